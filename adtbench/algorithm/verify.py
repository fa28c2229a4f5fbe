"""Tree verification: which drafted path the target accepts, and the bonus token.

Inputs are the target's *processed* logits at every tree node (``sampling.process_logits``), so the
verifier matches exactly the distribution the AR baseline samples from.

Greedy (temperature 0)
    A child x of node u is acceptable iff the rule accepts it at u (exact rule: x = argmax p_u).
    The accepted path is the deepest node whose whole root path is acceptable (first in node order on
    ties); the bonus token is argmax p at that node. Output equals AR greedy token for token.

Sampling, point-mass proposals (top-k / dynamic trees)
    Walk down from the root. At node u with target distribution p, try u's children in order, skipping
    tokens already tried (sibling dedup). Accept x with probability p(x) (q(x) = 1: the draft was a
    deterministic function of the context); on rejection p ← normalise(p with x zeroed). If a child is
    accepted, recurse into it with a fresh p; otherwise the bonus is drawn from the residual p.
    Lossless: P(out = x_j) = Π_{l<j}(1 − p_l(x_l)) · p_j(x_j) = p(x_j), and every y outside the tried set
    gets p(y) (algorithms.md §2.6).

Sampling, proposals drawn without replacement (sampled trees, true q)
    Children x_1..x_m of u were drawn in that order from the drafter's q without replacement, so x_j
    has proposal q_j = q with x_1..x_{j−1} removed, renormalised. Accept x_j with
    min(1, p_j(x_j)/q_j(x_j)); on rejection p_{j+1} = normalise(max(p_j − q_j, 0)) (recursive rejection
    sampling; SpecTr / RSD). Each step is a speculative-sampling step with target p_j, so the output
    follows p.

Relaxations (LANTERN) change only the ``AcceptanceRule``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from adtbench.algorithm.sampling import sample, sample_np
from adtbench.algorithm.tree import DraftTree


@dataclass(frozen=True)
class Acceptance:
    path: list[int]  # accepted node ids, root first
    bonus: int  # token chosen by the target after the last accepted node

    @property
    def accepted(self) -> int:
        """a: accepted draft tokens, bonus excluded."""
        return len(self.path) - 1


@dataclass(frozen=True)
class HostProposal:
    """A rule's proposal step in the form the verifier's float64 host loop (:func:`_proposal_children`) runs:
    accept x with min(1, (p(x) + extra(p, x)) / q(x)), on rejection p ← normalise(max(p − q, 0)). ``extra`` is None
    for the exact rule (nothing added)."""

    extra: Callable[[np.ndarray, int], float] | None = None


class AcceptanceRule:
    """Exact (lossless) acceptance. Subclasses relax it (LANTERN) by overriding the three hooks, and declare
    with :meth:`host_proposal` whether their proposal step may run on the host fast path."""

    name = "exact"
    lossless = True

    def greedy_accept(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Bool ``[m]``: does node row ``logits[i]`` (processed, ``[m, V]``) accept draft ``tokens[i]``?"""
        return logits.argmax(-1) == tokens

    def point_mass(self, p: torch.Tensor, x: int) -> tuple[float, torch.Tensor]:
        """Acceptance probability of a point-mass draft x under target p, and the unnormalised residual."""
        residual = p.clone()
        residual[x] = 0.0
        return float(p[x]), residual

    def with_proposal(self, p: torch.Tensor, x: int, q: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Acceptance probability of x drawn from q, and the unnormalised residual ``max(p − q, 0)``."""
        qx = float(q[x])
        accept = 1.0 if qx <= 0.0 else min(1.0, float(p[x]) / qx)
        return accept, (p - q).clamp_min(0.0)

    def host_proposal(self) -> HostProposal | None:
        """``with_proposal`` as a :class:`HostProposal`, or None when it is not of that form (then the verifier
        calls ``with_proposal`` itself). A subclass that overrides ``with_proposal`` gets None unless it overrides
        this too."""
        return HostProposal() if type(self).with_proposal is AcceptanceRule.with_proposal else None


EXACT = AcceptanceRule()


def _uniforms(n: int, generator: torch.Generator | None) -> list[float]:
    """n U(0, 1) draws in one call (a tree of n nodes tries at most n − 1 children)."""
    device = generator.device if generator is not None else "cpu"
    return torch.rand(n, generator=generator, device=device).tolist()


def _normalise(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = residual.sum()
    # A zero residual only happens when the rejected proposal had probability 1 (a measure-zero event).
    return residual / total if total > 0 else fallback


def verify_greedy(tree: DraftTree, logits: torch.Tensor, rule: AcceptanceRule = EXACT) -> Acceptance:
    """Deepest fully acceptable path under ``rule``; bonus = argmax of the unmodified logits there."""
    n = tree.size
    ok = torch.ones(n, dtype=torch.bool)
    if n > 1:
        parents = torch.tensor(tree.parents[1:], dtype=torch.long, device=logits.device)
        ok[1:] = rule.greedy_accept(logits[parents], tree.tokens[1:].to(logits.device)).cpu()
    ok_list = ok.tolist()
    depth = tree.depth.tolist()
    best, best_depth = 0, 0
    path_ok = [True] * n
    for j in range(1, n):
        path_ok[j] = ok_list[j] and path_ok[tree.parents[j]]
        if path_ok[j] and depth[j] > best_depth:
            best, best_depth = j, depth[j]
    return Acceptance(path=tree.path_to(best), bonus=int(logits[best].argmax()))


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    generator: torch.Generator | None,
    rule: AcceptanceRule = EXACT,
) -> Acceptance:
    """Multi-candidate recursive rejection (point-mass or without-replacement proposals)."""
    probs = logits.softmax(-1)
    tokens = tree.tokens.tolist()
    draws = iter(_uniforms(tree.size, generator))
    proposal = tree.proposal
    host = rule.host_proposal() if proposal is not None else None
    u, path = 0, [0]
    while True:
        p = probs[u]
        accepted = None
        kids = tree.children[u]
        if proposal is not None and host is not None and u in proposal and kids:
            accepted, pn = _proposal_children(probs[u], proposal[u], kids, tokens, draws, host.extra)
            if accepted is None:
                return Acceptance(path=path, bonus=sample_np(pn, generator))
        elif proposal is not None and u in proposal and kids:
            q = proposal[u].to(p)
            for c in kids:
                x = tokens[c]
                acc, residual = rule.with_proposal(p, x, q)
                if next(draws) < acc:
                    accepted = c
                    break
                p = _normalise(residual, p)
                q = q.clone()
                q[x] = 0.0
                q = _normalise(q, q)
        elif kids and _exact_point_mass(rule):
            accepted, pn = _point_mass_children(probs[u], kids, tokens, draws)
            if accepted is None:
                return Acceptance(path=path, bonus=sample_np(pn, generator))
        else:
            for c, x in _distinct_children(kids, tokens):
                acc, residual = rule.point_mass(p, x)
                if next(draws) < acc:
                    accepted = c
                    break
                p = _normalise(residual, p)
        if accepted is None:
            return Acceptance(path=path, bonus=sample(p, generator))
        path.append(accepted)
        u = accepted


def _distinct_children(kids: list[int], tokens: list[int]) -> Iterator[tuple[int, int]]:
    """``(child, token)`` in sibling order, skipping a child whose token an earlier sibling already proposed
    (a rejected token has probability 0 in the residual: trying it again would only waste a draw)."""
    seen: set[int] = set()
    for c in kids:
        if tokens[c] not in seen:
            seen.add(tokens[c])
            yield c, tokens[c]


def _exact_point_mass(rule: AcceptanceRule) -> bool:
    """Is ``rule``'s point-mass step the exact one (so :func:`_point_mass_children` may stand in for it)?"""
    return type(rule).point_mass is AcceptanceRule.point_mass


def _proposal_children(
    p_row: torch.Tensor,
    q_row: torch.Tensor,
    kids: list[int],
    tokens: list[int],
    draws: Iterator[float],
    extra: Callable[[np.ndarray, int], float] | None = None,
) -> tuple[int | None, np.ndarray]:
    """Recursive rejection over one node's children drawn from q without replacement, on float64 host copies.

    The generic loop's law: try the children in draw order; accept x with min(1, p̃(x)/q(x)), where p̃(x) = p(x)
    (exact) or p(x) + ``extra(p, x)`` (a relaxation's moved mass, e.g. LANTERN's C_{m*}(x) under the current p);
    on rejection p ← normalise(max(p − q, 0)) and q ← q with q(x) = 0, renormalised. Returns the accepted child
    (or None) and the final p (the residual the bonus token is drawn from).
    """
    p = p_row.detach().to("cpu", torch.float64).numpy()
    q = q_row.detach().to("cpu", torch.float64).numpy()
    for c in kids:
        x = tokens[c]
        qx = q[x]
        px = p[x] if extra is None else p[x] + extra(p, x)
        if next(draws) < (1.0 if qx <= 0.0 else min(1.0, px / qx)):
            return c, p
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        if total > 0:  # zero only when the rejected proposal had probability 1 (a measure-zero event)
            p = residual / total
        q = q.copy()
        q[x] = 0.0
        qt = q.sum()
        if qt > 0:
            q = q / qt
    return None, p


def _point_mass_children(
    p_row: torch.Tensor, kids: list[int], tokens: list[int], draws: Iterator[float]
) -> tuple[int | None, np.ndarray]:
    """Exact recursive rejection over one node's point-mass children, on a float64 host copy of ``p``.

    The same law as the generic loop (try distinct child tokens in order; accept x with probability p(x); on
    rejection p ← p with p(x) = 0, renormalised), without a dozen small tensor ops per child. Returns the
    accepted child (or None) and the final distribution (the residual the bonus token is drawn from).
    """
    p = p_row.detach().to("cpu", torch.float64).numpy()
    for c, x in _distinct_children(kids, tokens):
        if next(draws) < p[x]:
            return c, p
        residual = p.copy()
        residual[x] = 0.0
        total = residual.sum()
        if total > 0:  # zero only when p(x) was 1 and x was still rejected: a measure-zero event
            p = residual / total
    return None, p


def verify_tree(
    tree: DraftTree,
    logits: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None = None,
    rule: AcceptanceRule = EXACT,
) -> Acceptance:
    """Verify ``tree`` against processed target logits ``[n, V]`` (one row per node)."""
    if greedy:
        return verify_greedy(tree, logits, rule)
    return verify_sampling(tree, logits, generator, rule)
