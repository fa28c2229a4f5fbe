"""Batched decoding: B prompts share every target forward, for the AR baseline and every tree policy.

    decode_ar_batch   the AR baseline: up to B prompts, one token of every slot per forward (an image has a fixed
                      length, so the group finishes together)
    generate_batch    speculative decoding with continuous batching: each slot builds its own tree (its own policy
                      state and generator) while one drafter forward per tree level serves every slot
                      (``drafters.batch.BatchDrafter``), one target forward verifies every slot's tree
                      (``models.batch.BatchTarget``: per-row KV columns, ragged commits), each slot accepts and
                      commits its own path; a finished slot takes the next prompt at once

Exactness: a slot makes the same calls and the same draws from its own generator, in the same order, as
``engine.generate`` / ``engine.decode_ar`` of its prompt alone; only the target's logits come from a batched forward,
equal to the single-prompt ones up to float rounding. So a prompt's tokens do not depend on which prompts share its
batch (generators are seeded per prompt): greedy and seeded T = 1 output equal B = 1's in float64 (tested), and
every policy and relaxation keeps the law it has at B = 1.

What is batched: the target forward, the drafter's forwards (policies are coroutines, ``TreePolicy.propose_steps``,
so every slot's levels are drafted in lockstep), the logit processing (CFG mix, constraint, temperature, filters),
for AR the greedy argmax, and on a device the cycle's read (``verify.read_verdicts``). What runs per slot: the
policy's tree building and acceptance. Under ``engine.compile`` the cycle is three replays: every slot's draft phase
(``drafters.batch_phase``: the slots' graphed levels, one drafter forward per level for all), the verify with every
slot's acceptance and commit and the drafter's catch-up (``batch_step``).

Timing: a slot's ``latency_s`` runs from its admission (its prefill) to its last token; in a batch it includes the
other slots' work, as a served request's latency does. ``prefill_s`` is its own prefill, ``draft_s`` its own
drafting, ``verify_s`` the batched forwards and acceptance it took part in. Throughput (images/s over the wall time
of the whole stream) is the caller's (``harness.app``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.ar import first_token
from adtbench.algorithm.batch_step import BatchSlots, batch_catch_up, batch_step_for
from adtbench.algorithm.drafters.batch import BatchDrafter, SlotDrafter
from adtbench.algorithm.drafters.batch_phase import BatchPhase, drafts_in_phases
from adtbench.algorithm.drafters.eagle import EagleDrafter
from adtbench.algorithm.drafters.session import DraftSession, Lockstep, Steps
from adtbench.algorithm.engine import pending_slots, prefill_drafter
from adtbench.algorithm.methods.gate import DraftGate
from adtbench.algorithm.policies.base import TreePolicy
from adtbench.algorithm.records import Clock, CycleRecord, GenerationResult
from adtbench.algorithm.sampling import process_logits, sample_rows
from adtbench.algorithm.slot import DecodeState, Item, SlotStream, Timing, decides_on_host, root_alone, verify_slots
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, AcceptanceRule, CycleRead
from adtbench.models.base import PromptInputs
from adtbench.models.batch import BatchTarget, SlotTree
from adtbench.sampling_params import SamplingParams


def _processed(bt: BatchTarget, raw: torch.Tensor, gen_idx: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """Raw logits ``[R, N, V]`` of every slot (rows CFG-major) → processed ``[B, N, V]``; ``gen_idx [B, N]``: the
    generation index each node's logits predict. One ``process_logits`` call for all slots."""
    _, N, V = raw.shape
    return process_logits(raw.view(bt.c, bt.B * N, V), gen_idx.reshape(-1), bt.layout, sp).view(bt.B, N, V)


