"""The batched draft phase (``algorithm/drafters/batch_phase.py``, ``decode.batch_size > 1`` under ``engine.compile``):
every drafting slot's levels, reranks and trees as one graph replay with one batch-drafter forward per level, on the
simulated CUDA device (the graph stand-in), float64:

- T = 0: each slot's tokens are AR greedy's and the eager batched cycle's for the static tree, the chain, EAGLE-2 and
  ADT-Tree fixed, through a slot refilled mid-stream and an idle one, with one phase replay per batched drafting cycle;
- each slot's tree in each cycle (tokens, parents, depth, mask, alive, proposal rows) is the eager lockstep's, greedy
  and at T = 1 with sampled drafts (the draws the eager path's);
- ``budget: cost``: each slot's N chosen in the phase is the eager host choice's, read in the batched verdict (one
  read per batched cycle);
- planted: a draw inside the captured phase fails (``GraphError``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import small_tree_policies, tiny

import adtbench.algorithm.batch as batch_mod
from adtbench import accel, accel_graphs
from adtbench.algorithm.batch import generate_batch
from adtbench.algorithm.drafters.batch_phase import BatchPhase
from adtbench.algorithm.engine import decode_ar
from adtbench.algorithm.policies.static import StaticTreePolicy
from adtbench.graph_modes import GraphModes
from adtbench.models.batch import BatchTarget
from adtbench.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
T1 = SamplingParams(temperature=1.0, cfg_scale=3.0)
PROMPTS = ("a red circle", "two blue squares on a striped floor", "a green cat")
POLICIES = small_tree_policies()
POLICIES["static_sampled"] = lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], "sample")
"""Three levels (two drafter forwards, the second's nodes attending their parents' scratch slots)."""


def batch(target: Any, slots: int, inputs: list[Any]) -> BatchTarget:
    """A batch over ``target`` with its verify buckets captured (``engine.compile=true`` at B > 1)."""
    need = max(target.prompt_length(x) for x in inputs) + target.layout.num_gen_tokens + 32 + 1
    bt = BatchTarget(target, slots, True, need)
    bt.request_static(graphs=True)
    return bt


class Recorder:
    """Wraps ``batch._draft_in_lockstep``: per batched cycle, each slot's tree as host copies (tokens, parents,
    depth, ancestor mask, alive, proposal rows) and the phase replays it took."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cycles: list[dict[int, tuple[Any, ...]]] = []
        self.replays: list[int] = []
        self.eager: list[int] = []  # phases run eagerly (a combined key's first use)
        real = batch_mod._draft_in_lockstep

        def lockstep(bd: Any, steps: Any, phase: BatchPhase | None = None) -> Any:
            runs = lambda: (0, 0) if phase is None else (phase.replays, phase.eager_runs)  # noqa: E731
            before = runs()
            trees = real(bd, steps, phase)
            after = runs()
            self.replays.append(after[0] - before[0])
            self.eager.append(after[1] - before[1])
            self.cycles.append({s: self.copy(t) for s, t in trees.items()})
            return trees

        monkeypatch.setattr(batch_mod, "_draft_in_lockstep", lockstep)

    @staticmethod
    def copy(t: Any) -> tuple[Any, ...]:
        alive = None if t.alive is None else t.alive.cpu().tolist()
        q = None if t.proposal is None else t.proposal.cpu().clone()
        parts = (t.tokens, t.parents, t.depth, t.ancestor_mask)
        return (*(x.cpu().tolist() for x in parts), alive, q)


def decode(bt: BatchTarget, drafter: Any, policy: Any, sp: SamplingParams, inputs: list[Any], levels: str) -> list:
    """Every prompt through ``generate_batch`` (``engine.graphs.levels=levels``), prompt i with generator seed i."""
    policy.graphs = GraphModes(verify="auto", levels=levels)
    items = [(i, x, accel.generator(bt.device, i)) for i, x in enumerate(inputs)]
    got: dict[int, list[int]] = {}
    generate_batch(bt, drafter, policy, items, sp, lambda k, r: got.__setitem__(k, r.tokens))
    return [got[i] for i in range(len(inputs))]


