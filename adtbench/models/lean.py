"""Lean inference kernels shared by the in-project GPTs and the EAGLE drafter (the CPU per-op-overhead regime).

The modules (``llamagen.gpt.Block``, ``eagle.EagleLayer``) stay the specification and the autograd (training)
path. ``decoder_layer`` computes the same function under ``no_grad`` with fewer aten ops and no ``nn.Module``
dispatch:

- the residual stream is 2-D ``[R·n, D]``, so every projection is one ``mm`` against a cached transposed weight
  and both residual adds are in-place ``addmm_`` (``x += a·Wᵀ``);
- RMSNorm weights are folded into the projection that follows: ``(x̂ ⊙ w)·Wᵀ = x̂·(W·diag w)ᵀ``; on the host the
  norm itself is two kernels (a vector norm over the stream with an ε column, a division: ``Scratch``), on CUDA
  torch's fused ``rms_norm``;
- q|k|v come from one matmul (fused rows ``[q | k | v]``) and are rotated in one step whose v heads have the
  identity table (``rope.Rotary``: one complex product for interleaved pairs, ``x·C + roll(x)·S`` for halves), so
  the rotated K and the V leave it adjacent and enter the KV cache in one copy;
- SwiGLU's gate|up (LlamaGen ``w1|w3``) is one matmul; ``silu_`` and ``mul_`` work on its two halves in place;
- every intermediate of a layer lives in buffers made once per shape (``Scratch``: per network, the last
  ``SCRATCH_SHAPES`` shapes and every shape a live CUDA graph was captured over: ``scratch``), written with
  ``out=`` and read through views made with them, so a layer issues its kernels and almost no view ops — and a
  static bucket (``models.graphs``) the same addresses every call;
- the attention mask is one additive float tensor (0 / −inf, compute dtype) per forward (``additive_mask``)
  instead of a boolean mask that SDPA converts again in every layer; grouped K/V heads are read as they are
  (``enable_gqa``), not repeated.

Per decoder layer of an AR step (``adtbench bench count``, CPU, float32): LlamaGen 15 aten ops on the static path
and on the variable-shape one (13 kernels; the attention's K/V views of a new width are two ``unbind`` calls per
forward, ``StaticKVCache.windows``), was 32 / 33 (21 kernels); Chameleon 18 (16 kernels), was 40 / 41 (28
kernels) — its q and k rows stored in interleaved rotary pairs (``interleave_pairs``).

Derived weights are inference-only buffers: never in a ``state_dict``, rebuilt by ``InferenceWeights`` whenever a
source parameter changes in place (``_version``), moves (``Module._apply``: ``to``/``half``/``cuda``) or is
reloaded (``load_state_dict``). They equal the parameters' values up to float rounding of the folded products.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adtbench import accel, accel_graphs
from adtbench.models.kv import StaticKVCache
from adtbench.models.rope import Rotary, rotate

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
    ``x.to(float32)``), so a float64 model rounds there to float32 too; None: the rule above. On a CUDA device a half
    type normalising in float32 is one fused kernel (``rms_norm`` of the half tensor accumulates and scales in float32
    and rounds once, the cast–normalise–cast of the rule in one kernel instead of three).
    """
    if x.dtype in HALF and dtype in (None, torch.float32) and accel.is_cuda(x.device):
        out = F.rms_norm(x, (x.shape[-1],), None, eps)
        return out if weight is None else out * weight
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
    # per-head LayerNorms of q and k before RoPE (Chameleon; LANTERN's drafters): ``qk_affine``'s (weight, bias, eps)
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None
    norm_dtype: torch.dtype | None = None  # ``rms``'s dtype for both RMSNorms (Chameleon: float32, HF's rule)


