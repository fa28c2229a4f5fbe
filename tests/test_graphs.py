"""Static-shape forwards (``models.graphs``), on the CPU: the bucketing and padding a CUDA graph replays.

A target asked for static verifies (``request_static``) keeps one pinned KV cache for every image and runs every
tree at its bucket's size over a capacity bucket of that cache; an EAGLE drafter asked for static shapes does the same
for its ``expand`` levels and the decode loop's ``extend``. These tests check, in float64, that the real nodes / slots
get exactly the variable-shape forward's outputs through a run of trees and non-prefix commits (padding is inert), that
the pinned caches are reused across images, that a prompt too long for them falls back to variable shapes, and that
greedy speculation through the buckets is AR greedy; on the simulated device (``accel.simulate``) the graphs of every
(node bucket, capacity bucket) pair replay to AR's tokens. Real captures need CUDA (``tests/test_gpu.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import tiny
from omegaconf import OmegaConf

import adtbench.algorithm.tree_step as TS
from adtbench import accel, accel_graphs
from adtbench.algorithm.cost import random_tree
from adtbench.algorithm.drafters.catch_up import catch_up_of
from adtbench.algorithm.drafters.eagle import EagleDrafter
from adtbench.algorithm.engine import decode_ar, generate, prefill
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.policies.static import StaticTreePolicy
from adtbench.errors import ConfigError
from adtbench.harness import job
from adtbench.models import graphs, lean
from adtbench.models.base import Capabilities, PromptInputs
from adtbench.models.graphs import BUCKETS, StaticDraft, StaticVerify, bucket_of, capacity_buckets
from adtbench.models.rows import prompt_rows
from adtbench.sampling_params import SamplingParams

MODELS = ["tiny_llamagen", "tiny_chameleon"]


def fine_widths(capacity: int) -> tuple[int, ...]:
    """Capacity buckets 4 columns apart (the tiny models' live lengths stay under the default step of 64 columns)."""
    return capacity_buckets(capacity, count=capacity, align=4)


def test_buckets_are_the_smallest_power_of_two_that_holds_the_tree() -> None:
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 63, 64, 65, 128)] == [1, 2, 4, 4, 8, 64, 64, 128, 128]
    assert bucket_of(129) is None and BUCKETS[-1] == 128


def test_capacity_buckets_are_equal_aligned_steps_ending_at_the_capacity() -> None:
    assert capacity_buckets(1600) == (256, 512, 768, 1024, 1280, 1600)  # 1536 is less than half a step short
    assert capacity_buckets(1536) == (192, 384, 576, 768, 960, 1152, 1344, 1536)
    assert capacity_buckets(300) == (64, 128, 192, 256, 300) and capacity_buckets(50) == (50,)
    assert fine_widths(14) == (4, 8, 12, 14)
    assert capacity_buckets(529) == (128, 256, 384, 529)  # mini's pinned cache
    for c in (1, 63, 64, 65, 529, 1000, 2925):
        w = capacity_buckets(c)
        inner = w[:-1]  # equal steps, aligned; the last width the capacity, at most 1.5 steps past them
        assert w[-1] == c and len(w) <= graphs.CAPACITY_BUCKETS and all(x % 64 == 0 for x in inner)
        assert all(x == (i + 1) * w[0] for i, x in enumerate(inner)) and (not inner or c - inner[-1] <= 1.5 * w[0])


