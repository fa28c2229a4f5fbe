"""Static-shape forwards of the target's verifies and the drafter's levels, and their CUDA graphs (``engine.compile``
on a GPU), gpt-fast / SGLang style.

A CUDA graph replays a fixed sequence of kernels on fixed addresses, so everything a forward reads or writes must
live in buffers that never move and never change shape:

- the KV cache is allocated once per run at a fixed capacity C (``StaticGPTTarget.kv_cache`` at the first prefill
  after ``request_static``) and every image reuses it;
- a forward over n tree nodes runs at the smallest *node bucket* b ≥ n of ``BUCKETS`` (1, 2, 4, …, 128): nodes
  n … b − 1 are padding, and every input is copied into the bucket's static buffers — tokens ``[b]``, positions
  ``[R, b]``, the KV columns written ``[b]`` and the additive mask ``[R, 1, b, K]``;
- it attends over the first K columns of the cache, K the smallest *capacity bucket* ≥ L + b (L the committed
  length; ``capacity_buckets``: the capacity in ``CAPACITY_BUCKETS`` equal steps aligned to ``CAPACITY_ALIGN``
  columns), not over the whole capacity C: the attention reads at most one step more than the live length. The
  layers write K/V with ``index_copy_`` at the written columns (``lean.decoder_layer`` with a tensor ``start``); the
  mask admits the committed columns, then the tree block, and nothing past L + b.

One CUDA graph per (node bucket b, capacity bucket K ≥ b): at most 8 × ``CAPACITY_BUCKETS`` = 64 per model (fewer
where a step is shorter than the largest node bucket). All the graphs of a node bucket share its input buffers and
one mask storage of ``R·b·C`` elements (each K views the first ``R·b·K`` of it), so the static inputs take the memory
they took with one graph per node bucket; what grows with the number of graphs is the capture time (each capture
is three forwards: two warm-ups and the capture) and, on CUDA, each graph's private pool of intermediates (sharing
one pool between them needs ``accel_graphs.capture`` to pass ``pool=`` to ``torch.cuda.graph``).

Padding is inert: a padded node attends to itself only (its row of the block is the identity) and writes its K/V
at columns L + n … L + b − 1, past the committed length L, where no later mask admits them until a commit
overwrites them; its outputs are never read. So a bucketed forward computes, for the n real nodes, exactly what the
variable-shape forward computes (tested on the CPU in float64: ``tests/test_graphs.py``).

The EAGLE drafter does the same (``EagleDrafter.request_static``, ``StaticDrafter``): one pinned drafter cache (with
its ``valid`` / additive ``bias``) for every image, pinned at the first ``reset``, and m new slots at bucket b ≥ m —
feats and embeds ``[R, b, H]``, positions ``[R, b]``, the written columns ``[b]``, the mask ``[R, 1, b, K]`` over
the first K columns (K the smallest capacity bucket past the last written column). One bucket serves ``expand`` (a
tree level's scratch slots written after the S earlier ones, at L + S …, seeing the committed columns and the
scratch slots the session's slot mask names) and the decode loop's ``extend`` (m committed slots at L …, causal
among themselves); only the written columns and the mask differ, and both are loaded outside the graph. Padding is
inert as for the target: a padded slot sees itself only and writes past the live slots, where the next level or
``extend`` overwrites it before any mask admits it. The prompt's ``extend`` (with a ``valid``
mask), calls past the largest bucket or the capacity, and an image whose reset needs more room than was pinned
(logged once) run at variable shapes.

On the CPU ``StaticVerify`` / ``StaticDraft`` run the same static shapes eagerly (what the tests check); on CUDA
each (node bucket, capacity bucket) forward is captured once (``capture``: the target's at the first prefill, the
drafter's at its first reset) — outside the timed scope, its time reported — and replayed by every call of that
pair, the AR step (node bucket 1) included, so the AR baseline and speculation get the same treatment. A captured
graph reads the weights and caches of its capture: no parameter may change after it.

**Routing by measured cost** (real CUDA only): a node bucket is not always faster than the next larger one — on an
H200 mini's buckets 4 and 8 replay in ≈ 2.5 ms against ≈ 0.8 ms at 2 and at 16 (another kernel choice at those
row counts). After the target's capture ``StaticVerifier.measure`` times one replay of every bucket (CUDA events,
the bucket's median width) and ``route_by`` sends n nodes to the cheapest bucket b ≥ n whose time is below
``ROUTE_MARGIN`` × the smallest fitting bucket's (ties and noise keep the smallest). Padding is inert, so a routed
forward computes what the smallest bucket computes; only its kernels differ. Off a GPU (the stand-in's times are
host times) the route is the smallest bucket, as before.
"""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar

