"""Lean inference kernels shared by the in-project GPTs and the EAGLE drafter (the CPU per-op-overhead regime).

The modules (``llamagen_gpt.Block``, ``eagle.EagleLayer``) stay the specification and the autograd (training)
path. ``decoder_layer`` computes the same function under ``no_grad`` with fewer aten ops and no ``nn.Module``
dispatch:

- the residual stream is 2-D ``[R·n, D]``, so every projection is one ``mm`` against a cached transposed weight
  and both residual adds are folded into ``addmm`` (``x + a·Wᵀ``);
- RMSNorm weights are folded into the projection that follows: ``(x̂ ⊙ w)·Wᵀ = x̂·(W·diag w)ᵀ``;
- q|k|v come from one matmul (fused rows ``[q | k | v]``) and are rotated in one ``rope.rotate`` call whose v
  heads have the identity table, so the rotated K and the V leave it adjacent and enter the KV cache in one copy;
- SwiGLU's gate|up (LlamaGen ``w1|w3``) is one matmul, split by a view;
- the attention mask is one additive float tensor (0 / −inf, compute dtype) per forward (``additive_mask``)
  instead of a boolean mask that SDPA converts again in every layer.

Derived weights are inference-only buffers: never in a ``state_dict``, rebuilt by ``InferenceWeights`` whenever a
source parameter changes in place (``_version``), moves (``Module._apply``: ``to``/``half``/``cuda``) or is
reloaded (``load_state_dict``). They equal the parameters' values up to float rounding of the folded products.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adtbench.models.kv import StaticKVCache
from adtbench.models.rope import rotate

HALF = (torch.float16, torch.bfloat16)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask (True = attend) → additive ``0 / −inf`` in ``dtype``; a float mask is returned as is."""
    if mask.dtype != torch.bool:
        return mask
    return torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device).masked_fill_(mask, 0.0)


