"""CUDA graphs and their stand-in (``accel``'s seam: ``accel.graphs_supported``; the simulated device,
``accel_sim``, counts the stand-in's captures and replays).

**CUDA graphs** (``capture``). On CUDA: two warm-up runs on a side stream, then ``torch.cuda.graph`` capture, as
PyTorch requires. Anywhere else (the simulated device, or ``standin_graphs()`` in a test) the ``StandInGraph`` runs
the same warm-up, capture order and static buffers eagerly, and holds the forward to what a captured graph can do:
during capture a synchronisation or a host→device copy raises ``GraphError`` (illegal while a CUDA stream
captures); every replay must run the ops the capture ran, at the same shapes and with the same Python arguments
(a graph replays its kernels, it never re-runs Python), and read no tensor storage the capture did not read (a graph
reads its captured addresses: new inputs must be copied into the static buffers); the outputs are the capture's
tensors, rewritten in place by every replay.

**What a graph owns.** A graph reads and writes, at every replay, the storages its capture touched; those it did not
allocate itself (weights, caches, static inputs, the lean layers' scratch buffers) belong to the Python objects that
made them. Both graphs hold a reference to each (``Graph.held``), so no later eviction can hand their memory to
someone else while the graph lives; and ``capturing()`` names the graph under capture (its warm-ups included), so a
cache that hands out buffers (``lean.scratch``) keeps those for as long as that graph lives. The stand-in checks it at
every replay: a captured storage that only the graph still holds — its owner dropped it, as a least-recently-used
cache evicting a captured buffer does (on CUDA, without the graph's reference, a replay writing into freed memory) —
raises ``GraphError`` naming the op that first touched it at capture.

**Random numbers in a capture.** A graph replays the draws of its capture unless the generator's state is registered
with it (CUDA's ``CUDAGraph.register_generator_state``): a random op during a capture (both graphs) raises
``GraphError`` naming the op unless its ``generator=`` was passed to ``capture(..., generators=)`` — a draw from the
default generator too (adtbench draws from each prompt's own generator).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from adtbench import accel_sim
from adtbench.accel_sim import DRAWS, NO_SIGNATURE, READS, _functorch, call_site, op_name, tensors_in


class GraphError(RuntimeError):
    """What a CUDA graph cannot do: synchronise, copy from the host or draw from an unregistered generator during
    capture, replay other ops, shapes or Python values than it captured, read a tensor it did not capture, or replay
    on a storage its owner dropped."""


# ---------------------------------------------------------------------------------------------------------
# CUDA graphs and their stand-in
# ---------------------------------------------------------------------------------------------------------


class Graph:
    """A captured forward: ``replay()`` reruns it and rewrites ``out`` (the capture's output tensors) in place.

    ``held``: the storages the capture touched that it did not allocate (data pointer → storage), referenced by the
    graph for as long as it lives (module docstring, "What a graph owns"); ``first_use``: for each, the op and call
    site that first touched it at capture; ``generators``: the generators registered with the graph (a random op
    during its capture must draw from one of them)."""

    out: Any
    held: dict[int, torch.UntypedStorage]
    first_use: dict[int, str]
    generators: tuple[torch.Generator, ...]

    def replay(self) -> None:
        raise NotImplementedError

    def held_bytes(self) -> int:
        """Bytes of the storages the graph holds (its capture touched and did not allocate)."""
        return sum(s.nbytes() for s in self.held.values())

    def orphans(self) -> list[int]:
        """Data pointers of the held storages no live tensor owns any more: the graph's reference is their last
        (``torch._C._storage_Use_Count``: one per tensor on the storage, one for its Python object, which ``held``
        keeps; the check inductor's CUDA-graph trees make)."""
        return [ptr for ptr, s in self.held.items() if _use_count(s) <= 1]

    def _keep(self, trace: _Trace) -> None:
        self.held, self.first_use = trace.held, trace.first_use


def _use_count(s: torch.UntypedStorage) -> int:
    count = getattr(torch._C, "_storage_Use_Count", None)
    return 2 if count is None else int(count(s._cdata))  # without the count (an older torch): nothing is seen


_capturing: list[Graph] = []


def capturing() -> Graph | None:
    """The graph being captured now, its warm-up runs included (the innermost), or None. A cache that hands a forward
    buffers to write must keep what it hands out during a capture alive while that graph lives (``lean.scratch``
    pins it): the graph's replays keep using those addresses, and never call the cache again."""
    return _capturing[-1] if _capturing else None


class Pins:
    """The live graphs captured over a cached value (weak references): a cache that hands out buffers or views a
    forward uses calls ``note()`` on each hand-out and evicts an entry only while it is false (no live graph was
    captured over it: ``lean.scratch``, ``StaticKVCache.window``)."""

    def __init__(self) -> None:
        self._graphs: weakref.WeakSet[Graph] = weakref.WeakSet()

    def note(self) -> None:
        """Pin the value to the graph being captured (``capturing()``), if any."""
        graph = capturing()
        if graph is not None:
            self._graphs.add(graph)

    def __bool__(self) -> bool:
        return len(self._graphs) > 0


@contextlib.contextmanager
def _capture_of(graph: Graph) -> Iterator[None]:
    _capturing.append(graph)
    try:
        yield
    finally:
        _capturing.pop()


class CudaGraph(Graph):
    def __init__(self, forward: Callable[[], Any], generators: tuple[torch.Generator, ...] = ()) -> None:
        self.generators = generators
        with torch.no_grad(), _capture_of(self):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            for g in generators:
                self.graph.register_generator_state(g)
            trace = _Trace(capturing=True, generators=generators)
            with torch.cuda.graph(self.graph), trace:
                self.out = forward()
        self._keep(trace)

    def replay(self) -> None:
        self.graph.replay()


_force_standin = 0


@contextlib.contextmanager
def standin_graphs() -> Iterator[None]:
    """Within: ``capture`` builds ``StandInGraph``s even on a real GPU (tests of the stand-in itself)."""
    global _force_standin
    _force_standin += 1
    try:
        yield
    finally:
        _force_standin -= 1


def capture(forward: Callable[[], Any], device: torch.device, generators: tuple[torch.Generator, ...] = ()) -> Graph:
    """Capture ``forward`` (no arguments; it reads and writes static buffers) as a CUDA graph on a GPU, as a
    ``StandInGraph`` elsewhere (module docstring). Both run it twice first (warm-up), then once to capture.
    ``generators``: registered with the graph (``register_generator_state`` on CUDA), the only ones a random op in
    ``forward`` may draw from; each replay then draws afresh from their current state."""
    if device.type == "cuda" and not _force_standin:
        return CudaGraph(forward, tuple(generators))
    return StandInGraph(forward, tuple(generators))


class StandInGraph(Graph):
    """CUDA graph semantics run eagerly (module docstring). ``replays`` counts replays."""

    def __init__(self, forward: Callable[[], Any], generators: tuple[torch.Generator, ...] = ()) -> None:
        self.forward, self.generators = forward, generators
        with torch.no_grad(), _capture_of(self):
            for _ in range(2):
                forward()
            trace = _Trace(capturing=True, generators=generators)
            with trace:
                self.out = forward()
        self.ops, self.reads = trace.ops, trace.reads
        self._keep(trace)
        self.replays = 0
        if accel_sim.active is not None:
            accel_sim.active.counts["graph_captures"] += 1

    def replay(self) -> None:
        self._check_owned()
        trace = _Trace(capturing=False)
        with torch.no_grad(), trace:
            new = self.forward()
        unseen = trace.reads - self.reads
        if unseen:
            raise GraphError(
                f"a graph replay read {len(unseen)} tensor(s) its capture never read; a CUDA graph reads the captured "
                "addresses only: copy new inputs into the static buffers instead of passing new tensors"
            )
        missing = [ptr for ptr in self.held if ptr not in trace.reads]
        if missing:
            raise GraphError(
                f"a graph replay left {len(missing)} storage(s) of its capture untouched (first used at capture by "
                f"{self.first_use[missing[0]]}) and made new ones in their place; a CUDA graph keeps reading and "
                "writing the captured storages: keep the buffers a capture used for as long as the graph lives"
            )
        if trace.ops != self.ops:
            pairs = zip(trace.ops, self.ops)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(trace.ops), len(self.ops)))
            got = trace.ops[at] if at < len(trace.ops) else "(end)"
            want = self.ops[at] if at < len(self.ops) else "(end)"
            raise GraphError(
                f"a graph replay ran other work than its capture (op {at}: replayed {got}, captured {want}); "
                "a CUDA graph replays the captured kernels at the captured shapes and Python values"
            )
        flat_out, _ = tree_flatten(self.out)
        flat_new, _ = tree_flatten(new)
        with torch.no_grad():
            for o, n in zip(flat_out, flat_new, strict=True):
                if isinstance(o, torch.Tensor):
                    o.copy_(n)
        self.replays += 1
        if accel_sim.active is not None:
            accel_sim.active.counts["graph_replays"] += 1

    def _check_owned(self) -> None:
        """Refuse a replay over a captured storage that no live tensor owns any more (``Graph.orphans``)."""
        dead = self.orphans()
        if dead:
            size = sum(self.held[p].nbytes() for p in dead)
            raise GraphError(
                f"a graph replay would touch {len(dead)} storage(s) ({size} bytes) that no live tensor owns any more "
                f"(the first used at capture by {self.first_use[dead[0]]}): their owner dropped them after the "
                "capture (a cache evicted a captured buffer?) while the graph keeps reading and writing those "
                "addresses; on CUDA that is memory the allocator hands out again unless the graph holds it (silent "
                "corruption at the next capture, reset_peak_memory or out-of-memory retry). Keep what a capture "
                "uses alive while the graph lives (accel_graphs.capturing(): lean.scratch pins its captured buffers)"
            )


