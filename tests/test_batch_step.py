"""The graphed batched verify (``algorithm.batch_step``, ``decode.batch_size > 1`` under ``engine.compile``): every
slot's tree verify forward, logits processing, acceptance, packed verdict and ragged KV commit as one graph replay, on
the simulated CUDA device (the graph stand-in: a replay runs the captured ops on the captured storages, no read or
host copy during a capture, no random op in the graph), float64:

- T = 0: each slot's tokens are AR greedy's (and the eager batched cycle's) for every tree policy, through slots
  refilled mid-stream and idle ones, with one step launch per batched cycle and the drafter's catch-up replayed
  (``BatchCatchUp``);
- cycle for cycle and slot for slot the step's verdict is ``accept_tree``'s on the unpadded tree from the same logits
  and uniforms (closed form, rank loop with proposals, LANTERN, a gate's roots alone, a one-node tree);
- per batched cycle: three replays (the draft phase, ``tests/test_batch_phase.py``; the verify step; the catch-up)
  and one host read (``bench overhead bench.count=true``);
- planted: a draw inside the captured step and a mask buffer not the step's own fail (``GraphError``);
- the choice: ``eager`` never runs the step; ``graph`` at B > 1 without ``engine.compile`` names
  ``engine.graphs.verify`` before any weights load.

The T = 1 law through the step is ``tests/test_laws.py``'s ``eagle2-cycle-graphed-k2w4-b2`` (the *cycle* tier).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import small_tree_policies, tiny, with_cost

import adtbench.algorithm.batch_step as BS
from adtbench import accel, accel_graphs
from adtbench.algorithm.batch import generate_batch
from adtbench.algorithm.engine import decode_ar
from adtbench.algorithm.methods.gate import DraftGate
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.sampling import process_logits, sample_rows_cdf
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, Draws, accept_tree
from adtbench.errors import ConfigError
from adtbench.graph_modes import GraphModes
from adtbench.models.batch import BatchTarget
from adtbench.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
T1 = SamplingParams(temperature=1.0, cfg_scale=3.0)
PROMPTS = ("a red circle", "two blue squares on a striped floor", "a green cat")
POLICIES = small_tree_policies()
TS_POLICIES = {**POLICIES, "adt_sampled": lambda: with_cost(
    ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8, budget="cost", draft_sampling="sample"))}  # fmt: skip


def batch(target: Any, slots: int, inputs: list[Any]) -> BatchTarget:
    """A batch over ``target`` with its buckets captured (what ``engine.compile=true`` asks at B > 1)."""
    need = max(target.prompt_length(x) for x in inputs) + target.layout.num_gen_tokens + 32 + 1  # bucket 32
    bt = BatchTarget(target, slots, True, need)
    bt.request_static(graphs=True)
    return bt


def decode(bt: BatchTarget, drafter: Any, policy: Any, inputs: list[Any], sp: SamplingParams, mode: str) -> list:
    """Every prompt through ``generate_batch`` (``engine.graphs.verify=mode``), prompt i with generator seed i."""
    policy.graphs = GraphModes(verify=mode)
    items = [(i, x, accel.generator(bt.device, i)) for i, x in enumerate(inputs)]
    got: dict[int, list[int]] = {}
    generate_batch(bt, drafter, policy, items, sp, lambda k, r: got.__setitem__(k, r.tokens))
    return [got[i] for i in range(len(inputs))]


def launches(bt: BatchTarget) -> int:
    return sum(s.launches for s in BS.batch_steps_of(bt))


@pytest.mark.parametrize("name", ["static", "static_sampled", "chain", "eagle2", "eagle2_cost", "adt_fixed",
                                  "adt_cost", "gate"])  # fmt: skip
def test_greedy_equals_ar_through_the_batched_step(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three prompts through two slots (a slot refilled, then one idle): each prompt's tokens are AR greedy's and the
    eager batched cycle's; the step ran once per batched cycle, as captured graphs, and the drafter caught up after
    it by its own replay (``BatchCatchUp``; the eager ``extend`` where a gated slot kept two cycles pending)."""
    caught: list[int] = []
    real = BS.BatchCatchUp.launch
    monkeypatch.setattr(BS.BatchCatchUp, "launch", lambda self, *a: caught.append(1) or real(self, *a))
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        ar = [decode_ar(target, x, GREEDY, None).tokens for x in inputs]
        policy = POLICIES["eagle2" if name == "gate" else name]()
        if name == "gate":  # the verdict carries the bonus row's entropy; some cycles are plain AR steps
            policy.gate = DraftGate(1.5, explore=2)
        eager = decode(batch(target, 2, inputs), drafter, policy, inputs, GREEDY, "eager")
        bt = batch(target, 2, inputs)
        graphed = decode(bt, drafter, policy, inputs, GREEDY, "auto")
        assert graphed == eager == ar
        steps = BS.batch_steps_of(bt)
        assert steps and all(s.graphed and s.graphs for s in steps)
        assert launches(bt) == bt.forwards > 3  # every batched cycle: one launch
        assert len(caught) > bt.forwards // 3


