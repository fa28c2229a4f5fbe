"""The decode loop: one implementation for every model, policy and acceptance rule.

    prefill            prompt → first image token (the root of cycle 1) and the drafter's prefix
    decode_ar          the AR baseline: one target forward per token
    speculative_cycle  draft a tree (policy × drafter) → verify it (one target forward) → commit a + 1 tokens
    generate           prefill, then cycles until the image is complete

Bookkeeping per cycle (algorithms.md §1): the root is the last chosen token (not yet in the target's KV
cache); the target commits root + a accepted drafts and picks the bonus token, which becomes the next root.
τ = committed / cycles counts the bonus (AR: τ = 1). The tree depth is capped by the image positions left,
minus one, so the last token is always a bonus and no cycle overshoots the image (a cycle with no room for
drafts verifies the root alone; the policy is not consulted). The token sampled at prefill is cycle 1's root;
the last chosen token ends the image without a further forward.

The drafter consumes the committed slots (f_t, x_{t+1}) lazily: all those since its last forward enter it in one
``extend`` at the start of the next drafted cycle. A policy's draft gate (``algorithm.gate``) may replace a cycle by
a plain AR step (the root verified alone); consecutive AR steps then cost the target forward alone.

Timed scope (``latency_s``): from before the prompt prefill (text encoding excluded) to the last token,
prefill and KV allocation included, VQ decoding excluded; CUDA is synchronised at every timer boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.policies.base import LoopPolicy, Policy, TreePolicy
from adtbench.algorithm.records import Clock, CycleRecord, GenerationResult
from adtbench.algorithm.sampling import SamplingParams, process_logits
from adtbench.algorithm.verify import EXACT, AcceptanceRule, verify_tree
from adtbench.models.base import PrefillResult, PromptInputs, Target, ar_step, ar_tokens, prefill_token


def prefill(
    target: Target, inputs: PromptInputs, sp: SamplingParams, max_tree_nodes: int, generator: torch.Generator | None
) -> tuple[int, PrefillResult]:
    """Run the prompt; returns (first image token, ``PrefillResult``) — ``models.base.prefill_token``, the step
    the AR baseline's loop (``ar_tokens``) starts with too."""
    return prefill_token(target, inputs, sp, max_tree_nodes, generator)


@torch.no_grad()
def decode_ar(
    target: Target, inputs: PromptInputs, sp: SamplingParams, generator: torch.Generator | None
) -> GenerationResult:
    """Plain AR decoding (``models.base.ar_tokens``: one target forward per token), timed."""
    clock = Clock(target.device)
    t0 = clock.now()
    marks: list[float] = []
    tokens = ar_tokens(target, inputs, sp, generator, on_prefill=lambda: marks.append(clock.now()))
    latency = clock.now() - t0
    t_prefill = marks[0] - t0
    cycles = [CycleRecord(pos=g, nodes=1, D=0, d=0, K=0, a=0) for g in range(len(tokens) - 1)]
    return GenerationResult(tokens, cycles, latency, t_prefill, 0.0, latency - t_prefill, target.forwards, 0)


@dataclass
class CycleOutcome:
    tokens: list[int]  # committed after the root: the accepted drafts, then the bonus token
    record: CycleRecord
    features: torch.Tensor  # [R, a+1, H] target features of the committed tokens (root first)
    positions: torch.Tensor  # [R, a+1] their position ids
    last_logits: torch.Tensor  # [V] processed logits the bonus token was drawn from (the next root's)
    draft_s: float
    verify_s: float
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
) -> CycleOutcome:
    """Draft a tree, verify it in one target forward, commit root + accepted drafts, tell the policy."""
    ta = clock.now()
    tree = policy.propose(session, max_depth)
    session.drafter.rollback()
    tb = clock.now()
    raw, feats = target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    processed = process_logits(raw, session.root_gen + 1 + tree.depth, target.layout, sp)
    acc = verify_tree(tree, processed, sp.greedy, generator, rule)
    keep = torch.tensor(acc.path, dtype=torch.long)
    positions = target.next_pos[:, None] + torch.arange(keep.numel(), device=target.next_pos.device)[None]
    target.commit(keep)
    tc = clock.now()
    if tree.size > 1:
        policy.observe(tree, acc, session.root_gen)
    new = [*tree.tokens[acc.path[1:]].tolist(), acc.bonus]
    rec = CycleRecord(
        session.root_gen, tree.size, tree.drafted_depth, tree.max_depth, tree.width, acc.accepted, dict(tree.info)
    )
    feats, last = feats[:, keep.to(feats.device)], processed[acc.path[-1]]
    return CycleOutcome(new, rec, feats, positions, last, tb - ta + clock.now() - tc, tc - tb, session.forwards)


