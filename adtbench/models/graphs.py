"""Static-shape forwards of the target's verifies and the drafter's levels, and their CUDA graphs (``engine.compile``
on a GPU), gpt-fast / SGLang style.

A CUDA graph replays a fixed sequence of kernels on fixed addresses, so everything a forward reads or writes must
live in buffers that never move and never change shape:

- the KV cache is allocated once per run at a fixed capacity C (``StaticGPTTarget.kv_cache`` at the first prefill
  after ``request_static``) and every image reuses it;
- a forward over n tree nodes runs at the smallest *bucket* b ≥ n of ``BUCKETS`` (1, 2, 4, …, 128): nodes
  n … b − 1 are padding, and every input is copied into the bucket's static buffers — tokens ``[b]``, positions
  ``[R, b]``, the KV columns written ``[b]`` and the additive mask ``[R, 1, b, C]`` over the whole capacity;
- the layers write K/V with ``index_copy_`` at the written columns and attend over all C columns
  (``lean.decoder_layer`` with a tensor ``start``); the mask admits the committed columns, then the tree block.

Padding is inert: a padded node attends to itself only (its row of the block is the identity) and writes its K/V
at columns L + n … L + b − 1, past the committed length L, where no later mask admits them until a commit
overwrites them; its outputs are never read. So a bucketed forward computes, for the n real nodes, exactly what the
variable-shape forward computes (tested on the CPU in float64: ``tests/test_graphs.py``).

The EAGLE drafter does the same (``EagleDrafter.request_static``, ``StaticDrafter``): one pinned drafter cache (with
its ``valid`` / additive ``bias``) for every image, pinned at the first ``reset``, and m new slots at bucket b ≥ m —
feats and embeds ``[R, b, H]``, positions ``[R, b]``, the written columns ``[b]``, the mask ``[R, 1, b, C]``. One
bucket serves ``expand`` (a tree level's scratch slots written after the S earlier ones, at L + S …, seeing the
committed columns and the scratch slots the session's slot mask names) and the decode loop's ``extend`` (m committed
slots at L …, causal among themselves); only the written columns and the mask differ, and both are loaded outside
the graph. Padding is inert as for the target: a padded slot sees itself only and writes past the live slots, where
the next level or ``extend`` overwrites it before any mask admits it. The prompt's ``extend`` (with a ``valid``
mask), calls past the largest bucket or the capacity, and an image whose reset needs more room than was pinned
(logged once) run at variable shapes.

On the CPU ``StaticVerify`` / ``StaticDraft`` run the same static shapes eagerly (what the tests check); on CUDA
each bucket's forward is captured once (``capture``: the target's at the first prefill, the drafter's at its first
reset) — outside the timed scope, its time reported — and replayed by every call of that bucket, the AR step
(bucket 1) included, so the AR baseline and speculation get the same treatment. A captured graph reads the weights
and caches of its capture: no parameter may change after it.
"""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar

import torch

from adtbench import accel

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_Out = TypeVar("_Out")


def bucket_of(n: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket holding ``n`` nodes; None past the largest (that verify runs at its own shape)."""
    return next((b for b in buckets if b >= n), None)


class _Step(Generic[_Out]):
    """One bucket's static-shape forward: ``run`` it eagerly, or ``capture`` it once as a CUDA graph (its stand-in
    off a GPU: ``accel.capture``) and replay it; either way the outputs are static tensors the next ``run`` rewrites
    (read them first)."""

    graph: accel.Graph | None = None
    device: torch.device

    def _forward(self) -> _Out:
        raise NotImplementedError

    def run(self) -> _Out:
        if self.graph is not None:
            self.graph.replay()
            out: _Out = self.graph.out
            return out
        return self._forward()

    def capture(self) -> None:
        """Capture ``run``'s forward (``accel.capture``: two warm-up runs, then the capture)."""
        self.graph = accel.capture(self._forward, self.device)


class StaticVerify(_Step[tuple[torch.Tensor, torch.Tensor]]):
    """The static buffers and forward of one bucket of ``b`` nodes for a target with ``rows`` rows and a pinned
    cache of ``capacity`` columns; ``graph`` after ``capture``."""

    def __init__(self, target: Any, b: int, rows: int, capacity: int) -> None:
        dev = self.device = target.device
        self.target, self.b, self.capacity = target, b, capacity
        self.tokens = torch.zeros(b, dtype=torch.long, device=dev)
        self.pos = torch.zeros(rows, b, dtype=torch.long, device=dev)
        self.cols = torch.arange(b, device=dev)  # a bucket's columns after the committed length
        self.write = self.cols.clone()
        self._pad_block = _padded_block(b, target.dtype, dev)
        self.mask = _initial_mask(self._pad_block, rows, capacity)

    def load(self, tokens: torch.Tensor, block: torch.Tensor, pos: torch.Tensor, length: int) -> None:
        """Copy n real nodes in: ``tokens [n]``, their additive tree block ``[n, n]``, positions ``[R, n]``; the
        committed length ``length`` (L) places the block at columns L … L + b − 1 (``key_bias`` admits the rest)."""
        n, b, L = tokens.numel(), self.b, length
        self.tokens[:n].copy_(tokens)
        self.pos[:, :n].copy_(pos)
        torch.add(self.cols, L, out=self.write)
        self.mask.fill_(float("-inf"))
        self.mask[:, :, :, :L] = self.target.key_bias[:, None, None, :L]
        window = self._pad_block.clone() if n < b else block
        if n < b:
            window[:n, :n] = block
        self.mask[:, :, :, L : L + b] = window

    def _forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.target.static_forward(self.tokens, self.pos, self.write, self.mask)


