"""EAGLE feature-level drafter (EAGLE-1/2, ``cnets1.Model``), generic over targets.

Slot t of the drafter sequence holds the pair ``(f_t, x_{t+1})``: the target's post-norm feature at
position t and the embedding of the *next* token. ``g_t = layer(fc([e(x_{t+1}); f_t]))`` regresses
``f_{t+1}``, and ``target.lm_head(g_t)`` gives the drafter's distribution of ``x_{t+2}``. The head is the
target's (frozen, shared); the drafter owns ``fc`` and one decoder layer (keys ``fc.*``,
``layers.0.self_attn.{q,k,v,o}_proj``, ``layers.0.mlp.{gate,up,down}_proj``, ``layers.0.post_attention_layernorm``,
optional ``layers.0.input_layernorm`` — EAGLE drops the input norm of layer 0 — and optional per-head q/k LayerNorms
``layers.0.self_attn.{q,k}_norm.{weight,bias} [heads, head_dim]``, LANTERN's Chameleon drafters). The embedding e is
the target's unless the checkpoint stores one (``embed_tokens.weight [vocab, H]``, ``EagleConfig.vocab_size`` > 0:
LANTERN's drafters embed their inputs with their own frozen copy); ``EagleDrafter.embed`` / ``embed_prompt`` are the
one place every caller gets the drafter's input embeddings from. Positions come from the target's own scheme
(``target.drafter_rope``), slot t at the target position of ``f_t``.

Runtime state: a KV cache over the *committed* slots (``length``) plus scratch slots appended while a
policy expands a tree (``scratch``); ``rollback`` discards the scratch after each cycle, so speculative
entries never survive. CFG rows run exactly like the target's rows.

The modules are the reference and the autograd (training) path; under ``no_grad`` ``forward`` runs the same
function through ``lean.decoder_layer`` with inference-only fused weights (q|k|v rows, gate|up rows, RMSNorm
weights folded; ``adtbench.models.lean``). ``extend``/``expand`` build their masks once, in additive form.

Static shapes (``request_static``; ``engine.compile`` on a GPU): one pinned KV cache serves every image, and
``expand`` and the decode loop's ``extend`` run at the buckets of ``models.graphs`` (``StaticDrafter``; their CUDA
graphs on a GPU), computing for the real slots what the variable-shape path computes. The prompt's ``extend``
(with ``valid``) stays variable-shape.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from adtbench import accel
from adtbench.algorithm.drafters.graphed import LevelGraphs
from adtbench.models.graphs import StaticDrafter
from adtbench.models.kv import StaticKVCache
from adtbench.models.lean import (
    InferenceWeights,
    LayerWeights,
    additive_mask,
    compile_stack,
    fold_t,
    interleave_pairs,
    qk_affine,
    stack_fn,
    stack_memo,
)
from adtbench.models.llamagen.gpt import RMSNorm
from adtbench.models.rope import Rope, apply_rope, rotary

if TYPE_CHECKING:
    from adtbench.models.base import PrefillResult, Target

log = logging.getLogger("adtbench")


@dataclass
class EagleConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    fc_bias: bool = True
    attention_bias: bool = False
    input_norm: bool = False
    qk_norm: bool = False  # per-head q/k LayerNorm (LANTERN's Chameleon drafters)
    num_layers: int = 1
    vocab_size: int = 0  # rows of the drafter's own input embedding (LANTERN's stored copy); 0: the target's
    rope_theta: float | None = None  # RoPE θ its checkpoint states (checked against the target's); None: unstated

    def to_dict(self) -> dict:
        return asdict(self)


class HeadLayerNorm(nn.Module):
    """LayerNorm over head_dim with a per-head affine (Chameleon's q/k norm, transformers' ``ChameleonLayerNorm``):
    ``y[h] = (x[h] − mean(x[h])) / √(var(x[h]) + eps) · weight[h] + bias[h]``, weight/bias ``[heads, head_dim]``, eps
    1e-5. Lumina-mGPT's ``[1, head_dim]`` (one row shared by all heads) is expanded on load
    (``drafters.checkpoint``)."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, n, heads, head_dim]
        return F.layer_norm(x, (x.shape[-1],), None, None, self.eps) * self.weight + self.bias


