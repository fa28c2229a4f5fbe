"""The Hydra app: decode a prompt set with one model × drafter × policy, timing the AR baseline alongside.

One job per Hydra run dir: check the config (:func:`check_config`), open the run dir for it
(``rundir_write.check_resume``: a rerun resumes only with the same config), build the
:class:`~adtbench.harness.job.Job`, warm it up, then decode every unfinished prompt — baseline and method,
``timing.repeats`` times in ABBA order (:mod:`adtbench.harness.timing`, the speedup protocol) — committing each prompt's
:class:`SampleRecord`, trace and image through the run dir's one writer (:mod:`adtbench.harness.rundir_write`) and
refreshing the :class:`Summary` (every 10 s, and at the end); the printed line is :meth:`Summary.line`. docs/outputs.md
documents the files.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from adtbench import accel
from adtbench.errors import ConfigError
from adtbench.harness.caches import lantern_used
from adtbench.harness.config import (
    Checked,
    check_prompts,
    config_fingerprint,
    register_resolvers,
    resolve_paths,
    validate,
)
from adtbench.harness.data.prompts import Prompt, load_dataset
from adtbench.harness.job import Job
from adtbench.harness.lock import RunDirGuard, RunDirLock, discard_new_run_dir, held_lock, refuse  # noqa: F401 (¹)
from adtbench.harness.provenance import job_provenance, resume_warning
from adtbench.harness.records import SampleRecord, Summary, slim, trace_record
from adtbench.harness.rundir_write import ResultStore, check_resume, record_provenance
from adtbench.harness.timing import LoadWatch, environment, machine, timed_results
from adtbench.resources import conf_dir

# (¹) RunDirGuard stays importable from here: the .hydra/hydra.yaml of runs made before it moved names this module.

log = logging.getLogger("adtbench")
register_resolvers()

SUMMARY_EVERY_S = 10.0  # summary.json refresh interval during a run (always written at the end)


def check_config(cfg: DictConfig) -> tuple[Checked, list[Prompt]]:
    """Everything about one job that can be checked without weights and without touching its run dir: the typed
    schema, ranges and cross-key rules (``config.validate``), the eval metrics' weight paths, the prompt file and
    prompts the model cannot take. Resolves ``cfg``'s relative paths in place (``config.resolve_paths``).
    Returns the config typed with its policy (``config.Checked``) and the prompts; raises ``ConfigError`` naming the
    key.

    The command line runs it for every job before Hydra starts (``adtbench.harness.precheck``), so a rejected
    config writes nothing; :func:`run` runs it again (direct calls, and the jobs of other launchers)."""
    resolve_paths(cfg)
    checked = validate(cfg)
    if cfg.get("eval") is not None and str(cfg.eval.get("kind", "none")) != "none":
        from adtbench.harness.eval.metrics import validate as validate_eval

        validate_eval(cfg)  # missing metric weights fail before any model loads
    prompts = load_dataset(cfg)
    check_prompts(cfg, prompts)
    return checked, prompts


def run(cfg: DictConfig, run_dir: Path, choices: dict[str, str]) -> dict:
    """Check the config (:func:`check_config`, before anything is written), lock the run dir for this job, load,
    decode every unfinished prompt, write records; returns the summary.

    The lock (held from the Hydra callback on in run mode, taken here for sweep jobs and direct calls) is released
    when the job ends. A ``ConfigError`` raised once the run dir exists (a check that needs the model, or a resume
    into a dir of another config) leaves no dir behind that this job created without committing a prompt
    (``lock.discard_new_run_dir``); a dir that held anything before the job is never touched."""
    as_given = copy.deepcopy(cfg)  # resume compares the config as given, not the resolved absolute paths
    checked, prompts = check_config(cfg)
    lock = held_lock(run_dir)
    owned = lock is None
    if lock is None:
        lock = RunDirLock(run_dir)
    try:
        return _run(cfg, as_given, checked, prompts, run_dir, choices).to_json()
    except ConfigError:
        discard_new_run_dir(run_dir)
        raise
    finally:
        if owned:
            lock.release()


def _run(
    cfg: DictConfig,
    fingerprint_cfg: DictConfig,
    checked: Checked,
    prompts: list[Prompt],
    run_dir: Path,
    choices: dict[str, str],
) -> Summary:
    check_resume(run_dir, config_fingerprint(fingerprint_cfg))
    store = ResultStore(run_dir)
    done = store.done_ids()
    todo = [p for p in prompts if p.prompt_id not in done]
    log.info("%d prompts (%d already done) → %s", len(prompts), len(prompts) - len(todo), run_dir)

    job = Job.build(cfg, checked, todo)
    conf = job.conf
    exact = job.exactness
    env = environment(job.target)
    prov = job_provenance(env, exact.lossless, exact.reason)
    previous, _ = record_provenance(run_dir, prov, decoding=bool(todo))  # before this job's first sample
    warning = resume_warning(run_dir, previous, prov) if todo else None
    if warning:
        log.warning("%s", warning)
    warmup_s = job.warm_up(todo, conf.warmup, conf.baseline, conf.timing.aa)
    log.info(
        "warm-up: %d generation(s) of each side in %.1f s%s",
        conf.warmup if todo else 0,
        warmup_s,
        " (compilation included)" if job.compiled else "",
    )
    run_info: dict[str, Any] = {**machine(), **job.run_info(), "warmup_s": warmup_s}
    from adtbench.harness.tracking import build_logger

    tracker = build_logger(cfg, run_dir, choices)
    try:
        rule, lantern = job.rule.name, lantern_used(cfg, job.rule)
        lossless = (exact.lossless, exact.reason)
        ctx = RunContext(cfg, run_dir, choices, job, store, tracker, env, len(prompts), rule, lantern, lossless)
        summary = _decode_all(ctx, todo, run_info)
        if cfg.get("eval") is not None and str(cfg.eval.get("kind", "none")) != "none":
            from adtbench.harness.eval import run_eval

            summary = run_eval(cfg, run_dir, target=job.target, summary=summary) or summary
            tracker.log_summary(summary.to_json())
    finally:
        tracker.finish()
    print(f"{summary.line()} -> {run_dir}")
    return summary


@dataclasses.dataclass
class RunContext:
    """What one job's decode loop works with, fixed once the models are built: the composed config, where
    results go, the built job, the result store and tracker, and what every summary records (choices,
    environment, prompt count, acceptance rule, the LANTERN values used: ``caches.lantern_used``, whether the method
    is lossless: ``job.exactness``)."""

    cfg: DictConfig
    run_dir: Path
    choices: dict[str, str]
    job: Job
    store: ResultStore
    tracker: Any
    env: dict[str, Any]
    n_prompts: int
    rule_name: str = "exact"
    lantern: dict[str, Any] | None = None
    lossless: tuple[bool, str] | None = None  # ``job.exactness``: the flag and its reason

    def summary(self, records: list[dict[str, Any]], run_info: dict[str, Any]) -> Summary:
        """:meth:`Summary.build` of ``records`` for this job (with the simulated device's counts so far in this
        process — load, bind, warm-up, decodes — when it runs on one)."""
        sim = accel.simulation()
        if sim is not None:
            run_info = {**run_info, "simulated_device": sim.report()}
        return Summary.build(
            records,
            self.cfg,
            self.choices,
            self.env,
            self.n_prompts,
            self.rule_name,
            run_info,
            self.lantern,
            self.lossless,
        )


def _decode_all(ctx: RunContext, todo: list[Prompt], run_info: dict[str, Any]) -> Summary:
    """Decode every unfinished prompt (baseline and method, ``timing.repeats`` times), commit its records, refresh
    the summary; the load average is read just before and just after this timed work."""
    from tqdm import tqdm

    conf, target, store, tracker, run_dir = ctx.job.conf, ctx.job.target, ctx.store, ctx.tracker, ctx.run_dir
    repeats = conf.timing.repeats
    records = [slim(r) for r in store.records()]
    watch = LoadWatch(run_info["cpus_available"])
    run_info = {
        **run_info,
        **watch.start(
            f"{len(todo)} prompt(s) × {repeats} repeat(s), {run_info['threads']} "
            f"torch thread(s), {run_info['cpus_available']} core(s)"
        ),
    }
    last_summary = time.perf_counter()
    bar = tqdm(total=len(todo), desc=ctx.job.policy.name, disable=not conf.progress, file=sys.stderr)
    for p, seed, runs, bases, refs, aas, batch in timed_results(ctx.job, todo, repeats, conf.baseline, conf.timing.aa):
        bar.update()
        res = runs[0]
        image = target.decode_image(target.layout.tokens_to_codes(res.tokens)) if conf.save_images else None
        trace = trace_record(p.prompt_id, res)
        sample = SampleRecord.build(p, seed, runs, bases or None, batch, refs or None, aas or None)
        record = store.commit(sample, trace, image)
        if conf.maps is not None and conf.maps.per_image:
            from adtbench.harness.maps import write_sample_maps

            write_sample_maps(run_dir, trace, target.layout)
        records.append(record.slim())
        if time.perf_counter() - last_summary > SUMMARY_EVERY_S:  # keep summary.json current, cheaply
            store.write_summary(ctx.summary(records, run_info))
            last_summary = time.perf_counter()
        tracker.log_sample(record.to_json(), trace, image)
    bar.close()
    run_info |= watch.stop()
    summary = ctx.summary(records, run_info)
    for warning in ("timing_warning", "aa_warning"):
        if summary.stats.get(warning):
            log.warning("%s", summary.stats[warning])
    store.write_summary(summary)
    if conf.maps is not None and conf.maps.per_run:
        from adtbench.harness.maps import write_run_maps

        write_run_maps(run_dir, store.traces(), target.layout)
    tracker.log_summary(summary.to_json())
    return summary


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
