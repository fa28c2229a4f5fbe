"""Raster-causal attention over a KV cache filled out of raster order (ZipAR, MuLo-SD verification and resampling).

A ``Target``'s generated cache columns are appended in *feeding* order, and a slot (generation index) may be fed
more than once: a resampled token, or a kept token refreshed in its final context. ``RasterCache`` records the slot
of every column and builds the ``allowed`` mask of ``Target.forward_at``:

- a token at slot s attends to the **latest** column of every slot < s (older columns of a slot are superseded
  and never attended again), to the *real* new tokens of the same forward at slots < s, and to itself;
- a new real token supersedes the older column of its slot from this forward on;
- a *temporary* token (a query whose K/V is not kept: a stand-in or a re-query) is attended by no other token.

So every query sees exactly one value per raster-earlier slot it can see — the newest one fed — which is the
raster-causal context of the model's training whenever those values are final. Slots never fed are invisible
(ZipAR's rows that have not reached a column yet).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class RasterCache:
    """Slot bookkeeping of a target's generated cache columns (module docstring); ``num_slots`` = image tokens."""

    def __init__(self, num_slots: int) -> None:
        self.col_slot = np.zeros(0, dtype=np.int64)  # slot held by each generated column, feeding order
        self.latest = np.full(num_slots, -1, dtype=np.int64)  # newest column of each slot (−1: never fed)
        self.live = np.zeros(0, dtype=bool)  # column is the newest of its slot (== latest[col_slot] == arange)

    @property
    def columns(self) -> int:
        return int(self.col_slot.size)

    def fed(self, slot: int) -> bool:
        return bool(self.latest[slot] >= 0)

    def allowed(self, slots: Sequence[int], real: Sequence[bool]) -> torch.Tensor:
        """Bool ``[n, G + n]`` for ``Target.forward_at`` (G = columns so far) for new tokens at ``slots``."""
        s = np.asarray(slots, dtype=np.int64)
        r = np.asarray(real, dtype=bool)
        if s.size != r.size:
            raise ValueError("slots and real differ in length")
        if len(set(s[r].tolist())) != int(r.sum()):
            raise ValueError("two real tokens at one slot in one forward")
        live = self.live
        superseded = self.latest[s[r]]  # the live column of each slot a real token of this forward re-feeds
        superseded = superseded[superseded >= 0]
        if superseded.size:
            live = live.copy()
            live[superseded] = False
        old = live[None, :] & (self.col_slot[None, :] < s[:, None])
        new = (r[None, :] & (s[None, :] < s[:, None])) | np.eye(s.size, dtype=bool)
        return torch.from_numpy(np.concatenate([old, new], axis=1))

    def commit(self, slots: Sequence[int], real: Sequence[bool]) -> torch.Tensor:
        """Record the real tokens of a forward as new columns; returns their indices for ``Target.commit``."""
        keep = np.flatnonzero(np.asarray(real, dtype=bool))
        new_slots = np.asarray(slots, dtype=np.int64)[keep]
        prev = self.latest[new_slots]
        self.live[prev[prev >= 0]] = False
        self.latest[new_slots] = self.columns + np.arange(keep.size)
        self.col_slot = np.concatenate([self.col_slot, new_slots])
        self.live = np.concatenate([self.live, np.ones(keep.size, dtype=bool)])
        return torch.from_numpy(keep)
