"""The decode loop: one implementation for every model, policy and acceptance rule.

    prefill            prompt → first image token (the root of cycle 1) and the drafter's prefix
    decode_ar          the AR baseline: one target forward per token
    speculative_cycle  draft a tree (policy × drafter) → verify it (one target forward) → commit a + 1 tokens
    ar_cycle           the root verified alone (a gated cycle, or no room for drafts)
    generate           prefill, then cycles until the image is complete

Bookkeeping per cycle (algorithms.md §1) lives in ``slot.DecodeState``, which the batched loop
(``algorithm.batch``) drives per slot too: the root is the last chosen token (not yet in the target's KV cache); the
target commits root + a accepted drafts and picks the bonus token, which becomes the next root. τ = committed /
cycles counts the bonus (AR: τ = 1). The tree depth is capped by the image positions left, minus one, so the last
token is always a bonus and no cycle overshoots the image (a cycle with no room for drafts verifies the root alone;
the policy is not consulted). The token sampled at prefill is cycle 1's root; the last chosen token ends the image
without a further forward.

The cycle stays on the device. Tree, verify forward, acceptance (``verify.accept``), KV commit and the drafter's
inputs are device tensors; the host learns once per cycle what it must know — the accepted count and path, the
bonus token, the realised depth and live nodes (ADT-Tree, the records), the entropy of the bonus's distribution
(the draft gate) — in one read of one small tensor (``verify.read_verdict``). ``budget: cost`` trees read their node
count before the verify (``cost.TreeBudget.choose``) — in the draft phase's graph it is chosen on the device and
read with the verdict (``policies.eagle2``); the AR baseline reads its tokens once per image. Where the
target's verifies are captured as graphs (``engine.compile`` on a GPU) the verify forward, logits processing,
acceptance and the packed verdict are one graph replay (``tree_step``, ``engine.graphs.verify``). When the
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

from typing import Any

import torch

from adtbench.algorithm import tree_step
from adtbench.algorithm.ar import ar_step, ar_tokens, prefill_token
from adtbench.algorithm.drafters.base import Drafter
from adtbench.algorithm.drafters.catch_up import catch_up_graphed, materialised
from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.methods.gate import DraftGate
from adtbench.algorithm.policies.base import LoopPolicy, Policy
from adtbench.algorithm.records import Clock, CycleRecord, GenerationResult
from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.slot import DecodeState, Mark, Pending, Timing, decides_on_host, root_alone
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, AcceptanceRule, CycleRead, verify_cycle
from adtbench.models.base import PrefillResult, PromptInputs, Target
from adtbench.sampling_params import SamplingParams


def prefill(
    target: Target,
    drafter: Drafter,
    inputs: PromptInputs,
    sp: SamplingParams,
    max_tree_nodes: int,
    drafter_slots: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, PrefillResult, torch.Tensor]:
    """Run the prompt through the target (``algorithm.ar.prefill_token``, the step the AR baseline's loop starts with
    too) and the drafter; returns (first image token ``[]`` on the device, ``PrefillResult``, the drafter's output at
    the root ``[R, H]``). ``drafter_slots``: the most scratch slots one cycle's drafting needs."""
    root, res = prefill_token(target, inputs, sp, max_tree_nodes, generator)
    return root, res, prefill_drafter(target, drafter, res, root, max(max_tree_nodes, drafter_slots))


def prefill_drafter(
    target: Target, drafter: Drafter, res: PrefillResult, root: torch.Tensor, slots: int
) -> torch.Tensor:
    """Start the drafter on a prompt (its features, and the drafter's input embeddings shifted by one with the root's
    last): room for the prompt, the image and ``slots`` scratch slots; returns its output at the root ``[R, H]``."""
    R, n_gen = res.features.shape[0], target.layout.num_gen_tokens
    drafter.reset(R, res.features.shape[1] + n_gen + slots + 1)
    root_embed = drafter.embed(target, root.view(1))[None].expand(R, 1, -1)
    prompt = drafter.embed_prompt(target, res)[:, 1:]
    return drafter.extend(res.features, torch.cat([prompt, root_embed], 1), res.positions, res.valid)


def catch_up(target: Target, drafter: Drafter, st: DecodeState) -> None:
    """The drafter consumes (f_t, x_{t+1}) of every position ``st`` committed since its last forward, in one
    ``extend`` — one graph replay after a graphed verify (``drafters.catch_up``); its output at the new root goes to
    ``st.out``."""
    out = catch_up_graphed(target, drafter, st.pending)
    st.caught_up(out if out is not None else drafter.extend(*pending_slots(target, drafter, st.pending)))


