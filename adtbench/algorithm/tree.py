"""Draft trees: the data a policy proposes and the target verifies.

A ``DraftTree`` of n nodes is given by ``tokens[n]`` and ``parents[n]`` with node 0 the root (the token the
target chose last cycle, not yet in its KV cache) and ``parents[0] = -1``. Every tensor lives on the device the
tree was built on (the drafter's): a policy builds the tree there and the engine verifies it there, so no tree
tensor crosses to the host during a cycle.

Invariants (built in by the policies' builders; checked by ``DraftTree`` for trees given host parents)
- parents precede children: ``parents[j] < j`` for j ≥ 1;
- siblings appear in proposal order (rank order for top-k trees, draw order for sampled trees);
- ``depth[j] = depth[parents[j]] + 1``, ``depth[0] = 0``;
- ``ancestor_mask[i, j]`` is True iff j is i or an ancestor of i (the ancestor closure), so
  ``depth = ancestor_mask.sum(1) − 1``;
- ``alive[j]`` is False for a node the drafter gave probability 0 (a top-k rank past the drafter's support, a
  Gumbel key of −inf) and for every descendant of one: such nodes keep the tree's shape static but are never
  accepted (the host-side builders of earlier versions dropped them).

Sampled trees (drafts drawn *without replacement* from the drafter's distribution) carry ``proposal [n, V]``:
row u is the drafter's processed distribution at node u from which u's children were drawn, in draw order (rows
of nodes without children are unused). Trees without it are point-mass (deterministic top-k) proposals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import torch


@dataclass(frozen=True)
class HostTree:
    """What a host-side builder already holds of its tree (``policies.eagle2``'s host path), so the host views of
    ``DraftTree`` need no read: ``parents`` (node 0's −1 first), the realised depth over the live nodes, and the
    liveness per node (None: every node live). Never written to."""

    parents: list[int]
    max_depth: int
    alive: list[bool] | None = None


class DraftTree:
    """One cycle's draft tree (module docstring). ``drafted_depth`` D: sequential drafter levels run this cycle
    (d̄ in the ADT-Tree paper); ``width`` K: the policy's top-k / branching (trace only); ``info``: policy trace
    fields (host values). ``depth``, ``ancestor_mask``, ``max_children`` and ``child_ranks`` may be given by a builder
    that knows them (static shapes); otherwise they are derived from ``parents``. ``static``: every tensor given is a
    static buffer that a graph rewrites in place (a draft phase's, ``drafters.draft_phase``): a graphed verify reads
    them inside its replay instead of copying them in (``tree_step``). ``readout``: float64 scalars the policy decided
    on the device (``budget: cost``'s node count, ``policies.eagle2``), read with the verdict and handed to
    ``on_read`` (every verify path packs them into its one read: ``tree_step``, ``batch_step``,
    ``verify.read_verdicts``). ``host``: the builder's host
    copies (``HostTree``), read by the host views instead of the tensors."""

    def __init__(
        self,
        tokens: torch.Tensor,
        parents: torch.Tensor | Sequence[int] | np.ndarray,
        drafted_depth: int,
        width: int = 0,
        proposal: torch.Tensor | Mapping[int, torch.Tensor] | None = None,
        info: dict[str, float | int | str] | None = None,
        *,
        alive: torch.Tensor | None = None,
        depth: torch.Tensor | None = None,
        ancestor_mask: torch.Tensor | None = None,
        max_children: int | None = None,
        child_ranks: torch.Tensor | None = None,
        static: bool = False,
        readout: torch.Tensor | None = None,
        on_read: Callable[[list[float]], None] | None = None,
        host: HostTree | None = None,
    ) -> None:
        dev = tokens.device
        self.host = host
        self.static = static
        self.readout, self.on_read = readout, on_read
        self.tokens = tokens
        self.drafted_depth, self.width = drafted_depth, width
        self.info: dict[str, float | int | str] = {} if info is None else info
        self.alive = alive
        n = tokens.numel()
        if isinstance(parents, torch.Tensor):
            self.parents = parents if parents.device == dev else parents.to(dev)
            par: np.ndarray | None = None
        else:  # host parents (tests, host-built trees): checked, and the static structure is derived on the host
            par = np.asarray(parents, dtype=np.int64)
            _check_parents(par, n)
            self.parents = torch.from_numpy(par).to(dev)
        if depth is None or ancestor_mask is None:
            if par is None:
                par = self.parents.cpu().numpy()
            d, anc = host_ancestry(par)
            depth = torch.from_numpy(d).to(dev) if depth is None else depth
            ancestor_mask = torch.from_numpy(anc).to(dev) if ancestor_mask is None else ancestor_mask
        self.depth, self.ancestor_mask = depth, ancestor_mask
        self._max_children = max_children
        self._child_ranks = child_ranks
        if isinstance(proposal, Mapping):
            rows = torch.zeros(n, next(iter(proposal.values())).numel(), dtype=torch.float64, device=dev)
            for u, q in proposal.items():
                rows[u] = q.to(dev, torch.float64)
            proposal = rows
        self.proposal = proposal

    @property
    def size(self) -> int:
        return self.tokens.numel()

    # --- host views (reference verifier, sampled-tree bookkeeping, tests): each reads the device once -----------
    @cached_property
    def parent_list(self) -> list[int]:
        if self.host is not None:
            return self.host.parents
        return [int(p) for p in self.parents.tolist()]

    @cached_property
    def token_list(self) -> list[int]:
        return [int(t) for t in self.tokens.tolist()]

    @cached_property
    def alive_list(self) -> list[bool]:
        """Per node: live (``alive``; every node when the tree has no dead ones)."""
        if self.host is not None and self.host.alive is not None:
            return self.host.alive
        return [True] * self.size if self.alive is None else self.alive.tolist()

    @property
    def max_depth(self) -> int:
        """Realised depth d after reranking (root at depth 0), over the live nodes."""
        if self.host is not None:
            return self.host.max_depth
        if self.alive is None:
            return int(self.depth.max())
        return max(int(d) for d, live in zip(self.depth.tolist(), self.alive_list, strict=True) if live)

    @property
    def live_nodes(self) -> int:
        """Live nodes, the root included."""
        return self.size if self.alive is None else sum(self.alive_list)

    @cached_property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for j, p in enumerate(self.parent_list[1:], start=1):
            kids[p].append(j)
        return kids

    @cached_property
    def child_ranks(self) -> torch.Tensor:
        """``[n, max_children]`` on the tree's device: the node id of each node's r-th child (sibling order), −1 where
        it has fewer; given by static builders, else derived on the device (no read)."""
        return tree_child_ranks(self)

    @property
    def max_children(self) -> int:
        """The most children any node has (the acceptance loop's length); given by static builders."""
        if self._max_children is None:
            self._max_children = max((len(k) for k in self.children), default=0)
        return self._max_children

    @property
    def is_chain(self) -> bool:
        """Is this a chain root → 1 → … → n − 1 of live nodes, as its builder declared (``max_children`` ≤ 1 given: no
        device read)? Nodes with at most one child each form one, ids following depth (parents precede children)."""
        return self.size > 1 and self._max_children is not None and self._max_children <= 1 and self.alive is None

    def path_to(self, node: int) -> list[int]:
        path = [node]
        while self.parent_list[path[-1]] >= 0:
            path.append(self.parent_list[path[-1]])
        return path[::-1]

    def retrieve_indices(self, sampling_order: bool = False) -> torch.Tensor:
        """EAGLE's root-to-leaf rows ``[leaves, max_depth + 1]`` padded with −1.

        Rows follow leaf node order; with ``sampling_order`` they are sorted lexicographically (−1 last),
        which is EAGLE-2's order when sampling.
        """
        leaves = [j for j in range(self.size) if not self.children[j]]
        width = int(self.depth.max()) + 1
        rows = [self.path_to(j) + [-1] * (width - len(self.path_to(j))) for j in leaves]
        if sampling_order:
            big = self.size + 1
            rows.sort(key=lambda r: [big if v < 0 else v for v in r])
        return torch.tensor(rows, dtype=torch.long)


def _check_parents(par: np.ndarray, n: int) -> None:
    if par.size != n or n < 1 or par[0] != -1:
        raise ValueError("tree needs tokens[n], parents[n] with parents[0] == -1")
    bad = np.flatnonzero((par[1:] < 0) | (par[1:] >= np.arange(1, n)))
    if bad.size:
        j = int(bad[0]) + 1
        raise ValueError(f"node {j} has parent {int(par[j])}: parents must precede children")


def host_ancestry(par: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(depth [n], ancestor closure [n, n]) of a host parent array (int64, parents before children): from a bounded
    per-process cache (trees repeat their shapes cycle after cycle), else :func:`_ancestry_of`. Never written to;
    a builder that knows its parents are valid hands both to ``DraftTree`` (no check, no recomputation)."""
    key = par.tobytes()
    hit = _ANCESTRY.get(key)
    if hit is None:
        if len(_ANCESTRY) >= _ANCESTRY_MAX:
            _ANCESTRY.clear()
        hit = _ANCESTRY[key] = _ancestry_of(par)
    return hit


def _ancestry_of(par: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(depth [n], ancestor closure [n, n]) of a parent array by pointer jumping: one vectorised step per level."""
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


_ANCESTRY: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
_ANCESTRY_MAX = 4096


def tree_child_ranks(tree: DraftTree) -> torch.Tensor:
    """``DraftTree.child_ranks`` computed afresh (not cached: a graph replaying it recomputes it from the parents)."""
    if tree._child_ranks is not None:
        return tree._child_ranks
    n, par = tree.size, tree.parents[1:]
    earlier = (par[:, None] == par[None]) & torch.ones(n - 1, n - 1, dtype=torch.bool, device=par.device).tril(-1)
    table = torch.full((n, max(tree.max_children, 1)), -1, dtype=torch.long, device=par.device)
    return table.index_put_((par, earlier.sum(1)), torch.arange(1, n, device=par.device))


def ancestry_on_device(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth ``[n]``, ancestor closure ``[n, n]`` bool) of a device parent array whose depth is at most
    ``max_depth``, on its device without a host read: ``max_depth`` pointer-jumping steps (the root is its own
    parent, so a finished chain keeps marking the root column, which every row holds anyway)."""
    n = parents.numel()
    up = parents.clamp_min(0)
    anc = torch.eye(n, dtype=torch.bool, device=parents.device)
    cur = up
    for _ in range(max_depth):
        anc.scatter_(1, cur[:, None], True)
        cur = up[cur]
    return anc.sum(1) - 1, anc


@lru_cache(maxsize=64)
def true_flag(device: torch.device) -> torch.Tensor:
    """``[True]`` on ``device`` (the root's liveness and acceptance; cached, never written)."""
    return torch.ones(1, dtype=torch.bool, device=device)


@lru_cache(maxsize=256)
def arange_on(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` on ``device`` (node ids, positions past a root; cached, never written)."""
    return torch.arange(n, device=device)


@lru_cache(maxsize=256)
def arange_from(a: int, b: int, device: torch.device) -> torch.Tensor:
    """``arange(a, b)`` long on ``device`` (scratch columns, candidate ranges; cached, never written)."""
    return torch.arange(a, b, device=device)


def root_only(token: torch.Tensor) -> DraftTree:
    """The one-node tree of plain AR decoding (``token``: ``[1]`` long on the device)."""
    return DraftTree(token.view(1), [-1], drafted_depth=0, width=0)