def _signature(x: Any) -> Any:
    """What of an argument a CUDA graph freezes: a tensor's shape and dtype, a Python value itself. Asked of every
    argument of every op a stand-in graph runs, so the common leaves are tested first, by exact type."""
    kind = type(x)
    if kind in _VALUES:
        return x
    if isinstance(x, torch.Tensor):
        return ("T", x.shape, x.dtype)
    if kind is list or kind is tuple or isinstance(x, list | tuple):
        return tuple(_signature(v) for v in x)
    if isinstance(x, int | float | bool | str | type(None) | torch.dtype | torch.device):
        return x
    if kind is slice:
        return ("slice", x.start, x.stop, x.step)
    return kind.__name__


_VALUES = frozenset((int, float, bool, str, type(None), torch.dtype, torch.device))
"""The exact types ``_signature`` keeps as they are (subclasses take the ``isinstance`` path)."""


_TRACES: list[_Trace] = []  # the stand-in traces active now (``made``)

_NO_MODES = torch._C.DisableTorchFunction
"""Within: torch calls reach no ``TorchFunctionMode`` (neither the trace nor the simulated device below it)."""


def made(out: Any) -> None:
    """The tensors of ``out`` were made by the forward a stand-in graph is tracing, by work its mode cannot see
    (functorch's unwrapping of ``accel.vmap``'s outputs): their storages are the graph's own, not inputs it reads.
    Nothing outside a trace (and on CUDA: the graph sees the kernels)."""
    if not _TRACES:
        return
    with _NO_MODES():
        for t in [out] if isinstance(out, torch.Tensor) else tensors_in((out,), {}):
            for trace in _TRACES:
                trace.made.add(_storage(t)[0])


