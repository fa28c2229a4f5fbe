"""B prompts in one target forward: a KV cache with a batch dimension and per-row lengths (batched decoding).

``BatchTarget`` drives a ``StaticGPTTarget``'s network (LlamaGen, mini, the lean Chameleon / Lumina, AR-DTok) for
``slots`` prompts at once. Each slot holds one prompt and its ``c`` CFG rows (1, or 2 under CFG); rows are
CFG-major — row ``k·B + s`` is CFG row k of slot s — so the logits of all slots mix with ``cfg_mix`` in one call
(``view(c, B·n, V)``).

Invariants, per slot s (host ints, and the device copies the forward reads):

- ``length[s]``: committed cache columns of the slot's rows (its prompt, then its committed image tokens). Columns
  past it hold nothing a mask admits: ``key_bias [R, C]`` is 0 exactly on the row's valid committed columns
  (padding of a left-padded uncond row stays −inf) and −inf elsewhere.
- ``next_pos[r]``: the position id of row r's next token.

A forward takes one tree per slot (``SlotTree``: tokens, ancestor mask, depths; a slot with nothing to decode sends
its root again, see ``idle``), pads them to the largest n with inert nodes (self-only attention, depth 0), writes
row r's K/V at its own columns ``length[s] … length[s] + n − 1`` (``lean.decoder_layer`` with per-row columns) and
attends over the first ``max(length) + n`` columns through one additive mask: the row's ``key_bias``, then the
slot's tree block at its own columns. Padding is inert: padded nodes attend only to themselves and write past the
row's length, where nothing is admitted until a commit overwrites it. So a slot's logits are those of the same tree
decoded alone (equal up to float rounding of the batched matmuls; tested in float64).

``commit`` keeps a ragged path per slot (root first) in one gather + one scatter over all layers, then marks the
columns valid; ``admit`` prefills one new prompt into a free slot (the adapter's own ``_prefill`` over a cache of
its own, copied into the slot's rows) while the other slots keep their state — the continuous batching of a
serving engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adtbench.models import graphs
from adtbench.models.base import PrefillResult, PromptInputs, StaticGPTTarget
from adtbench.models.graphs import BUCKETS, _Buckets, _Step, bucket_of


@dataclass
class SlotTree:
    """One slot's nodes for a batched forward: ``tokens [n]`` (node 0 = root), ancestor mask ``[n, n]`` (bool, self
    included), ``depth [n]``; all on the target's device."""

    tokens: torch.Tensor
    mask: torch.Tensor
    depth: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.tokens.numel())


def slot_rows(s: int, slots: int, rows_per_slot: int, device: torch.device) -> torch.Tensor:
    """The rows of slot ``s`` in CFG-major order (row ``k·slots + s``: its CFG row k, cond first)."""
    return torch.arange(rows_per_slot, device=device) * slots + s


def per_row(values: list[int], rows_per_slot: int, device: torch.device) -> torch.Tensor:
    """One value per slot → one per row (CFG-major), as a long tensor on ``device``."""
    return torch.tensor(values, dtype=torch.long).repeat(rows_per_slot).to(device)


