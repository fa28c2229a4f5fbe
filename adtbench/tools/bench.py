"""Benchmarks (scripts, not tests).

    adtbench bench overhead [hydra overrides] [bench.prompts=N] [bench.phases=true | bench.count=true] [bench.out=FILE]
                            [bench.overhead_tokens=N]
    adtbench bench cost model=anole model.random_init=true [bench.tree_sizes=[1,2,...]] [bench.level_nodes=16]
                        [bench.repeats=20] [bench.overhead_prompts=2] [bench.out=FILE]
    adtbench bench probe [overrides] [bench.buckets=[1,2,...,128]] [bench.repeats=20] [bench.prompts=1] [bench.out=FILE]
                         [bench.overhead_tokens=N]
    adtbench bench speed [bench.rows=[...]] [bench.prompts=20] [bench.out=DIR] [bench.results=results] [overrides]
    adtbench bench versus [overrides] --variant NAME [overrides] --variant NAME [overrides] ... [bench.prompts=20]
    adtbench bench batch [overrides] [bench.sizes=[1,2,4,8,16,32]] [bench.prompts=32] [bench.out=DIR]
                         [bench.readme=FILE]

``overhead``: engine overhead per draft–verify cycle = cycle time − time inside the target's verifies − time inside
the drafter (its ``extend`` / ``expand`` and the LM-head calls that score its outputs), per cycle, over
``bench.prompts`` prompts after one warm-up generation (``adtbench.tools.bench_cycle.CycleTimer``). The model time is
taken around the public calls both paths go through — ``target.verify_forward``, ``drafter.extend`` /
``drafter.expand``, ``target.lm_head`` — so with ``engine.compile=true`` a CUDA-graph replay counts as target or
drafter time, never as overhead (the verify's mask and input copies count with it). On CUDA the marks are CUDA events
and nothing synchronises per call: the device is synchronised once at the end of each image, then the events are
read, so the overhead is the device timeline's share outside the model calls (engine kernels, launch gaps, waits).
Prefill (the prompt pass, the first token, the drafter's prefix pass) and prompt encoding are outside every cycle.
It also reports the synchronisations per cycle outside the prefill (on the simulated device from
``accel_sim.Simulation``'s counts, on CUDA from ``torch.cuda.set_sync_debug_mode("warn")``), the explicit
synchronisations per image (the loop's image boundaries) and the graph replays per cycle. Models built here are
compiled (``engine.compile``) before the policy binds, as in the app. ``bench.overhead_tokens=N`` (a Jacobi loop
only; default null: the whole image) stops each decode once N tokens are committed — how the CPU runs the overhead of
an 8,191-token Emu3 image (``tests/test_emu3_shape.py``); a GPU measures whole images.

``bench.phases=true`` splits the cycle instead into the exclusive time of each part of the decode loop (``PHASES``:
target network — variable-shape forward or static bucket / graph replay —, masks, acceptance, drafter network,
drafting bookkeeping, draws, policy, …) and the rest of the cycle's own lines; a host-side diagnostic that
synchronises a GPU around every phase. ``bench.count=true`` counts instead, per cycle and per phase, the aten ops
issued outside the networks and the device→host reads (``adtbench.tools.bench_count``; any machine); with
``decode.batch_size=B > 1`` per *batched* cycle (one target forward for every slot) over one window of the method's
side holding every prompt (the slots' admissions counted as prefill; at B > 1 the tool only counts).

``cost``: the cost model of one draft–verify cycle on this machine (``adtbench.algorithm.cost.measure_cost``, the same
measurement ``budget: cost`` trees use), for any model — real-shaped ones with random weights included (timing
does not depend on the weights): the target's verification forward vs tree size (1…128 nodes by default) at a
KV length of half the image, one drafter level vs its node count (drafter forward + LM head + processing), the
fixed per-cycle work, and — unless ``bench.overhead_prompts=0`` — the engine's non-model overhead per cycle
measured by ``overhead`` on full generations. Each timing is the median of ``bench.repeats`` runs after warm-up,
CUDA-synchronised on a GPU. CPU and GPU alike.

``probe``: the graphed engine on this device, bucket by bucket (``adtbench.tools.bench_probe``): pure replay time per
verify bucket against the weight-read floor, the verify call's time in AR steps, graphed against eager logits, an AR
step's time and device work (kernels and launches on CUDA), and the default policy's overhead and synchronisations
per cycle.

``speed``: the speed table (``adtbench.tools.bench_speed``): one app job per row on the same prompts, each timing the
AR baseline in the same job; τ, d̄, speedup with its CI and median, and the cost model's bound per row.

``versus``: a head-to-head (``adtbench.tools.bench_versus``): several policy settings and the AR baseline timed in one
job, interleaved per prompt, with each setting's time ratio to the first and its CI.

``batch``: throughput against the batch size (``adtbench.tools.bench_batch``): for each B the AR baseline and the
method over the same prompts in one process (B = 1 unbatched, B > 1 with continuous batching), images/s and tokens/s
of both sides, τ, the speedup at equal B and each side relative to B = 1; a table, a JSON and a plot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from adtbench import accel, accel_graphs
from adtbench.algorithm.cost import (  # noqa: F401 (fill_cache, fill_cache_to, random_tree re-exported)
    fill_cache,
    fill_cache_to,
    median_ms,
    random_tree,
    target_parameters,
)
from adtbench.errors import ConfigError
from adtbench.harness.config import (
    compose_config,
    refuse_reference_in_bench,
    register_resolvers,
    resolve_paths,
    validate,
)
from adtbench.io import atomic_write_json
from adtbench.sampling_params import build_sampling
from adtbench.tools.bench_count import PREFILL
from adtbench.tools.bench_cycle import device_bandwidth, overhead_line, overhead_table

# Where a cycle's time goes (``bench.phases=true``): (owner, attribute, label). Owner: a module or class path, or
# ``target`` / ``drafter`` / ``policy`` for the built instances. Times are exclusive (a phase's nested phases are not
# in it); whatever no phase covers is ``cycle (rest)``: the cycle's own lines and unlisted helpers.
TARGET_NET, DRAFTER_NET, DRAFTER_HEAD = "target network (verify forward)", "drafter network", "drafter LM head"
EMBEDDING = "token embedding"
JACOBI_STEP = "jacobi: step (one graph replay)"  # ``methods.jacobi.step``: the verify and the engine work, one launch
LEVEL_GRAPH = "drafter level graph (replay: network, head, processing, selection)"  # ``drafters.graphed``
TREE_STEP = "tree verify step (one graph replay: forward, processing, acceptance, KV commit)"  # ``tree_step``
CATCH_UP = "drafter catch-up (one graph replay)"  # ``drafters.catch_up``
BATCH_STEP = "batched verify step (one graph replay: forward, processing, every slot's acceptance, KV commit)"
BATCH_PHASE = "batched draft phase (one graph replay: every slot's levels, one drafter forward per level, trees)"
# ``bench.count``: not engine ops
_GRAPHS = {JACOBI_STEP, LEVEL_GRAPH, TREE_STEP, CATCH_UP, BATCH_STEP, BATCH_PHASE}  # one replay each
NETWORKS = frozenset({TARGET_NET, DRAFTER_NET, DRAFTER_HEAD, EMBEDDING, *_GRAPHS})
PHASES: tuple[tuple[str, str, str], ...] = (
    ("target", "_forward", TARGET_NET),  # the variable-shape forward
    ("adtbench.models.graphs:StaticVerify", "run", TARGET_NET),  # a static bucket: eager, or its graph's replay
    ("target", "verify_forward", "verify mask + positions"),
    ("target", "commit", "KV commit"),
    ("adtbench.algorithm.engine", "process_logits", "target logits processing"),
    ("adtbench.algorithm.verify", "accept", "acceptance (device)"),
    ("adtbench.algorithm.verify", "read_verdict", "the cycle's host read"),
    ("adtbench.algorithm.verify", "verify_tree", "acceptance (host walk)"),
    ("drafter", "forward", DRAFTER_NET),
    ("adtbench.models.graphs:StaticDraft", "run", DRAFTER_NET),
    ("adtbench.algorithm.drafters.graphed:LevelGraphs", "run", LEVEL_GRAPH),  # one launch on a GPU
    ("drafter", "extend", "drafter extend (bookkeeping)"),
    ("target", "lm_head", DRAFTER_HEAD),
    ("target", "embed_tokens", EMBEDDING),
    ("adtbench.algorithm.drafters.session:DraftSession", "logprobs", "drafter logits → log-probs"),
    ("adtbench.algorithm.drafters.session:DraftSession", "expand", "drafting session (expand bookkeeping)"),
    ("adtbench.algorithm.policies.static", "gumbel_top_k", "draws without replacement (static)"),
    ("adtbench.algorithm.policies.sampled", "gumbel_top_k", "draws without replacement (sampled trees)"),
    ("policy", "propose", "policy: tree building"),
    ("policy", "observe", "policy: observe"),
    ("adtbench.algorithm.methods.jacobi.loop", "process_logits", "target logits processing"),
    ("adtbench.algorithm.methods.jacobi.loop:JacobiState", "plan", "jacobi: window size + top-up"),
    ("adtbench.algorithm.methods.jacobi.loop", "init_drafts", "jacobi: new drafts (init)"),
    ("adtbench.algorithm.methods.jacobi.loop:JacobiState", "chain", "jacobi: the chain's tree"),
    ("adtbench.algorithm.methods.jacobi.loop:JacobiState", "advance", "jacobi: advance (bonus, window, records)"),
    ("adtbench.algorithm.methods.jacobi.loop", "redraw", "jacobi: redraw"),
    ("adtbench.algorithm.methods.jacobi.step:JacobiStep", "launch", JACOBI_STEP),
    ("adtbench.algorithm.tree_step:TreeStep", "launch", TREE_STEP),
    ("adtbench.algorithm.drafters.catch_up:CatchUp", "launch", CATCH_UP),
    ("adtbench.algorithm.tree_step:TreeStep", "fill", "tree verify step: the tree into its buffers, the draws"),
    ("adtbench.algorithm.tree_step:TreeStep", "verify", "the cycle's host read"),
)


class _Phases:
    """Exclusive wall time per entry of ``phases`` (default :data:`PHASES`) while active: a context manager that
    restores every attribute it wrapped; on CUDA each reading synchronises (``bench.phases=true`` is a host-side
    diagnostic: the synchronisations remove the overlap of host and device that the plain split measures). With a
    ``counter`` (``bench_count.DeviceCounter``) each wrapped call also brackets its phase label there."""

    def __init__(
        self,
        instances: dict[str, Any],
        sync: bool,
        phases: tuple[tuple[str, str, str], ...] = PHASES,
        counter: Any = None,
    ) -> None:
        import importlib

        self.counter = counter
        self.total: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[float] = []
        self._undo: list[tuple[Any, str, Any, bool]] = []
        self.sync = sync
        for owner_name, attr, label in phases:
            if owner_name in instances:
                owner = instances[owner_name]
                # a Jacobi loop has no drafter and its policy builds no tree (no propose / observe); a target or
                # drafter missing a listed method is an error (the table is out of date)
                if owner is None or (owner_name == "policy" and not hasattr(owner, attr)):
                    continue
            else:
                mod, _, cls = owner_name.partition(":")
                owner = importlib.import_module(mod)
                owner = getattr(owner, cls) if cls else owner
            own = attr in vars(owner)
            self._undo.append((owner, attr, vars(owner).get(attr) if own else None, own))
            setattr(owner, attr, self._wrap(getattr(owner, attr), label))
            self.total.setdefault(label, 0.0)
            self.calls.setdefault(label, 0)

    def _wrap(self, fn: Any, label: str) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            if self.sync:
                accel.synchronize()
            t = time.perf_counter()
            self._stack.append(0.0)
            if self.counter is not None:
                self.counter.push(label)
            try:
                return fn(*a, **k)
            finally:
                if self.counter is not None:
                    self.counter.pop()
                if self.sync:
                    accel.synchronize()
                dt = time.perf_counter() - t
                inner = self._stack.pop()
                self.total[label] += dt - inner
                self.calls[label] += 1
                if self._stack:
                    self._stack[-1] += dt

        return wrapped

    def __enter__(self) -> _Phases:
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, attr, original, own in reversed(self._undo):
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)  # an instance attribute shadowing its class's method: remove the shadow


def overhead(cfg: Any, target: Any = None, drafter: Any = None) -> dict:
    """Engine overhead per cycle (module docstring). The job is the app's (``harness.job.Job``: threads, clamped
    top-k, the rule, ``engine.compile`` before the policy binds, the device's generator, the app's decode call);
    ``target``/``drafter`` reuse already-built models (compiled already when ``engine.compile`` is on: ``cost`` and
    ``probe`` compile before they measure)."""
    register_resolvers()
    if bool(cfg.bench.get("count", False)) and cfg.policy.get("rounds") == "auto":
        cfg.policy.rounds = "planned"  # the count measures what a GPU runs: ``auto`` plans the rounds on CUDA
    checked = validate(cfg)
    policy = checked.policy
    from adtbench.algorithm.policies.jacobi import JacobiPolicy

    jacobi = isinstance(policy, JacobiPolicy)  # a loop whose every forward is a cycle (its models: ``JacobiModels``)
    if not policy.uses_drafter and not jacobi:
        raise ConfigError(
            "policy", "the overhead benchmark needs a drafting policy or a Jacobi loop (sjd, scd, gsd, sjd_pac)"
        )
    from adtbench.harness.data.prompts import load_dataset
    from adtbench.harness.job import Job
    from adtbench.harness.loops import build_loop_models

    prompts = load_dataset(cfg)[: int(cfg.bench.prompts)]
    limit = cfg.bench.get("overhead_tokens")
    if limit is not None and (not jacobi or int(limit) < 1):
        raise ConfigError(
            "bench.overhead_tokens", f"a positive token count for a Jacobi loop (sjd, scd, gsd, sjd_pac), got {limit}"
        )
    if target is None or drafter is None:
        job = Job.build(cfg, checked)
    else:  # the models the caller built (and compiled) through ``build_models``; a loop policy's own models
        job = Job.over(
            cfg,
            checked,
            target,
            drafter if policy.uses_drafter else build_loop_models(cfg, checked.conf, policy, target),
        )
    if bool(cfg.bench.get("count", False)):  # the count measures what a GPU runs: acceptance on the device
        job = dataclasses.replace(job, acceptance="device")
    target = job.target
    if limit is not None:  # a partial image per decode (the CPU's run of an 8,191-token Emu3 shape)
        job.policy.limit = int(limit)
    drafter = job.models.drafter if jacobi else job.models  # Jacobi: init=drafter's chain, else None
    device = target.device
    sync = device.type == "cuda"  # the phase split synchronises a real GPU around every phase

    def run(p: Any) -> Any:
        return job.decode(p, True)

    instances = {"target": target, "drafter": drafter, "policy": job.policy}
    if job.batched is not None:  # B > 1: the method's side of one window over every prompt, counted per batched cycle
        if not bool(cfg.bench.get("count", False)):
            raise ConfigError("decode.batch_size", "bench overhead at B > 1 counts only: add bench.count=true")
        job.batched.baseline, job.batched.acceptance = False, "device"
        job.decode_window(prompts[: job.batch_size], 0)  # warm-up (graph capture)
        # the slots' drafters and policies are copies made inside the count: a wrapped method would travel with them
        return _count_breakdown(cfg, prompts, run, {**instances, "drafter": None, "policy": None}, job.batched)
    job.decode(prompts[0], True, seed=0)  # warm-up (graph capture, compilation)
    if bool(cfg.bench.get("count", False)):
        return _count_breakdown(cfg, prompts, run, instances)
    if bool(cfg.bench.get("phases", False)):
        return _phase_breakdown(cfg, prompts, run, instances, sync)
    from adtbench.tools.bench_cycle import DRAFTER, DRAFTER_HEAD, TARGET, CycleTimer

    cycles, cycle_s = 0, 0.0
    per_image: list[dict[str, float]] = []
    model_labels = (TARGET, DRAFTER, DRAFTER_HEAD)
    with CycleTimer(target, drafter) as timer:
        for p in prompts:
            before = sum(timer.totals.get(k, 0.0) for k in model_labels)
            res = run(p)
            timer.settle()  # the image's end synchronised the device: its marks can be read
            n, s = len(res.cycles), res.latency_s - res.prefill_s
            model_s = sum(timer.totals.get(k, 0.0) for k in model_labels) - before
            per_image.append({"cycles": n, "cycle_ms": 1e3 * s / max(n, 1), "overhead_frac": 1 - model_s / s})
            cycles += n
            cycle_s += s
    per: dict[str, Any] = {
        "cycle_ms": 1e3 * cycle_s / cycles,
        "target_forward_ms": 1e3 * timer.totals[TARGET] / cycles,
        "drafter_ms": 1e3 * (timer.totals[DRAFTER] + timer.totals[DRAFTER_HEAD]) / cycles,
    }
    per["overhead_ms"] = per["cycle_ms"] - per["target_forward_ms"] - per["drafter_ms"]
    per["overhead_frac"] = per["overhead_ms"] / per["cycle_ms"]
    counted = timer.source is not None
    work = None
    if bool(cfg.bench.get("launches", False)):  # one more image under the profiler (CUDA) / the op counter
        from adtbench.tools.bench_probe import device_work

        n_first = per_image[0]["cycles"]
        raw = device_work(lambda: run(prompts[0]), 1, device)
        work = {k: (v / n_first if isinstance(v, float) else v) for k, v in raw.items()}
        work["scope"] = "one image's decode per cycle, its prefill included"
    return {
        "model": str(cfg.model.name),
        "policy": job.policy.name,
        "device": accel.device_name(device) if accel.is_cuda(device) else str(device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "cycles": cycles,
        **per,
        "timing": "CUDA events" if device.type == "cuda" else "perf_counter marks",
        "engine_compile": job.compiled,
        "engine_mode": target.engine_mode,  # graphs | compiled | eager
        "graph_replays_per_cycle": timer.replays / cycles,
        "static_runs_per_cycle": timer.static_runs / cycles,
        "model_calls_per_cycle": {k: v / cycles for k, v in timer.calls.items()},
        "syncs_per_cycle": timer.syncs / cycles if counted else None,
        "sync_split_per_cycle": {k: v / cycles for k, v in timer.split.items()} if counted else None,
        "sync_sites_per_cycle": {k: v / cycles for k, v in timer.sites.most_common(10)} if counted else None,
        "prefill_syncs_per_image": timer.prefill_syncs / len(prompts) if counted else None,
        "explicit_syncs_per_image": timer.explicit / len(prompts),
        "sync_count": timer.source,
        "per_image": per_image,
        "work_per_cycle": work,
    }


def _timed_decodes(
    cfg: Any,
    prompts: list[Any],
    run: Any,
    instances: dict[str, Any],
    sync: bool,
    phases: tuple[tuple[str, str, str], ...],
) -> tuple[_Phases, int, float, float]:
    """Decode every prompt with ``phases`` timed; returns the timer, the cycles, their seconds (prefill excluded) and
    the seconds of the drafter's prefix passes (its first forward of each image, inside ``prefill_s``: bounded by
    the prefill's time), which belong to no cycle. The target's prompt pass is not a ``_forward``."""
    cycles, cycle_s, prefix_drafter = 0, 0.0, 0.0
    with _Phases(instances, sync, phases) as ph:
        for p in prompts:
            before = ph.total[DRAFTER_NET]
            res = run(p)
            cycles += len(res.cycles)
            cycle_s += res.latency_s - res.prefill_s
            prefix_drafter += min(ph.total[DRAFTER_NET] - before, res.prefill_s)
    return ph, cycles, cycle_s, prefix_drafter


def _phase_breakdown(cfg: Any, prompts: list[Any], run: Any, instances: dict[str, Any], sync: bool) -> dict:
    """``bench.phases=true``: exclusive ms per cycle of every :data:`PHASES` entry over the prompts (the drafter's
    prefix passes removed from its network phase), plus ``cycle (rest)``. The wrappers cost ≈ 1 µs per call."""
    ph, cycles, cycle_s, prefix_drafter = _timed_decodes(cfg, prompts, run, instances, sync, PHASES)
    seconds = {k: v for k, v in ph.total.items() if ph.calls[k]}
    seconds[DRAFTER_NET] = seconds.get(DRAFTER_NET, 0.0) - prefix_drafter
    cycle_ms = 1e3 * cycle_s / cycles
    per = {k: 1e3 * v / cycles for k, v in seconds.items()}
    per["cycle (rest)"] = cycle_ms - sum(per.values())
    return {
        "model": str(cfg.model.name),
        "policy": instances["policy"].name,
        "threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "cycles": cycles,
        "cycle_ms": cycle_ms,
        "phases": [
            {"phase": k, "ms_per_cycle": v, "share": v / cycle_ms, "calls_per_cycle": ph.calls.get(k, cycles) / cycles}
            for k, v in sorted(per.items(), key=lambda kv: -kv[1])
        ],
    }


# the batched loop's parts (``algorithm.batch``): admissions are prefill, its forwards networks
BATCH_PHASES: tuple[tuple[str, str, str], ...] = (
    ("adtbench.algorithm.slot:SlotStream", "admit", PREFILL),  # a slot's prompt: prefill, first token, drafter's
    ("adtbench.models.batch:BatchTarget", "static_forward", TARGET_NET),
    ("adtbench.models.batch:StaticBatchVerify", "run", TARGET_NET),
    ("adtbench.algorithm.drafters.eagle:EagleDrafter", "forward", DRAFTER_NET),
    ("adtbench.models.batch:BatchTarget", "forward", "batched verify: padding, mask, positions"),
    ("adtbench.models.batch:BatchTarget", "commit", "KV commit"),
    ("adtbench.algorithm.drafters.batch:BatchDrafter", "extend", "drafter extend (bookkeeping)"),
    ("adtbench.algorithm.drafters.batch:BatchDrafter", "expand", "batched drafter level (bookkeeping)"),
    ("adtbench.algorithm.batch", "_processed", "target logits processing"),
    ("adtbench.algorithm.batch", "verify_slots", "acceptance (device)"),
    ("adtbench.algorithm.slot", "read_verdicts", "the cycle's host read"),
    ("adtbench.algorithm.batch_step:BatchTreeStep", "launch", BATCH_STEP),
    ("adtbench.algorithm.batch_step:BatchCatchUp", "launch", CATCH_UP),
    ("adtbench.algorithm.drafters.batch_phase:BatchPhase", "launch", BATCH_PHASE),
    ("adtbench.algorithm.drafters.batch_phase:BatchPhase", "first_use", "batched draft phase: a first use, eager"),
    ("adtbench.algorithm.batch_step:BatchTreeStep", "fill", "batched verify step: the trees into its buffers, draws"),
    ("adtbench.algorithm.batch_step:BatchTreeStep", "verify", "the cycle's host read"),
)


def _count_breakdown(cfg: Any, prompts: list[Any], run: Any, instances: dict[str, Any], batched: Any = None) -> dict:
    """``bench.count=true``: aten ops outside the networks and host reads per cycle, by phase (``bench_count``).
    ``batched`` (a ``harness.batched.BatchedDecoder``): every prompt in one window of its method side; a cycle is
    one batched cycle (one target forward for all slots), ``slot_cycles`` the slots' cycles in it."""
    from adtbench.tools.bench_count import DeviceCounter

    counter = DeviceCounter(NETWORKS, instances["target"].device)
    phases = (
        *(BATCH_PHASES if batched is not None else ()),
        ("adtbench.algorithm.engine", "prefill", PREFILL),
        ("adtbench.algorithm.methods.jacobi.loop", "prefill_token", PREFILL),
        ("target", "encode_prompt", PREFILL),
        ("adtbench.algorithm.methods.jacobi.step:JacobiStep", "start_image", PREFILL),  # the image's first window
        *PHASES,
    )
    cycles = levels = 0
    graphs = getattr(instances["drafter"], "level_graphs", None)  # graphed drafting levels (``drafters.graphed``)
    replays = 0 if graphs is None else graphs.level_replays
    slot_cycles = 0
    with _Phases(instances, False, phases, counter=counter), counter, _counted_replays(counter) as cycle_replays:
        if batched is None:
            results = [run(p) for p in prompts]
        else:
            bt, forwards = batched.bt, batched.bt.forwards
            results = [d[2] for d in batched.window(prompts, 1)]
            cycles = batched.bt.forwards - (forwards if batched.bt is bt else 0)
        for res in results:
            slot_cycles += len(res.cycles)
            levels += sum(c.drafted_depth for c in res.cycles)
    cycles = cycles or slot_cycles
    target = instances["target"]
    level_replays = 0 if graphs is None else graphs.level_replays - replays
    return {
        "model": str(cfg.model.name),
        "policy": (instances["policy"] if batched is None else batched.policy).name,
        "device": str(target.device),
        "prompts": len(prompts),
        "batch_size": 1 if batched is None else batched.B,
        "slot_cycles": slot_cycles,
        **counter.per_cycle(cycles),
        "levels_per_cycle": levels / slot_cycles,  # per slot's cycle
        "level_graph_replays_per_cycle": level_replays / cycles,  # one per drafting level when graphed
        "graph_replays_per_cycle": cycle_replays[0] / cycles,  # every graph replayed outside prefill
    }