@torch.no_grad()
def decode_ar_batch(bt: BatchTarget, items: list[Item], sp: SamplingParams) -> list[GenerationResult]:
    """Plain AR decoding of up to ``bt.B`` prompts together: each is prefilled into its slot, then every forward
    takes one token of every slot (same draws per prompt as ``engine.decode_ar``). Tokens stay on the device until
    the group is done (one read). Returns one result per item, in order."""
    if not 0 < len(items) <= bt.B:
        raise ValueError(f"{len(items)} prompts for {bt.B} slots")
    clock, n, dev = Clock(bt.device), bt.layout.num_gen_tokens, bt.device
    t0 = clock.now()
    roots, prefill_s = [], []
    for s, (_, inputs, gen) in enumerate(items):
        t = clock.mark()
        roots.append(first_token(bt.admit(s, inputs), bt.layout, sp, gen).view(1))
        prefill_s.append((t, clock.mark()))
    zero = torch.zeros(1, dtype=torch.long, device=dev)  # an idle slot's root; a one-node tree's kept node
    keeps: list[torch.Tensor | None] = [zero] * len(items) + [None] * (bt.B - len(items))
    tokens = [torch.cat(roots)]
    for g in range(1, n):
        last = tokens[-1]
        trees = [BatchTarget.idle(last[s] if s < len(items) else zero) for s in range(bt.B)]
        raw, _ = bt.forward(trees)
        processed = _processed(bt, raw, torch.full((bt.B, 1), g, device=dev), sp)[: len(items), 0]
        if sp.greedy:
            nxt = processed.argmax(-1)
        else:
            nxt = torch.stack([sample_rows(processed[s].softmax(-1), gen) for s, (_, _, gen) in enumerate(items)])
        bt.commit(keeps, [True] * bt.B)
        tokens.append(nxt)
    latency = clock.now() - t0
    table = torch.stack(tokens, 1).tolist()  # [items, n]: the group's one read
    out = []
    for s, row in enumerate(table):
        pre = clock.seconds(*prefill_s[s])
        cycles = [
            CycleRecord(root_gen=g, nodes=1, drafted_depth=0, tree_depth=0, width=0, accepted=0) for g in range(n - 1)
        ]
        out.append(GenerationResult([int(x) for x in row], cycles, latency, pre, 0.0, latency - pre, n, 0))
    return out


def _draft_in_lockstep(
    bd: BatchDrafter, steps: dict[int, tuple[DraftSession, Steps]], phase: BatchPhase | None = None
) -> dict[int, DraftTree]:
    """Run every drafting slot's ``propose_steps`` (with its session) to its tree, one ``BatchDrafter.expand`` per
    round for all the levels the slots ask for in that round (a slot whose tree is done drops out). Slots whose
    levels are graphed hand over their whole draft phase (``DraftPhase``): all of them run as one ``phase`` replay
    (``drafters.batch_phase``), before the eager slots' rounds."""
    slots: Lockstep[Any, DraftTree] = Lockstep({s: st for s, (_, st) in steps.items()})
    while slots.pending:
        phases = drafts_in_phases(slots.pending)
        if phases:
            assert phase is not None, "a draft phase without the batch's"
            outs = phase.run(phases)
            for s in phases:
                slots.send(s, outs[s])
            continue
        levels = {s: steps[s][0].prepare(r) for s, r in slots.pending.items()}
        outs = bd.expand({s: li.inputs for s, li in levels.items()})
        for s, li in levels.items():
            slots.send(s, steps[s][0].receive(li, outs[s]))
    return slots.done


