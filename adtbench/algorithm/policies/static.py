"""Static trees (EAGLE-1 / LANTERN++) and chains.

A static tree is a list of child-rank paths: ``[0, 1]`` is "the 2nd-ranked child of the top-1 child of the
root". Paths must be prefix-closed. Any top-k works (no hard-coded stride). Drafting runs one drafter
forward per level over all nodes of that level that have children.

``draft_sampling``:
- ``topk``: rank r = the r-th most likely drafter token (deterministic, point-mass proposals; always
  used at temperature 0);
- ``sample``: a node's children are drawn *without replacement* from the drafter's processed
  distribution, in rank order; the tree carries that distribution so the verifier uses the true q.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adtbench.algorithm.drafters.draft_phase import DraftPhase, logprob_dtype
from adtbench.algorithm.drafters.graphed import LevelGraphs, LevelRequest, levels_for
from adtbench.algorithm.drafters.session import DraftSession, Expand, Steps
from adtbench.algorithm.policies.base import Method, TreePolicy, register_method, stable_topk, with_gate
from adtbench.algorithm.sampling import draw_into, gumbel_top_k
from adtbench.algorithm.tree import DraftTree, true_flag
from adtbench.errors import check_choice, check_number

# mc_sim_7b_63: EAGLE-1's default tree (SafeAILab/EAGLE eagle/model/choices.py), 25 nodes, depth 5.
MC_SIM_7B_63 = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
                [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
                [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]  # fmt: skip


def chain_paths(depth: int) -> list[list[int]]:
    return [[0] * d for d in range(1, depth + 1)]


def full_tree_paths(width: int, depth: int) -> list[list[int]]:
    """Every rank path with ranks < width up to ``depth`` levels (width^1 + … + width^depth nodes)."""
    level = [[r] for r in range(width)]
    out = list(level)
    for _ in range(depth - 1):
        level = [[*p, r] for p in level for r in range(width)]
        out += level
    return out


def wide_top_paths(width: int, depth: int) -> list[list[int]]:
    """``width`` siblings at every level along the top-1 spine (a "fishbone", width·depth nodes)."""
    return [[0] * d + [r] for d in range(depth) for r in range(width)]


SHAPES: dict[str, list[list[int]]] = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    "chain_5": chain_paths(5),
    "full_2x4": full_tree_paths(2, 4),
    "fishbone_4x5": wide_top_paths(4, 5),
}


def validate_paths(paths: Sequence[Sequence[int]], key: str = "policy.tree") -> list[tuple[int, ...]]:
    """Check a rank-path list (non-empty, ranks ≥ 0, prefix-closed, no duplicates); return sorted tuples."""
    from adtbench.errors import ConfigError

    if not paths:
        raise ConfigError(key, "a static tree needs at least one path")
    tuples = [tuple(int(r) for r in p) for p in paths]
    if len(set(tuples)) != len(tuples):
        raise ConfigError(key, "duplicate paths")
    present = set(tuples)
    for p in tuples:
        if not p or min(p) < 0:
            raise ConfigError(key, f"path {list(p)} must be a non-empty list of ranks ≥ 0")
        if len(p) > 1 and p[:-1] not in present:
            raise ConfigError(key, f"path {list(p)} has no parent path {list(p[:-1])} (paths must be prefix-closed)")
    return sorted(tuples, key=lambda p: (len(p), p))


@dataclass(frozen=True)
class _Level:
    """One level of a static tree's drafting plan (node ids are positions in the sorted path list, root 0).

    ``row [m]``: the row of the level's log-prob block each node draws from (its parent's row); ``rank [m]``: its
    child rank; ``parents [m]``: its parent node; ``grow``: indices (into the level) of the nodes that have
    children; ``grow_parents``: the session ids of those nodes' parents (the session numbers nodes in expand
    order: the root 0, then each level's grown nodes)."""

    row: torch.Tensor
    rank: torch.Tensor
    parents: torch.Tensor
    width: int  # draws per row (1 + the largest rank of the level)
    grow: torch.Tensor
    grow_parents: torch.Tensor


