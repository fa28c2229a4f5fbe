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

from functools import lru_cache
from typing import Any

import torch

from adtbench.algorithm.cost import CostModelSource, PolicyBudget, TreeBudget
from adtbench.algorithm.drafters.session import DraftSession, Expand, Steps
from adtbench.algorithm.policies.base import POLICIES, TreePolicy, stable_topk, with_gate
from adtbench.algorithm.policies.sampled import SampledDrafts
from adtbench.algorithm.tree import DraftTree, ancestry_on_device, true_flag
from adtbench.algorithm.verify import Acceptance
from adtbench.errors import ConfigError, check_number


def eagle2_candidates(depth: int, top_k: int) -> int:
    """Number of candidates EAGLE-2 produces: K + depth·K²."""
    return top_k + depth * top_k * top_k


def eagle2_steps(
    session: DraftSession,
    depth: int,
    top_k: int,
    total_tokens: int,
    max_depth: int,
    budget: TreeBudget | None = None,
) -> Steps:
    """EAGLE-2's tree (module docstring), built on the drafter's device (a coroutine: ``drafters.session.Steps``;
    ``drive(eagle2_steps(session, …), session)`` builds it for one session). With a ``budget``
    (``adtbench.algorithm.cost``) the rerank keeps the N best candidates that maximise the expected committed tokens
    per unit of time instead of ``total_tokens − 1`` (N is the one value the host reads before the verify), and the
    rounds drafted follow the budget's level rule: decided before each round from this cycle's candidates when the
    session decides on the host (``session.on_host``: the CPU, where a read costs nothing), else planned from the
    image's previous cycle (``TreeBudget.plan_rounds``: no read while drafting).

    Candidates are kept in creation order (level 0: the root's K best children; round r: K·K children of the K
    frontier nodes) with their cumulative drafter log-prob as score; a candidate the drafter gives probability 0
    keeps its place with score −inf: it ranks after every live one (never before its parent) and, if kept, is a
    dead node (``DraftTree.alive``). Every shape is known on the host, so building the tree reads nothing.
    """
    K = top_k
    rounds = max(0, min(depth, max_depth - 1))
    live = budget is not None and getattr(session, "on_host", False)  # decide each round now (reads are free)
    if budget is not None and not live:
        rounds = budget.plan_rounds(rounds)
    dev = session.device
    v0, t0 = stable_topk(session.root_logprobs(), K)
    k0 = v0.numel()  # K, or V when the vocabulary is smaller
    scores, toks, par = [v0], [t0], [_const(-1, k0, dev)]
    f_score, f_tok, f_cand, f_sess = v0, t0, torch.arange(k0, device=dev), _const(0, k0, dev)
    count = k0
    for r in range(rounds):
        if live:
            assert budget is not None
            drafted = torch.cat(scores).to(torch.float64).exp().sort(descending=True).values.cpu().numpy()
            f_pi = float(f_score.to(torch.float64).exp().sum())
            if not budget.worth_expanding(drafted, f_pi, f_score.numel(), budget.spent_ms(session.levels)):
                break
        ids, lp = yield Expand(f_sess, f_tok, r + 1)
        vals, kids = stable_topk(lp, K)  # [f, K] per frontier row, ties toward the lower token id
        cum = (vals + f_score[:, None]).view(-1)
        scores.append(cum)
        toks.append(kids.reshape(-1))
        par.append(f_cand.repeat_interleave(vals.shape[1], output_size=cum.numel()))
        f_score, best = stable_topk(cum, K)  # the next frontier: the K best new candidates
        f_tok, f_cand = toks[-1][best], count + best
        f_sess = torch.arange(ids.start, ids.stop, device=dev)[best // vals.shape[1]]
        count += cum.numel()
    score, tok, parent = torch.cat(scores), torch.cat(toks), torch.cat(par)
    keep = min(total_tokens - 1, count)
    ranked, order = stable_topk(score, count)  # the rerank order of every candidate
    info: dict[str, float | int | str] = {}
    if budget is not None:
        level = torch.cat([torch.full((s.numel(),), i, device=dev) for i, s in enumerate(scores)])
        keep, e_pred = budget.choose(ranked, level[order], keep, session.levels, K)
        info.update(N_cost=keep, E_pred=e_pred, calib=budget.c)
    order = order[:keep]
    sel = order.sort().values  # kept candidates in creation order: parents before children
    slot = torch.full((count + 1,), -1, dtype=torch.long, device=dev)  # candidate → tree node; slot ``count`` = root
    slot[sel] = torch.arange(1, keep + 1, device=dev)
    slot[count:] = 0  # a slice: a fill on the device (an index would copy the 0 from the host)
    tree_par = slot[torch.where(parent[sel] < 0, count, parent[sel])]
    parents = torch.cat([_const(-1, 1, dev), tree_par])
    d, anc = ancestry_on_device(parents, rounds + 1)
    return DraftTree(
        torch.cat([session.root_token, tok[sel]]), parents, drafted_depth=len(session.levels) + 1, width=K,
        info=info, alive=torch.cat([true_flag(dev), score[sel] > float("-inf")]), depth=d, ancestor_mask=anc,
        max_children=K,
    )  # fmt: skip


@lru_cache(maxsize=256)
def _const(value: int, n: int, device: torch.device) -> torch.Tensor:
    """A constant long ``[n]`` on ``device`` (cached, never written)."""
    return torch.full((n,), value, dtype=torch.long, device=device)


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
        depth = check_number(depth, "policy.depth", int, lo=1)
        top_k = check_number(top_k, "policy.top_k", int, lo=1)
        total_tokens = check_number(total_tokens, "policy.total_tokens", int, lo=2)  # the root + one draft
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

    def propose_steps(self, session: DraftSession, max_depth: int) -> Steps:
        budget = self.cost.tree_budget(self.name)
        d, k, n = self.depth, self.top_k, self.total_tokens
        if self.sampled.applies(session):
            return (yield from self.sampled.steps(session, d, k, n, max_depth, budget))
        return (yield from eagle2_steps(session, d, k, n, max_depth, budget))

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
