"""The one graph runner: fixed-shape work captured per shape key, replayed, or run eagerly (SGLang's
``CudaGraphRunner`` model: every graphed part builds on it).

Its users — the static verify buckets (``models.graphs``), the Jacobi device step (``algorithm.methods.jacobi.step``),
the tree verify step (``algorithm.tree_step``), the drafting levels (``algorithm.drafters.graphed``) and the drafter's
catch-up (``algorithm.drafters.catch_up``) — subclass ``GraphRunner`` and hand it *programs*: functions of no
argument that read and write only the runner's static buffers (and the models' pinned caches and masks), at the shapes
their key fixes (a node bucket, an attention width, a level). The runner owns

- ``graphs``: shape key → ``accel_graphs.Graph`` (a CUDA graph on a GPU, its stand-in elsewhere: the only caller of
  ``accel_graphs.capture``). A graph holds the storages its capture touched alive for as long as it lives
  (``accel_graphs``, "What a graph owns"): dropping a graph is what releases them;
- the switch ``graphed``: True — a key's program is captured at its first use (``capture``; an owner may wrap the
  capture, ``capture_scope``) and replayed from then on; False — the same program runs eagerly, at the same fixed
  shapes (the CPU's static buckets, ``engine.graphs.<part>=graph`` on uncaptured buckets);
- the static buffers a program reads and writes (``buffer(name, shape, dtype)``: zeros (or ``fill``) at creation,
  the same tensor while it lives);
- the counters, one way for all: ``captures``, ``replays``, ``eager_runs``.

Invariants: a program reads and writes only static storages (a graph replays the captured addresses); reallocating a
buffer invalidates every graph captured over it, so ``drop()`` releases the graphs and the buffers together, and
``buffer`` of a known name at another shape or dtype drops the graphs first.

``runner_for(owner, kind, key, make)``: the per-owner cache (a ``WeakKeyDictionary`` keyed by the owner — a target's
static buckets — then by the runner's class and key): one runner per (owner, setting), made once and reused by every
image, since its buffers are its graphs' addresses.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import torch

from adtbench import accel_graphs

R = TypeVar("R", bound="GraphRunner")

Program = Callable[[], Any]
"""Fixed-shape work of no argument over static buffers; what it returns is the graph's output (rewritten in place by
every replay)."""


class GraphRunner:
    """Graphs per shape key, their static buffers and their counters (module docstring)."""

    def __init__(self, device: torch.device, graphed: bool = True) -> None:
        self.device, self.graphed = device, graphed
        self.graphs: dict[Hashable, accel_graphs.Graph] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self.captures = self.replays = self.eager_runs = 0

    def replay_or_run(self, key: Hashable, program: Program) -> Any:
        """``key``'s graph replayed (captured at its first use) and its outputs returned; or, not ``graphed``,
        ``program`` run eagerly and its outputs returned."""
        if not self.graphed:
            self.eager_runs += 1
            return program()
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.capture(key, program)
        graph.replay()
        self.replays += 1
        return graph.out

    def capture(self, key: Hashable, program: Program) -> accel_graphs.Graph:
        """Capture ``program`` as ``key``'s graph (two warm-up runs, then the capture: ``accel_graphs.capture``)
        inside ``capture_scope(key)``."""
        with self.capture_scope(key):
            graph = self.graphs[key] = accel_graphs.capture(program, self.device)
        self.captures += 1
        return graph

    def capture_scope(self, key: Hashable) -> contextlib.AbstractContextManager[None]:
        """What a capture runs inside (the warm-ups included): nothing here; an owner whose program must change no
        state while captured overrides it (``JacobiStep`` switches its step off)."""
        return contextlib.nullcontext()

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, fill: float = 0) -> torch.Tensor:
        """The static buffer ``name`` (``fill`` at creation, zeros by default; the same tensor while it lives). Asked at
        another shape or dtype it is reallocated, and every graph dropped first (they read the old storage)."""
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != shape or buf.dtype != dtype:
            if buf is not None:
                self.graphs.clear()
            if fill == 0:
                buf = torch.zeros(shape, dtype=dtype, device=self.device)
            else:
                buf = torch.full(shape, fill, dtype=dtype, device=self.device)
            self._buffers[name] = buf
        return buf

    def drop(self) -> None:
        """Release every graph and static buffer (before the owner reallocates what they read)."""
        self.graphs.clear()
        self._buffers.clear()


_RUNNERS: weakref.WeakKeyDictionary[Any, dict[Hashable, GraphRunner]] = weakref.WeakKeyDictionary()


def runner_for(owner: Any, kind: type[R], key: Hashable, make: Callable[[], R]) -> R:
    """The ``kind`` runner of ``owner`` for ``key``: made by ``make()`` at the first ask, the same object after
    (module docstring)."""
    runners = _RUNNERS.setdefault(owner, {})
    runner = runners.get((kind, key))
    if runner is None:
        runner = runners[(kind, key)] = make()
    assert isinstance(runner, kind)
    return runner


def runners_of(owner: Any, kind: type[R]) -> list[R]:
    """The ``kind`` runners made for ``owner`` so far, in the order they were made."""
    return [r for (k, _), r in _RUNNERS.get(owner, {}).items() if k is kind and isinstance(r, kind)]


@contextlib.contextmanager
def switched_off(flag: torch.Tensor) -> Iterator[None]:
    """A capture scope: ``flag`` (a device bool) False while inside, True after — a program gated by it changes no
    state during its warm-ups and capture."""
    flag.fill_(False)
    try:
        yield
    finally:
        flag.fill_(True)


__all__ = ["GraphRunner", "Program", "runner_for", "runners_of", "switched_off"]
