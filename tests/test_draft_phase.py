"""A tree cycle in three replays and one read (issue 51), on the simulated CUDA device: the draft phase as one replay
(``algorithm/drafters/draft_phase.py``: every level, the rerank and the tree of a cycle in one graph — the same trees
as the per-level graphs, greedy = AR, one replay per drafted cycle), the verify with its KV commit
(``algorithm/tree_step.py``) and the drafter's catch-up (``algorithm/drafters/catch_up.py``) one replay each; the
count per cycle (``bench overhead bench.count=true``); planted failures: a draw inside the phase, a mask for the wrong
bucket. The T = 1 laws through the whole graphed cycle: ``tests/test_laws.py`` (``*-cycle-graphed-*``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import recording_trees, small_tree_policies, tiny

from adtbench import accel, accel_graphs
from adtbench.algorithm.drafters.catch_up import catch_up_replays
from adtbench.algorithm.drafters.graphed import LevelGraphs
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.sampling_params import SamplingParams

POLICIES = small_tree_policies()


@pytest.mark.parametrize(
    "name,temperature",
    [("static", 0.0), ("static_sampled", 1.0), ("chain", 1.0), ("eagle2", 1.0), ("adt_fixed", 0.0),
     ("eagle2_cost", 0.0)],
)  # fmt: skip
def test_the_phase_builds_the_per_level_trees(name: str, temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 on the simulated CUDA device: the draft phase as one replay and the per-level replays
    (``LevelGraphs.phases`` off) build the same tree in every cycle — tokens, parents, depth, ancestor mask, live
    nodes and the sampled proposal rows — so the decode is the same; the phase is one replay per drafted cycle."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", device="cuda")
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
        inputs = target.encode_prompt("two blue squares on a striped floor", cfg=True)
        runs = []
        for phases in (True, False):
            monkeypatch.setattr(LevelGraphs, "phases", phases)
            policy = recording_trees(POLICIES[name]())
            lg = drafter.level_graphs
            before = (0, 0) if lg is None else (lg.level_replays, lg.tree_replays)
            res = generate(target, drafter, policy, inputs, sp, torch.Generator(device="cuda").manual_seed(5))
            lg = drafter.level_graphs
            assert lg is not None
            runs.append((res, policy.trees, lg.level_replays - before[0], lg.tree_replays - before[1]))
    (res_p, trees_p, levels_p, phases_p), (res_l, trees_l, levels_l, _) = runs
    drafted = sum(c.drafted_depth > 0 for c in res_p.cycles)
    assert (levels_p, phases_p) == (0, drafted) and levels_l > drafted > 3
    assert len(trees_p) == len(trees_l)
    for (tok_p, par_p, shape_p, alive_p, q_p), (tok_l, par_l, shape_l, alive_l, q_l) in zip(trees_p, trees_l):
        assert (tok_p, par_p, shape_p, alive_p) == (tok_l, par_l, shape_l, alive_l)
        assert (q_p is None) == (q_l is None)
        if q_p is not None:
            assert torch.equal(q_p, q_l)
    assert res_p.tokens == res_l.tokens


@pytest.mark.parametrize("name", ["static", "chain", "eagle2", "adt_fixed"])
def test_the_phase_is_one_replay_and_greedy_equals_ar(name: str) -> None:
    """float32 on the simulated device with the verify buckets captured too: one draft-phase replay per drafted cycle,
    no per-level replay, each (phase, width) captured once; greedy decoding gives AR greedy's tokens."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float32", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
        for prompt in ("a red circle", "two blue squares on a striped floor"):
            inputs = target.encode_prompt(prompt, cfg=True)
            ar = decode_ar(target, inputs, sp, None)
            lg = drafter.level_graphs
            before = (0, 0) if lg is None else (lg.level_replays, lg.tree_replays)
            res = generate(target, drafter, POLICIES[name](), inputs, sp, None)
            lg = drafter.level_graphs
            assert lg is not None and res.tokens == ar.tokens, prompt
            drafted = sum(c.drafted_depth > 0 for c in res.cycles)
            assert (lg.level_replays - before[0], lg.tree_replays - before[1]) == (0, drafted) and drafted > 3
        assert lg.captures == len(lg.graphs) < lg.tree_replays / 4