@pytest.mark.parametrize("widths", ["default", "fine"])
@pytest.mark.parametrize("model", MODELS)
def test_bucketed_verifies_equal_variable_shapes_through_commits(model: str, widths: str) -> None:
    """Trees of 1 … 17 nodes, each verified at its bucket (1, 2, 4, 8, 16, 32) and then committed along a path that
    is not a prefix: the real nodes' logits and features equal the variable-shape target's within 1e-10. Each verify
    attends over the smallest capacity bucket holding its columns (``fine``: buckets 4 columns apart, so the width
    changes from verify to verify), never over the whole pinned capacity."""
    plain, _ = tiny(model)
    static, _ = tiny(model)
    static.request_static(graphs=False)
    used: list[tuple[int, int, int]] = []
    run = StaticVerify.run

    def spy(self: StaticVerify) -> tuple[torch.Tensor, torch.Tensor]:
        used.append((self.b, self.width, int(self.write[0]) + self.b))  # bucket, width, columns needed
        return run(self)

    gen = torch.Generator().manual_seed(0)
    lay = plain.layout
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StaticVerify, "run", spy)
        if widths == "fine":
            mp.setattr(graphs, "capacity_buckets", fine_widths)
        for t in (plain, static):
            t.start(t.encode_prompt("a red circle", cfg=True), 32)
        for n in (1, 3, 2, 5, 9, 17, 4):
            mask, depth = random_tree(n, gen)
            toks = lay.image_token_offset + torch.randint(0, lay.num_codes, (n,), generator=gen)
            (a, fa), (b, fb) = (t.verify_forward(toks, mask, depth) for t in (plain, static))
            assert a.shape == b.shape and (a - b).abs().max() <= 1e-10 and (fa - fb).abs().max() <= 1e-10, n
            path = torch.nonzero(mask[-1]).view(-1)  # the deepest-last node's root path: not a prefix in general
            for t in (plain, static):
                t.commit(path)
    assert [b for b, _, _ in used] == [1, 4, 2, 8, 16, 32, 4]
    st = static.static
    assert st.widths == (fine_widths if widths == "fine" else capacity_buckets)(st.capacity)
    for _, width, need in used:  # the smallest width holding the columns, short of the whole capacity
        assert width == min(w for w in st.widths if w >= need) < st.capacity
    assert len({w for _, w, _ in used}) >= (4 if widths == "fine" else 1)
    assert static.cache is static.pinned


@pytest.mark.parametrize("model", MODELS)
def test_the_pinned_cache_serves_every_image_and_greedy_speculation_is_ar(model: str) -> None:
    target, drafter = tiny(model)
    target.request_static(graphs=False)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    first = None
    for prompt in ("a red circle", "two blue squares on a striped floor"):
        inputs = target.encode_prompt(prompt, cfg=True)
        ar = decode_ar(target, inputs, sp, None)
        spec = generate(target, drafter, Eagle2Policy(depth=3, top_k=4, total_tokens=20), inputs, sp, None)
        assert spec.tokens == ar.tokens
        first = first or target.pinned
        assert target.cache is target.pinned is first


def test_a_prompt_longer_than_the_pinned_room_runs_at_variable_shapes(caplog: pytest.LogCaptureFixture) -> None:
    target, drafter = tiny("tiny_chameleon")
    target.request_static(graphs=False, extra_prompt=0)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    short = target.encode_prompt("a cat", cfg=True)
    decode_ar(target, short, sp, None)
    long = target.encode_prompt("a very long prompt about a red circle left of a blue square on a floor", cfg=True)
    ar = decode_ar(target, long, sp, None)
    assert target.cache is not target.pinned and "variable shapes" in caplog.text
    spec = generate(target, drafter, Eagle2Policy(depth=2, top_k=3, total_tokens=8), long, sp, None)
    assert spec.tokens == ar.tokens


class DrafterTwin:
    """A ``Drafter`` that runs every call on ``static`` (a drafter asked for static shapes) and on ``plain`` (the same
    weights, variable shapes) and returns ``static``'s outputs: ``diff`` is the largest difference of the outputs so
    far, ``calls`` the (method, slots, variable-shape prompt ``extend``) of each forward."""

    def __init__(self, static: EagleDrafter, plain: EagleDrafter) -> None:
        assert static.static is None and static._pin is not None and plain._pin is None
        self.static, self.plain = static, plain
        self.diff = 0.0
        self.calls: list[tuple[str, int, bool]] = []

    @property
    def length(self) -> int:
        assert self.static.length == self.plain.length
        return self.static.length

    @property
    def scratch(self) -> int:
        assert self.static.scratch == self.plain.scratch
        return self.static.scratch

    def embed(self, target: Any, ids: torch.Tensor) -> torch.Tensor:
        return self.static.embed(target, ids)

    def embed_prompt(self, target: Any, res: Any) -> torch.Tensor:
        return self.static.embed_prompt(target, res)

    def reset(self, rows: int, capacity: int) -> None:
        self.static.reset(rows, capacity)
        self.plain.reset(rows, capacity)

    def rollback(self) -> None:
        self.static.rollback()
        self.plain.rollback()

    def _both(self, name: str, *args: Any) -> torch.Tensor:
        out = getattr(self.static, name)(*args)
        ref = getattr(self.plain, name)(*args)
        assert out.shape == ref.shape
        self.diff = max(self.diff, float((out - ref).abs().max()))
        self.calls.append((name, args[0].shape[1], name == "extend" and len(args) > 3 and args[3] is not None))
        return out

    def extend(self, *args: Any) -> torch.Tensor:
        return self._both("extend", *args)

    def expand(self, *args: Any) -> torch.Tensor:
        return self._both("expand", *args)