@dataclass(frozen=True)
class _Plan:
    levels: list[_Level]
    parents: torch.Tensor  # [n] (−1 for the root)
    depth: torch.Tensor
    ancestor_mask: torch.Tensor
    proposal_nodes: torch.Tensor  # nodes with children, in level order (the rows of the stacked q)
    max_children: int
    child_ranks: torch.Tensor


class StaticTreePolicy(TreePolicy):
    name = "static"

    def __init__(self, paths: Sequence[Sequence[int]], draft_sampling: str = "topk", name: str = "static") -> None:
        self.paths = validate_paths(paths)
        self.draft_sampling = check_choice(draft_sampling, "policy.draft_sampling", ("topk", "sample"))
        self.name = name
        self.width = max(p[-1] for p in self.paths) + 1
        self._plans: dict[tuple[int, torch.device], _Plan] = {}

    def max_nodes(self) -> int:
        return len(self.paths) + 1

    def _plan(self, max_depth: int, device: torch.device) -> _Plan:
        """The drafting plan of the tree cut at ``max_depth`` levels, on ``device``: every cut's plan is built at the
        first call on a device (the shape never changes, so no per-cycle bookkeeping is left but the tokens, and the
        cuts an image's end needs make no host→device copy in a timed cycle)."""
        if (max_depth, device) not in self._plans:
            for depth in range(1, max(map(len, self.paths)) + 1):
                self._plans[(depth, device)] = self._build_plan(depth, device)
        return self._plans[(max_depth, device)]

    def _build_plan(self, max_depth: int, device: torch.device) -> _Plan:
        """The plan of one cut (``_plan``)."""
        paths = [p for p in self.paths if len(p) <= max_depth]  # sorted by (length, path): a prefix, levels contiguous
        node: dict[tuple[int, ...], int] = {(): 0} | {p: i + 1 for i, p in enumerate(paths)}
        inner = {p[:-1] for p in paths if len(p) > 1}
        sess: dict[tuple[int, ...], int] = {(): 0}
        levels: list[_Level] = []
        for level in range(1, max(map(len, paths)) + 1):
            here = [p for p in paths if len(p) == level]
            prefixes = list(dict.fromkeys(p[:-1] for p in here))  # parents, in the order of their first child
            grow = [i for i, p in enumerate(here) if p in inner and level < max_depth]
            grow_parents = [sess[here[i][:-1]] for i in grow]
            for i in grow:
                sess[here[i]] = len(sess)
            levels.append(
                _Level(
                    row=_long([prefixes.index(p[:-1]) for p in here], device),
                    rank=_long([p[-1] for p in here], device),
                    parents=_long([node[p[:-1]] for p in here], device),
                    width=max(p[-1] for p in here) + 1,
                    grow=_long(grow, device),
                    grow_parents=_long(grow_parents, device),
                )
            )
        par = [-1] + [node[p[:-1]] for p in paths]
        tree = DraftTree(torch.zeros(len(par), dtype=torch.long, device=device), par, drafted_depth=0)
        kids = [sum(1 for q in paths if q[:-1] == p) for p in [(), *paths]]
        return _Plan(
            levels,
            tree.parents,
            tree.depth,
            tree.ancestor_mask,
            _long([node[p] for p in [(), *paths] if p == () or p in inner], device),
            max(kids),
            tree.child_ranks,
        )

    def propose_steps(self, session: DraftSession, max_depth: int) -> Steps:
        """Draft level by level: each level's tokens are one gather from the ranked (top-k) or drawn (sample) tokens
        of its parents' rows; the shape, the session ids and the masks come from the plan."""
        sample = self.draft_sampling == "sample" and not session.greedy
        plan = self._plan(min(max_depth, max(map(len, self.paths))), session.device)
        grown = sum(lv.grow.numel() for lv in plan.levels)
        graphs = levels_for(session, 1 + grown, grown) if self.graphs.levels != "eager" else None
        if graphs is not None:
            return (yield from self._graphed(session, graphs, plan, sample))
        lp = session.root_logprobs()[None]  # [rows, V]: the level's parents' distributions
        tokens, alive, qs = [session.root_token], [true_flag(session.device)], []
        alive_all = alive[0]
        for i, lv in enumerate(plan.levels):
            if sample:
                drawn, ok = gumbel_top_k(lp, lv.width, session.generator)
                qs.append(lp)
            else:
                vals, drawn = stable_topk(lp, lv.width)
                ok = vals > float("-inf")
            tok, live = drawn[lv.row, lv.rank], ok[lv.row, lv.rank] & alive_all[lv.parents]
            tokens.append(tok)
            alive.append(live)
            alive_all = torch.cat(alive)
            if lv.grow.numel():
                _, lp = yield Expand(lv.grow_parents, tok[lv.grow], i + 1)
        proposal = None
        if sample:
            q = torch.cat(qs).exp()
            proposal = q.new_zeros(plan.parents.numel(), q.shape[-1]).index_copy_(0, plan.proposal_nodes, q)
        return DraftTree(
            torch.cat(tokens),
            plan.parents,
            drafted_depth=len(plan.levels),
            width=self.width,
            proposal=proposal,
            alive=alive_all,
            depth=plan.depth,
            ancestor_mask=plan.ancestor_mask,
            max_children=plan.max_children,
            child_ranks=plan.child_ranks,
        )

    def _graphed(
        self, session: DraftSession, graphs: LevelGraphs, plan: _Plan, sample: bool
    ) -> Generator[DraftPhase, Any, DraftTree]:
        """``propose_steps``'s tree with each level one graph replay (``drafters.graphed``): level i's program draws
        its nodes from its parents' log-probs (the root's, computed in level 0's program, or the buffer the previous
        level's program wrote) — a stable top-k, or Gumbel keys from noise drawn into a static buffer just before the
        replay (the eager path's draws, in the same order from the same generator) — writes their tokens, liveness
        and (sampled) their parents' distributions into static buffers, then expands the nodes that have children
        and writes their children's log-probs for level i + 1. The tree's tokens, liveness and proposal rows are those
        buffers (no copy: the cycle verifies and observes its tree before the next cycle drafts). With
        ``LevelGraphs.phases`` every level's noise is drawn first and the levels replay as one graph
        (``drafters.draft_phase``)."""
        target, layout, sp, dev = session.target, session.layout, session.sp, session.device
        n = plan.parents.numel()
        sizes = [lv.rank.numel() for lv in plan.levels]
        V = layout.vocab_size
        dtype = logprob_dtype(graphs.dtype)
        name = f"static.{id(plan)}"
        toks = graphs.buffer(f"{name}.tokens", (n,), torch.long)
        alive = graphs.buffer(f"{name}.alive", (n,), torch.bool)
        q = graphs.buffer(f"{name}.q", (n, V), dtype) if sample else None
        lps = [graphs.buffer(f"{name}.lp{i}", (max(1, lv.grow.numel()), V), dtype) for i, lv in enumerate(plan.levels)]
        noise = [graphs.buffer(f"{name}.e{i}", (1 if i == 0 else plan.levels[i - 1].grow.numel(), V), torch.float64)
                 for i in range(len(plan.levels))] if sample else []  # fmt: skip
        node, n0, q_row = 1, 1, 0
        phase = DraftPhase(graphs) if graphs.phases else None
        run = graphs.run if phase is None else phase.add
        for i, lv in enumerate(plan.levels):
            m, g = sizes[i], lv.grow.numel()

            def level(
                K: int | None, i: int = i, lv: _Level = lv, node: int = node, n0: int = n0, q_row: int = q_row
            ) -> Generator[LevelRequest, tuple[torch.Tensor, torch.Tensor], None]:
                if i == 0:
                    lp = graphs.root_logprobs(target, layout, sp)[None]
                    alive[:1], toks[:1] = true_flag(dev), graphs.root
                else:
                    lp = lps[i - 1][: plan.levels[i - 1].grow.numel()]
                if sample:
                    assert q is not None
                    keys = lp.to(torch.float64) - noise[i].log()
                    top = keys.topk(min(lv.width, keys.shape[-1]), dim=-1)
                    drawn, ok = top.indices, top.values > float("-inf")
                    q.index_copy_(0, plan.proposal_nodes[q_row : q_row + lp.shape[0]], lp.exp())
                else:
                    vals, drawn = stable_topk(lp, lv.width)
                    ok = vals > float("-inf")
                tok = drawn[lv.row, lv.rank]
                toks[node : node + lv.rank.numel()] = tok
                alive[node : node + lv.rank.numel()] = ok[lv.row, lv.rank] & alive[lv.parents]
                if K is not None:
                    out = yield from graphs.expand(target, layout, sp, lv.grow_parents, tok[lv.grow], n0, i + 1, K)
                    lps[i][: lv.grow.numel()] = out

            if sample:  # before the level's replay, or every level's before the phase's: the same order
                draw_into(noise[i], "exponential_", session.generator)
            key = ("static", id(plan), i, sample, sp, id(target))
            run(key, n0 - 1 + g if g else None, level)
            if g:
                graphs.advance(session, g)
            q_row += 1 if i == 0 else plan.levels[i - 1].grow.numel()
            node, n0 = node + m, n0 + g
        if phase is not None:  # every level in one replay; the tree's shape is the plan's, its tokens the buffers
            yield from phase.run(("static", id(plan), sample, sp, id(target)))
        return DraftTree(  # the buffers themselves: the cycle verifies this tree before the next one is drafted
            toks,
            plan.parents,
            drafted_depth=len(plan.levels),
            width=self.width,
            proposal=q,
            alive=alive,
            depth=plan.depth,
            ancestor_mask=plan.ancestor_mask,
            max_children=plan.max_children,
            child_ranks=plan.child_ranks,
            static=True,
        )


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


