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
    """Candidates live in flat tensors (score, token, parent candidate id; −1 = root) in creation order."""
    K = top_k
    rounds = max(0, min(depth, max_depth - 1))
    lp0 = session.root_logprobs()
    first = stable_topk(lp0, K)
    first = first[torch.isfinite(lp0[first])]
    dev = lp0.device
    scores, toks, parents = [lp0[first]], [first], [torch.full_like(first, -1)]
    frontier = torch.arange(first.numel(), device=dev)  # candidate ids
    frontier_scores = scores[0]
    count = first.numel()
    sess: dict[int, int] = {}  # candidate id → session node id (only ever-expanded candidates)
    for _ in range(rounds):
        if frontier.numel() == 0:
            break
        fr = frontier.tolist()
        par_ids = parents_of(fr, parents, count)
        ids, lp = session.expand([0 if q < 0 else sess[q] for q in par_ids], torch.cat(toks)[frontier])
        sess.update(zip(fr, ids))
        top = torch.sort(lp, dim=-1, descending=True, stable=True)
        cum = (top.values[:, :K] + frontier_scores[:, None]).flatten()
        kids = top.indices[:, :K].flatten()
        keep = torch.isfinite(cum)
        n_new = int(keep.sum())
        if n_new == 0:
            break
        gid = torch.full_like(kids, -1)
        gid[keep] = count + torch.arange(n_new, device=dev)
        scores.append(cum[keep])
        toks.append(kids[keep])
        parents.append(frontier.repeat_interleave(K)[keep])
        count += n_new
        best = stable_topk(cum.masked_fill(~keep, float("-inf")), K)
        best = best[keep[best]]
        frontier, frontier_scores = gid[best], cum[best]
    all_scores, all_toks, all_par = torch.cat(scores), torch.cat(toks), torch.cat(parents)
    n_keep = min(total_tokens - 1, count)
    sel = torch.sort(stable_topk(all_scores.double(), n_keep)).values
    node = torch.full((count + 1,), -1, dtype=torch.long, device=dev)  # slot count = root (id −1)
    node[sel] = torch.arange(1, n_keep + 1, device=dev)
    node[count] = 0
    par = all_par[sel]
    tree_par = node[torch.where(par < 0, count, par)]
    if (tree_par < 0).any():
        raise AssertionError("EAGLE-2 rerank kept a candidate without its parent")
    return DraftTree(
        tokens=torch.cat([torch.tensor([session.root_token], device=dev), all_toks[sel]]).cpu(),
        parents=[-1, *tree_par.tolist()],
        drafted_depth=rounds + 1 if count else 0,
        width=K,
    )


def parents_of(cands: list[int], parents: list[torch.Tensor], count: int) -> list[int]:
    """Parent candidate id of each candidate in ``cands`` (−1 = root)."""
    flat = torch.cat(parents)
    return flat[torch.tensor(cands, dtype=torch.long, device=flat.device)].tolist()


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

    def max_draft_slots(self) -> int:
        return self.top_k * self.depth  # K frontier nodes expanded per round

    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        return build_eagle2_tree(session, self.depth, self.top_k, self.total_tokens, max_depth)