def test_a_draw_inside_the_draft_phase_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a sampled tree's noise drawn inside the phase's program (not into its static buffers before the
    replay) — the stand-in refuses the capture, as a CUDA graph would replay the capture's draws forever."""
    from adtbench.algorithm.policies import static

    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", device="cuda")
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
        inputs = target.encode_prompt("a red circle", cfg=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        monkeypatch.setattr(static, "draw_into", lambda buf, fill, generator: None)
        real_log = torch.Tensor.log

        def drawn_log(self):
            return real_log(torch.empty_like(self).exponential_(generator=g))

        monkeypatch.setattr(torch.Tensor, "log", drawn_log)
        with pytest.raises(accel_graphs.GraphError, match="draws random numbers"):
            generate(target, drafter, POLICIES["static_sampled"](), inputs, sp, g)


COUNTED = {
    "eagle2": ("policy=eagle2",),
    "static": ("policy=static",),
    "chain": ("policy=chain",),
    "adt_fixed": ("policy=adt", "policy.budget=fixed"),
    "eagle2_cost": ("policy=eagle2", "policy.budget=cost"),  # the node count chosen in the phase, read with the verdict
    "adt_cost": ("policy=adt",),
}


@pytest.mark.parametrize("name", list(COUNTED))
def test_a_tree_cycle_is_three_replays_and_one_read(name: str, tmp_path: Path) -> None:
    """``bench overhead bench.count=true`` on the simulated device with ``engine.compile=true`` (tiny LlamaGen, the
    smoke prompt): per cycle at most 3 graph replays (the catch-up, the draft phase, the verify with its KV commit),
    at most 15 engine kernels outside them and at most one host read (issue 51's goal; ``docs/speed.md``)."""
    from adtbench.tools.bench import main as bench_main

    out = tmp_path / "count.json"
    with accel.simulate():
        args = ["overhead", "model=tiny_llamagen", "dataset=smoke", "model.device=cuda", "engine.compile=true",
                "threads=1", "bench.count=true", "bench.prompts=1", *COUNTED[name], f"bench.out={out}"]  # fmt: skip
        assert bench_main(args) == 0
    r = json.loads(out.read_text())
    assert r["cycles"] > 5
    got = (r["graph_replays_per_cycle"], r["engine_kernels_per_cycle"], r["host_reads_per_cycle"])
    assert got[0] <= 3.0 and got[1] <= 15.0 and got[2] <= 1.0, got


def test_a_mask_for_the_wrong_bucket_fails() -> None:
    """Planted: each tree step's ancestor mask swapped for another buffer of its shape (a mask not the bucket's own,
    as another bucket's step holds) after its graphs were captured — on CUDA the replay would keep reading the
    captured mask and verify the wrong tree; the stand-in refuses the replay."""
    import adtbench.algorithm.tree_step as TS

    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float32", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
        inputs = target.encode_prompt("two blue squares on a striped floor", cfg=True)
        ar = decode_ar(target, inputs, sp, None)
        assert generate(target, drafter, POLICIES["eagle2"](), inputs, sp, None).tokens == ar.tokens
        steps = [s for s in TS.steps_of(target) if s.graphs]
        assert steps
        for step in steps:
            step.anc = step.anc.clone()
        with pytest.raises(accel_graphs.GraphError, match=r"no live tensor owns|never read"):
            generate(target, drafter, POLICIES["eagle2"](), inputs, sp, None)


def test_the_graphed_catch_up_of_a_two_layer_drafter_builds_the_eager_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catch-up's replay (``drafters.catch_up``) is idempotent: a capture's warm-ups mark the committed columns
    L … L + a before the replay runs, and a new slot i still sees columns L … L + i only. A drafter of two layers
    shows it (a second layer's keys are the first's attention outputs): float64, simulated device, the static sampled
    tree at T = 1, the same trees and proposal rows in every cycle as with the catch-up eager (``extend``)."""
    from omegaconf import OmegaConf

    from adtbench.algorithm import engine
    from adtbench.harness.drafters import build_drafter

    runs = []
    for graphed in (True, False):
        with accel.simulate():
            target, _ = tiny("tiny_llamagen", device="cuda")
            dcfg = OmegaConf.create({"kind": "eagle", "path": None, "seed": 1, "num_layers": 2, "input_norm": False})
            drafter = build_drafter(dcfg, target)
            drafter.request_static(graphs=True)
            target.request_static(graphs=True)  # the verify's step: the catch-up reads its buffers
            if not graphed:
                monkeypatch.setattr(engine, "catch_up_graphed", lambda *a: None)
            policy = recording_trees(POLICIES["static_sampled"]())
            inputs = target.encode_prompt("two blue squares on a striped floor", cfg=True)
            sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
            res = generate(target, drafter, policy, inputs, sp, torch.Generator(device="cuda").manual_seed(5))
            runs.append((res.tokens, policy.trees))
            assert (catch_up_replays(drafter) > 3) == graphed
    (tok_g, trees_g), (tok_e, trees_e) = runs
    assert len(trees_g) == len(trees_e) > 3
    for (a_tok, a_par, a_shape, a_alive, a_q), (b_tok, b_par, b_shape, b_alive, b_q) in zip(trees_g, trees_e):
        assert (a_tok, a_par, a_shape, a_alive) == (b_tok, b_par, b_shape, b_alive)
        assert a_q is not None and b_q is not None and torch.allclose(a_q, b_q, rtol=0, atol=1e-12)
    assert tok_g == tok_e
