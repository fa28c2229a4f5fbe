"""A static (preallocated) KV cache with tree-path compaction, gpt-fast style."""

from __future__ import annotations

import torch


class StaticKVCache:
    """Per-layer K/V buffers ``[R, kv_heads, capacity, head_dim]``; callers track the length.

    ``write`` stores n new entries at ``start``; ``compact(start, keep)`` moves entries ``start + keep[i]``
    to ``start + i`` for every layer (the accepted tree path), after which the valid length is
    ``start + len(keep)``.
    """

    def __init__(
        self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype, device
    ) -> None:
        shape = (rows, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.capacity = capacity

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [R, kv_heads, n, d]`` at ``start``; return the views ``[:, :, :start+n]``."""
        end = start + k.shape[2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: need {end} > capacity {self.capacity}")
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def compact(self, start: int, keep: torch.Tensor) -> None:
        k = keep.numel()
        if torch.equal(keep.cpu(), torch.arange(k)):
            return  # already in place (always true for AR steps and fully-left paths)
        src = start + keep.to(self.k[0].device)
        for buf in (*self.k, *self.v):
            buf[:, :, start : start + k] = buf.index_select(2, src)