def ar_cycle(
    target: Target, root: int, g: int, sp: SamplingParams, generator: torch.Generator | None, clock: Clock
) -> CycleOutcome:
    """A cycle without drafts (gated, or no room left): the root alone, i.e. one AR step (``models.base.ar_step``)."""
    t = clock.now()
    bonus, last, feats = ar_step(target, root, g + 1, sp, generator)
    positions = target.next_pos[:, None] - 1
    return CycleOutcome([bonus], CycleRecord(g, 1, 0, 0, 0, 0), feats, positions, last, 0.0, clock.now() - t, 0)


@torch.no_grad()
def generate(
    target: Target,
    drafter: Any,
    policy: Policy,
    inputs: PromptInputs,
    sp: SamplingParams,
    generator: torch.Generator | None,
    rule: AcceptanceRule = EXACT,
) -> GenerationResult:
    """Speculative generation of one image: a ``LoopPolicy`` runs its own loop (``drafter`` = its models);
    a tree policy runs cycles with the EAGLE ``drafter`` (``policy.uses_drafter`` False → AR decoding)."""
    if isinstance(policy, LoopPolicy):
        return policy.generate(target, drafter, inputs, sp, generator, rule)
    if not policy.uses_drafter or drafter is None:
        return decode_ar(target, inputs, sp, generator)
    policy.reset()
    gate = policy.gate
    if gate is not None:
        gate.reset()
    clock, n_gen, R = Clock(target.device), target.layout.num_gen_tokens, 0
    t0 = clock.now()
    root, res = prefill(target, inputs, sp, policy.max_nodes(), generator)
    R = target.rows
    drafter.reset(R, res.features.shape[1] + n_gen + max(policy.max_nodes(), policy.max_draft_slots()) + 1)
    root_embed = target.embed_tokens(torch.tensor([root]))[None].expand(R, 1, -1)
    out = drafter.extend(res.features, torch.cat([res.input_embeds[:, 1:], root_embed], 1), res.positions, res.valid)
    t_prefill = clock.now() - t0
    tokens, cycles, draft_s, verify_s, drafter_forwards = [root], [], 0.0, 0.0, 1
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (features, positions) of slots the drafter has not seen
    pending_tokens: list[int] = []  # their next tokens x_{t+1}
    b: int | None = None  # the gate's entropy bin of the next root (None: unknown)
    while len(tokens) < n_gen:
        g = len(tokens) - 1
        room = n_gen - len(tokens) - 1  # drafts stop one short of the image end: the last token is a bonus
        if room >= 1 and (gate is None or gate.draft(b)):
            t = clock.now()
            if pending:  # the drafter consumes (f_t, x_{t+1}) of every committed position, in one forward
                feats, positions = pending[0] if len(pending) == 1 else (torch.cat(x, 1) for x in zip(*pending))
                embeds = target.embed_tokens(torch.tensor(pending_tokens))[None].expand(R, -1, -1).to(feats.dtype)
                out = drafter.extend(feats, embeds, positions)
                pending, pending_tokens, drafter_forwards = [], [], drafter_forwards + 1
            session = DraftSession(drafter, target, sp, tokens[-1], g, target.next_pos.clone(), out, generator)
            draft_s += clock.now() - t
            c = speculative_cycle(target, session, policy, sp, rule, generator, room, clock)
            if gate is not None:
                gate.observe(b, len(c.tokens))
        else:
            c = ar_cycle(target, tokens[-1], g, sp, generator, clock)
        t = clock.now()
        tokens += c.tokens
        cycles.append(c.record)
        if gate is not None:
            b = gate.bin_of(c.last_logits)
        if len(tokens) < n_gen:
            pending.append((c.features, c.positions))
            pending_tokens += c.tokens
        draft_s, verify_s = draft_s + c.draft_s + clock.now() - t, verify_s + c.verify_s
        drafter_forwards += c.drafter_forwards
    latency = clock.now() - t0
    stats = {} if gate is None else {"gated_steps": gate.skips}
    return GenerationResult(
        tokens[:n_gen], cycles, latency, t_prefill, draft_s, verify_s, target.forwards, drafter_forwards, stats
    )
