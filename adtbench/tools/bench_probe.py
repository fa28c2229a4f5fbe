"""``adtbench bench probe``: what the graphed engine costs on this device, bucket by bucket (``gpu.sh probe``).

    adtbench bench probe [hydra overrides, e.g. model=anole model.random_init=true model.device=cuda]
                         [bench.buckets=[1,2,4,8,16,32,64,128]] [bench.repeats=20] [bench.prompts=1] [bench.out=FILE]

The models are built from the composed config (the drafter: an EAGLE drafter, random when the config names none)
and compiled as ``engine.compile=true`` does (``harness.job.compile_models``: static-shape verifies and drafter
levels over pinned caches, captured as CUDA graphs — their stand-in on the simulated device); a device without
graphs is a ``ConfigError``. The target's cache is filled to half the image with random tokens (the cost model's
KV length), then, per verify bucket b (1 … 128 nodes):

- ``replay_ms``: one replay of the bucket's captured graph alone (``bench.repeats`` replays back to back between
  two ``accel.mark``s — CUDA events on a GPU — then one synchronisation), i.e. the network with no input copies,
  masks or launches of its own;
- ``verify_ms``: one ``target.verify_forward`` of a random b-node tree through the public call (input copies, mask,
  the replay, the output copies), timed the same way;
- ``x_step``: ``verify_ms`` over the bucket-1 call (the goal: verify(64) ≤ 1.3 AR steps);
- ``floor_x``: ``replay_ms`` over the weight-read floor (the target's weight bytes over the device bandwidth measured
  by a device-to-device copy; a real GPU only); ``step_read_bytes`` / ``step_read_ms`` / ``step_read_x``: the
  tighter floor of the bytes an AR step must read (``step_read_bytes``: the embedding's rows of the step's token and
  the head's computed rows only — on Emu3's 184,622-token vocabulary the full embedding and head are 3.0 of 17.0 GB,
  the rows read 0.27 GB) and the bucket-1 replay over it;
- ``max_abs_diff`` / ``rel_diff`` / ``argmax_agree``: the graphed verify's logits against the eager variable-shape
  forward of the same tree at the same KV state (max |Δ|, ‖Δ‖ / ‖eager‖, the share of nodes whose argmax agrees).

The drafter's buckets get ``replay_ms`` too. Per AR step (``algorithm.ar.ar_step``: the root verified alone, its
logits processed, a token chosen, committed), graphed and eager (the variable-shape forward), continuing from the
half-filled cache: its time (``bench.repeats`` steps back to back between two marks) and its device work — on CUDA
``torch.profiler``'s count of kernels run, of kernel launches (``cudaLaunchKernel`` …) and of graph launches
(``cudaGraphLaunch``) per step; on the simulated device the aten ops per step and the graph replays per step
(stand-ins for the kernels and launches: no GPU figure). Last, unless ``bench.prompts=0``, ``adtbench bench
overhead`` on the same models with the composed policy (the default run's unless overridden): the cycle's split, the
overhead share and the synchronisations per cycle (``bench_cycle``). Writes the JSON to ``bench.out`` and prints a
Markdown summary with the goals of issue 33 (AR step ≤ 2× the floor, verify(64) ≤ 1.3 steps, overhead ≤ 10 % of the
cycle, ≤ 2 synchronisations per cycle).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from adtbench import accel
from adtbench.errors import ConfigError

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# ``bench.policies``: each policy at a pinned shape (random weights give τ ≈ 1, so a tree left to adapt would shrink)
PINNED_POLICIES: dict[str, list[str]] = {
    "ar": [],  # the probe's own AR step
    "scd": ["policy=scd", "policy.window=32"],
    "sjd": ["policy=sjd", "policy.window=16"],
    "sjd_pac": ["policy=sjd_pac", "policy.window=32"],
    "eagle2": ["policy=eagle2", "policy.budget=fixed"],  # depth 4, top-k 10, 59 nodes
    "adt": ["policy=adt", "policy.adapt=false", "policy.budget=fixed"],  # D0 = 5, K0 = 10: ADT's own loop and reads
    "static": ["policy=static"],
}
GOALS = {"step_floor_x": 2.0, "verify64_steps": 1.3, "overhead_frac": 0.10, "syncs_per_cycle": 2.0}


def _timed_ms(fn: Callable[[], Any], n: int, device: torch.device) -> float:
    """Mean ms of ``n`` back-to-back calls of ``fn`` between two ``accel.mark``s (CUDA events: nothing waits in
    between), after two untimed calls; one synchronisation before reading."""
    for _ in range(2):
        fn()
    accel.synchronize(device)
    a = accel.mark(device)
    for _ in range(n):
        fn()
    b = accel.mark(device)
    accel.synchronize(device)
    return 1e3 * accel.elapsed_s(a, b) / n


class _OpCount(TorchDispatchMode):
    """Aten ops dispatched while active (the simulated device's stand-in for kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def device_work(fn: Callable[[], Any], n: int, device: torch.device) -> dict[str, Any]:
    """What ``n`` calls of ``fn`` ask of the device, per call: on CUDA ``torch.profiler``'s kernels run, kernel
    launches and graph launches; elsewhere (the simulated device) aten ops and graph replays."""
    fn()
    accel.synchronize(device)
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        try:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    fn()
                torch.cuda.synchronize(device)
            events = list(prof.key_averages())
        except Exception as e:  # a profiler the machine lacks (CUPTI) must not cost the rest of the probe
            return {"source": f"torch.profiler failed: {type(e).__name__}: {e}"}
        kernels = copies = launches = graphs = 0
        for e in events:
            if e.device_type == torch.autograd.DeviceType.CUDA:
                if e.key.startswith(("Memcpy", "Memset")):
                    copies += e.count
                else:
                    kernels += e.count
            elif e.key in LAUNCHES:
                launches += e.count
            elif e.key == "cudaGraphLaunch":
                graphs += e.count
        return {
            "source": "torch.profiler (CUDA)",
            "kernels": kernels / n,
            "copies": copies / n,
            "kernel_launches": launches / n,
            "graph_launches": graphs / n,
        }
    sim = accel.simulation()
    before = sim.counts["graph_replays"] if sim is not None else 0
    with _OpCount() as ops:
        for _ in range(n):
            fn()
    replays = (sim.counts["graph_replays"] - before) if sim is not None else 0
    return {
        "source": "aten ops (simulated device: no GPU figure)",
        "aten_ops": ops.ops / n,
        "graph_replays": replays / n,
    }


def _logit_diff(graphed: torch.Tensor, eager: torch.Tensor) -> dict[str, float]:
    """max |Δ|, ‖Δ‖ / ‖eager‖ and the argmax agreement of two logit tensors. The norms run over the computed logits
    only: a target whose head computes the image rows (``StaticGPTTarget.logits_head``) fills the others with the
    dtype's lowest value, whose ≈ 1e38 entries would make any ‖eager‖ ≈ 1e43 and every ratio ≈ 0."""
    g, e = graphed.double(), eager.double()
    d = (g - e).abs()
    live = eager > torch.finfo(eager.dtype).min
    return {
        "max_abs_diff": float(d.max()),
        "rel_diff": float(d[live].norm() / e[live].norm().clamp_min(1e-30)),
        "argmax_agree": float((g.argmax(-1) == e.argmax(-1)).double().mean()),
    }


@torch.no_grad()
def top_kernels(events: Any, n: int, k: int = 3) -> list[dict[str, Any]]:
    """The ``k`` kernels with the most device time in ``torch.profiler`` ``key_averages()`` rows of ``n`` calls:
    name (cut to 80 characters), µs and count per call — what tells one bucket's kernel choice from another's."""
    rows = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not e.key.startswith("Mem")]
    rows.sort(key=lambda e: -float(getattr(e, "device_time_total", 0.0)))
    return [{"name": e.key[:80], "us": float(e.device_time_total) / n, "count": e.count / n} for e in rows[:k]]


