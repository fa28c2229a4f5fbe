"""The graphed tree verify (``algorithm.tree_step``, ``engine.graphs.verify``): a drafted tree's verify forward, logits
processing, acceptance and packed verdict as one graph replay, on the simulated CUDA device (the graph stand-in: a
replay must run the captured ops on the captured storages, no read or host copy during a capture, no random op in
the graph), float64:

- T = 0: token-identical to AR greedy for every tree policy (static, chain, EAGLE-2, ADT with ``budget`` fixed and
  cost, a draft gate reading the bonus's entropy), one step launch per drafted cycle;
- padding changes nothing: in every cycle the step's verdict (path, bonus, realised depth, live nodes) equals
  ``verify.accept_tree`` on the policy's unpadded tree from the same logits and the same uniforms — greedy, the
  exact closed form, the rank loop with proposals (sampled trees) and LANTERN's relaxed rule, trees with dead nodes;
- per drafted cycle: one graph replay and one device read, and ``bench overhead bench.count=true``'s engine ops;
- the choice: ``auto`` runs the step where the verifies are graphed, ``eager`` never, ``graph`` refuses a setting it
  cannot run naming ``engine.graphs.verify``; the old key ``engine.verify_step`` is refused naming the new one.

The T = 1 laws of the step (the static sampled tree, EAGLE-2, sampled ADT-Tree) are in ``tests/test_laws.py``
(``*-step-t3``: the fixed-shape step run eagerly on static CPU buckets, where thousands of images are affordable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import small_tree_policies, tiny, with_cost

import adtbench.algorithm.tree_step as TS
from adtbench import accel
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.gate import DraftGate
from adtbench.algorithm.methods.lantern import LanternRule
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, Draws, accept_tree
from adtbench.errors import ConfigError
from adtbench.sampling_params import SamplingParams
from adtbench.tools.bench import TREE_STEP

GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
T1 = SamplingParams(temperature=1.0, cfg_scale=3.0)


POLICIES = {
    **small_tree_policies(),
    "adt_sampled": lambda: with_cost(
        ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8, budget="cost", draft_sampling="sample")
    ),
}


def graphed(dtype: str = "float64") -> tuple[Any, Any]:
    """A tiny LlamaGen and its drafter on the simulated device, verifies and drafting levels captured (what
    ``engine.compile=true`` does on a GPU)."""
    target, drafter = tiny("tiny_llamagen", dtype=dtype, device="cuda")
    target.request_static(graphs=True)
    drafter.request_static(graphs=True)
    return target, drafter


def drafted(res: Any) -> int:
    return sum(c.drafted_depth > 0 for c in res.cycles)


@pytest.mark.parametrize("name", ["static", "chain", "eagle2", "eagle2_cost", "adt_fixed", "adt_cost", "gate"])
def test_greedy_equals_ar_through_the_step(name: str) -> None:
    """Greedy decoding through the step gives AR greedy's tokens; every drafted cycle is one launch of a step."""
    with accel.simulate():
        target, drafter = graphed()
        policy = POLICIES["eagle2" if name == "gate" else name]()
        if name == "gate":  # the verdict carries the bonus row's entropy; some cycles are plain AR steps
            policy.gate = DraftGate(1.5, explore=2)
        for prompt in ("a red circle", "two blue squares on a striped floor"):
            inputs = target.encode_prompt(prompt, cfg=True)
            ar = decode_ar(target, inputs, GREEDY, None)
            before = sum(s.launches for s in TS.steps_of(target))
            res = generate(target, drafter, policy, inputs, GREEDY, None)
            assert res.tokens == ar.tokens, prompt
            launches = sum(s.launches for s in TS.steps_of(target)) - before
            assert launches == drafted(res) > 3
        steps = TS.steps_of(target)
        assert all(s.graphed and s.graphs for s in steps)


