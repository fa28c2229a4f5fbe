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
policy's tree building and acceptance.

Timing: a slot's ``latency_s`` runs from its admission (its prefill) to its last token; in a batch it includes the
other slots' work, as a served request's latency does. ``prefill_s`` is its own prefill, ``draft_s`` its own
drafting, ``verify_s`` the batched forwards and acceptance it took part in. Throughput (images/s over the wall time
of the whole stream) is the caller's (``harness.app``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.ar import first_token
from adtbench.algorithm.drafters.batch import BatchDrafter, SlotDrafter
from adtbench.algorithm.drafters.eagle import EagleDrafter
from adtbench.algorithm.drafters.session import DraftSession, Expand, Steps
from adtbench.algorithm.engine import CycleOutcome, ar_outcome, judge, outcome, pending_slots, prefill_drafter
from adtbench.algorithm.gate import DraftGate
from adtbench.algorithm.policies.base import TreePolicy
from adtbench.algorithm.records import Clock, CycleRecord, GenerationResult
from adtbench.algorithm.sampling import SamplingParams, next_token_tensor, process_logits, sample_rows
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, AcceptanceRule, CycleRead, Verdict, accept, read_verdicts
from adtbench.models.base import PromptInputs
from adtbench.models.batch import BatchTarget, SlotTree

Item = tuple[Any, PromptInputs, torch.Generator | None]  # (the caller's key, the encoded prompt, its generator)


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
        cycles = [CycleRecord(g, 1, 0, 0, 0, 0) for g in range(n - 1)]
        out.append(GenerationResult([int(x) for x in row], cycles, latency, pre, 0.0, latency - pre, n, 0))
    return out


def _drafts(st: _Slot, n_gen: int) -> bool:
    """Whether a slot drafts this cycle: room for a draft before the image's last token, and its gate lets it
    (``engine.generate``'s rule; a gate's ``draft`` is called once per cycle, as there)."""
    gate = st.policy.gate
    return n_gen - len(st.tokens) - 1 >= 1 and (gate is None or gate.draft(st.bin))


def _draft_in_lockstep(bd: BatchDrafter, live: dict[int, _Slot], steps: dict[int, Steps]) -> None:
    """Run every slot's ``propose_steps`` to its tree, one ``BatchDrafter.expand`` per round for all the levels the
    slots ask for in that round (a slot whose tree is done drops out); sets each slot's ``tree``."""
    requests: dict[int, Expand] = {}

    def advance(s: int, reply: Any) -> None:
        try:
            requests[s] = steps[s].send(reply)
        except StopIteration as done:
            live[s].tree = done.value
            requests.pop(s, None)

    for s in steps:
        advance(s, None)
    while requests:
        levels = {}
        for s, r in requests.items():
            session = live[s].session
            assert session is not None
            levels[s] = session.prepare(r)
        outs = bd.expand({s: li.inputs for s, li in levels.items()})
        for s, li in levels.items():
            session = live[s].session
            assert session is not None
            advance(s, session.receive(li, outs[s]))


def _accept_all(
    slots: list[_Slot | None],
    processed: torch.Tensor,
    sp: SamplingParams,
    rule: AcceptanceRule,
    acceptance: str,
    on_host: bool,
) -> list[CycleRead | torch.Tensor | None]:
    """Every slot's acceptance from its rows of ``processed [B, N, V]``: a ``CycleRead`` for a drafted tree, the
    chosen token (device ``[]``, ``engine.ar_cycle``'s draw) for a root verified alone, None for an empty slot. On the
    host (``on_host``) each tree runs ``engine.judge``'s float64 walk; on the device every tree is accepted there and
    all the verdicts are read at once (``verify.read_verdicts``: one read per cycle for the whole batch)."""
    out: list[CycleRead | torch.Tensor | None] = [None] * len(slots)
    pending: list[tuple[int, tuple[DraftTree, Verdict, list[torch.Tensor]]]] = []
    for s, st in enumerate(slots):
        if st is None:
            continue
        tree, gate = st.tree, st.policy.gate
        if tree is None:
            out[s] = next_token_tensor(processed[s, 0], sp, st.generator)
        elif on_host:
            out[s] = judge(tree, processed[s, : tree.size], sp, rule, st.generator, gate is not None, acceptance)
        else:
            verdict = accept(tree, processed[s, : tree.size], sp.greedy, st.generator, rule)
            pending.append((s, (tree, verdict, [DraftGate.entropy(verdict.bonus_logits)] if gate is not None else [])))
    if pending:
        for (s, _), read in zip(pending, read_verdicts([p for _, p in pending]), strict=True):
            out[s] = read
    return out


