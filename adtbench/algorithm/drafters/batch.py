"""The EAGLE drafter for B slots in one forward (batched decoding: ``algorithm.batch``).

``BatchDrafter`` keeps every slot's drafter state in one KV cache with a batch dimension — rows CFG-major like
``models.batch.BatchTarget`` (row ``k·B + s`` is CFG row k of slot s) — with per-slot lengths: ``length[s]`` committed
slots (the prompt's, then one per committed image token) and ``scratch[s]`` speculative slots of the current cycle
after them. ``key_bias [R, C]`` is 0 exactly on a row's valid committed slots.

- ``extend({s: (feats, embeds, pos)})``: every listed slot drops its scratch and appends its committed slots, in one
  forward; each sees its valid committed slots and its new slots causally.
- ``expand({s: (feats, embeds, pos, slot_mask)})``: every listed slot appends one tree level of scratch slots, in one
  forward; node rows see the slot's committed slots and the scratch slots its ``slot_mask [m, scratch + m]`` admits
  (``DraftSession.prepare``'s ancestry).

Both pad the slots to the largest m; a padded or unlisted row writes past its slot's live columns and attends only to
what is already there (its output is never read), so every listed slot gets the outputs of its own drafter alone, up
to float rounding (tested in float64). ``SlotDrafter`` is one slot seen through the ``Drafter`` protocol, for a
``DraftSession``; ``algorithm.batch`` drafts all slots' levels in lockstep through ``expand``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from adtbench.algorithm.drafters.eagle import EagleDrafter
from adtbench.models.base import PrefillResult, Target
from adtbench.models.batch import per_row, row_mask, slot_rows
from adtbench.models.kv import StaticKVCache


class BatchDrafter:
    """``slots`` slots of ``rows_per_slot`` rows (module docstring), ``capacity`` drafter slots per row."""

    def __init__(self, drafter: EagleDrafter, slots: int, rows_per_slot: int, capacity: int) -> None:
        self.B, self.c, self.R, self.capacity = slots, rows_per_slot, slots * rows_per_slot, capacity
        self.single = drafter.fork()  # prompts run through a drafter of their own (variable shapes, ``admit``)
        self.net = drafter.fork()  # the weights over the batch cache
        c, p = drafter.config, drafter.fc.weight
        self.dtype, self.device = p.dtype, p.device
        self.cache = StaticKVCache(c.num_layers, self.R, c.num_kv_heads, capacity, c.head_dim, p.dtype, p.device)
        self.net.cache = self.cache
        self.key_bias = torch.full((self.R, capacity), float("-inf"), dtype=p.dtype, device=p.device)
        self.length = [0] * slots
        self.scratch = [0] * slots
        self._rows = [slot_rows(s, slots, rows_per_slot, p.device) for s in range(slots)]

    def rows(self, s: int) -> torch.Tensor:
        """The rows of slot ``s`` (made once, never written)."""
        return self._rows[s]

    def admit(self, s: int, start: Any) -> torch.Tensor:
        """Slot ``s`` takes a new prompt: ``start(drafter)`` runs the prompt through a single drafter (e.g.
        ``engine.prefill_drafter``) and returns its output at the root; its committed slots are copied into the
        slot's rows. Returns that output ``[c, H]``."""
        one = self.single
        out: torch.Tensor = start(one)
        assert one.cache is not None
        n, rows = one.length, self.rows(s)
        if n > self.capacity:
            raise RuntimeError(f"drafter prompt of {n} slots > batch capacity {self.capacity}")
        self.cache.buf[:, rows, :, :n] = one.cache.buf[:, :, :, :n]
        self.key_bias[rows] = float("-inf")
        self.key_bias[rows, :n] = one.bias[:, :n]
        self.length[s], self.scratch[s] = n, 0
        return out

    def _forward(
        self, reqs: Mapping[int, tuple[torch.Tensor, ...]], blocks: dict[int, torch.Tensor], width: int
    ) -> torch.Tensor:
        """One forward of every row: the listed slots' (feats, embeds, pos) padded to M = the largest m, written at
        columns ``length + scratch + i``; ``blocks[s] [M, width]`` (additive) is slot s's mask over columns
        ``length[s] … length[s] + width − 1`` (past them: nothing; before: ``key_bias``). Returns ``[R, M, H]``."""
        M = max(r[0].shape[1] for r in reqs.values())
        H, dev = self.single.config.hidden_size, self.device
        feats = torch.zeros(self.R, M, H, dtype=self.dtype, device=dev)
        embeds = torch.zeros_like(feats)
        pos = torch.zeros(self.R, M, dtype=torch.long, device=dev)
        eye = torch.full((M, width), float("-inf"), dtype=self.dtype, device=dev)
        block = eye[None].repeat(self.R, 1, 1)
        ar = torch.arange(M, device=dev)
        for s in range(self.B):
            rows = self.rows(s)
            if s in reqs:
                f, e, p = reqs[s][:3]
                m = f.shape[1]
                feats[rows, :m], embeds[rows, :m], pos[rows, :m] = f.to(self.dtype), e.to(self.dtype), p
            block[rows[:, None], ar[None], (self.scratch[s] + ar)[None]] = 0.0  # own column (padding: only that)
            if s in blocks:
                b = blocks[s]
                block[rows, : b.shape[0], : b.shape[1]] = b
        base = per_row([L + S for L, S in zip(self.length, self.scratch, strict=True)], self.c, dev)
        write = base[:, None] + ar[None]
        total = max(self.length) + width
        if total > self.capacity:
            raise RuntimeError(f"drafter KV overflow: need {total} > capacity {self.capacity}")
        cols = per_row(self.length, self.c, dev)[:, None] + torch.arange(width, device=dev)[None]
        return self.net.forward(embeds, feats, pos, row_mask(self.key_bias, cols, block, total), write)

    @torch.no_grad()
    def extend(self, reqs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """Listed slots: drop the scratch, append committed slots (feats, embeds ``[c, m, H]``, positions ``[c, m]``);
        returns each one's last output ``[c, H]`` (it predicts the root's children)."""
        for s in reqs:
            self.scratch[s] = 0
        M = max(r[0].shape[1] for r in reqs.values())
        blocks = {}
        for s, (f, _, _) in reqs.items():
            m = f.shape[1]
            b = torch.full((M, M), float("-inf"), dtype=self.dtype, device=self.device)
            b[:m, :m] = b[:m, :m].triu(1)  # new slot i sees new slots j ≤ i
            blocks[s] = b.fill_diagonal_(0.0)  # and a padded one itself only
        out = self._forward(reqs, blocks, M)
        res = {}
        for s, (f, _, _) in reqs.items():
            m, rows = f.shape[1], self.rows(s)
            self.key_bias[rows, self.length[s] : self.length[s] + m] = 0.0
            self.length[s] += m
            res[s] = out[rows, m - 1]
        return res

    @torch.no_grad()
    def expand(self, reqs: dict[int, tuple[torch.Tensor, ...]]) -> dict[int, torch.Tensor]:
        """Listed slots: append one level of scratch slots (``Drafter.expand``'s arguments: feats, embeds ``[c, m, H]``,
        positions ``[c, m]``, ``slot_mask [m, scratch + m]`` bool or additive); returns each one's ``[c, m, H]``."""
        M = max(r[0].shape[1] for r in reqs.values())
        width = max(self.scratch) + M
        blocks = {}
        for s, r in reqs.items():
            sm = r[3]
            if sm.dtype == torch.bool:
                sm = torch.zeros(sm.shape, dtype=self.dtype, device=self.device).masked_fill_(~sm, float("-inf"))
            blocks[s] = sm.to(self.dtype)
        out = self._forward(reqs, blocks, width)
        res = {}
        for s, r in reqs.items():
            m = r[0].shape[1]
            res[s] = out[self.rows(s), :m]
            self.scratch[s] += m
        return res

    def rollback(self, s: int) -> None:
        self.scratch[s] = 0


class SlotDrafter:
    """Slot ``s`` of a ``BatchDrafter`` through the ``Drafter`` protocol (what a ``DraftSession`` calls);
    ``level_graphs``: its graphed levels in the batch's draft phase (``drafters.batch_phase.SlotLevels``), or None."""

    def __init__(self, batch: BatchDrafter, s: int) -> None:
        self.batch, self.s = batch, s
        self.level_graphs: Any = None

    @property
    def length(self) -> int:
        return self.batch.length[self.s]

    @length.setter
    def length(self, value: int) -> None:
        self.batch.length[self.s] = value

    @property
    def scratch(self) -> int:
        return self.batch.scratch[self.s]

    @scratch.setter
    def scratch(self, value: int) -> None:
        self.batch.scratch[self.s] = value

    def embed(self, target: Target, ids: torch.Tensor) -> torch.Tensor:
        return self.batch.single.embed(target, ids)

    def embed_prompt(self, target: Target, res: PrefillResult) -> torch.Tensor:
        return self.batch.single.embed_prompt(target, res)

    def reset(self, rows: int, capacity: int) -> None:
        raise RuntimeError("a batched slot's drafter starts through BatchDrafter.admit")

    def extend(
        self, feats: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        if valid is not None:
            raise RuntimeError("a batched slot's prompt enters through BatchDrafter.admit")
        return self.batch.extend({self.s: (feats, embeds, pos)})[self.s]

    def expand(
        self, feats: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor, slot_mask: torch.Tensor
    ) -> torch.Tensor:
        return self.batch.expand({self.s: (feats, embeds, pos, slot_mask)})[self.s]

    def rollback(self) -> None:
        self.batch.rollback(self.s)