class EagleAttention(nn.Module):
    def __init__(self, c: EagleConfig) -> None:
        super().__init__()
        self.h, self.kv, self.d = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        if c.qk_norm:
            self.q_norm = HeadLayerNorm(c.num_heads, c.head_dim)
            self.k_norm = HeadLayerNorm(c.num_kv_heads, c.head_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        style: str,
        mask: torch.Tensor | None,
        cache: StaticKVCache,
        layer: int,
        start: int,
    ) -> torch.Tensor:
        R, n, _ = x.shape
        q, k = self.q_proj(x).view(R, n, self.h, self.d), self.k_proj(x).view(R, n, self.kv, self.d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin, style)
        k = apply_rope(k.transpose(1, 2), cos, sin, style)
        v = self.v_proj(x).view(R, n, self.kv, self.d).transpose(1, 2)
        k_all, v_all = cache.write(layer, start, k, v)
        if self.kv != self.h:
            k_all = k_all.repeat_interleave(self.h // self.kv, dim=1)
            v_all = v_all.repeat_interleave(self.h // self.kv, dim=1)
        out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        out_proj: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(R, n, -1))
        return out_proj


class EagleMLP(nn.Module):
    def __init__(self, c: EagleConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return y


class EagleLayer(nn.Module):
    def __init__(self, c: EagleConfig, index: int) -> None:
        super().__init__()
        self.self_attn = EagleAttention(c)
        self.mlp = EagleMLP(c)
        if c.input_norm or index > 0:
            self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        style: str,
        mask: torch.Tensor | None,
        cache: StaticKVCache,
        layer: int,
        start: int,
    ) -> torch.Tensor:
        h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        x = x + self.self_attn(h, cos, sin, style, mask, cache, layer, start)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out

    def inference_weights(self, interleave: bool = False) -> LayerWeights:
        """This layer in ``lean.decoder_layer`` form (q|k|v and gate|up fused, RMSNorm weights folded); ``interleave``:
        the q and k rows (and their norms' affine) in interleaved rotary pairs (``lean.interleave_pairs``: a drafter
        whose RoPE pairs halves rotates in one complex product)."""
        a, mlp, post = self.self_attn, self.mlp, self.post_attention_layernorm
        pre = getattr(self, "input_layernorm", None)
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0)
        bias = None
        if a.q_proj.bias is not None:
            bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach()
        qk_norm = qk_affine(getattr(a, "q_norm", None), getattr(a, "k_norm", None))
        if interleave:
            qk, heads = (a.h + a.kv) * a.d, a.h + a.kv
            qkv = torch.cat([interleave_pairs(qkv[:qk], heads, a.d), qkv[qk:]], 0)
            if bias is not None:
                bias = torch.cat([interleave_pairs(bias[:qk], heads, a.d), bias[qk:]])
            if qk_norm is not None:
                qn, kn, eps = qk_norm
                qk_norm = (interleave_pairs(qn, 1, a.d, dim=1), interleave_pairs(kn, 1, a.d, dim=1), eps)
        return LayerWeights(
            qkv=fold_t(qkv, None if pre is None else pre.weight),
            qkv_bias=bias,
            o=fold_t(a.o_proj.weight),
            up=fold_t(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0), post.weight),
            down=fold_t(mlp.down_proj.weight),
            heads=a.h,
            kv_heads=a.kv,
            head_dim=a.d,
            norm_in=pre is not None,
            eps_in=0.0 if pre is None else pre.eps,
            eps_ffn=post.eps,
            qk_norm=qk_norm,
        )


