"""The simulated CUDA device behind ``accel``'s seam (entered by ``accel.simulate`` or
``ADTBENCH_SIMULATE_DEVICE=cuda``: ``accel.activate_from_env``); its graphs are ``accel_graphs.StandInGraph``.

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
"""

from __future__ import annotations

import os
import sys
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_functorch: Any = torch._C._functorch  # vmap's wrappers (``Simulation.vmapped``)

SIM_DEVICE = torch.device("cpu", 0)
"""The simulated device: CPU memory, told apart from the host (``cpu``) by its index."""


class PlacementError(RuntimeError):
    """An op the simulated device refuses because CUDA would (a host tensor in device work, numpy of a device
    tensor, a generator on the other device)."""


active: Simulation | None = None
"""The active simulated device, or None (``accel.simulation()``)."""

# ---------------------------------------------------------------------------------------------------------
# The simulated device
# ---------------------------------------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_DEVICE_DESC = torch.Tensor.device
_IS_CUDA_DESC = torch.Tensor.is_cuda
_DATA_DESC = torch.Tensor.data

# host reads of device values: each synchronises a CUDA stream
READS = _words(
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
DRAWS = _RANDOM | _words("rand_like randn_like randint_like poisson binomial _standard_gamma dirichlet")
NO_SIGNATURE = _words("_set_grad_enabled is_grad_enabled _has_compatible_shallow_copy_type")
# a tensor's storage and address: neither reads nor places anything (the graph stand-in asks for every argument)
_METADATA = _words("untyped_storage data_ptr")


def op_name(func: Any) -> str:
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


_PLAIN = (tuple, list, dict)
"""The containers ``tensors_in`` walks itself; any other pytree node (a namedtuple, ``torch.return_types``, an
``OrderedDict``) goes through ``tree_flatten``."""


def tensors_in(args: Any, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among ``args`` and ``kwargs``' values, in ``tree_flatten``'s order (its leaves that are tensors).
    Every torch call under the simulation asks this, so plain tuples, lists and dicts are walked here: a torch op's
    arguments are tensors, numbers and flat sequences of them, and ``tree_flatten`` is ≈ 30 × slower on those."""
    found: list[torch.Tensor] = []
    for x in args if type(args) is tuple else (args,):  # the common case inline: a flat tuple of tensors and numbers
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif type(x) in _PLAIN or isinstance(x, _PLAIN):
            _collect(x, found)
    if kwargs:
        _collect(kwargs, found)
    return found


def _collect(x: Any, found: list[torch.Tensor]) -> None:
    if isinstance(x, torch.Tensor):
        found.append(x)
    elif type(x) in _PLAIN:
        for v in x.values() if type(x) is dict else x:
            _collect(v, found)
    elif isinstance(x, _PLAIN):  # a subclass: tree_flatten's own rules (a leaf unless registered)
        found.extend(v for v in tree_flatten(x)[0] if isinstance(v, torch.Tensor))


def _is_device_arg(d: Any) -> bool | None:
    """A ``device=`` argument: True for the simulated device (or any CUDA name), False for the host, None if
    absent."""
    if d is None:
        return None
    if isinstance(d, int):  # a bare index is a CUDA ordinal
        return True
    dev = torch.device(d) if not isinstance(d, torch.device) else d
    return dev.type == "cuda" or dev == SIM_DEVICE


_ACCEL_FILES = frozenset(
    os.path.join(os.path.dirname(__file__), n) for n in ("accel.py", "accel_sim.py", "accel_graphs.py")
)
"""The seam's own files: ``call_site`` names the first frame outside them."""


def call_site() -> str:
    """Where in adtbench (or a test) the current torch call was made: ``path:line in function``."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if (
            fn not in _ACCEL_FILES
            and ("/adtbench/" in fn or "/tests/" in fn or "/benchmarks/" in fn)
            and "/torch/" not in fn
        ):
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


class TensorTags:
    """A value per live tensor object, held weakly (the tensor's entry goes when its Python object does): the
    mapping ``torch.utils.weak.WeakTensorKeyDictionary`` is, keyed by ``id`` in a plain dict. Every torch call under
    the simulation asks it of each tensor argument, and the weak dictionary's Python-level key objects cost ≈ 3 ×
    this lookup (one ``dict.get`` and a weak reference's call)."""

    def __init__(self) -> None:
        self._refs: dict[int, tuple[weakref.ref, Any]] = {}

    def __contains__(self, t: object) -> bool:
        entry = self._refs.get(id(t))
        return entry is not None and entry[0]() is t

    def get(self, t: torch.Tensor, default: Any = None) -> Any:
        entry = self._refs.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else default

    def __getitem__(self, t: torch.Tensor) -> Any:
        entry = self._refs.get(id(t))
        if entry is None or entry[0]() is not t:
            raise KeyError(t)
        return entry[1]

    def __setitem__(self, t: torch.Tensor, value: Any) -> None:
        key = id(t)
        entry = self._refs.get(key)
        if entry is not None and entry[0]() is t:
            self._refs[key] = (entry[0], value)
            return
        refs = self._refs

        def drop(ref: weakref.ref, key: int = key) -> None:  # the tensor died: forget it, unless its id is reused
            if refs.get(key, (None,))[0] is ref:
                del refs[key]

        refs[key] = (weakref.ref(t, drop), value)

    def pop(self, t: torch.Tensor, default: Any = None) -> Any:
        key = id(t)
        entry = self._refs.get(key)
        if entry is None or entry[0]() is not t:
            return default
        del self._refs[key]
        return entry[1]

    def __len__(self) -> int:
        return sum(1 for ref, _ in self._refs.values() if ref() is not None)


_ON_DEVICE = TensorTags()
PINNED = TensorTags()  # ``pinned`` host buffers (page-locked on CUDA)
_HOST_SITE = TensorTags()


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
        self._vmapping = 0  # inside ``vmapped``: functorch wrappers are placed where what they wrap is

    # --- tags ---
    def is_device(self, t: torch.Tensor) -> bool:
        return t in self.on_device

    def _on(self, t: torch.Tensor) -> bool:
        """Is ``t`` on the device; inside ``vmapped`` a functorch wrapper is where the tensor it wraps is."""
        if t in self.on_device:
            return True
        while self._vmapping and _functorch.is_batchedtensor(t):
            t = _functorch.get_unwrapped(t)
            if t in self.on_device:
                return True
        return False

    def vmapped(self, mapped: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``mapped(*args)`` (a ``torch.vmap``-ped function, ``accel.vmap``): inside it, ops see functorch's
        wrappers of the arguments, placed where the wrapped tensors are; its outputs are device tensors when any
        argument is (functorch unwraps them where this mode cannot see). Mixing host and device arguments raises as
        any op does."""
        tensors = tensors_in(args, {})
        dev = [t for t in tensors if t in self.on_device]
        host = [t for t in tensors if t not in self.on_device and t.dim() > 0]
        if dev and host:
            raise PlacementError(
                f"simulated cuda: vmap at {call_site()} mixes a host tensor {list(host[0].shape)} {host[0].dtype} "
                f"({self._where(host[0])}) into device work: create it with device= the model's device"
            )
        self._vmapping += 1
        try:
            out = mapped(*args)
        finally:
            self._vmapping -= 1
        return self._tag(out, bool(dev), None if dev else f"{call_site()} (vmap)")

    def tag_device(self, t: torch.Tensor) -> torch.Tensor:
        self.on_device[t] = True
        return t

    def _tag(self, out: Any, device: bool, site: str | None) -> Any:
        for x in [out] if isinstance(out, torch.Tensor) else tensors_in(out, {}):
            if device:
                self.on_device[x] = True
            else:
                self.on_device.pop(x, None)
                if site is not None:
                    self.host_site[x] = site
        return out

    def _where(self, t: torch.Tensor) -> str:
        site = self.host_site.get(t)
        return f"made on the host at {site}" if site else "made on the host outside the simulation's view"

    def _read(self, name: str) -> None:
        self.counts["device_reads"] += 1
        self.reads_by_op[f"{name} at {call_site()}"] += 1

    def _h2d(self, name: str) -> None:
        self.counts["host_to_device_copies"] += 1
        self.reads_by_op[f"{name} (host→device) at {call_site()}"] += 1

    # --- the mode ---
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        name = getattr(func, "__name__", "")
        if name == "__get__":
            if owner is _DEVICE_DESC:
                return SIM_DEVICE if self._on(args[0]) else func(*args)
            if owner is _IS_CUDA_DESC:
                return self._on(args[0])
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and self._on(args[0]):
                self.on_device[out] = True
            return out
        if name == "__set__":
            if owner is _DATA_DESC:
                self._tag(args[0], self._on(args[1]), None)
            return func(*args, **kwargs)
        if func is torch.device:
            dev = func(*args, **kwargs)
            return SIM_DEVICE if dev.type == "cuda" else dev
        if name in NO_SIGNATURE or name in _METADATA:
            return func(*args, **kwargs)

        tensors = tensors_in(args, kwargs)
        on = [self._on(t) for t in tensors]
        dev_in = [t for t, d in zip(tensors, on) if d]
        if "device" in kwargs and _is_device_arg(kwargs["device"]):
            kwargs = {**kwargs, "device": SIM_DEVICE}

        # factories: born where ``device=`` says, or like their input
        if name in _FACTORIES and not (name == "normal" and tensors):
            on_dev = bool(_is_device_arg(kwargs.get("device")))
            if on_dev and name in ("tensor", "as_tensor") and not (tensors and self._on(tensors[0])):
                self._h2d(f"torch.{name}")
            self._check_generator(name, kwargs, on_dev)
            out = func(*args, **kwargs)
            return self._tag(out, on_dev, None if on_dev else f"{call_site()} (torch.{name} without a device)")
        if name in _LIKE or name in _NEW:
            arg = _is_device_arg(kwargs.get("device"))
            on_dev = bool(arg) if arg is not None else bool(dev_in)
            self._check_generator(name, kwargs, on_dev)
            return self._tag(func(*args, **kwargs), on_dev, None if on_dev else f"{call_site()} ({name})")

        # moves
        if name in ("to", "cuda", "cpu"):
            src = args[0]
            target = self._to_target(name, args, kwargs)
            if target is None:  # a dtype-only ``to``: stays where it is
                return self._tag(func(*args, **kwargs), self._on(src), None)
            if name == "cuda":
                args, kwargs = (src,), {}
                func = torch.Tensor.to
                kwargs = {"device": SIM_DEVICE}
            elif target:
                args, kwargs = self._rewrite_to(args, kwargs)
            src_dev = self._on(src)
            if target and not src_dev and src.numel() > 0:
                self._h2d(".to(device)")
            if not target and src_dev:
                self._read(name)
            out = func(*args, **kwargs)
            if out is src and target != src_dev:  # a move CUDA makes a copy of; in CPU memory torch returns src
                out = src.clone()
            return self._tag(out, target, None if target else f"{call_site()} (.{name}())")
        if name == "numpy" and dev_in:
            raise PlacementError(
                f"simulated cuda: .numpy() of a device tensor at {call_site()}; on CUDA: \"can't convert cuda:0 device "
                'type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first"'
            )

        # reads, cross-device copies, and the placement rule
        if name in READS and dev_in:
            self._read(name)
        if name == "__getitem__" and dev_in and self._bool_index(args):
            self._read("boolean-mask indexing")
        if name == "__setitem__" and self._on(args[0]) and _element_write(args[1], args[2]):
            self._h2d("__setitem__ of a Python number at an index")  # a blocking copy on CUDA (seen on an H200)
        if dev_in:
            host = [t for t, d in zip(tensors, on) if not d and t.dim() > 0]
            if name == "copy_" and not self._on(tensors[0]) and self._on(tensors[1]):
                if kwargs.get("non_blocking") and tensors[0] in PINNED:
                    self.counts["async_copies"] += 1  # into page-locked memory: CUDA copies without waiting
                else:
                    self._read("copy_ to the host")  # device → host: the host waits for the value
            elif host:
                if name in _CROSS:
                    self._h2d(name)
                else:
                    t = host[0]
                    raise PlacementError(
                        f"simulated cuda: {name} at {call_site()} mixes a host tensor {list(t.shape)} {t.dtype} "
                        f'({self._where(t)}) into device work; CUDA refuses it ("Expected all tensors to be on the '
                        "same device\"): create it with device= the model's device"
                    )
        elif name == "copy_" and len(tensors) >= 2 and self._on(tensors[1]):
            self._read("copy_ to the host")
        if name in _RANDOM:
            self._check_generator(name, kwargs, bool(dev_in) or bool(_is_device_arg(kwargs.get("device"))))
        out = func(*args, **kwargs)
        if not tensors:
            return out
        if name in ("copy_", "__setitem__") or (name.endswith("_") and not name.startswith("__")):
            return self._tag(out, self._on(tensors[0]), None) if isinstance(out, torch.Tensor) else out
        site = None if dev_in else next((self.host_site[t] for t in tensors if t in self.host_site), None)
        return self._tag(out, bool(dev_in), site)

    def _bool_index(self, args: Any) -> bool:
        return any(x.dtype == torch.bool and x.dim() > 0 for x in tensors_in(args[1:], {}))

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
                return a in active.on_device if active is not None else None
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
                f"simulated cuda: {name} at {call_site()}: Expected a '{want}' device type for generator but found "
                f"'{got}' (make the generator with accel.generator(device, seed))"
            )

    # --- lifetime ---
    def __enter__(self) -> Simulation:
        global active
        if active is not None:
            raise RuntimeError("a simulated device is already active")
        super().__enter__()
        active = self
        self._saved = {"Generator": torch.Generator, "from_numpy": torch.from_numpy}
        torch.Generator = _SimGenerator  # type: ignore[misc]
        from_numpy = self._saved["from_numpy"]

        def _from_numpy(a: Any) -> torch.Tensor:
            t = from_numpy(a)
            self.host_site[t] = f"{call_site()} (torch.from_numpy)"
            return t

        torch.from_numpy = _from_numpy  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        global active
        torch.Generator = self._saved["Generator"]  # type: ignore[misc]
        torch.from_numpy = self._saved["from_numpy"]  # type: ignore[assignment]
        active = None
        super().__exit__(*exc)

    def report(self) -> dict[str, int]:
        """The counters as plain ints (``device_reads``, ``host_to_device_copies``, ``synchronize``,
        ``graph_captures``, ``graph_replays``)."""
        keys = ("device_reads", "host_to_device_copies", "synchronize", "graph_captures", "graph_replays")
        return {k: int(self.counts[k]) for k in keys}