# level widths 17, 9, 5, 3, 2, 1 (the nodes with children: buckets 32, 16, 8, 4, 2, 1), then a leaf
WIDE = (
    [[r] for r in range(17)] + [[r, 0] for r in range(17)] + [[r, 0, 0] for r in range(9)]
    + [[r, 0, 0, 0] for r in range(5)] + [[r, 0, 0, 0, 0] for r in range(3)] + [[r, 0, 0, 0, 0, 0] for r in range(2)]
    + [[0] * 7]
)  # fmt: skip


@pytest.mark.parametrize("model", MODELS)
def test_bucketed_drafter_equals_variable_shapes_through_real_decodes(model: str) -> None:
    """Two images through one pinned drafter cache: at T = 1 a wide sampled tree (expansion levels of 17 … 1 slots,
    accepted paths that are not first children, extends of several committed slots), then greedy EAGLE-2 (extends of
    one slot). Every static ``expand`` and ``extend`` equals the variable-shape drafter's within 1e-10, at the buckets
    expected; the greedy image is AR's."""
    target, static = tiny(model)
    _, plain = tiny(model)  # the same seed: the same drafter weights
    target.request_static(graphs=False)
    static.request_static(graphs=False)
    twin = DrafterTwin(static, plain)
    used: list[int] = []
    run = StaticDraft.run

    def spy(self: StaticDraft) -> torch.Tensor:
        used.append(self.b)
        widths.append((self.width, int(self.write[0]) + self.b))
        return run(self)

    widths: list[tuple[int, int]] = []  # (width, columns needed) of every static drafter forward
    moved: list[bool] = []
    commit = type(target).commit

    def commit_spy(self: Any, keep: torch.Tensor, in_place: bool = False) -> None:
        moved.append(not in_place)
        commit(self, keep, in_place)

    pinned = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StaticDraft, "run", spy)
        mp.setattr(type(target), "commit", commit_spy)
        mp.setattr(graphs, "capacity_buckets", fine_widths)
        sampled = SamplingParams(temperature=1.0, cfg_scale=3.0)
        inputs = target.encode_prompt("a red circle", cfg=True)
        gen = torch.Generator().manual_seed(0)
        res = generate(target, twin, StaticTreePolicy(WIDE, "sample"), inputs, sampled, gen)
        pinned.append(static.cache)
        assert max(c.accepted for c in res.cycles) >= 1 and any(moved)  # accepted drafts, non-prefix commits
        greedy = SamplingParams(temperature=0.0, cfg_scale=3.0)
        inputs = target.encode_prompt("two blue squares on a striped floor", cfg=True)
        res = generate(target, twin, Eagle2Policy(depth=3, top_k=4, total_tokens=20), inputs, greedy, None)
        pinned.append(static.cache)
        assert res.tokens == decode_ar(target, inputs, greedy, None).tokens
    assert twin.diff <= 1e-10
    assert static.pinned is not None and pinned == [static.pinned[0]] * 2 and plain.cache is not static.cache
    expands = [m for name, m, _ in twin.calls if name == "expand"]
    extends = [m for name, m, prompt in twin.calls if name == "extend" and not prompt]
    assert {17, 9, 5, 3, 2, 1} <= set(expands) and 1 in extends and max(extends) >= 2
    # every expand and every decode-loop extend ran at its bucket; the prompts' extends did not
    assert sorted(used) == sorted(bucket_of(m) for m in expands + extends)
    # each at the smallest capacity bucket holding its columns (fine buckets: many widths, never the whole capacity)
    assert static.static is not None and static.static.widths == fine_widths(static.static.capacity)
    assert all(w == min(x for x in static.static.widths if x >= need) for w, need in widths)
    assert len({w for w, _ in widths}) >= 4 and max(w for w, _ in widths) < static.static.capacity


@pytest.mark.parametrize("model", MODELS)
def test_greedy_speculation_with_the_static_drafter_and_verifies_is_ar(model: str) -> None:
    target, drafter = tiny(model)
    target.request_static(graphs=False)
    drafter.request_static(graphs=False)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    for prompt in ("a red circle", "two blue squares on a striped floor"):
        inputs = target.encode_prompt(prompt, cfg=True)
        spec = generate(target, drafter, StaticTreePolicy(WIDE), inputs, sp, None)
        assert spec.tokens == decode_ar(target, inputs, sp, None).tokens
        assert drafter.pinned is not None and drafter.cache is drafter.pinned[0]