def both(name: str, sp: SamplingParams, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """The eager lockstep's and the batched phase's decode of ``PROMPTS`` through two slots, with their trees."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        ar = [decode_ar(target, x, sp, None).tokens for x in inputs] if sp.greedy else None
        runs = []
        for levels in ("eager", "auto"):
            rec = Recorder(monkeypatch)
            tokens = decode(batch(target, 2, inputs), drafter, POLICIES[name](), sp, inputs, levels)
            runs.append((tokens, rec))
            monkeypatch.undo()
    return ar, runs[0], runs[1]


@pytest.mark.parametrize("name", ["static", "chain", "eagle2", "adt_fixed"])
def test_greedy_equals_ar_through_the_batched_phase(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three prompts through two slots (one refilled, then one idle): each prompt's tokens are AR greedy's and the
    eager batched cycle's; every batched cycle that drafts is one phase replay (or, at a combined key's first use,
    one eager run of the same program), the eager one none; every slot's tree in every cycle is the eager
    lockstep's."""
    ar, (eager, rec_e), (graphed, rec_g) = both(name, GREEDY, monkeypatch)
    assert graphed == eager == ar
    assert sum(rec_e.replays) == sum(rec_e.eager) == 0
    drafting = [int(bool(c)) for c in rec_g.cycles]
    assert [r + e for r, e in zip(rec_g.replays, rec_g.eager, strict=True)] == drafting
    assert sum(rec_g.replays) > 3 and sum(rec_g.eager) < sum(drafting) / 2
    assert rec_g.cycles == rec_e.cycles


@pytest.mark.parametrize("name", ["static_sampled", "eagle2"])
def test_the_batched_phase_builds_the_eager_trees_at_t1(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """T = 1, seeded: the sampled static tree's noise is drawn from each slot's own generator in the eager lockstep's
    order, so every slot's tree in every cycle — proposal rows included — and so every token are the eager path's."""
    _, (eager, rec_e), (graphed, rec_g) = both(name, T1, monkeypatch)
    assert len(rec_g.cycles) == len(rec_e.cycles) > 3 and sum(rec_g.replays) > 3
    for cg, ce in zip(rec_g.cycles, rec_e.cycles, strict=True):
        assert cg.keys() == ce.keys()
        for s in cg:
            *a, qa = cg[s]
            *b, qb = ce[s]
            assert a == b
            assert (qa is None) == (qb is None) == (name != "static_sampled")
            if qa is not None:
                assert torch.allclose(qa, qb, rtol=0, atol=1e-12)
    assert graphed == eager


def test_a_draw_inside_the_batched_phase_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the sampled tree's noise drawn inside the batched phase's program (not into its static buffers before
    the replay) — the stand-in refuses the capture, as a CUDA graph would replay the capture's draws forever."""
    from adtbench.algorithm.policies import static

    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS[:2]]
        g = torch.Generator(device="cuda").manual_seed(0)
        monkeypatch.setattr(static, "draw_into", lambda buf, fill, generator: None)
        real_log = torch.Tensor.log

        def drawn_log(self: torch.Tensor) -> torch.Tensor:
            return real_log(torch.empty_like(self).exponential_(generator=g))

        monkeypatch.setattr(torch.Tensor, "log", drawn_log)
        with pytest.raises(accel_graphs.GraphError, match="draws random numbers"):
            decode(batch(target, 2, inputs), drafter, POLICIES["static_sampled"](), T1, inputs, "auto")


def test_a_slot_without_room_drafts_eagerly_beside_the_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot whose graphed levels do not fit (``SlotLevels.fits`` False for slot 1, planted) drafts op by op in the
    eager lockstep while slot 0's phase replays in the same cycle (its rows padding in the phase's forward): greedy
    tokens are still AR's, and the phase replays in every cycle slot 0 drafts."""
    from adtbench.algorithm.drafters.batch_phase import SlotLevels

    real = SlotLevels.fits
    monkeypatch.setattr(SlotLevels, "fits", lambda self, slots: self.s == 0 and real(self, slots))
    rec = Recorder(monkeypatch)
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS[:2]]
        ar = [decode_ar(target, x, GREEDY, None).tokens for x in inputs]
        assert decode(batch(target, 2, inputs), drafter, POLICIES["eagle2"](), GREEDY, inputs, "auto") == ar
    both_slots = sum(len(c) == 2 for c in rec.cycles)
    runs = [r + e for r, e in zip(rec.replays, rec.eager, strict=True)]
    assert both_slots > 3 and runs == [int(0 in c) for c in rec.cycles] and sum(rec.replays) > 3