class _Trace(TorchFunctionMode):
    """Records the ops a forward runs (name and argument signatures) and the storages it reads that it did not
    create; in capture mode, refuses what a capturing CUDA stream refuses (a synchronisation, a host→device copy) and
    a random op whose generator is not among ``generators``, and keeps the storages read (``held``, with the op and
    call site that first touched each: ``first_use``)."""

    def __init__(self, capturing: bool, generators: tuple[torch.Generator, ...] = ()) -> None:
        super().__init__()
        self.capturing = capturing
        self.generators = generators
        self.ops: list[tuple[str, Any, Any]] = []
        self.reads: set[int] = set()
        self.made: set[int] = set()
        self.held: dict[int, torch.UntypedStorage] = {}
        self.first_use: dict[int, str] = {}

    def __enter__(self) -> _Trace:
        _TRACES.append(self)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _TRACES.remove(self)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = op_name(func)
        if name.startswith("__get__") or name in NO_SIGNATURE:
            return func(*args, **kwargs)
        if self.capturing and name in READS:
            raise GraphError(f"{name} synchronises the device: illegal while a CUDA graph is being captured")
        if self.capturing and name in DRAWS:
            self._check_draw(name, kwargs.get("generator"))
        # the bookkeeping's own tensor calls (shape, storage) are not the forward's: no mode sees them
        with _NO_MODES():
            self.ops.append((name, _signature(args), _signature(sorted(kwargs.items())) if kwargs else ()))
            for t in tensors_in(args, kwargs):
                ptr, storage = _storage(t)
                if ptr not in self.made:
                    self.reads.add(ptr)
                    if self.capturing and storage is not None and ptr not in self.held and storage.nbytes() > 0:
                        self.held[ptr] = storage
                        self.first_use[ptr] = f"{name} at {call_site()}"
        out = func(*args, **kwargs)
        with _NO_MODES():
            for t in [out] if isinstance(out, torch.Tensor) else tensors_in((out,), {}):
                ptr, _ = _storage(t)
                if ptr not in self.reads:
                    self.made.add(ptr)
        return out

    def _check_draw(self, name: str, g: Any) -> None:
        if g is not None and any(g is r for r in self.generators):
            return
        which = "the default generator" if g is None else "a generator not registered with the graph"
        raise GraphError(
            f"{name} at {call_site()} draws random numbers from {which} while a CUDA graph is being captured: every "
            "replay would repeat the capture's draws. Draw outside the graph into a static buffer, or pass the "
            "generator to accel_graphs.capture(..., generators=) (CUDA's register_generator_state)"
        )


def _storage(t: torch.Tensor) -> tuple[int, torch.UntypedStorage | None]:
    """A tensor's storage as (data pointer, the storage), or (``id(t)``, None) for a tensor without one; a functorch
    wrapper (inside ``accel.vmap``) has the storage of the tensor it wraps."""
    while _functorch.is_batchedtensor(t):
        t = _functorch.get_unwrapped(t)
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s
    except (RuntimeError, NotImplementedError):
        return id(t), None