def test_a_prompt_longer_than_the_drafters_pinned_room_runs_it_at_variable_shapes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With no extra room, a longer prompt's image runs the drafter at variable shapes (one warning), tokens still
    AR's; a shorter prompt after it is back on the pinned cache and its buckets."""
    target, drafter = tiny("tiny_chameleon")
    drafter.request_static(graphs=False, extra_prompt=0)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    policy = Eagle2Policy(depth=2, top_k=3, total_tokens=8)
    used: list[int] = []
    run = StaticDraft.run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StaticDraft, "run", lambda self: used.append(self.b) or run(self))
        short = target.encode_prompt("a cat", cfg=True)
        generate(target, drafter, policy, short, sp, None)
        assert drafter.pinned is not None and drafter.cache is drafter.pinned[0] and used
        n = len(used)
        long = target.encode_prompt("a very long prompt about a red circle left of a blue square on a floor", cfg=True)
        spec = generate(target, drafter, policy, long, sp, None)
        assert drafter.cache is not drafter.pinned[0] and len(used) == n
        assert spec.tokens == decode_ar(target, long, sp, None).tokens
        assert caplog.text.count("the drafter needs") == 1
        generate(target, drafter, policy, short, sp, None)
        assert drafter.cache is drafter.pinned[0] and len(used) > n
        generate(target, drafter, policy, long, sp, None)
    assert caplog.text.count("the drafter needs") == 1


def test_a_fork_of_the_static_drafter_has_its_own_cache_at_variable_shapes() -> None:
    """Batched decoding's per-slot ``fork`` of a pinned drafter neither reuses the pinned cache nor its buckets."""
    target, drafter = tiny("tiny_llamagen")
    drafter.request_static(graphs=False)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    generate(target, drafter, Eagle2Policy(depth=2, top_k=3, total_tokens=8), inputs, sp, None)
    assert drafter.pinned is not None and drafter.cache is drafter.pinned[0]
    fork = drafter.fork()
    assert fork.static is None and fork.pinned is None
    spec = generate(target, fork, Eagle2Policy(depth=2, top_k=3, total_tokens=8), inputs, sp, None)
    assert spec.tokens == decode_ar(target, inputs, sp, None).tokens
    assert fork.cache is not drafter.pinned[0] and fork.static is None and drafter.static is not None