@dataclass
class _Slot:
    """One prompt in flight (``generate_batch``)."""

    key: Any
    generator: torch.Generator | None
    drafter: SlotDrafter
    policy: TreePolicy
    t0: float
    root: torch.Tensor  # [1] the next cycle's root, on the device
    out: torch.Tensor  # the drafter's output at the root [c, H]
    prefill: tuple[Any, Any]  # clock marks
    tokens: list[int] = field(default_factory=lambda: [-1])  # the root's value is read with the first cycle
    cycles: list[CycleRecord] = field(default_factory=list)
    pending: list[CycleOutcome] = field(default_factory=list)
    drafts: list[tuple[Any, Any]] = field(default_factory=list)  # per cycle: drafting marks
    verifies: list[tuple[Any, Any]] = field(default_factory=list)  # per cycle: batched forward + acceptance marks
    forwards: int = 1
    drafter_forwards: int = 1
    bin: int | None = None  # the gate's entropy bin of the next root
    session: DraftSession | None = None  # this cycle's (None: a cycle without drafts)
    tree: DraftTree | None = None


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
    (``copy.deepcopy``), ``drafter``'s weights serve a ``BatchDrafter``; ``acceptance`` as in ``engine.generate``."""
    clock, layout, dev = Clock(bt.device), bt.layout, bt.device
    n_gen = layout.num_gen_tokens
    on_host = acceptance == "host" or (acceptance == "auto" and not accel.is_cuda(dev))
    policies = [copy.deepcopy(policy) for _ in range(bt.B)]
    room_slots = max(policy.max_nodes(), policy.max_draft_slots())
    bd = BatchDrafter(drafter, bt.B, bt.c, bt.capacity + 2 * room_slots)
    stream = iter(items)
    slots: list[_Slot | None] = [None] * bt.B
    zero = torch.zeros(1, dtype=torch.long, device=dev)  # an idle slot's root; a one-node tree's kept node

    def admit(s: int) -> None:
        item = next(stream, None)
        slots[s] = None
        if item is None:
            return
        key, inputs, gen = item
        t0 = clock.now()
        start = clock.mark()
        res = bt.admit(s, inputs)
        root = first_token(res, layout, sp, gen)
        pol = policies[s]
        pol.reset()
        if pol.gate is not None:
            pol.gate.reset()
        out = bd.admit(s, lambda one: prefill_drafter(bt.target, one, res, root, room_slots))
        slots[s] = _Slot(key, gen, SlotDrafter(bd, s), pol, t0, root.view(1), out, (start, clock.mark()))
        if n_gen <= 1:
            finish(s)

    def finish(s: int) -> None:
        st = slots[s]
        assert st is not None
        latency = clock.now() - st.t0
        if st.tokens[0] < 0:  # a one-token image: no cycle read the root
            st.tokens[0] = int(st.root)
        draft_s = sum(clock.seconds(a, b) for a, b in st.drafts)
        verify_s = sum(clock.seconds(a, b) for a, b in st.verifies)
        stats = {} if st.policy.gate is None else {"gated_steps": st.policy.gate.skips}
        res = GenerationResult(st.tokens[:n_gen], st.cycles, latency, clock.seconds(*st.prefill), draft_s, verify_s,
                               st.forwards, st.drafter_forwards, stats)  # fmt: skip
        on_done(st.key, res)
        admit(s)

    for s in range(bt.B):
        admit(s)
    while any(st is not None for st in slots):
        start = clock.mark()
        live = {s: sl for s, sl in enumerate(slots) if sl is not None}
        drafting = {s: sl for s, sl in live.items() if _drafts(sl, n_gen)}
        catching = {s: sl for s, sl in drafting.items() if sl.pending}
        if catching:  # the drafter consumes every drafting slot's committed positions, one forward for all
            outs = bd.extend({s: pending_slots(bt.target, sl.pending) for s, sl in catching.items()})
            for s, sl in catching.items():
                sl.out, sl.pending, sl.drafter_forwards = outs[s], [], sl.drafter_forwards + 1
        steps: dict[int, Steps] = {}
        for s, sl in live.items():
            sl.session = sl.tree = None
            if s in drafting:
                g = len(sl.tokens) - 1
                sl.session = DraftSession(sl.drafter, bt.target, sp, sl.root, g, bt.next_pos[bt.slot_rows(s)], sl.out,
                                          sl.generator, on_host)  # fmt: skip
                steps[s] = sl.policy.propose_steps(sl.session, n_gen - len(sl.tokens) - 1)
        _draft_in_lockstep(bd, live, steps)
        trees: list[SlotTree] = []
        gidx = torch.ones(bt.B, dtype=torch.long)  # generation index of each slot's root + 1
        drafted = clock.mark()
        for s in range(bt.B):
            st = slots[s]
            if st is None:
                trees.append(BatchTarget.idle(zero))
                continue
            gidx[s] = len(st.tokens)
            bd.rollback(s)
            tree = st.tree
            trees.append(BatchTarget.idle(st.root) if tree is None else SlotTree(tree.tokens, tree.ancestor_mask,
                                                                                 tree.depth))  # fmt: skip
            st.drafts.append((start, drafted))
        start = clock.mark()
        next_pos = bt.next_pos.clone()
        raw, feats = bt.forward(trees)
        depth = torch.nn.utils.rnn.pad_sequence([t.depth for t in trees], batch_first=True)
        processed = _processed(bt, raw, gidx.to(dev)[:, None] + depth, sp)
        reads = _accept_all(slots, processed, sp, rule, acceptance, on_host)
        keeps: list[torch.Tensor | None] = []
        in_place: list[bool] = []
        for s, st in enumerate(slots):
            read = reads[s]
            if st is None:
                keeps.append(None)
                in_place.append(True)
            elif isinstance(read, CycleRead):
                keeps.append(read.keep)
                in_place.append(read.acceptance.path[-1] == read.acceptance.accepted)
            else:  # the root alone
                keeps.append(zero)
                in_place.append(True)
        bt.commit(keeps, in_place)
        verified = clock.mark()
        for s, st in enumerate(slots):
            if st is None:
                continue
            rows = bt.slot_rows(s)
            f, pos = feats.index_select(0, rows), next_pos[rows]
            st.forwards += 1
            st.verifies.append((start, verified))
            gate, done = st.policy.gate, reads[s]
            marks = (verified, verified, verified)
            if isinstance(done, CycleRead):
                assert st.session is not None and st.tree is not None
                c = outcome(done, st.tree, f[:, : st.tree.size], pos, st.policy, st.session, marks)
                if gate is not None:
                    gate.observe(st.bin, len(c.tokens))
            else:
                assert isinstance(done, torch.Tensor)
                c = ar_outcome(st.root, done, processed[s, 0], f[:, :1], pos, len(st.tokens) - 1, gate is not None,
                               marks)  # fmt: skip
            if st.tokens[0] < 0:
                st.tokens[0] = c.root
            st.tokens += c.tokens
            st.cycles.append(c.record)
            st.root = c.next_tokens[-1:]
            st.drafter_forwards += c.drafter_forwards
            if gate is not None:
                st.bin = gate.bin_of_entropy(c.entropy) if c.entropy is not None else None
            if len(st.tokens) < n_gen:
                st.pending.append(c)
            else:
                finish(s)
