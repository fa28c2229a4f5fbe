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

Two implementations of these laws. ``accept`` decides on the tree's device with no host read (the decode loop's;
the host learns the outcome in the cycle's one read): greedy and exact point mass in closed form — with one uniform
U per node, child c of u (siblings in order, duplicates skipped) is accepted iff Σ_{c' before c} p_u(x_c') ≤ U <
Σ_{c' up to c} p_u(x_c'): each rejection renormalises p by 1 − p(x_j), which the next acceptance divides back out,
so the i-th child is accepted with probability p(x_i), the sequential walk's law — and every other rule (proposals,
LANTERN) by a loop over child ranks, vectorised over nodes. ``verify_tree`` walks the tree on float64 host copies:
the reference the device path is tested equal to in law.

What a verified tree becomes, one type per stage: ``Verdict`` (the device path's acceptance, not yet read: path mask,
last node, bonus and the row it came from) → ``CycleRead`` (the host's one read, either path: the ``Acceptance`` —
path, bonus, realised depth, live nodes; what the reference walk returns and a policy observes — with the committed
tokens and the path's device handles for the KV commit and the drafter) → ``records.CycleRecord`` (what the run
keeps of the cycle, built by ``slot.DecodeState.advance``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from adtbench import accel
from adtbench.algorithm.records import Acceptance
from adtbench.algorithm.sampling import sample, sample_np, sample_rows, sample_rows_cdf, uniforms
from adtbench.algorithm.tree import DraftTree, arange_on, true_flag


@dataclass(frozen=True)
class HostProposal:
    """A rule's proposal step in the form the verifier's float64 host loop (:func:`_proposal_children`) runs:
    accept x with min(1, (p(x) + extra(p, x)) / q(x)), on rejection p ← normalise(max(p − q, 0)). ``extra`` is None
    for the exact rule (nothing added)."""

    extra: Callable[[np.ndarray, int], float] | None = None


class AcceptanceRule:
    """Exact (lossless) acceptance. Subclasses relax it (LANTERN) by overriding the hooks, and declare with
    :meth:`host_proposal` whether their proposal step may run on the host fast path.

    The row hooks (``greedy_accept``, ``point_mass_rows``, ``proposal_rows``) are the rule, vectorised over rows on
    any device; the scalar hooks (``point_mass``, ``with_proposal``) are the same rule on one row for the host
    reference loop."""

    name = "exact"
    lossless = True

    def greedy_accept(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Bool ``[m]``: does node row ``logits[i]`` (processed, ``[m, V]``) accept draft ``tokens[i]``?"""
        return logits.argmax(-1) == tokens

    def point_mass_rows(self, p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row of probabilities ``p [m, V]`` and point-mass draft ``x [m]``: the acceptance probability ``[m]`` and
        the unnormalised residual ``[m, V]`` (here p(x), and p with x zeroed)."""
        px = p.gather(1, x[:, None])
        return px[:, 0], p.scatter(1, x[:, None], 0.0)

    def proposal_rows(
        self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor, px: torch.Tensor, qx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: draft ``x`` drawn from ``q``; ``px``, ``qx`` its probabilities. The acceptance probability
        ``min(1, p(x)/q(x))`` (1 where q(x) = 0) and the unnormalised residual ``max(p − q, 0)``."""
        return (px / qx).clamp_max(1.0).nan_to_num(1.0), (p - q).clamp_min(0.0)  # q(x) = 0: 1 (inf or nan → 1)

    def point_mass(self, p: torch.Tensor, x: int) -> tuple[float, torch.Tensor]:
        """Acceptance probability of a point-mass draft x under target p, and the unnormalised residual."""
        accept, residual = self.point_mass_rows(p[None], torch.tensor([x], device=p.device))
        return float(accept[0]), residual[0]

    def with_proposal(self, p: torch.Tensor, x: int, q: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Acceptance probability of x drawn from q, and the unnormalised residual ``max(p − q, 0)``."""
        xs = torch.tensor([x], device=p.device)
        accept, residual = self.proposal_rows(p[None], xs, q[None], p[x].view(1), q[x].view(1))
        return float(accept[0]), residual[0]

    def host_proposal(self) -> HostProposal | None:
        """``with_proposal`` as a :class:`HostProposal`, or None when it is not of that form (then the verifier
        calls ``with_proposal`` itself). A subclass that overrides ``with_proposal`` gets None unless it overrides
        this too."""
        generic = type(self).with_proposal is AcceptanceRule.with_proposal
        return HostProposal() if generic and type(self).proposal_rows is AcceptanceRule.proposal_rows else None


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
        parents = tree.parents[1:].to(logits.device)
        ok[1:] = rule.greedy_accept(logits[parents], tree.tokens[1:].to(logits.device)).cpu()
    if tree.alive is not None:
        ok &= tree.alive.cpu()
    ok_list = ok.tolist()
    depth = tree.depth.tolist()
    best, best_depth = 0, 0
    path_ok = [True] * n
    for j in range(1, n):
        path_ok[j] = ok_list[j] and path_ok[tree.parent_list[j]]
        if path_ok[j] and depth[j] > best_depth:
            best, best_depth = j, depth[j]
    return _result(tree, tree.path_to(best), int(logits[best].argmax()))


def _result(tree: DraftTree, path: list[int], bonus: int) -> Acceptance:
    return Acceptance(path, bonus, tree.max_depth, tree.live_nodes)


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    generator: torch.Generator | None,
    rule: AcceptanceRule = EXACT,
) -> Acceptance:
    """Multi-candidate recursive rejection (point-mass or without-replacement proposals)."""
    probs = logits.softmax(-1)
    proposal = tree.proposal
    host = rule.host_proposal() if proposal is not None else None
    if proposal is not None and tree.max_children <= 1 and tree.alive is None and tree.size > 1:
        exact = host is not None and host.extra is None
        return _chain_proposal(tree, probs, proposal, generator, None if exact else rule)
    tokens, alive = tree.token_list, tree.alive_list
    draws = iter(_uniforms(tree.size, generator))
    host_p: np.ndarray | None = None  # float64 host copy of every row, made once at the first host step
    u, path = 0, [0]
    while True:
        p = probs[u]
        accepted = None
        kids = [c for c in tree.children[u] if alive[c]]
        if kids and (host is not None or (proposal is None and _exact_point_mass(rule))) and host_p is None:
            host_p = probs.detach().to("cpu", torch.float64).numpy()
        if proposal is not None and host is not None and kids:
            assert host_p is not None
            accepted, pn = _proposal_children(host_p[u], proposal[u], kids, tokens, draws, host.extra)
            if accepted is None:
                return _result(tree, path, sample_np(pn, generator))
        elif proposal is not None and kids:
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
            assert host_p is not None
            accepted, pn = _point_mass_children(host_p[u], kids, tokens, draws)
            if accepted is None:
                return _result(tree, path, sample_np(pn, generator))
        else:
            for c, x in _distinct_children(kids, tokens):
                acc, residual = rule.point_mass(p, x)
                if next(draws) < acc:
                    accepted = c
                    break
                p = _normalise(residual, p)
        if accepted is None:
            return _result(tree, path, sample(p, generator))
        path.append(accepted)
        u = accepted


def _chain_proposal(
    tree: DraftTree,
    probs: torch.Tensor,
    proposal: torch.Tensor,
    generator: torch.Generator | None,
    rule: AcceptanceRule | None = None,
) -> Acceptance:
    """The proposal walk of :func:`verify_sampling` on a chain (every node at most one child: the Jacobi loops'
    windows, sampled chains), all nodes at once: node i's child x is accepted with its acceptance probability a_i iff
    node i's uniform is below it, the path ends at the first rejection k, and the bonus is drawn from node k's
    normalised residual (p_k if that vanished), or from p_m after the whole chain. ``rule`` None: the exact rule on
    float64 host copies, a_i = min(1, p_i(x)/q_i(x)) (1 where q_i(x) = 0), residual max(p_k − q_k, 0) — the same n
    uniforms in the same order and the same bonus draw as the node-by-node walk, so the same decisions seed for seed;
    otherwise ``rule.proposal_rows`` over every node in one call (a relaxed rule such as GSD's or LANTERN's: the same
    law as its node walk, one vectorised call instead of one per node)."""
    n = tree.size
    u = np.asarray(_uniforms(n, generator)[: n - 1])
    if rule is None:
        p = probs.detach().to("cpu", torch.float64).numpy()
        q = proposal.detach().to("cpu", torch.float64).numpy()
        x = tree.tokens.tolist()[1:]
        rows = np.arange(n - 1)
        px, qx = p[rows, x], q[rows, x]
        with np.errstate(divide="ignore", invalid="ignore"):
            acc = np.where(qx <= 0.0, 1.0, np.minimum(1.0, px / qx))
        residual_of = lambda k: np.maximum(p[k] - q[k], 0.0)  # noqa: E731
    else:
        xs = tree.tokens[1:].to(probs.device)
        pm, qm = probs[:-1], proposal[:-1].to(probs)
        acc_t, res_t = rule.proposal_rows(pm, xs, qm, pm.gather(1, xs[:, None])[:, 0], qm.gather(1, xs[:, None])[:, 0])
        acc = np.asarray(acc_t.tolist())
        p = probs.detach().to("cpu", torch.float64).numpy()
        residual_of = lambda k: res_t[k].detach().to("cpu", torch.float64).numpy()  # noqa: E731
    rejected = np.flatnonzero(u >= acc)
    k = int(rejected[0]) if rejected.size else n - 1
    path = list(range(k + 1))
    if k == n - 1:
        return _result(tree, path, sample_np(p[k], generator))
    residual = residual_of(k)
    total = residual.sum()  # zero only when the rejected proposal had probability 1 (a measure-zero event)
    return _result(tree, path, sample_np(residual / total if total > 0 else p[k], generator))


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
    cls = type(rule)
    return cls.point_mass is AcceptanceRule.point_mass and cls.point_mass_rows is AcceptanceRule.point_mass_rows


def _host_row(row: np.ndarray | torch.Tensor) -> np.ndarray:
    """A probability row as a float64 host array (a host array is taken as it is)."""
    return row if isinstance(row, np.ndarray) else row.detach().to("cpu", torch.float64).numpy()


def _proposal_children(
    p_row: np.ndarray | torch.Tensor,
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
    (or None) and the final p (the residual the bonus token is drawn from). ``p_row``: read, never written (the
    float64 host row of ``verify_sampling``'s one copy).
    """
    p, q = _host_row(p_row), _host_row(q_row)
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
    p_row: np.ndarray | torch.Tensor, kids: list[int], tokens: list[int], draws: Iterator[float]
) -> tuple[int | None, np.ndarray]:
    """Exact recursive rejection over one node's point-mass children, on a float64 host copy of ``p_row`` (read,
    never written: ``verify_sampling``'s one copy of every row).

    The same law as the generic loop (try distinct child tokens in order; accept x with probability p(x); on
    rejection p ← p with p(x) = 0, renormalised), without a dozen small tensor ops per child. Returns the
    accepted child (or None) and the final distribution (the residual the bonus token is drawn from).
    """
    p = _host_row(p_row)
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


# --------------------------------------------------------------------------------------------------------
# On the device: the same laws, no host read (module docstring)
# --------------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """One tree's acceptance on its device, before the host reads it: ``on_path [n]`` (the accepted nodes, root
    included), ``last []`` (the deepest accepted node), ``bonus []`` (the token chosen after it) and ``bonus_logits
    [V]`` (the processed row it was chosen from, whatever the rule zeroed afterwards: the next root's distribution)."""

    on_path: torch.Tensor
    last: torch.Tensor
    bonus: torch.Tensor
    bonus_logits: torch.Tensor


@dataclass
class CycleRead:
    """The host's one read of a verified tree (``read_verdict``)."""

    acceptance: Acceptance
    root: int  # the root's token
    tokens: list[int]  # the committed tokens after the root: accepted drafts, then the bonus
    keep: torch.Tensor  # [a+1] the path's node ids on the device, root first
    next_tokens: torch.Tensor  # [a+1] the committed tokens after the root on the device (drafts, then the bonus)
    extra: list[float]  # the caller's extra scalars, in order
    slots: object = None  # a graphed verify's committed slots on the device (``drafters.catch_up.CommittedSlots``)


def read_verdict(tree: DraftTree, verdict: Verdict, extra: Sequence[torch.Tensor] = ()) -> CycleRead:
    """Pack what the host must learn of a verified tree into one small tensor and read it (one device sync): the
    path — its node ids and tokens: the accepted nodes in node order (parents precede children), so at most
    ``drafted_depth + 1`` — the bonus, the realised depth and live nodes, and the caller's ``extra`` scalars (e.g. the
    draft gate's entropy)."""
    return read_verdicts([(tree, verdict, extra)])[0]


VERDICT_HEAD = 4  # a packed verdict's head: accepted + 1, bonus, realised depth, live nodes (then the extra scalars)


def pack_verdict(
    tree: DraftTree, verdict: Verdict, extra: Sequence[torch.Tensor] = (), width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the host must learn of a verified tree, as one float64 tensor ``[VERDICT_HEAD + len(extra) + 2·width]``:
    the head (accepted + 1, bonus, realised depth, live nodes, ``extra``), then ``width`` node ids — the accepted path
    first, in node order (parents precede children), then the rest — then their tokens. ``width``: how many ids;
    default ``min(n, drafted_depth + 1)`` (no path is longer), a fixed size in a captured graph. Returns (packed, ids
    ``[width]``, their tokens ``[width]``): no host read. :func:`unpack_verdict` reads it back."""
    order = torch.sort((~verdict.on_path).to(torch.uint8), stable=True).indices  # the path first, in node order
    ids = order[: min(tree.size, tree.drafted_depth + 1) if width is None else width]
    depth = tree.depth if tree.alive is None else tree.depth * tree.alive
    nodes = tree.alive.sum() if tree.alive is not None else torch.full_like(verdict.last, tree.size)
    head = [verdict.on_path.sum(), verdict.bonus, depth.max(), nodes, *extra]
    tokens = tree.tokens.index_select(0, ids)
    head_t = torch.stack([x.to(torch.float64) for x in head])
    packed = torch.cat([head_t, ids.to(torch.float64), tokens.to(torch.float64)])
    return packed, ids, tokens


def unpack_verdict(values: Sequence[float], width: int, extra: int) -> tuple[Acceptance, int, list[int], list[float]]:
    """The host side of :func:`pack_verdict` (``values``: the packed tensor read as floats; ``extra``: how many extra
    scalars): the ``Acceptance``, the root's token, the committed tokens after the root (the path's drafts, then the
    bonus) and the extra scalars."""
    h = VERDICT_HEAD + extra
    k, bonus = int(values[0]), int(values[1])
    acc = Acceptance([int(x) for x in values[h : h + k]], bonus, int(values[2]), int(values[3]))
    tokens = [int(x) for x in values[h + width + 1 : h + width + k]] + [bonus]
    return acc, int(values[h + width]), tokens, list(values[VERDICT_HEAD:h])


def read_verdicts(verified: Sequence[tuple[DraftTree, Verdict, Sequence[torch.Tensor]]]) -> list[CycleRead]:
    """``read_verdict`` of many trees (a batch's slots, ``algorithm.batch``) in one read: their packed tensors
    (``pack_verdict``) are concatenated, each followed by its tree's ``readout`` (handed to its ``on_read``), read
    once, and split."""
    packs = [pack_verdict(tree, verdict, extra) for tree, verdict, extra in verified]
    parts = []
    for (tree, _, _), (packed, _, _) in zip(verified, packs, strict=True):
        parts += [packed] if tree.readout is None else [packed, tree.readout.to(torch.float64)]
    values = torch.cat(parts).tolist()
    out, at = [], 0
    for (tree, verdict, extra), (packed, ids, path_tokens) in zip(verified, packs, strict=True):
        acc, root, tokens, scalars = unpack_verdict(values[at : at + packed.numel()], ids.numel(), len(extra))
        at += packed.numel()
        if tree.readout is not None:
            told = values[at : at + tree.readout.numel()]
            at += len(told)
            if tree.on_read is not None:
                tree.on_read(told)
        k = acc.accepted + 1
        following = torch.cat([path_tokens[1:k], verdict.bonus.view(1)])  # the packed ids' tokens: no second gather
        out.append(CycleRead(acc, root, tokens, ids[:k], following, scalars))
    return out


ACCEPTANCE = ("auto", "device", "host")


def verify_cycle(
    tree: DraftTree,
    processed: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None,
    rule: AcceptanceRule = EXACT,
    extra: Callable[[torch.Tensor], list[torch.Tensor]] | None = None,
    where: str = "auto",
) -> CycleRead:
    """Verify ``tree`` against processed logits ``[n, V]`` and read what the host must learn (``CycleRead``);
    ``extra(row)``: further scalars of the bonus's processed row to read with it (the draft gate's entropy).

    ``where``: ``device`` — ``accept`` on the logits' device, then one packed read (``read_verdict``); ``host`` —
    the float64 walk of ``verify_tree`` on host copies; ``auto`` — host when the logits are on the CPU (there the host
    is the device: numpy's per-call cost is a fraction of a torch op's, and a read costs nothing), device elsewhere.
    The same law either way (tested); the draws differ, so a seed gives other tokens on the two paths."""
    if where == "device" or (where == "auto" and accel.is_cuda(processed.device)):
        verdict = accept(tree, processed, greedy, generator, rule)
        if extra is None and tree.is_chain and tree.readout is None:
            return read_chain(tree, verdict)
        return read_verdict(tree, verdict, extra(verdict.bonus_logits) if extra is not None else [])
    acc = verify_tree(tree, processed, greedy, generator, rule)
    if tree.readout is not None and tree.on_read is not None:
        tree.on_read(tree.readout.tolist())
    tokens = tree.token_list
    committed = [tokens[i] for i in acc.path[1:]] + [acc.bonus]
    values = [float(x) for x in extra(processed[acc.path[-1]])] if extra is not None else []
    k = len(acc.path)
    both = torch.tensor(acc.path + committed, device=tree.tokens.device)  # one tensor: the path's ids, its tokens
    return CycleRead(acc, tokens[0], committed, both[:k], both[k:], values)


@dataclass(frozen=True)
class Draws:
    """Where the device acceptance's randomness comes from: drawn from ``generator`` as it is needed (the eager cycle),
    or read from ``buffer`` — ``[n + 1]`` uniforms filled outside a captured graph (``tree_step``): one per node, then
    the bonus's, drawn by inverse CDF (``sample_rows_cdf``: the categorical law, as the exponential race is). The same
    decisions from the same uniforms either way; only the bonus's mechanism differs."""

    generator: torch.Generator | None = None
    buffer: torch.Tensor | None = None

    def node_uniforms(self, n: int, device: torch.device) -> torch.Tensor:
        """One U[0, 1) per node ``[n]`` (float64)."""
        return uniforms((n,), self.generator, device) if self.buffer is None else self.buffer[:n]

    def bonus(self, row: torch.Tensor) -> torch.Tensor:
        """One token ``[]`` from the unnormalised probability row ``[V]``."""
        if self.buffer is None:
            return sample_rows(row, self.generator)
        return sample_rows_cdf(row.view(1, -1), None, self.buffer[-1:])[0]


def accept(
    tree: DraftTree,
    processed: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None = None,
    rule: AcceptanceRule = EXACT,
) -> Verdict:
    """Verify ``tree`` against processed target logits ``[n, V]`` on their device (module docstring)."""
    if tree.size == 1:
        bonus = processed[0].argmax() if greedy else sample_rows(processed[0].softmax(-1), generator)
        return Verdict(true_flag(processed.device), processed.new_zeros((), dtype=torch.long), bonus, processed[0])
    if tree.is_chain and (greedy or tree.proposal is not None):
        return accept_chain(tree, processed, greedy, generator, rule)
    return accept_tree(tree, processed, greedy, Draws(generator), rule)


def accept_tree(
    tree: DraftTree, processed: torch.Tensor, greedy: bool, draws: Draws, rule: AcceptanceRule = EXACT
) -> Verdict:
    """``accept``'s general paths, for any tree of at least two nodes, chains included (``accept`` takes a shortcut
    for those): greedy, the exact point-mass closed form, or the rank loop. Fixed shapes given the tree's shapes and
    its ``max_children``, no host read: what the graphed verify (``tree_step``) captures, its draws from a buffer."""
    if greedy:
        ok = rule.greedy_accept(processed.index_select(0, tree.parents[1:]), tree.tokens[1:])
        return _finish(tree, processed, ok, None, draws)
    p = processed.softmax(-1)
    if takes_rank_loop(tree, greedy, rule):
        return _by_rank(tree, processed, p, draws, rule)
    return _closed_form(tree, processed, p, draws)


def takes_rank_loop(tree: DraftTree, greedy: bool, rule: AcceptanceRule) -> bool:
    """Does :func:`accept_tree` verify ``tree`` by the rank loop (sampling with a proposal, or a relaxed point-mass
    rule), whose length is ``tree.max_children`` and which reads ``tree.child_ranks``? Else greedy or the closed
    form."""
    return not greedy and (tree.proposal is not None or not _exact_point_mass(rule))


def accept_chain(
    tree: DraftTree,
    processed: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None = None,
    rule: AcceptanceRule = EXACT,
) -> Verdict:
    """``accept`` of a chain (``is_chain``) greedy or with proposals, in a fixed handful of ops (``chain_verdict``,
    drawing its n uniforms and the bonus's exponential race from ``generator``). The same decisions from the same
    draws as the general paths (tested token for token): greedy, ok_i = the rule's argmax test of row i; with
    proposals (``_by_rank`` at its one rank), one uniform per node, ok_i = U_i < acc_i (``rule.proposal_rows``)."""
    n = tree.size
    u = None if greedy else uniforms((n,), generator, processed.device)[:-1]
    return chain_verdict(
        tree.tokens[1:], processed, tree.proposal, greedy, rule, u, n - 1, lambda p: sample_rows(p, generator)
    )


def chain_verdict(
    x: torch.Tensor,
    processed: torch.Tensor,
    proposal: torch.Tensor | None,
    greedy: bool,
    rule: AcceptanceRule,
    u: torch.Tensor | None,
    live: int | torch.Tensor,
    draw: Callable[[torch.Tensor], torch.Tensor],
) -> Verdict:
    """The chain's acceptance law, one place for the eager loop (``accept_chain``) and the fixed-shape Jacobi step
    (``jacobi.step``): drafts ``x [n − 1]`` (node i's child is i + 1) against processed rows ``[n, V]``, proposal
    rows ``[n, V]`` (row i: draft x_i's q; None when greedy), uniforms ``u [n − 1]`` (None when greedy), the first
    ``live`` drafts testable (an int, or a device ``[1]`` tensor: the fixed-shape step's room clamp; drafts past it are
    never accepted) and ``draw`` (one token from an unnormalised probability row ``[1, V]`` or ``[V]``).

    ok_i = (greedy: the rule's argmax test of row i; else U_i < acc_i, ``rule.proposal_rows``) and i < live; the
    accepted length a = Σ_i Π_{j≤i} ok_j and the bonus comes from row a: its argmax (greedy), a draw from row a's
    normalised residual when a < live (a rejection there), else from p_a (every live draft accepted)."""
    n = processed.shape[0]
    if greedy:
        ok = rule.greedy_accept(processed[:-1], x)
    else:
        assert proposal is not None and u is not None
        p = processed.softmax(-1)
        q = proposal[:-1].to(p.dtype)
        head = p[:-1]
        acc, residual = rule.proposal_rows(head, x, q, head.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0])
        ok = u.to(p.dtype) < acc
    if isinstance(live, torch.Tensor):
        ok = ok & (arange_on(n - 1, processed.device) < live)
    a = ok.to(torch.long).cumprod(0).sum().view(1)  # [1]: a 0-d index would be read to the host
    row = processed.index_select(0, a)[0]
    if greedy:
        bonus = row.argmax()
    else:
        p_a = p.index_select(0, a)
        after_rejection = _normalise_rows(residual.index_select(0, a.clamp_max(n - 2)), p_a)  # row a's, a < live
        bonus = draw(torch.where(a < live, after_rejection, p_a)[0])
    return Verdict(arange_on(n, processed.device) <= a, a[0], bonus, row)


def read_chain(tree: DraftTree, verdict: Verdict) -> CycleRead:
    """``read_verdict`` of a chain's verdict: one read of (a, bonus, the chain's tokens); the path is 0 … a."""
    values = torch.cat([verdict.last.view(1), verdict.bonus.view(1), tree.tokens]).tolist()
    n, a, bonus, tokens = tree.size, int(values[0]), int(values[1]), values[2:]
    acc = Acceptance(list(range(a + 1)), bonus, n - 1, n)
    following = torch.cat([tree.tokens[1 : a + 1], verdict.bonus.view(1)])
    return CycleRead(
        acc, int(tokens[0]), [*tokens[1 : a + 1], bonus], arange_on(n, tree.tokens.device)[: a + 1], following, []
    )


def _live(tree: DraftTree, ok: torch.Tensor) -> torch.Tensor:
    return ok if tree.alive is None else ok & tree.alive[1:]


def _finish(
    tree: DraftTree,
    processed: torch.Tensor,
    chosen: torch.Tensor,
    residual: torch.Tensor | None,
    draws: Draws,
) -> Verdict:
    """From ``chosen [n − 1]`` (child j + 1 acceptable / accepted at its parent): the deepest node whose whole path
    is chosen (first in node order on ties), and the bonus there — argmax (``residual`` None: greedy) or a draw from
    that node's ``residual`` row."""
    refused = torch.cat([true_flag(chosen.device).logical_not(), ~_live(tree, chosen)])
    blocked = (tree.ancestor_mask & refused).any(1)  # an ancestor (or the node) not chosen
    last = torch.where(blocked, -1, tree.depth).argmax().view(1)  # [1]: a 0-d index would be read to the host
    row = processed[last][0]
    bonus = row.argmax() if residual is None else draws.bonus(residual[last][0])
    return Verdict(tree.ancestor_mask[last][0], last[0], bonus, row)


def _siblings(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """(``same [n−1, n−1]``: children j, j' share a parent; ``dup [n−1]``: an earlier sibling proposed the same
    token — a rejected token has probability 0 in the residual, so trying it again only wastes a draw)."""
    par, tok = tree.parents[1:], tree.tokens[1:]
    same = par[:, None] == par[None]
    before = _strictly_lower(par.numel(), par.device)
    dup = (same & before & (tok[:, None] == tok[None])).any(1)
    return same, dup


def _closed_form(tree: DraftTree, processed: torch.Tensor, p: torch.Tensor, draws: Draws) -> Verdict:
    """Exact point-mass rejection with one uniform per node (module docstring): child c of u is accepted iff U_u
    falls in its slice ``[lo_c, lo_c + p_u(x_c))`` of the siblings' cumulative mass; the bonus at the last node u is
    drawn from p_u with its children's tokens zeroed."""
    par, tok = tree.parents[1:], tree.tokens[1:]
    same, dup = _siblings(tree)
    mass = torch.where(_live(tree, ~dup), p[par, tok], 0.0)
    hi = (same & ~_strictly_lower(par.numel(), par.device).T).to(mass.dtype) @ mass  # Σ mass of siblings up to c
    u = draws.node_uniforms(tree.size, p.device).to(mass.dtype)[par]
    chosen = (hi - mass <= u) & (u < hi) & (mass > 0)
    # the residual of every node: p with its live children's tokens zeroed (a node's own row only is ever drawn
    # from; a dead child was never tried, and shares no token with a live sibling)
    tried = _live(tree, torch.ones_like(par, dtype=torch.bool))
    residual = p.index_put((par, tok), torch.where(tried, 0.0, p[par, tok]))
    return _finish(tree, processed, chosen, residual, draws)


def _by_rank(tree: DraftTree, processed: torch.Tensor, p: torch.Tensor, draws: Draws, rule: AcceptanceRule) -> Verdict:
    """Recursive rejection, every node at once, one child rank per step: at step r each node that has a live r-th
    child not preceded by an accepted one tries it under ``rule`` (point mass, or drawn from q when the tree has a
    proposal); a rejection replaces the node's p by the normalised residual (and its q by q without the draft,
    renormalised). The bonus at the last node is drawn from its final p.

    One uniform U per node serves all its tries: given the rejections so far U is uniform on [lo, 1), so a try with
    acceptance probability a accepts iff U < lo + a·(1 − lo), and a rejection moves lo there. For the exact point-mass
    rule the thresholds are the closed form's cumulative masses: both use the same draws and take the same decisions
    (so LANTERN at δ = 0 replays the exact rule seed for seed)."""
    n, R = tree.size, tree.max_children
    rank = tree.child_ranks  # [n, R] child node id, −1 where none
    child = rank.clamp_min(0)
    live = tree.alive if tree.alive is not None else torch.ones_like(tree.tokens, dtype=torch.bool)
    q = tree.proposal
    if q is None:  # point mass: an earlier sibling with the same token makes a child not worth a try
        live = live & ~torch.cat([true_flag(p.device).logical_not(), _siblings(tree)[1]])
    else:
        q = q.to(p.dtype)
    has = rank >= 0
    tries_all = has & live[child]  # [n, R]
    xs = torch.where(has, tree.tokens[child], 0)  # a token id for every (node, rank); only tries are read
    u = draws.node_uniforms(n, p.device).to(p.dtype)
    accepted = torch.full((n,), -1, dtype=torch.long, device=p.device)
    lo: torch.Tensor | float = 0.0
    for r in range(R):
        x = xs[:, r]
        tries = tries_all[:, r] if r == 0 else tries_all[:, r] & (accepted < 0)
        if q is None:
            acc, residual = rule.point_mass_rows(p, x)
        else:
            acc, residual = rule.proposal_rows(p, x, q, p.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0])
        threshold = acc if r == 0 else lo + acc * (1.0 - lo)
        take = tries & (u < threshold)
        rejected = tries & ~take
        accepted = torch.where(take, child[:, r], accepted)
        p = torch.where(rejected[:, None], _normalise_rows(residual, p), p)
        if r + 1 < R:
            lo = torch.where(rejected, threshold, lo)
            if q is not None:
                q = torch.where(rejected[:, None], _normalise_rows(q.scatter(1, x[:, None], 0.0), q), q)
    chosen = torch.zeros(n + 1, dtype=torch.bool, device=p.device)
    chosen = chosen.scatter(0, torch.where(accepted >= 0, accepted, n), True)  # out of place: vmapped per slot
    return _finish(tree, processed, chosen[1:n], p, draws)


def _normalise_rows(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``residual / Σ residual`` per row; rows whose residual vanished (a measure-zero event: the rejected draft had
    probability 1) keep ``fallback``."""
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total, fallback)


@lru_cache(maxsize=256)
def _strictly_lower(m: int, device: torch.device) -> torch.Tensor:
    """Bool ``[m, m]``: j' < j (cached, never written)."""
    return torch.ones(m, m, dtype=torch.bool, device=device).tril(-1)
