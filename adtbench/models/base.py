"""The target interface every model adapter implements, and its generic tree bookkeeping.

An adapter implements six model-specific pieces:

- ``encode_prompt(text, cfg)`` → ``PromptInputs`` (tokenisation / text encoding; outside the timed scope);
- ``_prefill(inputs, capacity)`` → ``PrefillResult`` over the prompt rows (cond, and uncond under CFG);
- ``_forward(tokens, mask, position_ids)`` → raw logits ``[R, n, V]`` and features ``[R, n, H]`` of n
  candidate tokens, appending their K/V after the current length, given an explicit 4-D attention mask
  ``[R, 1, n, L + n]`` and explicit position ids ``[R, n]``. The mask is what ``_verify_mask`` builds: boolean
  (True = attend) by default; ``StaticGPTTarget`` overrides it to build the additive form (0 / −inf in the model
  dtype) once per forward, which its network uses in every layer as is;
- ``_compact(start, keep)``: KV compaction after verification (entries ``start + keep`` → ``start..``);
- ``embed_tokens`` / ``lm_head``: the drafter's shared embedding and head (``full_lm_head``: the head over the whole
  vocabulary, for training);
- ``drafter_rope(head_dim)``: the positional scheme a drafter for this target uses.

The base class owns the per-row state that makes CFG rows share one tree: ``length`` (committed KV
entries, equal for all rows), ``valid [R, capacity]`` (which cache columns are real tokens — pad columns
of a left-padded uncond row are not) and ``next_pos [R]`` (the position id of each row's next token).
A tree node at depth d gets position ``next_pos + d`` in every row; its mask row is the row's valid
prefix plus the node's ancestors (the ancestor closure, self included).

Loops that do not decode in raster order (ZipAR, MuLo-SD's resampling) use ``forward_at``: tokens at explicit
generation slots (position ``gen_pos0 + slot``), each attending to the valid prompt prefix plus the generated
cache columns and new tokens an explicit ``allowed`` mask names; ``commit`` then keeps any subset of them. The
cache columns are in feeding order; ``algorithm.raster.RasterCache`` tracks which slot each one holds.

Features are the last-layer hidden states *after* the final norm (EAGLE's ``f_t``).

Raw logits (``_forward``, ``forward_at``, the prefill's, ``lm_head``) are exact on every row the layout's
constraint can let through — the image tokens and the forced tokens (``TokenLayout``) — and only there: a target may
leave the other rows at the dtype's lowest finite value, which ``process_logits`` masks to −inf at every generation
index (finite, not −inf, so that the CFG mix of two such rows is not NaN). ``StaticGPTTarget`` computes its LM head
over those rows only (``logits_head``: 8,192 of Chameleon's 65,536).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from adtbench.layout import TokenLayout
from adtbench.models.rope import Rope
from adtbench.sampling_params import SamplingParams

log = logging.getLogger("adtbench")


@dataclass
class PromptInputs:
    """Model-specific encoded prompt (cond and, under CFG, uncond rows)."""

    text: str
    cfg: bool
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class PrefillResult:
    logits: torch.Tensor  # [R, V] raw logits at the last prompt position (predict generation index 0)
    features: torch.Tensor  # [R, P, H] target features of the prompt positions
    input_embeds: torch.Tensor  # [R, P, H] the target's input embedding at each prompt position
    positions: torch.Tensor  # [R, P] position ids of the prompt positions
    valid: torch.Tensor  # [R, P] bool: real tokens (False on padding)
    ids: torch.Tensor | None = None  # [R, P] token ids of the prompt positions; None: not tokens (a condition)

    def clone(self) -> PrefillResult:
        """A copy whose tensors share no storage with this one's."""
        copies = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return PrefillResult(**{k: None if v is None else v.clone() for k, v in copies.items()})


