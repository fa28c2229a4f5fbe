"""The batched draft phase: every drafting slot's levels, reranks and trees of a batched cycle as ONE graph replay,
with ONE drafter forward per level for all slots (``decode.batch_size > 1``; the B = 1 phase is ``draft_phase``).

At B = 1 a policy queues its level programs into a ``DraftPhase`` and the phase replays them as one graph
(``drafters.draft_phase``); a level program drafts through ``LevelGraphs.expand``, a generator that yields the level's
drafter inputs (``LevelRequest``) and receives the forward's outputs, so the forward is its driver's. Here the driver
is the batch's:

- each slot has its own ``SlotLevels`` (a ``LevelGraphs`` over slot s of the ``BatchDrafter``: its node outputs,
  slot ancestry, root, root positions and program buffers — the B = 1 state, so the policies' programs run unchanged);
  its ``DraftPhase.run`` yields the phase instead of replaying it;
- ``BatchPhase.run`` takes every drafting slot's phase and replays, per combined key (each slot's phase key and the
  attention width K; captured at the key's second use, run eagerly at its first; at most ``MAX_GRAPHS`` kept), one
  program that advances every slot's levels in lockstep: round j gathers each slot's j-th level request, runs ONE
  forward of the batch drafter over all rows and one LM head and logits processing (``_forward``), sends each slot
  its rows, and the slots' programs go on to their next request or their tree.

The batched forward (rows CFG-major: row k·B + s is CFG row k of slot s, ``BatchDrafter``'s layout): M = the largest
m of the round; slot s's m nodes padded to M, written at columns ``L_s + S_s + i`` (L_s its committed drafter length,
S_s its scratch slots before the level); its mask over the first K columns is the batch's committed ``key_bias`` with
the nodes' ancestry rows scattered at columns ``L_s + 0 … L_s + S_s + m − 1``, each padded row admitting its own
column only. A slot without a request this round (done drafting, not drafting, idle) is all padding, written past its
scratch. Exactness: a real node attends exactly the columns of ``BatchDrafter.expand`` (the eager lockstep) — its
committed columns and its ancestors' scratch slots —, the extra columns −inf (an exact 0 in the softmax's sum), so
each slot's tree equals the eager batched lockstep's (tested in float64); padded rows write only columns no real
node admits (scratch past the slot's live slots, rewritten before any later level admits them).

Host per cycle: each drafting slot's load (``SlotLevels.begin``: the root's output, token and positions — three
device writes), its draws for sampled drafts (into static buffers, from its own generator, before the replay), one
transfer of every slot's drafter length and root generation index, one replay. The trees are views of the slots'
static buffers (``DraftTree.static``), read by the batched verify's replay.

A slot drafts through here only when its policy's levels are graphed (the same switches as B = 1:
``engine.graphs.levels``, the batch's captured verify buckets under ``engine.compile``) and its tree fits the cache;
otherwise it drafts op by op in the eager lockstep (``algorithm.batch``), and both kinds mix in one cycle. ``budget:
cost`` chooses each slot's node count inside the phase, as at B = 1 (``policies.eagle2._cost_tree``); it reaches the
host in the slot's row of the batched verdict (``DraftTree.readout``, ``batch_step``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from adtbench.algorithm.drafters.draft_phase import DraftPhase
from adtbench.algorithm.drafters.graphed import LevelGraphs, LevelRequest
from adtbench.algorithm.drafters.session import Lockstep
from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.tree import arange_from
from adtbench.graph_runner import GraphRunner
from adtbench.models.graphs import capacity_buckets

if TYPE_CHECKING:
    from adtbench.algorithm.drafters.batch import BatchDrafter, SlotDrafter
    from adtbench.algorithm.drafters.session import DraftSession


MAX_GRAPHS = 64
"""The batched phases' graphs kept at once (each holds its capture's memory on a GPU): combined keys multiply every
slot's tree shapes, and ADT-Tree's change per cycle."""


class SlotLevels(LevelGraphs):
    """Slot ``s``'s graphed levels in a batch (module docstring): ``LevelGraphs``'s state for one slot, its forward
    the batch's. Its drafter length and root generation index are views of the owner's ``host_in`` (one transfer for
    all slots per cycle); reallocating a program buffer or the state drops the owner's graphs too (they read them)."""

    batched = True
    phases = True  # always: its levels run only inside the batch's phase

    def __init__(self, owner: BatchPhase, drafter: SlotDrafter, s: int) -> None:
        bd = owner.bd
        super().__init__(drafter, bd.c, bd.capacity, owner.widths, weights=bd.net)
        self.owner, self.s = owner, s
        self.length, self.root_gen = owner.lengths[s], owner.gens[s]
        self.g = 0  # the root's generation index this cycle (host)

    def fits(self, slots: int) -> bool:
        """Room for ``slots`` scratch slots and a padded level after the slot's committed ones."""
        return bool(self.drafter.length + slots + self.owner.room <= self.capacity)

    def begin(self, session: DraftSession) -> None:
        """Load the cycle (``LevelGraphs.begin``): the root's output, token and positions; L and g reach the device
        with the other slots' (``BatchPhase.run``)."""
        self.L, self.g = self.drafter.length, session.root_gen
        root, row = session.outputs[:, 0], self.outputs[:, 0]
        row.copy_(root)
        self.root.copy_(session.root_token)
        self.root_pos.copy_(session.root_pos)

    def forward(self, req: LevelRequest) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError("a batched slot's levels run in its batch's phase (BatchPhase.run)")

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, fill: float = 0) -> torch.Tensor:
        old = self._buffers.get(name)
        buf = super().buffer(name, shape, dtype, fill)
        if old is not None and buf is not old:
            self.owner.graphs.clear()
        return buf

    def drop(self) -> None:
        super().drop()
        self.owner.graphs.clear()


