"""The graphed tree verify: a drafted tree's verify forward, logits processing, acceptance and packed verdict as one
CUDA graph replay (``engine.graphs.verify``; ``verify`` holds the law, ``models.graphs`` the bucketed forwards, this
module only their fixed-shape execution for trees).

The eager cycle (``engine.speculative_cycle``) builds the verify mask and positions on the host's command (≈ 35 ops
and 3 transfers), replays the bucket's forward, processes the logits, accepts (``verify.accept``: 50–130 ops) and
packs the verdict for the host's one read (≈ 20 ops): ≈ 120 launches around one replay. Here they are one fixed-shape
function of static device buffers, captured per (node bucket b, attention width K):

- **Inputs** (``TreeStep``, a ``graph_runner.GraphRunner``: one per target bucket and acceptance setting, reused by
  every image — ``runner_for`` — its static buffers): the tree padded to
  b nodes — ``tokens``, ``parents`` (a padded node its own parent), ``depth``, the ancestor mask (padded rows the
  identity), ``alive`` (False past the tree's n nodes: padded nodes are never accepted), the child ranks (−1
  padded; only for the rank loop) and the proposal rows (sampled trees) — the root's generation index, the committed
  length L, the root's positions and the draws; the committed columns' ``valid`` / additive bias are the target's
  pinned masks (``StaticGPTTarget.pinned_masks``: one storage every image, read and written in place).
- **The forward** writes the bucket's inputs from the device length (``StaticVerify.place``) and runs its static
  forward; K/V land at columns L … L + b − 1, past the committed length, as the eager bucketed verify's do.
- **Acceptance** is ``verify.accept_tree`` on the padded tree: the same law as the eager cycle, its uniforms from a
  buffer of b + 1 filled outside the graph from the prompt's own generator (one per node, then the bonus's, drawn by
  inverse CDF: ``verify.Draws``), so the graph holds no random op. Padding changes nothing: a padded node is dead
  (never tried), the child of itself (no real node's sibling, its (parent, token) pair never a real node's residual
  entry — stale parents could repeat one, and ``index_put`` of a repeated index keeps either write) and comes after
  every real node.
- **The verdict** is ``verify.pack_verdict`` at the fixed width b: (accepted + 1, bonus, realised depth,
  live nodes, the gate's entropy where a gate reads it), the node ids in path-first order and their tokens, and the
  committed tokens after the root (``following``); after it, in the same buffer and the same read, a static tree's
  ``readout`` (≤ ``READOUT`` scalars a policy decided in the draft phase: ``budget: cost``'s node count), handed to
  the tree's ``on_read``.
- **The KV commit** (``_commit``): the accepted path's K/V moved to columns L … L + a at the bucket's fixed shape (all
  b columns in path-first order), those columns marked in the target's pinned ``valid`` / ``key_bias`` and the
  positions advanced — inside the replay, so the host only keeps the counters (``Target.committed``). The path's
  features in path-first order (``path_feats``) stay in a static buffer with ``following`` and ``pos0``: the
  drafter's catch-up reads them in its own replay (``drafters.catch_up``, ``CycleRead.slots``).

**Host per cycle** (``verify``): a tree the draft phase built (``DraftTree.static``: its tensors static buffers) is
copied into the step's buffers inside the replay — one graph per (K, those buffers); any other tree by ≈ 10 copies
before it. Then three small writes (g, L, the root's positions), one fill of the draws (sampling only), one replay
(captured the first time it is needed) and one read of the packed verdict.

**Where it runs** (``engine.graphs.verify``): ``auto`` — where the target's verifies are captured as graphs
(``engine.compile=true`` on CUDA or the simulated device), acceptance is on the device and the tree fits a bucket;
``graph`` — also where the buckets are static but not captured (the same function, run eagerly); a ``ConfigError``
naming ``engine.graphs.verify`` where that cannot be (no static buckets, acceptance on the host); ``eager`` — the
op-by-op cycle. One-node trees and trees larger than every bucket take the eager cycle; batched decoding
(``decode.batch_size > 1``) verifies through ``batch_step`` (every slot's tree in one replay). The law is the eager
cycle's; a seed gives other tokens at T > 0 (the bonus by inverse CDF, the uniforms from a buffer of b + 1) and the
same tokens (AR's) when greedy: ``tests/test_tree_step.py``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from adtbench.algorithm.drafters.catch_up import CommittedSlots
from adtbench.algorithm.methods.gate import DraftGate
from adtbench.algorithm.sampling import draw_into, process_logits
from adtbench.algorithm.slot import decides_on_host
from adtbench.algorithm.tree import DraftTree, arange_on, tree_child_ranks
from adtbench.algorithm.verify import (
    VERDICT_HEAD,
    AcceptanceRule,
    CycleRead,
    Draws,
    accept_tree,
    pack_verdict,
    takes_rank_loop,
    unpack_verdict,
)
from adtbench.errors import ConfigError
from adtbench.graph_runner import GraphRunner, runner_for, runners_of
from adtbench.models.base import Target
from adtbench.sampling_params import SamplingParams

READOUT = 4  # float64 scalars a static tree may hand the host in the verdict's read (``DraftTree.readout``)


class TreeStep(GraphRunner):
    """The static buffers and per-width graphs of one (target bucket b, sampling setting, rule, ranks, proposal
    dtype, entropy read) (module docstring): a ``GraphRunner`` keyed by the attention width, graphed where the
    target's verifies are captured."""

    def __init__(
        self,
        target: Any,
        b: int,
        sp: SamplingParams,
        rule: AcceptanceRule,
        ranks: int,
        proposal: torch.dtype | None,
        entropy: bool,
    ) -> None:
        static, dev = target.static, target.device
        super().__init__(dev, graphed=bool(static.captures))  # the target's verifies are captured: so is this step
        self.target, self.b, self.sp, self.rule, self.entropy = target, b, sp, rule, entropy
        self.bucket = static.steps[b]
        self.ranks_n = ranks
        long, buffer = torch.long, self.buffer
        self.tokens = buffer("tokens", (b,), long)
        self.parents = buffer("parents", (b,), long)
        self.own = torch.arange(b, dtype=long, device=dev)
        self.depth = buffer("depth", (b,), long)
        self.eye = torch.eye(b, dtype=torch.bool, device=dev)
        self.anc = self.eye.clone()  # the ancestor mask (padded rows the identity; ``fill`` rewrites it per cycle)
        self.alive = buffer("alive", (b,), torch.bool)
        self.ranks = buffer("ranks", (b, ranks), long, fill=-1) if ranks else None
        V = target.layout.vocab_size
        self.proposal = None if proposal is None else buffer("proposal", (b, V), proposal)
        self.root_gen = buffer("root_gen", (1,), long)
        self.length = buffer("length", (1,), long)
        self.pos0 = buffer("pos0", (static.rows,), long)
        self.valid, self.bias = target.pinned_masks()  # the committed columns [R, C]: the target's, one storage
        self.next_pos = buffer("next_pos", (static.rows,), long)  # the positions after the commit (target.next_pos)
        self.draws = buffer("draws", (b + 1,), torch.float64)
        size = VERDICT_HEAD + int(entropy) + 2 * b
        self.verdict = buffer("verdict", (size + READOUT,), torch.float64)  # what the host reads, at once
        self.packed, self.readout = self.verdict[:size], self.verdict[size:]  # the tree's readout after the verdict
        self.order = buffer("order", (b,), long)  # the node ids, the accepted path first (in node order)
        self.following = buffer("following", (b,), long)  # the committed tokens after the root: the drafts, the bonus
        # the accepted path's K/V moved inside the step (a pinned ``StaticKVCache``): the host keeps the counters
        self.commits = isinstance(getattr(target.cache, "buf", None), torch.Tensor)
        hidden = target.net.tok_embeddings.weight.shape[-1]
        self.path_feats = buffer("path_feats", (static.rows, b, hidden), target.dtype)  # path first (``order``)
        self.source: DraftTree | None = None  # this cycle's tree when its tensors are static buffers (read in-graph)
        self.readout_of: DraftTree | None = None  # this cycle's tree when it hands the host a readout
        self.launches = 0
        self.raw: torch.Tensor | None = None  # the last verify's raw logits [R, b, V] (a static output; tests)

    # --- the cycle's host side ---

    def fill(self, tree: DraftTree, root_gen: int, generator: torch.Generator | None) -> None:
        """Copy ``tree`` (n ≤ b nodes; not when its tensors are static buffers, ``DraftTree.static``: the replay
        copies them) and the target's committed state into the buffers; fill the draws."""
        t = self.target
        self.source = tree if tree.static else None
        self.readout_of = tree if tree.readout is not None else None
        if self.source is None:
            self._copy_tree(tree)
            if tree.readout is not None:  # a static tree's is copied in the replay
                self.readout[: tree.readout.numel()].copy_(tree.readout)
        self.root_gen.fill_(root_gen)
        self.length.fill_(t.length)
        self.pos0.copy_(t.next_pos)
        if not self.sp.greedy:
            draw_into(self.draws, "uniform_", generator)

    def _copy_tree(self, tree: DraftTree) -> None:
        copy_tree(self, tree)

    def launch(self, K: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One verify at attention width ``K``: its graph's replay (keyed by ``K`` and a static tree's storages;
        captured at its first use: the warm-ups and the capture write only outputs, K/V past the committed length and
        the commit's idempotent moves and marks), or the cycle run eagerly where the target's verifies are not graphed
        (``GraphRunner.replay_or_run``). Returns the raw logits ``[R, b, V]`` and features ``[R, b, H]`` (static
        outputs: read before the next launch)."""
        self.launches += 1
        source = self.source
        key = (K, None if source is None else _storages(source))
        out: tuple[torch.Tensor, torch.Tensor] = self.replay_or_run(key, lambda: self._cycle(K, source))
        return out

    def verify(
        self, tree: DraftTree, root_gen: int, generator: torch.Generator | None
    ) -> tuple[CycleRead, torch.Tensor]:
        """Verify ``tree`` (its root at generation index ``root_gen``), commit the accepted path's K/V and read the
        verdict once: the ``CycleRead`` of ``verify.verify_cycle`` (its ``slots``: the committed slots left on the
        device for the drafter's catch-up, ``drafters.catch_up``) and the verified nodes' features ``[R, b, H]``
        (padded: index them by ``keep``). The target is committed when this returns (``Target.commit``'s work: the
        K/V move inside the replay where the cache is a pinned ``StaticKVCache``, its counters on the host)."""
        t, b = self.target, self.b
        self.fill(tree, root_gen, generator)
        self.raw, feats = self.launch(self.bucket._width_for(t.length + b))
        t.forwards += 1
        values = self.verdict.tolist()
        acc, root, tokens, extra = unpack_verdict(values, b, int(self.entropy))
        told = self.readout_of
        if told is not None and told.readout is not None and told.on_read is not None:
            size = self.packed.numel()
            told.on_read(values[size : size + told.readout.numel()])
        k = acc.accepted + 1
        keep = self.order[:k]
        if self.commits:  # moved, marked and the positions advanced in the replay
            t.committed(k, next_pos=self.next_pos, marked=True)
        else:
            t.commit(keep, in_place=acc.path[-1] == acc.accepted)
        # the committed tokens as a view of ``following``: read (the next root) before this step's next verify
        read = CycleRead(acc, root, tokens, keep, self.following[:k], extra, CommittedSlots(self, k))
        return read, feats

    # --- the captured step ---

    def _cycle(self, K: int, source: DraftTree | None) -> tuple[torch.Tensor, torch.Tensor]:
        """What one replay runs: the tree from its static buffers (``source``; else ``fill`` copied it), the
        verify (``_step``), the path's features in path-first order (``path_feats``: the catch-up's input), and the
        KV commit (``_commit``)."""
        if source is not None:
            self._copy_tree(source)
            if source.readout is not None:
                self.readout[: source.readout.numel()].copy_(source.readout)
        raw, feats = self._step(K)
        self.path_feats.copy_(feats.index_select(1, self.order))
        if self.commits:
            self._commit()
        return raw, feats

    def _commit(self) -> None:
        """``Target.commit`` at the bucket's fixed shape: the K/V move of columns L + order[i] → L + i for all b (the
        accepted path first, so columns L … L + a hold it; the rest lie past the committed length, where the next
        verify overwrites them), columns L … L + a marked valid (the target's pinned ``valid`` / ``key_bias``) and the
        positions advanced by a + 1 (``next_pos``). L is the device length: one graph serves every cycle."""
        buf = self.target.cache.buf  # [layers, R, 2·kv, C, d]
        buf.index_copy_(3, self.own + self.length, buf.index_select(3, self.order + self.length))
        k = self.packed[:1].long()  # a + 1
        cols = arange_on(self.bias.shape[1], self.device)
        committed = ((cols >= self.length) & (cols < self.length + k))[None]
        self.valid.masked_fill_(committed, True)
        self.bias.masked_fill_(committed, 0.0)
        torch.add(self.pos0, k, out=self.next_pos)

    def _step(self, K: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed-shape verify (module docstring): everything from the static buffers, nothing read."""
        dev, st, sp = self.device, self.bucket, self.sp
        st.tokens.copy_(self.tokens)
        st.pos.copy_(self.pos0[:, None] + self.depth[None])
        block = torch.where(self.anc, 0.0, float("-inf")).to(st.masks[K].dtype)
        committed = arange_on(K, dev) < self.length  # the bias past L may be an earlier, longer image's
        st.place(self.length, torch.where(committed, self.bias[:, :K], float("-inf")), block, K)
        raw, feats = st._forward_at(K)
        processed = process_logits(raw, self.root_gen + 1 + self.depth, self.target.layout, sp)
        parts = (self.tokens, self.parents, self.depth, self.anc, self.alive, self.ranks, self.proposal)
        packed, order, following = tree_verdict(
            *parts, processed, self.draws, sp.greedy, self.rule, self.entropy, self.ranks_n
        )  # ``ranks_n``: the rank loop's length (its buffer's width); 0 where the loop is not taken
        self.packed.copy_(packed)
        self.order.copy_(order)
        self.following.copy_(following)
        return raw, feats


class TreeBuffers(Protocol):
    """A padded tree's static buffers (b nodes): what ``copy_tree`` writes and ``tree_verdict`` reads. ``own`` /
    ``eye``: ``arange(b)`` and the identity (constants)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    own: torch.Tensor
    depth: torch.Tensor
    eye: torch.Tensor
    anc: torch.Tensor
    alive: torch.Tensor
    ranks: torch.Tensor | None
    proposal: torch.Tensor | None


def copy_tree(dst: TreeBuffers, tree: DraftTree) -> None:
    """``tree`` (n ≤ b nodes) padded to the bucket in ``dst``'s buffers: a padded node its own parent, dead, the
    identity's ancestor row."""
    n = tree.size
    dst.tokens[:n].copy_(tree.tokens)
    dst.parents.copy_(dst.own)  # a padded node its own parent: no (parent, token) pair of a real node's row
    dst.parents[:n].copy_(tree.parents)
    dst.depth[:n].copy_(tree.depth)
    dst.anc.copy_(dst.eye)
    dst.anc[:n, :n].copy_(tree.ancestor_mask)
    if tree.alive is None:
        dst.alive[:n].fill_(True)
    else:
        dst.alive[:n].copy_(tree.alive)
    dst.alive[n:].fill_(False)
    if dst.ranks is not None:
        dst.ranks.fill_(-1)
        # a static source's ranks from its parents now: a replay re-runs this, the cached property would not
        ranks = tree.child_ranks if not tree.static else tree_child_ranks(tree)
        dst.ranks[:n, : ranks.shape[1]].copy_(ranks)
    if dst.proposal is not None:
        assert tree.proposal is not None
        dst.proposal[:n].copy_(tree.proposal)


def tree_verdict(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    anc: torch.Tensor,
    alive: torch.Tensor,
    ranks: torch.Tensor | None,
    proposal: torch.Tensor | None,
    processed: torch.Tensor,
    draws: torch.Tensor,
    greedy: bool,
    rule: AcceptanceRule,
    entropy: bool,
    max_children: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One padded tree's acceptance at its fixed shape (b nodes, processed rows ``[b, V]``, ``draws [b + 1]``), no
    host read: (the packed verdict ``pack_verdict`` at width b — then the gate's entropy where ``entropy`` —, the node
    ids path first ``[b]``, the committed tokens after the root ``[b]``: the path's drafts, then the bonus at a). What
    ``TreeStep`` replays, and ``batch_step`` over every slot at once (``torch.vmap``)."""
    b = tokens.shape[0]
    tree = DraftTree(tokens, parents, 0, proposal=proposal, alive=alive, depth=depth, ancestor_mask=anc,
                     max_children=max_children, child_ranks=ranks)  # fmt: skip
    verdict = accept_tree(tree, processed, greedy, Draws(buffer=draws), rule)
    extra = [DraftGate.entropy(verdict.bonus_logits)] if entropy else []
    packed, order, path_tokens = pack_verdict(tree, verdict, extra, width=b)
    k = verdict.on_path.sum()
    after = arange_on(b, tokens.device)
    drafts = path_tokens.index_select(0, (after + 1).clamp_max(b - 1))
    return packed, order, torch.where(after == k - 1, verdict.bonus, drafts)


def _storages(tree: DraftTree) -> tuple[int, ...]:
    """The data pointers of a static tree's tensors (a graph per source: it reads those addresses)."""
    parts = (tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, tree.alive, tree.proposal, tree._child_ranks,
             tree.readout)  # fmt: skip
    return tuple(-1 if x is None else x.data_ptr() for x in parts)


def step_for(
    target: Target,
    tree: DraftTree,
    sp: SamplingParams,
    rule: AcceptanceRule,
    entropy: bool,
    mode: str,
    acceptance: str,
) -> TreeStep | None:
    """The ``TreeStep`` that verifies ``tree`` (module docstring, "Where it runs"), or None for the eager cycle.
    ``entropy``: the verdict carries the bonus row's entropy (a draft gate reads it); ``mode``:
    ``engine.graphs.verify``; ``acceptance``: ``engine.acceptance``. Raises a ``ConfigError`` naming
    ``engine.graphs.verify`` where ``graph`` cannot run."""
    if mode == "eager":
        return None
    static = getattr(target, "static", None)
    on_host = decides_on_host(acceptance, target.device)
    if mode == "graph" and (static is None or on_host):
        why = "acceptance on the device (engine.acceptance=device, or auto on CUDA)" if on_host else None
        why = why or "a target with static-shape verifies (engine.compile=true on CUDA, or request_static)"
        raise ConfigError("engine.graphs.verify", f"graph needs {why}")
    if static is None or on_host or tree.size < 2 or (mode == "auto" and not static.captures):
        return None
    t: Any = target
    if t.cache is not t.pinned or not static.fits(tree.size, t.length, t.rows):
        return None
    b = static.bucket_for(tree.size, t.length)
    ranks = 0
    if takes_rank_loop(tree, sp.greedy, rule):
        ranks = 1 << max(0, tree.max_children - 1).bit_length()  # a power of two ≥ max_children: few graphs
    proposal = None if tree.proposal is None else tree.proposal.dtype
    key = (b, ranks, proposal, sp, id(rule), entropy)
    return runner_for(static, TreeStep, key, lambda: TreeStep(target, b, sp, rule, ranks, proposal, entropy))


def steps_of(target: Any) -> list[TreeStep]:
    """The ``TreeStep``s made for ``target``'s static buckets so far (their ``launches``, ``graphs``)."""
    static = getattr(target, "static", None)
    return [] if static is None else runners_of(static, TreeStep)


__all__ = ["TreeBuffers", "TreeStep", "copy_tree", "step_for", "steps_of", "tree_verdict"]
