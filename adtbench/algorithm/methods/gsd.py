"""GSD's grouped acceptance (arXiv 2508.07747; lossy): a relaxed acceptance rule of the Jacobi loop (``policy=gsd``),
beside LANTERN's (``lantern.LanternRule``) — both ``verify.AcceptanceRule``s."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from adtbench.algorithm.verify import AcceptanceRule
from adtbench.models.base import Target

if TYPE_CHECKING:
    from adtbench.algorithm.methods.jacobi.loop import JacobiParams


class GroupedRule(AcceptanceRule):
    """GSD's grouped acceptance test (arXiv 2508.07747; lossy): for a draft x drawn from q under target p, its group
    G(x) = the tokens y within a window of ``size`` ranks of p's order — x, the ``below`` = size // 2 ranks just
    below it (lower p) and the ``above`` = size − below − 1 ranks just above it (the reference's slice of 7 lower, x
    and 6 higher at size 14) — with |p(y) − p(x)| < ``gap`` and
    ‖e(y) − e(x)‖² < ``dist`` (e: the target's input embedding of image tokens; x ∈ G always); accept with
    min(1, Σ_G p / Σ_G q). On rejection the plain residual max(p − q, 0) (not group-corrected, as the reference).
    The paper's guarantee — acceptance at least the exact rule's — holds where the rest of the group has
    Σp / Σq ≥ p(x) / q(x) (a mediant), e.g. for a point-mass q. Vectorised over rows: two top-k's per row for the
    rank window (ties among equal probabilities fall as top-k breaks them, as the reference's argsort), a
    [rows, size] candidate window. Greedy stays exact (argmax)."""

    name = "gsd"
    lossless = False

    def __init__(self, embeddings: torch.Tensor, offset: int, size: int, gap: float, dist: float) -> None:
        self.emb, self.offset, self.gap, self.dist = embeddings, offset, gap, dist
        self.below = size // 2
        self.above = max(0, size - self.below - 1)
        self.codes = embeddings.shape[0]

    def proposal_rows(
        self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor, px: torch.Tensor, qx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[m, V]``: the group's acceptance and the plain residual. The rank window around x is two top-k's
        (the ``above`` tokens just above p(x), the ``below`` + 1 at or below it) rather than a full sort."""
        V, inf = p.shape[-1], float("inf")  # a Python scalar: no host→device copy (a sync on CUDA)
        at_or_below = torch.where(p <= px[:, None], p, -inf).topk(min(self.below + 1, V), -1)
        above = torch.where(p > px[:, None], -p, -inf).topk(min(self.above, V), -1)
        cand = torch.cat([above.indices, at_or_below.indices], -1)  # [m, ≤ size]
        inside = torch.cat([above.values, at_or_below.values], -1) > -inf
        pc, qc = p.gather(1, cand), q.gather(1, cand)
        code = (cand - self.offset).clamp(0, self.codes - 1)
        image = (cand >= self.offset) & (cand < self.offset + self.codes)
        ex = self.emb[(x - self.offset).clamp(0, self.codes - 1)]
        near = ((self.emb[code] - ex[:, None]) ** 2).sum(-1) < self.dist
        group = inside & (cand != x[:, None]) & ((pc - px[:, None]).abs() < self.gap) & image & near
        num, den = px + (pc * group).sum(-1), qx + (qc * group).sum(-1)  # x itself always, once
        return (num / den).clamp_max(1.0).nan_to_num(1.0), (p - q).clamp_min(0.0)


def grouped_rule(target: Target, params: JacobiParams) -> GroupedRule:
    """``GroupedRule`` on ``target``'s input embeddings of its image tokens (float32, on its device)."""
    lay = target.layout
    ids = lay.image_token_offset + torch.arange(lay.num_codes, device=target.device)
    emb = target.embed_tokens(ids).to(torch.float32)
    return GroupedRule(emb, lay.image_token_offset, params.group_size, params.group_gap, params.group_dist)


__all__ = ["GroupedRule", "grouped_rule"]
