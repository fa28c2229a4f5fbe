"""``policy=eagle2``: EAGLE-2's dynamic draft tree (``cnets1.Model.topK_genrate``), algorithms.md §2.3–2.4.

With K = ``top_k`` and R = ``depth`` expansion rounds:

1. level 0: the K most likely children of the root are candidates (score = drafter log-prob);
2. each round expands the K frontier nodes in one drafter forward, adds all K·K children as candidates with
   cumulative log-prob score, and keeps the K best children as the next frontier;
3. rerank: keep the ``total_tokens − 1`` best candidates of all ``K + R·K²``, in ascending candidate
   order (parents before children, siblings by rank).

Ties are broken toward the lower candidate index everywhere. Because a child's score never exceeds its
parent's and parents have lower indices, every kept node's parent is kept (asserted) — the reference's
``searchsorted`` lookup can silently pick a wrong parent on ties. The drafted depth is D = R + 1
(capped by the image positions left); candidates with zero drafter probability are never kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from adtbench.algorithm.cost import CostModelSource, PolicyBudget, TreeBudget
from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.policies.base import POLICIES, TreePolicy, desc_stable, top_k_stable, with_gate
from adtbench.algorithm.policies.sampled import SampledDrafts
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import Acceptance
from adtbench.errors import ConfigError


def eagle2_candidates(depth: int, top_k: int) -> int:
    """Number of candidates EAGLE-2 produces: K + depth·K²."""
    return top_k + depth * top_k * top_k


def build_eagle2_tree(
    session: DraftSession,
    depth: int,
    top_k: int,
    total_tokens: int,
    max_depth: int,
    budget: TreeBudget | None = None,
) -> DraftTree:
    """EAGLE-2's tree (module docstring); with a ``budget`` (``adtbench.algorithm.cost``) the rounds run only while one
    more level can pay for itself, and the rerank keeps the N best candidates that maximise the expected
    committed tokens per unit of time instead of ``total_tokens − 1``.

    Candidates live in flat numpy arrays in creation order (a few dozen entries: numpy's per-call cost is a
    fraction of a torch op's): score (cumulative drafter log-prob, in the drafter's float dtype, so sums round
    exactly as in torch), token, parent candidate id (−1 = root) and, once expanded, the session node id. The
    only torch work per level is the drafter forward; its ``[m, V]`` log-probs are ranked on a host copy
    (``top_k_stable``: one ``np.partition`` and a sort of the K candidates, in the order of a stable ``torch.sort``).
    """
    K = top_k
    rounds = max(0, min(depth, max_depth - 1))
    lp0 = session.root_logprobs()
    dev = lp0.device
    lp0_host = lp0.cpu().numpy()
    first = top_k_stable(lp0_host, K)
    first_lp = lp0_host[first]
    finite = np.isfinite(first_lp)
    first, first_lp = first[finite], first_lp[finite]
    count = first.size
    cap = count + rounds * K * K
    scores = np.empty(cap, dtype=first_lp.dtype)
    toks = np.empty(cap, dtype=np.int64)
    parents = np.empty(cap, dtype=np.int64)
    node = np.full(cap, -1, dtype=np.int64)  # session node of each expanded candidate
    scores[:count], toks[:count], parents[:count] = first_lp, first, -1
    frontier = np.arange(count)
    levels = [0] if count else []  # nodes expanded per drafter level (level 0: the root, scored by ``extend``)
    for _ in range(rounds):
        if frontier.size == 0:
            break
        if budget is not None:
            pi = np.exp(-np.sort(-scores[:count].astype(np.float64)))
            fpi = float(np.exp(scores[frontier].astype(np.float64)).sum())
            if not budget.worth_expanding(pi, fpi, frontier.size, budget.spent_ms(levels[1:])):
                break
        fpar = parents[frontier]
        par_node = np.where(fpar < 0, 0, node[np.maximum(fpar, 0)])
        ids, lp = session.expand(par_node, torch.from_numpy(toks[frontier]).to(dev))
        node[frontier] = ids
        levels.append(frontier.size)
        lp_host = lp.cpu().numpy()
        top = top_k_stable(lp_host, K)  # per row: K best children, ties toward the lower token id
        cum = (np.take_along_axis(lp_host, top, -1) + scores[frontier][:, None]).ravel()
        kids = top.ravel()
        keep = np.isfinite(cum)
        n_new = int(keep.sum())
        if n_new == 0:
            break
        gid = np.full(kids.size, -1, dtype=np.int64)
        gid[keep] = count + np.arange(n_new)
        end = count + n_new
        scores[count:end], toks[count:end] = cum[keep], kids[keep]
        parents[count:end] = np.repeat(frontier, K)[keep]
        count = end
        best = desc_stable(np.where(keep, cum, -np.inf))[:K]
        frontier = gid[best[keep[best]]]
    order = desc_stable(scores[:count].astype(np.float64))[: min(total_tokens - 1, count)]
    info: dict[str, float | int | str] = {}
    if budget is not None:
        pi = np.exp(scores[order].astype(np.float64))
        n_keep, _ = budget.best(pi, budget.spent_ms(levels[1:]))
        info.update(N_cost=n_keep, E_pred=float(pi[:n_keep].sum()), calib=budget.c)
        order = order[:n_keep]
    n_keep = order.size
    sel = np.sort(order)
    tree_node = np.full(count + 1, -1, dtype=np.int64)  # slot count = root (id −1)
    tree_node[sel] = np.arange(1, n_keep + 1)
    tree_node[count] = 0
    par = parents[sel]
    tree_par = tree_node[np.where(par < 0, count, par)]
    if (tree_par < 0).any():
        raise AssertionError("EAGLE-2 rerank kept a candidate without its parent")
    return DraftTree(
        tokens=torch.from_numpy(np.concatenate([[session.root_token], toks[sel]]).astype(np.int64)),
        parents=[-1, *tree_par.tolist()],
        drafted_depth=len(levels),
        width=K,
        info=info,
    )


class Eagle2Policy(TreePolicy):
    """EAGLE-2 trees; ``budget: cost`` sizes each tree to the machine (``adtbench.algorithm.cost``)."""

    name = "eagle2"

    def __init__(
        self,
        depth: int = 4,
        top_k: int = 10,
        total_tokens: int = 59,
        budget: str = "fixed",
        calibrate: bool = True,
        draft_sampling: str = "topk",
    ) -> None:
        if depth < 1:
            raise ConfigError("policy.depth", f"must be ≥ 1, got {depth}")
        if top_k < 1:
            raise ConfigError("policy.top_k", f"must be ≥ 1, got {top_k}")
        if total_tokens < 2:
            raise ConfigError("policy.total_tokens", f"must be ≥ 2 (root + one draft), got {total_tokens}")
        if total_tokens - 1 > eagle2_candidates(depth, top_k):
            raise ConfigError(
                "policy.total_tokens",
                f"{total_tokens} − 1 drafted nodes exceed the {eagle2_candidates(depth, top_k)} candidates "
                f"a tree with depth={depth}, top_k={top_k} can have (K + depth·K²)",
            )
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.cost = PolicyBudget(budget, ("fixed", "cost"), calibrate)
        self.sampled = SampledDrafts(draft_sampling)

    def max_nodes(self) -> int:
        return self.total_tokens

    def max_draft_slots(self) -> int:
        return self.top_k * self.depth  # K frontier nodes expanded per round

    def bind(self, cost: CostModelSource | None) -> None:
        self.cost.bind(cost, self.total_tokens, self.top_k)

    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        budget = self.cost.tree_budget(self.name)
        if self.sampled.applies(session):
            return self.sampled.build(session, self.depth, self.top_k, self.total_tokens, max_depth, budget)
        return build_eagle2_tree(session, self.depth, self.top_k, self.total_tokens, max_depth, budget)

    def observe(self, tree: DraftTree, acceptance: Acceptance, root_gen: int) -> None:
        self.cost.observe(tree, acceptance)
        self.sampled.observe(tree, acceptance)

    def reset(self) -> None:
        self.cost.reset()
        self.sampled.reset()


@POLICIES.register("eagle2")
def build_eagle2(node: Any) -> Eagle2Policy:
    """``policy=eagle2``: ``depth``, ``top_k``, ``total_tokens``, ``budget`` (default fixed), ``calibrate``,
    ``draft_sampling``, ``gate_tokens``, ``gate_explore``."""
    policy = Eagle2Policy(
        int(node["depth"]), int(node["top_k"]), int(node["total_tokens"]), str(node.get("budget", "fixed")),
        node.get("calibrate", True), str(node.get("draft_sampling", "topk")),
    )  # fmt: skip
    return with_gate(policy, node)