@contextlib.contextmanager
def _counted_replays(counter: Any) -> Iterator[list[int]]:
    """Within: every graph replay (CUDA or stand-in) outside ``counter``'s prefill label is counted in the yielded
    ``[n]``; the classes' ``replay`` is restored on exit."""
    n = [0]
    saved = {cls: cls.replay for cls in (accel_graphs.CudaGraph, accel_graphs.StandInGraph)}

    def counting(real: Any) -> Any:
        def replay(self: Any) -> None:
            if counter.label != PREFILL:
                n[0] += 1
            real(self)

        return replay

    try:
        for cls, real in saved.items():
            cls.replay = counting(real)  # type: ignore[method-assign]
        yield n
    finally:
        for cls, real in saved.items():
            cls.replay = real  # type: ignore[method-assign]


DEFAULT_TREE_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)


@torch.no_grad()
def cost(cfg: Any) -> dict:
    """The cost model of this machine for ``cfg.model`` (``algorithm.cost.measure_cost``: verify forward vs tree size,
    one drafter level vs its node count, the fixed per-cycle work) plus, unless ``bench.overhead_prompts=0``, the
    engine's non-model overhead per cycle on full generations. CPU and GPU alike; weights may be random."""
    from omegaconf import OmegaConf

    from adtbench.algorithm.cost import measure_cost

    b = cfg.bench
    register_resolvers()
    sizes = [int(x) for x in (b.get("tree_sizes") or DEFAULT_TREE_SIZES)]
    if not sizes or min(sizes) < 1:
        raise ConfigError("bench.tree_sizes", f"need positive tree sizes, got {sizes}")
    repeats = int(b.get("repeats", 20))
    from adtbench.harness.job import build_models
    from adtbench.harness.schema import check

    # the app's models, an EAGLE drafter whatever the policy, compiled before anything measures (as the app binds)
    conf = check(cfg)
    target, drafter = build_models(cfg, conf, None, eagle=True)
    sp = build_sampling(cfg.sampling)  # the composed sampling group (default: T = 1, CFG 3)
    if not target.supports_cfg:
        sp = dataclasses.replace(sp, cfg_scale=1.0)
    from adtbench.tools.bench_cycle import CycleTimer

    with CycleTimer(target, drafter, calls=()) as counted:  # counts the static-shape runs and graph replays only
        model = measure_cost(target, drafter, sp, max(sizes), int(b.get("level_nodes", 16)), repeats, sizes=sizes)
    cuda = target.device.type == "cuda"  # a real GPU: its bandwidth (never a simulated device's)
    weight_bytes = sum(p.numel() * p.element_size() for p in target_parameters(target))
    bandwidth = device_bandwidth(target.device) if cuda else None
    t_static, d_static = target.static, drafter.static  # build_models(eagle=True): an EagleDrafter
    result: dict[str, Any] = {
        "model": str(cfg.model.name),
        "device": accel.device_name(target.device)
        if accel.is_cuda(target.device)
        else f"cpu ({torch.get_num_threads()} threads)",
        "dtype": str(target.dtype).replace("torch.", ""),
        "cfg_rows": 2 if sp.use_cfg else 1,
        "kv_len": model.meta["kv_len"],
        "repeats": repeats,
        "cost_model": model.to_json(),
        "verify": [
            {"tree_nodes": n, "target_forward_ms": ms, "ms_per_node": ms / n, "x_step": ms / model.step_ms}
            for n, ms in zip(model.verify_nodes, model.verify_ms)
        ],
        "drafter_level": [
            {"nodes": m, "ms": ms, "x_step": ms / model.step_ms} for m, ms in zip(model.level_nodes, model.level_ms)
        ],
        "fixed_ms": model.fixed_ms,
        "engine_compile": conf.engine.compile,
        "graph_capture_s": None if t_static is None else t_static.capture_s,
        "drafter_graph_capture_s": None if d_static is None else d_static.capture_s,
        # what the measurement ran: the pinned capacities (None: variable shapes) and the static / graphed forwards
        "pinned_capacity": {
            "target": None if t_static is None else t_static.capacity,
            "drafter": None if d_static is None else d_static.capacity,
        },
        "measured_static_runs": counted.static_runs,
        "measured_graph_replays": counted.replays,
        "weight_bytes": weight_bytes,
        "device_bandwidth_gbs": bandwidth,
        # one step reads every weight once: its floor at the measured bandwidth
        "weight_read_ms": None if bandwidth is None else 1e3 * weight_bytes / (bandwidth * 1e9),
    }
    n_over = int(b.get("overhead_prompts", 2))
    if n_over > 0:
        built_on = "cuda" if accel.is_cuda(target.device) else str(target.device)  # `auto` → what was built
        resolved = {"dtype": result["dtype"], "device": built_on}
        over_cfg = OmegaConf.merge(cfg, {"bench": {"prompts": n_over}, "model": resolved})
        result["overhead"] = overhead(over_cfg, target=target, drafter=drafter)
    return result


