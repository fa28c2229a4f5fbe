"""The decode loop: one implementation for every model, policy and acceptance rule.

    prefill            prompt → first image token (the root of cycle 1) and the drafter's prefix
    decode_ar          the AR baseline: one target forward per token
    speculative_cycle  draft a tree (policy × drafter) → verify it (one target forward) → commit a + 1 tokens
    generate           prefill, then cycles until the image is complete

Bookkeeping per cycle (algorithms.md §1): the root is the last chosen token (not yet in the target's KV cache); the
target commits root + a accepted drafts and picks the bonus token, which becomes the next root. τ = committed /
cycles counts the bonus (AR: τ = 1). The tree depth is capped by the image positions left, minus one, so the last
token is always a bonus and no cycle overshoots the image (a cycle with no room for drafts verifies the root alone;
the policy is not consulted). The token sampled at prefill is cycle 1's root; the last chosen token ends the image
without a further forward.

The cycle stays on the device. Tree, verify forward, acceptance (``verify.accept``), KV commit and the drafter's
inputs are device tensors; the host learns once per cycle what it must know — the accepted count and path, the
bonus token, the realised depth and live nodes (ADT-Tree, the records), the entropy of the bonus's distribution
(the draft gate) — in one read of one small tensor (``verify.read_verdict``). ``budget: cost`` trees read their node
count before the verify (``cost.TreeBudget.choose``); the AR baseline reads its tokens once per image. When the
device is the CPU, the cycle's decisions run on the host by default (``acceptance``: ``auto``): acceptance as the
float64 host walk (``verify.verify_cycle``), EAGLE-2 and sampled trees built on host copies of each drafter level
(``DraftSession.on_host``) — the same trees and the same law, far fewer calls there (a torch op costs several
numpy calls on the CPU, and a read costs nothing).

The drafter consumes the committed slots (f_t, x_{t+1}) lazily: all those since its last forward enter it in one
``extend`` at the start of the next drafted cycle. A policy's draft gate (``algorithm.gate``) may replace a cycle by
a plain AR step (the root verified alone); consecutive AR steps then cost the target forward alone.

Timed scope (``latency_s``): from before the prompt prefill (text encoding excluded) to the last token, prefill and
KV allocation included, VQ decoding excluded; CUDA is synchronised at the image's start and end only, the split into
prefill / draft / verify comes from CUDA events (``records.Clock``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.ar import ar_step, ar_tokens, prefill_token
from adtbench.algorithm.drafters.base import Drafter
from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.gate import DraftGate
from adtbench.algorithm.policies.base import LoopPolicy, Policy, TreePolicy
from adtbench.algorithm.records import Clock, CycleRecord, GenerationResult
from adtbench.algorithm.sampling import SamplingParams, process_logits
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, AcceptanceRule, CycleRead, verify_cycle
from adtbench.models.base import PrefillResult, PromptInputs, Target


def prefill(
    target: Target,
    drafter: Drafter,
    inputs: PromptInputs,
    sp: SamplingParams,
    max_tree_nodes: int,
    drafter_slots: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, PrefillResult, torch.Tensor]:
    """Run the prompt through the target (``models.base.prefill_token``, the step the AR baseline's loop starts with
    too) and the drafter; returns (first image token ``[]`` on the device, ``PrefillResult``, the drafter's output at
    the root ``[R, H]``). ``drafter_slots``: the most scratch slots one cycle's drafting needs."""
    root, res = prefill_token(target, inputs, sp, max_tree_nodes, generator)
    return root, res, prefill_drafter(target, drafter, res, root, max(max_tree_nodes, drafter_slots))


def prefill_drafter(
    target: Target, drafter: Drafter, res: PrefillResult, root: torch.Tensor, slots: int
) -> torch.Tensor:
    """Start the drafter on a prompt (its features, and the input embeddings shifted by one with the root's last):
    room for the prompt, the image and ``slots`` scratch slots; returns its output at the root ``[R, H]``."""
    R, n_gen = res.features.shape[0], target.layout.num_gen_tokens
    drafter.reset(R, res.features.shape[1] + n_gen + slots + 1)
    root_embed = target.embed_tokens(root.view(1))[None].expand(R, 1, -1)
    return drafter.extend(res.features, torch.cat([res.input_embeds[:, 1:], root_embed], 1), res.positions, res.valid)


def catch_up(target: Target, drafter: Drafter, pending: list[CycleOutcome]) -> torch.Tensor:
    """The drafter consumes (f_t, x_{t+1}) of every position committed since its last forward, in one ``extend``;
    returns its output at the new root ``[R, H]``."""
    return drafter.extend(*pending_slots(target, pending))


