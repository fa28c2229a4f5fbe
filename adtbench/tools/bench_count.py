"""``adtbench bench overhead bench.count=true``: what the decode loop asks of the device, counted on any machine.

On a GPU the engine's cost outside the networks is launches and synchronisations: every aten op the host issues is
(at least) one kernel launch, and every read of a device value on the host — ``.item()``, ``.tolist()``, ``.cpu()``,
``.numpy()``, ``bool()`` / ``float()`` / ``int()`` of a tensor, an op whose output shape depends on the data
(``nonzero``, boolean-mask indexing, ``unique`` …) — waits for the device to finish everything queued before it.
Both are properties of the code path, not of the machine, so they can be counted on the CPU:

- ``engine_ops_per_cycle``: aten ops (``TorchDispatchMode``: every op the dispatcher sees, views included) issued
  while no network runs — the target's ``_forward``, the drafter's ``forward``, the LM head and the token embedding
  are networks (their ops are reported apart as ``network_ops_per_cycle``);
- ``host_reads_per_cycle``: the calls listed above (``TorchFunctionMode``; a read inside a read counts once) and the
  reads no Python call names — an aten ``_local_scalar_dense`` or ``nonzero`` issued inside another op, e.g.
  indexing with a 0-d tensor — outside the networks; reads inside them are ``network_reads_per_cycle`` (on the CPU
  the rotary tables are gathered from a per-position table sized by a read — a CPU-only path; on a GPU they are
  computed directly);
- ``transfers_per_cycle``: ``.to(<device>)``, ``.cuda()``, ``torch.tensor`` / ``as_tensor`` of Python data outside the
  networks — host→device copies on a GPU (a pageable one synchronises the stream as well), no-ops on the CPU.

Acceptance runs on the device (``engine.acceptance=device``, what a GPU runs) whatever the config says: on the CPU
the default is the float64 host walk, which reads the device by design. Prefill (the prompt pass, the first token,
the drafter's prefix pass: ``engine.prefill``) is excluded; the figures
are totals over the prompts' cycles divided by the cycles. Counts are attributed to the innermost active phase of
``bench.PHASES`` (or ``cycle (rest)``), and ``read_sites`` names the lines that read outside the networks, busiest
first. Prompt encoding (outside the timed scope) counts as prefill.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

READ_METHODS = frozenset(
    {"tolist", "numpy", "cpu", "item", "__bool__", "__float__", "__int__", "__index__", "__array__", "__complex__"}
)
DATA_DEPENDENT = frozenset(
    {"nonzero", "masked_select", "unique", "unique_consecutive", "argwhere", "bincount", "nonzero_static"}
)
HIDDEN_READS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2"})
PREFILL = "prefill"
REST = "cycle (rest)"


def is_transfer(func: Any, args: tuple, kwargs: dict) -> bool:
    """A copy that may cross host and device: ``.to(<device>)``, ``.cuda()``, or a tensor made from Python data
    (``torch.tensor`` / ``as_tensor``). A pageable host→device copy synchronises the stream too; on the CPU these are
    no-ops or plain copies, so they are counted apart from the reads."""
    name = getattr(func, "__name__", "")
    if name in ("cuda", "tensor", "as_tensor"):
        return True
    if name == "to":
        return "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:])
    return False


def is_host_read(func: Any, args: tuple, kwargs: dict) -> bool:
    """Does this torch-function call make the host wait for a device value (module docstring)?"""
    name = getattr(func, "__name__", "")
    if name in READ_METHODS or name in DATA_DEPENDENT:
        return name != "nonzero_static"
    if name in ("__getitem__", "__setitem__") and len(args) > 1:
        idx = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx)
    if name == "where":
        return len(args) + len(kwargs) == 1  # torch.where(cond): nonzero
    if name == "repeat_interleave":
        return len(args) > 1 and isinstance(args[1], torch.Tensor) and "output_size" not in kwargs
    return False


class DeviceCounter:
    """Counts aten ops and host reads per phase label while active (a context manager).

    ``push(label)`` / ``pop()`` bracket a phase (the bench's wrappers call them); ``network`` labels' ops count as
    network ops. ``sites`` counts host reads by the first frame inside adtbench that is not this module."""

    def __init__(self, network: frozenset[str]) -> None:
        self.network = network
        self.ops: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.transfers: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self.stack: list[str] = []
        self._in_read = 0
        outer = self

        class _Reads(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                kwargs = kwargs or {}
                if is_transfer(func, args, kwargs):
                    outer.transfers[outer.label] += 1
                if not is_host_read(func, args, kwargs):
                    return func(*args, **kwargs)
                outer._read()
                outer._in_read += 1
                try:
                    return func(*args, **kwargs)
                finally:
                    outer._in_read -= 1

        class _Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                outer.ops[outer.label] += 1
                if outer._in_read == 0 and func.name() in HIDDEN_READS:
                    outer._read()  # a read no Python call asked for, e.g. indexing with a 0-d tensor (``x[t]``)
                return func(*args, **(kwargs or {}))

        self._modes = (_Reads(), _Ops())

    @property
    def label(self) -> str:
        return self.stack[-1] if self.stack else REST

    def _read(self) -> None:
        self.reads[self.label] += 1
        if self.label == PREFILL or self.label in self.network:
            return
        here = os.path.dirname(os.path.abspath(__file__))
        pkg = os.path.dirname(here)
        for frame in reversed(traceback.extract_stack(limit=12)[:-2]):
            path = os.path.abspath(frame.filename)
            if path.startswith(pkg) and not path.startswith(os.path.join(here, "bench")):
                self.sites[f"{os.path.relpath(path, os.path.dirname(pkg))}:{frame.lineno} {frame.name}"] += 1
                break

    def push(self, label: str) -> None:
        self.stack.append(label)

    def pop(self) -> None:
        self.stack.pop()

    def __enter__(self) -> DeviceCounter:
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)

    def per_cycle(self, cycles: int, top_sites: int = 15) -> dict[str, Any]:
        """The JSON fields of ``bench.count=true`` (module docstring), prefill excluded."""
        labels = (set(self.ops) | set(self.reads) | set(self.transfers)) - {PREFILL}
        engine = sum(self.ops[k] for k in labels if k not in self.network)
        net = sum(self.ops[k] for k in labels if k in self.network)
        reads = sum(self.reads[k] for k in labels if k not in self.network)
        net_reads = sum(self.reads[k] for k in labels if k in self.network)
        transfers = sum(self.transfers[k] for k in labels if k not in self.network)
        rows = [
            {"phase": k, "ops_per_cycle": self.ops[k] / cycles, "reads_per_cycle": self.reads[k] / cycles,
             "transfers_per_cycle": self.transfers[k] / cycles, "network": k in self.network}
            for k in sorted(labels, key=lambda k: (-self.reads[k], -self.ops[k]))
        ]  # fmt: skip
        return {
            "cycles": cycles,
            "host_reads_per_cycle": reads / cycles,
            "engine_ops_per_cycle": engine / cycles,
            "network_ops_per_cycle": net / cycles,
            "network_reads_per_cycle": net_reads / cycles,
            "transfers_per_cycle": transfers / cycles,
            "prefill_ops": self.ops[PREFILL],
            "prefill_reads": self.reads[PREFILL],
            "phases": rows,
            "read_sites": [{"site": s, "per_cycle": n / cycles} for s, n in self.sites.most_common(top_sites)],
        }