@torch.no_grad()
def generate_batch(
    bt: BatchTarget,
    drafter: EagleDrafter,
    policy: TreePolicy,
    items: Iterable[Item],
    sp: SamplingParams,
    on_done: Callable[[Any, GenerationResult], None],
    rule: AcceptanceRule = EXACT,
    acceptance: str = "auto",
) -> None:
    """Speculative decoding of ``items`` through ``bt.B`` slots (module docstring); ``on_done(key, result)`` is
    called for each prompt as soon as its image is complete, in completion order. ``policy`` is copied per slot
    (``copy.deepcopy``), ``drafter``'s weights serve a ``BatchDrafter``; ``acceptance`` as in ``engine.generate``.
    Each slot is a ``slot.DecodeState`` driven as ``engine.generate`` drives its one."""
    clock, layout, dev = Clock(bt.device), bt.layout, bt.device
    n_gen = layout.num_gen_tokens
    on_host = decides_on_host(acceptance, dev)
    policies = [copy.deepcopy(policy) for _ in range(bt.B)]
    room_slots = max(policy.max_nodes(), policy.max_draft_slots())
    bd = BatchDrafter(drafter, bt.B, bt.c, bt.capacity + 2 * room_slots)
    zero = torch.zeros(1, dtype=torch.long, device=dev)  # an idle slot's root; a one-node tree's kept node
    drafters = [SlotDrafter(bd, s) for s in range(bt.B)]
    phase = _batch_phase(bt, bd, drafters, policy, room_slots, on_host)

    def start(s: int, inputs: PromptInputs, gen: torch.Generator | None) -> DecodeState:
        res = bt.admit(s, inputs)
        root = first_token(res, layout, sp, gen)
        out = bd.admit(s, lambda one: prefill_drafter(bt.target, one, res, root, room_slots))
        return DecodeState.start(policies[s], gen, n_gen, root, out, on_host)

    def result(st: DecodeState, timing: Timing) -> GenerationResult:
        return st.result(clock, timing)

    stream = SlotStream(bt.B, items, clock, start, lambda st: st.done, result, on_done)
    slots = stream.slots
    while stream.busy:
        start_mark = clock.mark()
        live = {s: sl.state for s, sl in enumerate(slots) if sl is not None}
        drafting = {s: st for s, st in live.items() if st.drafts()}
        catching = {s: st for s, st in drafting.items() if st.pending}
        if catching:  # the drafter consumes every drafting slot's committed positions, one forward (or replay) for all
            outs = batch_catch_up(bt.target, bd, {s: st.pending for s, st in catching.items()})
            if outs is None:
                outs = bd.extend({s: pending_slots(bt.target, bd.single, st.pending) for s, st in catching.items()})
            for s, st in catching.items():
                st.caught_up(outs[s])
        for st in live.values():  # a slot that did not catch up keeps its committed slots past the next verify
            st.pending = BatchSlots.materialised(st.pending)
        sessions: dict[int, DraftSession] = {}
        steps: dict[int, tuple[DraftSession, Steps]] = {}
        for s, st in drafting.items():
            sessions[s] = st.session(drafters[s], bt.target, sp, bt.next_pos[bt.slot_rows(s)])
            steps[s] = (sessions[s], st.policy.propose_steps(sessions[s], st.room))
        trees = _draft_in_lockstep(bd, steps, phase)
        drafted = clock.mark()
        for s, sl in enumerate(slots):
            if sl is not None:
                bd.rollback(s)
                sl.timing.drafts.append((start_mark, drafted))
        start_mark = clock.mark()
        entropy = policy.gate is not None
        slot_trees = [trees.get(s) for s, sl in enumerate(slots) if sl is not None]
        step = batch_step_for(bt, slot_trees, sp, rule, entropy, policy.graphs.verify, on_host)
        reads: list[CycleRead | torch.Tensor | None]
        if step is not None:  # one replay: forward, acceptance, the verdicts' one read, the commit
            graphed = [None if sl is None else (trees.get(s), sl.state.root, sl.state.g, sl.state.generator)
                       for s, sl in enumerate(slots)]  # fmt: skip
            graphed_reads, feats, next_pos = step.verify(graphed)
            reads, processed = list(graphed_reads), None
        else:
            next_pos = bt.next_pos.clone()
            reads, feats, processed = _eager_verify(bt, trees, slots, sp, rule, acceptance, on_host, entropy, zero)
        verified = clock.mark()
        for s, sl in enumerate(slots):
            if sl is None:
                continue
            st, read = sl.state, reads[s]
            rows = bt.slot_rows(s)
            f, pos = feats.index_select(0, rows), next_pos[rows]
            sl.timing.forwards += 1
            sl.timing.verifies.append((start_mark, verified))
            if isinstance(read, CycleRead) and s in trees:
                st.advance(read, f, pos, trees[s], sessions[s])
            elif isinstance(read, CycleRead):  # the root alone, through the graphed step
                st.advance(read, f[:, :1], pos)
            else:
                assert isinstance(read, torch.Tensor) and processed is not None
                extra = [DraftGate.entropy(processed[s, 0])] if entropy else []
                st.advance(root_alone(st.root, read, extra), f[:, :1], pos)
            if st.done:
                stream.finish(s)