import torch

from adtbench import accel, accel_graphs
from adtbench.graph_runner import GraphRunner

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
CAPACITY_BUCKETS = 8  # attention widths per node bucket: the pinned capacity in this many equal steps
CAPACITY_ALIGN = 64  # a step is a multiple of this many columns
ROUTE_MARGIN = 0.8  # a larger bucket takes n nodes only when it replays in under 0.8× the smallest fitting one
_Out = TypeVar("_Out")


def bucket_of(n: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket holding ``n`` nodes; None past the largest (that verify runs at its own shape)."""
    return next((b for b in buckets if b >= n), None)


def capacity_buckets(capacity: int, count: int = CAPACITY_BUCKETS, align: int = CAPACITY_ALIGN) -> tuple[int, ...]:
    """The attention widths of a pinned cache of ``capacity`` columns: multiples of one step (``capacity / count``
    rounded up to a multiple of ``align``) short of the capacity by half a step or more, then the capacity itself — at
    most ``count`` widths, the last at most 1.5 steps wide."""
    step = -(-capacity // max(1, count))
    step = -(-step // align) * align
    return (*range(step, capacity - step // 2 + 1, step), capacity)


class _Step(GraphRunner, Generic[_Out]):
    """One node bucket's static-shape forwards, one per capacity bucket ``K`` (``widths``): ``run`` the one the last
    ``load`` chose (``width``) eagerly, or ``capture_widths`` each once as a CUDA graph (its stand-in off a GPU: the
    ``graph_runner.GraphRunner`` it is, keyed by ``K``) and replay it; either way the outputs are static tensors the
    next ``run`` rewrites (read them first). The widths share the node bucket's input buffers and one mask storage
    (``_mask_at``)."""

    b: int
    device: torch.device
    widths: tuple[int, ...]
    width: int  # the capacity bucket the next ``run`` attends over
    _mask_store: torch.Tensor  # R·b·C elements: the mask of every width is a view of its first R·b·K
    _pad_block: torch.Tensor

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, graphed=False)  # graphed once ``capture_widths`` captured every width
        self.masks: dict[int, torch.Tensor] = {}

    def _init_masks(self, rows: int, widths: tuple[int, ...]) -> None:
        """The mask views ``[R, 1, b, K]`` of every width K ≥ b (over one storage), each set to ``_initial_mask``."""
        self.widths = tuple(w for w in widths if w >= self.b)
        size = rows * self.b * self.widths[-1]
        self._mask_store = torch.empty(size, dtype=self._pad_block.dtype, device=self.device)
        for K in self.widths:
            self.masks[K] = self._mask_store[: rows * self.b * K].view(rows, 1, self.b, K)
        self.width = self.widths[-1]
        self._reset_mask(self.width)

    def _reset_mask(self, K: int) -> None:
        _initial_mask(self._pad_block, self.masks[K])

    def _width_for(self, end: int) -> int:
        """The smallest width holding columns ``0 … end − 1``."""
        return next(w for w in self.widths if w >= end)

    def _forward_at(self, K: int) -> _Out:
        raise NotImplementedError

    @property
    def graph(self) -> accel_graphs.Graph | None:
        """The captured graph of the current width (None before ``capture``)."""
        return self.graphs.get(self.width)

    def run(self) -> _Out:
        K = self.width
        out: _Out = self.replay_or_run(K, lambda: self._forward_at(K))
        return out

    def capture_widths(self) -> int:
        """Capture the forward of every width (``GraphRunner.capture``: two warm-up runs, then the capture; the mask of
        the width reset first, so no row is fully masked); returns the number of graphs."""
        for K in self.widths:
            self._reset_mask(K)
            self.width = K
            self.capture(K, lambda K=K: self._forward_at(K))
        self.graphed = True
        return len(self.widths)


class StaticVerify(_Step[tuple[torch.Tensor, torch.Tensor]]):
    """The static buffers and forwards of one bucket of ``b`` nodes for a target with ``rows`` rows over a pinned
    cache, at the attention ``widths`` (capacity buckets); ``graphs`` after ``capture``."""

    def __init__(self, target: Any, b: int, rows: int, widths: tuple[int, ...]) -> None:
        super().__init__(target.device)
        dev = self.device
        self.target, self.b = target, b
        self.tokens = torch.zeros(b, dtype=torch.long, device=dev)
        self.pos = torch.zeros(rows, b, dtype=torch.long, device=dev)
        self.cols = torch.arange(b, device=dev)  # a bucket's columns after the committed length
        self.write = self.cols.clone()
        self._pad_block = _padded_block(b, target.dtype, dev)
        self._init_masks(rows, widths)

    @property
    def mask(self) -> torch.Tensor:
        """The mask of the current width ``[R, 1, b, K]``."""
        return self.masks[self.width]

    def load(self, tokens: torch.Tensor, block: torch.Tensor, pos: torch.Tensor, length: int) -> None:
        """Copy n real nodes in: ``tokens [n]``, their additive tree block ``[n, n]``, positions ``[R, n]``; the
        committed length ``length`` (L) places the block at columns L … L + b − 1 (``key_bias`` admits the rest) and
        picks the width: the smallest capacity bucket ≥ L + b."""
        n, b, L = tokens.numel(), self.b, length
        self.width = self._width_for(L + b)
        mask = self.masks[self.width]
        self.tokens[:n].copy_(tokens)
        self.pos[:, :n].copy_(pos)
        torch.add(self.cols, L, out=self.write)
        mask.fill_(float("-inf"))
        mask[:, :, :, :L] = self.target.key_bias[:, None, None, :L]
        window = self._pad_block.clone() if n < b else block
        if n < b:
            window[:n, :n] = block
        mask[:, :, :, L : L + b] = window

    def place(self, length: torch.Tensor, base: torch.Tensor, block: torch.Tensor, K: int) -> None:
        """``load``'s placement from a device length ``[1]`` (L), for a step captured as a graph (no host value): the
        written columns L … L + b − 1 and the mask of width K — ``base [R, K]`` (additive: the committed columns'
        bias, −inf from L on) with the additive ``block [b, b]`` (the padded nodes' rows the identity) over columns
        L … L + b − 1. The tokens and positions are the caller's to write."""
        b, dev = self.b, self.device
        torch.add(self.cols, length, out=self.write)
        rel = torch.arange(K, device=dev) - length
        cols = block.index_select(1, rel.clamp(0, b - 1))  # [b, K]
        inside = (rel >= 0) & (rel < b)
        self.masks[K].copy_(torch.where(inside[None, None], cols[None], base[:, None])[:, None])

    def _forward_at(self, K: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.target.static_forward(self.tokens, self.pos, self.write, self.masks[K])


class _Buckets:
    """The buckets of one model's static forwards (``steps``: node bucket → step with ``capture``), each ≤ the pinned
    capacity (a bucket past it could never run), each at the attention ``widths`` (capacity buckets) ≥ its size;
    ``capture_s`` and ``captures`` (the number of graphs) after ``capture``."""

    steps: dict[int, Any]
    buckets: tuple[int, ...]
    widths: tuple[int, ...]
    capture_s = 0.0
    captures = 0

    def capture(self) -> float:
        """Capture every (node bucket, width) pair (CUDA graphs, or their stand-in off a GPU); returns and records the
        seconds it took."""
        t = time.perf_counter()
        self.captures = 0
        for step in self.steps.values():
            self.captures += step.capture_widths()
            accel.synchronize(step.device)
        self.capture_s = time.perf_counter() - t
        return self.capture_s


class StaticVerifier(_Buckets):
    """All buckets of one target (``StaticGPTTarget.kv_cache``): ``forward`` pads a verify to its bucket, runs it
    and returns the n real nodes' logits and features (copies: the buffers are reused by the next call)."""

    def __init__(
        self,
        target: Any,
        rows: int,
        capacity: int,
        buckets: tuple[int, ...] = BUCKETS,
        widths: tuple[int, ...] | None = None,
    ) -> None:
        self.rows, self.capacity = rows, capacity
        self.buckets = tuple(b for b in buckets if b <= capacity)
        self.widths = capacity_buckets(capacity) if widths is None else widths
        assert self.widths[-1] == capacity, "the largest width is the pinned capacity"
        self.steps = {b: StaticVerify(target, b, rows, self.widths) for b in self.buckets}
        self.route: dict[int, int] = {}  # smallest fitting bucket → the bucket that runs it (``route_by``)
        self.replay_ms: dict[int, float] = {}  # ``measure``'s figures

    def bucket_for(self, n: int, length: int) -> int | None:
        """The bucket a verify of ``n`` nodes after ``length`` committed columns runs at: where ``route_by`` sent the
        smallest bucket holding it when that one fits the pinned capacity, else the smallest."""
        b = bucket_of(n, self.buckets)
        if b is None:
            return None
        routed = self.route.get(b, b)
        return routed if length + routed <= self.capacity else b

    def route_by(self, times: dict[int, float], margin: float = ROUTE_MARGIN) -> dict[int, int]:
        """Route each bucket b to the cheapest bucket c ≥ b by ``times`` (ms per replay) when t(c) < ``margin`` ·
        t(b), else keep b; returns the routes that moved (also kept in ``route``)."""
        self.route = {}
        for b in self.buckets:
            if b not in times:
                continue
            best = min((c for c in self.buckets if c >= b and c in times), key=lambda c: (times[c], c))
            if times[best] < margin * times[b]:
                self.route[b] = best
        return dict(self.route)

    def measure(self, repeats: int = 5) -> dict[int, float]:
        """ms per replay of every captured bucket at its median width (two warm-up replays, then ``repeats`` back to
        back between two ``accel.mark``s, one synchronisation): ``replay_ms``. The inputs are whatever the buffers
        hold (a replay's time does not depend on them; its writes land past the committed columns)."""
        for b, step in self.steps.items():
            K = step.widths[len(step.widths) // 2]
            graph = step.graphs.get(K)
            if graph is None:
                continue
            step.width = K
            for _ in range(2):
                graph.replay()
            accel.synchronize(step.device)
            t0 = accel.mark(step.device)
            for _ in range(repeats):
                graph.replay()
            t1 = accel.mark(step.device)
            accel.synchronize(step.device)
            self.replay_ms[b] = 1e3 * accel.elapsed_s(t0, t1) / repeats
        return dict(self.replay_ms)

    def fits(self, n: int, length: int, rows: int) -> bool:
        b = self.bucket_for(n, length)
        return b is not None and rows == self.rows and length + b <= self.capacity

    def forward(
        self, tokens: torch.Tensor, block: torch.Tensor, pos: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = tokens.numel()
        b = self.bucket_for(n, length)
        assert b is not None
        step = self.steps[b]
        step.load(tokens, block, pos, length)
        logits, feats = step.run()
        return logits[:, :n].clone(), feats[:, :n].clone()


class StaticDraft(_Step[torch.Tensor]):
    """The static buffers and forwards of one bucket of ``b`` drafter slots (``rows`` rows, hidden size ``hidden``)
    over a pinned cache, at the attention ``widths`` (capacity buckets); ``graphs`` after ``capture``. One bucket
    serves both of the drafter's static forwards: ``expand`` (new scratch slots after the earlier ones) and the
    decode loop's ``extend`` (new committed slots, causal among themselves) differ only in the columns written and the
    mask, both loaded here."""

    def __init__(
        self,
        drafter: Any,
        b: int,
        rows: int,
        widths: tuple[int, ...],
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(device)
        self.drafter, self.b = drafter, b
        self.feats = torch.zeros(rows, b, hidden, dtype=dtype, device=device)
        self.embeds = torch.zeros(rows, b, hidden, dtype=dtype, device=device)
        self.pos = torch.zeros(rows, b, dtype=torch.long, device=device)
        self.cols = torch.arange(b, device=device)
        self.write = self.cols.clone()
        self._pad_block = _padded_block(b, dtype, device)
        self._init_masks(rows, widths)

    @property
    def mask(self) -> torch.Tensor:
        """The mask of the current width ``[R, 1, b, K]``."""
        return self.masks[self.width]

    def load(
        self,
        feats: torch.Tensor,
        embeds: torch.Tensor,
        pos: torch.Tensor,
        bias: torch.Tensor,
        block: torch.Tensor,
        length: int,
        start: int,
    ) -> None:
        """Copy m real slots in: ``feats``, ``embeds [R, m, H]``, positions ``[R, m]``, written at columns
        ``start … start + m − 1``. Real slot i attends the committed columns ``< length`` through ``bias [R, ≥ length]``
        (additive) and columns ``length … start + m − 1`` through row i of ``block [m, start + m − length]``
        (additive: the earlier scratch slots, then the new ones). Padded slot i ≥ m writes at ``start + i`` and sees
        that column only. The width: the smallest capacity bucket ≥ ``start + b``."""
        m, b = feats.shape[1], self.b
        self.width = self._width_for(start + b)
        mask = self.masks[self.width]
        self.feats[:, :m].copy_(feats)
        self.embeds[:, :m].copy_(embeds)
        self.pos[:, :m].copy_(pos)
        torch.add(self.cols, start, out=self.write)
        mask.fill_(float("-inf"))
        mask[:, :, :m, :length] = bias[:, None, None, :length]
        mask[:, :, :m, length : start + m] = block
        if m < b:
            mask[:, :, m:, start + m : start + b] = self._pad_block[m:, m:]

    def _forward_at(self, K: int) -> torch.Tensor:
        out: torch.Tensor = self.drafter.static_forward(self.feats, self.embeds, self.pos, self.write, self.masks[K])
        return out


class StaticDrafter(_Buckets):
    """All buckets of one drafter (``EagleDrafter.request_static``) over its pinned cache of ``capacity`` columns:
    ``forward`` pads m slots to their bucket, runs it and returns the m real outputs (a copy: the buffers are reused
    by the next call)."""

    def __init__(
        self,
        drafter: Any,
        rows: int,
        capacity: int,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
        buckets: tuple[int, ...] = BUCKETS,
        widths: tuple[int, ...] | None = None,
    ) -> None:
        self.rows, self.capacity = rows, capacity
        self.buckets = tuple(b for b in buckets if b <= capacity)
        self.widths = capacity_buckets(capacity) if widths is None else widths
        assert self.widths[-1] == capacity, "the largest width is the pinned capacity"
        self.steps = {b: StaticDraft(drafter, b, rows, self.widths, hidden, dtype, device) for b in self.buckets}

    def fits(self, m: int, start: int) -> bool:
        """m slots written from column ``start`` run at a bucket: one holds m and its padding stays in the cache."""
        b = bucket_of(m, self.buckets)
        return b is not None and start + b <= self.capacity

    def forward(
        self,
        feats: torch.Tensor,
        embeds: torch.Tensor,
        pos: torch.Tensor,
        bias: torch.Tensor,
        block: torch.Tensor,
        length: int,
        start: int,
    ) -> torch.Tensor:
        """``StaticDraft.load`` at m's bucket, then ``run``: the outputs ``[R, m, H]`` of the m real slots."""
        m = feats.shape[1]
        b = bucket_of(m, self.buckets)
        assert b is not None
        step = self.steps[b]
        step.load(feats, embeds, pos, bias, block, length, start)
        return step.run()[:, :m].clone()


def _initial_mask(pad_block: torch.Tensor, mask: torch.Tensor) -> None:
    """Set a bucket's mask ``[R, 1, b, K]`` as before its first ``load``: slot i sees column i only (its initial write
    column), so the warm-up and capture runs have no fully masked row (an SDPA kernel may give NaN there, and NaN K/V
    in the pinned cache would poison later forwards: masked columns still meet V as 0 · NaN)."""
    b = pad_block.shape[0]
    mask.fill_(float("-inf"))
    mask[:, :, :, :b] = pad_block


def _padded_block(b: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[b, b]``: the identity (a padded node sees itself only; real rows overwrite their block)."""
    return torch.full((b, b), float("-inf"), dtype=dtype, device=device).fill_diagonal_(0.0)