@dataclass(frozen=True)
class Capabilities:
    """What a target offers beyond the ``Target`` interface: declared by its class (``Target.capabilities``), read by
    the harness (``job.compile_models``, ``harness.batched``) — never probed with ``getattr``. Each family's
    declaration is checked against its behaviour (``tests/test_families.py``)."""

    static_cache: bool = False  # ``request_static``: one pinned KV cache, verifies through static-shape buckets
    graphs: bool = False  # those buckets capture as CUDA graphs (``engine.compile`` on a GPU; ``models.graphs``)
    compile: bool = False  # ``compile_forward``: the network's layer stack through ``torch.compile``
    batch: bool = False  # ``models.batch.BatchTarget`` decodes B prompts per forward over its network


class Target(ABC):
    """A verifiable AR image model (see module docstring)."""

    capabilities: ClassVar[Capabilities] = Capabilities()  # a target declares what it offers (``Capabilities``)
    engine_mode: str = "eager"  # what its forwards run as: eager | compiled | graphs (``job.compile_models`` sets it)
    vq: Any = None  # the VQ image decoder of ``decode_image`` and ``codebook``; None: none (or another route: Tar LM)
    static: Any = None  # the static-shape verifier over the pinned cache (``capabilities.static_cache``); None: off

    layout: TokenLayout
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    supports_cfg: bool = True
    device: torch.device
    dtype: torch.dtype
    plain_decode: PlainDecode | None = None  # the plain AR loop its own unspeculated stage runs (Tar): see PlainDecode

    def __init__(self) -> None:
        self.length = 0
        self.rows = 1
        self.valid = torch.zeros(1, 0, dtype=torch.bool)
        self.next_pos = torch.zeros(1, dtype=torch.long)
        self.gen_pos0 = torch.zeros(1, dtype=torch.long)  # [R] position id of generation index 0
        self.prompt_cols = 0  # cache columns before the first generated one
        self.forwards = 0  # target forward passes since the last prefill (NFE)

    # --- adapter hooks -------------------------------------------------------------------------------
    @abstractmethod
    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs: ...

    @abstractmethod
    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult: ...

    @abstractmethod
    def _forward(
        self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abstractmethod
    def _compact(self, start: int, keep: torch.Tensor) -> None: ...

    @abstractmethod
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def lm_head(self, features: torch.Tensor) -> torch.Tensor: ...

    def full_lm_head(self, features: torch.Tensor) -> torch.Tensor:
        """The LM head over the whole vocabulary (``lm_head`` may leave unreachable rows unset: module docstring);
        what training's soft cross-entropy over the vocabulary reads."""
        return self.lm_head(features)

    def weights(self) -> list[torch.Tensor]:
        """The network's parameters, those a forward reads (the weight-read floor of ``bench probe`` / ``cost``, the
        cost model's cache key); none for a target without a torch network."""
        return []

    @abstractmethod
    def drafter_rope(self, head_dim: int) -> Rope: ...

    @torch.no_grad()
    def decode_image(self, codes: torch.Tensor) -> np.ndarray:
        """VQ codes ``[grid_h, grid_w]`` → uint8 image ``[H, W, 3]`` through ``self.vq`` (override for other paths)."""
        from adtbench.models.vq_common import to_uint8_images

        vq = self.vq
        if vq is None:
            raise RuntimeError(f"{type(self).__name__}: no VQ decoder configured (model.vq)")
        h, w = codes.shape
        pixels = vq.decode_codes(codes.reshape(1, -1).to(self.device), h, w)
        return to_uint8_images(pixels.float().cpu())[0]

    def text_window(self) -> tuple[int, str, Callable[[str], int]] | None:
        """How much of a prompt the text encoder reads: ``(limit, unit, count)`` — ``words`` for word-level encoders
        with ``max_len`` (the mini model, the tiny hash encoder), ``tokens`` for tokenizer encoders with ``max_length``
        (FLAN-T5; ``count(text)`` gives a prompt's length); None for targets that take the whole prompt into their
        context."""
        enc = getattr(self, "text_encoder", None)
        owner = getattr(enc, "__self__", enc)  # a bound ``encode`` method: its module holds the limits
        if owner is None:
            return None
        limit = getattr(owner, "max_len", None) or getattr(getattr(owner, "cfg", None), "max_len", None)
        if isinstance(limit, int):
            return limit, "words", lambda text: len(re.findall(r"[a-z0-9]+", text.lower()))
        limit, tok = getattr(owner, "max_length", None), getattr(owner, "tokenizer", None)
        if isinstance(limit, int) and tok is not None:
            return limit, "tokens", lambda text: len(tok(text, add_special_tokens=True)["input_ids"])
        return None

    def plain_decoder(self) -> PlainDecode:
        """``plain_decode``, or a RuntimeError saying who hands it over (a target running a stage plainly needs it)."""
        if self.plain_decode is None:
            raise RuntimeError(
                f"{type(self).__name__} runs a stage plainly: build it with a plain AR loop "
                "(models.registry.build_target(cfg, plain_decode=algorithm.ar.ar_tokens))"
            )
        return self.plain_decode

    def codebook(self) -> torch.Tensor:
        """The VQ codebook ``[num_codes, d]`` (row c = code c; token id = c + layout.image_token_offset)."""
        vq = self.vq
        if vq is None:
            raise RuntimeError(f"{type(self).__name__} has no VQ model: no codebook for LANTERN neighbourhoods")
        return vq.codebook()

    # --- generic bookkeeping -------------------------------------------------------------------------
    @torch.no_grad()
    def start(self, inputs: PromptInputs, max_tree_nodes: int) -> PrefillResult:
        """Prefill the prompt and reset all per-row state; returns the prompt's logits and features."""
        prompt_len = self.prompt_length(inputs)
        capacity = prompt_len + self.layout.num_gen_tokens + max_tree_nodes
        res = self.prompt_prefill(inputs, capacity)
        rows, plen = res.valid.shape
        self.rows, self.length = rows, plen
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=res.valid.device)
        self.valid[:, :plen] = res.valid
        self.next_pos = res.positions[:, -1] + 1
        self.gen_pos0, self.prompt_cols = self.next_pos.clone(), plen
        self.forwards = 1
        return res

    @abstractmethod
    def prompt_length(self, inputs: PromptInputs) -> int:
        """Number of prompt positions (cache columns) ``_prefill`` will create."""

    def prompt_prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        """The prompt's prefill that ``start`` and a batch's ``admit`` (``models.batch``) run: the adapter's
        ``_prefill`` (a ``StaticGPTTarget`` restores it instead inside ``reuse_prefill``)."""
        return self._prefill(inputs, capacity)

    @torch.no_grad()
    def verify_forward(
        self, tokens: torch.Tensor, tree_mask: torch.Tensor, depth: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward tree nodes ``tokens [n]`` (node 0 = root) with ancestor mask ``[n, n]`` and depths ``[n]``."""
        dev = self.valid.device
        mask = self._verify_mask(tree_mask.to(dev))
        pos = self.next_pos[:, None] + depth.to(dev)[None]
        self.forwards += 1
        return self._forward(tokens.to(dev), mask, pos)

    def _verify_mask(self, tree_mask: torch.Tensor) -> torch.Tensor:
        """``_attention_mask`` of: row r's valid cache prefix, then the tree's ``[n, n]`` ancestor mask."""
        n, L, R = tree_mask.shape[0], self.length, self.rows
        allowed = torch.cat([self.valid[:, None, :L].expand(R, n, L), tree_mask[None].expand(R, n, n)], dim=-1)
        return self._attention_mask(allowed)

    def _attention_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """Boolean ``[R, n, L + n]`` (True = attend) → the mask ``_forward`` takes (here ``[R, 1, n, L + n]``)."""
        return allowed[:, None]

    @torch.no_grad()
    def forward_at(
        self, tokens: torch.Tensor, slots: torch.Tensor, allowed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward ``tokens [n]`` at generation slots ``slots [n]`` (position ``gen_pos0 + slot`` per row).

        ``allowed [n, G + n]`` (bool; G = ``length − prompt_cols`` generated cache columns): which generated
        columns and which of the n new tokens each token attends to (the valid prompt prefix is always attended).
        Their K/V are appended after ``length``; ``commit`` keeps a subset. Returns raw logits ``[R, n, V]`` and
        features ``[R, n, H]``; the output at slot s predicts generation index s + 1.
        """
        dev = self.valid.device
        n, L, P, R = tokens.numel(), self.length, self.prompt_cols, self.rows
        if allowed.shape != (n, L - P + n):
            raise ValueError(f"allowed must be [{n}, {L - P + n}], got {list(allowed.shape)}")
        # generated columns are always valid (``commit`` marks them), so only the prompt prefix needs ``valid``
        prefix = self.valid[:, None, :P].expand(R, n, P)
        mask = self._attention_mask(torch.cat([prefix, allowed.to(dev)[None].expand(R, n, L - P + n)], dim=-1))
        pos = self.gen_pos0[:, None] + slots.to(dev)[None]
        self.forwards += 1
        return self._forward(tokens.to(dev), mask, pos)

    def commit(self, keep: torch.Tensor, in_place: bool = False) -> None:
        """Keep tree nodes ``keep`` (the accepted path, root first; on the device) as the next committed KV entries.
        ``in_place``: the caller knows ``keep`` is ``0 … k−1`` (an AR step, a path of first children), so nothing
        moves. No device value is read."""
        if not in_place:
            self._compact(self.length, keep)
        self.committed(keep.numel())

    def committed(self, k: int, next_pos: torch.Tensor | None = None, marked: bool = False) -> None:
        """The bookkeeping of a commit of ``k`` entries whose K/V already sit at columns ``length …`` (``commit``
        after its move, or a graph that moved them: ``algorithm.tree_step``): valid columns (unless ``marked``: the
        graph marked them), length, positions (``next_pos`` [R]: the graph computed them)."""
        if not marked:
            self._mark_valid(self.length, k)
        self.length += k
        self.next_pos = self.next_pos + k if next_pos is None else next_pos

    def _mark_valid(self, start: int, k: int) -> None:
        self.valid[:, start : start + k].fill_(True)  # fill_: no scalar tensor lifted


PlainDecode = Callable[[Target, PromptInputs, SamplingParams, "torch.Generator | None"], list[int]]
"""A plain AR loop ``(target, inputs, sampling, generator) → the generated token ids`` — ``algorithm.ar.ar_tokens``.
A target whose adapter runs one of its stages unspeculated (Tar: the LM pass before a speculated AR-DTok, the AR-DTok
pass after a speculated LM) is handed one by its builder (``registry.build_target(cfg, plain_decode=...)``): the
models import nothing of the algorithm layer, whose sampling law chooses the tokens."""


class StaticGPTTarget(Target):
    """Target hooks shared by in-project GPTs (LlamaGen, AR-DTok): ``self.net`` exposes ``tok_embeddings``,
    ``output`` and ``forward_embeds(x, pos, mask, cache, start)``; K/V live in a ``StaticKVCache``.

    Masks are additive (0 / −inf, model dtype): ``key_bias [R, capacity]`` holds the committed columns' term (kept up
    to date by ``start`` and ``commit``), so a verify mask is one ``cat`` of it with the tree's block."""

    capabilities: ClassVar[Capabilities] = Capabilities(static_cache=True, graphs=True, compile=True, batch=True)

    net: Any
    cache: Any = None
    key_bias: torch.Tensor | None = None
    image_head = True  # the LM head over the rows the layout can emit only (``logits_head``); False: every row
    _head_weight: tuple[Any, ...] | None = None  # (weight, (storage, dtype, span), its rows' transposed view)
    pinned: Any = None  # the one KV cache every image reuses under ``request_static``
    _pinned_masks: tuple[torch.Tensor, torch.Tensor] | None = None  # ``pinned_masks``
    _pin: tuple[int, bool] | None = None  # (extra prompt columns, capture CUDA graphs): pin at the first prefill
    _warned_unpinned = False
    _reuse: tuple[PromptInputs, dict[int, tuple[PrefillResult, torch.Tensor]]] | None = None  # ``reuse_prefill``'s

    @contextlib.contextmanager
    def reuse_prefill(self, inputs: PromptInputs) -> Iterator[None]:
        """While entered, each prefill of ``inputs`` (this object; ``start``, a batch's ``admit``) after the first at
        a capacity is restored instead of run: a cache as the adapter's ``_prefill`` gets it (``kv_cache``), the
        prompt's K/V copied into its columns 0 … P − 1, and a copy of the first ``PrefillResult`` — the same state
        and values as running it, since a prefill is a deterministic function of (prompt, capacity, weights) and
        writes nothing else (every adapter's ``_prefill``: K/V at those columns of ``kv_cache(R, capacity)``).
        What follows the prefill — the first token's draw from its logits with the image's generator, the drafter's
        start — runs as usual. Decoding never writes the prompt's columns (its writes start at ``length``;
        ``tests/test_prefill_reuse.py``), and the kept K/V is a copy in any case.

        Off unless entered, and entered only where many images of one prompt are drawn untimed (the law tests,
        ``adtbench check``'s law test): never in a timed run (``bench``, the app, the AR baseline), whose prefill is
        part of what it measures (``tests/test_prefill_reuse.py`` checks who enters it). The weights must not change
        while it is entered."""
        if self._reuse is not None:
            raise RuntimeError("reuse_prefill is already entered on this target")
        self._reuse = (inputs, {})
        try:
            yield
        finally:
            self._reuse = None

    def prompt_prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        """``Target.prompt_prefill``; inside ``reuse_prefill(inputs)`` the first prefill at ``capacity`` is kept and
        the later ones restored from it."""
        if self._reuse is None or self._reuse[0] is not inputs:
            return self._prefill(inputs, capacity)
        kept = self._reuse[1].get(capacity)
        if kept is None:
            res = self._prefill(inputs, capacity)
            P = res.valid.shape[1]
            self._reuse[1][capacity] = (res.clone(), self.cache.buf[:, :, :, :P].clone())
            return res
        res, kv = kept
        self.cache = self.kv_cache(res.valid.shape[0], capacity)
        self.cache.buf[:, :, :, : kv.shape[3]] = kv
        return res.clone()

    def request_static(self, graphs: bool, extra_prompt: int = 256) -> None:
        """From the next prefill on, keep one KV cache for every image (capacity: that prefill's plus
        ``extra_prompt`` columns for longer prompts) and verify through static-shape buckets (``models.graphs``);
        with ``graphs`` (CUDA) capture each bucket as a CUDA graph at that prefill — outside any timed scope when
        the first prefill is the warm-up's. ``static.capture_s`` reports the capture time."""
        self._pin = (extra_prompt, graphs)

    def kv_cache(self, rows: int, capacity: int) -> Any:
        """The KV cache an adapter's ``_prefill`` writes: a fresh one, or the pinned one when it fits."""
        from adtbench.models.graphs import StaticVerifier

        if self._pin is not None and self.static is None:
            extra, graphs = self._pin
            self.rows = rows  # the capture's forwards run at this prompt's rows (CFG: 2), before ``start`` sets them
            self.cache = self.pinned = self.net.new_cache(rows, capacity + extra)
            self.static = StaticVerifier(self, rows, capacity + extra)
            if graphs:
                self.static.capture()
                if self.device.type == "cuda":  # a real GPU: route buckets by their measured replay times
                    moved = self.static.route_by(self.static.measure())
                    if moved:
                        log.info(
                            "verify buckets routed by measured replay time: %s (ms: %s)",
                            moved,
                            {b: round(t, 3) for b, t in self.static.replay_ms.items()},
                        )
        if self.static is not None:
            if rows == self.static.rows and capacity <= self.static.capacity:
                return self.pinned
            if not self._warned_unpinned:
                log.warning(
                    "this prompt needs %d KV columns, more than the %d pinned for static verifies: it runs at "
                    "variable shapes (no CUDA graphs)",
                    capacity,
                    self.static.capacity,
                )
                self._warned_unpinned = True
        return self.net.new_cache(rows, capacity)

    @torch.no_grad()
    def verify_forward(
        self, tokens: torch.Tensor, tree_mask: torch.Tensor, depth: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``Target.verify_forward``; through the static buckets when the cache is the pinned one and the tree
        fits a bucket."""
        st = self.static
        if st is None or self.cache is not self.pinned or not st.fits(tokens.numel(), self.length, self.rows):
            return super().verify_forward(tokens, tree_mask, depth)
        dev = self.valid.device
        block = self._tree_block(tree_mask.to(dev))
        pos = self.next_pos[:, None] + depth.to(dev)[None]
        self.forwards += 1
        return st.forward(tokens.to(dev), block, pos, self.length)

    def static_forward(
        self, tokens: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The static-shape forward (``models.graphs``): K/V written at columns ``write [b]``, attention over the
        first K columns of the pinned cache (a capacity bucket) with ``mask [R, 1, b, K]``."""
        x = self.net.tok_embeddings(tokens)[None].expand(self.rows, -1, -1)
        feats = self.net.forward_embeds(x, pos, mask, self.cache, write)
        return self.logits_head(feats), feats

    def head_rows(self) -> tuple[int, int, tuple[int, ...]] | None:
        """``(lo, hi, extra)``: the vocabulary rows the layout's constraint lets through at some generation index —
        the image tokens ``lo … hi − 1`` and the forced tokens ``extra`` (Lumina-mGPT's end-of-line and end-of-image)
        — or None where that is the whole vocabulary (LlamaGen, the mini model, AR-DTok: every token is an image
        token) or ``image_head`` is off."""
        lay = self.layout
        lo, hi = lay.image_token_offset, lay.image_token_offset + lay.num_codes
        extra = tuple(sorted({t for t in (lay.eol_token, lay.eoi_token) if t is not None and not lo <= t < hi}))
        if not self.image_head or hi - lo + len(extra) >= lay.vocab_size:
            return None
        return lo, hi, extra

    def head_span(self) -> tuple[int, int] | None:
        """The contiguous rows ``lo … hi − 1`` of the vocabulary that hold every ``head_rows`` row: those
        ``logits_head`` computes (None: every row)."""
        rows = self.head_rows()
        if rows is None:
            return None
        lo, hi, extra = rows
        lo, hi = min((lo, *extra)), max((hi, *(t + 1 for t in extra)))
        return None if hi - lo >= self.layout.vocab_size else (lo, hi)

    def logits_head(self, feats: torch.Tensor) -> torch.Tensor:
        """Raw logits ``[..., V]`` of features ``[..., D]`` (no grad): ``net.output`` over the contiguous rows that hold
        the ``head_rows`` — one matrix product into those columns (Chameleon: the 8,192 image tokens; Lumina-mGPT:
        up to its end-of-line and end-of-image tokens) — the other rows at the dtype's lowest finite value (module
        docstring). ``process_logits`` then gives the processed logits of the full head, bit for bit where the
        product's sums do not depend on how many rows it computes (float32 on this CPU library:
        ``tests/test_chameleon_lean.py``). Every row under grad mode, or where the span is the whole vocabulary."""
        span, head = self.head_span(), self.net.output
        if span is None or head.bias is not None or torch.is_grad_enabled():
            return head(feats)
        (lo, hi), (V, D) = span, head.weight.shape
        w, cached = head.weight, self._head_weight
        key = (w.data_ptr(), w.dtype, span)  # a move (``to``) swaps the parameter's storage in place
        if cached is None or cached[0] is not w or cached[1] != key:
            cached = self._head_weight = (w, key, w.detach()[lo:hi].t())  # a view of its rows, no copy
        h = feats.reshape(-1, D)
        out = torch.full((h.shape[0], V), torch.finfo(feats.dtype).min, dtype=feats.dtype, device=feats.device)
        torch.mm(h, cached[2], out=out[:, lo:hi])
        return out.view(*feats.shape[:-1], V)

    def start(self, inputs: PromptInputs, max_tree_nodes: int) -> PrefillResult:
        res = super().start(inputs, max_tree_nodes)
        bias = torch.where(self.valid, 0.0, float("-inf")).to(self.dtype)
        if self.cache is self.pinned and self.pinned is not None:  # views of one storage every image: a graph's commit
            valid_p, bias_p = self.pinned_masks()  # marks them in its replay (``algorithm.tree_step``)
            n = self.valid.shape[1]
            valid_p.fill_(False)
            bias_p.fill_(float("-inf"))
            valid_p[:, :n].copy_(self.valid)
            bias_p[:, :n].copy_(bias)
            self.valid, bias = valid_p[:, :n], bias_p[:, :n]
        self.key_bias = bias
        return res

    def pinned_masks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(``valid``, ``key_bias``) over the pinned cache's whole capacity ``[R, C]``: under ``request_static`` an
        image's ``valid`` and ``key_bias`` are views of their first columns (past an image's columns: False / −inf)."""
        if self._pinned_masks is None:
            R, C, dev = self.static.rows, self.static.capacity, self.device
            valid = torch.zeros(R, C, dtype=torch.bool, device=dev)
            self._pinned_masks = (valid, torch.full((R, C), float("-inf"), dtype=self.dtype, device=dev))
        return self._pinned_masks

    def _mark_valid(self, start: int, k: int) -> None:
        super()._mark_valid(start, k)
        assert self.key_bias is not None
        self.key_bias[:, start : start + k].fill_(0.0)

    def _verify_mask(self, tree_mask: torch.Tensor) -> torch.Tensor:
        """Additive ``[R, 1, n, L + n]``: the committed columns' bias, then the tree's ancestor block."""
        assert self.key_bias is not None, "prefill first"
        n, L, R = tree_mask.shape[0], self.length, self.rows
        block = self._tree_block(tree_mask)
        return torch.cat([self.key_bias[:, None, None, :L].expand(R, 1, n, L), block.expand(R, 1, n, n)], -1)

    def _tree_block(self, tree_mask: torch.Tensor) -> torch.Tensor:
        """A tree's ancestor mask ``[n, n]`` in additive form (0 / −inf, model dtype)."""
        return torch.where(tree_mask, 0.0, float("-inf")).to(self.dtype)

    def _attention_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """Additive ``[R, 1, n, L + n]``: 0 where attended, −inf elsewhere (model dtype), built once per forward."""
        from adtbench.models.lean import additive_mask

        return additive_mask(allowed[:, None], self.dtype)

    def _forward(
        self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mask``: boolean or additive ``[R, 1, n, L + n]`` (``net.forward_embeds`` takes either)."""
        assert self.cache is not None, "prefill first"
        x = self.net.tok_embeddings(tokens)[None].expand(self.rows, -1, -1)
        feats = self.net.forward_embeds(x, position_ids, mask, self.cache, self.length)
        return self.logits_head(feats), feats

    def compile_forward(self) -> None:
        """Run the network's inference layer stack through ``torch.compile`` (inductor, dynamic shapes: tree size
        and KV length vary per call) from now on; the eager path stays the reference. Optional, never required."""
        from adtbench.models.lean import compile_stack

        compile_stack(self.net)

    def _compact(self, start: int, keep: torch.Tensor) -> None:
        assert self.cache is not None, "prefill first"
        self.cache.compact(start, keep)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.net.tok_embeddings(ids.to(self.device))

    def weights(self) -> list[torch.Tensor]:
        return list(self.net.parameters())

    def lm_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.logits_head(features)

    def full_lm_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.net.output(features)
