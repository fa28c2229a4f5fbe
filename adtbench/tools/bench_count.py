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

``adtbench bench count``: the same dispatcher count for one step of the target alone (``step_ops``; any machine) —
the aten ops of an AR step (one token: ``ar_step``) or of a verify of n nodes, split into the decoder layers (per
layer), the LM head, the rest of the network (embedding, mask, rotary tables, final norm, the static buffers' load)
and the logits processing / token choice / commit, each also as *kernels* (ops that are not views: what a CUDA graph
replays) — on the eager (variable-shape) path and on the static-shape path a CUDA graph captures
(``models.graphs``)::

    adtbench bench count [model=mini] [bench.nodes=[1,8,16,32]] [bench.paths=[eager,static]] [bench.fill=0.5]
                         [bench.out=FILE]
"""

from __future__ import annotations

import contextlib
import importlib
import os
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from adtbench import accel

READ_METHODS = frozenset(
    {"tolist", "numpy", "cpu", "item", "__bool__", "__float__", "__int__", "__index__", "__array__", "__complex__"}
)
DATA_DEPENDENT = frozenset(
    {"nonzero", "masked_select", "unique", "unique_consecutive", "argwhere", "bincount", "nonzero_static"}
)
HIDDEN_READS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2"})
MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
METADATA = frozenset({"aten::_unsafe_view", "aten::_reshape_alias", "aten::lift_fresh", "aten::detach"})
"""Ops that only make new tensor metadata but carry no alias annotation (counted as views)."""
PREFILL = "prefill"
REST = "cycle (rest)"


def is_view(func: Any) -> bool:
    """Does this aten op only make a view (no kernel on a device, nothing in a CUDA graph)?"""
    return bool(getattr(func, "is_view", False)) or func.name() in METADATA


def matmul_flops(name: str, args: tuple) -> int:
    """2·M·K·N of an ``aten::mm`` / ``addmm`` (summed over the batch of ``bmm`` / ``baddbmm``)."""
    a, b = (args[1], args[2]) if name in ("aten::addmm", "aten::baddbmm") else (args[0], args[1])
    batch = a.shape[0] if a.dim() == 3 else 1
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def is_transfer(func: Any, args: tuple, kwargs: dict) -> bool:
    """A copy that may cross host and device: ``.to(<device>)``, ``.cuda()``, or a tensor made from Python data
    (``torch.tensor`` / ``as_tensor``). A pageable host→device copy synchronises the stream too; on the CPU these are
    no-ops or plain copies, so they are counted apart from the reads."""
    name = getattr(func, "__name__", "")
    if name in ("cuda", "tensor", "as_tensor"):
        return True
    if name == "to":
        dest = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
        if dest is None:
            return False
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        return src is None or src.device != torch.device(dest)  # to its own device: the tensor itself, no copy


def is_host_read(func: Any, args: tuple, kwargs: dict, device: torch.device | None = None) -> bool:
    """Does this torch-function call make the host wait for a device value (module docstring)? ``device``: the run's
    device; where it is a CUDA one (real or simulated), a read of a tensor on the host (``.numpy()`` of a CPU tensor:
    the policy's own host arrays) waits for nothing. Without it every tensor is the device's (a CPU run)."""
    name = getattr(func, "__name__", "")
    if name in READ_METHODS or name in DATA_DEPENDENT:
        host = bool(args) and isinstance(args[0], torch.Tensor) and not accel.is_cuda(args[0].device)
        return name != "nonzero_static" and not (host and device is not None and accel.is_cuda(device))
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

    def __init__(self, network: frozenset[str], device: torch.device | None = None) -> None:
        self.network = network
        self.device = device  # the run's device (``is_host_read``)
        self.ops: Counter[str] = Counter()
        self.views: Counter[str] = Counter()  # the ops of ``ops`` that only make views (no kernel)
        self.flops: Counter[str] = Counter()  # multiply-adds ×2 of the matrix products (``MATMULS``)
        self.keys: Counter[str] = Counter()  # key columns the attention kernels read (summed over calls)
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
                if not is_host_read(func, args, kwargs, outer.device):
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
                if is_view(func):
                    outer.views[outer.label] += 1
                if func._schema.name in MATMULS:
                    outer.flops[outer.label] += matmul_flops(func._schema.name, args)
                elif "scaled_dot_product" in func.name():
                    outer.keys[outer.label] += args[1].shape[-2]
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
        kernels = engine - sum(self.views[k] for k in labels if k not in self.network)
        net = sum(self.ops[k] for k in labels if k in self.network)
        reads = sum(self.reads[k] for k in labels if k not in self.network)
        net_reads = sum(self.reads[k] for k in labels if k in self.network)
        transfers = sum(self.transfers[k] for k in labels if k not in self.network)
        rows = [
            {
                "phase": k,
                "ops_per_cycle": self.ops[k] / cycles,
                "reads_per_cycle": self.reads[k] / cycles,
                "transfers_per_cycle": self.transfers[k] / cycles,
                "network": k in self.network,
            }
            for k in sorted(labels, key=lambda k: (-self.reads[k], -self.ops[k]))
        ]
        return {
            "cycles": cycles,
            "host_reads_per_cycle": reads / cycles,
            "engine_ops_per_cycle": engine / cycles,
            "engine_kernels_per_cycle": kernels / cycles,  # the ops that are not views: launches on a GPU
            "network_ops_per_cycle": net / cycles,
            "network_reads_per_cycle": net_reads / cycles,
            "transfers_per_cycle": transfers / cycles,
            "prefill_ops": self.ops[PREFILL],
            "prefill_reads": self.reads[PREFILL],
            "phases": rows,
            "read_sites": [{"site": s, "per_cycle": n / cycles} for s, n in self.sites.most_common(top_sites)],
        }


# ---------------------------------------------------------------------------------------------------------
# ``adtbench bench count``: the aten ops of one target step, per decoder layer
# ---------------------------------------------------------------------------------------------------------

LAYERS, HEAD, NET_REST, PROCESSING, COMMIT = "decoder layers", "LM head", "network (rest)", "processing", "commit"
STEP_PHASES = (LAYERS, HEAD, NET_REST, PROCESSING, COMMIT)


@contextlib.contextmanager
def labelled(counter: DeviceCounter, calls: list[tuple[Any, str, str]]) -> Iterator[None]:
    """Within: each ``(owner, attribute, label)`` call runs under its label in ``counter`` (owner: an object, a class
    or a module; a module path string is imported). Every attribute is restored on exit."""
    undo: list[tuple[Any, str, Any, bool]] = []

    def wrap(fn: Any, label: str) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            counter.push(label)
            try:
                return fn(*a, **k)
            finally:
                counter.pop()

        return wrapped

    try:
        for owner, attr, label in calls:
            if isinstance(owner, str):
                owner = importlib.import_module(owner)
            own = attr in vars(owner)
            undo.append((owner, attr, vars(owner).get(attr), own))
            setattr(owner, attr, wrap(getattr(owner, attr), label))
        yield
    finally:
        for owner, attr, original, own in reversed(undo):
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)


def _head_call(target: Any) -> tuple[Any, str]:
    """The (owner, attribute) of the target's LM head inside its forward."""
    if hasattr(target, "logits_head"):
        return target, "logits_head"
    return target.net.output, "forward"


@torch.no_grad()
def step_ops(target: Any, sp: Any, nodes: int = 1, static: bool = False, fill: float = 0.5) -> dict:
    """The aten ops of one step of ``target`` by phase (``STEP_PHASES``; module docstring): an AR step (``nodes`` 1:
    ``ar.ar_step``, forward + processing + token choice + commit) or a verify of a chain of ``nodes`` tokens
    (forward + processing of every node). ``static``: through the static-shape buckets (``request_static``, no
    capture: the forward a CUDA graph captures) on a fresh prefill, after ``fill`` of the image was committed (random
    tokens: ``cost.fill_cache_to``, as the cost model measures). The second of two identical steps is counted (the first
    builds the per-device caches). Returns per phase ``ops`` / ``views`` / ``kernels`` / matmul MFLOP, the per-layer
    figures and the key columns each layer's attention reads against the live KV length.
    """
    from adtbench.algorithm import ar
    from adtbench.algorithm.cost import fill_cache_to
    from adtbench.algorithm.sampling import process_logits

    if static:
        target.request_static(graphs=False)
    gen = torch.Generator(device=target.device).manual_seed(0)
    fill_cache_to(target, fill, max(nodes, 1), gen, sp.use_cfg and target.supports_cfg)
    lay, dev = target.layout, target.valid.device
    token = torch.tensor(lay.image_token_offset, device=dev)
    chain = torch.ones(nodes, nodes, dtype=torch.bool, device=dev).tril()
    depth = torch.arange(nodes, device=dev)

    def step() -> None:
        if nodes == 1:
            ar.ar_step(target, token, 1, sp, None)
            return
        raw, _ = target.verify_forward(token.expand(nodes).clone(), chain, depth)
        process_logits(raw, depth + 1, lay, sp)

    step()  # warm: lazily built caches (rotary tables, one-node masks, inference weights, static buffers)
    counter = DeviceCounter(frozenset())
    calls = [
        ("adtbench.models.lean", "decoder_layer", LAYERS),
        (*_head_call(target), HEAD),
        (target, "verify_forward", NET_REST),
        (ar, "process_logits", PROCESSING),
        (ar, "next_token_tensor", PROCESSING),
        (target, "commit", COMMIT),
    ]
    live = target.length
    with labelled(counter, calls), counter:
        counter.push(PROCESSING)  # a verify's processing runs outside any labelled call
        step()
        counter.pop()
    layers = len(target.net.layers)
    phases = {
        p: {
            "ops": counter.ops[p],
            "views": counter.views[p],
            "kernels": counter.ops[p] - counter.views[p],
            "matmul_mflop": counter.flops[p] / 1e6,
        }
        for p in STEP_PHASES
    }
    total = sum(counter.ops[p] for p in STEP_PHASES)
    views = sum(counter.views[p] for p in STEP_PHASES)
    return {
        "nodes": nodes,
        "path": "static" if static else "eager",
        "layers": layers,
        "per_layer_ops": counter.ops[LAYERS] / layers,
        "per_layer_kernels": (counter.ops[LAYERS] - counter.views[LAYERS]) / layers,
        "key_columns": counter.keys[LAYERS] / layers,  # what each layer's attention reads
        "live_columns": live,  # committed KV columns before the step
        "step_ops": total,
        "step_kernels": total - views,
        "phases": phases,
    }


def count_table(model: str, rows: list[dict]) -> str:
    """Markdown table of ``step_ops`` results."""
    head = (
        f"{model}: aten ops of one step (kernels = ops that are not views)\n\n"
        "| path | nodes | per layer ops | per layer kernels | LM head ops | network rest ops | processing + commit "
        "ops | step ops | step kernels | LM head MFLOP | key columns (live) |\n|---|" + "---:|" * 10
    )
    lines = [head]
    for r in rows:
        ph = r["phases"]
        lines.append(
            f"| {r['path']} | {r['nodes']} | {r['per_layer_ops']:g} | {r['per_layer_kernels']:g} | "
            f"{ph[HEAD]['ops']} | {ph[NET_REST]['ops']} | {ph[PROCESSING]['ops'] + ph[COMMIT]['ops']} | "
            f"{r['step_ops']} | {r['step_kernels']} | {ph[HEAD]['matmul_mflop']:.3g} | "
            f"{r['key_columns']:g} ({r['live_columns']}) |"
        )
    return "\n".join(lines)


def main(args: list[str]) -> int:
    """``adtbench bench count [overrides]`` (module docstring): one fresh target per (path, nodes)."""
    from adtbench.algorithm.ar import ar_tokens
    from adtbench.errors import ConfigError
    from adtbench.harness.config import compose_config, refuse_reference_in_bench, resolve_paths
    from adtbench.io import atomic_write_json
    from adtbench.models.registry import build_target
    from adtbench.sampling_params import build_sampling

    extra = ["+bench.nodes=[1,8,16,32]", "+bench.paths=[eager,static]", "+bench.fill=0.5", "+bench.out=null"]
    try:
        cfg = compose_config("config", [*extra, *args])
        refuse_reference_in_bench(cfg, "count")
        resolve_paths(cfg)
        sp = build_sampling(cfg.sampling)
        rows = []
        for path in cfg.bench.paths:
            if str(path) not in ("eager", "static"):
                raise ConfigError("bench.paths", f"paths are eager or static, got {path!r}")
            for n in cfg.bench.nodes:
                target = build_target(cfg.model, plain_decode=ar_tokens)
                rows.append(step_ops(target, sp, int(n), str(path) == "static", float(cfg.bench.fill)))
    except ConfigError as e:
        print(f"adtbench: config error: {e}")
        return 2
    print(count_table(str(cfg.model.name), rows))
    if cfg.bench.out:
        atomic_write_json(Path(str(cfg.bench.out)), {"model": str(cfg.model.name), "rows": rows}, newline=False)
    return 0


if __name__ == "__main__":
    import sys

    from adtbench import accel

    accel.activate_from_env()  # ADTBENCH_SIMULATE_DEVICE=cuda, as the ``adtbench`` command
    sys.exit(main(sys.argv[1:]))