def replay_kernels(fn: Callable[[], Any], n: int, device: torch.device) -> list[dict[str, Any]] | None:
    """``top_kernels`` of ``n`` calls of ``fn`` on CUDA (None elsewhere: no GPU figure, or a profiler the machine
    lacks)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize(device)
        return top_kernels(prof.key_averages(), n)
    except Exception:  # CUPTI missing must not cost the rest of the probe
        return None


def host_launch_us(device: torch.device, n: int = 2000) -> float:
    """Host µs per launch of a one-element add, ``n`` back to back with no synchronisation in between (what one
    kernel launch costs this host: the figure that lets two hosts' overheads compare); on the CPU, µs per op."""
    x = torch.zeros(1, device=device)
    y = torch.empty_like(x)
    for _ in range(50):
        torch.add(x, 1, out=y)
    accel.synchronize(device)
    t = time.perf_counter()
    for _ in range(n):
        torch.add(x, 1, out=y)
    us = 1e6 * (time.perf_counter() - t) / n
    accel.synchronize(device)
    return us


def judge_policies(
    cfg: Any,
    overrides: list[str],
    names: list[str],
    overhead: Callable[..., dict],
    target: Any,
    drafter: Any,
    ar_step_ms: float,
    ar_replay_ms: float,
    taus: list[float],
) -> list[dict[str, Any]]:
    """Each policy of ``names`` (``PINNED_POLICIES``) through ``overhead`` on the probe's compiled models: its cycle
    split, overhead share with a 95 % bootstrap CI over the prompts, synchronisations and launches per cycle
    (``bench.launches``), and the projection τ × AR step / cycle at each τ of ``taus`` (a projection: random weights
    accept nothing, so τ is stated, not measured). ``ar``: the probe's graphed AR step, its overhead the step outside
    the bucket-1 replay."""
    import numpy as np

    from adtbench.harness.config import compose_config, resolve_paths
    from adtbench.harness.stats import bootstrap_ci

    # the command line's policy overrides belong to the probe's own overhead run, not to the pinned policies
    base = [o for o in overrides if not o.lstrip("+~").startswith(("policy=", "policy."))]
    rows: list[dict[str, Any]] = []
    for name in names:
        if name == "ar":
            rows.append(
                {
                    "policy": "ar",
                    "overrides": [],
                    "cycle_ms": ar_step_ms,
                    "overhead_frac": 1 - ar_replay_ms / ar_step_ms,
                    "projection": {str(t): 1.0 for t in taus},
                }
            )
            continue
        pcfg = compose_config("config", [*base, *PINNED_POLICIES[name], "+bench.launches=true"])
        resolve_paths(pcfg)
        built_on = "cuda" if accel.is_cuda(target.device) else str(target.device)
        pcfg.model.dtype, pcfg.model.device = str(target.dtype).replace("torch.", ""), built_on
        o = overhead(pcfg, target=target, drafter=drafter)
        fracs = np.array([x["overhead_frac"] for x in o["per_image"]])
        cyc = np.array([x["cycle_ms"] for x in o["per_image"]])
        ci = bootstrap_ci(fracs) if len(fracs) > 1 else (float(fracs[0]), float(fracs[0]))
        rows.append(
            {
                "policy": name,
                "overrides": PINNED_POLICIES[name],
                **{k: o[k] for k in ("cycle_ms", "target_forward_ms", "drafter_ms", "overhead_ms", "overhead_frac")},
                "overhead_frac_ci": [float(ci[0]), float(ci[1])],
                "cycle_ms_per_image": cyc.tolist(),
                "cycles": o["cycles"],
                "prompts": o["prompts"],
                "syncs_per_cycle": o["syncs_per_cycle"],
                "graph_replays_per_cycle": o["graph_replays_per_cycle"],
                "work_per_cycle": o["work_per_cycle"],
                "projection": {str(t): t * ar_step_ms / o["cycle_ms"] for t in taus},
            }
        )
    return rows


def weight_tensors(target: Any) -> list[torch.Tensor]:
    """The target's parameters (``cost.target_parameters``), each storage once: a tied head and embedding are two
    parameters over one tensor (the lean nets assign the same tensor to both), read once."""
    from adtbench.algorithm.cost import target_parameters

    seen: dict[tuple[int, int], torch.Tensor] = {}
    for p in target_parameters(target):
        seen.setdefault((p.data_ptr(), p.numel()), p)
    return list(seen.values())


def step_read_bytes(target: Any) -> int:
    """The weight bytes one AR step must read: every tensor of ``weight_tensors``, except that of the input embedding
    (``net.tok_embeddings.weight``) only the ``R`` rows of the step's token are read and of the LM head
    (``net.output.weight``) only the rows ``logits_head`` computes (``head_span``: Emu3's end-of-line … last visual
    token, 32,776 of 184,622 rows; Chameleon's 8,192 image tokens of 65,536). A tied head is one tensor, counted at its
    span. The floor of the goal stays ``weight_bytes`` (every tensor); this one is tighter where the vocabulary is
    much larger than the image tokens."""
    tensors = weight_tensors(target)
    total = sum(p.numel() * p.element_size() for p in tensors)
    ptrs = {p.data_ptr() for p in tensors}
    net = getattr(target, "net", None)
    head = getattr(getattr(net, "output", None), "weight", None)
    emb = getattr(getattr(net, "tok_embeddings", None), "weight", None)
    span = target.head_span() if hasattr(target, "head_span") else None
    tied = isinstance(head, torch.Tensor) and isinstance(emb, torch.Tensor) and head.data_ptr() == emb.data_ptr()
    if isinstance(head, torch.Tensor) and head.data_ptr() in ptrs and span is not None:
        total -= (head.shape[0] - (span[1] - span[0])) * head[0].numel() * head.element_size()
    if isinstance(emb, torch.Tensor) and emb.data_ptr() in ptrs and not tied:
        total -= (emb.shape[0] - min(emb.shape[0], int(target.rows))) * emb[0].numel() * emb.element_size()
    return int(total)


def probe(cfg: Any, overhead: Callable[..., dict] | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The measurement of the module docstring; returns its JSON. ``overhead``: ``tools.bench.overhead`` (the caller
    passes it: the overhead run is that command's), called as ``overhead(cfg, target=…, drafter=…)``; None skips it.
    ``overrides``: the command line's (``bench.policies`` recomposes the config with each policy's pins)."""
    from omegaconf import OmegaConf

    from adtbench.algorithm.ar import ar_step
    from adtbench.algorithm.cost import fill_cache_to, random_tree
    from adtbench.harness.config import register_resolvers
    from adtbench.harness.job import build_models
    from adtbench.harness.schema import check
    from adtbench.models.graphs import BUCKETS
    from adtbench.sampling_params import SamplingParams, build_sampling
    from adtbench.tools.bench_cycle import device_bandwidth

    register_resolvers()
    b = cfg.bench
    buckets = sorted({int(x) for x in (b.get("buckets") or DEFAULT_BUCKETS)})
    if not buckets or not set(buckets) <= set(BUCKETS):
        raise ConfigError("bench.buckets", f"need buckets among {list(BUCKETS)}, got {buckets}")
    repeats = int(b.get("repeats", 20))
    if repeats < 1:
        raise ConfigError("bench.repeats", f"must be positive, got {repeats}")
    # the app's models with an EAGLE drafter, compiled as ``engine.compile=true`` does (the probe's premise)
    compiled = OmegaConf.merge(cfg, {"engine": {"compile": True}})
    target, drafter = build_models(compiled, check(compiled), None, eagle=True)
    if target.engine_mode != "graphs":
        raise ConfigError(
            "model.device",
            "the probe times CUDA graphs: a model with static verifies on a CUDA device "
            f"(or ADTBENCH_SIMULATE_DEVICE=cuda), not {target.device}",
        )
    sp = build_sampling(cfg.sampling)
    if not target.supports_cfg:
        sp = dataclasses.replace(sp, cfg_scale=1.0)
    dev, lay = target.device, target.layout
    gen = torch.Generator().manual_seed(0)
    length = fill_cache_to(target, 0.5, max(buckets), gen, cfg=sp.use_cfg and target.supports_cfg)
    st = target.static
    rows = target.rows

    def tokens(n: int) -> torch.Tensor:
        return (lay.image_token_offset + torch.randint(0, lay.num_codes, (n,), generator=gen)).to(dev)

    eager_static = st

    def eager_verify(*case: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager variable-shape forward at the same KV state (the static buckets switched off for the call)."""
        target.static = None
        try:
            out: tuple[torch.Tensor, torch.Tensor] = target.verify_forward(*case)
            return out
        finally:
            target.static = eager_static

    rows_out = []
    step_ms = None
    for n in buckets:
        step = st.steps.get(n)
        if step is None or step.graph is None:
            raise ConfigError("bench.buckets", f"bucket {n} has no captured graph (pinned capacity {st.capacity})")
        mask, depth = random_tree(n, gen)
        case = (tokens(n), mask.to(dev), depth.to(dev))
        graphed = target.verify_forward(*case)[0]
        diff = _logit_diff(graphed, eager_verify(*case)[0])
        replay = _timed_ms(step.graph.replay, repeats, dev)
        call = _timed_ms(lambda c=case: target.verify_forward(*c), repeats, dev)
        step_ms = call if n == 1 else step_ms
        rows_out.append(
            {
                "bucket": n,
                "replay_ms": replay,
                "verify_ms": call,
                "routed_to": st.bucket_for(n, length),
                "kernels": replay_kernels(step.graph.replay, 3, dev),
                **diff,
            }
        )
    for r in rows_out:
        r["x_step"] = None if step_ms is None else r["verify_ms"] / step_ms

    # the drafter's buckets, pinned at a real image's room
    n_gen = lay.num_gen_tokens
    drafter.reset(rows, target.prompt_cols + n_gen + max(buckets) + 1)
    dst = drafter.static
    drafter_rows = []
    if dst is not None:
        for n in buckets:
            d_step = dst.steps.get(n)
            if d_step is not None and d_step.graph is not None:
                drafter_rows.append({"bucket": n, "replay_ms": _timed_ms(d_step.graph.replay, repeats, dev)})

    # one AR step, graphed and eager: time and device work, from the cache filled to half the image above (the verifies
    # committed nothing); the steps commit, so each measurement continues where the last one stopped (a few tokens past
    # half the image: the same attention width), and the cache is refilled only where the image's remaining positions
    # would not hold a measurement (a tiny grid; an 8,191-token Emu3 image refilled per measurement cost four fills)
    greedy = SamplingParams(temperature=0.0, cfg_scale=sp.cfg_scale)
    state: dict[str, Any] = {"g": length - target.prompt_cols}  # the verifies above committed nothing

    def refill(steps: int) -> int:
        """Make room for ``steps`` AR steps (+ the warm-up calls); returns the steps left inside the image."""
        if n_gen - 1 - state["g"] < steps + 3:
            fill_cache_to(target, 0.5, max(buckets), gen, cfg=sp.use_cfg and target.supports_cfg)
            state["g"] = target.length - target.prompt_cols
        state["token"] = tokens(1)[0]
        return n_gen - 1 - state["g"]  # the steps left inside the image

    def one_step() -> None:
        state["token"] = ar_step(target, state["token"], state["g"] + 1, greedy, None)[0]
        state["g"] += 1

    def eager_step() -> None:
        target.static = None
        try:
            one_step()
        finally:
            target.static = eager_static

    ar: dict[str, Any] = {}
    for name, fn in (("graphed", one_step), ("eager", eager_step)):
        ar[f"{name}_ms"] = _timed_ms(fn, max(1, min(repeats, refill(repeats) - 2)), dev)
        ar[f"{name}_work"] = device_work(fn, max(1, min(3, refill(3) - 1)), dev)
    ar["kv_len"] = int(target.length)  # where the last measurement ended

    weight_bytes = sum(p.numel() * p.element_size() for p in weight_tensors(target))
    read_bytes = step_read_bytes(target)
    bandwidth = device_bandwidth(dev) if dev.type == "cuda" else None
    floor_ms = None if bandwidth is None else 1e3 * weight_bytes / (bandwidth * 1e9)
    read_ms = None if bandwidth is None else 1e3 * read_bytes / (bandwidth * 1e9)
    for r in rows_out:
        r["floor_x"] = None if floor_ms is None else r["replay_ms"] / floor_ms
    result: dict[str, Any] = {
        "model": str(cfg.model.name),
        "device": accel.device_name(dev),
        "dtype": str(target.dtype).replace("torch.", ""),
        "cfg_rows": rows,
        "kv_len": length,
        "pinned_capacity": {"target": st.capacity, "drafter": None if dst is None else dst.capacity},
        "graph_capture_s": {"target": st.capture_s, "drafter": None if dst is None else dst.capture_s},
        "repeats": repeats,
        "timing": "CUDA events" if dev.type == "cuda" else "perf_counter marks (no GPU figure)",
        "weight_bytes": weight_bytes,
        "device_bandwidth_gbs": bandwidth,
        "weight_read_ms": floor_ms,
        "step_read_bytes": read_bytes,
        "step_read_ms": read_ms,
        "step_read_x": None if read_ms is None or rows_out[0]["bucket"] != 1 else rows_out[0]["replay_ms"] / read_ms,
        "verify": rows_out,
        "drafter": drafter_rows,
        "ar_step": ar,
    }
    n_over = int(b.get("prompts", 1))
    if n_over > 0 and overhead is not None:
        built_on = "cuda" if accel.is_cuda(dev) else str(dev)
        over_cfg = OmegaConf.merge(
            cfg, {"bench": {"prompts": n_over}, "model": {"dtype": result["dtype"], "device": built_on}}
        )
        result["overhead"] = overhead(over_cfg, target=target, drafter=drafter)
    names = [str(x) for x in (b.get("policies") or [])]
    if names:
        unknown = [x for x in names if x not in PINNED_POLICIES]
        if unknown or overhead is None:
            raise ConfigError("bench.policies", f"unknown {unknown}; known: {sorted(PINNED_POLICIES)}")
        taus = [float(t) for t in (b.get("project_tau") or [2.0, 3.0, 4.0])]
        result["host_launch_us"] = host_launch_us(dev)
        result["policies"] = judge_policies(
            cfg, list(overrides or []), names, overhead, target, drafter, ar["graphed_ms"],
            rows_out[0]["replay_ms"] if rows_out[0]["bucket"] == 1 else ar["graphed_ms"], taus,
        )  # fmt: skip
        result["project_tau"] = taus
    result["goals"] = goals(result)
    return result


def goals(r: dict[str, Any]) -> dict[str, Any]:
    """Issue 33's goals against this probe: (value, goal, met) per goal; value None where not measured here. The time
    goals are judged on a real GPU only (``met`` None elsewhere); the synchronisations are a property of the code path,
    judged on the simulated device too."""
    by = {x["bucket"]: x for x in r["verify"]}
    floor = r.get("weight_read_ms")
    step = by.get(1, {}).get("replay_ms")
    over = r.get("overhead") or {}
    values = {
        "step_floor_x": None if floor is None or step is None else step / floor,
        "verify64_steps": by.get(64, {}).get("x_step"),
        "overhead_frac": over.get("overhead_frac"),
        "syncs_per_cycle": over.get("syncs_per_cycle"),
    }
    gpu = r.get("timing") == "CUDA events"
    judged = {k: v is not None and (gpu or k == "syncs_per_cycle") for k, v in values.items()}
    return {k: {"value": v, "goal": GOALS[k], "met": v <= GOALS[k] if judged[k] else None} for k, v in values.items()}


def table(r: dict[str, Any]) -> str:
    """The Markdown summary of a ``probe`` result."""

    def num(v: Any, fmt: str = ".3f") -> str:
        return "–" if v is None else f"{v:{fmt}}"

    cap, pin = r["graph_capture_s"], r["pinned_capacity"]
    lines = [
        f"{r['model']} on {r['device']}, {r['dtype']}, {r['cfg_rows']} CFG row(s), KV {r['kv_len']} of the pinned "
        f"{pin['target']} (drafter {pin['drafter']}); capture {num(cap['target'], '.2f')} s target, "
        f"{num(cap['drafter'], '.2f')} s drafter; {r['repeats']} back-to-back calls per figure, {r['timing']}",
        "",
        "| bucket | replay (ms) | verify call (ms) | × AR step | replay / floor | max abs Δ | rel Δ | argmax agree |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r["verify"]:
        lines.append(
            f"| {x['bucket']} | {num(x['replay_ms'])} | {num(x['verify_ms'])} | {num(x['x_step'], '.2f')} | "
            f"{num(x['floor_x'], '.2f')} | {num(x['max_abs_diff'], '.2e')} | {num(x['rel_diff'], '.2e')} | "
            f"{num(x['argmax_agree'], '.3f')} |"
        )
    routed = {x["bucket"]: x.get("routed_to") for x in r["verify"] if x.get("routed_to") not in (None, x["bucket"])}
    if routed:
        lines += ["", "verify calls routed by measured replay time (bucket → bucket run): " + str(routed)]
    tops = [(x["bucket"], x["kernels"][0]) for x in r["verify"] if x.get("kernels")]
    if tops:
        lines += [
            "",
            "top kernel per replay: "
            + "; ".join(f"{b}: {k['name'][:48]} {k['us']:.0f} µs ×{k['count']:.0f}" for b, k in tops),
        ]
    if r["drafter"]:
        lines += [
            "",
            "drafter replay (ms) per bucket: "
            + ", ".join(f"{x['bucket']}: {x['replay_ms']:.3f}" for x in r["drafter"]),
        ]
    floor = r.get("weight_read_ms")
    if floor is not None:
        lines += [
            "",
            f"weight-read floor {floor:.3f} ms ({r['weight_bytes'] / 1e9:.2f} GB of weights at the measured "
            f"{r['device_bandwidth_gbs']:.0f} GB/s); the bytes an AR step reads (the embedding's rows of its token, "
            f"the head's computed rows) {num(r.get('step_read_ms'))} ms ({r.get('step_read_bytes', 0) / 1e9:.2f} GB): "
            f"the bucket-1 replay is {num(r.get('step_read_x'), '.2f')}× that",
        ]
    ar = r["ar_step"]
    gw, ew = ar["graphed_work"], ar["eager_work"]

    def work(w: dict[str, Any]) -> str:
        if "kernels" not in w and "aten_ops" not in w:
            return w["source"]
        if "kernels" in w:
            return (
                f"{w['kernels']:.0f} kernels, {w['kernel_launches']:.0f} kernel launches, "
                f"{w['graph_launches']:.0f} graph launches"
            )
        return f"{w['aten_ops']:.0f} aten ops, {w['graph_replays']:.0f} graph replays"

    lines += [
        "",
        f"AR step (ar_step): graphed {ar['graphed_ms']:.3f} ms ({work(gw)}), eager {ar['eager_ms']:.3f} ms "
        f"({work(ew)}); per step, {gw['source']}",
    ]
    if "overhead" in r:
        from adtbench.tools.bench_cycle import overhead_line

        o = r["overhead"]
        lines += ["", f"policy={o['policy']}, {o['prompts']} prompt(s), {o['cycles']} cycles: {overhead_line(o)}"]
    if r.get("policies"):
        taus = r["project_tau"]

        def ci(x: dict[str, Any]) -> str:
            lo_hi = x.get("overhead_frac_ci")
            return "" if not lo_hi else f" [{100 * lo_hi[0]:.1f}, {100 * lo_hi[1]:.1f}]"

        def launches(x: dict[str, Any]) -> str:
            w = x.get("work_per_cycle") or {}
            if "kernel_launches" in w:
                return f"{w['kernel_launches']:.0f} + {w['graph_launches']:.1f} graphs"
            if "aten_ops" in w:
                return f"{w['aten_ops']:.0f} ops, {w['graph_replays']:.1f} replays"
            return "–"

        lines += [
            "",
            f"Every policy at a pinned shape ({r['policies'][-1].get('prompts', '–')} prompts; host "
            f"{r['host_launch_us']:.1f} µs per launch). Projection = τ × AR step / cycle at a stated τ "
            "(random weights accept nothing: a projection, not a measurement).",
            "",
            "| policy | cycle (ms) | target | drafter | overhead [95 % CI] | syncs / cycle | launches / cycle | "
            + " | ".join(f"× AR at τ {t:g}" for t in taus)
            + " |",
            "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(taus),
        ]
        for x in r["policies"]:
            lines.append(
                f"| {x['policy']} | {x['cycle_ms']:.2f} | {num(x.get('target_forward_ms'), '.2f')} | "
                f"{num(x.get('drafter_ms'), '.2f')} | {100 * x['overhead_frac']:.1f} %{ci(x)} | "
                f"{num(x.get('syncs_per_cycle'), '.2f')} | {launches(x)} | "
                + " | ".join(f"{x['projection'][str(t)]:.2f}" for t in taus)
                + " |"
            )
    lines += ["", "| goal | value | target | met |", "|---|---:|---:|---|"]
    names = {
        "step_floor_x": "AR step replay / weight-read floor",
        "verify64_steps": "verify(64) / AR step",
        "overhead_frac": "engine overhead / cycle",
        "syncs_per_cycle": "synchronisations per cycle",
    }
    for k, g in r["goals"].items():
        met = "–" if g["met"] is None else "yes" if g["met"] else "no"
        lines.append(f"| {names[k]} | {num(g['value'], '.3f')} | ≤ {g['goal']:g} | {met} |")
    return "\n".join(lines)
