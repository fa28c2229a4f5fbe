"""The one graph runner (``adtbench.graph_runner``) and the config family that switches its users
(``adtbench.graph_modes``, ``engine.graphs``):

- ``GraphRunner``: a key's program captured at its first use (inside the owner's capture scope) and replayed after,
  or run eagerly when not graphed; the counters (captures, replays, eager runs) move one way for all; a static
  buffer asked at another shape drops the graphs; ``drop`` releases graphs and buffers; ``runner_for`` makes one
  runner per (owner, kind, key) and forgets the owner with it;
- every user runs through it on the simulated device: the verify buckets, the Jacobi step (``engine.graphs.step``),
  the tree verify step (``engine.graphs.verify``) and the drafting levels (``engine.graphs.levels``) — their
  counters move, and ``eager`` for a part leaves its runner unused.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import tiny

import adtbench.graph_runner as GR
from adtbench import accel, accel_graphs
from adtbench.algorithm.engine import generate
from adtbench.algorithm.methods.jacobi.step import JacobiStep
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.policies.jacobi import JacobiModels
from adtbench.algorithm.tree_step import TreeStep
from adtbench.errors import ConfigError
from adtbench.graph_modes import GraphModes, graph_modes
from adtbench.graph_runner import GraphRunner, runner_for, runners_of
from adtbench.sampling_params import SamplingParams

CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)


class Doubler(GraphRunner):
    """A program writing 2·x into a static buffer; ``scopes`` records the capture scopes entered."""

    def __init__(self, graphed: bool) -> None:
        super().__init__(CPU, graphed)
        self.x = self.buffer("x", (3,), torch.float64)
        self.scopes: list[Any] = []

    def run(self, key: int) -> torch.Tensor:
        out: torch.Tensor = self.replay_or_run(key, lambda: self.x * (2 + 0 * key))
        return out

    @contextlib.contextmanager
    def _scope(self, key: Any) -> Iterator[None]:
        self.scopes.append(key)
        yield

    def capture_scope(self, key: Any) -> Any:
        return self._scope(key)


def test_capture_at_first_use_then_replay_or_eager() -> None:
    with accel_graphs.standin_graphs():
        r = Doubler(graphed=True)
        r.x.copy_(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
        assert r.run(4).tolist() == [2.0, 4.0, 6.0] and r.scopes == [4]
        r.x.fill_(5.0)
        assert r.run(4).tolist() == [10.0] * 3  # the replay rewrites the capture's output in place
        assert r.run(8).tolist() == [10.0] * 3 and r.scopes == [4, 8]
        assert (r.captures, r.replays, r.eager_runs) == (2, 3, 0) and set(r.graphs) == {4, 8}
        e = Doubler(graphed=False)
        e.x.fill_(1.0)
        assert e.run(4).tolist() == [2.0] * 3 and (e.captures, e.replays, e.eager_runs) == (0, 0, 1) and not e.graphs


def test_a_reallocated_buffer_drops_the_graphs() -> None:
    with accel_graphs.standin_graphs():
        r = Doubler(graphed=True)
        r.run(1)
        assert r.buffer("x", (3,), torch.float64) is r.x and r.graphs  # the same buffer: the graphs stay
        r.x = r.buffer("x", (4,), torch.float64)  # reallocated: every graph read the old storage
        assert not r.graphs and r.x.shape == (4,) and r.x.abs().sum() == 0
        r.run(1)
        assert r.captures == 2
        r.drop()
        assert not r.graphs and r.buffer("x", (4,), torch.float64) is not r.x


def test_runner_for_makes_one_runner_per_owner_kind_and_key() -> None:
    class Owner:
        pass

    owner = Owner()
    a = runner_for(owner, Doubler, 1, lambda: Doubler(False))
    assert runner_for(owner, Doubler, 1, lambda: Doubler(True)) is a and not a.graphed
    b = runner_for(owner, Doubler, 2, lambda: Doubler(False))
    assert b is not a and runners_of(owner, Doubler) == [a, b] and runners_of(owner, GraphRunner) == []
    assert runners_of(Owner(), Doubler) == []
    held = len(GR._RUNNERS)
    del owner, a, b
    gc.collect()
    assert len(GR._RUNNERS) == held - 1  # the cache holds the owner weakly: its runners go with it


def test_graph_modes_parse_and_refuse() -> None:
    assert graph_modes(None) == GraphModes() == GraphModes("auto", "auto", "auto")
    assert graph_modes({"levels": "eager"}) == GraphModes(levels="eager")
    with pytest.raises(ConfigError, match=r"^engine\.graphs\.verify: must be one of \['auto', 'graph', 'eager'\]"):
        graph_modes({"verify": "yes"})
    with pytest.raises(ConfigError, match=r"^engine\.graphs\.stepp: unknown part"):
        graph_modes({"stepp": "auto"})


def _counters(runners: list[GraphRunner]) -> tuple[int, int, int]:
    return (sum(r.captures for r in runners), sum(r.replays for r in runners), sum(r.eager_runs for r in runners))


def test_every_part_runs_through_the_runner_on_the_simulated_device() -> None:
    """``policy=eagle2`` (the verify buckets, the tree verify step, the drafting levels) and ``policy=scd`` (the
    Jacobi step) on the simulated device with the target's and drafter's verifies captured: each part's runner
    captures and replays; with the part ``eager`` its runner does not move and the tokens are the same."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float32", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        inputs = target.encode_prompt("a red circle", cfg=True)

        def eagle2(modes: GraphModes) -> list[int]:
            policy = POLICIES.build("eagle2", {"depth": 3, "top_k": 3, "total_tokens": 10})
            policy.graphs = modes
            return generate(target, drafter, policy, inputs, GREEDY, None).tokens

        eagle2(GraphModes())  # the first prefill pins the caches and captures the buckets
        buckets = list(target.static.steps.values()) + list(drafter.static.steps.values())
        assert _counters(buckets)[0] == target.static.captures + drafter.static.captures > 0  # ``capture_widths``
        tokens = {}
        for modes in (GraphModes(), GraphModes(verify="eager", levels="eager")):
            trees, levels = runners_of(target.static, TreeStep), drafter.level_graphs
            assert levels is not None
            was = (_counters(trees), _counters([levels]), _counters(buckets))
            tokens[modes.verify] = eagle2(modes)
            trees = runners_of(target.static, TreeStep)
            now = (_counters(trees), _counters([levels]), _counters(buckets))
            graphed = modes.verify == "auto"
            assert (now[0][1] > was[0][1]) == graphed and (now[1][1] > was[1][1]) == graphed, (modes, was, now)
            assert now[2][1] > was[2][1]  # the buckets replay either way (the eager cycle's verifies, the catch-ups)
        assert tokens["auto"] == tokens["eager"]
        for step in ("auto", "eager"):
            policy = POLICIES.build("scd", {"window": 4})
            policy.graphs = GraphModes(step=step)
            was = _counters(runners_of(target.static, JacobiStep))
            res = generate(target, JacobiModels(), policy, inputs, GREEDY, accel.generator(target.device, 0))
            now = _counters(runners_of(target.static, JacobiStep))
            assert res.stats["step"] == ("graph" if step == "auto" else "eager")
            assert (now[1] > was[1]) == (step == "auto") and now[2] == was[2] == 0, (step, was, now)
