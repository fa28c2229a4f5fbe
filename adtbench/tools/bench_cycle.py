"""Where a decode cycle's device time goes, measured without disturbing it (``adtbench bench overhead``).

``CycleTimer`` wraps the public calls every model forward of a cycle goes through — the target's ``verify_forward``
(an eager forward, a static-shape bucket, or a CUDA-graph replay of one), the drafter's ``extend`` / ``expand``
(likewise) and the drafter's LM head (``target.lm_head``) — with ``accel.mark`` around each outermost call: a
recorded CUDA event on a GPU (nothing waits), ``perf_counter`` elsewhere. Nothing synchronises per call: the marks
are turned into seconds by ``settle()`` once the device has passed them (the decode loop synchronises at the end of
each image). On a GPU the two events of a call bracket the device's timeline from the first kernel of the call to
its last, so a graph replay counts as model time and the engine's own kernels, launch gaps and waits between calls
are the rest of the cycle; calls nested in a timed call (the head inside a forward, a replay inside a verify) are
not timed twice. Calls made during the prefill (``engine.prefill``: the prompt pass, the first token, the drafter's
prefix pass) or the prompt's encoding are not timed: prefill is outside every cycle.

It also counts the **synchronisations** outside the prefill:

- on the simulated device (``ADTBENCH_SIMULATE_DEVICE=cuda``, ``accel.simulate()``): ``accel_sim.Simulation``'s counts —
  host reads of device values (``device_reads``) and blocking host→device copies (``host_to_device_copies``);
- on CUDA: every warning of ``torch.cuda.set_sync_debug_mode("warn")`` ("called a synchronizing CUDA operation":
  ``.item()`` / ``.tolist()`` / ``.cpu()``, ``nonzero`` and other data-dependent shapes, blocking copies), caught
  while the timer is active;
- on the host (a CPU model): nothing synchronises; ``source`` is None.

Explicit ``accel.synchronize`` calls (the decode loop's image boundaries) are counted apart (``explicit``); on
CUDA the sync debug mode is off during them, so they are not counted twice. ``replays`` counts the static-shape
forwards (``models.graphs``; the Jacobi step's and the tree verify's, ``methods.jacobi.step`` / ``tree_step``)
run through a captured graph, ``static_runs`` all of them: a graphed run that falls back to variable shapes shows as
``replays == 0``.
"""

from __future__ import annotations

import importlib
import warnings
from collections import Counter
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.cost import median_ms

TARGET = "target verify (verify_forward)"
DRAFTER = "drafter (extend / expand)"
DRAFTER_HEAD = "drafter LM head (target.lm_head)"
MODEL_CALLS: tuple[tuple[str, str, str], ...] = (
    ("target", "verify_forward", TARGET),
    ("drafter", "extend", DRAFTER),
    ("drafter", "expand", DRAFTER),
    ("target", "lm_head", DRAFTER_HEAD),
    # the device-resident Jacobi step (``engine.graphs.step``): its replay holds the verify and the engine work on the
    # device, so the overhead left is the host's (the draws, the verdict's copy, the wait one step late, the records)
    ("adtbench.algorithm.methods.jacobi.step:JacobiStep", "launch", TARGET),
    # the graphed tree verify (``engine.graphs.verify``): forward, processing and acceptance in one replay
    ("adtbench.algorithm.tree_step:TreeStep", "launch", TARGET),
)
"""(owner, attribute, label): the public calls every model forward of a cycle goes through, eager or graphed."""
_PREFILL: tuple[tuple[str, str], ...] = (
    ("adtbench.algorithm.engine", "prefill"),
    ("adtbench.algorithm.methods.jacobi.loop", "prefill_token"),  # the Jacobi loop's prefill (no drafter prefix pass)
    ("target", "encode_prompt"),
)
SYNC_WARNING = "synchronizing CUDA operation"  # torch.cuda.set_sync_debug_mode("warn")'s message
SIM_SOURCE = "simulated device counts (host reads + blocking host→device copies)"
CUDA_SOURCE = "torch.cuda.set_sync_debug_mode('warn') warnings (host reads + blocking copies)"


