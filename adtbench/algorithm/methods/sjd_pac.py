"""SJD-PAC (arXiv 2603.18599, CVPR 2026): Jacobi decoding whose verify is a tree — Proactive Drafting and Adaptive
Continuation — on the SCD loop of ``methods.jacobi.loop`` (its state, init, coupled redraw, window sizers, batched loop
and static buckets; this module adds the tree and its candidates only).

**The tree** (K = ``branch``, D = ``tree_depth``, L = ``window``; the authors' ``generate_tree_mask_and_retrieve``).
The first t = D − 1 positions after the root hold K candidates each, c_i^0 … c_i^{K−1}; the later ones one draft
(branch 0). The verified tree is the full K-ary tree of depth D (root included, T(D) = (K^D − 1)/(K − 1) nodes: 13
for K = D = 3) whose node at depth i with branch b at its last level holds c_i^b, so every node at depth i holding
branch b carries the same token; its main path (branch 0 at every level) is extended by a chain of single drafts to
L nodes in all (the main path holds m = L − T(D) + t drafts). A window too small for the tree takes the deepest
full tree that fits (T(D') ≤ L, so L < K + 1 is SCD's chain), and near the image end the main path stops one short
of the end (``JacobiState.room``) and the tree with it (t ≤ m). Node ids: the main path 0 … m first (so a main-path
accept commits in place), then the other nodes level by level in lexicographic branch order. One target forward
verifies it with tree attention (``Target.verify_forward``), as the tree policies do.

**Verify** (``variant: exact``): the multi-draft rule of ``verify.verify_tree`` / ``verify.accept`` (recursive
rejection over children drawn without replacement): at the accepted node u at depth i − 1 with target row p_u, try
c_i^0, c_i^1, … in order; c_i^k is accepted with min(1, p_k(x)/q_k(x)) where q_k is the stored q_i with
c_i^0 … c_i^{k−1} removed, renormalised, and p_0 = p_u, p_{k+1} = norm(max(p_k − q_k, 0)); the first accepted
candidate is the next node; if every live candidate is rejected the bonus is drawn from the final residual; past
the last draft of a path (a leaf) the bonus is drawn from that leaf's p. Greedy: the deepest path of argmax matches.

**Adaptive Continuation** (``JacobiState.advance``, SCD's maximal coupling unchanged): the positions past the bonus
take their target rows along the *extended path* — the accepted path, then branch 0 down the tree, then the main
chain (a row whose context holds rejected or stale tokens, known before anything at its position is drawn) — and
each keeps its old branch-0 token x with probability min(1, p(x)/q_old(x)), else takes a draw from
norm(max(p − q_old, 0)); stored q := p. **Proactive Drafting**: the candidates c_i^1 … c_i^{K−1} of the first t
positions of the next forward are drawn without replacement from the stored q_i with c_i^0 removed (Gumbel-top-k;
a candidate past q's support is dead: ``DraftTree.alive``, never tried). New positions are initialised by
``jacobi.draws.init_drafts`` (``random``: uniform image tokens, q uniform — the authors' setting; ``left`` / ``up``: a
point mass, so no live alternatives). Greedy: the alternatives are the row's next K − 1 tokens by logit.

**Lossless** (exact). jacobi.py's invariant, for candidate sets: at every verify, the candidate tuple
(c_i^0, …, c_i^{K−1}) at each position i, given everything that decided anything left of i (committed tokens,
candidates and target rows at earlier positions, every uniform used there), is an ordered sample without
replacement from its stored q_i and was never tested. (1) Verify: the walk tests only children of accepted nodes,
at positions ≤ a + 1 (a: the accepted depth), and the rows it reads at depth i − 1 see tokens at positions < i only
(tree attention). So at each tested position the candidates are, given the walk so far, a without-replacement sample
from q_i, and recursive rejection sampling over such a sample emits exactly p_u (SpecTr / RRS: each try is one
speculative step from q_k against p_k, and p_{k+1} is the law of the output given that c^k was rejected; the
without-replacement draw makes c^{k+1} ~ q_k given the rejections). Hence every committed token has the AR law of
the processed distribution, and the bonus too (final residual, or p at a leaf). (2) Continuation: a position j ≥
a + 2 was never tested (the walk stopped at a + 1) and its old c_j^0, given the left information (which now includes
the verify's tests, all at positions < j, and the row used for j, read at depth j − 1), is still ~ q_j: the first
draw of a without-replacement sample is a draw from q_j, and its siblings were neither tested nor used. jacobi.py's
coupling argument then makes the new token y_j ~ p_j given the left information, and q := p_j restores the invariant
for branch 0. (3) Drafting: c_j^1 … c_j^{K−1} are drawn afterwards from q_j without c_j^0, sequentially without
replacement: with y_j ~ q_j, the tuple is an ordered without-replacement sample from q_j, given everything left of j
(those draws use fresh randomness and nothing right of j). Tokens right of j never influence j's candidates. Window
sizes depend on past acceptance only. The tests plant two bugs that break (1)–(3) — alternatives drawn *with*
replacement, and the stored q of a redrawn position left at q_old — and the law test rejects both.

**The authors' variant** (``variant: authors``; lossy, ``SJDPACSpeculativeSampler.__call__``): (a) every node is
tested on its own (one uniform per node, sibling k against p_k / q_k as above) and the committed path is the deepest
node whose whole path passed (the *longest* accepted row, the first on ties) instead of the first accepted sibling;
(b) the alternatives c_j^1 … c_j^{K−1} of a continued position are drawn without replacement from the residual
norm(max(p − q_old, 0)) (minus c_j^0) while the test treats them as draws from q = p; (c) after a full accept of the
main path the bonus is drawn from the uniform fill (uniform image tokens; a forced position keeps its token), not
from p. Greedy is exact either way. Its measured distance from AR: docs/methods.md, "SJD-PAC".

**Records**: as jacobi.py's, with ``nodes`` the tree's size, ``K`` = branch, ``extra``: ``L`` (nodes) and
``off_main`` (1 when the accepted path left the main path: the tree's gain); ``stats`` add ``branch``,
``tree_depth``, ``variant`` and ``off_main`` (forwards that committed off the main path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from adtbench.algorithm.methods.jacobi.loop import JacobiParams, JacobiState, window_value
from adtbench.algorithm.methods.jacobi.windows import FixedWindow
from adtbench.algorithm.params import key, parse
from adtbench.algorithm.records import CycleRecord
from adtbench.algorithm.sampling import gumbel_top_k, uniforms
from adtbench.algorithm.tree import DraftTree, ancestry_on_device, arange_on, host_ancestry
from adtbench.algorithm.verify import (
    AcceptanceRule,
    CycleRead,
    Draws,
    Verdict,
    _finish,
    _normalise_rows,
    accept,
    read_verdict,
    read_verdicts,
)
from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.sampling_params import SamplingParams

VARIANTS = ("exact", "authors")


# --------------------------------------------------------------------------------------------------------
# parameters and the tree's geometry
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SJDPACParams(JacobiParams):
    """SJD-PAC (module docstring): ``branch`` K, ``tree_depth`` D (levels of the K-ary tree, root included),
    ``variant`` exact | authors; every ``JacobiParams`` key applies (``redraw`` coupled and ``rule`` exact only; the
    authors' defaults: L = 64, K = D = 3, random init)."""

    window: int | str = key(64, check=window_value)
    branch: int = key(3, lo=1)
    tree_depth: int = key(3, lo=1)
    variant: str = key("exact", choices=VARIANTS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.redraw != "coupled":
            raise ConfigError("policy.redraw", f"SJD-PAC continues with SCD's coupled redraw only, got {self.redraw}")
        if self.rule != "exact":
            raise ConfigError("policy.rule", f"SJD-PAC verifies with its own rule (policy.variant), got {self.rule}")
        if self.init == "drafter":
            raise ConfigError("policy.init", "SJD-PAC drafts without a drafter: init=random|left|up")

    @property
    def state_type(self) -> type[JacobiState]:
        return AuthorsState if self.variant == "authors" else SJDPACState


def sjd_pac_params(node: dict[str, Any]) -> SJDPACParams:
    """``SJDPACParams`` from a plain policy node (``params.parse``); every bad value a ``ConfigError`` naming
    ``policy.<key>``."""
    return parse(SJDPACParams, node)


def full_tree_nodes(K: int, levels: int) -> int:
    """T(levels): nodes of the full K-ary tree with ``levels`` levels, root included ((K^levels − 1)/(K − 1))."""
    return levels if K == 1 else (K**levels - 1) // (K - 1)


def geometry(L: int, K: int, D: int) -> tuple[int, int]:
    """(main-path nodes M, branched positions t) of a window of L nodes: the deepest full tree that fits,
    D' = max{d ≤ D : T(d) ≤ L}, t = D' − 1, and the main path extended to L nodes in all, M = L − T(D') + D'
    (K = 1: the chain, t = 0)."""
    if K == 1:
        return L, 0
    levels = max(d for d in range(1, D + 1) if full_tree_nodes(K, d) <= L)
    return L - full_tree_nodes(K, levels) + levels, levels - 1


class TreeSizer(FixedWindow):
    """Wraps a window sizer (L per forward) into the main path's nodes M (``JacobiState.plan`` sizes the main path),
    remembering the branched positions t of the same L (``geometry``)."""

    def __init__(self, inner: FixedWindow, K: int, D: int) -> None:
        super().__init__(inner.L)
        self.inner, self.K, self.D, self.t = inner, K, D, 0

    def reset(self) -> None:
        self.inner.reset()

    def size(self, g: int) -> int:
        M, self.t = geometry(self.inner.size(g), self.K, self.D)
        return M

    def observe(self, g: int, m: int, a: int, rows: torch.Tensor | None = None) -> None:
        self.inner.observe(g, m, a, rows)


@dataclass(frozen=True)
class TreeShape:
    """The static tables of one tree shape (m main drafts, t branched positions, K; on a device, cached, never
    written): ``parents``, ``depth``, ``anc`` (ancestor closure), ``ranks`` ``[n, K]`` (children in branch order),
    ``src`` (node → index into cat(main path tokens [m + 1], alternatives [t, K − 1] flattened)) and ``ext``
    ``[n, m + 1]`` (node u → the node at each depth of its extended path: u's path, branch 0 down, then the main
    chain)."""

    parents: torch.Tensor
    depth: torch.Tensor
    anc: torch.Tensor
    ranks: torch.Tensor
    src: torch.Tensor
    ext: torch.Tensor

    @property
    def size(self) -> int:
        return self.parents.numel()


def host_tree_shape(m: int, t: int, K: int) -> dict[str, np.ndarray]:
    """The tables of ``TreeShape`` for main path 0 … m and branched positions 1 … t (t ≤ m, K ≥ 2), built on the
    host node by node (module docstring): the reference ``tree_shape`` derives its device tables from."""
    parents, depth, src = list(range(-1, m)), list(range(m + 1)), list(range(m + 1))
    level = [0]  # the nodes at depth d − 1 of the K-ary part, lexicographic
    kids: list[list[int]] = [[] for _ in range(m + 1)]
    for d in range(1, t + 1):
        nxt = []
        for u in level:
            for b in range(K):
                if u == d - 1 and b == 0:  # the main path's own child
                    v = d
                else:
                    v = len(parents)
                    parents.append(u)
                    depth.append(d)
                    src.append(d if b == 0 else m + 1 + (d - 1) * (K - 1) + b - 1)
                    kids.append([])
                kids[u].append(v)
                nxt.append(v)
        level = nxt
    for d in range(t, m):  # the chain below the tree's main node
        kids[d].append(d + 1)
    n = len(parents)
    ranks = np.full((n, K), -1, dtype=np.int64)
    for u, ks in enumerate(kids):
        ranks[u, : len(ks)] = ks
    par = np.asarray(parents, dtype=np.int64)
    dep, anc = host_ancestry(par)
    ext = np.zeros((n, m + 1), dtype=np.int64)
    for u in range(n):
        path, v = [], u
        while v >= 0:
            path.append(v)
            v = parents[v]
        path.reverse()
        while kids[path[-1]] and depth[path[-1]] < m:  # branch 0 down (the chain below the main node)
            path.append(kids[path[-1]][0])
        path += list(range(len(path), m + 1))  # an off-main leaf: the main chain's nodes
        ext[u] = path
    return {"parents": par, "depth": dep, "anc": anc, "ranks": ranks, "src": np.asarray(src), "ext": ext}


@lru_cache(maxsize=64)
def canonical_shape(t: int, K: int, device: torch.device) -> TreeShape:
    """The ``TreeShape`` of the bare tree (m = t) on ``device``: one host→device copy per (t, K, device), made by
    ``SJDPACState.start`` before the first forward (cached, never written)."""
    h = host_tree_shape(t, t, K)
    on = {k: torch.tensor(v, device=device) for k, v in h.items()}
    return TreeShape(on["parents"], on["depth"], on["anc"], on["ranks"], on["src"], on["ext"])


@lru_cache(maxsize=256)
def tree_shape(m: int, t: int, K: int, device: torch.device) -> TreeShape:
    """``TreeShape`` of main path 0 … m with branched positions 1 … t (K ≥ 2; equal to ``host_tree_shape``, tested):
    derived on the device from ``canonical_shape(t)`` by inserting the chain t + 1 … m after the main path (the
    other nodes' ids shift by s = m − t), so a new window size costs device ops, no host→device copy (cached)."""
    c, s = canonical_shape(t, K, device), m - t
    if s == 0:
        return c

    def shift(x: torch.Tensor) -> torch.Tensor:  # canonical ids past the main path move by s (−1 stays)
        return torch.where(x > t, x + s, x)

    chain = t + 1 + arange_on(s, device)  # the chain's node ids (= depths)
    parents = torch.cat([c.parents[: t + 1], chain - 1, shift(c.parents[t + 1 :])])
    depth = torch.cat([c.depth[: t + 1], chain, c.depth[t + 1 :]])
    src = torch.cat([c.src[: t + 1], chain, shift(c.src[t + 1 :])])
    ranks = shift(c.ranks)
    first = arange_on(K, device) == 0
    bottom = torch.where(first, chain[0], ranks[t])[None]  # the tree's main node now has the chain below it
    links = torch.where(first & (chain[:, None] < m), chain[:, None] + 1, -1)
    ranks = torch.cat([ranks[:t], bottom, links, ranks[t + 1 :]])
    tail = chain[None].expand(c.size, s)
    ext_tree = torch.cat([shift(c.ext), tail], 1)
    ext = torch.cat([ext_tree[: t + 1], arange_on(m + 1, device)[None].expand(s, m + 1), ext_tree[t + 1 :]])
    _, anc = ancestry_on_device(parents, m)
    return TreeShape(parents, depth, anc, ranks, src, ext)


# --------------------------------------------------------------------------------------------------------
# the state of one image
# --------------------------------------------------------------------------------------------------------


@dataclass
class SJDPACState(JacobiState):
    """``JacobiState`` verifying SJD-PAC's tree (module docstring). Adds ``alt [t_max, K − 1]`` / ``alt_ok`` (the
    alternatives of the first t positions after the root and whether each was drawn), ``alt_n`` (leading positions
    whose alternatives ``advance`` already set; the rest are drawn by ``plan``), this forward's ``t`` and shape."""

    alt: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    alt_ok: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    alt_n: int = 0
    t: int = 0
    shape: TreeShape | None = None
    off_main: int = 0

    @property
    def K(self) -> int:
        assert isinstance(self.params, SJDPACParams)
        return self.params.branch

    @classmethod
    def start(
        cls,
        root: torch.Tensor,
        layout: TokenLayout,
        params: JacobiParams,
        sizer: FixedWindow,
        sp: SamplingParams,
        dtype: torch.dtype,
        generator: torch.Generator | None,
    ) -> JacobiState:
        assert isinstance(params, SJDPACParams)
        sizer = TreeSizer(sizer, params.branch, params.tree_depth)
        st = super().start(root, layout, params, sizer, sp, dtype, generator)
        assert isinstance(st, SJDPACState)
        T, dev = max(params.tree_depth - 1, 0), root.device
        if params.branch > 1:
            for t in range(1, T + 1):  # the canonical tables' one copy each, before the first forward
                canonical_shape(t, params.branch, dev)
        st.alt = torch.zeros(T, max(params.branch - 1, 0), dtype=torch.long, device=dev)
        st.alt_ok = torch.zeros(T, max(params.branch - 1, 0), dtype=torch.bool, device=dev)
        return st

    def plan(self, drafter: Any = None) -> int:
        """``JacobiState.plan`` (the main path), then the alternatives of branched positions ``alt_n`` … t − 1 not
        set by ``advance``: drawn without replacement from the stored q minus branch 0 (dead when greedy)."""
        m = super().plan(drafter)
        assert isinstance(self.sizer, TreeSizer)
        self.t = min(self.sizer.t, m) if self.K > 1 else 0
        lo, hi = self.alt_n, self.t
        if hi > lo:
            if self.q is None:
                self.alt_ok[lo:hi] = False
            else:
                self.alt[lo:hi], self.alt_ok[lo:hi] = self.alternatives(self.q[lo:hi], lo)
        return m

    def alternatives(self, dist: torch.Tensor, lo: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K − 1 draws without replacement from each row of ``dist`` (unnormalised probabilities ``[r, V]``) with the
        branch-0 token of positions lo + 1 … lo + r removed (Gumbel-top-k), and whether each was drawn."""
        tok0 = self.seq[self.g + 1 + lo : self.g + 1 + lo + dist.shape[0], None]
        logits = dist.log().scatter(1, tok0, float("-inf"))
        return gumbel_top_k(logits, self.K - 1, self.generator)

    def tree(self) -> DraftTree:
        """The SJD-PAC tree of this forward (module docstring); the chain when it has no branched position."""
        m, t, K = self.m, self.t, self.K
        if t == 0:
            self.shape = None
            return self.chain()
        dev = self.seq.device
        shape = self.shape = tree_shape(m, t, K, dev)
        tokens = torch.cat([self.seq[self.g : self.g + m + 1], self.alt[:t].flatten()])[shape.src]
        ok = torch.cat([torch.ones(m + 1, dtype=torch.bool, device=dev), self.alt_ok[:t].flatten()])[shape.src]
        alive = ~(shape.anc & ~ok[None]).any(1)
        proposal = None if self.q is None else self.q[: m + 1].index_select(0, shape.depth)
        return DraftTree(
            tokens,
            shape.parents,
            m,
            K,
            proposal,
            alive=alive,
            depth=shape.depth,
            ancestor_mask=shape.anc,
            max_children=K,
            child_ranks=shape.ranks,
        )

    def in_place(self, read: CycleRead) -> bool:
        return read.acceptance.path[-1] == read.acceptance.accepted  # the main path: nodes 0 … a

    def advance(self, read: CycleRead, processed: torch.Tensor) -> CycleRecord:
        """``JacobiState.advance`` on the rows of the extended path (module docstring: the coupled continuation),
        then the alternatives ``advance`` sets itself (greedy: the rows' next tokens; ``authors``: residual draws),
        and the record of the tree."""
        a, last, shape = read.acceptance.accepted, read.acceptance.path[-1], self.shape
        nodes = processed.shape[0]
        rows = processed if shape is None else processed.index_select(0, shape.ext[last])
        k = min(self.alt.shape[0], self.m - a) if self.K > 1 else 0
        q_old = None if self.q is None else self.q[a + 1 : a + 1 + k]
        rec = super().advance(read, rows)
        k = min(k, self.held)  # the positions redrawn (room may cut them)
        self.alt_n = self.continued(rows[a + 1 : a + 1 + k], None if q_old is None else q_old[:k])
        off = int(last != a)
        self.off_main += off
        rec.nodes, rec.width, rec.extra = nodes, self.K if shape is not None else 1, {"L": nodes, "off_main": off}
        return rec

    def continued(self, rows: torch.Tensor, q_old: torch.Tensor | None) -> int:
        """Alternatives of the redrawn positions 1 … r set by ``advance`` (``rows``: their processed rows; ``q_old``:
        the proposals their old drafts had): greedy — the rows' best K − 1 tokens besides branch 0; exact — none
        (``plan`` draws them from the stored q := p); returns how many positions were set."""
        r = rows.shape[0]
        if r == 0 or not self.greedy:
            return 0
        tok0 = self.seq[self.g + 1 : self.g + 1 + r, None]
        top = rows.scatter(1, tok0, float("-inf")).topk(self.K - 1, -1)
        self.alt[:r], self.alt_ok[:r] = top.indices, top.values > float("-inf")
        return r

    def stats(self) -> dict[str, Any]:
        assert isinstance(self.params, SJDPACParams)
        return {
            **super().stats(),
            "branch": self.params.branch,
            "tree_depth": self.params.tree_depth,
            "variant": self.params.variant,
            "off_main": self.off_main,
        }


@dataclass
class AuthorsState(SJDPACState):
    """``variant: authors`` (module docstring, departures (a)–(c)): the longest accepted row, alternatives of a
    continued position drawn from its residual, the uniform fill after a full accept. Greedy is the exact state's."""

    def continued(self, rows: torch.Tensor, q_old: torch.Tensor | None) -> int:
        r = rows.shape[0]
        if r == 0 or self.greedy:
            return super().continued(rows, q_old)
        assert q_old is not None
        resid = (rows.softmax(-1) - q_old.to(rows.dtype)).clamp_min(0.0)
        self.alt[:r], self.alt_ok[:r] = self.alternatives(resid, 0)
        return r

    def fill(self, processed: torch.Tensor) -> torch.Tensor:
        """The bonus distribution after a full accept (c): uniform image tokens, or the main leaf's (a point mass)
        where the bonus position has a forced token."""
        if self.layout.forced_token(self.g + self.m + 1) >= 0:
            return processed[self.m].softmax(-1)
        return self.tables.uniform.to(processed.dtype)

    def verify(
        self, tree: DraftTree, processed: torch.Tensor, sp: SamplingParams, rule: AcceptanceRule, where: str
    ) -> CycleRead:
        if sp.greedy or tree.size == 1:
            return super().verify(tree, processed, sp, rule, where)
        return read_verdict(tree, accept_authors(tree, processed, self.generator, self.fill(processed)))

    @staticmethod
    def verify_batch(
        states: Sequence[JacobiState | None],
        cases: Sequence[tuple[DraftTree, torch.Generator | None] | None],
        processed: torch.Tensor,
        sp: SamplingParams,
        rule: AcceptanceRule,
        acceptance: str,
        on_host: bool,
    ) -> list[Any]:
        if sp.greedy:
            return JacobiState.verify_batch(states, cases, processed, sp, rule, acceptance, on_host)
        out: list[Any] = [None] * len(cases)
        pending: list[tuple[int, tuple[DraftTree, Verdict, list[torch.Tensor]]]] = []
        for s, (st, case) in enumerate(zip(states, cases, strict=True)):
            if case is None or st is None:
                continue
            tree, gen = case
            rows = processed[s, : tree.size]
            assert isinstance(st, AuthorsState)
            if tree.size == 1:
                verdict = accept(tree, rows, False, gen)
            else:
                verdict = accept_authors(tree, rows, gen, st.fill(rows))
            pending.append((s, (tree, verdict, [])))
        for (s, _), read in zip(pending, read_verdicts([p for _, p in pending]), strict=True):
            out[s] = read
        return out


def accept_authors(
    tree: DraftTree, processed: torch.Tensor, generator: torch.Generator | None, fill: torch.Tensor
) -> Verdict:
    """The authors' acceptance (module docstring, (a) and (c)) on the rows' device, no host read: node c, the k-th
    live child of u, passes iff U_c · q_k(x_c) < p_k(x_c) (its own uniform; p_k, q_k u's rows after k recursive
    rejections, whatever its earlier siblings' outcomes); the path ends at the deepest node whose whole path passed
    (the first in node order on ties: the lexicographically first row); the bonus is drawn from that node's row after
    all its children's rejections — or from ``fill`` when it is the main path's leaf (node ``drafted_depth``)."""
    n, dev = tree.size, processed.device
    p = processed.softmax(-1)
    assert tree.proposal is not None
    q = tree.proposal.to(p.dtype)
    rank = tree.child_ranks
    has, child = rank >= 0, rank.clamp_min(0)
    live = tree.alive if tree.alive is not None else torch.ones(n, dtype=torch.bool, device=dev)
    tries_all = has & live[child]
    xs = torch.where(has, tree.tokens[child], 0)
    u = uniforms((n,), generator, dev).to(p.dtype)
    passed = torch.zeros(n + 1, dtype=torch.bool, device=dev)
    for r in range(rank.shape[1]):
        x, tries = xs[:, r : r + 1], tries_all[:, r]
        px, qx = p.gather(1, x)[:, 0], q.gather(1, x)[:, 0]
        ok = tries & (u[child[:, r]] * qx < px)
        passed.scatter_(0, torch.where(ok, child[:, r], n), True)
        p = torch.where(tries[:, None], _normalise_rows((p - q).clamp_min(0.0), p), p)
        q = torch.where(tries[:, None], _normalise_rows(q.scatter(1, x, 0.0), q), q)
    leaf = tree.drafted_depth
    residual = torch.cat([p[:leaf], fill.to(p.dtype)[None], p[leaf + 1 :]])
    return _finish(tree, processed, passed[1:n], residual, Draws(generator))


__all__ = [
    "VARIANTS",
    "AuthorsState",
    "SJDPACParams",
    "SJDPACState",
    "TreeShape",
    "accept_authors",
    "canonical_shape",
    "full_tree_nodes",
    "geometry",
    "host_tree_shape",
    "sjd_pac_params",
    "tree_shape",
]