def _batch_phase(
    bt: BatchTarget, bd: BatchDrafter, drafters: list[SlotDrafter], policy: TreePolicy, room: int, on_host: bool
) -> BatchPhase | None:
    """The batch's draft phase (``drafters.batch_phase``), each slot's ``SlotLevels`` handed to its drafter — where the
    B = 1 levels would be graphed: ``engine.graphs.levels`` not eager, the batch's verify buckets captured
    (``engine.compile``) on a device with graphs, decisions on the device. None: every slot drafts eagerly."""
    static = bt.static
    captured = static is not None and any(st.graphed for st in static.steps.values())
    if policy.graphs.levels == "eager" or on_host or not captured or not accel.graphs_supported(bd.device):
        return None
    phase = BatchPhase(bd, drafters, room)
    for d, levels in zip(drafters, phase.slots, strict=True):
        d.level_graphs = levels
    return phase


def _eager_verify(
    bt: BatchTarget,
    trees: dict[int, DraftTree],
    slots: list[Any],
    sp: SamplingParams,
    rule: AcceptanceRule,
    acceptance: str,
    on_host: bool,
    entropy: bool,
    zero: torch.Tensor,
) -> tuple[list[CycleRead | torch.Tensor | None], torch.Tensor, torch.Tensor]:
    """The eager batched verify: one target forward over every slot's tree (its root alone where it drafted none;
    ``zero`` for an idle slot), each slot's acceptance (``slot.verify_slots``) and the ragged commit. Returns the
    reads (as ``verify_slots``), the features and the processed logits ``[B, N, V]``."""
    forward: list[SlotTree] = []
    gidx = torch.ones(bt.B, dtype=torch.long)  # generation index of each slot's root + 1
    for s, sl in enumerate(slots):
        tree = None if sl is None else trees.get(s)
        if sl is not None:
            gidx[s] = len(sl.state.tokens)
        if tree is None:
            forward.append(BatchTarget.idle(zero if sl is None else sl.state.root))
        else:
            forward.append(SlotTree(tree.tokens, tree.ancestor_mask, tree.depth))
    raw, feats = bt.forward(forward)
    depth = torch.nn.utils.rnn.pad_sequence([t.depth for t in forward], batch_first=True)
    processed = _processed(bt, raw, gidx.to(bt.device)[:, None] + depth, sp)
    cases = [None if sl is None else (trees.get(s), sl.state.generator) for s, sl in enumerate(slots)]
    reads = verify_slots(cases, processed, sp, rule, acceptance, on_host, entropy)
    keeps: list[torch.Tensor | None] = []
    in_place: list[bool] = []
    for s, sl in enumerate(slots):
        read = reads[s]
        if sl is None:
            keeps.append(None)
            in_place.append(True)
        elif isinstance(read, CycleRead):
            keeps.append(read.keep)
            in_place.append(read.acceptance.path[-1] == read.acceptance.accepted)
        else:  # the root alone
            keeps.append(zero)
            in_place.append(True)
    bt.commit(keeps, in_place)
    return reads, feats, processed
