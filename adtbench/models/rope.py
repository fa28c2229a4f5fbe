"""Rotary position embeddings indexed by explicit position ids (tree verification needs them).

``Rope1D``: the usual 1-D RoPE, HF ``rotate_half`` pairing (dims i and i + d/2).
``Rope2D``: LlamaGen's 2-D RoPE, interleaved (complex) pairing (dims 2i, 2i+1). The first half of the
frequency pairs rotates with the grid row, the second half with the column; positions below
``cls_len`` (the condition prefix) get cos = sin = 0, so their q and k are exactly zero — a quirk of
LlamaGen's table that trained checkpoints depend on.

Three ways to apply them: ``apply_rope`` (the reference: split into pairs, rotate, re-interleave), the lean
stack's ``Rotary`` (one complex product for interleaved pairs, ``x·C + roll(x)·S`` for halves) and
``rotate(x, C, S) = x·C + partner(x)·S`` with per-forward tables from ``qkv_tables`` (what ``Rotary`` is built
from): ``partner`` swaps the two members of each rotation pair (``flip`` of the pairs), ``C`` repeats cos over both
members and ``S`` carries the sign (``−sin`` on the first member, ``+sin`` on the second). Per pair ``(a, b)`` that
is ``(a·c − b·s, b·c + a·s)``, the same products and sums as ``apply_rope``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from adtbench import accel


@lru_cache(maxsize=64)
def _inv_freq(dim: int, n: int, theta: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``1 / theta^(2i/dim)`` for i < n (cached per device/dtype)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=dtype)[:n] / dim))


@dataclass(frozen=True)
class Rope1D:
    head_dim: int
    theta: float = 10000.0
    style: str = "half"

    def cos_sin(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``pos [R, n]`` → cos, sin ``[R, n, head_dim/2]``."""
        ftype = torch.float64 if dtype == torch.float64 else torch.float32
        inv = _inv_freq(self.head_dim, self.head_dim // 2, self.theta, pos.device, ftype)
        ang = pos.to(ftype)[..., None] * inv
        return ang.cos(), ang.sin()


@dataclass(frozen=True)
class Rope2D:
    head_dim: int
    grid_w: int
    cls_len: int
    theta: float = 10000.0
    style: str = "interleaved"

    def cos_sin(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``pos [R, n]`` → cos, sin ``[R, n, head_dim/2]`` (row freqs then column freqs)."""
        ftype = torch.float64 if dtype == torch.float64 else torch.float32
        half = self.head_dim // 2
        inv = _inv_freq(half, half // 2, self.theta, pos.device, ftype)
        k = (pos - self.cls_len).clamp_min(0)
        row, col = (k // self.grid_w).to(ftype), (k % self.grid_w).to(ftype)
        ang = torch.cat([row[..., None] * inv, col[..., None] * inv], dim=-1)
        live = (pos >= self.cls_len).to(ftype)[..., None]
        return ang.cos() * live, ang.sin() * live


Rope = Rope1D | Rope2D


@lru_cache(maxsize=64)
def _table_consts(style: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``sign [2, 1, 1, 1, 2]`` (row 0 → C: +1 +1, row 1 → S: −1 +1) and the identity pair ``[2, 1, 1, 1, 1]``.

    ``sign`` multiplies ``stack([cos, sin])[..., None]`` (interleaved) or ``[..., None, :]`` (half) so that one
    ``flatten`` lays out both tables; ``ident`` is C = 1, S = 0 (heads that are not rotated, e.g. v).
    """
    sign = torch.tensor([[1.0, 1.0], [-1.0, 1.0]], device=device, dtype=dtype)
    if style == "interleaved":
        sign = sign.view(2, 1, 1, 1, 2)
    elif style == "half":
        sign = sign.view(2, 1, 1, 2, 1)
    else:
        raise ValueError(f"unknown rope style {style!r}")
    return sign, torch.tensor([1.0, 0.0], device=device, dtype=dtype).view(2, 1, 1, 1, 1)


def _direct_tables(rope: Rope, pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[2, R, n, 1, head_dim]``: row 0 the C table, row 1 the S table (sign folded in) at ``pos [R, n]``."""
    cos, sin = rope.cos_sin(pos, dtype)  # [R, n, d/2]
    R, n, half = cos.shape
    sign, _ = _table_consts(rope.style, cos.device, cos.dtype)
    cs = torch.stack([cos, sin])  # [2, R, n, d/2]
    cs = cs[..., None] if rope.style == "interleaved" else cs[..., None, :]
    return (cs * sign).view(2, R, n, 1, 2 * half)  # ±1 products are exact


_POSITION_TABLES: dict[tuple[Rope, torch.device, torch.dtype], torch.Tensor] = {}


def _position_table(rope: Rope, upto: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``_direct_tables`` at positions ``0 … P−1`` (``P > upto``), as ``[2, P, 1, head_dim]``; grown by doubling."""
    key = (rope, device, dtype)
    tab = _POSITION_TABLES.get(key)
    if tab is None or tab.shape[1] <= upto:
        P = max(upto + 1, 2 * (0 if tab is None else tab.shape[1]), 256)
        tab = _direct_tables(rope, torch.arange(P, device=device)[None], dtype)[:, 0]
        _POSITION_TABLES[key] = tab
    return tab


HEAD_TABLE_MAX = 1 << 22
"""Entries (positions × heads × head_dim) of one cached fused-head table (16 MB in float32): a bigger model's rows are
laid out over its heads per forward instead (``qkv_tables``)."""
_HeadKey = tuple[Rope, torch.device, torch.dtype, int, int]
_HEAD_TABLES: dict[_HeadKey, tuple[torch.Tensor, torch.Tensor | None]] = {}


def _head_tables(
    rope: Rope, upto: int, device: torch.device, dtype: torch.dtype, rot_heads: int, id_heads: int
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``_position_table`` laid out over a fused head axis, ``[2, P, rot_heads + id_heads, head_dim]`` (the rotated
    heads, then the identity ones: ``qkv_tables``' rows at every position ``0 … P−1``), and for the interleaved style
    the complex table ``[P, heads, head_dim/2]`` (``Rotary.complex``'s rows); rebuilt when the position table grows.
    None past ``HEAD_TABLE_MAX``."""
    pos_tab = _position_table(rope, upto, device, dtype)
    _, P, _, d = pos_tab.shape
    if P * (rot_heads + id_heads) * d > HEAD_TABLE_MAX:
        return None
    key = (rope, device, dtype, rot_heads, id_heads)
    hit = _HEAD_TABLES.get(key)
    if hit is None or hit[0].shape[1] != P:
        _, ident = _table_consts(rope.style, device, dtype)
        tab = torch.cat([pos_tab.expand(2, P, rot_heads, d), ident[:, 0].expand(2, P, id_heads, d)], 2)
        pairs = torch.complex(tab[0, ..., 0::2], tab[1, ..., 1::2]) if rope.style == "interleaved" else None
        hit = _HEAD_TABLES[key] = (tab, pairs)
    return hit


def _host_rows(pos: torch.Tensor, dtype: torch.dtype) -> tuple[int, torch.dtype]:
    """The largest position of ``pos`` (checked non-negative) and the tables' dtype: the per-position tables' size."""
    lo, hi = pos.aminmax()
    if int(lo) < 0:
        raise IndexError(f"negative position id {int(lo)}")
    return int(hi), torch.float64 if dtype == torch.float64 else torch.float32


def qkv_tables(
    rope: Rope, pos: torch.Tensor, dtype: torch.dtype, rot_heads: int, id_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``C, S [R, n, rot_heads + id_heads, head_dim]`` for ``rotate`` over a fused head axis.

    The first ``rot_heads`` heads (q, then k) are rotated at ``pos [R, n]``; the last ``id_heads`` (v) get the
    identity (C = 1, S = 0, exact). Computed once per forward in cos's dtype (fp32 for half models, fp64 for fp64),
    shared by every layer. On the CPU the rows come from a per-position table (one gather of the fused-head table,
    ``_head_tables``; no device sync is needed to size it there), elsewhere they are computed directly; both are the
    same formula.
    """
    if not accel.is_cuda(pos.device) and pos.numel() > 0:
        hi, ftype = _host_rows(pos, dtype)
        cached = _head_tables(rope, hi, pos.device, ftype, rot_heads, id_heads)
        if cached is not None:
            C, S = cached[0][:, pos].unbind(0)
            return C, S
        tab = _position_table(rope, hi, pos.device, ftype)[:, pos]  # [2, R, n, 1, d]
    else:
        tab = _direct_tables(rope, pos, dtype)
    _, R, n, _, d = tab.shape
    _, ident = _table_consts(rope.style, tab.device, tab.dtype)
    full = torch.cat([tab.expand(2, R, n, rot_heads, d), ident.expand(2, R, n, id_heads, d)], 3)
    C, S = full.unbind(0)
    return C, S


@dataclass(frozen=True)
class Rotary:
    """The rotary tables of one lean-stack forward over ``N = R·n`` tokens and a fused head axis (``rotary``), shared
    by every layer: ``cos`` = C and ``sin`` = S ``[N, heads, d]`` of ``qkv_tables`` (``rotate``'s), and the forms
    the lean layer applies them in. ``interleaved`` (pairs 2i, 2i + 1): one complex product ``x ⊙ complex()`` of x
    viewed as complex; ``half`` (pairs i, i + d/2): ``x·C + roll(x, d/2)·S`` (``roll`` swaps the halves: the partner
    of ``rotate``). Per pair ``(a, b)`` both are ``(a·c − b·s, b·c + a·s)``, the products and sums of ``apply_rope``;
    identity heads (v) are multiplied by 1 + 0i or C = 1, S = 0: exact."""

    style: str
    cos: torch.Tensor
    sin: torch.Tensor
    pairs: torch.Tensor | None = None  # ``complex()``'s table when gathered with cos and sin (the host's tables)

    @property
    def dtype(self) -> torch.dtype:
        """The real dtype the rotation is computed in."""
        return self.cos.dtype

    def complex(self) -> torch.Tensor:
        """The interleaved style's table ``[N, heads, d/2]``: ``c + i·s`` per pair (the identity heads 1 + 0i)."""
        if self.pairs is not None:
            return self.pairs
        return torch.complex(self.cos[..., 0::2], self.sin[..., 1::2])

    def to(self, dtype: torch.dtype) -> Rotary:
        """The same tables cast to ``dtype``."""
        return Rotary(self.style, self.cos.to(dtype), self.sin.to(dtype))


def rotary(rope: Rope, pos: torch.Tensor, dtype: torch.dtype, rot_heads: int, id_heads: int) -> Rotary:
    """``Rotary`` tables at ``pos [R, n]``: the first ``rot_heads`` heads rotated, the last ``id_heads`` identity, in
    the dtype ``qkv_tables`` computes in (the same values). On the CPU every table — cos, sin and the interleaved
    style's complex one — is one gather from the per-position tables over the fused heads (``_head_tables``)."""
    cached = None
    if not accel.is_cuda(pos.device) and pos.numel() > 0:
        hi, ftype = _host_rows(pos, dtype)
        cached = _head_tables(rope, hi, pos.device, ftype, rot_heads, id_heads)
    if cached is not None:
        tab, pairs = cached
        rows = pos.reshape(-1)
        C, S = tab[:, rows].unbind(0)  # [N, heads, d]
        return Rotary(rope.style, C, S, None if pairs is None else pairs[rows])
    C, S = qkv_tables(rope, pos, dtype, rot_heads, id_heads)  # [R, n, heads, d]
    R, n, heads, d = C.shape
    return Rotary(rope.style, C.reshape(R * n, heads, d), S.reshape(R * n, heads, d))


def rotate(x: torch.Tensor, C: torch.Tensor, S: torch.Tensor, style: str) -> torch.Tensor:
    """``x·C + partner(x)·S`` over the last dim (module docstring); computed in C's dtype, returned in x's."""
    xf = x.to(C.dtype)
    d = xf.shape[-1]
    if style == "interleaved":
        partner = xf.unflatten(-1, (d // 2, 2)).flip(-1).flatten(-2)
    else:
        partner = xf.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)
    return torch.addcmul(xf * C, partner, S).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotate ``x [R, heads, n, d]`` with cos/sin ``[R, n, d/2]``; computed in cos's dtype."""
    c, s = cos[:, None].to(cos.dtype), sin[:, None]
    xf = x.to(cos.dtype)
    if style == "half":
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    elif style == "interleaved":
        xe, xo = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack([xe * c - xo * s, xo * c + xe * s], dim=-1).flatten(-2)
    else:
        raise ValueError(f"unknown rope style {style!r}")
    return out.to(x.dtype)
