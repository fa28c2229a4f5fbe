"""The accelerator seam, and a simulated CUDA device that runs the GPU code paths on the CPU.

Every place adtbench asks "is this a CUDA device?", synchronises, marks time inside a decode, reads memory counters,
makes a random generator for the model's device or captures a CUDA graph goes through this module
(``is_cuda``, ``synchronize``, ``mark`` / ``elapsed_s``, ``generator``, ``capture``). On a real GPU these are the
CUDA calls. Under the simulated device they run on the CPU with CUDA's rules enforced, so that CI — which has no
GPU — executes the code a GPU runs and fails where a GPU would.

**The simulated device** (``ADTBENCH_SIMULATE_DEVICE=cuda`` for any ``adtbench`` / ``python run.py`` command,
``simulate()`` in tests). ``model.device=cuda`` (and ``auto``) then resolve to ``SIM_DEVICE`` (``cpu:0``: a CPU
tensor, told apart from host tensors by where it was born) and ``is_cuda`` says yes, so the engine takes its device
paths (device acceptance, the device clock, CUDA graphs through the stand-in below, bf16 by default). A
``TorchFunctionMode`` sees every torch call and enforces:

- **Placement.** A tensor is *on the device* when it was born there — a factory called with ``device=`` the
  device (or ``"cuda"``), ``.to(device)`` / ``.cuda()``, the parameters and buffers of a model moved there — or
  computed from a device tensor; anything else is *on the host* (``torch.tensor`` / ``arange`` / ``zeros`` … without
  a device, ``from_numpy``, ``.cpu()``, ``.to("cpu")``). An op that mixes a host tensor of one or more dimensions into
  device work raises ``PlacementError`` naming the op and where the host tensor was made, as CUDA refuses it (0-d
  host tensors are scalars CUDA accepts; indexing a device tensor with host indices and copies across are allowed
  and counted). ``.numpy()`` of a device tensor raises, as on CUDA. A random op whose generator lives elsewhere than
  its output raises (``Expected a 'cuda' device type for generator``).
- **Synchronisations.** Reads of device values by the host (``item``, ``tolist``, ``bool`` / ``int`` / ``float`` of a
  tensor, ``.cpu()``, ``nonzero``, boolean-mask indexing, ``unique``, …) and blocking host→device copies
  (``.to(device)`` of a host tensor, ``torch.tensor(data, device=…)``, ``copy_`` from the host) are counted:
  ``Simulation.counts`` (``device_reads``, ``host_to_device_copies``, ``synchronize``), reported by the app (run
  info ``simulated_device``) and ``adtbench bench overhead``.

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
import logging
import os
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

log = logging.getLogger("adtbench")

SIMULATE_ENV = "ADTBENCH_SIMULATE_DEVICE"
SIM_DEVICE = torch.device("cpu", 0)
"""The simulated device: CPU memory, told apart from the host (``cpu``) by its index."""


class PlacementError(RuntimeError):
    """An op the simulated device refuses because CUDA would (a host tensor in device work, numpy of a device
    tensor, a generator on the other device)."""


class GraphError(RuntimeError):
    """What a CUDA graph cannot do: synchronise, copy from the host or draw from an unregistered generator during
    capture, replay other ops, shapes or Python values than it captured, read a tensor it did not capture, or replay
    on a storage its owner dropped."""


# ---------------------------------------------------------------------------------------------------------
# The seam: device questions, synchronisation, timing marks, generators, memory
# ---------------------------------------------------------------------------------------------------------

_active: Simulation | None = None


def simulation() -> Simulation | None:
    """The active simulated device, or None."""
    return _active


def cuda_available() -> bool:
    """A CUDA device is there (real, or simulated)."""
    return _active is not None or torch.cuda.is_available()


def resolve(name: str) -> torch.device:
    """``auto`` / ``cuda[:i]`` / ``cpu`` → a torch device: under the simulated device ``auto`` and ``cuda`` are
    ``SIM_DEVICE``; otherwise ``auto`` is ``cuda`` when one is available. Raises ``ValueError`` for a CUDA device
    that is not there (callers name their config key)."""
    if name == "auto":
        name = "cuda" if cuda_available() else "cpu"
    dev = torch.device(name) if name != "cuda" or _active is None else SIM_DEVICE
    if dev.type == "cuda" and _active is not None:
        return SIM_DEVICE
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name!r} requested but no CUDA device is available")
    return dev


def is_cuda(device: torch.device | str | None) -> bool:
    """Does work on ``device`` run as on a CUDA device (a real one, or the simulated one)?"""
    if device is None:
        return False
    dev = device if isinstance(device, torch.device) else torch.device(device)
    return dev.type == "cuda" or (_active is not None and dev == SIM_DEVICE)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the device (a no-op on the host; counted on the simulated device)."""
    if _active is not None and (device is None or is_cuda(device)):
        _active.counts["synchronize"] += 1
    elif (device is None or torch.device(device).type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def mark(device: torch.device) -> Any:
    """A timestamp inside device work that does not synchronise: a recorded CUDA event on a GPU, ``perf_counter``
    elsewhere (the simulated device included: its work is done when the call returns)."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def elapsed_s(a: Any, b: Any) -> float:
    """Seconds between two ``mark``s (CUDA events: once the device has passed both, e.g. after ``synchronize``)."""
    if isinstance(a, float):
        return float(b - a)
    return 1e-3 * float(a.elapsed_time(b))


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded random generator for work on ``device`` (CUDA's own on a GPU; the simulated device's there, the
    host's on the CPU): sampling on the device must draw from a generator of that device."""
    return torch.Generator(device=device).manual_seed(int(seed))


def pinned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host buffer that ``copy_to_host`` fills without synchronising: page-locked memory when ``device`` is a GPU
    (a copy into pageable memory waits for the device), plain host memory elsewhere (the simulated device notes it as
    pinned, so its copies count as asynchronous)."""
    if device.type == "cuda":
        return torch.zeros(shape, dtype=dtype, pin_memory=True)
    out = torch.zeros(shape, dtype=dtype)
    _PINNED[out] = True
    return out


def copy_to_host(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Enqueue ``dst.copy_(src)`` from the device into a ``pinned`` host buffer without waiting for it: read ``dst``
    only after a ``Fence`` recorded after this call has been waited on. Counted as ``async_copies`` on the simulated
    device (its work is done when the call returns)."""
    dst.copy_(src, non_blocking=True)


class Fence:
    """A point in the device's queue the host can wait for later: ``record()`` after enqueuing work (a CUDA event on a
    GPU; a no-op elsewhere, where the work is done when its call returns), ``wait()`` blocks until the device passed
    it. Waiting on a fence recorded one step earlier, while the next step is queued, leaves the device busy (the
    graphed Jacobi loop's one-step-late read). Counted as ``fence_waits`` on the simulated device."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event() if device.type == "cuda" else None

    def record(self) -> None:
        if self.event is not None:
            self.event.record()

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
        elif _active is not None:
            _active.counts["fence_waits"] += 1


def device_name(device: torch.device) -> str:
    """What to print for the device: the GPU's name, or the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if is_cuda(device):
        return "simulated cuda (cpu)"
    return "cpu"


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak allocated device memory since ``reset_peak_memory`` (None where the device keeps no such count)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


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


def graphs_supported(device: torch.device) -> bool:
    """Does ``engine.compile`` run CUDA graphs (or their stand-in) on ``device``?"""
    return is_cuda(device)


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
        if _active is not None:
            _active.counts["graph_captures"] += 1

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
        if _active is not None:
            _active.counts["graph_replays"] += 1

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
                "uses alive while the graph lives (accel.capturing(): lean.scratch pins its captured buffers)"
            )