class _Checked:
    """Wraps ``TreeStep.verify``: after each launch, ``verify.accept_tree`` on the policy's own (unpadded) tree from
    the step's raw logits and the same uniforms (node i's, then the bonus's) must give the step's verdict."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, rule: Any) -> None:
        self.cycles, self.rule, self.seen = 0, rule, set()
        real = TS.TreeStep.verify

        def verify(step: TS.TreeStep, tree: Any, root_gen: int, generator: Any) -> Any:
            read, feats = real(step, tree, root_gen, generator)
            self.check(step, tree, root_gen, read)
            return read, feats

        monkeypatch.setattr(TS.TreeStep, "verify", verify)

    def check(self, step: TS.TreeStep, tree: Any, root_gen: int, read: Any) -> None:
        n, sp = tree.size, step.sp
        assert step.raw is not None
        processed = process_logits(step.raw[:, :n], root_gen + 1 + tree.depth, step.target.layout, sp)
        draws = Draws(buffer=torch.cat([step.draws[:n], step.draws[-1:]]))
        v = accept_tree(tree, processed, sp.greedy, draws, self.rule)
        path = torch.nonzero(v.on_path).flatten().tolist()
        assert read.acceptance.path == path
        assert read.acceptance.bonus == int(v.bonus)
        alive = tree.alive if tree.alive is not None else torch.ones(n, dtype=torch.bool, device=tree.tokens.device)
        assert read.acceptance.nodes == int(alive.sum())
        assert read.acceptance.tree_depth == int((tree.depth * alive).max())
        assert read.tokens == [*tree.tokens[path[1:]].tolist(), int(v.bonus)]
        self.cycles += 1
        self.seen.add((n < step.b, tree.alive is not None and not bool(tree.alive.all()), tree.proposal is not None))


@pytest.mark.parametrize(
    "name,sp,lantern",
    [("eagle2", T1, False), ("static_sampled", T1, False), ("adt_sampled", T1, False), ("adt_fixed", T1, False),
     ("eagle2", T1, True), ("static_sampled", T1, True), ("chain", T1, True), ("adt_fixed", GREEDY, False)],
)  # fmt: skip
def test_the_padded_step_decides_as_the_unpadded_tree(
    name: str, sp: SamplingParams, lantern: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cycle for cycle, the step's verdict on the tree padded to its bucket is ``accept_tree``'s on the tree itself
    from the same logits and uniforms: dead padding is never tried and shifts no sibling's slice — for the closed
    form (EAGLE-2 at T = 1), the rank loop with proposals (sampled trees), LANTERN's relaxed rule and greedy."""
    with accel.simulate():
        target, drafter = graphed()
        c = target.layout.num_codes
        table = torch.tensor([[(i + j) % c for j in range(1, 4)] for i in range(c)], device="cuda")
        rule = LanternRule(table, target.layout.image_token_offset, delta=0.3, k=3) if lantern else EXACT
        checked = _Checked(monkeypatch, rule)
        g = torch.Generator(device="cuda").manual_seed(3)
        for prompt in ("a red circle", "two blue squares on a striped floor"):
            inputs = target.encode_prompt(prompt, cfg=True)
            generate(target, drafter, POLICIES[name](), inputs, sp, g, rule)
        assert checked.cycles >= 8
        assert any(padded for padded, _, _ in checked.seen)  # trees smaller than their bucket were verified


