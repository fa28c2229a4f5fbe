"""Sampled dynamic trees: ``draft_sampling: sample`` for ``eagle2`` and ``adt`` at temperature > 0.

Why. At T = 1 a visual AR target is far from deterministic (noise textures, edges), so a top-k draft x is
accepted with probability p(x) only (point-mass recursive rejection), however good the drafter. A draft *drawn*
from the drafter's q is accepted with probability Σ_v min(p, q) — near 1 wherever q ≈ p, broad or not. On the
mini model (8 held-out prompts, T = 1) one sampled draft per cycle gives τ 1.58 against 1.31 for the top-1 draft.

The tree. Level 0 is the root (its q from the drafter's ``extend``); each level draws children for a frontier of
expanded nodes, then the next frontier is chosen among the new children, for at most ``depth`` rounds after
level 0 (``D = depth + 1`` draft levels, capped by the image positions left):

- children of u are drawn from q_u *without replacement*, in draw order (Gumbel-top-n: the n largest of
  ``log q_u + Gumbel`` are n sequential draws without replacement, Kool et al. 2019), and verified with the
  true q (``tree.proposal[u]``, ``verify.verify_sampling``'s recursive rejection);
- each node carries an estimated reach probability R (root 1): the j-th child (j = 0, 1, …) of u gets
  ``R_u · α_u · (1 − α_u)^j``, where ``α_u = AcceptanceModel.alpha(H(q_u))`` is the acceptance rate of one try
  at a node whose drafter entropy is H(q_u) (learned online per image). E[accepted drafts] ≈ Σ R;
- how many children each frontier node gets is chosen from those values: ``budget: fixed`` takes the best values
  until ``max_nodes`` are in the tree; ``budget: cost`` adds them while the measured-cost rate
  ``(1 + Σ R) / (t_spent + t_verify(n))`` improves (``TreeBudget.best_extension``); a further level runs only while
  its optimistic gain (Σ R of the new frontier) can pay for one drafter level and its nodes;
- the frontier is the (at most) K new nodes of highest R.

Losslessness. A verified draft set stays a valid input to recursive rejection as long as the *number* of children
of u is decided before they are drawn: each try is then an exact speculative-sampling step given everything
drawn before it. Here a child's value depends only on its parent (R_u, α_u from q_u) and its draw index j, never
on its own token, so the counts per parent — and so the whole selection — are functions of parent-level
information: the drawn tokens are never inspected to decide whether they are verified. Which nodes are expanded,
and the counts at the next level, may depend on the tokens drawn so far (they precede the draws they decide).
Tested with the χ² joint-law test of the engine (``tests/test_engine.py``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
import torch

from adtbench.algorithm.cost import TreeBudget
from adtbench.algorithm.drafters.session import DraftSession, Expand, Steps
from adtbench.algorithm.records import Acceptance
from adtbench.algorithm.sampling import ENTROPY_EDGES, exponentials, gumbel_top_k
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import check_choice

DRAFT_SAMPLING = ("topk", "sample")
ALPHA_RANGE = (0.02, 0.98)


class AcceptanceModel:
    """α(H): the probability that one try of a draft drawn from q_u is accepted, by entropy bin of q_u.

    A Beta-like running estimate per bin, ``(successes + prior · weight) / (tries + weight)``, reset per image
    (an image's trees never depend on the images before it). A try is one child verified at u: the accepted
    child of every accepted node with children took ``index + 1`` tries (one success), the last accepted node's
    children all failed.
    """

    def __init__(self, prior: float = 0.6, weight: float = 4.0) -> None:
        self.prior, self.weight = prior, weight
        self.reset()

    def reset(self) -> None:
        self.tries = np.zeros(ENTROPY_EDGES.size + 1)
        self.successes = np.zeros(ENTROPY_EDGES.size + 1)
        self._table = self._alpha_table()

    def _alpha_table(self) -> np.ndarray:
        a = (self.successes + self.prior * self.weight) / (self.tries + self.weight)
        return np.asarray(np.clip(a, *ALPHA_RANGE))

    @staticmethod
    def bins(entropy: np.ndarray) -> np.ndarray:
        return np.asarray(np.searchsorted(ENTROPY_EDGES, entropy, side="right"))

    def alpha(self, entropy: np.ndarray) -> np.ndarray:
        return np.asarray(self._table[self.bins(entropy)])

    def observe(self, tree: DraftTree, acceptance: Acceptance, entropy: dict[int, float]) -> None:
        """Count the tries and successes of a verified tree (``entropy``: H(q_u) of every node with children)."""
        path = acceptance.path
        for i, u in enumerate(path):
            kids = tree.children[u]
            if not kids or u not in entropy:
                continue
            b = int(self.bins(np.asarray(entropy[u])))
            if i + 1 < len(path):
                self.tries[b] += kids.index(path[i + 1]) + 1
                self.successes[b] += 1
            else:
                self.tries[b] += len(kids)
        self._table = self._alpha_table()


@dataclass
class SampledTree:
    tree: DraftTree
    entropy: dict[int, float] = field(default_factory=dict)  # node → H(q_node) for nodes given children


def _entropy_support(lp: torch.Tensor, top_k: int) -> torch.Tensor:
    """``[2, m]`` float64 on lp's device: H(q) per row of ``q = exp(lp)`` ``[m, V]`` (−inf entries contribute 0) and
    min(#{q > 0}, top_k) per row — what the host reads of a level to size it."""
    lp = lp.to(torch.float64)
    q = lp.exp()
    pos = q > 0
    H = -(q * torch.where(pos, lp, 0.0)).sum(-1)
    return torch.stack([H, pos.sum(-1).clamp_max(top_k).to(torch.float64)])


def sampled_steps(
    session: DraftSession,
    depth: int,
    top_k: int,
    max_nodes: int,
    max_depth: int,
    budget: TreeBudget | None,
    model: AcceptanceModel,
) -> Generator[Expand, tuple[range, torch.Tensor], SampledTree]:
    """The sampled tree of one cycle (module docstring; a coroutine: ``drive(sampled_steps(session, …), session)``
    builds it for one session): ``depth`` rounds after level 0, at most ``top_k``
    children per node and frontier nodes per round, at most ``max_nodes`` nodes (root included).

    The sizing is host work on parent-level values (reach R, α(H)), so each level reads its frontier's entropies and
    supports (one small read per level; the top-k trees read nothing while drafting). Where the draws, tokens and
    proposal rows live: on the drafter's device (the draws by Gumbel-top-k there), or, when the session decides on
    the host (``session.on_host``: ``engine.acceptance`` auto on the CPU), on host copies of each level's rows —
    fewer torch calls, the same generator calls and keys (``lp − log E``, E ~ Exp(1) of the frontier's shape), so
    the same tokens and the same tree for a seed (tested)."""
    rounds = max(0, min(depth, max_depth - 1))
    host = bool(getattr(session, "on_host", False))
    cap, dev = max_nodes, session.device
    par = np.empty(cap, dtype=np.int64)
    reach = np.empty(cap, dtype=np.float64)
    sess = np.full(cap, -1, dtype=np.int64)
    par[0], reach[0], sess[0] = -1, 1.0, 0
    n = 1
    toks_h = np.zeros(cap, dtype=np.int64)  # host path: node tokens (the root's stays on the device)
    toks = [session.root_token]  # device path: device pieces in node order
    q_nodes: list[int] = []
    q_rows: list[torch.Tensor] = []  # device path: the drafter log-prob rows of the nodes given children
    q_rows_h: list[np.ndarray] = []  # host path: their float64 probability rows (host copies)
    entropy: dict[int, float] = {}
    frontier = np.zeros(1, dtype=np.int64)
    lp = session.root_logprobs()[None]
    j = np.arange(top_k)
    spent = budget.spent_ms([]) if budget is not None else 0.0
    for level in range(rounds + 1):
        if host:
            lp64 = lp.to(torch.float64)
            q_h = lp64.exp().cpu().numpy()  # torch's exp: the device path's proposal rows, bit for bit
            H, support = _entropy_support_host(lp64.cpu().numpy(), q_h, top_k)
        else:
            H, support = _entropy_support(lp, top_k).cpu().numpy()
        a = model.alpha(H)[:, None]
        values = np.where(j < support[:, None], reach[frontier][:, None] * a * (1.0 - a) ** j, -1.0).ravel()
        order = (-values).argsort(kind="stable")  # per parent a prefix in draw order: values fall with j
        order = order[values[order] > 0.0][: cap - n]
        if budget is not None:
            k, _ = budget.best_extension(1.0 + reach[1:n].sum(), n, values[order], spent)
            order = order[:k]
        if order.size == 0:
            break
        counts = np.bincount(order // top_k, minlength=frontier.size)
        if host:
            drawn_h = _gumbel_top_k_host(lp64, session.generator)  # [f, V] keys of every row, as the device draws
        else:
            drawn, _ = gumbel_top_k(lp, int(counts.max()), session.generator)  # [f, max count], draw order
            rows = np.repeat(np.arange(frontier.size), counts)
            ranks = np.concatenate([np.arange(c) for c in counts])
            toks.append(drawn[torch.from_numpy(rows).to(dev), torch.from_numpy(ranks).to(dev)])
        m = int(counts.sum())
        for i in counts.nonzero()[0].tolist():
            f, c = int(frontier[i]), int(counts[i])
            if host:
                toks_h[n : n + c] = _largest_in_order(drawn_h[i], c)
                q_rows_h.append(q_h[i])
            else:
                q_rows.append(lp[i])
            par[n : n + c] = f
            reach[n : n + c] = values[i * top_k : i * top_k + c]
            q_nodes.append(f)
            entropy[f] = float(H[i])
            n += c
        new = np.arange(n - m, n)
        if level == rounds or n >= cap:
            break
        cand = new[(-reach[new]).argsort(kind="stable")][:top_k]
        if budget is not None:
            cand = cand[: budget.best_frontier(1.0 + reach[1:n].sum(), n, reach[cand], spent)]
        if cand.size == 0:
            break
        parents = torch.from_numpy(sess[par[cand]]).to(dev)
        kids = torch.from_numpy(toks_h[cand]).to(dev) if host else torch.cat(toks)[torch.from_numpy(cand).to(dev)]
        ids, lp = yield Expand(parents, kids, level + 1)
        sess[cand] = np.arange(ids.start, ids.stop)
        frontier = cand
        if budget is not None:
            spent += budget.t_level(cand.size)
    proposal: torch.Tensor | None = None  # None: the root alone (no draft paid for itself)
    if host:
        tokens = torch.cat([session.root_token, torch.from_numpy(toks_h[1:n]).to(dev)])
        if q_nodes:
            table = np.zeros((n, q_rows_h[0].size))
            table[q_nodes] = q_rows_h
            proposal = torch.from_numpy(table).to(dev)
    else:
        tokens = torch.cat(toks)
        if q_nodes:
            q = torch.stack(q_rows).to(torch.float64).exp()
            proposal = q.new_zeros(n, q.shape[-1]).index_copy_(0, torch.tensor(q_nodes, device=dev), q)
    tree = DraftTree(
        tokens,
        par[:n].tolist(),
        drafted_depth=len(session.levels) + (1 if n > 1 else 0),
        width=top_k,
        proposal=proposal,
        info={"E_est": float(reach[1:n].sum())},
    )
    return SampledTree(tree, entropy)


def _entropy_support_host(lp: np.ndarray, q: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """``_entropy_support`` on host copies of a level's float64 log-probs and probabilities ``[m, V]``."""
    pos = q > 0
    H = -(q * np.where(pos, lp, 0.0)).sum(-1)
    return H, np.minimum(pos.sum(-1), top_k).astype(np.float64)


def _gumbel_top_k_host(lp64: torch.Tensor, generator: torch.Generator | None) -> np.ndarray:
    """The Gumbel-top-k keys ``lp − log E`` of ``gumbel_top_k`` (the same draws of the generator, the same float64
    arithmetic) for every row of ``lp64 [m, V]``, as a host array."""
    e = exponentials(tuple(lp64.shape), generator, lp64.device).log_()
    keys: np.ndarray = (lp64 - e).cpu().numpy()
    return keys


def _largest_in_order(keys: np.ndarray, c: int) -> np.ndarray:
    """Indices of the ``c`` largest of ``keys [V]``, largest first (``torch.topk``'s order; keys of a continuous draw
    never tie): one partition and a sort of c, or argmax for one."""
    if c == 1:
        return np.array([int(np.argmax(keys))])
    idx = np.argpartition(-keys, c - 1)[:c] if c < keys.size else np.arange(keys.size)
    return np.asarray(idx[np.argsort(-keys[idx], kind="stable")])


class SampledDrafts:
    """A policy's ``draft_sampling`` option: ``sample`` builds these trees at temperature > 0 (greedy
    decoding keeps the top-k tree) and keeps their per-image acceptance model."""

    def __init__(self, draft_sampling: str) -> None:
        self.on = check_choice(draft_sampling, "policy.draft_sampling", DRAFT_SAMPLING) == "sample"
        self.model = AcceptanceModel()
        self._entropy: dict[int, float] | None = None

    def applies(self, session: DraftSession) -> bool:
        return self.on and not session.greedy

    def steps(
        self, session: DraftSession, depth: int, top_k: int, total: int, max_depth: int, budget: TreeBudget | None
    ) -> Steps:
        out = yield from sampled_steps(session, depth, top_k, total, max_depth, budget, self.model)
        self._entropy = out.entropy
        return out.tree

    def observe(self, tree: DraftTree, acceptance: Acceptance) -> None:
        if self._entropy is not None and tree.proposal is not None:
            self.model.observe(tree, acceptance, self._entropy)
        self._entropy = None

    def reset(self) -> None:
        self.model.reset()
        self._entropy = None