def _signature(x: Any) -> Any:
    """What of an argument a CUDA graph freezes: a tensor's shape and dtype, a Python value itself."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), str(x.dtype))
    if isinstance(x, list | tuple):
        return tuple(_signature(v) for v in x)
    if isinstance(x, int | float | bool | str | slice | type(None) | torch.dtype | torch.device):
        return x if not isinstance(x, slice) else ("slice", x.start, x.stop, x.step)
    return type(x).__name__


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

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = _name(func)
        if name.startswith("__get__") or name in _NO_SIGNATURE:
            return func(*args, **kwargs)
        if self.capturing and name in _READS:
            raise GraphError(f"{name} synchronises the device: illegal while a CUDA graph is being captured")
        if self.capturing and name in _DRAWS:
            self._check_draw(name, kwargs.get("generator"))
        self.ops.append((name, _signature(list(args)), _signature(sorted(kwargs.items()))))
        for t in _tensors(args, kwargs):
            ptr, storage = _storage(t)
            if ptr not in self.made:
                self.reads.add(ptr)
                if self.capturing and storage is not None and ptr not in self.held and storage.nbytes() > 0:
                    self.held[ptr] = storage
                    self.first_use[ptr] = f"{name} at {_site()}"
        out = func(*args, **kwargs)
        for t in _tensors((out,), {}):
            ptr, _ = _storage(t)
            if ptr not in self.reads:
                self.made.add(ptr)
        return out

    def _check_draw(self, name: str, g: Any) -> None:
        if g is not None and any(g is r for r in self.generators):
            return
        which = "the default generator" if g is None else "a generator not registered with the graph"
        raise GraphError(
            f"{name} at {_site()} draws random numbers from {which} while a CUDA graph is being captured: every "
            "replay would repeat the capture's draws. Draw outside the graph into a static buffer, or pass the "
            "generator to accel.capture(..., generators=) (CUDA's register_generator_state)"
        )


def _storage(t: torch.Tensor) -> tuple[int, torch.UntypedStorage | None]:
    """A tensor's storage as (data pointer, the storage), or (``id(t)``, None) for a tensor without one."""
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s
    except (RuntimeError, NotImplementedError):
        return id(t), None