class _Checked:
    """Wraps ``BatchTreeStep.verify``: after each launch, for every slot, ``verify.accept_tree`` on its policy's own
    (unpadded) tree from its rows of the step's raw logits and its uniforms (node i's, then the bonus's) gives the
    step's verdict; a root alone's bonus is its row's argmax (greedy) or the inverse-CDF draw of its last uniform."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, rule: Any) -> None:
        self.cycles, self.alone, self.one_node, self.rule, self.seen = 0, 0, 0, rule, set()
        real = BS.BatchTreeStep.verify

        def verify(step: BS.BatchTreeStep, cases: list) -> Any:
            out = real(step, cases)
            for s, case in enumerate(cases):
                if case is not None:
                    self.check(step, s, case, out[0][s])
            return out

        monkeypatch.setattr(BS.BatchTreeStep, "verify", verify)

    def check(self, step: BS.BatchTreeStep, s: int, case: Any, read: Any) -> None:
        tree, _, g, _ = case
        sp, bt = step.sp, step.bt
        assert step.raw is not None
        n = 1 if tree is None else tree.size
        depth = torch.zeros(1, dtype=torch.long, device=bt.device) if n == 1 else tree.depth
        processed = process_logits(step.raw[bt.slot_rows(s), :n], g + 1 + depth, bt.layout, sp)
        if n == 1:  # a root alone, or a one-node tree (its root)
            self.one_node += tree is not None
            u = step.draws[s, -1:]
            bonus = processed[0].argmax() if sp.greedy else sample_rows_cdf(processed[0].softmax(-1)[None], None, u)[0]
            assert read.acceptance.path == [0] and read.acceptance.bonus == int(bonus)
            self.alone += 1
            return
        draws = Draws(buffer=torch.cat([step.draws[s, :n], step.draws[s, -1:]]))
        v = accept_tree(tree, processed, sp.greedy, draws, self.rule)
        path = torch.nonzero(v.on_path).flatten().tolist()
        assert read.acceptance.path == path and read.acceptance.bonus == int(v.bonus)
        assert read.tokens == [*tree.tokens[path[1:]].tolist(), int(v.bonus)]
        self.cycles += 1
        self.seen.add((n < step.b, tree.proposal is not None))


@pytest.mark.parametrize(
    "name,sp,lantern",
    [("eagle2", T1, False), ("static_sampled", T1, False), ("adt_sampled", T1, False), ("gate", T1, False),
     ("eagle2", T1, True), ("chain", T1, True), ("adt_fixed", GREEDY, False), ("adt_cost", T1, True)],
)  # fmt: skip
def test_each_slot_decides_as_its_unpadded_tree(
    name: str, sp: SamplingParams, lantern: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cycle for cycle and slot for slot, the step's verdict (its tree padded to the batch's bucket, acceptance
    vectorised over the slots) is ``accept_tree``'s on the slot's own tree from the same logits and uniforms — the
    closed form (EAGLE-2 at T = 1), the rank loop with proposals (sampled trees), LANTERN's relaxed rule, greedy —
    and a root alone's bonus is its row's draw: the law of the eager batched cycle."""
    from adtbench.algorithm.methods.lantern import LanternRule

    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        c = target.layout.num_codes
        table = torch.tensor([[(i + j) % c for j in range(1, 4)] for i in range(c)], device="cuda")
        rule = LanternRule(table, target.layout.image_token_offset, delta=0.3, k=3) if lantern else EXACT
        checked = _Checked(monkeypatch, rule)
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        policy = (TS_POLICIES["eagle2"] if name == "gate" else TS_POLICIES[name])()
        if name == "gate":
            policy.gate = DraftGate(1.5, explore=2)
        policy.graphs = GraphModes(verify="auto")
        bt = batch(target, 2, inputs)
        items = [(i, x, accel.generator(bt.device, i)) for i, x in enumerate(inputs)]
        generate_batch(bt, drafter, policy, items, sp, lambda k, r: None, rule)
        assert checked.cycles >= 8 and launches(bt) == bt.forwards
        assert any(padded for padded, _ in checked.seen)  # trees smaller than the batch's bucket were verified
        if name == "gate":
            assert checked.alone > 0  # the gate's AR steps: roots alone through the step


