"""The simulated CUDA device and the CUDA-graph stand-in (``adtbench.accel``): CUDA's placement rules on the CPU, the
synchronisations counted, a graph's capture/replay discipline — and the two crashes a first GPU run of the earlier
engine would have hit, planted back, fail here (negative controls)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny

from adtbench import accel, accel_graphs, accel_sim
from adtbench.accel_graphs import GraphError
from adtbench.accel_sim import PlacementError
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.models.kv import StaticKVCache
from adtbench.sampling_params import SamplingParams


def test_a_host_tensor_in_device_work_is_refused_naming_the_op_and_where_it_was_made() -> None:
    with accel.simulate():
        x = torch.ones(3, device="cuda")
        host = torch.arange(3)  # no device: born on the host
        assert x.device == accel_sim.SIM_DEVICE and host.device == torch.device("cpu") and x.is_cuda
        with pytest.raises(PlacementError, match=r"add at .*test_accel.py.*arange without a device"):
            x + host
        assert (x + torch.tensor(2.0)).is_cuda  # a 0-d host tensor is a scalar: CUDA accepts it
        assert (x + host.to(x.device)).is_cuda  # moved first: fine, and counted as a copy
        with pytest.raises(PlacementError, match="numpy"):
            x.numpy()


def test_reads_and_copies_are_counted_and_results_stay_on_the_device() -> None:
    with accel.simulate() as sim:
        x = torch.zeros(4, device="cuda")
        y = (x + 1).cumsum(0)
        assert y.is_cuda and not y.cpu().is_cuda
        before = sim.report()
        assert float(y[-1]) == 4.0 and y.tolist() == [1.0, 2.0, 3.0, 4.0]
        x.copy_(torch.ones(4))  # host → device
        idx = torch.tensor([0, 2], device=x.device)  # from host data: a copy
        x[3] = 0  # a Python number written into device memory: CUDA copies it from the host (a blocking copy)
        after = sim.report()
    assert after["device_reads"] - before["device_reads"] == 2
    assert after["host_to_device_copies"] - before["host_to_device_copies"] == 3
    assert idx.is_cuda is False  # outside the simulation a tensor's device is its physical one


def test_a_generator_on_the_other_device_is_refused() -> None:
    with accel.simulate():
        dev = torch.device("cuda")
        g_host, g_dev = torch.Generator().manual_seed(0), accel.generator(accel.resolve("cuda"), 0)
        assert g_dev.device == accel_sim.SIM_DEVICE
        torch.rand(2, generator=g_dev, device=dev)
        with pytest.raises(PlacementError, match="Expected a 'cuda' device type for generator"):
            torch.rand(2, generator=g_host, device=dev)
        with pytest.raises(PlacementError, match="Expected a 'cpu' device type for generator"):
            torch.rand(2, generator=g_dev)


def test_planted_compact_with_host_indices_fails_on_the_simulated_device() -> None:
    """Negative control of the crash of landed main: ``StaticKVCache.compact`` with a host ``keep`` (as the cost
    model's cache filling passed it) is refused; the same call with ``keep`` on the device runs."""
    with accel.simulate():
        kv = StaticKVCache(1, 1, 1, 8, 2, torch.float32, accel.resolve("cuda"))
        with pytest.raises(PlacementError, match=r"index_select at models/kv\.py"):
            kv.compact(0, torch.arange(3))
        kv.compact(0, torch.arange(3, device=kv.buf.device))


def _stand_in_step():
    buf = torch.zeros(3)
    state = {"n": 3, "buf": buf}

    def forward() -> torch.Tensor:
        return state["buf"][: state["n"]] * 2 + 1

    return buf, state, forward


def test_the_graph_stand_in_replays_into_the_captured_outputs() -> None:
    buf, _, forward = _stand_in_step()
    with accel_graphs.standin_graphs():
        g = accel_graphs.capture(forward, torch.device("cpu"))
    out = g.out
    buf.copy_(torch.tensor([1.0, 2.0, 3.0]))  # new inputs go into the static buffer
    g.replay()
    assert g.out is out and out.tolist() == [3.0, 5.0, 7.0]


def test_the_graph_stand_in_refuses_what_a_cuda_graph_cannot_replay() -> None:
    buf, state, forward = _stand_in_step()
    with accel_graphs.standin_graphs():
        g = accel_graphs.capture(forward, torch.device("cpu"))
        state["n"] = 2  # a Python value the capture froze
        with pytest.raises(GraphError, match="other work than its capture"):
            g.replay()
        state["n"], state["buf"] = 3, torch.ones(3)  # a new tensor instead of a copy into the static buffer
        with pytest.raises(GraphError, match="never read"):
            g.replay()

        def syncing() -> torch.Tensor:
            return buf * float(buf.sum())

        with accel.simulate(), pytest.raises(GraphError, match="illegal while a CUDA graph is being captured"):
            accel_graphs.capture(lambda: syncing(), accel.resolve("cuda"))


@pytest.mark.parametrize("model", ["tiny_llamagen", "tiny_chameleon"])
def test_graphed_cfg_decoding_equals_eager_and_the_planted_capture_bug_fails(model: str) -> None:
    """``engine.compile`` on the simulated device captures every verify bucket at the first prefill with the CFG rows
    (2): graphed greedy speculation equals eager AR token for token, every call after the capture replays. Negative
    control: with the rows set after the capture (landed main), the capture's warm-up fails as it would on CUDA."""
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    with accel.simulate() as sim:
        target, drafter = tiny(model, dtype="float32", device="cuda")
        inputs = target.encode_prompt("a red circle", cfg=True)
        eager = decode_ar(target, inputs, sp, None).tokens
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        policy = Eagle2Policy(depth=2, top_k=3, total_tokens=9)
        graphed = generate(target, drafter, policy, inputs, sp, None)
        assert graphed.tokens == eager
        assert sorted(target.static.steps) == [1, 2, 4, 8, 16, 32, 64, 128][: len(target.static.steps)]
        assert all(s.graph is not None for s in target.static.steps.values())
        assert sim.counts["graph_replays"] >= graphed.target_forwards - 1
    with accel.simulate():  # planted: the capture runs before the prompt's rows are set (landed main)
        target, _ = tiny(model, dtype="float32", device="cuda")
        target.request_static(graphs=True)
        new_cache = target.net.new_cache

        def rows_set_after_the_capture(rows: int, capacity: int):
            cache = new_cache(rows, capacity)
            target.rows = 1  # what the target held before this prompt's ``start``
            return cache

        target.net.new_cache = rows_set_after_the_capture
        with pytest.raises(RuntimeError, match=r"invalid for input of size|must have same slice shapes"):
            decode_ar(target, target.encode_prompt("a red circle", cfg=True), sp, None)


def _cached_buffer_step(pinning: bool):
    """A forward that writes a buffer it takes from a cache (as ``lean.scratch`` hands out ``Scratch``), and the
    cache's eviction: a least-recently-used cache making room drops the entry — unless, with ``pinning``, a live
    graph was captured over it (``accel_graphs.Pins``)."""
    cache: dict[str, tuple[torch.Tensor, accel_graphs.Pins]] = {}
    x = torch.arange(3.0)

    def forward() -> torch.Tensor:
        if "buf" not in cache:
            cache["buf"] = (torch.empty(3), accel_graphs.Pins())
        buf, pins = cache["buf"]
        pins.note()
        torch.mul(x, 2, out=buf)
        return buf + 1

    def evict() -> None:
        if not (pinning and cache["buf"][1]):
            cache.clear()

    return x, cache, forward, evict


def test_the_graph_stand_in_refuses_a_replay_over_a_storage_no_live_tensor_owns() -> None:
    """Issue 40's hazard at its smallest, and its negative control: the cache evicts a buffer after the capture —
    on CUDA the graph keeps writing an address the allocator hands out again — and the stand-in's replay refuses,
    naming the op that first used it at capture. The graph holds what its capture touched (``held``); a cache that
    pins what it hands out during a capture keeps it, the replay runs, and the pin lapses with the graph."""
    with accel_graphs.standin_graphs():
        x, cache, forward, evict = _cached_buffer_step(pinning=False)
        g = accel_graphs.capture(forward, torch.device("cpu"))
        assert g.held_bytes() == 2 * 3 * 4 and not g.orphans()  # x and the cached buffer, float32
        evict()
        assert len(g.orphans()) == 1
        with pytest.raises(GraphError, match=r"no live tensor owns any more \(the first used at capture by mul at "):
            g.replay()

        x, cache, forward, evict = _cached_buffer_step(pinning=True)
        g = accel_graphs.capture(forward, torch.device("cpu"))
        evict()
        x.copy_(torch.tensor([1.0, 2.0, 3.0]))
        g.replay()
        assert g.out.tolist() == [3.0, 5.0, 7.0] and "buf" in cache
        del g
        evict()
        assert not cache


def test_a_random_op_in_a_capture_needs_its_generator_registered() -> None:
    """A graph replays the draws of its capture unless the generator is registered with it (CUDA's
    ``register_generator_state``): a random op during a capture from an unregistered generator — or the default one
    — is refused naming the op (planted controls); with the generator registered each replay draws afresh."""
    with accel.simulate():
        dev = accel.resolve("cuda")
        g = accel.generator(dev, 0)
        base = torch.zeros(4, device=dev)

        def draw() -> torch.Tensor:
            return base + torch.rand(4, generator=g, device=dev)

        with pytest.raises(GraphError, match=r"rand at .*test_accel\.py.* not registered with the graph"):
            accel_graphs.capture(draw, dev)
        with pytest.raises(GraphError, match=r"normal_ at .*test_accel\.py.*the default generator"):
            accel_graphs.capture(lambda: base.clone().normal_(), dev)
        graph = accel_graphs.capture(draw, dev, generators=(g,))
        first = graph.out.clone()
        graph.replay()
        assert not torch.equal(first, graph.out) and bool(((graph.out >= 0) & (graph.out < 1)).all())
