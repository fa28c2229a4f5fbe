"""The draft phase as one replay (``algorithm/drafters/draft_phase.py``): every level, the rerank and the tree of a
cycle in one graph, the same trees as the per-level graphs, greedy = AR, one replay per drafted cycle."""

from __future__ import annotations

import pytest
import torch
from conftest import recording_trees, small_tree_policies, tiny

from adtbench import accel, accel_graphs
from adtbench.algorithm.drafters.graphed import LevelGraphs
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.sampling_params import SamplingParams

POLICIES = small_tree_policies()


@pytest.mark.parametrize(
    "name,temperature",
    [("static", 0.0), ("static_sampled", 1.0), ("chain", 1.0), ("eagle2", 1.0), ("adt_fixed", 0.0),
     ("eagle2_cost", 1.0)],
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