def pack_trees(trees: list[SlotTree], N: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Every slot's tree padded to N inert nodes (token 0, depth 0, self-only attention): tokens ``[B, N]``, depths
    ``[B, N]``, ancestor blocks ``[B, N, N]`` (bool)."""
    B = len(trees)
    tokens = torch.zeros(B, N, dtype=torch.long, device=device)
    depth = torch.zeros(B, N, dtype=torch.long, device=device)
    block = torch.eye(N, dtype=torch.bool, device=device).repeat(B, 1, 1)
    for s, t in enumerate(trees):
        n = t.size
        tokens[s, :n], depth[s, :n], block[s, :n, :n] = t.tokens, t.depth, t.mask
    return tokens, depth, block


def row_mask(key_bias: torch.Tensor, cols: torch.Tensor, block: torch.Tensor, width: int) -> torch.Tensor:
    """Additive mask ``[R, 1, M, width]``: row r's committed-column bias ``key_bias [R, ≥ width]`` for every one of its
    M new positions, with ``block [R, M, w]`` (additive) placed at that row's own columns ``cols [R, w]``."""
    R, M = block.shape[0], block.shape[1]
    mask = key_bias[:, None, None, :width].expand(R, 1, M, width).clone()
    mask.scatter_(3, cols[:, None, None, :].expand(-1, 1, M, -1), block[:, None])
    return mask


class BatchTarget:
    """Per-slot state over ``target``'s network (module docstring). ``cfg``: every prompt has a CFG uncond row;
    ``capacity``: cache columns per row (the longest prompt + the image + one tree)."""

    def __init__(self, target: StaticGPTTarget, slots: int, cfg: bool, capacity: int) -> None:
        if not target.capabilities.batch:
            raise TypeError(f"{type(target).__name__}: batched decoding needs a target that declares batch")
        self.target, self.B, self.c, self.capacity = target, slots, (2 if cfg else 1), capacity
        self.rows = self.B * self.c
        self.device, self.dtype, self.layout = target.device, target.dtype, target.layout
        self.cache = target.net.new_cache(self.rows, capacity)
        self.key_bias = torch.full((self.rows, capacity), float("-inf"), dtype=self.dtype, device=self.device)
        self.next_pos = torch.zeros(self.rows, dtype=torch.long, device=self.device)
        self.length = [0] * self.B
        self._len = torch.zeros(self.rows, dtype=torch.long, device=self.device)  # length per row (device copy)
        self._cols = torch.arange(capacity, device=self.device)
        self._slot_rows = [slot_rows(s, self.B, self.c, self.device) for s in range(self.B)]
        self.forwards = 0
        self.static: StaticBatchVerifier | None = None  # ``request_static``: bucketed (and graphed) forwards

    def slot_rows(self, s: int) -> torch.Tensor:
        """The cache rows of slot ``s`` (its CFG rows, cond first; made once, never written)."""
        return self._slot_rows[s]

    # --- prompts ---------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def admit(self, s: int, inputs: PromptInputs) -> PrefillResult:
        """Prefill ``inputs`` into slot ``s`` (whatever it held is dropped); returns the prompt's ``PrefillResult``
        (rows: the slot's CFG rows). One forward of this prompt alone; the other slots are untouched."""
        t = self.target
        P = t.prompt_length(inputs)
        if P + t.layout.num_gen_tokens + 1 > self.capacity:
            raise ValueError(f"prompt of {P} positions does not fit the batch cache ({self.capacity} columns)")
        saved = t.cache
        res = t.prompt_prefill(inputs, P)  # the adapter's own prefill, over a cache of exactly P columns
        own, t.cache = t.cache, saved
        rows = self.slot_rows(s)
        if res.valid.shape[0] != self.c:
            raise ValueError(f"prompt has {res.valid.shape[0]} rows, the batch {self.c} (sampling.cfg_scale)")
        self.cache.buf[:, rows, :, :P] = own.buf[:, :, :, :P]
        self.key_bias[rows] = float("-inf")
        self.key_bias[rows, :P] = torch.where(res.valid, 0.0, float("-inf")).to(self.dtype)
        self.next_pos[rows] = res.positions[:, -1] + 1
        self.length[s] = P
        self._len[rows] = P
        return res

    # --- the batched forward ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, trees: list[SlotTree]) -> tuple[torch.Tensor, torch.Tensor]:
        """One target forward over every slot's tree (one per slot, in slot order). Returns raw logits ``[R, N, V]``
        and features ``[R, N, H]`` (N = the largest tree; rows CFG-major; a slot's nodes past its own n are
        padding, never to be read)."""
        B, c, dev = self.B, self.c, self.device
        if len(trees) != B:
            raise ValueError(f"one tree per slot: {len(trees)} for {B} slots")
        N = max(t.size for t in trees)
        self.forwards += 1
        st = self.static
        if st is not None and st.fits(N, max(self.length)):
            return st.forward(self, trees, N)
        tokens, depth, block = pack_trees(trees, N, dev)
        write = self._len[:, None] + torch.arange(N, device=dev)[None]  # [R, N] each row's own columns
        width = max(self.length) + N  # the columns any row attends
        if width > self.capacity:
            raise RuntimeError(f"KV cache overflow: need {width} > capacity {self.capacity}")
        add = torch.where(block, 0.0, float("-inf")).to(self.dtype).repeat(c, 1, 1)  # [R, N, N]
        mask = row_mask(self.key_bias, write, add, width)
        pos = self.next_pos[:, None] + depth.repeat(c, 1)
        return self.static_forward(tokens, pos, write, mask)

    def static_forward(
        self, tokens: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The network over ``tokens [B, N]`` of every slot at positions ``pos [R, N]``, K/V written at each row's
        columns ``write [R, N]``, attending through ``mask [R, 1, N, width]``: raw logits and features."""
        x = self.target.net.tok_embeddings(tokens).repeat(self.c, 1, 1)
        feats = self.target.net.forward_embeds(x, pos, mask, self.cache, write)
        return self.target.logits_head(feats), feats

    def request_static(self, graphs: bool) -> None:
        """Verify through static-shape buckets over this batch's cache (``StaticBatchVerifier``), captured as CUDA
        graphs now when ``graphs`` (before any prompt is admitted: the capture's writes land in columns that admits and
        commits overwrite before a mask admits them)."""
        self.static = StaticBatchVerifier(self)
        if graphs:
            self.static.capture()

    def commit(self, keeps: list[torch.Tensor | None], in_place: list[bool]) -> None:
        """Keep slot s's tree nodes ``keeps[s]`` (its accepted path, root first, on the device; None: nothing) as its
        next committed columns. ``in_place[s]``: ``keeps[s]`` is ``0 … k−1`` (nothing moves). Reads nothing."""
        k = [0 if kp is None else int(kp.numel()) for kp in keeps]
        moving = [s for s, kp in enumerate(keeps) if kp is not None and not in_place[s]]
        if moving:
            K = max(k[s] for s in moving)
            keep = torch.zeros(self.B, K, dtype=torch.long, device=self.device)
            for s in range(self.B):
                kp = keeps[s]
                if kp is not None and s in moving:
                    keep[s, : k[s]] = kp
                else:  # in place or idle: move columns onto themselves
                    keep[s] = torch.arange(K, device=self.device)
            base = self._len[:, None]
            src, dst = base + keep.repeat(self.c, 1), base + torch.arange(K, device=self.device)[None]
            buf = self.cache.buf  # [layers, R, 2·kv, C, hd]
            shape = (buf.shape[0], self.rows, buf.shape[2], K, buf.shape[4])
            moved = buf.gather(3, src[None, :, None, :, None].expand(shape))
            buf.scatter_(3, dst[None, :, None, :, None].expand(shape), moved)
        add = per_row(k, self.c, self.device)
        lo = self._len[:, None]
        self.key_bias.masked_fill_((self._cols[None] >= lo) & (self._cols[None] < lo + add[:, None]), 0.0)
        self._len += add
        self.next_pos += add
        self.committed(k)

    def committed(self, k: list[int]) -> None:
        """The host's bookkeeping of a commit of ``k[s]`` entries per slot whose K/V moves, valid marks and device
        lengths and positions are done (``commit``'s work, or a graph's: ``algorithm.batch_step``): the slots'
        lengths. Every batched commit ends here, as a target's ends in ``Target.committed``."""
        self.length = [L + n for L, n in zip(self.length, k, strict=True)]

    @staticmethod
    def idle(root: torch.Tensor) -> SlotTree:
        """A one-node tree for a slot with nothing to decode (it is never committed)."""
        one = torch.ones(1, 1, dtype=torch.bool, device=root.device)
        return SlotTree(root.view(1), one, torch.zeros(1, dtype=torch.long, device=root.device))


class StaticBatchVerify(_Step[tuple[torch.Tensor, torch.Tensor]]):
    """One bucket of b nodes per slot over a ``BatchTarget``'s cache: static tokens ``[B, b]``, positions and
    written columns ``[R, b]``, the mask ``[R, 1, b, K]`` (the eager forward's, over the first K columns: the
    smallest of the attention ``widths`` holding the longest slot's columns); ``graphs`` after ``capture_widths`` (a
    ``graph_runner.GraphRunner``, as every bucket). Padding is the eager forward's (``pack_trees``): inert."""

    def __init__(self, bt: BatchTarget, b: int, widths: tuple[int, ...]) -> None:
        super().__init__(bt.device)
        dev = self.device
        self.bt, self.b = bt, b
        self.tokens = torch.zeros(bt.B, b, dtype=torch.long, device=dev)
        self.pos = torch.zeros(bt.rows, b, dtype=torch.long, device=dev)
        self.cols = torch.arange(b, device=dev)
        self.write = self.cols[None].repeat(bt.rows, 1)
        self._pad_block = torch.full((b, b), float("-inf"), dtype=bt.dtype, device=dev).fill_diagonal_(0.0)
        self._init_masks(bt.rows, widths)  # before the first load: each row sees its own column (no NaN rows)

    def load(self, trees: list[SlotTree]) -> None:
        bt, b = self.bt, self.b
        self.width = self._width_for(max(bt.length) + b)
        tokens, depth, block = pack_trees(trees, b, bt.device)
        self.tokens.copy_(tokens)
        torch.add(bt._len[:, None], self.cols[None], out=self.write)
        add = torch.where(block, 0.0, float("-inf")).to(bt.dtype).repeat(bt.c, 1, 1)
        self.masks[self.width].copy_(row_mask(bt.key_bias, self.write, add, self.width))
        self.pos.copy_(bt.next_pos[:, None] + depth.repeat(bt.c, 1))

    def _forward_at(self, K: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.bt.static_forward(self.tokens, self.pos, self.write, self.masks[K])


class StaticBatchVerifier(_Buckets):
    """All buckets of one ``BatchTarget`` (``BatchTarget.request_static``), each at the attention widths of
    ``graphs.capacity_buckets``: ``forward`` pads every slot's tree to the bucket of the largest, runs it and returns
    the first N nodes' logits and features (copies)."""

    def __init__(self, bt: BatchTarget, buckets: tuple[int, ...] = BUCKETS) -> None:
        self.capacity = bt.capacity
        self.buckets = tuple(b for b in buckets if b <= bt.capacity)
        self.widths = graphs.capacity_buckets(bt.capacity)
        self.steps = {b: StaticBatchVerify(bt, b, self.widths) for b in self.buckets}

    def fits(self, n: int, longest: int) -> bool:
        """The trees' largest size ``n`` has a bucket whose padding stays in every row's cache (``longest``: the
        longest slot's committed columns)."""
        b = bucket_of(n, self.buckets)
        return b is not None and longest + b <= self.capacity

    def forward(self, bt: BatchTarget, trees: list[SlotTree], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = bucket_of(n, self.buckets)
        assert b is not None
        step = self.steps[b]
        step.load(trees)
        logits, feats = step.run()
        return logits[:, :n].clone(), feats[:, :n].clone()
