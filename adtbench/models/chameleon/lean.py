"""The Chameleon LM (Anole, Lumina-mGPT) on the project's lean stack: fused inference weights, a static KV cache.

``ChameleonLM`` computes the function of transformers' ``ChameleonModel`` + ``lm_head`` (``swin_norm=False``, the
7B layout) through ``lean.lean_stack``, the kernels the in-project GPTs and the EAGLE drafter use. Per layer, with
``x`` the residual stream:

    h = x + o(SDPA(rope(LN_q(q)), rope(LN_k(k)), v; mask)),  q|k|v = RMSNorm(x)·W_qkvᵀ
    x' = h + down(silu(gate) ⊙ up),                           gate|up = RMSNorm(h)·W_13ᵀ

and after the last layer the final RMSNorm (the features) and ``lm_head`` (``output``: raw logits over the whole
vocabulary; the image-token constraint is ``TokenLayout``'s, applied by ``process_logits``, exactly as on the HF path,
which calls ``lm.model`` + ``lm.lm_head`` and never the ``forward`` that masks image logits). The target
(``LeanChameleonTarget``) multiplies by the image-token rows of ``output`` only (``StaticGPTTarget.logits_head``).

Numerics, chosen so that the lean path equals the HF path to float rounding in float32 and float64:

- RMSNorm statistics in float32 whatever the model dtype (HF's ``x.to(float32)``; ``lean.rms(dtype=float32)``),
  then cast back and scaled. The RMSNorm weights are folded into the projection that follows
  (``(x̂ ⊙ w)·Wᵀ = x̂·(W·diag w)ᵀ``), so only the folded products are stored.
- q/k norm: ``lean.HeadLayerNorm`` — LayerNorm over head_dim (eps 1e-5, no affine) then the per-head affine
  ``[heads, head_dim]``; checkpoints storing ``(d0, head_dim)`` (Lumina-mGPT) are expanded at load
  (``hf_checkpoint.expand_qk_norm``, models.md §1.4).
- RoPE: ``Rope1D`` (θ from the config, HF ``rotate_half`` pairing — stored interleaved: the q and k rows of
  ``wqkv`` and the q/k norms' affine are reordered head by head so that pair i is dims 2i, 2i + 1, which changes no
  attention score and makes the rotation one complex product, ``lean.interleave_pairs``; the K cache holds that
  order), angles and cos/sin in float32 whatever the
  model dtype (HF's rotary embedding forces float32); a float64 model multiplies by those float32 values cast
  to float64, as HF does. Half models rotate in float32 (HF rounds cos/sin to the half type first: equal up to
  half-precision rounding).
- Attention: SDPA with the additive 0/−inf mask (HF's ``sdpa`` takes ``finfo.min``: the same weights, exactly 0
  on blocked columns), default scale ``head_dim^-½``; grouped K/V heads repeated as HF's ``repeat_kv``.

Weights (one copy): q|k|v rows fused and input-norm-folded into ``wqkv [(H + 2·KV)·hd, D]``, gate|up fused and
post-attention-norm-folded into ``w13 [2F, D]``, ``wo``, ``w2``, the q/k norms, the final norm weight, the
embedding and the head. The loaders build them layer by layer and drop each layer's HF-layout tensors once fused,
so the peak is one layer above the model (the 7B bf16 model is 14 GB).

Loading: ``load_chameleon_net`` reads an HF folder (safetensors shards, the real on-disk layout: the same
checks as ``hf_checkpoint.load_chameleon_lm`` through ``open_chameleon_checkpoint``), tensor by tensor straight
onto the device; ``lean_from_hf`` converts an in-memory ``ChameleonForConditionalGeneration`` (``random_init``:
the same seeded weights as the HF path), emptying it as it goes. Architectures this module does not implement
(``swin_norm``, biases, RoPE scaling, another activation) are a ``ConfigError`` on ``model.impl``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.models.kv import StaticKVCache
from adtbench.models.lean import (
    FusedBlock,
    HeadLayerNorm,
    InferenceWeights,
    LayerWeights,
    additive_mask,
    assemble,
    frozen,
    fuse_llama_layer,
    interleave_pairs,
    llama_layer_shapes,
    qk_affine,
    stack_fn,
    stack_memo,
)
from adtbench.models.rope import Rope1D, Rotary, rotary

QK_NORM_EPS = 1e-5  # transformers' ChameleonLayerNorm hard-codes it
NORM_DTYPE = torch.float32  # HF's RMSNorm and rotary tables are float32 whatever the model dtype


@dataclass(frozen=True)
class ChameleonArch:
    """The sizes ``ChameleonLM`` needs, read from a ``ChameleonConfig``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_config(cls, config: Any, key: str = "model.impl") -> ChameleonArch:
        """Sizes of ``config``; a feature the lean path does not implement is a ``ConfigError`` on ``key``."""
        from adtbench.models.hf_causal import _rope_theta

        act = getattr(config, "hidden_act", "silu")
        unsupported = [
            name
            for name, on in (
                ("swin_norm", bool(getattr(config, "swin_norm", False))),
                ("attention_bias", bool(getattr(config, "attention_bias", False))),
                ("mlp_bias", bool(getattr(config, "mlp_bias", False))),
                ("rope_scaling", _rope_scaled(config)),
                (f"hidden_act={act}", act != "silu"),
            )
            if on
        ]
        if unsupported:
            raise ConfigError(key, f"the lean Chameleon does not implement {unsupported}; use model.impl=hf")
        heads = int(config.num_attention_heads)
        if int(config.hidden_size) % heads:
            raise ConfigError(key, f"hidden_size {config.hidden_size} is not a multiple of {heads} heads")
        return cls(
            vocab_size=int(config.vocab_size),
            hidden_size=int(config.hidden_size),
            intermediate_size=int(config.intermediate_size),
            num_layers=int(config.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            rms_norm_eps=float(config.rms_norm_eps),
            rope_theta=_rope_theta(config),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF key → shape of every LM tensor this module reads (``lm_head`` absent when tied)."""
        D, F, V, hd = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        H, KV = self.num_heads, self.num_kv_heads
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
        if not self.tie_word_embeddings:
            out["lm_head.weight"] = (V, D)
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            out |= llama_layer_shapes(p, D, F, H, KV, hd)
            out |= {
                p + "self_attn.q_norm.weight": (H, hd),
                p + "self_attn.q_norm.bias": (H, hd),
                p + "self_attn.k_norm.weight": (KV, hd),
                p + "self_attn.k_norm.bias": (KV, hd),
            }
        return out


def _rope_scaled(config: Any) -> bool:
    """Does ``config`` ask for a RoPE other than the default (4.x ``rope_scaling``, 5.x ``rope_parameters``)?"""
    if getattr(config, "rope_scaling", None):
        scaling = config.rope_scaling
        return not (isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default")
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_type", "default") != "default"


class ChameleonBlock(FusedBlock):
    """One Chameleon decoder layer in inference form: a ``FusedBlock`` and the q/k ``HeadLayerNorm``s."""

    def __init__(self, a: ChameleonArch) -> None:
        D, F, H, KV, hd = a.hidden_size, a.intermediate_size, a.num_heads, a.num_kv_heads, a.head_dim
        super().__init__(D, F, H, KV, hd, a.rms_norm_eps, NORM_DTYPE)
        self.q_norm = HeadLayerNorm(H, hd, QK_NORM_EPS)
        self.k_norm = HeadLayerNorm(KV, hd, QK_NORM_EPS)

    def qk_norm(self) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """The fused q|k norm affine (one small copy)."""
        return qk_affine(self.q_norm, self.k_norm)


class ChameleonLM(InferenceWeights, nn.Module):
    """Chameleon's LM for tree decoding (module docstring): ``tok_embeddings``, ``layers`` (``ChameleonBlock``),
    ``norm_weight``, ``output`` (the LM head), ``rope``; ``config`` is the checkpoint's ``ChameleonConfig``.

    The interface ``StaticGPTTarget`` drives: ``tok_embeddings(ids)``, ``output(features)``,
    ``forward_embeds(x, pos, mask, cache, start)`` and ``new_cache(rows, capacity)``. Inference only. ``block``: the
    layer class (a subclass swaps it: ``emu3.lean.Emu3LM``, the same LM without q/k norms).
    """

    block: type[nn.Module] = ChameleonBlock

    def __init__(self, arch: ChameleonArch, config: Any = None) -> None:
        super().__init__()
        self.arch, self.config = arch, config
        self.tok_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(self.block(arch) for _ in range(arch.num_layers))
        self.norm_weight = frozen(arch.hidden_size)
        self.output = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.rope = Rope1D(arch.head_dim, arch.rope_theta, "interleaved")  # HF's frequencies; pairs: ``wqkv``'s order
        self.requires_grad_(False)

    def new_cache(self, rows: int, capacity: int) -> StaticKVCache:
        a, p = self.arch, self.norm_weight
        return StaticKVCache(a.num_layers, rows, a.num_kv_heads, capacity, a.head_dim, p.dtype, p.device)

    def _build_inference_weights(self) -> list[LayerWeights]:
        blocks: list[Any] = list(self.layers)  # ``block`` instances
        return [b.inference_weights() for b in blocks]

    def rope_tables(self, pos: torch.Tensor, dtype: torch.dtype) -> Rotary:
        """``rope.rotary`` tables for the fused q|k|v heads at ``pos [R, n]``: computed in float32 (HF's rotary
        embedding), cast to float64 for a float64 model (so the rotation runs in float64, as HF's)."""
        a = self.arch
        rot = rotary(self.rope, pos, NORM_DTYPE, a.num_heads + a.num_kv_heads, a.num_kv_heads)
        return rot.to(dtype) if dtype == torch.float64 else rot

    def forward_embeds(
        self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, start: int | torch.Tensor
    ) -> torch.Tensor:
        """Input embeddings ``[R, n, D]`` at positions ``[R, n]`` → post-final-norm features ``[R, n, D]``; the n
        new K/V entries are written at ``start``. ``mask [R, 1, n, start + n]``: boolean (True = attend) or
        additive in x's dtype."""
        mask = additive_mask(mask, x.dtype)
        rot = self.rope_tables(pos, x.dtype)
        layers, eps = self.inference_weights(), self.arch.rms_norm_eps
        memo = stack_memo(self)
        return stack_fn(self)(layers, self.norm_weight, eps, x, rot, mask, cache, start, NORM_DTYPE, memo=memo)


# ---------------------------------------------------------------------------------------------------------
# Building the inference weights from HF-layout tensors
# ---------------------------------------------------------------------------------------------------------


def _fuse(
    arch: ChameleonArch,
    get: Callable[[str], torch.Tensor],
    dtype: torch.dtype,
    layer_done: Callable[[int], None] | None = None,
    qk_norm: bool = True,
) -> dict[str, torch.Tensor]:
    """``ChameleonLM`` state dict from HF-layout tensors (``get(key)`` → tensor on the target device, any dtype).

    Every tensor is cast to ``dtype`` first; the RMSNorm folds run in fp32 for half types (``lean.fold_t``). Layer
    by layer: a layer's HF tensors are unreferenced here once fused, then ``layer_done(i)`` lets the source drop its
    own references. ``qk_norm`` False: layers without q/k LayerNorms (Emu3's plain Llama layers).
    """
    H, KV = arch.num_heads, arch.num_kv_heads

    def t(key: str) -> torch.Tensor:
        return get(key).to(dtype)

    def norm(key: str, heads: int) -> torch.Tensor:
        from adtbench.models.hf_checkpoint import expand_qk_norm

        return expand_qk_norm(t(key), heads, key).contiguous()

    sd: dict[str, torch.Tensor] = {}
    for i in range(arch.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        sd |= fuse_llama_layer(t, p, q, H, KV, arch.head_dim)
        for n, heads in (("q", H), ("k", KV)) if qk_norm else ():
            for part in ("weight", "bias"):
                affine = norm(p + f"self_attn.{n}_norm.{part}", heads)
                sd[q + f"{n}_norm.{part}"] = interleave_pairs(affine, 1, arch.head_dim, dim=1).contiguous()
        if layer_done is not None:
            layer_done(i)
    sd["norm_weight"] = t("model.norm.weight")
    sd["tok_embeddings.weight"] = t("model.embed_tokens.weight")
    sd["output.weight"] = sd["tok_embeddings.weight"] if arch.tie_word_embeddings else t("lm_head.weight")
    return sd


def _assemble(arch: ChameleonArch, config: Any, sd: dict[str, torch.Tensor]) -> ChameleonLM:
    net: ChameleonLM = assemble(ChameleonLM, arch, config, sd)
    return net


def lean_from_hf(lm: nn.Module) -> ChameleonLM:
    """The lean form of an in-memory ``ChameleonForConditionalGeneration`` (``random_init``: the HF path's seeded
    weights). ``lm`` is emptied as it is converted — each decoder layer is replaced by an empty module once fused,
    and the embedding / head tensors move over — so do not use it afterwards."""
    config = lm.config
    arch = ChameleonArch.from_config(config)
    sd = dict(lm.state_dict())
    layers: Any = lm.model.layers  # type: ignore[union-attr]

    def layer_done(i: int) -> None:
        for k in [k for k in sd if k.startswith(f"model.layers.{i}.")]:
            del sd[k]
        layers[i] = nn.Module()  # the layer's own references go too

    net = _assemble(arch, config, _fuse(arch, sd.__getitem__, next(lm.parameters()).dtype, layer_done))
    for name in ("embed_tokens", "norm"):
        setattr(lm.model, name, nn.Module())  # type: ignore[union-attr]
    return net


def load_chameleon_net(path: Path, dtype: torch.dtype, device: torch.device, key: str = "model.path") -> ChameleonLM:
    """``ChameleonLM`` from an HF Chameleon folder (safetensors shards), read tensor by tensor onto ``device``.

    Checks (``ConfigError(key, …)``), all before any tensor is read: those of
    ``hf_checkpoint.open_chameleon_checkpoint``; every LM tensor present (``model.vqmodel.*`` and other extra keys
    are ignored) with the config's shape, q/k-norms ``(d0, head_dim)`` with ``d0`` dividing the head count
    allowed (expanded). Unsupported architectures: ``ConfigError`` on ``model.impl``.
    """

    from adtbench.models.hf_checkpoint import (
        check_lm_shapes,
        heads_for,
        is_qk_norm,
        open_chameleon_checkpoint,
        tensor_reader,
    )

    config, files, shapes = open_chameleon_checkpoint(path, key)
    arch = ChameleonArch.from_config(config)
    own = arch.hf_shapes()
    heads = [
        f"{k}: {shapes[k][0]} rows do not divide {heads_for(k, config)} heads"
        for k in own
        if k in shapes and is_qk_norm(k) and heads_for(k, config) % shapes[k][0]
    ]
    check_lm_shapes(shapes, own, path, key, heads)
    return _assemble(arch, config, _fuse(arch, tensor_reader(files, device), dtype))


__all__ = ["ChameleonArch", "ChameleonBlock", "ChameleonLM", "lean_from_hf", "load_chameleon_net"]