class EagleDrafter(InferenceWeights, nn.Module):
    static: StaticDrafter | None = None  # static-shape buckets over the pinned cache (``request_static``); None: off
    pinned: tuple[StaticKVCache, torch.Tensor, torch.Tensor] | None = None  # (cache, valid, bias) every image reuses
    _pin: tuple[int, bool] | None = None  # (extra columns, capture CUDA graphs): pin at the next reset
    level_graphs: LevelGraphs | None = None  # graphed drafting levels over the pinned cache (graphs only)
    _warned_unpinned = False

    def __init__(self, config: EagleConfig, rope: Rope) -> None:
        super().__init__()
        self.config, self.rope = config, rope
        self.pair_rope = dataclasses.replace(rope, style="interleaved")  # the inference weights' pair order
        self.embed_tokens: nn.Embedding | None = None
        if config.vocab_size > 0:  # frozen, as LANTERN's (its training never updates the copy)
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        self.layers = nn.ModuleList(EagleLayer(config, i) for i in range(config.num_layers))
        self.cache: StaticKVCache | None = None
        self.length = 0
        self.scratch = 0
        self.valid = torch.zeros(1, 0, dtype=torch.bool)

    # --- input embeddings ----------------------------------------------------------------------------
    def embed(self, target: Target, ids: torch.Tensor) -> torch.Tensor:
        """The drafter's input embedding e(x) of token ids ``[...]`` → ``[..., H]``: its own stored table when its
        checkpoint has one (``config.vocab_size`` > 0), else the target's ``embed_tokens``."""
        if self.embed_tokens is None:
            return target.embed_tokens(ids)
        return cast(torch.Tensor, self.embed_tokens(ids.to(self.embed_tokens.weight.device)))

    def embed_prompt(self, target: Target, res: PrefillResult) -> torch.Tensor:
        """e(x) at the prompt positions ``[R, P, H]``: the target's prefill embeddings (``res.input_embeds``), or the
        drafter's own table over the prompt's token ids (``res.ids``) when it has one. Prompt positions that are not
        tokens (``res.ids`` None: LlamaGen's condition, Tar's) keep the target's input embeddings either way."""
        if self.embed_tokens is None or res.ids is None:
            return res.input_embeds
        return self.embed(target, res.ids)

    # --- the network --------------------------------------------------------------------------------
    def forward(
        self,
        embeds: torch.Tensor,
        feats: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        start: int | torch.Tensor,
    ) -> torch.Tensor:
        """Slots ``(feats, embeds) [R, m, H]`` at positions ``[R, m]`` written at ``start`` → outputs ``[R, m, H]``.

        ``mask [R, 1, m, start + m]``: boolean (True = attend) or additive (0 / −inf in the drafter's dtype). Under
        ``no_grad`` ``start`` may also be a long tensor ``[m]`` of the columns written, the mask then additive over
        the first K columns of the cache (``static_forward``).
        """
        assert self.cache is not None
        mask = additive_mask(mask, embeds.dtype)
        x = torch.cat([embeds, feats], dim=-1)
        if torch.is_grad_enabled():  # reference modules (training)
            x = self.fc(x)
            cos, sin = self.rope.cos_sin(pos, x.dtype)
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, self.rope.style, mask, self.cache, i, start)
            return cast(torch.Tensor, x)
        fc_t, fc_b, layers = self.inference_weights()
        R, m, _ = x.shape
        x2 = x.view(R * m, -1)
        x = (torch.mm(x2, fc_t) if fc_b is None else torch.addmm(fc_b, x2, fc_t)).view(R, m, -1)
        c = self.config
        rot = rotary(self.pair_rope, pos, x.dtype, c.num_heads + c.num_kv_heads, c.num_kv_heads)
        out = stack_fn(self)(layers, None, 0.0, x, rot, mask, self.cache, start, memo=stack_memo(self))
        return cast(torch.Tensor, out)

    def _build_inference_weights(self) -> tuple[torch.Tensor, torch.Tensor | None, list[LayerWeights]]:
        b = None if self.fc.bias is None else self.fc.bias.detach()
        interleave = self.rope.style == "half"  # stored in interleaved pairs: one complex product (``forward``)
        layers = [cast(EagleLayer, layer).inference_weights(interleave) for layer in self.layers]
        return fold_t(self.fc.weight), b, layers

    def compile_forward(self) -> None:
        """Run the inference layer stack through ``torch.compile`` (inductor, dynamic shapes) from now on."""
        compile_stack(self)

    def static_forward(
        self, feats: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The static-shape forward (``models.graphs.StaticDraft``): slots ``[R, b, H]`` written at columns
        ``write [b]`` of the pinned cache, attention over its first K columns (a capacity bucket) with the additive
        ``mask [R, 1, b, K]``; outputs ``[R, b, H]``."""
        with torch.no_grad():
            return self.forward(embeds, feats, pos, mask, write)

    def request_static(self, graphs: bool, extra_prompt: int = 256) -> None:
        """From the next ``reset`` on, keep one KV cache (with its ``valid`` / ``bias``) for every image — capacity:
        that reset's plus ``extra_prompt`` slots for longer prompts — and run ``expand`` and the decode loop's
        ``extend`` (``valid`` None) at static-shape buckets over it (``models.graphs.StaticDrafter``); with
        ``graphs`` (CUDA) capture each bucket as a CUDA graph at that reset (``static.capture_s``). A later reset
        that needs more room or other rows runs at variable shapes (one warning). The prompt's ``extend`` and calls
        past the largest bucket or the capacity stay variable-shape. Captured graphs read the inference weights and
        cache of that reset: no parameter may change after it."""
        self._pin = (extra_prompt, graphs)

    # --- runtime state ------------------------------------------------------------------------------
    def fork(self) -> EagleDrafter:
        """A drafter with this one's weights (parameters and inference weights shared, not copied) and runtime state
        of its own: batched decoding drafts every slot with its own KV cache (``algorithm.batch``). A fork runs at
        variable shapes: the pinned cache and static buckets (``request_static``) stay this drafter's."""
        self.inference_weights()  # built once here, shared by every fork while the parameters stay unchanged
        twin = copy.copy(self)
        twin.cache, twin.length, twin.scratch = None, 0, 0
        twin.valid = torch.zeros(1, 0, dtype=torch.bool)
        twin.static, twin.pinned, twin._pin, twin.level_graphs = None, None, None, None
        return twin

    def reset(self, rows: int, capacity: int) -> None:
        p = self.fc.weight
        c = self.config
        if self._pin is not None and self.static is None:
            self._pin_cache(rows, capacity + self._pin[0], self._pin[1])
        if self.pinned is not None and self._pinned_fits(rows, capacity):
            self.cache, self.valid, self.bias = self.pinned
            self.valid.fill_(False)
            self.bias.fill_(float("-inf"))
        else:
            if self.static is not None and not self._warned_unpinned:
                log.warning(
                    "the drafter needs %d KV slots x %d rows, not the %d x %d pinned for its static forwards: this "
                    "image runs it at variable shapes (no CUDA graphs)",
                    capacity,
                    rows,
                    self.static.capacity,
                    self.static.rows,
                )
                self._warned_unpinned = True
            self.cache = StaticKVCache(c.num_layers, rows, c.num_kv_heads, capacity, c.head_dim, p.dtype, p.device)
            self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=p.device)
            # the additive key bias of the committed slots (0 valid / −inf not), kept beside ``valid``: a forward's
            # mask is then one ``cat`` of views, not a boolean mask converted per forward
            self.bias = torch.full((rows, capacity), float("-inf"), dtype=p.dtype, device=p.device)
        self._causal: dict[int, torch.Tensor] = {}
        self.length, self.scratch = 0, 0

    def _pin_cache(self, rows: int, capacity: int, graphs: bool) -> None:
        """Allocate the pinned (cache, valid, bias) and the static buckets over them; capture them with ``graphs``."""
        p, c = self.fc.weight, self.config
        self.cache = StaticKVCache(c.num_layers, rows, c.num_kv_heads, capacity, c.head_dim, p.dtype, p.device)
        valid = torch.zeros(rows, capacity, dtype=torch.bool, device=p.device)
        bias = torch.full((rows, capacity), float("-inf"), dtype=p.dtype, device=p.device)
        self.pinned = (self.cache, valid, bias)
        self.static = StaticDrafter(self, rows, capacity, c.hidden_size, p.dtype, p.device)
        if graphs:  # the captured forwards write K/V into the pinned cache: the next prefill overwrites them
            self.inference_weights()  # built on the current stream, before the graphs read them
            self.static.capture()
            if accel.graphs_supported(p.device):  # tree policies' levels as graphs, captured at first use
                self.level_graphs = LevelGraphs(self, rows, capacity, self.static.widths)  # (``drafters.graphed``)

    def _pinned_fits(self, rows: int, capacity: int) -> bool:
        return self.static is not None and rows == self.static.rows and capacity <= self.static.capacity

    def _static_for(self, m: int, start: int) -> StaticDrafter | None:
        """The static buckets when m slots written from column ``start`` run there (the pinned cache is this image's
        and a bucket holds them within its capacity), else None."""
        st, pinned = self.static, self.pinned
        return st if st is not None and pinned is not None and self.cache is pinned[0] and st.fits(m, start) else None

    def _causal_block(self, m: int) -> torch.Tensor:
        """Additive ``[m, m]``: new slot i sees new slots j ≤ i (cached per m)."""
        t = self._causal.get(m)
        if t is None:
            t = torch.full((m, m), float("-inf"), dtype=self.bias.dtype, device=self.bias.device).triu_(1)
            self._causal[m] = t
        return t

    @torch.no_grad()
    def extend(
        self, feats: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append committed slots (``valid [R, m]``; None: all valid); returns the last slot's output ``[R, H]``
        (it predicts the root's children)."""
        self.rollback()
        R, m = feats.shape[0], feats.shape[1]
        L, dev = self.length, self.valid.device
        st = self._static_for(m, L) if valid is None else None
        if st is not None:  # the decode loop's case at a static-shape bucket
            out = st.forward(feats, embeds, pos, self.bias, self._causal_block(m), L, L)
            self.valid[:, L : L + m].fill_(True)
            self.bias[:, L : L + m].fill_(0.0)
            self.length += m
            return out[:, -1]
        if valid is None:  # the decode loop's case: every committed token is a real position
            mask = torch.cat(
                [self.bias[:, None, None, :L].expand(R, 1, m, L), self._causal_block(m)[None, None].expand(R, 1, m, m)],
                -1,
            ).to(embeds.dtype)
        else:  # slot L+i sees every valid column j ≤ L+i, and always itself
            keys = torch.cat([self.valid[:, :L], valid.to(dev)], 1)  # [R, L + m]
            col = torch.arange(L + m, device=dev)
            row = col[L:, None]
            allowed = ((col <= row) & keys[:, None]) | (col == row)  # [R, m, L + m]
            mask = additive_mask(allowed[:, None], embeds.dtype)
        out = self.forward(embeds, feats.to(embeds.dtype), pos, mask, L)
        if valid is None:
            self.valid[:, L : L + m].fill_(True)
            self.bias[:, L : L + m].fill_(0.0)
        else:
            v = valid.to(dev)
            self.valid[:, L : L + m] = v
            self.bias[:, L : L + m] = torch.where(v, 0.0, float("-inf"))
        self.length += m
        return out[:, -1]

    @torch.no_grad()
    def expand(
        self, feats: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor, slot_mask: torch.Tensor
    ) -> torch.Tensor:
        """Scratch slots for tree nodes. ``slot_mask [m, scratch + m]``: which scratch slots each new one sees —
        boolean (True = attend) or already additive (0 / −inf)."""
        R, m, _ = feats.shape
        L, S = self.length, self.scratch
        slots = additive_mask(slot_mask.to(self.bias.device), self.bias.dtype)
        st = self._static_for(m, L + S)
        if st is not None:
            out = st.forward(feats, embeds, pos, self.bias, slots, L, L + S)
        else:
            mask = torch.cat(
                [self.bias[:, None, None, :L].expand(R, 1, m, L), slots[None, None].expand(R, 1, m, S + m)], -1
            ).to(embeds.dtype)
            out = self.forward(embeds, feats, pos, mask, L + S)
        self.scratch += m
        return out

    def rollback(self) -> None:
        self.scratch = 0
