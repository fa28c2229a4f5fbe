"""A static (preallocated) KV cache with tree-path compaction, gpt-fast style."""

from __future__ import annotations

import torch

from adtbench import accel_graphs

WINDOWS = 16  # attention widths whose views a cache keeps (besides those a live CUDA graph was captured over)


class StaticKVCache:
    """One buffer ``buf [layers, R, 2·kv_heads, capacity, head_dim]`` (per layer: K heads, then V heads).

    Callers track the length. Views: ``kv[i]`` (layer i, K|V heads), ``k[i]`` / ``v[i]`` (``[R, kv_heads,
    capacity, head_dim]``). ``write``/``write_kv`` store n new entries at ``start``; ``compact(start, keep)``
    moves entries ``start + keep[i]`` to ``start + i`` for every layer in one gather + one copy, after which the
    valid length is ``start + len(keep)``.

    Autograd: the buffer never joins a graph. Under grad mode a write stores detached values and returns the
    cached prefix (constant) concatenated with the new, differentiable entries (training runs one forward per
    cache, ``start = 0``, so gradients are the same as through an uncached forward).
    """

    def __init__(
        self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype, device
    ) -> None:
        self.buf = torch.zeros((layers, rows, 2 * kv_heads, capacity, head_dim), dtype=dtype, device=device)
        self.kv = list(self.buf.unbind(0))
        self.k = [b[:, :kv_heads] for b in self.kv]
        self.v = [b[:, kv_heads:] for b in self.kv]
        self.kv_heads, self.capacity = kv_heads, capacity
        self._windows: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._window_pins: dict[int, accel_graphs.Pins] = {}

    def windows(self, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's K and V views ``[R, kv_heads, width, d]`` of its first ``width`` columns, made in two
        ``unbind`` calls (a forward's attention reads them all); the views of the last ``WINDOWS`` widths are kept (a
        static bucket's attention reads the same ones every call), and those of the widths a live CUDA graph was
        captured over (``accel_graphs.Pins``: its stand-in replays the capture's views)."""
        views = self._windows.pop(width, None)
        if views is None:
            cols = self.buf[:, :, :, :width]
            views = list(zip(cols[:, :, : self.kv_heads].unbind(0), cols[:, :, self.kv_heads :].unbind(0), strict=True))
            unpinned = [w for w in self._windows if not self._window_pins.get(w)]  # least recently used first
            for w in unpinned[: max(0, len(unpinned) + 1 - WINDOWS)]:
                del self._windows[w]
        self._windows[width] = views  # most recently used last
        if accel_graphs.capturing() is not None:
            self._window_pins.setdefault(width, accel_graphs.Pins()).note()
        return views

    def write_kv(self, layer: int, start: int, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``kv [R, 2·kv_heads, n, d]`` (K heads then V heads, any strides) at ``start``; return the K and V
        views ``[R, kv_heads, start + n, d]``."""
        end = start + kv.shape[2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: need {end} > capacity {self.capacity}")
        buf = self.kv[layer]
        if kv.requires_grad and torch.is_grad_enabled():
            buf[:, :, start:end] = kv.detach()
            full = kv if start == 0 else torch.cat([buf[:, :, :start], kv], 2)
            return full.split(self.kv_heads, 1)
        buf[:, :, start:end] = kv
        return buf[:, :, :end].split(self.kv_heads, 1)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [R, kv_heads, n, d]`` at ``start``; return the views ``[:, :, :start+n]``."""
        return self.write_kv(layer, start, torch.cat([k, v], 1))

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Entries ``start + keep[i]`` → ``start + i`` (``keep`` on the cache's device; nothing is read: a caller that
        knows ``keep`` is ``0 … k−1`` skips the call)."""
        k = keep.numel()
        self.buf[:, :, :, start : start + k] = self.buf.index_select(3, keep + start)