def rms(
    x: torch.Tensor, eps: float, weight: torch.Tensor | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """RMSNorm ``x · rsqrt(mean(x²) + eps) [· weight]`` over the last dim.

    Half types normalise in fp32 and cast back before the weight (LlamaGen's ``_norm(x.float()).type_as(x) · w``);
    other dtypes use ``F.rms_norm`` (bitwise the same formula on CPU, fused on CUDA). ``dtype``: normalise in this
    dtype whatever x's, cast back, then the weight — HF's Llama/Chameleon RMSNorm is ``dtype=float32`` (its
    ``x.to(float32)``), so a float64 model rounds there to float32 too; None: the rule above.
    """
    if dtype is None and x.dtype in HALF:
        dtype = torch.float32
    if dtype is not None and dtype != x.dtype:
        out = F.rms_norm(x.to(dtype), (x.shape[-1],), None, eps).to(x.dtype)
        return out if weight is None else out * weight
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def fold_t(weight: torch.Tensor, norm: torch.Tensor | None = None) -> torch.Tensor:
    """``(W · diag norm)ᵀ`` as the transposed view ``[in, out]`` that ``F.linear`` multiplies by (``x̂ @ result``).

    Without ``norm`` this is a view of the parameter (no copy); with it, one ``[out, in]`` product (fp32 math for
    half types). Extra memory per GPT block: the folded ``wqkv`` and the fused, folded ``w1|w3``.
    """
    w = weight.detach()
    if norm is None:
        return w.t()
    prod = w.float() * norm.detach().float() if w.dtype in HALF else w * norm.detach()
    return prod.to(w.dtype).t()


@dataclass(frozen=True)
class LayerWeights:
    """One pre-norm decoder layer, inference form. Shapes: ``qkv [D, (H + 2·KV)·hd]`` (rows q | k | v, the
    attention-norm weight folded in when ``norm_in``), ``o [H·hd, D]``, ``up [D, 2F]`` (gate | up, ffn-norm
    weight folded in), ``down [F, D]``."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    norm_in: bool  # RMS-normalise the layer input (EAGLE's layer 0 has no input norm)
    eps_in: float
    eps_ffn: float
    q_norm: Any = None  # per-head LayerNorms applied to q / k before RoPE (Chameleon; LANTERN's drafters)
    k_norm: Any = None
    norm_dtype: torch.dtype | None = None  # ``rms``'s dtype for both RMSNorms (Chameleon: float32, HF's rule)


class HeadLayerNorm(nn.Module):
    """Chameleon's q/k norm: LayerNorm over ``head_dim`` without affine (eps 1e-5), then a per-head affine,
    ``LN(x)·w_h + b_h`` for x ``[..., heads, head_dim]`` with weight, bias ``[heads, head_dim]`` (the
    ``LayerWeights.q_norm`` / ``k_norm`` of the lean Chameleon target; the same op order as transformers)."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), None, None, self.eps) * self.weight + self.bias


def decoder_layer(
    x: torch.Tensor,
    w: LayerWeights,
    rows: int,
    tables: tuple[torch.Tensor, torch.Tensor] | None,
    style: str,
    mask: torch.Tensor,
    kv_buf: torch.Tensor,
    start: int | torch.Tensor,
) -> torch.Tensor:
    """Residual stream ``x [R·n, D]`` → ``[R·n, D]``: ``h = x + Attn(norm(x))``, ``h + SwiGLU(norm(h))``.

    ``tables``: ``rope.qkv_tables`` for the fused q|k|v head axis (None: no rotary embedding); the layer's K/V go
    into ``kv_buf`` (``StaticKVCache.kv[i]``, ``[R, 2·KV, capacity, hd]``, capacity checked by the caller):
    ``start`` an int — written at ``start … start + n − 1``, attention over the first ``start + n`` columns, ``mask``
    additive ``[R, 1, n, start + n]``; ``start`` a long tensor ``[n]`` — written at those columns
    (``index_copy_``), attention over the first W columns of ``mask [R, 1, n, W]`` (the static-shape form a CUDA
    graph replays, W = capacity: ``models.graphs``); ``start`` a long tensor ``[R, n]`` — row r's K/V written at its
    own columns (``scatter_``), attention over the first W columns (batched rows of different lengths:
    ``models.batch``).
    """
    H, KV, hd = w.heads, w.kv_heads, w.head_dim
    n = x.shape[0] // rows
    h = rms(x, w.eps_in, dtype=w.norm_dtype) if w.norm_in else x
    qkv = torch.mm(h, w.qkv) if w.qkv_bias is None else torch.addmm(w.qkv_bias, h, w.qkv)
    qkv = qkv.view(rows, n, H + 2 * KV, hd)
    if w.q_norm is not None:
        q, k, v = qkv.split([H, KV, KV], 2)
        qkv = torch.cat([w.q_norm(q), w.k_norm(k), v], 2)
    if tables is not None:
        qkv = rotate(qkv, tables[0], tables[1], style)
    q, kv = qkv.split([H, 2 * KV], 2)
    if isinstance(start, int):
        kv_buf[:, :, start : start + n] = kv.transpose(1, 2)
        k, v = kv_buf[:, :, : start + n].split(KV, 1)
    else:
        if start.dim() == 1:
            kv_buf.index_copy_(2, start, kv.transpose(1, 2))
        else:  # per-row columns [R, n] (batched rows of different lengths)
            kv_buf.scatter_(2, start[:, None, :, None].expand(-1, 2 * KV, -1, hd), kv.transpose(1, 2))
        k, v = kv_buf[:, :, : mask.shape[-1]].split(KV, 1)
    q = q.transpose(1, 2)
    if KV != H:
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    x = torch.addmm(x, a.transpose(1, 2).reshape(rows * n, H * hd), w.o)
    gate, up = torch.mm(rms(x, w.eps_ffn, dtype=w.norm_dtype), w.up).chunk(2, -1)
    return torch.addmm(x, F.silu(gate) * up, w.down)


def lean_stack(
    layers: list[LayerWeights],
    norm: torch.Tensor | None,
    eps: float,
    x: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor] | None,
    style: str,
    mask: torch.Tensor,
    cache: StaticKVCache,
    start: int | torch.Tensor,
    norm_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x [R, n, D]`` through ``decoder_layer``s (layer i uses cache layer i; ``start`` as there), then RMSNorm with
    weight ``norm`` (None: no final norm; ``norm_dtype`` as in ``rms``) → ``[R, n, D]``. The unit ``compile_stack``
    compiles."""
    R, n, D = x.shape
    if isinstance(start, int) and start + n > cache.capacity:
        raise RuntimeError(f"KV cache overflow: need {start + n} > capacity {cache.capacity}")
    h = x.reshape(R * n, D)
    for w, kv_buf in zip(layers, cache.kv, strict=True):
        h = decoder_layer(h, w, R, tables, style, mask, kv_buf, start)
    return (h if norm is None else rms(h, eps, norm, norm_dtype)).view(R, n, D)


def compile_stack(module: nn.Module) -> None:
    """Make ``module``'s lean path call ``torch.compile(lean_stack)`` (inductor, ``dynamic=True``: the token count
    and the KV length change every call; the KV buffers are graph inputs mutated in place). Dynamo specialises
    size 1, so AR steps (n = 1) and trees (n ≥ 2) compile one graph each; the whole stack is one graph (compiling
    ``decoder_layer`` alone compiles faster but pays a guarded call per layer, slower than eager on the CPU)."""
    module._lean_stack = torch.compile(lean_stack, dynamic=True)


def stack_fn(module: nn.Module) -> Any:
    """The lean layer stack for ``module``: compiled after ``compile_stack``, else ``lean_stack``."""
    return module.__dict__.get("_lean_stack", lean_stack)


class InferenceWeights:
    """Mixin for an ``nn.Module``: ``inference_weights()`` returns ``_build_inference_weights()`` (module docstring),
    built lazily and rebuilt when stale.

    Staleness: any parameter's in-place version counter moved (optimizer steps, ``load_state_dict`` copies), the
    module was loaded (``load_state_dict``, also with ``assign=True``) or converted (``Module._apply``: ``to``,
    ``half``, ``cuda``: these swap parameter storage without a version bump). Replacing a ``Parameter`` of a
    submodule by plain attribute assignment is not seen: call ``invalidate_inference_weights()`` after it.
    """

    _iw_value: Any = None
    _iw_params: tuple[torch.Tensor, ...] = ()
    _iw_stamp: int = -1

    def _build_inference_weights(self) -> Any:
        raise NotImplementedError

    def invalidate_inference_weights(self) -> None:
        self._iw_value, self._iw_params, self._iw_stamp = None, (), -1

    def inference_weights(self) -> Any:
        if self._iw_value is not None and sum(p._version for p in self._iw_params) == self._iw_stamp:
            return self._iw_value
        with torch.no_grad():
            value = self._build_inference_weights()
        params = tuple(self.parameters())  # type: ignore[attr-defined]
        # versions only grow, so any in-place update of any parameter changes the sum
        self._iw_value, self._iw_params, self._iw_stamp = value, params, sum(p._version for p in params)
        return value

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.invalidate_inference_weights()
        return super()._apply(fn, *args, **kwargs)  # type: ignore[misc]

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self.invalidate_inference_weights()
        return super().load_state_dict(*args, **kwargs)  # type: ignore[misc]