def test_graphs_of_every_node_and_capacity_bucket_replay_the_eager_tokens() -> None:
    """On the simulated device (the CUDA-graph stand-in: a replay must run the captured ops at the captured shapes and
    read only captured storages) target and drafter capture one graph per (node bucket, capacity bucket ≥ it) — seven
    widths 8 columns apart over the tiny model's live lengths, so the replays move through them — and greedy
    speculation replays them to AR's tokens, image after image (the lean Chameleon; ``test_accel`` runs both models
    at the default widths)."""
    model = "tiny_chameleon"
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)

    def few_widths(capacity: int) -> tuple[int, ...]:
        return (*range(12, 60, 8), capacity)

    with pytest.MonkeyPatch.context() as mp, accel.simulate() as sim:
        mp.setattr(graphs, "capacity_buckets", few_widths)
        target, drafter = tiny(model, dtype="float32", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        for prompt in ("a red circle", "two blue squares on a striped floor"):
            inputs = target.encode_prompt(prompt, cfg=True)
            eager = decode_ar(target, inputs, sp, None).tokens  # through the graphs of node bucket 1 too
            spec = generate(target, drafter, Eagle2Policy(depth=3, top_k=4, total_tokens=20), inputs, sp, None)
            assert spec.tokens == eager
        for st in (target.static, drafter.static):
            assert st is not None and st.widths == few_widths(st.capacity)
            assert st.captures == sum(len([w for w in st.widths if w >= b]) for b in st.buckets)
        widths = [w for step in target.static.steps.values() for w, g in step.graphs.items() if g.replays]
        assert len({w for w in widths if w < target.static.capacity}) >= 3
        levels = drafter.level_graphs  # the graphed drafting levels (``drafters.graphed``), captured at first use
        assert levels is not None and levels.captures > 0
        # the drafter's catch-ups (``drafters.catch_up``): one graph per (step, slot bucket, width) used
        catch_up = catch_up_of(drafter)
        assert catch_up is not None and catch_up.replays > 0
        assert len({key[2] for key in catch_up.graphs if key[2] < drafter.static.capacity}) >= 3
        trees = TS.steps_of(target)  # the drafted trees' verifies (``tree_step``), one graph per (bucket, width) used
        tree_graphs = [g for step in trees for g in step.graphs.values()]
        assert trees and len({K for step in trees for K, _ in step.graphs if target.static.capacity > K}) >= 3
        assert all(g.replays for g in tree_graphs)
        assert sim.counts["graph_captures"] == (
            target.static.captures + drafter.static.captures + levels.captures + len(tree_graphs) + len(catch_up.graphs)
        )
    with accel.simulate():  # the same greedy tokens as the variable-shape path on the host
        plain, _ = tiny(model, dtype="float32")
        assert decode_ar(plain, plain.encode_prompt(prompt, cfg=True), sp, None).tokens == eager


def test_engine_compile_on_cuda_requests_the_drafters_graphs() -> None:
    """``compile_models`` on a CUDA target: target and drafter (the EAGLE drafter: static shapes) are asked for CUDA
    graphs and neither is ``torch.compile``d; a target that declares no graphs is compiled, its drafter too."""
    cfg = OmegaConf.create({"model": {"family": "llamagen"}, "drafter": {"kind": "eagle"}})
    calls: list[tuple[str, object]] = []

    def fake(name: str, static: bool) -> SimpleNamespace:
        obj = SimpleNamespace(device=torch.device("cuda"), compile_forward=lambda: calls.append((name, "compile")))
        obj.capabilities = Capabilities(static_cache=static, graphs=static, compile=True)
        if static:
            obj.request_static = lambda graphs: calls.append((name, graphs))
        return obj

    job.compile_models(fake("target", True), fake("drafter", True), cfg)
    assert calls == [("target", True), ("drafter", True)]
    calls.clear()
    job.compile_models(fake("target", False), fake("drafter", True), cfg)
    assert calls == [("target", "compile"), ("drafter", "compile")]
    calls.clear()
    job.compile_models(fake("target", True), None, cfg)
    assert calls == [("target", True)]
    calls.clear()  # torch.compile cannot trace under the simulated device: a target without graphs is refused there
    with accel.simulate(), pytest.raises(ConfigError, match=r"engine.compile: under .* declares none"):
        job.compile_models(fake("target", False), fake("drafter", True), cfg)
    assert calls == []


def _lru_scratch(memo: dict | None, R: int, n: int, layers: Any, D: int, dtype: torch.dtype, rot: Any, device: Any):
    """``lean.scratch`` as it was before issue 40 (planted): the 16 most recently used shapes, captured or not."""
    if memo is None:
        return lean.Scratch(R, n, layers, D, dtype, rot, device)
    key = (R, n, dtype, torch.device(device), None if rot is None else (rot.style, rot.dtype), id(layers))
    ws = memo.pop(key, None)
    if ws is None:
        ws = lean.Scratch(R, n, layers, D, dtype, rot, device)
        while len(memo) >= lean.SCRATCH_SHAPES:
            memo.pop(next(iter(memo)))
    memo[key] = ws
    return ws


def _prompt_of(target: Any, k: int) -> PromptInputs:
    """The tiny Chameleon's CFG rows of a prompt of ``k`` text tokens (``k + 3`` columns with its specials)."""
    sp = target.special
    return prompt_rows(
        f"{k} tokens", True, [sp["bos"], *[87] * k, sp["eot"], sp["boi"]], [sp["bos"], sp["boi"]], sp["pad"]
    )


@pytest.mark.parametrize("memo", ["pinned", "planted_lru"])
def test_captured_graphs_keep_their_buffers_through_twenty_prompt_lengths(memo: str) -> None:
    """Issue 40's hazard: the lean layers' ``Scratch`` of every captured bucket is pinned to its graphs, so 22
    distinct prompt lengths after the capture (each a new shape for the target's and the drafter's prefill) evict
    none, every graph still owns live storage, and greedy speculation through the graphs — a dynamic tree and SCD —
    is AR's tokens. Negative control (``planted_lru``, the 16-entry LRU of before): the prompt lengths evict the
    captured buffers and the stand-in refuses the next replay over storage no live tensor owns."""
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    with pytest.MonkeyPatch.context() as mp, accel.simulate():
        if memo == "planted_lru":
            mp.setattr(lean, "scratch", _lru_scratch)
        target, drafter = tiny("tiny_chameleon", dtype="float32", device="cuda")
        inputs = target.encode_prompt("a red circle", cfg=True)
        eager = decode_ar(target, inputs, sp, None).tokens
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        tree = Eagle2Policy(depth=3, top_k=4, total_tokens=20)
        assert generate(target, drafter, tree, inputs, sp, None).tokens == eager  # captures, replays
        lengths = {target.prompt_length(_prompt_of(target, k)) for k in range(1, 23)}
        for k in range(1, 23):
            prefill(target, drafter, _prompt_of(target, k), sp, 20, 20, None)
        assert len(lengths) == 22
        assert target.static is not None and drafter.static is not None
        graphs_ = [g for st in (target.static, drafter.static) for s in st.steps.values() for g in s.graphs.values()]
        if memo == "planted_lru":
            assert any(g.orphans() for g in graphs_)
            with pytest.raises(accel_graphs.GraphError, match=r"no live tensor owns any more .* in lean_stack"):
                generate(target, drafter, tree, inputs, sp, None)
            return
        assert not any(g.orphans() for g in graphs_)
        for net, st in ((target.net, target.static), (drafter, drafter.static)):
            scratch = net.__dict__["_lean_scratch"]
            pinned = sorted(key[1] for key, ws in scratch.items() if ws.pins)
            assert pinned == list(st.buckets)  # one Scratch per node bucket, kept
            assert len(scratch) == len(pinned) + lean.SCRATCH_SHAPES  # the prompt lengths filled the rest, evicting
        assert generate(target, drafter, tree, inputs, sp, None).tokens == eager
        scd = POLICIES.build("scd", {"window": 8, "init": "up"})
        assert generate(target, None, scd, inputs, sp, accel.generator(target.device, 0)).tokens == eager
        assert sum(g.replays for g in graphs_ if isinstance(g, accel_graphs.StandInGraph)) > 0


def test_routing_sends_a_bucket_to_a_cheaper_larger_one_and_keeps_its_outputs() -> None:
    """``route_by``: a bucket goes to the cheapest larger bucket only when that one is under ``ROUTE_MARGIN`` of its
    time (mini's H200 case: buckets 4 and 8 three times slower than 16); routed verifies equal the variable-shape
    forward in float64 (padding is inert); near the pinned capacity a routed bucket that no longer fits falls back to
    the smallest."""
    plain, _ = tiny("tiny_llamagen")
    static, _ = tiny("tiny_llamagen")
    static.request_static(graphs=False)
    for t in (plain, static):
        t.start(t.encode_prompt("a red circle", cfg=True), 32)
    st = static.static
    times = {1: 0.8, 2: 0.8, 4: 2.5, 8: 2.5, 16: 0.85, 32: 0.9}
    assert st.route_by(times) == {4: 16, 8: 16}
    assert st.route_by({1: 1.0, 2: 0.9, 4: 1.0}) == {}  # within the margin: the smallest stays
    st.route_by(times)
    used: list[int] = []
    run = StaticVerify.run

    def spy(self: StaticVerify) -> tuple[torch.Tensor, torch.Tensor]:
        used.append(self.b)
        return run(self)

    gen = torch.Generator().manual_seed(0)
    lay = plain.layout
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StaticVerify, "run", spy)
        for n in (3, 5, 2, 9):
            mask, depth = random_tree(n, gen)
            toks = lay.image_token_offset + torch.randint(0, lay.num_codes, (n,), generator=gen)
            (a, fa), (b, fb) = (t.verify_forward(toks, mask, depth) for t in (plain, static))
            assert (a - b).abs().max() <= 1e-10 and (fa - fb).abs().max() <= 1e-10, n
            path = torch.nonzero(mask[-1]).view(-1)
            for t in (plain, static):
                t.commit(path)
    assert used == [16, 16, 2, 16]
    assert st.bucket_for(3, st.capacity - 10) == 4  # bucket 16 would run past the pinned capacity


def test_measure_times_every_captured_bucket_on_the_stand_in() -> None:
    """``measure`` replays each captured bucket at its median width and records ms per replay (the stand-in's host
    times here: the path a GPU's capture runs before ``route_by``)."""
    with accel.simulate() as sim:
        target, _ = tiny("tiny_llamagen", dtype="float32", device="cuda")
        target.request_static(graphs=True)
        target.start(target.encode_prompt("a red circle", cfg=True), 16)
        st = target.static
        before = sim.counts["graph_replays"]
        ms = st.measure(repeats=2)
        assert set(ms) == set(st.buckets) and all(t > 0 for t in ms.values())
        assert sim.counts["graph_replays"] - before == 4 * len(st.buckets)
        assert st.route == {}  # off a GPU nothing routes by itself
