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

from collections.abc import Sequence
from typing import Any

import torch

from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.policies.base import (
    POLICIES,
    TreePolicy,
    sample_without_replacement,
    stable_topk,
    with_gate,
)
from adtbench.algorithm.tree import DraftTree

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


class StaticTreePolicy(TreePolicy):
    name = "static"

    def __init__(self, paths: Sequence[Sequence[int]], draft_sampling: str = "topk", name: str = "static") -> None:
        self.paths = validate_paths(paths)
        if draft_sampling not in ("topk", "sample"):
            from adtbench.errors import ConfigError

            raise ConfigError("policy.draft_sampling", f"must be 'topk' or 'sample', got {draft_sampling!r}")
        self.draft_sampling = draft_sampling
        self.name = name
        self.width = max(p[-1] for p in self.paths) + 1
        self._plan = self._build_plan()
        self._inner = {p[:-1] for p in self.paths if len(p) > 1}  # paths with children

    def max_nodes(self) -> int:
        return len(self.paths) + 1

    def _build_plan(self) -> list[list[tuple[tuple[int, ...], list[tuple[int, ...]], int]]]:
        """Per level: ``(parent path, its child paths in path order, 1 + their largest rank)``, parents in the order
        of their first child path; computed once (the paths never change)."""
        plan: list[list[tuple[tuple[int, ...], list[tuple[int, ...]], int]]] = []
        for level in range(1, max(map(len, self.paths)) + 1):
            groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
            for p in self.paths:
                if len(p) == level:
                    groups.setdefault(p[:-1], []).append(p)
            plan.append([(pre, kids, max(k[-1] for k in kids) + 1) for pre, kids in groups.items()])
        return plan

    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        sample = self.draft_sampling == "sample" and not session.greedy
        tokens, parents = [session.root_token], [-1]
        node_of: dict[tuple[int, ...], int] = {(): 0}
        sess_of: dict[tuple[int, ...], int] = {(): 0}
        logprobs: dict[tuple[int, ...], torch.Tensor] = {(): session.root_logprobs()}
        proposal: dict[int, torch.Tensor] = {}
        depth = 0
        for level, groups in enumerate(self._plan[:max_depth], start=1):
            new: list[tuple[int, ...]] = []
            for prefix, kids, width in groups:
                lp = logprobs.get(prefix)
                if lp is None:  # the parent was not drafted (a −inf rank) or not expanded
                    continue
                if sample:
                    drawn, probs = sample_without_replacement(lp, len(kids), session.generator)
                    chosen = list(zip(kids, drawn.tolist()))
                    proposal[node_of[prefix]] = probs
                else:
                    top = stable_topk(lp, width)
                    finite = torch.isfinite(lp[top]).tolist()
                    top_l = top.tolist()
                    chosen = [(p, top_l[p[-1]]) for p in kids if finite[p[-1]]]
                for p, tok in chosen:
                    node_of[p] = len(tokens)
                    tokens.append(tok)
                    parents.append(node_of[prefix])
                    new.append(p)
            if not new:
                break
            depth = level
            grow = [p for p in new if p in self._inner] if level < max_depth else []
            if grow:
                ids, lps = session.expand([sess_of[p[:-1]] for p in grow], [tokens[node_of[p]] for p in grow])
                for p, sid, lp in zip(grow, ids, lps):
                    sess_of[p], logprobs[p] = sid, lp
        return DraftTree(
            tokens=torch.tensor(tokens, dtype=torch.long),
            parents=parents,
            drafted_depth=depth,
            width=self.width,
            proposal=proposal if sample else None,
        )


class ChainPolicy(StaticTreePolicy):
    """A single path of ``depth`` drafts (top-1, or sampled from q at temperature > 0 with ``sample``)."""

    def __init__(self, depth: int = 5, draft_sampling: str = "topk") -> None:
        if depth < 1:
            from adtbench.errors import ConfigError

            raise ConfigError("policy.depth", f"must be ≥ 1, got {depth}")
        super().__init__(chain_paths(depth), draft_sampling, name="chain")


@POLICIES.register("chain")
def build_chain(node: Any) -> ChainPolicy:
    """``policy=chain``: ``depth``, ``draft_sampling``, ``gate_tokens``, ``gate_explore``."""
    return with_gate(ChainPolicy(int(node["depth"]), str(node["draft_sampling"])), node)


@POLICIES.register("static")
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