def test_at_most_max_graphs_phases_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """ADT-Tree's (D, K) changes per slot and cycle, so combined keys keep coming: with ``MAX_GRAPHS`` 1 the phase
    keeps one graph (the least recently replayed released first, recaptured at its next use) and greedy tokens stay
    AR's."""
    import adtbench.algorithm.drafters.batch_phase as BP

    monkeypatch.setattr(BP, "MAX_GRAPHS", 1)
    made: list[BatchPhase] = []
    real = BP.BatchPhase.__init__

    def init(self: BatchPhase, *a: Any) -> None:
        real(self, *a)
        made.append(self)

    monkeypatch.setattr(BP.BatchPhase, "__init__", init)
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        ar = [decode_ar(target, x, GREEDY, None).tokens for x in inputs]
        assert decode(batch(target, 2, inputs), drafter, POLICIES["adt_fixed"](), GREEDY, inputs, "auto") == ar
    (phase,) = made
    assert phase.captures >= 2 and len(phase.graphs) == 1 and phase.replays > 3


@pytest.mark.parametrize("name", ["eagle2_cost", "adt_cost"])
def test_a_cost_budget_chooses_in_the_batched_phase(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``budget: cost`` at B > 1: each slot's node count N is chosen inside the batched phase (``_cost_tree``, the
    tree at the kept candidates' bucket with the nodes past N dead) and reaches the host in the slot's row of the
    batched verdict: per slot and cycle the same N as the eager lockstep's host choice (``TreeBudget.choose`` from a
    read of the scores), N live drafts in the verified tree, greedy tokens AR's; one host read per batched cycle
    (the eager lockstep: one more per drafting slot)."""
    with accel.simulate() as sim:
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        ar = [decode_ar(target, x, GREEDY, None).tokens for x in inputs]
        runs = []
        for levels in ("eager", "auto"):
            policy = POLICIES[name]()
            policy.graphs = GraphModes(verify="auto", levels=levels)
            bt = batch(target, 2, inputs)
            got: dict[int, Any] = {}
            items = [(i, x, accel.generator(bt.device, i)) for i, x in enumerate(inputs)]
            before = sim.counts["device_reads"]
            generate_batch(bt, drafter, policy, items, GREEDY, got.__setitem__)
            runs.append(([got[i] for i in range(3)], sim.counts["device_reads"] - before, bt.forwards))
    (eager, reads_e, cycles_e), (graphed, reads_g, cycles_g) = runs
    assert [r.tokens for r in graphed] == [r.tokens for r in eager] == ar
    drafted_slot_cycles = 0
    for e, g in zip(eager, graphed, strict=True):
        drafted = [(ce, cg) for ce, cg in zip(e.cycles, g.cycles, strict=True) if cg.drafted_depth > 0]
        drafted_slot_cycles += len(drafted)
        assert len(drafted) > 3
        for ce, cg in drafted:
            assert ce.extra["N_cost"] == cg.extra["N_cost"] == cg.nodes - 1
    assert (reads_g, reads_e) == (cycles_g, cycles_e + drafted_slot_cycles)