class CycleTimer:
    """Device time inside the model calls of the cycles, and the synchronisations (module docstring); a context
    manager that restores everything it wrapped. ``totals[label]`` (seconds) and ``calls[label]`` after ``settle()``;
    ``syncs`` (outside the prefill; ``sites``: by call site), ``prefill_syncs``, ``explicit``, ``replays``,
    ``static_runs``; ``source`` says where the synchronisations were counted (None: a host device, nothing to count)."""

    def __init__(self, target: Any, drafter: Any = None, calls: tuple[tuple[str, str, str], ...] = MODEL_CALLS) -> None:
        self.device: torch.device = target.device
        self.cuda = self.device.type == "cuda"
        self.sim = accel.simulation() if accel.is_cuda(self.device) else None
        self.source = SIM_SOURCE if self.sim is not None else CUDA_SOURCE if self.cuda else None
        self.totals: dict[str, float] = {label: 0.0 for _, _, label in calls}
        self.calls: dict[str, int] = {label: 0 for _, _, label in calls}
        self.syncs = self.prefill_syncs = self.explicit = self.replays = self.static_runs = 0
        self.split: Counter[str] = Counter()  # syncs outside the prefill by kind
        self.sites: Counter[str] = Counter()  # syncs outside the prefill by call site (what to move next)
        self._pending: list[tuple[str, Any, Any]] = []
        self._depth = 0
        self._prefill = 0
        self._caught: list[warnings.WarningMessage] = []
        self._warn_ctx: Any = None
        self._undo: list[tuple[Any, str, Any, bool]] = []
        self._instances = {"target": target, "drafter": drafter}
        self._calls = calls

    # --- counting ---------------------------------------------------------------------------------------------
    def _implicit(self) -> Counter[str]:
        """Synchronisations so far, by kind (the simulation's counters, or the caught CUDA warnings)."""
        if self.sim is not None:
            c = self.sim.counts
            return Counter({"device_reads": c["device_reads"], "host_to_device_copies": c["host_to_device_copies"]})
        if self.cuda:
            return Counter({"cuda_syncs": len(self._sync_warnings())})
        return Counter()

    def _sync_warnings(self) -> list[warnings.WarningMessage]:
        return [w for w in self._caught if SYNC_WARNING in str(w.message)]

    def _site_counts(self) -> Counter[str]:
        """Synchronisations so far by call site (``path:line``; the simulation's ``reads_by_op`` keys on it)."""
        if self.sim is not None:
            return Counter(self.sim.reads_by_op)
        if self.cuda:
            return Counter(_short(w.filename) + f":{w.lineno}" for w in self._sync_warnings())
        return Counter()

    # --- wrappers ---------------------------------------------------------------------------------------------
    def _timed(self, fn: Any, label: str) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            if self._depth or self._prefill:  # nested in a timed call, or prefill: not a cycle's own call
                return fn(*a, **k)
            self._depth += 1
            start = accel.mark(self.device)
            try:
                return fn(*a, **k)
            finally:
                self._pending.append((label, start, accel.mark(self.device)))
                self._depth -= 1

        return wrapped

    def _prefill_scope(self, fn: Any) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            self._prefill += 1
            before, sites = self._implicit(), self._site_counts()
            try:
                return fn(*a, **k)
            finally:
                self._prefill -= 1
                if not self._prefill:
                    self._prefill_delta += self._implicit() - before
                    self._prefill_sites += self._site_counts() - sites

        return wrapped

    def _explicit_sync(self, fn: Any) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            self.explicit += 1
            if not self.cuda:
                return fn(*a, **k)
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(0)
            try:
                return fn(*a, **k)
            finally:
                torch.cuda.set_sync_debug_mode(mode)

        return wrapped

    def _step_run(self, fn: Any) -> Any:
        def wrapped(step: Any) -> Any:
            self.static_runs += 1
            self.replays += step.graph is not None
            return fn(step)

        return wrapped

    def _jacobi_launch(self, fn: Any) -> Any:
        """``jacobi.step.JacobiStep.launch`` / ``tree_step.TreeStep.launch``: one static-shape forward (and engine
        step), replayed when graphed."""

        def wrapped(step: Any, width: int) -> Any:
            self.static_runs += 1
            self.replays += bool(step.graphed)
            return fn(step, width)

        return wrapped

    def _patch(self, owner: Any, attr: str, make: Any) -> None:
        own = attr in vars(owner)
        self._undo.append((owner, attr, vars(owner).get(attr) if own else None, own))
        setattr(owner, attr, make(getattr(owner, attr)))

    def _owner(self, name: str) -> Any:
        if name in self._instances:
            return self._instances[name]
        mod, _, cls = name.partition(":")
        owner = importlib.import_module(mod)
        return getattr(owner, cls) if cls else owner

    def __enter__(self) -> CycleTimer:
        from adtbench.models import graphs

        self._prefill_delta: Counter[str] = Counter()
        self._prefill_sites: Counter[str] = Counter()
        for owner_name, attr, label in self._calls:
            owner = self._owner(owner_name)
            if owner is not None and callable(getattr(owner, attr, None)):
                self._patch(owner, attr, lambda fn, label=label: self._timed(fn, label))
        for owner_name, attr in _PREFILL:
            owner = self._owner(owner_name)
            if owner is not None:
                self._patch(owner, attr, self._prefill_scope)
        self._patch(accel, "synchronize", self._explicit_sync)
        self._patch(graphs._Step, "run", self._step_run)
        from adtbench.algorithm import tree_step
        from adtbench.algorithm.methods.jacobi import step as jacobi_step

        self._patch(jacobi_step.JacobiStep, "launch", self._jacobi_launch)
        self._patch(tree_step.TreeStep, "launch", self._jacobi_launch)
        if self.cuda:
            self._warn_ctx = warnings.catch_warnings(record=True)
            self._caught = self._warn_ctx.__enter__()
            warnings.simplefilter("always")
            self._debug_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        self._base, self._base_sites = self._implicit(), self._site_counts()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._finish_counts()
        if self.cuda:
            torch.cuda.set_sync_debug_mode(self._debug_mode)
            self._warn_ctx.__exit__(*exc)
        for owner, attr, original, own in reversed(self._undo):
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)  # an instance attribute shadowing its class's: remove the shadow
        self._undo.clear()

    def _finish_counts(self) -> None:
        total = self._implicit() - self._base
        self.prefill_syncs = sum(self._prefill_delta.values())
        self.split = total - self._prefill_delta
        self.syncs = sum(self.split.values())
        self.sites = self._site_counts() - self._base_sites - self._prefill_sites

    # --- reading ------------------------------------------------------------------------------------------------
    def settle(self) -> None:
        """Turn the marks recorded so far into seconds (the device must have passed them: call after an image, whose
        end the decode loop synchronises) and bring the synchronisation counts up to date."""
        for label, a, b in self._pending:
            self.totals[label] += accel.elapsed_s(a, b)
            self.calls[label] += 1
        self._pending.clear()
        self._finish_counts()


