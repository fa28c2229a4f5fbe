"""``policy=eagle2``: EAGLE-2's dynamic draft tree (``cnets1.Model.topK_genrate``), algorithms.md §2.3–2.4.

With K = ``top_k`` and R = ``depth`` expansion rounds:

1. level 0: the K most likely children of the root are candidates (score = drafter log-prob);
2. each round expands the K frontier nodes in one drafter forward, adds all K·K children as candidates with
   cumulative log-prob score, and keeps the K best children as the next frontier;
3. rerank: keep the ``total_tokens − 1`` best candidates of all ``K + R·K²``, in ascending candidate
   order (parents before children, siblings by rank).

Ties are broken toward the lower candidate index everywhere. Because a child's score never exceeds its
parent's and parents have lower indices, every kept node's parent is kept — by construction, so a kept candidate's
parent is looked up, not searched for (the reference's ``searchsorted`` lookup can silently pick a wrong parent on
ties); ``eagle2_host_steps`` asserts it, the device builder is tested to build the same trees. The drafted depth is
D = R + 1 (capped by the image positions left). A candidate with zero drafter probability keeps its place with
score −inf: it ranks after every live one and, if the rerank keeps it, is a dead node (``DraftTree.alive``: verified,
never accepted).
"""

from __future__ import annotations

import weakref
from collections.abc import Generator
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from adtbench.algorithm.cost import CostModelSource, PolicyBudget, TreeBudget
from adtbench.algorithm.drafters.draft_phase import DraftPhase, logprob_dtype
from adtbench.algorithm.drafters.graphed import LevelGraphs, LevelRequest, levels_for
from adtbench.algorithm.drafters.session import DraftSession, Expand, Steps
from adtbench.algorithm.policies.base import (
    Method,
    TreePolicy,
    desc_stable,
    register_method,
    stable_topk,
    top_k_stable,
    with_gate,
)
from adtbench.algorithm.policies.sampled import SampledDrafts
from adtbench.algorithm.records import Acceptance
from adtbench.algorithm.tree import DraftTree, HostTree, ancestry_on_device, arange_from, host_ancestry, true_flag
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
    graphed: bool = True,
) -> Steps:
    """EAGLE-2's tree (module docstring) as a coroutine (``drafters.session.Steps``; ``drive(eagle2_steps(session,
    …), session)`` builds it for one session). With a ``budget`` (``adtbench.algorithm.cost``) the rerank keeps the N
    best candidates that maximise the expected committed tokens per unit of time instead of ``total_tokens − 1``, and
    the rounds drafted follow the budget's level rule (``TreeBudget.live``): decided before each round from this
    cycle's candidates (``live``: the CPU, where a read costs nothing), or planned from the image's previous cycle
    (``TreeBudget.plan_rounds``: no read while drafting; other devices).

    Two implementations of one tree: on the drafter's device (``eagle2_device_steps``: what a GPU runs) or, when the
    session decides on the host (``session.on_host``: ``engine.acceptance`` auto on the CPU), on host copies
    (``eagle2_host_steps``: numpy's per-call cost is a fraction of a torch op's). Both draft the same levels and
    build the same tree (tested)."""
    live = budget is not None and budget.live(session.device)
    if getattr(session, "on_host", False):
        return (yield from eagle2_host_steps(session, depth, top_k, total_tokens, max_depth, budget, live))
    return (yield from eagle2_device_steps(session, depth, top_k, total_tokens, max_depth, budget, live, graphed))