class BatchPhase(GraphRunner):
    """Every drafting slot's draft phase as one replay per (slots' phase keys, K) over a ``BatchDrafter`` (module
        docstring). ``slots[s]``: slot s's ``SlotLevels``; ``room``: the largest level a policy drafts (a padded level's
        room past a slot's scratch); ``replays`` counts the batched phases replayed, ``eager_runs`` those run eagerly (a
    combined key's first use), ``captures`` the graphs captured."""

    def __init__(self, bd: BatchDrafter, drafters: list[SlotDrafter], room: int) -> None:
        super().__init__(bd.device)
        self.bd, self.room = bd, room
        self.widths = capacity_buckets(bd.capacity)
        self.host_in = self.buffer("host_in", (2 * bd.B,), torch.long)  # the slots' drafter lengths, then their g
        self.lengths, self.gens = self.host_in[: bd.B], self.host_in[bd.B :]
        self.slots = [SlotLevels(self, d, s) for s, d in enumerate(drafters)]
        self.seen: set[Any] = set()  # the combined keys run once (``launch``)

    def run(self, phases: dict[int, DraftPhase]) -> dict[int, Any]:
        """Replay the slots' ``phases`` (slot → its queued phase) as one graph, captured at the combined key's second
        use (``launch``; the first runs the program eagerly, ``first_use``); returns each slot's tree tensors (static
        buffers of its ``SlotLevels``)."""
        bd = self.bd
        self.host_in.copy_(torch.tensor(bd.length + [self.slots[s].g for s in range(bd.B)], device=self.device))
        K = self._width(phases)
        key = (tuple((s, p.key) for s, p in sorted(phases.items())), K)
        if self.graphed and key not in self.graphs and key not in self.seen:
            self.seen.add(key)
            return self.first_use(phases, K)
        return self.launch(key, phases, K)

    def first_use(self, phases: dict[int, DraftPhase], K: int | None) -> dict[int, Any]:
        """A combined key's first use: its program run eagerly (``eager_runs``). A combined key is a tuple of every
        slot's tree shape, so policies whose shape changes per cycle (ADT-Tree's (D, K)) meet many keys once: a
        capture costs about three runs of the program (two warm-ups, the capture) and holds its memory, this one."""
        self.eager_runs += 1
        return self._program(phases, K)

    def launch(self, key: Any, phases: dict[int, DraftPhase], K: int | None) -> dict[int, Any]:
        """The replay of ``key`` = (the slots' phase keys, K) (``GraphRunner.replay_or_run``: captured now if new; at
        most ``MAX_GRAPHS`` kept, the least recently replayed released first)."""
        graph = self.graphs.pop(key, None)
        if graph is not None:
            self.graphs[key] = graph  # the most recent last
        elif len(self.graphs) >= MAX_GRAPHS:
            del self.graphs[next(iter(self.graphs))]
        out: dict[int, Any] = self.replay_or_run(key, lambda: self._program(phases, K))
        return out

    def _width(self, phases: dict[int, DraftPhase]) -> int | None:
        """The attention width holding every round's columns: ``L_s + S_s + M`` for every slot (a request's S, or the
        slot's scratch when it has none), M the round's largest m; None when no slot drafts."""
        bd = self.bd
        ends = {s: p.ends for s, p in phases.items()}
        rounds = max(map(len, ends.values()), default=0)
        if rounds == 0:
            return None
        need = 0
        for j in range(rounds):
            starts = {s: e[j - 1] if j > 0 else 0 for s, e in ends.items() if len(e) > j}
            M = max(ends[s][j] - S for s, S in starts.items())
            for s in range(bd.B):
                e = ends.get(s)
                S = starts[s] if s in starts else e[-1] if e else bd.scratch[s]
                need = max(need, bd.length[s] + S + M)
        K = next((w for w in self.widths if w >= need), None)
        if K is None:
            raise RuntimeError(f"drafter KV overflow: a batched draft phase needs {need} > capacity {bd.capacity}")
        return K

    def _program(self, phases: dict[int, DraftPhase], K: int | None) -> dict[int, Any]:
        """Every slot's phase program at width K, in lockstep: each round one batched forward for the slots' requests
        (module docstring). Returns slot → its tree tensors."""
        slots: Lockstep[LevelRequest, Any] = Lockstep({s: p.program(K) for s, p in phases.items()})
        scratch = dict.fromkeys(phases, 0)  # a slot's scratch slots so far (its phase starts with none)
        while slots.pending:
            assert K is not None
            outs = self._forward(slots.pending, scratch, K)
            for s, req in list(slots.pending.items()):
                scratch[s] = req.S + req.m
                slots.send(s, outs[s])
        return slots.done

    def _forward(
        self, reqs: dict[int, LevelRequest], scratch: dict[int, int], K: int
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """One batch-drafter forward of every row for the slots' requests, then one LM head and one logits processing
        for all rows (module docstring); ``scratch``: the scratch slots of the slots drafting in this phase (past which
        a slot without a request writes). Returns slot → its outputs ``[c, m, H]`` and children's log-probs
        ``[m, V]``."""
        bd, dev = self.bd, self.device
        c, B = bd.c, bd.B
        M = max(r.m for r in reqs.values())
        feats, embeds, pos, writes, masks = [], [], [], [], []
        for s in range(B):
            L, r = self.lengths[s], reqs.get(s)
            S, m = (r.S, r.m) if r is not None else (scratch.get(s, bd.scratch[s]), 0)
            if r is not None:
                pad = M - m
                feats.append(torch.nn.functional.pad(r.feats, (0, 0, 0, pad)) if pad else r.feats)
                embeds.append(torch.nn.functional.pad(r.embeds, (0, 0, 0, pad)) if pad else r.embeds)
                pos.append(torch.nn.functional.pad(r.pos, (0, pad)) if pad else r.pos)
            else:
                zeros = _zeros(c, M, bd.single.config.hidden_size, bd.dtype, dev)
                feats.append(zeros)
                embeds.append(zeros)
                pos.append(_zeros(c, M, None, torch.long, dev))
            block = _padded_block(m, M, S, bd.dtype, dev).clone()  # [M, S + M]: padded rows see their own column
            if r is not None:
                block[:m, : S + m] = r.rows[:, : S + m]
            writes.append(L + arange_from(S, S + M, dev))
            cols = (L + arange_from(0, S + M, dev))[None, None, None].expand(c, 1, M, S + M)
            mask = bd.key_bias.index_select(0, bd.rows(s))[:, None, None, :K].expand(c, 1, M, K).clone()
            masks.append(mask.scatter_(-1, cols, block[None, None].expand(c, 1, M, S + M)))
        rows = lambda xs: torch.stack(xs, 1).flatten(0, 1)  # noqa: E731  [c, …] per slot → [c·B, …] CFG-major
        write = torch.stack(writes).repeat(c, 1)  # [R, M]
        with torch.no_grad():
            out = bd.net.forward(rows(embeds), rows(feats), rows(pos), rows(masks), write)
        target, layout, sp = next(iter(reqs.values())).head
        first = next(iter(reqs))  # a slot without a request takes its generation indices (in the table's range)
        gen = [self.gens[s if s in reqs else first] + (reqs[s if s in reqs else first].level + 1) for s in range(B)]
        gen_idx = torch.stack(gen)[:, None].expand(B, M).reshape(-1)
        raw = target.lm_head(out).view(c, B * M, -1)
        lp = process_logits(raw, gen_idx, layout, sp).log_softmax(-1).view(B, M, -1)
        out = out.view(c, B, M, -1)
        return {s: (out[:, s, : r.m], lp[s, : r.m]) for s, r in reqs.items()}


def drafts_in_phases(requests: dict[int, Any]) -> dict[int, DraftPhase]:
    """The slots whose request is a queued draft phase (``DraftPhase.run`` of a batched slot)."""
    return {s: r for s, r in requests.items() if isinstance(r, DraftPhase)}


@lru_cache(maxsize=256)
def _padded_block(m: int, M: int, S: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[M, S + M]``: −inf but a padded row's own column (row i ≥ m: column S + i) (cached, never written)."""
    out = torch.full((M, S + M), float("-inf"), dtype=dtype, device=device)
    if m < M:
        out[m:, S + m :] = torch.full((M - m, M - m), float("-inf"), dtype=dtype, device=device).fill_diagonal_(0.0)
    return out


@lru_cache(maxsize=256)
def _zeros(c: int, M: int, H: int | None, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros ``[c, M, H]`` (``[c, M]`` for H None) (cached, never written)."""
    return torch.zeros((c, M) if H is None else (c, M, H), dtype=dtype, device=device)


__all__ = ["BatchPhase", "SlotLevels", "drafts_in_phases"]