def frozen(*shape: int) -> nn.Parameter:
    """An uninitialised parameter without gradient (inference weights, filled by ``load_state_dict(assign=True)``)."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class FusedBlock(nn.Module):
    """One Llama-style pre-norm decoder layer in inference form (Chameleon, Emu3, Janus-Pro's LM): ``wqkv`` and
    ``w13`` with their RMSNorm weights folded in (q and k rows in interleaved rotary pairs: ``fuse_llama_layer``),
    ``wo``, ``w2``, each ``[out, in]`` like ``nn.Linear``. Subclasses add per-head q/k norms (``qk_norm``)."""

    def __init__(self, D: int, F: int, H: int, KV: int, hd: int, eps: float, norm_dtype: torch.dtype) -> None:
        super().__init__()
        self.eps, self.norm_dtype = eps, norm_dtype
        self.wqkv = frozen((H + 2 * KV) * hd, D)
        self.wo = frozen(D, H * hd)
        self.w13 = frozen(2 * F, D)
        self.w2 = frozen(D, F)
        self.heads, self.kv_heads, self.head_dim = H, KV, hd

    def qk_norm(self) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """``LayerWeights.qk_norm``: none in a plain Llama layer."""
        return None

    def inference_weights(self) -> LayerWeights:
        """``decoder_layer``'s view of this layer (transposed views, no copies but a q/k norm's fused affine)."""
        return LayerWeights(
            qkv=self.wqkv.t(),
            qkv_bias=None,
            o=self.wo.t(),
            up=self.w13.t(),
            down=self.w2.t(),
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            norm_in=True,
            eps_in=self.eps,
            eps_ffn=self.eps,
            qk_norm=self.qk_norm(),
            norm_dtype=self.norm_dtype,
        )


def llama_layer_shapes(prefix: str, D: int, F: int, H: int, KV: int, hd: int) -> dict[str, tuple[int, ...]]:
    """HF key → shape of one Llama decoder layer's tensors under ``prefix`` (``model.layers.{i}.``): the q/k/v/o
    projections, the gate/up/down MLP and the two RMSNorm weights."""
    return {
        prefix + "self_attn.q_proj.weight": (H * hd, D),
        prefix + "self_attn.k_proj.weight": (KV * hd, D),
        prefix + "self_attn.v_proj.weight": (KV * hd, D),
        prefix + "self_attn.o_proj.weight": (D, H * hd),
        prefix + "mlp.gate_proj.weight": (F, D),
        prefix + "mlp.up_proj.weight": (F, D),
        prefix + "mlp.down_proj.weight": (D, F),
        prefix + "input_layernorm.weight": (D,),
        prefix + "post_attention_layernorm.weight": (D,),
    }


def fuse_llama_layer(t: Any, p: str, q: str, H: int, KV: int, hd: int) -> dict[str, torch.Tensor]:
    """``FusedBlock`` tensors (keys ``q + wqkv | w13 | wo | w2``) of the HF layer under prefix ``p``, ``t(key)`` giving
    each HF tensor in the target dtype: ``wqkv`` = [q | k | v] · diag(input norm) with the q and k rows reordered to
    interleaved rotary pairs (``interleave_pairs``), ``w13`` = [gate | up] · diag(post-attention norm)."""

    def folded(keys: list[str], norm_key: str) -> torch.Tensor:
        return fold_t(torch.cat([t(k) for k in keys], 0), t(norm_key)).t().contiguous()  # [out, in]: W · diag(norm)

    qkv = folded([p + f"self_attn.{n}_proj.weight" for n in "qkv"], p + "input_layernorm.weight")
    qk = (H + KV) * hd
    return {
        q + "wqkv": torch.cat([interleave_pairs(qkv[:qk], H + KV, hd), qkv[qk:]], 0),
        q + "w13": folded(
            [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], p + "post_attention_layernorm.weight"
        ),
        q + "wo": t(p + "self_attn.o_proj.weight"),
        q + "w2": t(p + "mlp.down_proj.weight"),
    }


def assemble(cls: Any, arch: Any, config: Any, sd: dict[str, torch.Tensor]) -> Any:
    """``cls(arch, config)`` built on the meta device with ``sd``'s tensors assigned (no copy, no init pass), frozen,
    in eval mode: how every lean network is made from its fused state dict."""
    with torch.device("meta"):
        net = cls(arch, config)
    net.load_state_dict(sd, strict=True, assign=True)
    return net.requires_grad_(False).eval()


class HeadLayerNorm(nn.Module):
    """Chameleon's q/k norm: LayerNorm over ``head_dim`` without affine (eps 1e-5), then a per-head affine,
    ``LN(x)·w_h + b_h`` for x ``[..., heads, head_dim]`` with weight, bias ``[heads, head_dim]`` (the
    ``LayerWeights.qk_norm`` of the lean Chameleon target, ``qk_affine``; the same op order as transformers)."""

    def __init__(self, heads: int, head_dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), None, None, self.eps) * self.weight + self.bias


def interleave_pairs(t: torch.Tensor, heads: int, head_dim: int, dim: int = 0) -> torch.Tensor:
    """``t`` with the ``heads × head_dim`` entries along ``dim`` reordered, head by head, from the half-split rotary
    pairing (pair i = dims i, i + d/2: HF's ``rotate_half``) to the interleaved one (pair i = dims 2i, 2i + 1), a copy.

    Applied to the q and k rows of a projection (and to a q/k norm's affine) it changes no attention score — q·k sums
    the same products in another order — and lets the rotary embedding be one complex product (``rope.Rotary``)
    instead of a roll, a product and an ``addcmul``; the K cache then holds that order."""
    half = head_dim // 2
    pairs = torch.stack([torch.arange(half), torch.arange(half, head_dim)], 1).flatten()
    idx = (torch.arange(heads)[:, None] * head_dim + pairs[None]).flatten()
    return t.index_select(dim, idx.to(t.device))


def qk_affine(q_norm: Any, k_norm: Any) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """``LayerWeights.qk_norm`` of a q and a k head norm (modules with ``weight`` / ``bias [heads, hd]`` and ``eps``,
    the same eps): the affine of the fused q|k heads ``[H + KV, hd]`` (one small copy), or None without them."""
    if q_norm is None:
        return None
    if q_norm.eps != k_norm.eps:
        raise ValueError(f"q and k norms with different eps ({q_norm.eps}, {k_norm.eps})")
    weight = torch.cat([q_norm.weight.detach(), k_norm.weight.detach()], 0)
    return weight, torch.cat([q_norm.bias.detach(), k_norm.bias.detach()], 0), float(q_norm.eps)


class Scratch:
    """The buffers of one lean-stack shape (R rows × n tokens; the layers' sizes, dtype and rotary form) and the
    views every layer reads and writes, made once per shape (``scratch``), so that a layer issues its kernels and
    (almost) no view ops: the matrix products write into ``qkv`` / ``gu`` (``out=``), the rotation into ``rot``, whose
    views are q and the K|V the cache takes, and the residual stream ``x`` is updated in place (``addmm_``).

    On the host (a CPU tensor that is not the simulated device: ``accel.is_cuda`` false) the residual stream lives
    in ``[c_ffn | x | c_in]`` with ``c = √(D·eps)``, so that an RMSNorm is two kernels — ``‖[x | c]‖ = √D ·
    √(mean(x²) + eps)`` (one vector norm) and ``√D · x / ‖[x | c]‖`` (one ``addcdiv``) — where torch's CPU ``rms_norm``
    is five (pow, mean, add, rsqrt, mul); on CUDA ``rms_norm`` is one fused kernel and the stream is plain ``[N, D]``.
    """

    def __init__(
        self,
        R: int,
        n: int,
        layers: list[LayerWeights],
        D: int,
        dtype: torch.dtype,
        rot: Any,
        device: Any,
    ) -> None:
        w = layers[0]
        H, KV, hd = w.heads, w.kv_heads, w.head_dim
        N = self.N = R * n
        self.R, self.n, self.H, self.KV, self.hd = R, n, H, KV, hd
        empty = functools.partial(torch.empty, dtype=dtype, device=device)
        self.host = not accel.is_cuda(device)
        # the host's RMSNorm by vector norm (float32/64, every norm in the model dtype, one eps per kind of norm)
        ins, ffns = {lw.eps_in for lw in layers if lw.norm_in}, {lw.eps_ffn for lw in layers}
        same = all(lw.norm_dtype in (None, dtype) for lw in layers)
        self.eps_in, self.eps_ffn = next(iter(ins), 0.0), next(iter(ffns))
        self.vector_norm = (
            self.host and same and dtype in (torch.float32, torch.float64) and len(ins) <= 1 and len(ffns) == 1
        )
        if self.vector_norm:
            xe = empty(N, D + 2)
            xe[:, 0] = math.sqrt(D * self.eps_ffn)
            xe[:, D + 1] = math.sqrt(D * self.eps_in)
            self.x, self.x_in, self.x_ffn = xe[:, 1 : D + 1], xe[:, 1:], xe[:, : D + 1]
            self.h, self.zero, self.root_d = empty(N, D), torch.zeros((), dtype=dtype, device=device), math.sqrt(D)
        else:
            self.x = empty(N, D)
        self.qkv = empty(N, (H + 2 * KV) * hd)
        qkv3 = self.qkv.view(N, H + 2 * KV, hd)
        self.qk_norm = w.qk_norm is not None
        if self.qk_norm:  # LayerNorm of the q|k heads into ``qk``; v stays in ``qkv``
            self.qk_in, self.qk = qkv3[:, : H + KV], empty(N, H + KV, hd)
            src, heads = self.qk, H + KV
        else:  # q|k|v rotated together (identity on v): K|V leave adjacent, one cache write
            src, heads = qkv3, H + 2 * KV
        self.style = None if rot is None else rot.style
        if rot is None:  # no rotary embedding (absolute positions): q, k, v straight from the product
            out = src
        else:
            rd = rot.dtype
            out = empty(N, heads, hd)
            self.stage = None if rd == dtype else torch.empty(N, heads, hd, dtype=rd, device=device)
            self.src, self.out = src, out
            a = src if self.stage is None else self.stage  # the rotation's input and output in the tables' dtype
            b = out if self.stage is None else torch.empty(N, heads, hd, dtype=rd, device=device)
            self.rot_in, self.rot_out = a, b
            if rot.style == "interleaved":
                self.rot_in_c, self.rot_out_c = torch.view_as_complex(_pairs(a)), torch.view_as_complex(_pairs(b))
        self.q = out[:, :H].view(R, n, H, hd).transpose(1, 2)
        if self.qk_norm:
            self.k = out[:, H:].view(R, n, KV, hd).transpose(1, 2)
            self.v = qkv3[:, H + KV :].view(R, n, KV, hd).transpose(1, 2)
        else:
            self.kv = out[:, H:].view(R, n, 2 * KV, hd).transpose(1, 2)
        F2 = w.up.shape[1]
        self.gu = empty(N, F2)
        self.gate, self.up = self.gu[:, : F2 // 2], self.gu[:, F2 // 2 :]
        self.table: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None
        self.cols: torch.Tensor | None = None
        self.pins = accel_graphs.Pins()  # the live graphs captured over these buffers (``scratch`` keeps them)

    def nbytes(self) -> int:
        """Bytes of the buffers (their storages, each counted once)."""
        seen = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in vars(self).values()
            if isinstance(t, torch.Tensor)
        }
        return sum(seen.values())

    def begin(self, rot: Any, start: int | torch.Tensor, cache: StaticKVCache) -> None:
        """Per forward: the rotary tables of the rotated heads, the written columns (an int ``start``) or the
        per-row scatter index (``start [R, n]``)."""
        heads = self.H + self.KV if self.qk_norm else self.H + 2 * self.KV
        if rot is not None:
            if rot.style == "interleaved":
                table = rot.complex()
                self.table = table if table.shape[1] == heads else table[:, :heads]
            else:
                self.table, self.sin = (t if t.shape[1] == heads else t[:, :heads] for t in (rot.cos, rot.sin))
        if isinstance(start, int):
            self.cols = torch.arange(start, start + self.n, device=cache.buf.device)
        elif start.dim() == 1:
            self.cols = start
        else:  # per-row columns [R, n] (batched rows of different lengths)
            kv = self.KV if self.qk_norm else 2 * self.KV
            self.cols = start[:, None, :, None].expand(-1, kv, -1, self.hd)

    def norm(self, which: str, w: LayerWeights) -> torch.Tensor:
        """The RMS-normalised residual stream (the norm's weight is folded into the next product)."""
        if self.vector_norm:
            n = torch.linalg.vector_norm(self.x_in if which == "in" else self.x_ffn, dim=-1, keepdim=True)
            return torch.addcdiv(self.zero, self.x, n, value=self.root_d, out=self.h)
        return rms(self.x, w.eps_in if which == "in" else w.eps_ffn, dtype=w.norm_dtype)

    def rotate(self) -> None:
        """``out`` = the rotary embedding of ``src`` (``Rotary``; via the staging buffers in the tables' dtype)."""
        if self.style is None:
            return
        if self.stage is not None:
            self.stage.copy_(self.src)
        if self.style == "interleaved":
            torch.mul(self.rot_in_c, self.table, out=self.rot_out_c)
        else:
            partner = torch.roll(self.rot_in, self.hd // 2, -1)
            torch.mul(self.rot_in, self.table, out=self.rot_out)
            self.rot_out.addcmul_(partner, self.sin)
        if self.stage is not None:
            self.out.copy_(self.rot_out)


def _pairs(t: torch.Tensor) -> torch.Tensor:
    """``[..., d]`` → ``[..., d/2, 2]`` (a view: the rotation pairs of the interleaved style)."""
    return t.unflatten(-1, (t.shape[-1] // 2, 2))


def decoder_layer(
    w: LayerWeights,
    ws: Scratch,
    mask: torch.Tensor,
    cache: StaticKVCache,
    i: int,
    window: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Layer ``i`` of the stack on the residual stream ``ws.x`` in place: ``h = x + Attn(norm(x))``, then
    ``h + SwiGLU(norm(h))``, K/V written into cache layer i at ``ws.cols`` and attention over ``window`` — the K and
    V views of its first ``width`` columns (``StaticKVCache.windows``) — through the additive ``mask [R, 1, n,
    width]`` (``lean_stack``)."""
    H, KV, hd = w.heads, w.kv_heads, w.head_dim
    h = ws.norm("in", w) if w.norm_in else ws.x
    if w.qkv_bias is None:
        torch.mm(h, w.qkv, out=ws.qkv)
    else:
        torch.addmm(w.qkv_bias, h, w.qkv, out=ws.qkv)
    if w.qk_norm is not None:
        weight, bias, eps = w.qk_norm
        torch.addcmul(bias, F.layer_norm(ws.qk_in, (hd,), None, None, eps), weight, out=ws.qk)
    ws.rotate()
    cols = ws.cols
    assert cols is not None
    writes = ((cache.k[i], ws.k), (cache.v[i], ws.v)) if ws.qk_norm else ((cache.kv[i], ws.kv),)
    for buf, new in writes:
        if cols.dim() == 1:
            buf.index_copy_(2, cols, new)
        else:
            buf.scatter_(2, cols, new)
    k, v = window
    a = F.scaled_dot_product_attention(ws.q, k, v, attn_mask=mask, enable_gqa=KV != H)
    ws.x.addmm_(a.transpose(1, 2).reshape(ws.N, H * hd), w.o)
    torch.mm(ws.norm("ffn", w), w.up, out=ws.gu)
    F.silu(ws.gate, inplace=True)
    ws.x.addmm_(ws.gate.mul_(ws.up), w.down)


def functional_layer(
    x: torch.Tensor,
    w: LayerWeights,
    rows: int,
    rot: Rotary | None,
    mask: torch.Tensor,
    cache: StaticKVCache,
    i: int,
    start: int | torch.Tensor,
) -> torch.Tensor:
    """``decoder_layer`` without scratch buffers or in-place updates of intermediates, for ``torch.compile``: residual
    stream ``x [R·n, D]`` → ``[R·n, D]`` (``lean_stack`` for ``start`` and ``mask``); the rotation as ``rope.rotate``,
    grouped K/V repeated."""
    H, KV, hd = w.heads, w.kv_heads, w.head_dim
    n = x.shape[0] // rows
    h = rms(x, w.eps_in, dtype=w.norm_dtype) if w.norm_in else x
    qkv = torch.mm(h, w.qkv) if w.qkv_bias is None else torch.addmm(w.qkv_bias, h, w.qkv)
    qkv = qkv.view(rows, n, H + 2 * KV, hd)
    if w.qk_norm is not None:
        weight, bias, eps = w.qk_norm
        qk, v = qkv.split([H + KV, KV], 2)
        qkv = torch.cat([F.layer_norm(qk, (hd,), None, None, eps) * weight + bias, v], 2)
    if rot is not None:
        qkv = rotate(qkv, rot.cos.view(qkv.shape), rot.sin.view(qkv.shape), rot.style)
    q, kv = qkv.split([H, 2 * KV], 2)
    kv_buf = cache.kv[i]
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


SCRATCH_SHAPES = 16  # unpinned shapes a network keeps scratch for (least recently used dropped first)


def scratch(
    memo: dict | None, R: int, n: int, layers: list[LayerWeights], D: int, dtype: torch.dtype, rot: Any, device: Any
) -> Scratch:
    """The ``Scratch`` of this shape: from ``memo`` (a network's dict) or new (``memo`` None).

    ``memo`` keeps the ``SCRATCH_SHAPES`` most recently used shapes, plus every shape a live CUDA graph (or its
    stand-in) uses: a ``Scratch`` handed out while a graph is being captured (``accel_graphs.capturing()``, its warm-ups
    included) is pinned to that graph (``Scratch.pins``) and never evicted while the graph lives — its replays write
    these buffers at the captured addresses without calling ``scratch`` again, so recency cannot protect them (the
    hazard: each distinct prompt length adds a shape, and an evicted captured buffer is memory a replay writes after
    the allocator has handed it to someone else). A shape's pins lapse with its graphs (weak references)."""
    if memo is None:
        return Scratch(R, n, layers, D, dtype, rot, device)
    key = (R, n, dtype, torch.device(device), None if rot is None else (rot.style, rot.dtype), id(layers))
    ws = memo.pop(key, None)
    if ws is None:
        ws = Scratch(R, n, layers, D, dtype, rot, device)
        unpinned = [k for k, v in memo.items() if not v.pins]  # least recently used first
        for k in unpinned[: max(0, len(unpinned) + 1 - SCRATCH_SHAPES)]:
            del memo[k]
    memo[key] = ws  # most recently used last
    ws.pins.note()
    return ws


def lean_stack(
    layers: list[LayerWeights],
    norm: torch.Tensor | None,
    eps: float,
    x: torch.Tensor,
    rot: Rotary | None,
    mask: torch.Tensor,
    cache: StaticKVCache,
    start: int | torch.Tensor,
    norm_dtype: torch.dtype | None = None,
    memo: dict | None = None,
) -> torch.Tensor:
    """``x [R, n, D]`` through ``decoder_layer``s (layer i uses cache layer i), then RMSNorm with weight ``norm`` (None:
    no final norm, the stream is copied out; ``norm_dtype`` as in ``rms``) → ``[R, n, D]``; a new tensor. The unit
    ``compile_stack`` compiles.

    ``rot``: ``rope.rotary`` tables for the fused q|k|v heads (None: no rotary embedding). ``start`` an int — K/V
    written at ``start … start + n − 1``, attention over the first ``start + n`` columns, ``mask`` additive
    ``[R, 1, n, start + n]``; a long tensor ``[n]`` — written at those columns (``index_copy_``), attention over the
    first W columns of ``mask [R, 1, n, W]`` (the static-shape form a CUDA graph replays: ``models.graphs``); a long
    tensor ``[R, n]`` — row r's K/V written at its own columns (``scatter_``), attention over the first W columns
    (batched rows of different lengths: ``models.batch``). ``memo``: the network's dict of ``Scratch`` buffers (None:
    ``functional_layer``s, what ``compile_stack`` traces: AOT autograd refuses the scratch's complex views and
    ``out=`` writes under dynamic shapes, and inductor fuses the elementwise ops anyway).
    """
    R, n, D = x.shape
    width = start + n if isinstance(start, int) else mask.shape[-1]
    if width > cache.capacity:
        raise RuntimeError(f"KV cache overflow: need {width} > capacity {cache.capacity}")
    if memo is None:  # the compiled stack (``compile_stack``): functional layers inductor fuses
        h = x.reshape(R * n, D)
        for i, w in enumerate(layers):
            h = functional_layer(h, w, R, rot, mask, cache, i, start)
        return (h.clone() if norm is None else rms(h, eps, norm, norm_dtype)).view(R, n, D)
    ws = scratch(memo, R, n, layers, D, x.dtype, rot, x.device)
    ws.x.view(R, n, D).copy_(x)  # x may be an expanded view (the CFG rows of one embedding)
    ws.begin(rot, start, cache)
    windows = cache.windows(width)
    for i, w in enumerate(layers):
        decoder_layer(w, ws, mask, cache, i, windows[i])
    out = ws.x.clone() if norm is None else rms(ws.x, eps, norm, norm_dtype)
    return out.view(R, n, D)


def compile_stack(module: nn.Module) -> None:
    """Make ``module``'s lean path call ``torch.compile(lean_stack)`` (inductor, ``dynamic=True``: the token count
    and the KV length change every call; the KV buffers are graph inputs mutated in place). Dynamo specialises
    size 1, so AR steps (n = 1) and trees (n ≥ 2) compile one graph each; the whole stack is one graph (compiling
    ``decoder_layer`` alone compiles faster but pays a guarded call per layer, slower than eager on the CPU)."""
    module._lean_stack = torch.compile(lean_stack, dynamic=True)


def stack_fn(module: nn.Module) -> Any:
    """The lean layer stack for ``module``: compiled after ``compile_stack``, else ``lean_stack``."""
    return module.__dict__.get("_lean_stack", lean_stack)


def stack_memo(module: nn.Module) -> dict | None:
    """``module``'s dict of ``Scratch`` buffers for ``lean_stack`` (None once compiled: the compiled stack makes its
    own)."""
    if "_lean_stack" in module.__dict__:
        return None
    memo: dict = module.__dict__.setdefault("_lean_scratch", {})
    return memo


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