def eagle2_device_steps(
    session: DraftSession,
    depth: int,
    top_k: int,
    total_tokens: int,
    max_depth: int,
    budget: TreeBudget | None,
    live: bool,
    graphed: bool = True,
) -> Steps:
    """``eagle2_steps`` on the drafter's device. ``live``: the budget's level rule reads this cycle's candidates before
    each round (one small read per round); otherwise the rounds are planned and building the tree reads nothing but
    the candidates' scores, once, from which the budget decides the node count on the host (``TreeBudget.choose``).
    ``graphed`` (planned rounds, a drafter with graphed levels: ``drafters.graphed``): level 0 and each round one
    graph replay (``_graphed_candidates``), the same candidates.

    Candidates are kept in creation order (level 0: the root's K best children; round r: K·K children of the K
    frontier nodes) with their cumulative drafter log-prob as score; a candidate the drafter gives probability 0
    keeps its place with score −inf: it ranks after every live one (never before its parent) and, if kept, is a
    dead node (``DraftTree.alive``). Every shape is known on the host.
    """
    K = top_k
    rounds = max(0, min(depth, max_depth - 1))
    if budget is not None and not live:
        rounds = budget.plan_rounds(rounds)
    graphs = levels_for(session, 1 + rounds * K, rounds * K) if graphed and not live else None
    phase = DraftPhase(graphs) if graphs is not None and graphs.phases else None
    if graphs is not None:
        score, tok, parent, sizes = _graphed_candidates(session, graphs, K, rounds, phase)
    else:
        score, tok, parent, sizes = yield from _eager_candidates(session, K, rounds, budget if live else None)
    count = score.numel()
    keep = min(total_tokens - 1, count)
    info: dict[str, float | int | str] = {}
    if phase is not None and graphs is not None and budget is not None:  # the rule in the phase, read with the verdict
        return (yield from _device_budget_tree(session, graphs, phase, budget, score, tok, parent, sizes, keep, K))
    if budget is not None:  # the policy's decision on the host, from one read of the candidates' scores
        scores = np.asarray(score.tolist(), dtype=np.float64)
        order = desc_stable(scores)  # the rerank order of every candidate
        level = np.repeat(np.arange(len(sizes)), sizes)
        keep, e_pred = budget.choose(_exp64(scores[order]), level[order], keep, session.levels, K, plan=not live)
        info.update(N_cost=keep, E_pred=e_pred, calib=budget.c)
    if graphs is not None and budget is None:  # the rerank and the tree as one more graph (its shapes are fixed)
        key, n_lev = ("eagle2-tree", K, tuple(sizes), keep, score.data_ptr()), len(sizes)
        program = lambda _: _tree(score, tok, parent, keep, graphs.root, n_lev)  # noqa: E731
        if phase is not None:  # every level, the rerank and the tree: one replay (``drafters.draft_phase``)
            tokens, parents, d, anc, alive = yield from phase.run(key, program)
        else:
            tokens, parents, d, anc, alive = graphs.run(key, None, program, level=False)
    else:
        tokens, parents, d, anc, alive = _tree(score, tok, parent, keep, session.root_token, len(sizes))
    return _drafted(session, K, info, (tokens, parents, d, anc, alive), static=graphs is not None and budget is None)


def _drafted(
    session: DraftSession, K: int, info: dict[str, float | int | str], parts: tuple[torch.Tensor, ...], **more: Any
) -> DraftTree:
    """The ``DraftTree`` of an EAGLE-2 cycle: ``parts`` = (tokens, parents, depth, ancestor mask, alive); ``more``:
    ``static`` (a graph's outputs), ``readout`` / ``on_read``."""
    tokens, parents, d, anc, alive = parts
    return DraftTree(
        tokens,
        parents,
        drafted_depth=len(session.levels) + 1,
        width=K,
        info=info,
        alive=alive,
        depth=d,
        ancestor_mask=anc,
        max_children=K,
        **more,
    )


