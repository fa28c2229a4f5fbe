"""The graphed batched verify: every slot's tree through the batch's verify forward, logits processing, acceptance,
packed verdict and ragged KV commit as one graph replay (``decode.batch_size > 1`` under ``engine.compile``; the
B = 1 step is ``tree_step``, whose pieces — ``copy_tree``, ``tree_verdict`` — this module reuses).

The eager batched cycle (``batch.generate_batch``) pads the slots' trees on the host (``models.batch.pack_trees``:
a Python loop of copies), replays the bucket's forward, processes the logits, accepts each slot's tree op by op
(``slot.verify_slots``: 50–130 ops a slot), packs every verdict for one read and commits the ragged paths (a gather
and a scatter over all layers, built per cycle). Here they are one fixed-shape function of static buffers, captured
per (node bucket b, attention width K) for the batch's B slots:

- **Inputs** (``BatchTreeStep``, a ``graph_runner.GraphRunner``: one per batch bucket and acceptance setting,
  ``runner_for`` its ``StaticBatchVerifier``): every slot's tree padded to b nodes — ``tokens``, ``parents``,
  ``depth``, ancestor masks, ``alive``, child ranks and proposal rows where the rank loop / a proposal needs them
  (``[B, b, …]``; padding as ``tree_step``'s: a padded node its own parent, dead, self-only) — each slot's root
  generation index, whether its path is committed (``active``: 0 for an idle slot), ``b + 1`` uniforms per slot
  (sampling only; filled from the slot's own generator outside the graph) and the rows' committed lengths and next
  positions (``len_in``, ``pos_in``: copies of the batch's, so a replay never reads what it writes).
- **The forward** writes the bucket's inputs (``StaticBatchVerify``'s buffers: tokens, each row's own columns
  ``len_in + i``, the mask — the row's ``key_bias``, then its slot's tree block —, positions ``pos_in + depth``) and
  runs its static forward; the logits of every slot are processed in one call.
- **Acceptance** is ``tree_step.tree_verdict`` — ``verify.accept_tree`` and ``pack_verdict`` on one padded tree —
  vectorised over the slots by ``torch.vmap``: one set of kernels for all B trees, not a loop of B. The same law as
  the eager cycle: each slot's uniforms are its own (one per node, then the bonus's by inverse CDF,
  ``verify.Draws``), so the graph holds no random op. A slot whose root is verified alone (no drafts: no room or a
  gate's AR step) is a one-node tree padded with dead nodes: no child is tried and the bonus is drawn from (or the
  argmax of) the root's row — the law of ``engine.ar_cycle``'s draw.
- **The verdict**: one float64 row per slot (``pack_verdict`` at width b, the gate's entropy where one reads it,
  then the tree's ``readout``: ``budget: cost``'s node count, copied in by ``fill``), read by the host at once: one
  read per cycle for the whole batch.
- **The KV commit** inside the replay: row r's columns ``L + order[i] → L + i`` for all b (the accepted path first;
  the rest lie past the committed length), columns ``L … L + a`` marked in ``key_bias`` and the rows' lengths and
  positions advanced by ``(a + 1) · active`` (``BatchTarget._len`` / ``next_pos``); the host's ``length`` in
  ``BatchTarget.committed``, where every batched commit ends.

Every write is idempotent given the inputs (the forward rewrites the columns the commit permutes; lengths and
positions are ``*_in`` plus the path), so the two warm-ups and the capture of a graph at its first use leave the
state of one run.

**Host per cycle**: each drafted tree's ≈ 7 copies into its slot's buffers (4 for a root alone, none for an idle
slot), its uniforms, one transfer of the root indices and activity, two copies of the lengths, one replay, one read
and one copy of the committed tokens (they outlive the next replay in the drafter's pending slots).

**The drafter's catch-up** (``BatchCatchUp``, the B = 1 ``drafters.catch_up`` at B > 1): each slot's committed
slots stay in the step's buffers (``path_feats``: each row's features, its path first; ``following``; ``pos_in``) as
a ``BatchSlots`` pending entry, and the next cycle's catch-up of every drafting slot is one more replay, per (slot
bucket m, attention width W), over the ``BatchDrafter``'s cache: one transfer of the slots' drafter lengths and
path lengths, one replay. A slot that does not catch up before the step's next verify (a gate's AR step) gets its
entry as tensors first (``BatchSlots.materialised``); two pending cycles take the eager ``extend``.

**Where it runs** (``engine.graphs.verify``): ``auto`` and ``graph`` — where the batch's verify buckets are captured
(``engine.compile=true`` on CUDA or the simulated device: ``BatchTarget.request_static``), acceptance is on the
device, the largest tree fits a bucket (a cycle of roots alone takes the two-node one) and the slots' drafted trees
agree on having a proposal;
``eager`` — the op-by-op batched cycle. Elsewhere the eager batched cycle runs. Greedy: the eager cycle's tokens
(AR's); T > 0: the same law, other tokens for a seed (the bonus by inverse CDF): ``tests/test_batch_step.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.drafters.catch_up import CommittedSlots, catch_up_mask
from adtbench.algorithm.records import Acceptance
from adtbench.algorithm.sampling import draw_into, process_logits
from adtbench.algorithm.tree import DraftTree, arange_on
from adtbench.algorithm.tree_step import READOUT, copy_tree, tree_verdict
from adtbench.algorithm.verify import VERDICT_HEAD, AcceptanceRule, CycleRead, takes_rank_loop, unpack_verdict
from adtbench.graph_runner import GraphRunner, runner_for, runners_of
from adtbench.models.batch import BatchTarget, row_mask
from adtbench.models.graphs import BUCKETS, bucket_of, capacity_buckets
from adtbench.sampling_params import SamplingParams

SlotCase = tuple[DraftTree | None, torch.Tensor, int, torch.Generator | None] | None
"""A slot's verify: (its tree — None for the root alone —, the root ``[1]``, the root's generation index, its
generator), or None for an idle slot."""


@dataclass
class SlotRows:
    """Slot s's rows of a ``BatchTreeStep``'s buffers (views): a ``tree_step.TreeBuffers`` for ``copy_tree``."""

    tokens: torch.Tensor
    parents: torch.Tensor
    own: torch.Tensor
    depth: torch.Tensor
    eye: torch.Tensor
    anc: torch.Tensor
    alive: torch.Tensor
    ranks: torch.Tensor | None
    proposal: torch.Tensor | None


class BatchTreeStep(GraphRunner):
    """The static buffers and per-width graphs of one (batch bucket b, sampling setting, rule, ranks, proposal dtype,
    entropy read) (module docstring): a ``GraphRunner`` keyed by the attention width, graphed where the batch's
    verifies are captured."""

    def __init__(
        self,
        bt: BatchTarget,
        b: int,
        sp: SamplingParams,
        rule: AcceptanceRule,
        ranks: int,
        proposal: torch.dtype | None,
        entropy: bool,
    ) -> None:
        assert bt.static is not None
        self.st = bt.static.steps[b]
        super().__init__(bt.device, graphed=self.st.graphed)  # the batch's verifies are captured: so is this step
        self.bt, self.b, self.sp, self.rule, self.ranks_n, self.entropy = bt, b, sp, rule, ranks, entropy
        B, R, dev, long, buffer = bt.B, bt.rows, bt.device, torch.long, self.buffer
        self.tokens = buffer("tokens", (B, b), long)
        self.parents = buffer("parents", (B, b), long)
        self.depth = buffer("depth", (B, b), long)
        self.anc = buffer("anc", (B, b, b), torch.bool)
        self.alive = buffer("alive", (B, b), torch.bool)
        self.ranks = buffer("ranks", (B, b, ranks), long, fill=-1) if ranks else None
        V = bt.layout.vocab_size
        self.proposal = None if proposal is None else buffer("proposal", (B, b, V), proposal)
        self.host_in = buffer("host_in", (2 * B,), long)  # the roots' generation indices, then the slots' activity
        self.root_gen, self.active = self.host_in[:B], self.host_in[B:]
        self.draws = buffer("draws", (B, b + 1), torch.float64)
        self.len_in = buffer("len_in", (R,), long)
        self.pos_in = buffer("pos_in", (R,), long)
        self.width = VERDICT_HEAD + int(entropy) + 2 * b
        # what the host reads, at once: each slot's packed verdict, then its tree's readout (``DraftTree.readout``)
        self.verdict = buffer("verdict", (B, self.width + READOUT), torch.float64)
        self.order = buffer("order", (B, b), long)  # each slot's node ids, its accepted path first
        self.following = buffer("following", (B, b), long)  # each slot's committed tokens after its root
        hidden = bt.target.net.tok_embeddings.weight.shape[-1]
        self.path_feats = buffer("path_feats", (R, b, hidden), bt.dtype)  # each row's features, its path first
        own = torch.arange(b, dtype=long, device=dev)
        eye = torch.eye(b, dtype=torch.bool, device=dev)
        self.anc.copy_(eye.expand(B, b, b))  # a slot never filled attends to itself only (no all −inf row)
        self.first = own == 0  # a root alone: the root live, every padded node dead
        self.rows = [
            SlotRows(self.tokens[s], self.parents[s], own, self.depth[s], eye, self.anc[s], self.alive[s],
                     None if self.ranks is None else self.ranks[s],
                     None if self.proposal is None else self.proposal[s])
            for s in range(B)
        ]  # fmt: skip
        self.launches = 0
        self.raw: torch.Tensor | None = None  # the last verify's raw logits [R, b, V] (a static output; tests)
        self.following_copy = self.following
        self.verifies = 0  # which verify a ``BatchSlots`` came from (its buffers hold only the last one's)

    # --- the cycle's host side ---

    def fill(self, cases: list[SlotCase]) -> None:
        """Every slot's tree (or root alone) padded into its rows, its uniforms (sampling), the roots' generation
        indices, the slots' activity and the rows' lengths and positions."""
        host = [0] * (2 * self.bt.B)
        for s, case in enumerate(cases):
            if case is None:  # idle: its rows keep what they hold; nothing of it is committed or read
                continue
            tree, root, g, gen = case
            rows = self.rows[s]
            if tree is None or tree.size == 1:  # the root alone (a one-node tree: its root)
                rows.tokens[:1].copy_(root)
                rows.parents.copy_(rows.own)
                rows.anc.copy_(rows.eye)
                rows.alive.copy_(self.first)
                if rows.ranks is not None:
                    rows.ranks.fill_(-1)
            else:
                copy_tree(rows, tree)
            if tree is not None and tree.readout is not None:
                self.verdict[s, self.width : self.width + tree.readout.numel()].copy_(tree.readout)
            if not self.sp.greedy:
                draw_into(self.draws[s], "uniform_", gen)
            host[s], host[self.bt.B + s] = g, 1
        self.host_in.copy_(torch.tensor(host, device=self.device))
        self.len_in.copy_(self.bt._len)
        self.pos_in.copy_(self.bt.next_pos)

    def launch(self, K: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One batched verify at attention width ``K``: its graph's replay (captured at its first use), or the step
        run eagerly where the batch's verifies are not graphed. Returns the raw logits ``[R, b, V]`` and features
        ``[R, b, H]`` (static outputs)."""
        self.launches += 1
        out: tuple[torch.Tensor, torch.Tensor] = self.replay_or_run(K, lambda: self._cycle(K))
        return out

    def verify(self, cases: list[SlotCase]) -> tuple[list[CycleRead | None], torch.Tensor, torch.Tensor]:
        """Verify every slot's case (``SlotCase``) in one replay, commit each active slot's path and read all the
        verdicts at once. Returns per slot its ``CycleRead`` (None: idle), the verified nodes' features ``[R, b, H]``
        and the rows' positions before the commit ``[R]`` (static: index them before the next verify)."""
        bt, b = self.bt, self.b
        self.fill(cases)
        self.verifies += 1
        self.raw, feats = self.launch(self.st._width_for(max(bt.length) + b))
        bt.forwards += 1
        values = self.verdict.tolist()
        following = self.following_copy = self.following.clone()  # they outlive the next replay (the root, pending)
        reads: list[CycleRead | None] = []
        ks = [0] * bt.B
        for s, case in enumerate(cases):
            if case is None:
                reads.append(None)
                continue
            acc, root, tokens, extra = unpack_verdict(values[s], b, int(self.entropy))
            tree = case[0]
            if tree is None:  # the root alone: one node, no depth
                acc = Acceptance([0], acc.bonus)
            elif tree.readout is not None and tree.on_read is not None:
                tree.on_read(values[s][self.width : self.width + tree.readout.numel()])
            k = ks[s] = acc.accepted + 1
            slots = BatchSlots(self, k, s, self.following_copy)
            reads.append(CycleRead(acc, root, tokens, self.order[s, :k], following[s, :k], extra, slots))
        bt.committed(ks)  # moved, marked and the lengths and positions advanced in the replay
        return reads, feats, self.pos_in

    # --- the captured step ---

    def _cycle(self, K: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What one replay runs (module docstring): the forward, the processing, every slot's verdict, the commit."""
        bt, st, b, c, B = self.bt, self.st, self.b, self.bt.c, self.bt.B
        st.tokens.copy_(self.tokens)
        torch.add(self.len_in[:, None], st.cols[None], out=st.write)
        block = torch.where(self.anc, 0.0, float("-inf")).to(bt.dtype).repeat(c, 1, 1)
        st.masks[K].copy_(row_mask(bt.key_bias, st.write, block, K))
        st.pos.copy_(self.pos_in[:, None] + self.depth.repeat(c, 1))
        raw, feats = st._forward_at(K)
        V = raw.shape[-1]
        gen_idx = (self.root_gen[:, None] + 1 + self.depth).reshape(-1)
        processed = process_logits(raw.view(c, B * b, V), gen_idx, bt.layout, self.sp).view(B, b, V)
        sp, rule, entropy, ranks = self.sp, self.rule, self.entropy, self.ranks_n

        def one(
            tokens: torch.Tensor,
            parents: torch.Tensor,
            depth: torch.Tensor,
            anc: torch.Tensor,
            alive: torch.Tensor,
            child_ranks: torch.Tensor | None,
            proposal: torch.Tensor | None,
            rows: torch.Tensor,
            draws: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            parts = (tokens, parents, depth, anc, alive, child_ranks, proposal, rows, draws)
            return tree_verdict(*parts, sp.greedy, rule, entropy, ranks)

        args = (self.tokens, self.parents, self.depth, self.anc, self.alive, self.ranks, self.proposal, processed,
                self.draws)  # fmt: skip
        packed, order, following = accel.vmap(one, tuple(None if a is None else 0 for a in args))(*args)
        self.verdict[:, : self.width].copy_(packed)
        self.order.copy_(order)
        self.following.copy_(following)
        H = feats.shape[-1]
        self.path_feats.copy_(feats.gather(1, self.order.repeat(c, 1)[:, :, None].expand(-1, -1, H)))
        self._commit(packed[:, 0].long() * self.active)
        return raw, feats

    def _commit(self, k: torch.Tensor) -> None:
        """``BatchTarget.commit`` at the bucket's fixed shape for every slot, ``k [B]`` its committed columns (a + 1,
        0 when idle): row r's columns ``L + order[i] → L + i`` for all b, columns ``L … L + k − 1`` marked valid, the
        lengths and positions advanced by k (``len_in`` / ``pos_in`` + k: idempotent)."""
        bt, b, c = self.bt, self.b, self.bt.c
        k_rows = k.repeat(c)  # rows CFG-major: row j·B + s is slot s's
        base = self.len_in[:, None]
        buf = bt.cache.buf  # [layers, R, 2·kv, C, hd]
        shape = (buf.shape[0], bt.rows, buf.shape[2], b, buf.shape[4])
        src = (base + self.order.repeat(c, 1))[None, :, None, :, None].expand(shape)
        buf.scatter_(3, (base + self.st.cols[None])[None, :, None, :, None].expand(shape), buf.gather(3, src))
        cols = bt._cols[None]
        bt.key_bias.masked_fill_((cols >= base) & (cols < base + k_rows[:, None]), 0.0)
        torch.add(self.len_in, k_rows, out=bt._len)
        torch.add(self.pos_in, k_rows, out=bt.next_pos)


@dataclass
class BatchSlots(CommittedSlots):
    """Slot ``s``'s a + 1 committed slots of a ``BatchTreeStep``'s verify (``verify``: which one), left in the step's
    buffers for the drafter's catch-up (``batch_catch_up``); ``following``: that verify's committed tokens (a copy).
    Valid until the step's next verify: ``materialised`` before it when the slot did not catch up."""

    s: int = 0
    following: torch.Tensor | None = None
    verify: int = 0

    def __post_init__(self) -> None:
        self.verify = self.step.verifies

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features ``[c, k, H]``, positions ``[c, k]``, next tokens ``[k]``): the pending cycle's eager form."""
        step, k = self.step, self.k
        assert self.following is not None and step.verifies == self.verify, "a stale batched verify's slots"
        rows = step.bt.slot_rows(self.s)
        return step.path_feats[rows, :k], step.pos_in[rows][:, None] + arange_on(k, step.device)[None], \
            self.following[self.s, :k]  # fmt: skip

    @staticmethod
    def materialised(pending: list[Any]) -> list[Any]:
        """``pending`` with every ``BatchSlots`` as its tensors (copies: before the step's next verify)."""
        return [p.tensors() if isinstance(p, BatchSlots) else p for p in pending]


class BatchCatchUp(GraphRunner):
    """The batched drafter's catch-up after a ``BatchTreeStep`` verify as one replay (``drafters.catch_up`` at
    B > 1), keyed by (step, slot bucket m, attention width W): every catching slot's k = a + 1 committed slots — the
    step's path features, the embeddings of its committed tokens, positions ``pos_in + i`` — written at its rows'
    columns L … L + m − 1 (L: the slot's drafter length), each new slot i seeing the committed columns
    (``key_bias``) and new slots j ≤ i; the output at slot k − 1 into ``outs`` (other rows keep theirs) and columns
    L … L + k − 1 marked. A slot that is not catching (k = 0) writes past its length only. Idempotent (the mask
    past L reads no mark), so the warm-ups and the capture leave one run's state. The eager ``BatchDrafter.extend``
    computes the same rows from the same mask entries (up to its narrower width: columns −inf)."""

    def __init__(self, bd: Any, graphed: bool) -> None:
        super().__init__(bd.device, graphed=graphed)
        self.bd = bd
        self.host_in = self.buffer("host_in", (bd.R + bd.B,), torch.long)  # rows' drafter lengths, then slots' k
        self.dlen, self.k = self.host_in[: bd.R], self.host_in[bd.R :]
        self.outs = self.buffer("outs", (bd.R, bd.single.config.hidden_size), bd.dtype)
        self.widths = capacity_buckets(bd.capacity)

    def run(self, target: Any, step: BatchTreeStep, ks: dict[int, int]) -> dict[int, torch.Tensor] | None:
        """Catch up slots ``ks`` (slot → k) from ``step``'s last verify in one replay; returns each one's drafter output
        at its new root ``[c, H]``, or None where no bucket holds it (the eager ``extend`` runs)."""
        bd = self.bd
        m = bucket_of(max(ks.values()), BUCKETS)
        W = None if m is None else next((w for w in self.widths if w >= max(bd.length) + m), None)
        if m is None or W is None or m > step.b:
            return None
        self.host_in.copy_(torch.tensor(bd.length * bd.c + [ks.get(s, 0) for s in range(bd.B)], device=self.device))
        self.launch(target, step, m, W)
        for s, k in ks.items():
            bd.scratch[s] = 0
            bd.length[s] += k
        return {s: self.outs[bd.rows(s)] for s in ks}

    def launch(self, target: Any, step: BatchTreeStep, m: int, W: int) -> torch.Tensor:
        """The replay of (``step``, m, W) (``GraphRunner.replay_or_run``: captured at its first use)."""
        key = (id(step), m, W, id(target))
        out: torch.Tensor = self.replay_or_run(key, lambda: self._program(target, step, m, W))
        return out

    def _program(self, target: Any, step: BatchTreeStep, m: int, W: int) -> torch.Tensor:
        """The fixed-shape catch-up (class docstring): reads the step's buffers and the drafter's, writes ``outs``,
        the drafter's cache columns L … L + m − 1 of every row and its ``key_bias`` at L … L + k − 1."""
        bd, dev, dt = self.bd, self.device, self.bd.dtype
        ar = arange_on(m, dev)
        k_rows = self.k.repeat(bd.c)  # rows CFG-major: row j·B + s is slot s's
        feats = step.path_feats[:, :m].to(dt)
        embeds = bd.single.embed(target, step.following[:, :m]).to(dt).repeat(bd.c, 1, 1)
        rel = arange_on(W, dev)[None] - self.dlen[:, None]  # [R, W]: column − L
        causal = (rel[:, None] >= 0) & (rel[:, None] <= ar[None, :, None])  # [R, m, W]: columns L … L + i
        mask = catch_up_mask(rel[:, None], causal, bd.key_bias[:, None, :W])
        out = bd.net.forward(embeds, feats, step.pos_in[:, None] + ar[None], mask.to(dt)[:, None],
                             self.dlen[:, None] + ar[None])  # fmt: skip
        last = (k_rows - 1).clamp_min(0)[:, None, None].expand(-1, 1, out.shape[-1])
        self.outs.copy_(torch.where(k_rows[:, None] > 0, out.gather(1, last)[:, 0], self.outs))
        cols = arange_on(bd.capacity, dev)[None] - self.dlen[:, None]
        bd.key_bias.masked_fill_((cols >= 0) & (cols < k_rows[:, None]), 0.0)
        return self.outs


def batch_catch_up(target: Any, bd: Any, pending: dict[int, list[Any]]) -> dict[int, torch.Tensor] | None:
    """The drafter's catch-up of every catching slot (``pending``: slot → its pending cycles) as one replay, or None
    for the eager ``BatchDrafter.extend``: each slot's one pending cycle is the last verify of one graphed
    ``BatchTreeStep`` (``BatchSlots``)."""
    firsts = [p[0] for p in pending.values() if len(p) == 1 and isinstance(p[0], BatchSlots)]
    if len(firsts) != len(pending):
        return None
    step = firsts[0].step
    if not step.graphed or any(x.step is not step or x.verify != step.verifies for x in firsts):
        return None
    runner = runner_for(bd, BatchCatchUp, None, lambda: BatchCatchUp(bd, step.graphed))
    return runner.run(target, step, {s: p[0].k for s, p in pending.items()})


def batch_step_for(
    bt: BatchTarget,
    trees: list[DraftTree | None],
    sp: SamplingParams,
    rule: AcceptanceRule,
    entropy: bool,
    mode: str,
    on_host: bool,
) -> BatchTreeStep | None:
    """The ``BatchTreeStep`` that verifies this cycle's ``trees`` (one per live slot, None for a root alone; module
    docstring, "Where it runs"), or None for the eager batched cycle. ``mode``: ``engine.graphs.verify``."""
    static = bt.static
    if mode == "eager" or on_host or static is None:
        return None
    real = [t for t in trees if t is not None and t.size > 1]
    n = max([2, *(t.size for t in real)])  # two nodes at least (``accept_tree``'s): a root alone is padded
    if not static.fits(n, max(bt.length)):
        return None
    b = bucket_of(n, static.buckets)
    assert b is not None
    if not static.steps[b].graphed or any((t.proposal is None) != (real[0].proposal is None) for t in real):
        return None
    ranks = 0
    if any(takes_rank_loop(t, sp.greedy, rule) for t in real):
        ranks = 1 << max(0, max(t.max_children for t in real) - 1).bit_length()  # a power of two: few graphs
    elif not real and not sp.greedy:  # roots alone: a relaxed rule's rank loop reads child ranks (all −1 here)
        ranks = 1
    proposal = None if not real or real[0].proposal is None else real[0].proposal.dtype
    key = (b, ranks, proposal, sp, id(rule), entropy)
    return runner_for(static, BatchTreeStep, key, lambda: BatchTreeStep(bt, b, sp, rule, ranks, proposal, entropy))


def batch_steps_of(bt: BatchTarget) -> list[BatchTreeStep]:
    """The ``BatchTreeStep``s made for ``bt``'s buckets so far (their ``launches``, ``graphs``)."""
    return [] if bt.static is None else runners_of(bt.static, BatchTreeStep)


__all__ = ["BatchCatchUp", "BatchSlots", "BatchTreeStep", "SlotCase", "SlotRows", "batch_catch_up", "batch_step_for",
           "batch_steps_of"]  # fmt: skip