# ---------------------------------------------------------------------------------------------------------
# The simulated device
# ---------------------------------------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_DEVICE_DESC = torch.Tensor.device
_IS_CUDA_DESC = torch.Tensor.is_cuda
_DATA_DESC = torch.Tensor.data

# host reads of device values: each synchronises a CUDA stream
_READS = _words(
    "item tolist __bool__ __int__ __float__ __index__ __complex__ __format__ __repr__ nonzero argwhere "
    "masked_select unique unique_consecutive equal allclose"
)
# ops CUDA runs across devices (a copy), counted as a host→device copy when a host tensor goes to the device
_CROSS = _words("copy_ __setitem__ __getitem__ index_put_ index_put to")
_FACTORIES = _words(
    "zeros ones full empty arange range rand randn randint randperm eye linspace logspace tensor "
    "as_tensor scalar_tensor empty_strided normal tril_indices triu_indices"
)
_LIKE = _words("zeros_like ones_like full_like empty_like rand_like randn_like randint_like")
_NEW = _words("new_zeros new_ones new_full new_empty new_tensor")
_RANDOM = _words(
    "rand randn randint randperm multinomial normal bernoulli uniform_ normal_ exponential_ geometric_ "
    "random_ cauchy_ log_normal_ bernoulli_"
)
# random ops: a draw during a graph capture must come from a registered generator (the ``_like`` ones take none)
_DRAWS = _RANDOM | _words("rand_like randn_like randint_like poisson binomial _standard_gamma dirichlet")
_NO_SIGNATURE = _words("_set_grad_enabled is_grad_enabled _has_compatible_shallow_copy_type")


