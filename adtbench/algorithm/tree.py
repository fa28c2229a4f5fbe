"""Draft trees: the data a policy proposes and the target verifies.

A ``DraftTree`` of n nodes is given by ``tokens[n]`` and ``parents[n]`` with node 0 the root (the token the
target chose last cycle, not yet in its KV cache) and ``parents[0] = -1``.

Invariants (checked by ``DraftTree.__post_init__``)
- parents precede children: ``parents[j] < j`` for j ≥ 1;
- siblings appear in proposal order (rank order for top-k trees, draw order for sampled trees);
- ``depth[j] = depth[parents[j]] + 1``, ``depth[0] = 0``;
- ``ancestor_mask[i, j]`` is True iff j is i or an ancestor of i (the ancestor closure), so
  ``depth = ancestor_mask.sum(1) − 1``.

Sampled trees (drafts drawn *without replacement* from the drafter's distribution) carry ``proposal[u]``:
the drafter's processed distribution at node u from which u's children were drawn, in draw order. Trees
without it are point-mass (deterministic top-k) proposals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor  # long [n]
    parents: list[int]
    drafted_depth: int  # D: sequential draft levels the drafter ran this cycle (d̄ in the ADT-Tree paper)
    width: int = 0  # K: top-k / branching used by the policy (trace only)
    proposal: dict[int, torch.Tensor] | None = None  # node → drafter probs over its children (sampled trees)
    info: dict[str, float | int | str] = field(default_factory=dict)  # policy-specific trace fields

    def __post_init__(self) -> None:
        n = len(self.parents)
        if self.tokens.numel() != n or n < 1 or self.parents[0] != -1:
            raise ValueError("tree needs tokens[n], parents[n] with parents[0] == -1")
        par = np.asarray(self.parents, dtype=np.int64)
        bad = np.flatnonzero((par[1:] < 0) | (par[1:] >= np.arange(1, n)))
        if bad.size:
            j = int(bad[0]) + 1
            raise ValueError(f"node {j} has parent {self.parents[j]}: parents must precede children")
        self._par = par

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def _ancestry(self) -> tuple[np.ndarray, np.ndarray]:
        """(depth [n], ancestor closure [n, n]), shared by trees of the same shape (static trees repeat theirs every
        cycle): from a bounded per-process cache, else :func:`_ancestry_of`. Never written to."""
        key = tuple(self.parents)
        hit = _ANCESTRY.get(key)
        if hit is None:
            if len(_ANCESTRY) >= _ANCESTRY_MAX:
                _ANCESTRY.clear()
            hit = _ANCESTRY[key] = _ancestry_of(self._par)
        return hit

    @cached_property
    def depth(self) -> torch.Tensor:
        return torch.from_numpy(self._ancestry[0])

    @property
    def max_depth(self) -> int:
        """Realised depth d after reranking (root at depth 0)."""
        return int(self.depth.max())

    @cached_property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for j in range(1, self.size):
            kids[self.parents[j]].append(j)
        return kids

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        return torch.from_numpy(self._ancestry[1])

    def path_to(self, node: int) -> list[int]:
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]

    def retrieve_indices(self, sampling_order: bool = False) -> torch.Tensor:
        """EAGLE's root-to-leaf rows ``[leaves, max_depth + 1]`` padded with −1.

        Rows follow leaf node order; with ``sampling_order`` they are sorted lexicographically (−1 last),
        which is EAGLE-2's order when sampling.
        """
        leaves = [j for j in range(self.size) if not self.children[j]]
        width = self.max_depth + 1
        rows = [self.path_to(j) + [-1] * (width - len(self.path_to(j))) for j in leaves]
        if sampling_order:
            big = self.size + 1
            rows.sort(key=lambda r: [big if v < 0 else v for v in r])
        return torch.tensor(rows, dtype=torch.long)


def _ancestry_of(par: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(depth [n], ancestor closure [n, n]) of a parent array by pointer jumping: one vectorised step per level.
    Trees of one shape share these arrays (and the tensors viewing them): nothing may write to them."""
    n = par.size
    mask = np.eye(n, dtype=bool)
    depth = np.zeros(n, dtype=np.int64)
    rows, cur = np.arange(n), par.copy()
    live = cur >= 0
    while live.any():
        rows, cur = rows[live], cur[live]
        mask[rows, cur] = True
        depth[rows] += 1
        cur = par[cur]
        live = cur >= 0
    return depth, mask


_ANCESTRY: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
_ANCESTRY_MAX = 4096


def root_only(token: int) -> DraftTree:
    """The one-node tree of plain AR decoding."""
    return DraftTree(tokens=torch.tensor([token], dtype=torch.long), parents=[-1], drafted_depth=0, width=0)
