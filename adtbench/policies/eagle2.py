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

import torch

from adtbench.drafters.session import DraftSession
from adtbench.errors import ConfigError
from adtbench.policies.base import TreePolicy, stable_topk
from adtbench.tree import DraftTree


def eagle2_candidates(depth: int, top_k: int) -> int:
    """Number of candidates EAGLE-2 produces: K + depth·K²."""
    return top_k + depth * top_k * top_k


def build_eagle2_tree(session: DraftSession, depth: int, top_k: int, total_tokens: int, max_depth: int) -> DraftTree:
    K = top_k
    rounds = max(0, min(depth, max_depth - 1))
    lp0 = session.root_logprobs()
    first = stable_topk(lp0, K)
    first = first[torch.isfinite(lp0[first])]
    scores: list[float] = lp0[first].tolist()
    toks: list[int] = first.tolist()
    parent: list[int] = [-1] * len(toks)  # candidate index of the parent, -1 = root
    frontier = list(range(len(toks)))
    sess: dict[int, int] = {}
    for _ in range(rounds):
        if not frontier:
            break
        ids, lp = session.expand(
            [0 if parent[c] < 0 else sess[parent[c]] for c in frontier], [toks[c] for c in frontier]
        )
        sess.update(zip(frontier, ids))
        top = torch.sort(lp, dim=-1, descending=True, stable=True)
        vals, kids = top.values[:, :K], top.indices[:, :K]
        cum = vals + torch.tensor([scores[c] for c in frontier], dtype=vals.dtype, device=vals.device)[:, None]
        base = len(toks)
        flat, flat_tok = cum.flatten(), kids.flatten()
        keep = torch.isfinite(flat)
        order = {}  # flattened index → candidate index (only finite children become candidates)
        for j in keep.nonzero(as_tuple=True)[0].tolist():
            order[j] = len(toks)
            scores.append(float(flat[j]))
            toks.append(int(flat_tok[j]))
            parent.append(frontier[j // K])
        if len(toks) == base:
            break
        best = stable_topk(flat.masked_fill(~keep, float("-inf")), K)
        frontier = [order[j] for j in best.tolist() if j in order]
    n_keep = min(total_tokens - 1, len(toks))
    sel = sorted(stable_topk(torch.tensor(scores, dtype=torch.float64), n_keep).tolist())
    node = {c: j + 1 for j, c in enumerate(sel)}
    parents = [-1]
    for c in sel:
        if parent[c] >= 0 and parent[c] not in node:
            raise AssertionError(f"EAGLE-2 rerank kept candidate {c} without its parent {parent[c]}")
        parents.append(0 if parent[c] < 0 else node[parent[c]])
    return DraftTree(
        tokens=torch.tensor([session.root_token] + [toks[c] for c in sel], dtype=torch.long),
        parents=parents,
        drafted_depth=rounds + 1 if toks else 0,
        width=K,
    )


class Eagle2Policy(TreePolicy):
    name = "eagle2"

    def __init__(self, depth: int = 4, top_k: int = 10, total_tokens: int = 59) -> None:
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

    def max_nodes(self) -> int:
        return self.total_tokens

    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        return build_eagle2_tree(session, self.depth, self.top_k, self.total_tokens, max_depth)