def _short(path: str) -> str:
    """A warning's file as ``adtbench/…`` (or its last two parts)."""
    return path.split("/adtbench/", 1)[-1] if "/adtbench/" in path else "/".join(path.rsplit("/", 2)[-2:])


def device_bandwidth(device: torch.device, gib: float = 1.0, repeats: int = 10) -> float:
    """Measured device-memory bandwidth (GB/s) of ``device``: a ``gib``-GiB device-to-device copy reads and writes
    every byte once, so bytes moved = 2 × size; median of ``repeats`` CUDA-synchronised copies after one warm-up."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = median_ms(lambda: dst.copy_(src), repeats, sync=True)
    return 2 * n / (ms * 1e-3) / 1e9


OVERHEAD_COLUMNS = (
    "model",
    "policy",
    "device",
    "threads",
    "cycles",
    "cycle_ms",
    "target_forward_ms",
    "drafter_ms",
    "overhead_ms",
    "overhead_frac",
    "syncs_per_cycle",
    "graph_replays_per_cycle",
)


def overhead_table(r: dict) -> str:
    """An ``overhead`` result: its line (timing, what counted the synchronisations), then the Markdown row (last, for
    ``benchmarks/overhead.sh``'s ``tail -1``)."""

    def cell(v: Any) -> str:
        return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(OVERHEAD_COLUMNS) + " |\n|" + "---|" * len(OVERHEAD_COLUMNS)
    return overhead_line(r) + "\n\n" + head + "\n| " + " | ".join(cell(r.get(c)) for c in OVERHEAD_COLUMNS) + " |"


def overhead_line(o: dict) -> str:
    """One line of an ``overhead`` result: the split of a cycle and the synchronisations per cycle."""
    line = (
        f"engine overhead: {o['overhead_ms']:.2f} ms of a {o['cycle_ms']:.2f} ms cycle "
        f"({100 * o['overhead_frac']:.1f} %; target {o['target_forward_ms']:.2f} ms, drafter {o['drafter_ms']:.2f} ms"
    )
    if o.get("engine_compile"):
        line += f", {o.get('graph_replays_per_cycle', 0):.2f} graph replays per cycle"
    line += f"; {o.get('timing', 'timers')})"
    if o.get("syncs_per_cycle") is not None:
        line += f"; {o['syncs_per_cycle']:.2f} synchronisations per cycle ({o['sync_count']})"
    return line