def cost_table(r: dict) -> str:
    """Markdown tables of a ``cost`` result (for docs/README)."""
    from adtbench.algorithm.cost import CostModel

    head = f"{r['model']} on {r['device']}, {r['dtype']}, {r['cfg_rows']} CFG row(s), KV ≈ {r['kv_len']}"
    if r.get("engine_compile"):
        head += ", engine.compile=true" + (
            f" (capture {r['graph_capture_s']:.1f} s)" if r.get("graph_capture_s") else ""
        )
    lines = [head, "", CostModel.from_json(r["cost_model"]).table()]
    if r.get("weight_read_ms") is not None:
        step = CostModel.from_json(r["cost_model"]).step_ms
        lines.append(
            f"AR step {step:.2f} ms vs the weight-read floor {r['weight_read_ms']:.2f} ms "
            f"({r['weight_bytes'] / 1e9:.2f} GB of weights at the measured {r['device_bandwidth_gbs']:.0f} GB/s): "
            f"{step / r['weight_read_ms']:.2f}× the floor"
        )
    if r.get("engine_compile"):
        pin = r.get("pinned_capacity") or {}
        lines.append(
            f"measured through {r.get('measured_graph_replays', 0)} graph replays of "
            f"{r.get('measured_static_runs', 0)} static-shape forwards (pinned capacity: target {pin.get('target')}, "
            f"drafter {pin.get('drafter')})"
        )
    if "overhead" in r:
        lines.append(overhead_line(r["overhead"]))
    return "\n".join(lines)