def test_a_drafted_cycle_is_one_replay_and_one_read() -> None:
    """On the simulated device, per drafted cycle of EAGLE-2 at T = 1: one verify replay (the step's; the target's
    own bucket graphs never replay in a drafted cycle) and one device read (the verdict)."""
    with accel.simulate() as sim:
        target, drafter = graphed()
        inputs = target.encode_prompt("a red circle", cfg=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        generate(target, drafter, POLICIES["eagle2"](), inputs, T1, g)  # the captures
        before_launches = sum(s.launches for s in TS.steps_of(target))
        before = sim.counts.copy()
        res = generate(target, drafter, POLICIES["eagle2"](), inputs, T1, g)
        d = {k: sim.counts[k] - before[k] for k in ("graph_replays", "device_reads", "graph_captures")}
        cycles, k, levels = len(res.cycles), drafted(res), sum(c.drafted_depth for c in res.cycles)
        assert sum(s.launches for s in TS.steps_of(target)) - before_launches == k > 8  # the rest: no room to draft
        assert d["graph_captures"] <= 3  # a (bucket, width) or level width the first image did not need
        assert d["device_reads"] <= cycles + 2, (d, cycles)  # the verdict per cycle (+ the prefill's first token)
        # the drafter's levels, per drafted cycle its rerank, the step and its catch-up; per other cycle the AR step
        assert d["graph_replays"] <= levels + 3 * k + (cycles - k) + 2, (d, levels, k, cycles)


def test_the_choice_of_step() -> None:
    """``auto``: the step where the verifies are captured and acceptance is on the device; ``eager``: never;
    ``graph``: also on uncaptured static buckets (run eagerly), refused without them or with host acceptance."""
    with accel.simulate():
        target, _ = graphed()
        inputs = target.encode_prompt("a red circle", cfg=True)
        target.start(inputs, 64)
        t = DraftTree(torch.arange(7, device="cuda"), [-1, 0, 0, 1, 1, 2, 3], drafted_depth=3)
        assert TS.step_for(target, t, T1, EXACT, False, "auto", "auto") is not None
        assert TS.step_for(target, t, T1, EXACT, False, "eager", "auto") is None
        assert TS.step_for(target, t, T1, EXACT, False, "auto", "host") is None
        with pytest.raises(ConfigError, match=r"engine\.graphs\.verify"):
            TS.step_for(target, t, T1, EXACT, False, "graph", "host")
    plain, _ = tiny("tiny_llamagen")  # the CPU, no static buckets
    plain.start(plain.encode_prompt("a red circle", cfg=True), 64)
    t = DraftTree(torch.arange(3), [-1, 0, 1], drafted_depth=2)
    assert TS.step_for(plain, t, T1, EXACT, False, "auto", "device") is None
    with pytest.raises(ConfigError, match=r"engine\.graphs\.verify"):
        TS.step_for(plain, t, T1, EXACT, False, "graph", "device")
    plain.request_static(graphs=False)  # static CPU buckets, not captured: ``graph`` runs the step eagerly
    plain.start(plain.encode_prompt("a red circle", cfg=True), 64)
    step = TS.step_for(plain, t, T1, EXACT, False, "graph", "device")
    assert step is not None and not step.graphed
    assert TS.step_for(plain, t, T1, EXACT, False, "auto", "device") is None


def test_config_names_the_key() -> None:
    """A bad ``engine.graphs.verify`` (or ``levels``) is a ``ConfigError`` naming the key before any model loads, and
    so is ``graph`` where the part can never run as graphs; the old ``engine.verify_step`` names itself and the new
    key (the schema's check and ``check_engine``'s alike)."""
    from omegaconf import OmegaConf

    from adtbench.harness import schema
    from adtbench.harness.config import check_engine

    def cfg(device: str = "cpu", **engine: Any) -> Any:
        return OmegaConf.create({"warmup": 1, "model": {"device": device}, "engine": engine})

    with pytest.raises(ConfigError, match=r"^engine\.graphs\.verify: must be one of"):
        check_engine(cfg(graphs={"verify": "fast"}))
    with pytest.raises(ConfigError, match=r"^engine\.graphs\.verify: graph accepts on the device"):
        check_engine(cfg(graphs={"verify": "graph"}, acceptance="host"))
    with pytest.raises(ConfigError, match=r"^engine\.graphs\.levelz: unknown part"):
        check_engine(cfg(graphs={"levelz": "graph"}))
    for engine in ({"compile": False}, {"compile": True, "acceptance": "host"}):  # levels never graphed there
        with pytest.raises(ConfigError, match=r"^engine\.graphs\.levels: graph needs"):
            check_engine(cfg("cuda", graphs={"levels": "graph"}, **engine))
    with accel.simulate():
        check_engine(cfg("cuda", graphs={"levels": "graph"}, compile=True))
    with pytest.raises(ConfigError, match=r"^engine\.graphs\.levels: graph needs"):
        check_engine(cfg("cpu", graphs={"levels": "graph"}, compile=True))
    for where in (check_engine, lambda c: schema.check_group(c, "engine")):
        with pytest.raises(ConfigError, match=r"^engine\.verify_step: moved to engine\.graphs\.verify.*=eager"):
            where(cfg(verify_step="eager"))
    old = OmegaConf.create({"policy": {"name": "eagle2", "graph_levels": False}})
    with pytest.raises(ConfigError, match=r"^policy\.graph_levels: moved to engine\.graphs\.levels.*=eager"):
        schema.check_group(old, "policy")


TINY = ["model=tiny_llamagen", "policy=eagle2", "dataset=smoke", "model.device=cuda", "engine.compile=true",
        "threads=1", "bench.count=true", "bench.prompts=1"]  # fmt: skip
VERIFY = ("acceptance (device)", "verify mask + positions", "the cycle's host read", "target logits processing",
          "tree verify step: the tree into its buffers, the draws")  # fmt: skip


def test_bench_count_of_a_graphed_tree_cycle(tmp_path: Path) -> None:
    """``bench overhead bench.count=true`` of EAGLE-2 on the simulated device with ``engine.compile=true``: a cycle's
    verify, acceptance and read outside the step's one replay are ≈ 22 engine ops, views included (the tree's
    copies into the step's buffers, the draws, the read), and one device read — op by op
    (``engine.graphs.verify=eager``, the same run) ≈ 125; the cycle's kernels outside graphs 105 → 36."""
    from adtbench.tools.bench import main as bench_main

    rows = {}
    for step in ("auto", "eager"):
        out = tmp_path / f"{step}.json"
        with accel.simulate():
            assert bench_main(["overhead", *TINY, f"engine.graphs.verify={step}", f"bench.out={out}"]) == 0
        rows[step] = json.loads(out.read_text())
    phases = {s: {p["phase"]: p["ops_per_cycle"] for p in r["phases"]} for s, r in rows.items()}
    graphed = sum(v for k, v in phases["auto"].items() if k in VERIFY)
    eager = sum(v for k, v in phases["eager"].items() if k in VERIFY)
    assert phases["auto"].get(TREE_STEP, 0) > 0
    assert graphed <= 30 and eager >= 80, (phases["auto"], phases["eager"])
    kernels = {s: r["engine_kernels_per_cycle"] for s, r in rows.items()}
    assert kernels["auto"] < 0.45 * kernels["eager"], kernels
    assert rows["auto"]["host_reads_per_cycle"] <= 1.05