def _name(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    if name in ("__get__", "__set__"):
        owner = getattr(func, "__self__", None)
        return f"{name}:{getattr(owner, '__name__', '')}"
    return name


def _element_write(key: Any, value: Any) -> bool:
    """``t[key] = value`` with a Python number written at an integer or tensor index: CUDA copies the number from the
    host (a blocking copy; seen on an H200 with ``torch.cuda.set_sync_debug_mode``), where a slice is a ``fill_``."""
    if not isinstance(value, int | float) or isinstance(key, slice):
        return False
    keys = key if isinstance(key, tuple) else (key,)
    return all(isinstance(k, int | torch.Tensor) for k in keys) or any(isinstance(k, torch.Tensor) for k in keys)


def _tensors(args: Any, kwargs: dict) -> list[torch.Tensor]:
    flat, _ = tree_flatten((args, kwargs))
    return [x for x in flat if isinstance(x, torch.Tensor)]


def _is_device_arg(d: Any) -> bool | None:
    """A ``device=`` argument: True for the simulated device (or any CUDA name), False for the host, None if
    absent."""
    if d is None:
        return None
    if isinstance(d, int):  # a bare index is a CUDA ordinal
        return True
    dev = torch.device(d) if not isinstance(d, torch.device) else d
    return dev.type == "cuda" or dev == SIM_DEVICE


def _site() -> str:
    """Where in adtbench (or a test) the current torch call was made: ``path:line in function``."""
    f = sys._getframe(2)
    here = __file__
    while f is not None:
        fn = f.f_code.co_filename
        if fn != here and ("/adtbench/" in fn or "/tests/" in fn or "/benchmarks/" in fn) and "/torch/" not in fn:
            short = (
                fn.split("/adtbench/", 1)[-1]
                if "/adtbench/" in fn
                else fn.rsplit("/", 2)[-2] + "/" + fn.rsplit("/", 1)[-1]
            )
            return f"{short}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back  # type: ignore[assignment]
    return "(outside adtbench)"


class _SimGenerator(torch.Generator):
    """``torch.Generator`` under the simulated device: one made for the device reports it as its ``device``."""

    def __new__(cls, device: Any = "cpu") -> _SimGenerator:
        return _BASE_GENERATOR.__new__(cls, device="cpu")  # type: ignore[call-arg]

    def __init__(self, device: Any = "cpu") -> None:
        self.on_device = bool(_is_device_arg(device))

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return SIM_DEVICE if self.on_device else torch.device("cpu")


_BASE_GENERATOR = torch.Generator


_ON_DEVICE: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_PINNED: WeakTensorKeyDictionary = WeakTensorKeyDictionary()  # ``pinned`` host buffers (page-locked on CUDA)
_HOST_SITE: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def _generator_on_device(g: Any) -> bool:
    return bool(getattr(g, "on_device", False))


class Simulation(TorchFunctionMode):
    """The simulated CUDA device (module docstring). ``counts``: ``device_reads`` (host reads of device values),
    ``host_to_device_copies``, ``synchronize``, ``graph_captures``, ``graph_replays``; ``reads_by_op`` splits the
    reads by op and call site (for finding them)."""

    def __init__(self) -> None:
        super().__init__()
        # where tensors were born is a fact of the tensor, not of one simulation: a tensor cached on the simulated
        # device (an ``lru_cache``d index, a plan) stays there for the next simulation of the same process
        self.on_device = _ON_DEVICE
        self.host_site = _HOST_SITE
        self.counts: Counter[str] = Counter()
        self.reads_by_op: Counter[str] = Counter()
        self._saved: dict[str, Any] = {}
        self.report_at_exit: Callable[[], None] | None = None  # ``activate_from_env``'s exit line

    # --- tags ---
    def is_device(self, t: torch.Tensor) -> bool:
        return t in self.on_device

    def tag_device(self, t: torch.Tensor) -> torch.Tensor:
        self.on_device[t] = True
        return t

    def _tag(self, out: Any, device: bool, site: str | None) -> Any:
        def tag(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                if device:
                    self.on_device[x] = True
                else:
                    self.on_device.pop(x, None)
                    if site is not None:
                        self.host_site[x] = site
            return x

        tree_map(tag, out)
        return out

    def _where(self, t: torch.Tensor) -> str:
        site = self.host_site.get(t)
        return f"made on the host at {site}" if site else "made on the host outside the simulation's view"

    def _read(self, name: str) -> None:
        self.counts["device_reads"] += 1
        self.reads_by_op[f"{name} at {_site()}"] += 1

    def _h2d(self, name: str) -> None:
        self.counts["host_to_device_copies"] += 1
        self.reads_by_op[f"{name} (host→device) at {_site()}"] += 1

    # --- the mode ---
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        name = getattr(func, "__name__", "")
        if name == "__get__":
            if owner is _DEVICE_DESC:
                return SIM_DEVICE if args[0] in self.on_device else func(*args)
            if owner is _IS_CUDA_DESC:
                return args[0] in self.on_device
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and args[0] in self.on_device:
                self.on_device[out] = True
            return out
        if name == "__set__":
            if owner is _DATA_DESC:
                self._tag(args[0], args[1] in self.on_device, None)
            return func(*args, **kwargs)
        if func is torch.device:
            dev = func(*args, **kwargs)
            return SIM_DEVICE if dev.type == "cuda" else dev
        if name in _NO_SIGNATURE:
            return func(*args, **kwargs)

        tensors = _tensors(args, kwargs)
        dev_in = [t for t in tensors if t in self.on_device]
        if "device" in kwargs and _is_device_arg(kwargs["device"]):
            kwargs = {**kwargs, "device": SIM_DEVICE}

        # factories: born where ``device=`` says, or like their input
        if name in _FACTORIES and not (name == "normal" and tensors):
            on_dev = bool(_is_device_arg(kwargs.get("device")))
            if on_dev and name in ("tensor", "as_tensor") and not (tensors and tensors[0] in self.on_device):
                self._h2d(f"torch.{name}")
            self._check_generator(name, kwargs, on_dev)
            out = func(*args, **kwargs)
            return self._tag(out, on_dev, None if on_dev else f"{_site()} (torch.{name} without a device)")
        if name in _LIKE or name in _NEW:
            arg = _is_device_arg(kwargs.get("device"))
            on_dev = bool(arg) if arg is not None else bool(dev_in)
            self._check_generator(name, kwargs, on_dev)
            return self._tag(func(*args, **kwargs), on_dev, None if on_dev else f"{_site()} ({name})")

        # moves
        if name in ("to", "cuda", "cpu"):
            src = args[0]
            target = self._to_target(name, args, kwargs)
            if target is None:  # a dtype-only ``to``: stays where it is
                return self._tag(func(*args, **kwargs), src in self.on_device, None)
            if name == "cuda":
                args, kwargs = (src,), {}
                func = torch.Tensor.to
                kwargs = {"device": SIM_DEVICE}
            elif target:
                args, kwargs = self._rewrite_to(args, kwargs)
            src_dev = src in self.on_device
            if target and not src_dev and src.numel() > 0:
                self._h2d(".to(device)")
            if not target and src_dev:
                self._read(name)
            out = func(*args, **kwargs)
            if out is src and target != src_dev:  # a move CUDA makes a copy of; in CPU memory torch returns src
                out = src.clone()
            return self._tag(out, target, None if target else f"{_site()} (.{name}())")
        if name == "numpy" and dev_in:
            raise PlacementError(
                f"simulated cuda: .numpy() of a device tensor at {_site()}; on CUDA: \"can't convert cuda:0 device "
                'type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first"'
            )

        # reads, cross-device copies, and the placement rule
        if name in _READS and dev_in:
            self._read(name)
        if name == "__getitem__" and dev_in and self._bool_index(args):
            self._read("boolean-mask indexing")
        if name == "__setitem__" and args[0] in self.on_device and _element_write(args[1], args[2]):
            self._h2d("__setitem__ of a Python number at an index")  # a blocking copy on CUDA (seen on an H200)
        if dev_in:
            host = [t for t in tensors if t not in self.on_device and t.dim() > 0]
            if name == "copy_" and tensors[0] not in self.on_device and tensors[1] in self.on_device:
                if kwargs.get("non_blocking") and tensors[0] in _PINNED:
                    self.counts["async_copies"] += 1  # into page-locked memory: CUDA copies without waiting
                else:
                    self._read("copy_ to the host")  # device → host: the host waits for the value
            elif host:
                if name in _CROSS:
                    self._h2d(name)
                else:
                    t = host[0]
                    raise PlacementError(
                        f"simulated cuda: {name} at {_site()} mixes a host tensor {list(t.shape)} {t.dtype} "
                        f'({self._where(t)}) into device work; CUDA refuses it ("Expected all tensors to be on the '
                        "same device\"): create it with device= the model's device"
                    )
        elif name == "copy_" and len(tensors) >= 2 and tensors[1] in self.on_device:
            self._read("copy_ to the host")
        if name in _RANDOM:
            self._check_generator(name, kwargs, bool(dev_in) or bool(_is_device_arg(kwargs.get("device"))))
        out = func(*args, **kwargs)
        if not tensors:
            return out
        if name in ("copy_", "__setitem__") or (name.endswith("_") and not name.startswith("__")):
            return self._tag(out, tensors[0] in self.on_device, None) if isinstance(out, torch.Tensor) else out
        site = None if dev_in else next((self.host_site[t] for t in tensors if t in self.host_site), None)
        return self._tag(out, bool(dev_in), site)

    def _bool_index(self, args: Any) -> bool:
        flat, _ = tree_flatten(args[1:])
        return any(isinstance(x, torch.Tensor) and x.dtype == torch.bool and x.dim() > 0 for x in flat)

    @staticmethod
    def _to_target(name: str, args: Any, kwargs: dict) -> bool | None:
        """Where a ``to`` / ``cuda`` / ``cpu`` call sends the tensor: True device, False host, None unchanged."""
        if name == "cuda":
            return True
        if name == "cpu":
            return False
        d = kwargs.get("device")
        for a in args[1:]:
            if isinstance(a, torch.device | str | int) and not isinstance(a, bool):
                d = a
            elif isinstance(a, torch.Tensor):
                return a in _active.on_device if _active is not None else None
        return _is_device_arg(d)

    @staticmethod
    def _rewrite_to(args: Any, kwargs: dict) -> tuple[Any, dict]:
        args = tuple(SIM_DEVICE if (isinstance(a, torch.device | str) and _is_device_arg(a)) else a for a in args)
        if "device" in kwargs:
            kwargs = {**kwargs, "device": SIM_DEVICE}
        return args, kwargs

    def _check_generator(self, name: str, kwargs: dict, on_device: bool) -> None:
        g = kwargs.get("generator")
        if g is None or name not in _RANDOM:
            return
        g_dev = _generator_on_device(g)
        if g_dev != on_device:
            want, got = ("cuda", "cpu") if on_device else ("cpu", "cuda")
            raise PlacementError(
                f"simulated cuda: {name} at {_site()}: Expected a '{want}' device type for generator but found "
                f"'{got}' (make the generator with accel.generator(device, seed))"
            )

    # --- lifetime ---
    def __enter__(self) -> Simulation:
        global _active
        if _active is not None:
            raise RuntimeError("a simulated device is already active")
        super().__enter__()
        _active = self
        self._saved = {"Generator": torch.Generator, "from_numpy": torch.from_numpy}
        torch.Generator = _SimGenerator  # type: ignore[misc]
        from_numpy = self._saved["from_numpy"]

        def _from_numpy(a: Any) -> torch.Tensor:
            t = from_numpy(a)
            self.host_site[t] = f"{_site()} (torch.from_numpy)"
            return t

        torch.from_numpy = _from_numpy  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        global _active
        torch.Generator = self._saved["Generator"]  # type: ignore[misc]
        torch.from_numpy = self._saved["from_numpy"]  # type: ignore[assignment]
        _active = None
        super().__exit__(*exc)

    def report(self) -> dict[str, int]:
        """The counters as plain ints (``device_reads``, ``host_to_device_copies``, ``synchronize``,
        ``graph_captures``, ``graph_replays``)."""
        keys = ("device_reads", "host_to_device_copies", "synchronize", "graph_captures", "graph_replays")
        return {k: int(self.counts[k]) for k in keys}


@contextlib.contextmanager
def simulate() -> Iterator[Simulation]:
    """Run the block on the simulated CUDA device (module docstring)."""
    with Simulation() as sim:
        yield sim


def activate_from_env() -> Simulation | None:
    """Enter the simulated device for the rest of the process when ``ADTBENCH_SIMULATE_DEVICE=cuda`` (an entry
    point's first call); any other non-empty value is an error naming the variable."""
    value = os.environ.get(SIMULATE_ENV, "").strip()
    if not value:
        return None
    if value != "cuda":
        raise SystemExit(f"adtbench: {SIMULATE_ENV}={value!r}: the only simulated device is 'cuda'")
    sim = Simulation()
    sim.__enter__()
    log.info("simulated device: model.device=cuda runs on the CPU with CUDA's placement rules (%s)", SIMULATE_ENV)
    import atexit

    def report_at_exit() -> None:
        print(f"adtbench: simulated cuda: {sim.report()}", file=sys.stderr)

    sim.report_at_exit = report_at_exit  # a caller running the entry point in process unregisters it (tests)
    atexit.register(report_at_exit)
    return sim