def pending_slots(target: Target, pending: list[CycleOutcome]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The drafter's committed slots of ``pending`` cycles: (features, embeddings of the next tokens ``[R, m, H]``,
    positions ``[R, m]``)."""
    if len(pending) == 1:
        feats, positions, nxt = pending[0].features, pending[0].positions, pending[0].next_tokens
    else:
        feats = torch.cat([c.features for c in pending], 1)
        positions = torch.cat([c.positions for c in pending], 1)
        nxt = torch.cat([c.next_tokens for c in pending])
    embeds = target.embed_tokens(nxt)[None].expand(feats.shape[0], -1, -1).to(feats.dtype)
    return feats, embeds, positions


@torch.no_grad()
def decode_ar(
    target: Target, inputs: PromptInputs, sp: SamplingParams, generator: torch.Generator | None
) -> GenerationResult:
    """Plain AR decoding (``models.base.ar_tokens``: one target forward per token), timed."""
    clock = Clock(target.device)
    t0 = clock.now()
    start, marks = clock.mark(), []
    tokens = ar_tokens(target, inputs, sp, generator, on_prefill=lambda: marks.append(clock.mark()))
    latency = clock.now() - t0
    t_prefill = clock.seconds(start, marks[0])
    cycles = [
        CycleRecord(g, nodes=1, drafted_depth=0, tree_depth=0, width=0, accepted=0) for g in range(len(tokens) - 1)
    ]
    return GenerationResult(tokens, cycles, latency, t_prefill, 0.0, latency - t_prefill, target.forwards, 0)


@dataclass
class CycleOutcome:
    """What one cycle hands the loop: host values (read once) and the device tensors the drafter consumes next."""

    root: int  # the root's token (read with the cycle)
    tokens: list[int]  # committed after the root: the accepted drafts, then the bonus token
    record: CycleRecord
    features: torch.Tensor  # [R, a+1, H] target features of the committed tokens (root first)
    positions: torch.Tensor  # [R, a+1] their position ids
    next_tokens: torch.Tensor  # [a+1] the token after each (accepted drafts, then the bonus): the drafter's x_{t+1}
    entropy: float | None  # H of the bonus's distribution (read only for a draft gate)
    marks: tuple[Any, Any, Any]  # clock marks: drafted, verified, done
    drafter_forwards: int


def speculative_cycle(
    target: Target,
    session: DraftSession,
    policy: TreePolicy,
    sp: SamplingParams,
    rule: AcceptanceRule,
    generator: torch.Generator | None,
    max_depth: int,
    clock: Clock,
    entropy: bool = False,
    acceptance: str = "auto",
) -> CycleOutcome:
    """Draft a tree, verify it in one target forward, commit root + accepted drafts, tell the policy. ``entropy``:
    read the entropy of the bonus's distribution too (a draft gate); ``acceptance``: where acceptance runs
    (``verify.verify_cycle``)."""
    tree = policy.propose(session, max_depth)
    session.drafter.rollback()
    drafted = clock.mark()
    raw, feats = target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    processed = process_logits(raw, session.root_gen + 1 + tree.depth, target.layout, sp)
    read = judge(tree, processed, sp, rule, generator, entropy, acceptance)
    next_pos = target.next_pos
    target.commit(read.keep, in_place=read.acceptance.path[-1] == read.acceptance.accepted)
    verified = clock.mark()
    return outcome(read, tree, feats, next_pos, policy, session, (drafted, verified, clock.mark()))


def judge(
    tree: DraftTree,
    processed: torch.Tensor,
    sp: SamplingParams,
    rule: AcceptanceRule,
    generator: torch.Generator | None,
    entropy: bool,
    acceptance: str,
) -> CycleRead:
    """Accept along ``tree`` given its processed target logits ``[n, V]`` and read the verdict once
    (``verify.verify_cycle``); ``entropy``: read the bonus distribution's entropy with it (a draft gate)."""
    extra = (lambda row: [DraftGate.entropy(row)]) if entropy else None
    return verify_cycle(tree, processed, sp.greedy, generator, rule, extra, acceptance)


def outcome(
    read: CycleRead,
    tree: DraftTree,
    feats: torch.Tensor,
    next_pos: torch.Tensor,
    policy: TreePolicy,
    session: DraftSession,
    marks: tuple[Any, Any, Any],
) -> CycleOutcome:
    """A verified cycle's ``CycleOutcome`` (``feats [R, n, H]``: the tree's target features; ``next_pos [R]``: the
    root's positions, read before the commit); tells the policy how the tree fared."""
    acc, keep = read.acceptance, read.keep
    a = acc.accepted
    positions = next_pos[:, None] + _arange(a + 1, keep.device)[None]
    if tree.size > 1:
        policy.observe(tree, acc, session.root_gen)
    rec = CycleRecord(session.root_gen, acc.nodes, tree.drafted_depth, acc.tree_depth, tree.width, a, dict(tree.info))
    return CycleOutcome(
        read.root, read.tokens, rec, feats.index_select(1, keep), positions, read.next_tokens,
        read.extra[0] if read.extra else None, marks, session.forwards,
    )  # fmt: skip


def ar_cycle(
    target: Target,
    root: torch.Tensor,
    g: int,
    sp: SamplingParams,
    generator: torch.Generator | None,
    clock: Clock,
    entropy: bool = False,
) -> CycleOutcome:
    """A cycle without drafts (gated, or no room left): the root alone, i.e. one AR step (``models.base.ar_step``);
    its token and the root's (and the entropy for a gate) are read at once."""
    start = clock.mark()
    next_pos = target.next_pos
    bonus, last, feats = ar_step(target, root, g + 1, sp, generator)
    done = clock.mark()
    return ar_outcome(root, bonus, last, feats, next_pos, g, entropy, (start, done, done))


