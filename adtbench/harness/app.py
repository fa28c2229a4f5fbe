"""The Hydra app: decode a prompt set with one model × drafter × policy, timing the AR baseline alongside.

Per job (Hydra's run dir):
- ``samples.jsonl``: one line per prompt, appended and fsynced when its image is done (the commit marker);
- ``trace.jsonl``: the compact per-cycle trace of each prompt (pos, nodes, D, d, K, a);
- ``images/<prompt_id>.png``;
- ``summary.json``: τ, d̄, speedup (ratio of mean latencies) and its per-prompt spread, the composed choices,
  the environment; refreshed during the run (every 10 s) and written at the end;
- ``run_config.json``: the resolved config; a rerun into the same dir resumes only if it matches.

Speedup protocol: the baseline is ``decode_ar`` of the same target, same prompts, seeds, sampling, CFG rows,
dtype and device; ``warmup`` untimed generations of both after model load (and after ``engine.compile``);
each prompt is timed ``timing.repeats`` times, every repeat one (baseline, method) pair whose order alternates
from pair to pair (ABBA: baseline first on even pairs); the recorded latencies are the medians of the repeats,
and every repeat must give the same tokens (the seeded generator makes a decode deterministic). Timed scope:
prefill + decode loop (text encoding and VQ decode excluded). The speedup is reported as the ratio of total
times, the median of the paired per-prompt ratios and a two-level bootstrap CI
(:func:`adtbench.harness.stats.summarize`); the load average before and after the timed work is recorded next to
the thread and core counts, and a load above the available cores is flagged in the log and the printed line.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from adtbench import accel
from adtbench.algorithm.engine import GenerationResult
from adtbench.algorithm.policies import Policy
from adtbench.algorithm.records import TRACE_FIELDS
from adtbench.algorithm.sampling import SamplingParams
from adtbench.errors import ConfigError
from adtbench.harness.config import (
    check_prompts,
    config_fingerprint,
    register_resolvers,
    resolve_paths,
    timing_repeats,
    validate,
)
from adtbench.harness.data.prompts import Prompt, load_prompts
from adtbench.harness.job import Job
from adtbench.harness.lock import RunDirGuard, RunDirLock, discard_new_run_dir, held_lock, refuse  # noqa: F401 (¹)
from adtbench.harness.rundir import RUN_CONFIG_FILE, ResultStore
from adtbench.harness.stats import summarize
from adtbench.io import atomic_write_json
from adtbench.resources import conf_dir, cpus_available, load_average

# (¹) RunDirGuard stays importable from here: the .hydra/hydra.yaml of runs made before it moved names this module.

log = logging.getLogger("adtbench")
register_resolvers()

SUMMARY_EVERY_S = 10.0  # summary.json refresh interval during a run (always written at the end)
TIMING_SCOPE = "prefill + decode loop (text encoding, VQ decode and image writing excluded); CUDA synchronised"


def environment(target: Any) -> dict[str, Any]:
    import transformers

    dev = target.device
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(dev),
        "dtype": str(target.dtype).replace("torch.", ""),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if accel.is_cuda(dev):
        info |= {"gpu": accel.device_name(dev), "cuda": torch.version.cuda}
    return info


def load_peak(before: float | None, after: float | None) -> float | None:
    """The larger of two 1-minute load averages (``None`` without any)."""
    return max((x for x in (before, after) if x is not None), default=None)


def load_warning(before: float | None, after: float | None, cpus: int) -> str | None:
    """A warning when the 1-minute load average before or after the timed work exceeds the available cores."""
    peak = load_peak(before, after)
    if peak is None or peak <= cpus:
        return None
    return f"load average {peak:.2f} exceeded the {cpus} available core(s) around the timed work: timings unreliable"


def load_dataset(cfg: DictConfig) -> list[Prompt]:
    d = cfg.dataset
    return load_prompts(
        str(d.kind),
        None if d.get("path") is None else str(d.path),
        d.get("limit"),
        d.get("shard"),
        caption=str(d.get("caption", "first")),
        text=None if d.get("text") is None else str(d.text),
    )


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def sample_record(
    prompt: Prompt, seed: int, runs: list[GenerationResult], bases: list[GenerationResult] | None
) -> dict:
    """One samples.jsonl line from a prompt's timed repeats (``runs`` of the method, ``bases`` of the baseline).

    Token and count fields come from the first repeat (every repeat decodes the same tokens); ``latency_s``,
    ``prefill_s``, ``draft_s``, ``verify_s`` and ``baseline_latency_s`` are medians over the repeats, whose
    latencies are kept in ``latency_repeats_s`` / ``baseline_latency_repeats_s``.
    """
    res, base = runs[0], (bases[0] if bases else None)
    lat = _median([r.latency_s for r in runs])
    base_lat = None if not bases else _median([b.latency_s for b in bases])
    rec: dict[str, Any] = {
        "prompt_id": prompt.prompt_id,
        "prompt": prompt.text,
        "seed": seed,
        "tokens": res.tokens,
        "cycles": len(res.cycles),
        "committed": res.committed,
        "tau": res.tau,
        "d_bar": res.d_bar,
        "d_bar_tree": res.d_bar_tree,
        "drafted_depth_sum": sum(c.drafted_depth for c in res.cycles),
        "tree_depth_sum": sum(c.tree_depth for c in res.cycles),
        "target_forwards": res.target_forwards,
        "drafter_forwards": res.drafter_forwards,
        "latency_s": lat,
        "prefill_s": _median([r.prefill_s for r in runs]),
        "draft_s": _median([r.draft_s for r in runs]),
        "verify_s": _median([r.verify_s for r in runs]),
        "latency_repeats_s": [r.latency_s for r in runs],
        "baseline_latency_s": base_lat,
        "baseline_latency_repeats_s": None if not bases else [b.latency_s for b in bases],
        "baseline_target_forwards": None if base is None else base.target_forwards,
        "speedup": None if base_lat is None else base_lat / lat,
        "tokens_match_baseline": None if base is None else res.tokens == base.tokens,
        "encode_s": _median([r.encode_s for r in runs]),
        "baseline_encode_s": None if not bases else _median([b.encode_s for b in bases]),
        "stats": res.stats,
        "meta": prompt.meta,
    }
    return rec


def trace_record(prompt_id: str, res: GenerationResult) -> dict:
    t: dict[str, Any] = {"prompt_id": prompt_id}
    for key, attr in TRACE_FIELDS.items():
        t[key] = [getattr(c, attr) for c in res.cycles]
    for key in sorted({k for c in res.cycles for k in c.extra}):
        t[key] = [c.extra.get(key) for c in res.cycles]
    return t


SLIM_DROP = ("tokens", "prompt", "meta")


def slim(record: dict) -> dict:
    """A samples record without its bulky fields (kept in memory for summaries)."""
    return {k: v for k, v in record.items() if k not in SLIM_DROP}


def make_summary(
    records: list[dict],
    cfg: DictConfig,
    choices: dict,
    env: dict,
    n_prompts: int,
    rule_name: str = "exact",
    run_info: dict | None = None,
    lantern_used: dict | None = None,
) -> dict:
    """:func:`summarize` of the records plus the config choices, the environment, ``run_info`` (this job's
    machine state and set-up times: threads, cores, load averages, warm-up / bind times, compile) and
    ``lantern_params``: the LANTERN values the job decoded with (:func:`lantern_used`; None with LANTERN off)."""
    s = summarize(records) if records else {"n_samples": 0, "tau": None, "d_bar": None, "speedup": None}
    greedy = float(cfg.sampling.temperature) == 0.0
    matches = [r["tokens_match_baseline"] for r in records if r.get("tokens_match_baseline") is not None]
    s |= {
        "lantern": bool(cfg.get("lantern", {}).get("enabled", False)),
        "model": choices.get("model", cfg.model.get("name")),
        "drafter": choices.get("drafter"),
        "policy": choices.get("policy", cfg.policy.name),
        "dataset": choices.get("dataset"),
        "sampling": choices.get("sampling"),
        "choices": choices,
        "policy_params": OmegaConf.to_container(cfg.policy, resolve=True),
        "sampling_params": OmegaConf.to_container(cfg.sampling, resolve=True),
        "greedy_matches_baseline": (all(matches) if matches else None) if greedy else None,
        "n_prompts": n_prompts,
        "complete": len(records) == n_prompts,
        "acceptance_rule": rule_name,
        "lantern_params": lantern_used,
        "timing_scope": TIMING_SCOPE,
        **(run_info or {}),
        "env": env,
    }
    return s


def lantern_used(cfg: DictConfig, rule: Any) -> dict | None:
    """The LANTERN values a job decodes with — ``k`` as used (clipped to the model's codebook size − 1, see
    ``caches.build_lantern_rule``), not as configured; None when the rule is exact (LANTERN off)."""
    if getattr(rule, "name", "exact") != "lantern":
        return None
    from adtbench.harness.caches import lantern_params

    p = lantern_params(cfg.lantern)
    return {"k": int(rule.k), "delta": p.delta, "lam": p.lam, "normalize": p.normalize,
            "reference_residual": p.reference_residual}  # fmt: skip


def lantern_part(s: dict) -> str:
    """``lantern=off``, or ``lantern=on`` with the bounds and k used (``lantern=on(delta=0.1,k=511)``)."""
    if not s.get("lantern"):
        return "lantern=off"
    p = s.get("lantern_params") or {}
    used = [f"{name}={p[key]:g}" for key, name in (("delta", "delta"), ("lam", "lam"), ("k", "k"))
            if isinstance(p.get(key), int | float)]  # fmt: skip
    return "lantern=on" + (f"({','.join(used)})" if used else "")


def summary_line(s: dict) -> str:
    """The one-line result a run prints: model, policy, LANTERN on/off (:func:`lantern_part`), n, τ, d̄, latency,
    the speedup with its CI, eval scores and the timing warnings."""

    def f(key: str, fmt: str, unit: str = "") -> str:
        v = s.get(key)
        return "n/a" if v is None else f"{v:{fmt}}{unit}"

    line = f"adtbench: model={s.get('model')} policy={s.get('policy')} {lantern_part(s)} n={s.get('n_samples')} "
    line += f"tau={f('tau', '.3f')} d_bar={f('d_bar', '.2f')} latency={f('latency_s', '.4f', 's')}"
    jac = s.get("jacobi")
    if isinstance(jac, dict) and jac.get("window_mean") is not None:  # policy=sjd|scd|gsd: the mean window
        line += f" window={jac['window_mean']:.1f}"
    if s.get("speedup") is not None:
        line += f" baseline={f('baseline_latency_s', '.4f', 's')} speedup={f('speedup', '.3f', 'x')}"
        ci = s.get("speedup_ci")
        if ci and None not in ci:
            line += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
            if s.get("speedup_ci_caveat"):
                line += f" (CI over {s.get('speedup_n')} < 5 prompts)"
        line += f" median={f('speedup_median', '.3f', 'x')}"
    if (s.get("batch_size") or 1) > 1:
        line += f" batch={s['batch_size']} throughput={f('throughput_images_per_s', '.3f', ' img/s')}"
        if s.get("throughput_speedup") is not None:
            line += f" baseline={f('baseline_throughput_images_per_s', '.3f', ' img/s')}"
            line += f" throughput_speedup={f('throughput_speedup', '.3f', 'x')}"
    line += eval_part(s.get("eval"))
    if s.get("load_warning"):
        line += f" LOAD {f('load_peak', '.2f')} > {s.get('cpus_available')} CORES: timings unreliable"
    if s.get("timing_warning"):
        line += f" NOISY TIMING (repeats differ by {100 * s['timing_spread']:.1f} %): timings unreliable"
    return line


def eval_part(block: Any) -> str:
    """`` eval=<kind> name=value ...`` from a summary's ``eval`` block (4 significant digits; ``n/a`` for a
    metric without a value; ``FAILED(<metric>)`` when a metric raised); empty without an eval block."""
    if not isinstance(block, dict) or (not block.get("values") and not block.get("error")):
        return ""
    parts = [f" eval={block.get('kind', '?')}"]
    for name, v in (block.get("values") or {}).items():
        parts.append(f"{name}={'n/a' if not isinstance(v, int | float) else f'{v:.4g}'}")
    if block.get("error"):
        parts.append(f"FAILED({block['error'].get('metric', '?')})")
    return " ".join(parts)


# Config nodes and keys added after run dirs existed: a run_config.json without them ran with these values.
RESUME_NEW_KEYS: dict[str, Any] = {
    "timing": {"repeats": 1},
    "engine": {"compile": False, "acceptance": "auto"},
    "decode": {"batch_size": 1, "window": 4},
}


def check_resume(run_dir: Path, cfg: DictConfig) -> None:
    """Refuse to append to a run dir whose results came from a different config."""
    path = run_dir / RUN_CONFIG_FILE
    fp = config_fingerprint(cfg)
    if path.exists():
        saved = json.loads(path.read_text())
        old = {**RESUME_NEW_KEYS, **saved}
        for key, defaults in RESUME_NEW_KEYS.items():  # a node that gained keys: the saved values over the defaults
            if isinstance(saved.get(key), dict):
                old[key] = {**defaults, **saved[key]}
        if old != fp:
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            raise ConfigError(
                "hydra.run.dir", f"{run_dir} holds results of a different config (differs in: {', '.join(diff)})"
            )
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, fp, indent=2, newline=False)


def check_config(cfg: DictConfig) -> tuple[SamplingParams, Policy, list[Prompt]]:
    """Everything about one job that can be checked without weights and without touching its run dir: the typed
    schema, ranges and cross-key rules (``config.validate``), the eval metrics' weight paths, the prompt file and
    prompts the model cannot take. Resolves ``cfg``'s relative paths in place (``config.resolve_paths``).
    Returns the sampling params, the policy and the prompts; raises ``ConfigError`` naming the key.

    The command line runs it for every job before Hydra starts (``adtbench.harness.precheck``), so a rejected
    config writes nothing; :func:`run` runs it again (direct calls, and the jobs of other launchers)."""
    resolve_paths(cfg)
    sp, policy = validate(cfg)
    if cfg.get("eval") is not None and str(cfg.eval.get("kind", "none")) != "none":
        from adtbench.harness.eval.metrics import validate as validate_eval

        validate_eval(cfg)  # missing metric weights fail before any model loads
    prompts = load_dataset(cfg)
    check_prompts(cfg, prompts)
    return sp, policy, prompts


def run(cfg: DictConfig, run_dir: Path, choices: dict[str, str]) -> dict:
    """Check the config (:func:`check_config`, before anything is written), lock the run dir for this job, load,
    decode every unfinished prompt, write records; returns the summary.

    The lock (held from the Hydra callback on in run mode, taken here for sweep jobs and direct calls) is released
    when the job ends. A ``ConfigError`` raised once the run dir exists (a check that needs the model, or a resume
    into a dir of another config) leaves no dir behind that this job created without committing a prompt
    (``lock.discard_new_run_dir``); a dir that held anything before the job is never touched."""
    as_given = copy.deepcopy(cfg)  # resume compares the config as given, not the resolved absolute paths
    checked = check_config(cfg)
    lock = held_lock(run_dir)
    owned = lock is None
    if lock is None:
        lock = RunDirLock(run_dir)
    try:
        return _run(cfg, as_given, checked, run_dir, choices)
    except ConfigError:
        discard_new_run_dir(run_dir)
        raise
    finally:
        if owned:
            lock.release()


def _run(
    cfg: DictConfig,
    fingerprint_cfg: DictConfig,
    checked: tuple[SamplingParams, Policy, list[Prompt]],
    run_dir: Path,
    choices: dict[str, str],
) -> dict:
    sp, policy, prompts = checked
    check_resume(run_dir, fingerprint_cfg)
    store = ResultStore(run_dir)
    done = store.done_ids()
    todo = [p for p in prompts if p.prompt_id not in done]
    log.info("%d prompts (%d already done) → %s", len(prompts), len(prompts) - len(todo), run_dir)

    job = Job.build(cfg, sp, policy, todo)
    target = job.target
    env = environment(target)
    warmup_s = job.warm_up(todo, int(cfg.warmup), bool(cfg.baseline))
    log.info("warm-up: %d generation(s) of each side in %.1f s%s", int(cfg.warmup) if todo else 0, warmup_s,
             " (compilation included)" if job.compiled else "")  # fmt: skip
    run_info: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpus_available": cpus_available(),
        **job.run_info(),
        "warmup_s": warmup_s,
    }
    from adtbench.harness.tracking import build_logger

    tracker = build_logger(cfg, run_dir, choices)
    try:
        ctx = RunContext(cfg, run_dir, choices, job, store, tracker, env, len(prompts), job.rule.name,
                         lantern_used(cfg, job.rule))  # fmt: skip
        summary = _decode_all(ctx, todo, run_info)
        if cfg.get("eval") is not None and str(cfg.eval.get("kind", "none")) != "none":
            from adtbench.harness.eval import run_eval

            summary = run_eval(cfg, run_dir, target=target)
            tracker.log_summary(summary)
    finally:
        tracker.finish()
    print(f"{summary_line(summary)} -> {run_dir}")
    return summary


def timed_prompt(
    decode: Any, p: Prompt, seed: int, repeats: int, baseline: bool, first_pair: int
) -> tuple[list[GenerationResult], list[GenerationResult]]:
    """Time one prompt ``repeats`` times: each repeat is a (baseline, method) pair, the baseline first when the
    pair's global index (``first_pair`` + repeat) is even, so the order alternates ABBA. Every repeat of a side
    must decode the same tokens (same seed); returns (method runs, baseline runs)."""
    runs: list[GenerationResult] = []
    bases: list[GenerationResult] = []
    for r in range(repeats):
        base_first = (first_pair + r) % 2 == 0
        if baseline and base_first:
            bases.append(decode(p, seed, False))
        runs.append(decode(p, seed, True))
        if baseline and not base_first:
            bases.append(decode(p, seed, False))
    for side, results in (("method", runs), ("baseline", bases)):
        for r, res in enumerate(results[1:], 1):
            if res.tokens != results[0].tokens:
                raise RuntimeError(
                    f"prompt {p.prompt_id}: timing repeat {r} of the {side} decoded other tokens than repeat 0 with "
                    f"the same seed {seed}; timing.repeats needs a deterministic decode"
                )
    return runs, bases


@dataclasses.dataclass
class RunContext:
    """What one job's decode loop works with, fixed once the models are built: the composed config, where
    results go, the target and the ``decode(prompt, seed, method)`` closure over it, the result store and
    tracker, and what every summary records (choices, environment, prompt count, acceptance rule)."""

    cfg: DictConfig
    run_dir: Path
    choices: dict[str, str]
    job: Job
    store: ResultStore
    tracker: Any
    env: dict[str, Any]
    n_prompts: int
    rule_name: str = "exact"
    lantern: dict[str, Any] | None = None  # :func:`lantern_used`

    def summary(self, records: list[dict], run_info: dict[str, Any]) -> dict:
        """:func:`make_summary` of ``records`` for this job (with the simulated device's counts so far in this
        process — load, bind, warm-up, decodes — when it runs on one)."""
        sim = accel.simulation()
        if sim is not None:
            run_info = {**run_info, "simulated_device": sim.report()}
        return make_summary(records, self.cfg, self.choices, self.env, self.n_prompts, self.rule_name, run_info,
                            self.lantern)  # fmt: skip


def _decode_all(ctx: RunContext, todo: list[Prompt], run_info: dict[str, Any]) -> dict:
    """Decode every unfinished prompt (baseline and method, ``timing.repeats`` times), commit its records, refresh
    the summary; the load average is read just before and just after this timed work."""
    from tqdm import tqdm

    cfg, target, store, tracker, run_dir = ctx.cfg, ctx.job.target, ctx.store, ctx.tracker, ctx.run_dir
    policy_name = str(cfg.policy.name)
    repeats = timing_repeats(cfg)
    records = [slim(r) for r in store.records()]
    avg = load_average()
    before = None if avg is None else avg[0]
    run_info = {**run_info, "load_before": before, "load_after": None, "load_peak": load_peak(before, None)}
    run_info["load_warning"] = load_warning(before, None, run_info["cpus_available"])
    log.info("timed work: %d prompt(s) × %d repeat(s), %d torch thread(s), %d core(s), load average (1/5/15 min) %s",
             len(todo), repeats, run_info["threads"], run_info["cpus_available"], avg)  # fmt: skip
    if run_info["load_warning"]:
        log.warning("%s", run_info["load_warning"])
    last_summary = time.perf_counter()
    bar = tqdm(total=len(todo), desc=policy_name, disable=not cfg.progress, file=sys.stderr)
    for p, seed, runs, bases, batch in _decoded(ctx, todo, repeats):
        bar.update()
        res = runs[0]
        image = target.decode_image(target.layout.tokens_to_codes(res.tokens)) if cfg.save_images else None
        trace = trace_record(p.prompt_id, res)
        record = sample_record(p, seed, runs, bases or None) | {"batch": batch}
        store.commit(record, trace, image)
        if cfg.get("maps") is not None and cfg.maps.get("per_image"):
            from adtbench.harness.maps import write_sample_maps

            write_sample_maps(run_dir, trace, target.layout)
        records.append(slim(record))
        if time.perf_counter() - last_summary > SUMMARY_EVERY_S:  # keep summary.json current, cheaply
            store.write_summary(ctx.summary(records, run_info))
            last_summary = time.perf_counter()
        tracker.log_sample(record, trace, image)
    bar.close()
    avg = load_average()
    after = None if avg is None else avg[0]
    run_info |= {"load_after": after, "load_peak": load_peak(before, after)}
    run_info["load_warning"] = load_warning(before, after, run_info["cpus_available"])
    log.info("load average (1/5/15 min) after the timed work: %s", avg)
    if run_info["load_warning"]:
        log.warning("%s", run_info["load_warning"])
    summary = ctx.summary(records, run_info)
    if summary.get("timing_warning"):
        log.warning("%s", summary["timing_warning"])
    store.write_summary(summary)
    if cfg.get("maps") is not None and cfg.maps.get("per_run"):
        from adtbench.harness.maps import write_run_maps

        write_run_maps(run_dir, store.traces(), target.layout)
    tracker.log_summary(summary)
    return summary


def _decoded(
    ctx: RunContext, todo: list[Prompt], repeats: int
) -> Iterator[tuple[Prompt, int, list[GenerationResult], list[GenerationResult], dict[str, Any] | None]]:
    """Per unfinished prompt, in order: (prompt, seed, method runs, baseline runs, the record's ``batch`` field).
    One prompt at a time (:func:`timed_prompt`), or a window of ``decode.batch_size × decode.window`` prompts at a
    time (``harness.batched``): a window's prompts come out once both of its sides are done."""
    job = ctx.job
    if job.batched is None:

        def decode(p: Prompt, seed: int, method: bool) -> GenerationResult:
            return job.decode(p, method, seed)

        for i, p in enumerate(todo):
            seed = job.seed_of(p)
            runs, bases = timed_prompt(decode, p, seed, repeats, bool(ctx.cfg.baseline), i * repeats)
            yield p, seed, runs, bases, None
        return
    size = job.batch_size * job.window
    for w, i in enumerate(range(0, len(todo), size)):
        for p, seed, run, base, batch in job.decode_window(todo[i : i + size], w):
            yield p, seed, [run], [] if base is None else [base], batch


CONF_DIR = str(conf_dir())  # the checkout's conf/, or the copy shipped in the wheel (adtbench.resources)


class JobRefused(CompactHydraException):
    """A multirun job's ``ConfigError`` found after it started (a check that needs the model): raised rather than
    exit 2, so that Hydra marks the job failed and runs the next; Hydra prints it as one line after the sweep."""


RESUME: list[str] = []  # the override that resumes the job in progress (named when Ctrl-C ends the process)


def task(cfg: DictConfig) -> dict | None:
    """The Hydra task function: one job (:func:`run`) in Hydra's run dir. A ``ConfigError`` is the one-line error,
    exit 2, in run mode, and fails only its own job in a multirun (:class:`JobRefused`)."""
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    run_dir = Path(hc.runtime.output_dir)
    RESUME[:] = [f"hydra.sweep.dir={Path(hc.sweep.dir).absolute()}" if multirun else f"hydra.run.dir={run_dir}"]
    try:
        return run(cfg, run_dir, dict(hc.runtime.choices))
    except ConfigError as e:
        if multirun:
            log.error("config error: %s", e)
            raise JobRefused(f"adtbench: config error: {e}") from None
        refuse(e)
    return None


hydra_main = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(task)


def main() -> None:
    """``python run.py [overrides]`` / ``adtbench [run] [overrides]``: check every job's config before anything
    is written (``adtbench.harness.precheck``: Hydra's own composition errors included; one line naming the key,
    exit 2), then run Hydra's app. Ctrl-C ends with one line naming the override that resumes the run (the run
    dir, or a multirun's sweep dir: its jobs resume in their own dirs), exit 130."""
    from adtbench.harness.precheck import check_command_line

    try:
        try:
            check_command_line(sys.argv[1:], CONF_DIR, "config", check_config)
        except ConfigError as e:
            refuse(e, to_log=False)
        hydra_main()
    except KeyboardInterrupt:
        hint = f"; every finished prompt is kept: rerun the same command with {RESUME[0]} to resume" if RESUME else ""
        print(f"adtbench: interrupted{hint}", file=sys.stderr)
        sys.exit(130)