USAGE = "usage: adtbench bench overhead|cost|probe|speed|versus|batch [hydra overrides]"


def main(args: list[str]) -> int:
    if not args or args[0] not in ("overhead", "cost", "probe", "speed", "versus", "batch"):
        print(USAGE)
        return 2
    if args[0] == "speed":
        from adtbench.tools.bench_speed import main as speed_main

        return speed_main(args[1:])
    if args[0] == "versus":
        from adtbench.tools.bench_versus import main as versus_main

        return versus_main(args[1:])
    if args[0] == "batch":
        from adtbench.tools.bench_batch import main as batch_main

        return batch_main(args[1:])
    extra = ["+bench.prompts=8", "+bench.out=null", "+bench.overhead_tokens=null"]
    if args[0] == "overhead":
        extra += ["+bench.phases=false", "+bench.count=false"]
    if args[0] == "cost":
        extra += ["+bench.tree_sizes=null", "+bench.level_nodes=16", "+bench.repeats=20", "+bench.overhead_prompts=2"]
    if args[0] == "probe":
        extra = ["+bench.prompts=1", "+bench.out=null", "+bench.buckets=null", "+bench.repeats=20",
                 "+bench.policies=null", "+bench.project_tau=[2.0,3.0,4.0]", "+bench.overhead_tokens=null"]  # fmt: skip
    try:
        cfg = compose_config("config", [*extra, *args[1:]])
        refuse_reference_in_bench(cfg, args[0])
        resolve_paths(cfg)  # relative dataset / weight paths against paths.root_dir, as in the app
        if args[0] == "probe":
            from adtbench.tools.bench_probe import probe

            r = probe(cfg, overhead, overrides=[*extra, *args[1:]])
        else:
            r = overhead(cfg) if args[0] == "overhead" else cost(cfg)
    except ConfigError as e:
        print(f"adtbench: config error: {e}")
        return 2
    if args[0] == "cost":
        print(cost_table(r))
    elif args[0] == "probe":
        from adtbench.tools.bench_probe import table as probe_table

        print(probe_table(r))
    elif "host_reads_per_cycle" in r:
        print(
            f"{r['model']}, policy={r['policy']}, {r['prompts']} prompts, {r['cycles']} cycles"
            + (f" (B = {r['batch_size']}: {r['slot_cycles']} slot cycles)" if r["batch_size"] > 1 else "")
            + ": "
            f"{r['host_reads_per_cycle']:.2f} host reads, {r['graph_replays_per_cycle']:.2f} graph replays, "
            f"{r['engine_ops_per_cycle']:.1f} engine ops ({r['engine_kernels_per_cycle']:.1f} kernels, the rest views) "
            "and "
            f"{r['transfers_per_cycle']:.2f} transfers per cycle (networks: {r['network_ops_per_cycle']:.1f} ops, "
            f"{r['network_reads_per_cycle']:.2f} reads; prefill excluded)\n"
        )
        print("| phase | ops per cycle | host reads per cycle | transfers per cycle |\n|---|---:|---:|---:|")
        for row in r["phases"]:
            name = row["phase"] + (" (network)" if row["network"] else "")
            print(
                f"| {name} | {row['ops_per_cycle']:.1f} | {row['reads_per_cycle']:.2f} | "
                f"{row['transfers_per_cycle']:.2f} |"
            )
        print("\n| host read site | per cycle |\n|---|---:|")
        for row in r["read_sites"]:
            print(f"| `{row['site']}` | {row['per_cycle']:.2f} |")
    elif "phases" in r:
        print(
            f"{r['model']}, policy={r['policy']}, {r['threads']} thread(s), {r['prompts']} prompts, {r['cycles']} "
            f"cycles: {r['cycle_ms']:.3f} ms per cycle (prefill excluded)\n"
        )
        print("| phase | ms per cycle | share | calls per cycle |\n|---|---:|---:|---:|")
        for row in r["phases"]:
            print(
                f"| {row['phase']} | {row['ms_per_cycle']:.3f} | {100 * row['share']:.1f} % | "
                f"{row['calls_per_cycle']:.2f} |"
            )
    else:
        print(overhead_table(r))
    if cfg.bench.out:
        atomic_write_json(Path(str(cfg.bench.out)), r, newline=False)
    return 0