class ChainPolicy(StaticTreePolicy):
    """A single path of ``depth`` drafts (top-1, or sampled from q at temperature > 0 with ``sample``)."""

    def __init__(self, depth: int = 5, draft_sampling: str = "topk") -> None:
        super().__init__(chain_paths(check_number(depth, "policy.depth", int, lo=1)), draft_sampling, name="chain")


def build_chain(node: Any) -> ChainPolicy:
    """``policy=chain``: ``depth``, ``draft_sampling``, ``gate_tokens``, ``gate_explore``."""
    return with_gate(ChainPolicy(int(node["depth"]), str(node["draft_sampling"])), node)


def build_static(node: Any) -> StaticTreePolicy:
    """``policy=static``: ``tree`` (a name in ``SHAPES`` or a list of child-rank paths), ``draft_sampling``,
    ``gate_tokens``, ``gate_explore``."""
    from adtbench.errors import ConfigError

    tree = node["tree"]
    paths: Any
    if isinstance(tree, str):
        if tree not in SHAPES:
            raise ConfigError("policy.tree", f"unknown shape {tree!r}; shipped shapes: {sorted(SHAPES)}")
        paths = SHAPES[tree]
    else:
        paths = [list(p) for p in tree]
    return with_gate(StaticTreePolicy(paths, str(node["draft_sampling"]), name="static"), node)


TREE_GRAPHS = ("verify", "levels", "step")  # captured verify buckets, graphed drafting levels, the tree verify step
SCHEMAS = "adtbench.harness.schema"
register_method(Method("chain", build_chain, f"{SCHEMAS}:ChainConf", ("exact",), TREE_GRAPHS))
register_method(
    Method(
        "static",
        build_static,
        f"{SCHEMAS}:StaticConf",
        ("exact",),
        TREE_GRAPHS,
        law_keys={"tree": [[0], [1], [0, 0], [0, 1]], "draft_sampling": "sample"},  # child ranks < the law's 3 codes
    )
)
