"""Batched Jacobi decoding (``methods.jacobi.loop``): B prompts per target forward, a ragged window per slot."""

from __future__ import annotations

from typing import Any

import torch

from adtbench.algorithm.methods.jacobi.loop import JacobiParams, JacobiState
from adtbench.algorithm.methods.jacobi.windows import make_sizer
from adtbench.algorithm.records import Clock, GenerationResult
from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.slot import SlotStream, Timing, decides_on_host
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, AcceptanceRule, CycleRead
from adtbench.models.base import PromptInputs
from adtbench.sampling_params import SamplingParams

# --------------------------------------------------------------------------------------------------------
# batched decoding: B prompts per target forward, a ragged window per slot
# --------------------------------------------------------------------------------------------------------


@torch.no_grad()
def generate_jacobi_batch(
    bt: Any,
    items: Any,
    sp: SamplingParams,
    params: JacobiParams,
    on_done: Any,
    rule: AcceptanceRule = EXACT,
    acceptance: str = "auto",
    window: int | None = None,
) -> None:
    """Jacobi decoding of ``items`` (``(key, inputs, generator)``) through the ``bt.B`` slots of a ``BatchTarget``
    (``models.batch``), continuous batching (``slot.SlotStream``); ``on_done(key, GenerationResult)`` per prompt in
    completion order.

    Every slot keeps its own window (sized by its own sizer), accepted length and generator: one forward verifies
    every slot's chain, padded to the longest (``BatchTarget.forward``), and each slot commits its own accepted path
    (ragged) — never the batch minimum, as the SJD reference does. A slot makes the calls and the draws of a B = 1
    decode of its prompt (``decode_jacobi``), in the same order, so its tokens are B = 1's up to the float rounding
    of the batched forward. ``init: drafter`` is not batched (refused by the harness)."""
    from adtbench.algorithm.ar import first_token
    from adtbench.models.batch import BatchTarget, SlotTree

    clock, layout, dev = Clock(bt.device), bt.layout, bt.device
    on_host = decides_on_host(acceptance, dev)
    zero = torch.zeros(1, dtype=torch.long, device=dev)

    def start(s: int, inputs: PromptInputs, gen: torch.Generator | None) -> JacobiState:
        root = first_token(bt.admit(s, inputs), layout, sp, gen)
        return params.state_type.start(root, layout, params, make_sizer(params, layout, window), sp, bt.dtype, gen)

    def result(st: JacobiState, timing: Timing) -> GenerationResult:
        timing.stop(clock)
        return timing.result(clock, st.tokens[: layout.num_gen_tokens], st.cycles, 0, st.stats())

    stream = SlotStream(bt.B, items, clock, start, lambda st: st.done, result, on_done)
    slots = stream.slots
    while stream.busy:
        start_mark = clock.mark()
        trees: list[Any] = []
        chains: list[tuple[DraftTree, torch.Generator | None] | None] = []
        first = [0] * bt.B  # the generation index of each slot's first prediction
        for s, sl in enumerate(slots):
            if sl is None:
                trees.append(BatchTarget.idle(zero))
                chains.append(None)
                continue
            sl.state.plan()
            tree = sl.state.tree()
            trees.append(SlotTree(tree.tokens, tree.ancestor_mask, tree.depth))
            chains.append((tree, sl.state.generator))
            first[s] = sl.state.g + 1
        gidx = torch.tensor(first, dtype=torch.long, device=dev)
        drafted = clock.mark()
        raw, _ = bt.forward(trees)
        depth = torch.nn.utils.rnn.pad_sequence([t.depth for t in trees], batch_first=True)
        _, N, V = raw.shape
        gen_idx = (gidx[:, None] + depth).reshape(-1)
        processed = process_logits(raw.view(bt.c, bt.B * N, V), gen_idx, layout, sp).view(bt.B, N, V)
        states = [None if sl is None else sl.state for sl in slots]
        reads = params.state_type.verify_batch(states, chains, processed, sp, rule, acceptance, on_host)
        in_place = [sl is None or not isinstance(r, CycleRead) or sl.state.in_place(r) for sl, r in zip(slots, reads)]
        bt.commit([r.keep if isinstance(r, CycleRead) else None for r in reads], in_place)
        verified = clock.mark()
        for s, sl in enumerate(slots):
            read, chain = reads[s], chains[s]
            if sl is None or chain is None:
                continue
            assert isinstance(read, CycleRead)
            sl.state.advance(read, processed[s, : chain[0].size])
            sl.timing.forwards += 1
            sl.timing.drafts.append((start_mark, drafted))
            sl.timing.verifies.append((drafted, verified))
            if sl.state.done:
                stream.finish(s)


__all__ = ["generate_jacobi_batch"]