class _OneNodeSometimes(Eagle2Policy):
    """EAGLE-2 that proposes a one-node tree (its root, child ranks 8 wide: as a static builder may declare) every
    third proposal: a slot's tree that is its root alone, beside the others' real trees."""

    calls = 0

    def propose_steps(self, session: Any, room: int) -> Any:
        type(self).calls += 1
        if type(self).calls % 3:
            return super().propose_steps(session, room)
        tree = DraftTree(session.root_token, [-1], 0, max_children=8)

        def done() -> Any:
            return tree
            yield  # a coroutine that asks for no level

        return done()


@pytest.mark.parametrize("sp", [T1, GREEDY])
def test_a_one_node_tree_beside_real_ones(sp: SamplingParams, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot whose policy proposes a one-node tree goes through the step as a root alone (its wide child ranks are
    not copied into a narrower rank buffer), LANTERN's rank loop included; verdicts as ``accept_tree``'s, greedy =
    AR."""
    from adtbench.algorithm.methods.lantern import LanternRule

    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        c = target.layout.num_codes
        table = torch.tensor([[(i + j) % c for j in range(1, 4)] for i in range(c)], device="cuda")
        rule = LanternRule(table, target.layout.image_token_offset, delta=0.3, k=3) if not sp.greedy else EXACT
        checked = _Checked(monkeypatch, rule)
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        policy = _OneNodeSometimes(depth=2, top_k=3, total_tokens=9)
        policy.graphs = GraphModes(verify="auto")
        bt = batch(target, 2, inputs)
        items = [(i, x, accel.generator(bt.device, i)) for i, x in enumerate(inputs)]
        got: dict[int, list[int]] = {}
        generate_batch(bt, drafter, policy, items, sp, lambda k, r: got.__setitem__(k, r.tokens), rule)
        assert checked.one_node > 0 and checked.cycles > 8 and launches(bt) == bt.forwards
        if sp.greedy:
            assert [got[i] for i in range(3)] == [decode_ar(target, x, sp, None).tokens for x in inputs]


def test_eager_never_runs_the_step_and_t1_runs_it() -> None:
    """``engine.graphs.verify=eager`` at B > 1 is the op-by-op batched cycle; at T = 1 the step runs (its uniforms from
    each slot's generator, filled outside the graph) and every image is complete."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        bt = batch(target, 2, inputs)
        decode(bt, drafter, POLICIES["eagle2"](), inputs, T1, "eager")
        assert launches(bt) == 0
        out = decode(bt, drafter, POLICIES["static_sampled"](), inputs, T1, "auto")
        assert launches(bt) > 3 and all(len(t) == target.layout.num_gen_tokens for t in out)


def test_a_draw_inside_the_step_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a uniform drawn inside the captured step (the processing draws from the default generator) — a CUDA
    graph would replay the capture's draw forever; the stand-in refuses the capture."""
    real = BS.process_logits

    def drawing(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(*args, **kwargs)
        return out + 0 * torch.rand(1, dtype=out.dtype, device=out.device)

    monkeypatch.setattr(BS, "process_logits", drawing)
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float32", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS[:2]]
        with pytest.raises(accel_graphs.GraphError, match="draws random numbers"):
            decode(batch(target, 2, inputs), drafter, POLICIES["eagle2"](), inputs, T1, "auto")


def test_a_mask_for_the_wrong_bucket_fails() -> None:
    """Planted: each batched step's ancestor masks swapped for another buffer of their shape after the capture (a mask
    not the bucket's own): on CUDA the replay would keep reading the captured masks and verify the wrong trees; the
    stand-in refuses the replay."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float32", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS[:2]]
        bt = batch(target, 2, inputs)
        ar = [decode_ar(target, x, GREEDY, None).tokens for x in inputs]
        assert decode(bt, drafter, POLICIES["eagle2"](), inputs, GREEDY, "auto") == ar
        steps = [s for s in BS.batch_steps_of(bt) if s.graphs]
        assert steps
        for step in steps:
            step.anc = step.anc.clone()
        with pytest.raises(accel_graphs.GraphError, match=r"no live tensor owns|never read"):
            decode(bt, drafter, POLICIES["eagle2"](), inputs, GREEDY, "auto")


def test_a_batched_cycle_is_one_replay_and_one_read(tmp_path: Path) -> None:
    """``bench overhead bench.count=true`` at B = 2 with ``engine.compile=true``: the verify, acceptance and commit of
    every slot are one replay, the drafter's catch-up one more, every slot's draft phase a third
    (``drafters.batch_phase``: no batched drafter level op by op; a combined key's first use runs eagerly), and the
    cycle reads the host once."""
    from adtbench.tools.bench import BATCH_PHASE, BATCH_STEP, CATCH_UP
    from adtbench.tools.bench import main as bench_main

    out = tmp_path / "count.json"
    with accel.simulate():
        args = ["overhead", "model=tiny_llamagen", "dataset=smoke", "dataset.limit=3", "model.device=cuda",
                "engine.compile=true", "threads=1", "policy=eagle2", "decode.batch_size=2", "bench.count=true",
                "bench.prompts=3", f"bench.out={out}"]  # fmt: skip
        assert bench_main(args) == 0
    r = json.loads(out.read_text())
    rows = {x["phase"]: x for x in r["phases"]}
    assert r["cycles"] > 5 and 2.25 < r["graph_replays_per_cycle"] <= 3.0 and r["host_reads_per_cycle"] == 1.0
    assert all(rows[p]["ops_per_cycle"] > 0 for p in (BATCH_STEP, CATCH_UP, BATCH_PHASE))
    eager = {"acceptance (device)", "KV commit", "batched verify: padding, mask, positions",
             "drafter extend (bookkeeping)", "batched drafter level (bookkeeping)"}  # fmt: skip
    assert not eager & set(rows)


def test_graph_at_b_gt_1_without_compile_names_the_key() -> None:
    """``engine.graphs.verify=graph`` with ``decode.batch_size > 1`` and no ``engine.compile``: the batch has no
    captured buckets, so the step can never run: a ``ConfigError`` naming the key, before any weights load."""
    from test_app import compose_app

    from adtbench.harness.config import validate

    cfg = compose_app("policy=eagle2", "decode.batch_size=2", "engine.graphs.verify=graph")
    with pytest.raises(ConfigError, match=r"^engine\.graphs\.verify: graph with decode\.batch_size > 1"):
        validate(cfg)