class _Buckets:
    """The buckets of one model's static forwards (``steps``: bucket size → step with ``capture``), each ≤ the pinned
    capacity (a bucket past it could never run); ``capture_s`` after ``capture``."""

    steps: dict[int, Any]
    buckets: tuple[int, ...]
    capture_s = 0.0

    def capture(self) -> float:
        """Capture every bucket (CUDA graphs, or their stand-in off a GPU); returns and records the seconds it took."""
        t = time.perf_counter()
        for step in self.steps.values():
            step.capture()
            accel.synchronize(step.device)
        self.capture_s = time.perf_counter() - t
        return self.capture_s


class StaticVerifier(_Buckets):
    """All buckets of one target (``StaticGPTTarget.kv_cache``): ``forward`` pads a verify to its bucket, runs it
    and returns the n real nodes' logits and features (copies: the buffers are reused by the next call)."""

    def __init__(self, target: Any, rows: int, capacity: int, buckets: tuple[int, ...] = BUCKETS) -> None:
        self.rows, self.capacity = rows, capacity
        self.buckets = tuple(b for b in buckets if b <= capacity)
        self.steps = {b: StaticVerify(target, b, rows, capacity) for b in self.buckets}

    def fits(self, n: int, length: int, rows: int) -> bool:
        b = bucket_of(n, self.buckets)
        return b is not None and rows == self.rows and length + b <= self.capacity

    def forward(
        self, tokens: torch.Tensor, block: torch.Tensor, pos: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = tokens.numel()
        b = bucket_of(n, self.buckets)
        assert b is not None
        step = self.steps[b]
        step.load(tokens, block, pos, length)
        logits, feats = step.run()
        return logits[:, :n].clone(), feats[:, :n].clone()


class StaticDraft(_Step[torch.Tensor]):
    """The static buffers and forward of one bucket of ``b`` drafter slots (``rows`` rows, hidden size ``hidden``, a
    pinned cache of ``capacity`` columns); ``graph`` after ``capture``. One bucket serves both of the drafter's
    static forwards: ``expand`` (new scratch slots after the earlier ones) and the decode loop's ``extend`` (new
    committed slots, causal among themselves) differ only in the columns written and the mask, both loaded here."""

    def __init__(
        self, drafter: Any, b: int, rows: int, capacity: int, hidden: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.drafter, self.b, self.capacity, self.device = drafter, b, capacity, device
        self.feats = torch.zeros(rows, b, hidden, dtype=dtype, device=device)
        self.embeds = torch.zeros(rows, b, hidden, dtype=dtype, device=device)
        self.pos = torch.zeros(rows, b, dtype=torch.long, device=device)
        self.cols = torch.arange(b, device=device)
        self.write = self.cols.clone()
        self._pad_block = _padded_block(b, dtype, device)
        self.mask = _initial_mask(self._pad_block, rows, capacity)

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
        that column only."""
        m, b = feats.shape[1], self.b
        self.feats[:, :m].copy_(feats)
        self.embeds[:, :m].copy_(embeds)
        self.pos[:, :m].copy_(pos)
        torch.add(self.cols, start, out=self.write)
        self.mask.fill_(float("-inf"))
        self.mask[:, :, :m, :length] = bias[:, None, None, :length]
        self.mask[:, :, :m, length : start + m] = block
        if m < b:
            self.mask[:, :, m:, start + m : start + b] = self._pad_block[m:, m:]

    def _forward(self) -> torch.Tensor:
        out: torch.Tensor = self.drafter.static_forward(self.feats, self.embeds, self.pos, self.write, self.mask)
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
    ) -> None:
        self.rows, self.capacity = rows, capacity
        self.buckets = tuple(b for b in buckets if b <= capacity)
        self.steps = {b: StaticDraft(drafter, b, rows, capacity, hidden, dtype, device) for b in self.buckets}

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


def _initial_mask(pad_block: torch.Tensor, rows: int, capacity: int) -> torch.Tensor:
    """A bucket's mask ``[R, 1, b, capacity]`` before its first ``load``: slot i sees column i only (its initial
    write column), so the warm-up and capture runs have no fully masked row (an SDPA kernel may give NaN there, and
    NaN K/V in the pinned cache would poison later forwards: masked columns still meet V as 0 · NaN)."""
    b = pad_block.shape[0]
    mask = torch.full((rows, 1, b, capacity), float("-inf"), dtype=pad_block.dtype, device=pad_block.device)
    mask[:, :, :, :b] = pad_block
    return mask


def _padded_block(b: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[b, b]``: the identity (a padded node sees itself only; real rows overwrite their block)."""
    return torch.full((b, b), float("-inf"), dtype=dtype, device=device).fill_diagonal_(0.0)