def pending_slots(
    target: Target, drafter: Drafter, pending: list[Pending]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The drafter's committed slots of ``pending`` cycles (``DecodeState.pending``): (features, the drafter's
    embeddings of the next tokens ``[R, m, H]``, positions ``[R, m]``)."""
    slots = materialised(pending)
    if len(slots) == 1:
        feats, positions, nxt = slots[0]
    else:
        feats = torch.cat([f for f, _, _ in slots], 1)
        positions = torch.cat([p for _, p, _ in slots], 1)
        nxt = torch.cat([x for _, _, x in slots])
    embeds = drafter.embed(target, nxt)[None].expand(feats.shape[0], -1, -1).to(feats.dtype)
    return feats, embeds, positions


@torch.no_grad()
def decode_ar(
    target: Target, inputs: PromptInputs, sp: SamplingParams, generator: torch.Generator | None
) -> GenerationResult:
    """Plain AR decoding (``algorithm.ar.ar_tokens``: one target forward per token), timed."""
    clock = Clock(target.device)
    t0 = clock.now()
    start, marks = clock.mark(), []
    tokens = ar_tokens(target, inputs, sp, generator, on_prefill=lambda: marks.append(clock.mark()))
    latency = clock.now() - t0
    t_prefill = clock.seconds(start, marks[0])
    cycles = [
        CycleRecord(root_gen=g, nodes=1, drafted_depth=0, tree_depth=0, width=0, accepted=0)
        for g in range(len(tokens) - 1)
    ]
    return GenerationResult(tokens, cycles, latency, t_prefill, 0.0, latency - t_prefill, target.forwards, 0)


def speculative_cycle(
    target: Target,
    st: DecodeState,
    session: DraftSession,
    sp: SamplingParams,
    rule: AcceptanceRule,
    clock: Clock,
    acceptance: str = "auto",
    verify_graphs: str = "auto",
) -> tuple[Mark, Mark, Mark]:
    """Draft a tree (``st.policy`` on ``session``), verify it in one target forward, commit root + accepted drafts,
    advance ``st`` (``DecodeState.advance``: the policy and the gate learn how the tree fared). ``acceptance``: where
    acceptance runs (``verify.verify_cycle``); ``verify_graphs``: the verify as one graph replay or op by op
    (``tree_step``; ``engine.graphs.verify``). Returns the clock marks drafted, verified, done."""
    tree = st.policy.propose(session, st.room)
    session.drafter.rollback()
    drafted = clock.mark()
    entropy = st.gate is not None
    step = tree_step.step_for(target, tree, sp, rule, entropy, verify_graphs, acceptance)
    next_pos = target.next_pos
    if step is not None:  # forward, processing, acceptance, the verdict and the KV commit: one replay, one read
        read, feats = step.verify(tree, session.root_gen, st.generator)
    else:
        raw, feats = target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
        gen = session.root_gen + 1  # per node where some index forces a token, else one index serves every row
        processed = process_logits(raw, gen + tree.depth if target.layout.forces else gen, target.layout, sp)
        read = judge(tree, processed, sp, rule, st.generator, entropy, acceptance)
        target.commit(read.keep, in_place=read.acceptance.path[-1] == read.acceptance.accepted)
    marks = (drafted, clock.mark(), clock.mark())
    st.advance(read, feats, next_pos, tree, session)
    return marks


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


def ar_cycle(target: Target, st: DecodeState, sp: SamplingParams, clock: Clock) -> tuple[Mark, Mark, Mark]:
    """A cycle without drafts (gated, or no room left): the root alone, i.e. one AR step (``algorithm.ar.ar_step``);
    its token and the root's (and the entropy for a gate) are read at once (``slot.root_alone``). Returns the clock
    marks started, verified, done."""
    start = clock.mark()
    next_pos = target.next_pos
    bonus, processed, feats = ar_step(target, st.root, st.g + 1, sp, st.generator)
    done = clock.mark()
    extra = [DraftGate.entropy(processed)] if st.gate is not None else []
    st.advance(root_alone(st.root, bonus, extra), feats, next_pos)
    return start, done, done


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
    (``verify.verify_cycle``; ``engine.acceptance``). The policy's ``graphs`` (``engine.graphs``) say which parts run
    as graph replays: ``verify`` the tree verify (``tree_step``), ``levels`` the drafting levels, ``step`` a loop's."""
    if isinstance(policy, LoopPolicy):
        return policy.generate(target, drafter, inputs, sp, generator, rule, acceptance)
    if not policy.uses_drafter or drafter is None:
        return decode_ar(target, inputs, sp, generator)
    clock, n_gen = Clock(target.device), target.layout.num_gen_tokens
    t0 = clock.now()
    begin = clock.mark()
    root, _, out = prefill(target, drafter, inputs, sp, policy.max_nodes(), policy.max_draft_slots(), generator)
    timing = Timing(t0, (begin, clock.mark()))
    st = DecodeState.start(policy, generator, n_gen, root, out, decides_on_host(acceptance, target.device))
    while not st.done:
        start = clock.mark()
        if st.drafts():
            if st.pending:  # the drafter consumes (f_t, x_{t+1}) of every committed position, in one forward
                catch_up(target, drafter, st)
            session = st.session(drafter, target, sp, target.next_pos)
            marks = speculative_cycle(target, st, session, sp, rule, clock, acceptance, policy.graphs.verify)
            timing.cycle(start, *marks)
        else:
            timing.cycle(start, *ar_cycle(target, st, sp, clock))
    return st.result(clock, timing, target.forwards)