def _device_budget_tree(
    session: DraftSession,
    graphs: LevelGraphs,
    phase: DraftPhase,
    budget: TreeBudget,
    score: torch.Tensor,
    tok: torch.Tensor,
    parent: torch.Tensor,
    sizes: list[int],
    keep: int,
    K: int,
) -> Generator[DraftPhase, Any, DraftTree]:
    """``budget: cost`` with planned rounds inside the draft phase's one replay (``_cost_tree``): the tree of the
    ``keep`` best candidates at its bucket, those past the node count N the budget chose dead; N, the predicted
    drafts and the next cycle's rounds reach the host with the verdict (``DraftTree.readout`` → ``on_read``).

    Why on the device rather than a read of the scores before the verify (the host path's ``TreeBudget.choose``):
    that read splits the cycle in two — the host waits for the drafting to finish, decides, then builds and launches
    the rest — one synchronisation and some 40 launches more per cycle, against a verify at the bucket of ``keep``
    nodes instead of N's (on a GPU the verify's time is flat across the small buckets, ``cost.CostModel``). The node
    count is a function of the drafter's scores (and the calibration c, from earlier cycles) only, as on the host:
    it chooses which drafted nodes are verified, never how they are accepted, so the output law is exact."""
    level_of, spent, tv, t_level = _budget_tables(budget, session.levels, sizes, keep, K, graphs.device)
    c = graphs.buffer("e2.cost.c", (), torch.float64)
    calib = budget.c
    c.fill_(calib)
    key = ("eagle2-cost", K, tuple(sizes), tuple(session.levels), keep, id(budget), score.data_ptr())
    program = lambda _: _cost_tree(  # noqa: E731
        score, tok, parent, keep, graphs.root, len(sizes), level_of, spent, tv, t_level, c, K
    )
    tokens, parents, d, anc, alive, readout = yield from phase.run(key, program)
    info: dict[str, float | int | str] = {}

    def on_read(values: list[float]) -> None:
        n, e_pred, rounds = values
        budget.next_rounds = int(rounds)
        info.update(N_cost=int(n), E_pred=e_pred, calib=calib)

    return _drafted(session, K, info, (tokens, parents, d, anc, alive), static=True, readout=readout, on_read=on_read)


_TABLES: weakref.WeakKeyDictionary[TreeBudget, dict[Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]]
_TABLES = weakref.WeakKeyDictionary()


