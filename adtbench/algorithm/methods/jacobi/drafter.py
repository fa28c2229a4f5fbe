"""``init: drafter`` of the Jacobi loop (``methods.jacobi.loop``): new window positions drafted by the EAGLE drafter."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from adtbench.algorithm.sampling import process_logits, sample_rows
from adtbench.algorithm.tree import arange_on
from adtbench.algorithm.verify import CycleRead
from adtbench.models.base import Target
from adtbench.sampling_params import SamplingParams

# --------------------------------------------------------------------------------------------------------
# init=drafter: the EAGLE drafter's chain
# --------------------------------------------------------------------------------------------------------


class DrafterInit:
    """``init: drafter`` — new window positions drafted by the EAGLE drafter (``drafters.eagle``), one chain.

    The drafter's committed slots follow the committed tokens (``commit``: the features of the iteration's committed
    nodes, exact). To draft past the window it first reads the window in one scratch forward: slot k (the root's
    position + k) pairs the *verify forward's* feature at that position — computed on the previous window's token
    there, so stale where the draft changed — with the current draft after it; then it extends the chain one level
    per new token, feeding its own output as the next feature (EAGLE's chain). Every new draft is drawn from the
    drafter's processed distribution q (stored), so the proposal is exact whatever the features."""

    def __init__(self, drafter: Any, target: Target, sp: SamplingParams) -> None:
        self.drafter, self.target, self.sp = drafter, target, sp
        self.out: torch.Tensor | None = None  # the drafter's output at the last committed slot [R, H]
        self.feats: torch.Tensor | None = None  # the last verify's features [R, n, H]
        self.first = 0  # node of ``feats`` at the root's position
        self.pos: torch.Tensor | None = None  # the root's position ids [R]
        self.levels = 0
        self.forwards = 0

    def start(self, res: Any, root: torch.Tensor, slots: int) -> None:
        from adtbench.algorithm.engine import prefill_drafter

        self.out = prefill_drafter(self.target, self.drafter, res, root, slots)
        self.feats, self.pos, self.forwards = None, self.target.next_pos, 1

    def commit(self, read: CycleRead, feats: torch.Tensor, next_pos: torch.Tensor) -> None:
        """The drafter consumes the iteration's committed slots (f of root … d_a, x of d_1 … bonus)."""
        k = read.keep.numel()
        f = feats.index_select(1, read.keep)
        emb = self.drafter.embed(self.target, read.next_tokens)[None].expand(f.shape[0], -1, -1).to(f.dtype)
        pos = next_pos[:, None] + arange_on(k, f.device)[None]
        self.out = self.drafter.extend(f, emb, pos)
        self.feats, self.first, self.pos = feats, k, next_pos + k
        self.forwards += 1

    def _q(self, out: torch.Tensor, gen: int) -> torch.Tensor:
        raw = self.target.lm_head(out[:, None])
        return process_logits(raw, gen, self.target.layout, self.sp)[0]

    def draft(self, st: Any, s: int, t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts for s … s + t − 1 of ``st`` (a ``jacobi.JacobiState``: the window holds g + 1 … s − 1) and their
        proposals."""
        assert self.out is not None and self.pos is not None
        R, dev = self.out.shape[0], self.out.device
        w = s - st.g - 1  # window drafts already there
        out, self.levels = self.out, 0
        if w > 0:  # read the window: slots at the root … s − 2, features of the last verify
            assert self.feats is not None
            f = self.feats[:, self.first : self.first + w]
            emb = self.drafter.embed(self.target, st.seq[st.g + 1 : s])[None].expand(R, -1, -1).to(f.dtype)
            pos = self.pos[:, None] + arange_on(w, dev)[None]
            outs = self.drafter.expand(f, emb, pos, _causal(w, dev))
            out, self.levels = outs[:, -1], 1
        toks, qs = [], []
        for i in range(t):
            logits = self._q(out, s + i)  # forced positions: the constraint leaves the forced token alone
            if self.sp.greedy:
                tok = logits.argmax(-1)
            else:
                p = logits.softmax(-1)
                tok = sample_rows(p, st.generator)
                qs.append(p)
            toks.append(tok.view(1))
            if i + 1 < t:
                emb = self.drafter.embed(self.target, tok.view(1))[None].expand(R, -1, -1).to(out.dtype)
                pos = self.pos[:, None] + (w + i)
                done = self.drafter.scratch
                mask = torch.ones(1, done + 1, dtype=torch.bool, device=dev)
                out = self.drafter.expand(out[:, None], emb, pos, mask)[:, -1]
                self.levels += 1
        self.drafter.rollback()
        self.forwards += self.levels
        return torch.cat(toks), (torch.stack(qs) if qs else None)


@lru_cache(maxsize=64)
def _causal(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


__all__ = ["DrafterInit"]
