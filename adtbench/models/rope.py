"""Rotary position embeddings indexed by explicit position ids (tree verification needs them).

``Rope1D``: the usual 1-D RoPE, HF ``rotate_half`` pairing (dims i and i + d/2).
``Rope2D``: LlamaGen's 2-D RoPE, interleaved (complex) pairing (dims 2i, 2i+1). The first half of the
frequency pairs rotates with the grid row, the second half with the column; positions below
``cls_len`` (the condition prefix) get cos = sin = 0, so their q and k are exactly zero — a quirk of
LlamaGen's table that trained checkpoints depend on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


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