def _budget_tables(
    budget: TreeBudget, levels: list[int], sizes: list[int], keep: int, K: int, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """The constants ``_cost_tree`` reads (``TreeBudget.tables``, and each candidate's round), copied to the device
    once per (levels drafted, candidates, keep, K): (round of each candidate ``[M]``, spent ``[L + 1]``,
    t_verify ``[keep + 1 + K]``, t_level(K))."""
    tables = _TABLES.setdefault(budget, {})
    key = (tuple(levels), tuple(sizes), keep, K, dev)
    if key not in tables:
        spent, tv, t_level = budget.tables(levels, keep, K)
        level_of = np.repeat(np.arange(len(sizes)), sizes)
        as_dev = lambda x, dtype: torch.from_numpy(np.ascontiguousarray(x)).to(dev, dtype)  # noqa: E731
        tables[key] = (as_dev(level_of, torch.long), as_dev(spent, torch.float64), as_dev(tv, torch.float64), t_level)
    return tables[key]


def _cost_tree(
    score: torch.Tensor,
    tok: torch.Tensor,
    parent: torch.Tensor,
    keep: int,
    root: torch.Tensor,
    levels: int,
    level_of: torch.Tensor,
    spent: torch.Tensor,
    tv: torch.Tensor,
    t_level: float,
    c: torch.Tensor,
    frontier: int,
) -> tuple[torch.Tensor, ...]:
    """``TreeBudget.choose`` (``plan``) on the device, in fixed shapes: π the candidates' path probabilities in
    rerank order; for each number of rounds l the best prefix count n_l of the rounds ≤ l's candidates
    (``rate = (1 + c·Σπ) / (spent_l + t_verify(n + 1))``, the first maximum), and the next cycle's rounds — the first
    l whose one more round could not beat its best rate. N = n_L. Returns ``_tree`` at ``keep`` with the nodes of
    rerank rank ≥ N dead (the rerank order is closed under ancestors: a live node's ancestors live), and the readout
    (N, Σ_{i<N} π_i, next rounds) in float64."""
    count, dev = score.numel(), score.device
    vals, order = stable_topk(score, count)  # the rerank order of every candidate
    pi = vals.to(torch.float64).exp()
    lev = level_of.index_select(0, order)
    L = spent.numel() - 1
    rounds = arange_from(0, L + 1, dev)[:, None]
    upto = torch.where(lev[None] <= rounds, pi[None], 0.0).sort(-1, descending=True).values
    cums = torch.cat([upto.new_zeros(L + 1, 1), upto[:, :keep].cumsum(-1)], -1)  # [L + 1, keep + 1]
    rate = (1.0 + c * cums) / (spent[:, None] + tv[None, : keep + 1])
    n = rate.argmax(-1)  # the first maximum, as ``np.argmax``
    best = rate.gather(1, n[:, None])[:, 0]
    f_pi = torch.where(lev[None] == rounds, pi[None], 0.0).sort(-1, descending=True).values[:, :frontier].sum(-1)
    gain = 1.0 + c * cums.gather(1, n[:, None])[:, 0]
    t_more = spent + t_level + tv.index_select(0, n + frontier)
    stop = torch.cat([(gain + c * f_pi) / t_more <= best, true_flag(dev)])
    next_rounds = stop.to(torch.uint8).argmax()  # the first True
    N = n[L:]
    tokens, parents, d, anc, alive = _tree(score, tok, parent, keep, root, levels)
    rank = torch.empty_like(order).scatter_(0, order, arange_from(0, count, dev))  # candidate → its rerank rank
    sel = order[:keep].sort().values  # the tree's nodes 1 … keep, as ``_tree`` orders them
    alive = alive & torch.cat([true_flag(dev), rank.index_select(0, sel) < N])
    readout = torch.cat([N.to(torch.float64), cums[L].index_select(0, N), next_rounds.view(1).to(torch.float64)])
    return tokens, parents, d, anc, alive, readout


def _tree(
    score: torch.Tensor, tok: torch.Tensor, parent: torch.Tensor, keep: int, root: torch.Tensor, levels: int = 0
) -> tuple[torch.Tensor, ...]:
    """EAGLE-2's rerank and tree from its candidates (score, token, parent candidate ``[M]``): the ``keep`` best
    candidates (stable: ties toward the lower index) in creation order (parents before children) under ``root``
    ``[1]``; returns (tokens, parents, depth, ancestor mask, alive) on the candidates' device, in fixed shapes (no
    read). ``levels``: the rounds drafted + 1, the trees' depth bound (0: ``keep``)."""
    count, dev = score.numel(), score.device
    _, order = stable_topk(score, keep)
    sel = order.sort().values  # kept candidates in creation order: parents before children
    slot = torch.full((count + 1,), -1, dtype=torch.long, device=dev)  # candidate → tree node; slot ``count`` = root
    slot[sel] = arange_from(1, keep + 1, dev)
    slot[count:] = 0  # a slice: a fill on the device (an index would copy the 0 from the host)
    tree_par = slot[torch.where(parent[sel] < 0, count, parent[sel])]
    parents = torch.cat([_const(-1, 1, dev), tree_par])
    d, anc = ancestry_on_device(parents, levels if levels > 0 else keep)
    alive = torch.cat([true_flag(dev), score[sel] > float("-inf")])
    return torch.cat([root, tok[sel]]), parents, d, anc, alive


def _eager_candidates(
    session: DraftSession, K: int, rounds: int, live: TreeBudget | None
) -> Generator[Expand, tuple[range, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]]:
    """EAGLE-2's candidates level by level through ``session.expand`` (yielded: batched drafting runs many sessions'
    levels in one forward): (score, token, parent candidate (−1: the root), the candidates made per level).
    ``live``: the budget's level rule decides before each round (one small read per round)."""
    dev = session.device
    v0, t0 = stable_topk(session.root_logprobs(), K)
    k0 = v0.numel()  # K, or V when the vocabulary is smaller
    scores, toks, par = [v0], [t0], [_const(-1, k0, dev)]
    f_score, f_tok, f_cand, f_sess = v0, t0, torch.arange(k0, device=dev), _const(0, k0, dev)
    count = k0
    for r in range(rounds):
        if live is not None:
            pi = _exp64(np.asarray(torch.cat([*scores, f_score]).tolist()))  # one read: drafted, frontier
            if not _worth_a_round(live, pi[:count], pi[count:], session.levels):
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
    return torch.cat(scores), torch.cat(toks), torch.cat(par), [s.numel() for s in scores]


ROUND_CAP = 16
"""Rounds the graphed candidate buffers hold (more are sized on demand): one buffer per top-k serves every depth."""


def _graphed_candidates(
    session: DraftSession, graphs: LevelGraphs, K: int, rounds: int, phase: DraftPhase | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """``_eager_candidates`` (planned rounds) as graphed levels (``drafters.graphed``): level 0 (the root's log-probs
    and its K best children) and each round (the frontier's expand, its log-probs, the K best children per frontier
    node with their cumulative scores, the next frontier) are one graph replay each, writing the candidates into
    static buffers — score, token, parent candidate at their creation index; the frontier of round r (score, token,
    candidate, session node) in row r — that the next level reads. The shapes are the eager path's, known on the
    host: k0 = min(K, V) root children, m_r frontier nodes in round r, min(K, V) children each. With a ``phase``
    (``drafters.draft_phase``) the levels are queued there instead, to replay with the tree as one graph."""
    target, sp, layout = session.target, session.sp, session.layout
    V = layout.vocab_size
    k0 = kk = min(K, V)
    cap_r = max(ROUND_CAP, rounds)
    cap = k0 + cap_r * K * kk
    dtype = logprob_dtype(graphs.dtype)  # the processed log-probs' dtype
    sc = graphs.buffer(f"e2.score.{K}.{cap}", (cap,), dtype)
    tk = graphs.buffer(f"e2.token.{K}.{cap}", (cap,), torch.long)
    pr = graphs.buffer(f"e2.parent.{K}.{cap}", (cap,), torch.long)
    fs = graphs.buffer(f"e2.f_score.{K}.{cap}", (cap_r + 1, K), dtype)
    ft = graphs.buffer(f"e2.f_token.{K}.{cap}", (cap_r + 1, K), torch.long)
    fc = graphs.buffer(f"e2.f_cand.{K}.{cap}", (cap_r + 1, K), torch.long)
    fn = graphs.buffer(f"e2.f_node.{K}.{cap}", (cap_r + 1, K), torch.long)
    dev = graphs.device
    run = graphs.run if phase is None else phase.add

    def level0(_: int | None) -> None:
        v0, t0 = stable_topk(graphs.root_logprobs(target, layout, sp), K)
        sc[:k0], tk[:k0] = v0, t0
        pr[:k0] = _const(-1, k0, dev)
        fs[0, :k0], ft[0, :k0], fc[0, :k0] = v0, t0, arange_from(0, k0, dev)
        fn[0, :k0] = _const(0, k0, dev)

    run(("eagle2", K, cap, 0, sp, id(target)), None, level0)
    sizes, m, count = [k0], k0, k0
    for r in range(rounds):
        n0, c0, made = session.num_nodes, count, m * kk
        nxt = min(K, made)

        def level(
            Kw: int | None, r: int = r, m: int = m, n0: int = n0, c0: int = c0, nxt: int = nxt
        ) -> Generator[LevelRequest, tuple[torch.Tensor, torch.Tensor], None]:
            assert Kw is not None
            lp = yield from graphs.expand(target, layout, sp, fn[r, :m], ft[r, :m], n0, r + 1, Kw)
            vals, kids = stable_topk(lp, K)  # [m, kk]
            cum = (vals + fs[r, :m, None]).view(-1)
            sc[c0 : c0 + m * kk], tk[c0 : c0 + m * kk] = cum, kids.reshape(-1)
            pr[c0 : c0 + m * kk] = fc[r, :m].repeat_interleave(kk, output_size=m * kk)
            f_score, best = stable_topk(cum, nxt)
            fs[r + 1, :nxt], ft[r + 1, :nxt] = f_score, tk[c0 : c0 + m * kk][best]
            fc[r + 1, :nxt], fn[r + 1, :nxt] = c0 + best, n0 + best // kk

        run(("eagle2", K, cap, r + 1, m, n0, sp, id(target)), n0 - 1 + m, level)
        graphs.advance(session, m)
        sizes.append(made)
        m, count = nxt, count + made
    return sc[:count], tk[:count], pr[:count], sizes  # views of the buffers: read before the next cycle drafts


def eagle2_host_steps(
    session: DraftSession,
    depth: int,
    top_k: int,
    total_tokens: int,
    max_depth: int,
    budget: TreeBudget | None,
    live: bool,
) -> Steps:
    """``eagle2_steps`` on host copies: the same candidates, rounds, rerank and tree as ``eagle2_device_steps``
    (tested), in flat numpy arrays (a few dozen to a few hundred entries). The torch work per level is the drafter
    forward and one copy of its log-probs to the host, ranked there (``top_k_stable``: the order of a stable
    descending ``torch.sort``); scores stay in the drafter's float dtype, so sums round exactly as on the device, and
    path probabilities are exponentiated by torch's own kernel, once per candidate as it is made (the budget's sums
    see the device path's values). The tree's ancestry comes from a per-process cache (``tree.host_ancestry``: trees
    repeat their shapes)."""
    K = top_k
    rounds = max(0, min(depth, max_depth - 1))
    if budget is not None and not live:
        rounds = budget.plan_rounds(rounds)
    dev = session.device
    lp0 = session.root_logprobs().cpu().numpy()
    t0 = top_k_stable(lp0, K)
    k0 = t0.size
    cap = k0 + rounds * k0 * k0
    scores = np.empty(cap, dtype=lp0.dtype)
    toks = np.empty(cap, dtype=np.int64)
    par = np.empty(cap, dtype=np.int64)
    level = np.empty(cap, dtype=np.int64)
    scores[:k0], toks[:k0], par[:k0], level[:k0] = lp0[t0], t0, -1, 0
    pi = np.empty(cap if budget is not None else 0)  # path probabilities (float64) of the candidates, as made
    if budget is not None:
        pi[:k0] = _exp64(scores[:k0])
    f_cand, f_sess = np.arange(k0), np.zeros(k0, dtype=np.int64)
    count = k0
    for r in range(rounds):
        if live:
            assert budget is not None
            first = r == 0  # the root's children: ranked already, and the whole frontier
            if not _worth_a_round(budget, pi[:count], pi[:count] if first else pi[f_cand], session.levels, first):
                break
        ids, lp_t = yield Expand(torch.from_numpy(f_sess).to(dev), torch.from_numpy(toks[f_cand]).to(dev), r + 1)
        lp = lp_t.cpu().numpy()
        kids = top_k_stable(lp, K)  # [f, k] per frontier row, ties toward the lower token id
        cum = (np.take_along_axis(lp, kids, -1) + scores[f_cand][:, None]).ravel()
        end = count + cum.size
        scores[count:end], toks[count:end], level[count:end] = cum, kids.ravel(), r + 1
        par[count:end] = np.repeat(f_cand, kids.shape[1])
        if budget is not None:
            pi[count:end] = _exp64(cum)
        best = top_k_stable(cum, K)  # the next frontier: the K best new candidates
        f_sess = np.arange(ids.start, ids.stop)[best // kids.shape[1]]
        f_cand = count + best
        count = end
    score = scores[:count]
    keep = min(total_tokens - 1, count)
    info: dict[str, float | int | str] = {}
    if count == k0:  # no round drafted: the root's children, already in rerank order (``t0``'s stable order)
        if budget is not None:
            keep, e_pred = budget.choose(pi[:count], level[:count], keep, session.levels, K, plan=not live)
            info.update(N_cost=keep, E_pred=e_pred, calib=budget.c)
        sel: np.ndarray | slice = slice(0, keep)  # the first ``keep``: a view, no gather
        parents = _star(keep)
    else:
        order = desc_stable(score)  # the rerank order of every candidate
        if budget is not None:
            keep, e_pred = budget.choose(pi[order], level[:count][order], keep, session.levels, K, plan=not live)
            info.update(N_cost=keep, E_pred=e_pred, calib=budget.c)
        sel = np.sort(order[:keep])  # kept candidates in creation order: parents before children
        slot = np.full(count + 1, -1, dtype=np.int64)  # candidate → tree node; slot ``count`` = the root
        slot[sel] = np.arange(1, keep + 1)
        slot[count] = 0
        parents = np.concatenate([[-1], slot[np.where(par[sel] < 0, count, par[sel])]])
        assert keep == 0 or parents[1:].min() >= 0, "EAGLE-2 kept a candidate without its parent"
    d, anc = host_ancestry(parents)  # parents precede children by construction: no check
    live_nodes = score[sel] > -np.inf
    alive = None if live_nodes.all() else np.concatenate([[True], live_nodes])
    depth = int(d.max() if alive is None else d[alive].max())  # the realised depth, over the live nodes
    host = HostTree(parents.tolist(), depth, None if alive is None else alive.tolist())
    return DraftTree(
        torch.cat([session.root_token, torch.from_numpy(toks[sel]).to(dev)]),
        torch.from_numpy(parents).to(dev),
        drafted_depth=len(session.levels) + 1,
        width=K,
        info=info,
        alive=None if alive is None else torch.from_numpy(alive).to(dev),
        depth=torch.from_numpy(d).to(dev),
        ancestor_mask=torch.from_numpy(anc).to(dev),
        max_children=K,
        host=host,
    )


def _exp64(scores: np.ndarray) -> np.ndarray:
    """``exp`` of host scores in float64: every path's path probabilities (the host path's, and the device path's
    after its read), so the budget's sums and ties are equal on both."""
    out: np.ndarray = np.exp(scores.astype(np.float64))
    return out


def _worth_a_round(
    budget: TreeBudget, drafted: np.ndarray, frontier: np.ndarray, levels: list[int], ordered: bool = False
) -> bool:
    """The level rule before a round (``TreeBudget.worth_expanding``) from the path probabilities of the candidates
    drafted so far and of the frontier it would expand (host arrays). ``ordered``: ``drafted`` is descending already
    (the root's children in rank order, before the first round), so sorting it would give the same values."""
    ranked = drafted if ordered else np.sort(drafted)[::-1]
    return budget.worth_expanding(ranked, float(frontier.sum()), frontier.size, budget.spent_ms(levels))


@lru_cache(maxsize=64)
def _star(n: int) -> np.ndarray:
    """Parents ``[n + 1]`` of a root with ``n`` children: ``[−1, 0, …, 0]`` (cached, never written)."""
    out = np.zeros(n + 1, dtype=np.int64)
    out[0] = -1
    return out


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
        rounds: str = "auto",
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
        self.cost = PolicyBudget(budget, ("fixed", "cost"), calibrate, rounds)
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
        return (yield from eagle2_steps(session, d, k, n, max_depth, budget, self.graphs.levels != "eager"))

    def observe(self, tree: DraftTree, acceptance: Acceptance, root_gen: int) -> None:
        self.cost.observe(tree, acceptance)
        self.sampled.observe(tree, acceptance)

    def reset(self) -> None:
        self.cost.reset()
        self.sampled.reset()


def build_eagle2(node: Any) -> Eagle2Policy:
    """``policy=eagle2``: ``depth``, ``top_k``, ``total_tokens``, ``budget`` (default fixed), ``calibrate``,
    ``draft_sampling``, ``rounds``, ``gate_tokens``, ``gate_explore``."""
    policy = Eagle2Policy(
        int(node["depth"]),
        int(node["top_k"]),
        int(node["total_tokens"]),
        str(node.get("budget", "fixed")),
        node.get("calibrate", True),
        str(node.get("draft_sampling", "topk")),
        str(node.get("rounds", "auto")),
    )
    return with_gate(policy, node)


register_method(
    Method(
        "eagle2",
        build_eagle2,
        "adtbench.harness.schema:Eagle2Conf",
        lossless=("exact",),
        graphs=("verify", "levels", "step"),
        smoke=("policy.total_tokens=12", "policy.top_k=3", "policy.depth=3"),
    )
)
