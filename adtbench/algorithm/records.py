"""What a decode loop returns: per-cycle records, per-image results, and the clock that times them; and what the host
learns of one verified tree (``Acceptance``, ``verify``'s result).

Every loop (``engine.decode_ar``, ``engine.generate``, ``zipar.decode_zipar``, ``mulo.decode_mulo``) returns a
``GenerationResult`` whose ``cycles`` hold one ``CycleRecord`` per sequential target forward after the prefill;
``a + 1`` is the number of tokens that forward finalised, so τ = committed / cycles counts tokens per sequential
target forward for every method (AR: 1; a tree cycle: accepted drafts + bonus). Loop-specific per-image counters
go to ``GenerationResult.stats`` (written as ``stats`` in samples.jsonl).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from adtbench import accel


@dataclass(frozen=True)
class Acceptance:
    """What the host learns of one verified tree (the engine's one read per cycle; the reference verifier's result)."""

    path: list[int]  # accepted node ids, root first
    bonus: int  # token chosen by the target after the last accepted node
    tree_depth: int = 0  # realised depth d of the verified tree (its live nodes)
    nodes: int = 1  # live nodes verified, root included

    @property
    def accepted(self) -> int:
        """a: accepted draft tokens, bonus excluded."""
        return len(self.path) - 1


@dataclass(kw_only=True)
class CycleRecord:
    """One sequential target forward after the prefill: it finalised ``accepted + 1`` tokens, generation indices
    ``root_gen … root_gen + accepted`` for the tree loop; loops that finalise scattered positions (ZipAR, MuLo-SD) list
    them in ``extra["positions"]`` (the acceptance maps read it). Built by keyword only. In ``trace.jsonl`` the fields
    keep their short names (``TRACE_FIELDS``: pos, nodes, D, d, K, a)."""

    root_gen: int  # generation index of the root
    nodes: int  # verified tree nodes, root included
    drafted_depth: int  # D: sequential drafter levels run (d̄ averages it)
    tree_depth: int  # d: realised depth of the verified tree
    width: int  # K: the policy's top-k / branching
    accepted: int  # a: accepted drafts (bonus excluded)
    extra: dict = field(default_factory=dict)


TRACE_FIELDS = {
    "pos": "root_gen",
    "nodes": "nodes",
    "D": "drafted_depth",
    "d": "tree_depth",
    "K": "width",
    "a": "accepted",
}
"""``trace.jsonl`` key → ``CycleRecord`` attribute (the file format's names, stable since the first runs)."""


@dataclass
class GenerationResult:
    tokens: list[int]
    cycles: list[CycleRecord]
    latency_s: float
    prefill_s: float
    draft_s: float
    verify_s: float
    target_forwards: int
    drafter_forwards: int
    stats: dict[str, Any] = field(default_factory=dict)  # loop-specific per-image counters (samples ``stats``)
    encode_s: float = 0.0  # prompt encoding outside the timed scope (text encoder; Tar's LM): the app's + the loop's

    @property
    def committed(self) -> int:
        return sum(c.accepted + 1 for c in self.cycles)

    @property
    def tau(self) -> float:
        return self.committed / max(1, len(self.cycles))

    @property
    def d_bar(self) -> float:
        """d̄: mean drafted depth per cycle (the ADT-Tree paper's)."""
        return sum(c.drafted_depth for c in self.cycles) / max(1, len(self.cycles))

    @property
    def d_bar_tree(self) -> float:
        """Mean realised depth of the verified trees."""
        return sum(c.tree_depth for c in self.cycles) / max(1, len(self.cycles))


class Clock:
    """Wall clock of a decode loop. ``now()`` synchronises CUDA first (image boundaries: the latency); ``mark()``
    timestamps a point inside the loop without synchronising (a recorded CUDA event on a GPU, ``perf_counter`` on the
    CPU), and ``seconds(a, b)`` turns two marks into seconds once the device has passed both (after a ``now()``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sync = accel.is_cuda(device)

    def now(self) -> float:
        if self.sync:
            accel.synchronize(self.device)
        return time.perf_counter()

    def mark(self) -> Any:
        return accel.mark(self.device)

    def seconds(self, a: Any, b: Any) -> float:
        return accel.elapsed_s(a, b)