def ar_outcome(
    root: torch.Tensor,
    bonus: torch.Tensor,
    processed: torch.Tensor,
    feats: torch.Tensor,
    next_pos: torch.Tensor,
    g: int,
    entropy: bool,
    marks: tuple[Any, Any, Any],
) -> CycleOutcome:
    """A cycle without drafts: the root (generation index ``g``, at positions ``next_pos [R]``) and the ``bonus``
    chosen from ``processed [V]``, read at once (with the entropy for a gate)."""
    head = [root.view(()), bonus] + ([DraftGate.entropy(processed)] if entropy else [])
    values = torch.stack([x.to(torch.float64) for x in head]).tolist()
    return CycleOutcome(
        int(values[0]), [int(values[1])], CycleRecord(g, 1, 0, 0, 0, 0), feats, next_pos[:, None], bonus.view(1),
        values[2] if entropy else None, marks, 0,
    )  # fmt: skip


@torch.no_grad()
def generate(
    target: Target,
    drafter: Drafter | Any,
    policy: Policy,
    inputs: PromptInputs,
    sp: SamplingParams,
    generator: torch.Generator | None,
    rule: AcceptanceRule = EXACT,
    acceptance: str = "auto",
) -> GenerationResult:
    """Speculative generation of one image: a ``LoopPolicy`` runs its own loop (``drafter`` = its models, e.g.
    ``mulo.MuloModels``); a tree policy runs cycles with the ``drafter`` (a ``drafters.base.Drafter``;
    ``policy.uses_drafter`` False → AR decoding). ``acceptance``: ``auto`` | ``device`` | ``host``
    (``verify.verify_cycle``; ``engine.acceptance``)."""
    if isinstance(policy, LoopPolicy):
        return policy.generate(target, drafter, inputs, sp, generator, rule, acceptance)
    if not policy.uses_drafter or drafter is None:
        return decode_ar(target, inputs, sp, generator)
    policy.reset()
    gate = policy.gate
    if gate is not None:
        gate.reset()
    clock, n_gen = Clock(target.device), target.layout.num_gen_tokens
    on_host = acceptance == "host" or (acceptance == "auto" and not accel.is_cuda(target.device))
    t0 = clock.now()
    begin = clock.mark()
    root, _, out = prefill(target, drafter, inputs, sp, policy.max_nodes(), policy.max_draft_slots(), generator)
    prefilled = clock.mark()
    tokens: list[int] = [-1]  # the root's value is read with the first cycle (its tokens follow it)
    root_t = root.view(1)
    cycles: list[CycleRecord] = []
    marks: list[tuple[Any, Any, Any, Any]] = []  # per cycle: start, drafted, verified, done
    drafter_forwards = 1
    pending: list[CycleOutcome] = []  # committed slots the drafter has not seen (f_t, positions, x_{t+1})
    b: int | None = None  # the gate's entropy bin of the next root (None: unknown)
    while len(tokens) < n_gen:
        g = len(tokens) - 1
        room = n_gen - len(tokens) - 1  # drafts stop one short of the image end: the last token is a bonus
        start = clock.mark()
        if room >= 1 and (gate is None or gate.draft(b)):
            if pending:  # the drafter consumes (f_t, x_{t+1}) of every committed position, in one forward
                out = catch_up(target, drafter, pending)
                pending, drafter_forwards = [], drafter_forwards + 1
            session = DraftSession(drafter, target, sp, root_t, g, target.next_pos, out, generator, on_host)
            c = speculative_cycle(
                target, session, policy, sp, rule, generator, room, clock, gate is not None, acceptance
            )
            if gate is not None:
                gate.observe(b, len(c.tokens))
        else:
            c = ar_cycle(target, root_t, g, sp, generator, clock, gate is not None)
        if tokens[0] < 0:
            tokens[0] = c.root
        tokens += c.tokens
        cycles.append(c.record)
        marks.append((start, *c.marks))
        root_t = c.next_tokens[-1:]
        if gate is not None:
            b = gate.bin_of_entropy(c.entropy) if c.entropy is not None else None
        if len(tokens) < n_gen:
            pending.append(c)
        drafter_forwards += c.drafter_forwards
    latency = clock.now() - t0
    if tokens[0] < 0:  # a one-token image: no cycle read the root
        tokens[0] = int(root)
    t_prefill = clock.seconds(begin, prefilled)
    draft_s = sum(clock.seconds(s, d) + clock.seconds(v, e) for s, d, v, e in marks)
    verify_s = sum(clock.seconds(d, v) for _, d, v, _ in marks)
    stats = {} if gate is None else {"gated_steps": gate.skips}
    return GenerationResult(
        tokens[:n_gen], cycles, latency, t_prefill, draft_s, verify_s, target.forwards, drafter_forwards, stats
    )


@lru_cache(maxsize=256)
def _arange(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` on ``device`` (cached, never written)."""
    return torch.arange(n, device=device)
