"""Graphed drafting levels (``algorithm/drafters/graphed.py``): each level of a tree policy's drafting is one graph
replay, builds the eager path's trees, and keeps greedy decoding equal to AR greedy.

On the plain CPU ``request_static(graphs=True)`` gives the graph stand-in (``accel_graphs.StandInGraph``: capture order,
static buffers, replays that must run the captured ops and read only captured storages, no draw from an unregistered
generator during a capture); under ``accel.simulate()`` the same path runs with CUDA's placement rules and counted
synchronisations."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import recording_trees, small_tree_policies, tiny

from adtbench import accel, accel_graphs
from adtbench.algorithm.drafters.eagle import EagleDrafter
from adtbench.algorithm.drafters.graphed import LevelGraphs
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.base import desc_stable, stable_topk
from adtbench.sampling_params import SamplingParams

POLICIES = small_tree_policies()


@pytest.mark.parametrize(
    "name,temperature",
    [("static", 0.0), ("static_sampled", 1.0), ("chain", 1.0), ("eagle2", 0.0), ("eagle2_cost", 0.0),
     ("adt_fixed", 1.0), ("adt_cost", 0.0)],
)  # fmt: skip
def test_graphed_levels_build_the_eager_trees(name: str, temperature: float) -> None:
    """float64 on the simulated CUDA device (acceptance on the device, the path a GPU runs): the graphed levels and
    the eager levels of the same drafter (graphs switched off) draft the same tree in every cycle — same tokens,
    parents, live nodes and, for sampled drafts, the same proposal rows (the noise drawn outside the graph from the
    same generator, in the eager path's order) — so the decode is the same, token for token. ``budget: cost`` at
    T = 0: the graphed path verifies its tree at the bucket of the candidates kept (the nodes past the chosen N dead),
    so at T > 0 its draws differ from the host path's (other buckets); the live trees are compared."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", device="cuda")
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
        inputs = target.encode_prompt("two blue squares on a striped floor", cfg=True)
        runs = []
        for graphed in (True, False):
            policy = recording_trees(POLICIES[name]())
            if not graphed:
                saved, drafter.level_graphs = drafter.level_graphs, None
            res = generate(target, drafter, policy, inputs, sp, torch.Generator(device="cuda").manual_seed(5))
            if not graphed:
                drafter.level_graphs = saved
            runs.append((res, policy.trees))
    (res_g, trees_g), (res_e, trees_e) = runs
    lg = drafter.level_graphs
    assert isinstance(lg, LevelGraphs) and lg.replays > 0  # the levels' or the draft phase's replays
    assert len(trees_g) == len(trees_e) > 3
    for (tok_g, par_g, _, alive_g, q_g), (tok_e, par_e, _, alive_e, q_e) in zip(trees_g, trees_e, strict=True):
        assert (tok_g, par_g) == (tok_e, par_e)
        assert alive_g == alive_e or (alive_e is None and all(alive_g))
        assert (q_g is None) == (q_e is None)
        if q_g is not None:
            torch.testing.assert_close(q_g, q_e, rtol=1e-12, atol=1e-12)
    assert res_g.tokens == res_e.tokens


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_graphed_level_is_one_replay_and_greedy_equals_ar(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the simulated CUDA device with ``engine.compile``'s graphs, the per-level path (``LevelGraphs.phases``
    off; the draft phase as one replay is ``tests/test_draft_phase.py``'s): every drafting level of every cycle is
    exactly one graph replay (replays = the levels the records count, d̄ · cycles; a fixed-size EAGLE-2 / ADT tree's
    rerank and ancestry one more per cycle), the drafter's eager ``expand`` never runs,
    each level graph is captured once per (level, width) and replayed, and greedy decoding gives AR greedy's tokens."""

    def no_expand(*args, **kwargs):
        raise AssertionError("an eager drafter expand ran on the graphed path")

    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float32", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
        monkeypatch.setattr(EagleDrafter, "expand", no_expand)
        monkeypatch.setattr(LevelGraphs, "phases", False)
        policy = POLICIES[name]()
        for prompt in ("a red circle", "two blue squares on a striped floor"):
            inputs = target.encode_prompt(prompt, cfg=True)
            ar = decode_ar(target, inputs, sp, None)
            lg = drafter.level_graphs
            before = (lg.level_replays, lg.tree_replays) if lg is not None else (0, 0)
            res = generate(target, drafter, policy, inputs, sp, None)
            lg = drafter.level_graphs
            assert lg is not None
            assert res.tokens == ar.tokens, prompt
            levels = sum(c.drafted_depth for c in res.cycles)
            assert levels > len(res.cycles) > 3
            assert lg.level_replays - before[0] == levels, (lg.level_replays - before[0], levels)
            drafted = sum(c.drafted_depth > 0 for c in res.cycles)  # a fixed-size EAGLE-2 tree: one more graph
            assert lg.tree_replays - before[1] == (drafted if name in ("eagle2", "adt_fixed") else 0)
        # each (level, width) captured once, then replayed
        assert lg.captures == len(lg.graphs) < lg.replays / 4 and lg.eager_runs == 0  # the runner's counters


def test_a_draw_inside_a_level_graph_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the sampled levels' noise: drawn inside the level's program (not into its static buffer before
    the replay), the graph stand-in refuses the capture — a CUDA graph would replay the capture's draws forever."""
    from adtbench.algorithm.policies import static

    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", device="cuda")
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
        inputs = target.encode_prompt("a red circle", cfg=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        monkeypatch.setattr(static, "draw_into", lambda buf, fill, generator: None)
        real_log = torch.Tensor.log

        def drawn_log(self):  # the noise buffer's log: a draw from the prompt's generator inside the program
            return real_log(torch.empty_like(self).exponential_(generator=g))

        monkeypatch.setattr(torch.Tensor, "log", drawn_log)
        with pytest.raises(accel_graphs.GraphError, match="draws random numbers"):
            generate(target, drafter, POLICIES["static_sampled"](), inputs, sp, g)


def test_graphs_of_a_drafter_fork_are_its_own() -> None:
    """A fork (batched decoding's per-slot drafter) runs at variable shapes: no level graphs are shared with it."""
    with accel.simulate():
        _, drafter = tiny("tiny_llamagen", device="cuda")
        drafter.request_static(graphs=True)
        drafter.reset(2, 64)
        assert drafter.level_graphs is not None
        assert copy.copy(drafter).fork().level_graphs is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_stable_topk_is_the_stable_sort_order(dtype: torch.dtype) -> None:
    """The policies' top-k (one ``torch.topk`` over an int64 key below 64 bits, a stable sort in float64) gives the
    stable descending sort's first k — ties (−inf, −0.0 and +0.0, repeated values) toward the lower index."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        V = int(torch.randint(2, 400, (1,), generator=g))
        m = int(torch.randint(1, 4, (1,), generator=g))
        x = (torch.randint(-6, 3, (m, V), generator=g).double() / 2).to(dtype)
        x[torch.rand(m, V, generator=g) < 0.3] = float("-inf")
        x[torch.rand(m, V, generator=g) < 0.05] = -0.0
        k = int(torch.randint(1, V + 2, (1,), generator=g))
        vals, idx = stable_topk(x, k)
        ref = torch.from_numpy(desc_stable(x.double().numpy())[..., :k].copy())
        assert torch.equal(idx, ref), (V, k)
        assert torch.equal(vals, x.gather(-1, ref))
