"""Running the selected metrics on a run dir (:func:`run_eval`) and the ``adtbench eval`` command (:func:`main`):
results go to ``eval.json``, ``eval_samples.jsonl`` and ``summary.json["eval"]`` (package docstring).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import load_run_samples, node_get, pick_device, prompt_ids_digest
from adtbench.harness.eval.context import EvalContext
from adtbench.harness.eval.metrics import METRICS, validate
from adtbench.harness.records import Summary
from adtbench.harness.rundir import (
    has_samples,
    has_summary,
    is_merged_run,
    merged_sources,
    read_run_config,
    read_summary_typed,
    sample_dirs,
    samples_path,
)
from adtbench.harness.rundir_write import write_eval

log = logging.getLogger("adtbench.harness.eval")


def run_eval(
    cfg: Any,
    run_dir: str | os.PathLike[str],
    target: Any = None,
    inject: dict[str, Any] | None = None,
    shared: dict[Any, Any] | None = None,
    summary: Summary | None = None,
) -> Summary | None:
    """Evaluate the run in ``run_dir`` with ``cfg.eval``; write ``eval.json``, ``eval_samples.jsonl`` and the
    ``eval`` block of ``summary.json`` (``rundir_write.write_eval``); return the updated summary (the run's as it was
    when nothing is evaluated: None without one).

    Args:
        cfg: the composed config (``cfg.eval`` is used; ``paths`` only through interpolations).
        run_dir: a job directory holding ``samples.jsonl`` and ``images/``.
        target: the decoded target (its CUDA device is reused with ``eval.device=auto``).
        inject: stand-in modules instead of loading weights (see :class:`EvalContext`).
        shared: a dict reused across calls to keep loaded models (several run dirs in one process).
        summary: the run's summary as the caller just wrote it (the app); else read from the run dir.
    """
    run = Path(run_dir)
    names = validate(cfg, inject)
    ecfg = cfg.eval
    if summary is None:
        summary = read_summary_typed(run) if has_summary(run) else None
    if not names:
        return summary
    samples = load_run_samples(run)
    cache = node_get(ecfg, "cache_dir")
    ctx = EvalContext(
        run_dir=run,
        samples=samples,
        device=pick_device(node_get(ecfg, "device", "auto"), target),
        batch_size=int(node_get(ecfg, "batch_size", 32)),
        cache_dir=None if cache is None else Path(str(cache)).expanduser(),
        inject=dict(inject or {}),
        progress=bool(cfg.get("progress", True)) if hasattr(cfg, "get") else False,
        memo=shared if shared is not None else {},
    )
    # features of generated images are per run: drop those of a previous run sharing the memo
    for k in [k for k in ctx.memo if isinstance(k, tuple) and k and k[0] == "generated"]:
        del ctx.memo[k]
    block: dict[str, Any] = {
        "kind": str(node_get(ecfg, "kind")),
        "metrics": names,
        "n_images": len(samples),
        "prompt_ids": prompt_ids_digest([s.prompt_id for s in samples]),
        "device": str(ctx.device),
        "values": {},
        "time_s": {},
    }
    per_prompt: dict[str, dict[str, float]] = {}
    log.info("evaluating %d images of %s: %s", len(samples), run, ", ".join(names))
    error: BaseException | None = None
    for name in names if samples else []:
        t0 = time.perf_counter()
        try:
            out = METRICS.build(name, ecfg, ctx)
        except Exception as e:  # keep what finished, record the failure, then re-raise
            block["error"] = {"metric": name, "type": type(e).__name__, "message": str(e)}
            error = e
            break
        block["time_s"][name] = time.perf_counter() - t0
        for entry, details in out.entries.items():
            block[entry] = details
            block["values"][entry] = details.get("value")
        for col, vals in out.per_prompt.items():
            for pid, v in vals.items():
                per_prompt.setdefault(pid, {})[col] = v
    if not samples:
        block["skipped"] = f"no samples in {samples_path(run)}"
    block["complete"] = error is None and bool(samples)
    rows = [{"prompt_id": s.prompt_id, **per_prompt[s.prompt_id]} for s in samples if s.prompt_id in per_prompt]
    summary = write_eval(run, block, rows, summary)
    if error is not None:
        raise error
    return summary


def eval_line(summary: Summary | None) -> str:
    """One line with the evaluated values."""
    vals = ((summary.eval if summary is not None else None) or {}).get("values") or {}
    parts = [f"{k}={v:.4g}" if isinstance(v, int | float) else f"{k}=exported" for k, v in vals.items()]
    return "adtbench eval: " + (" ".join(parts) if parts else "nothing evaluated")


def find_run_dirs(root: Path) -> list[Path]:
    """``root`` if it is a run dir, else every run dir (holding ``samples.jsonl``) below it, sorted — where a merged
    run (``adtbench merge``) is among them, without the shard runs it was built from: a set metric (FID, P&R, KID)
    of a sharded config is the merged run's, not a mean over shards. Shard runs (``dataset.shard`` set) without
    their merged run are a ``ConfigError`` naming ``eval`` and the merge command."""
    if has_samples(root):
        return [root]
    runs = [d for d in sample_dirs(root) if "export" not in d.relative_to(root).parts]
    merged_from = {src.resolve() for d in runs if is_merged_run(d) for src in merged_sources(d)}
    runs = [d for d in runs if d.resolve() not in merged_from]
    shards = [d for d in runs if _shard_of(d) is not None]
    if shards:
        raise ConfigError(
            "eval",
            f"{len(shards)} shard run(s) under {root} (first: {shards[0]}) have no merged run: set metrics are not "
            f"additive over shards; merge first (adtbench merge {root} --out {root}/merged), then evaluate",
        )
    return runs


def _shard_of(run: Path) -> str | None:
    """``dataset.shard`` of a run (its ``run_config.json``), None for an unsharded run."""
    cfg = read_run_config(run) or {}
    shard = (cfg.get("dataset") or {}).get("shard") if isinstance(cfg.get("dataset"), dict) else None
    return None if shard in (None, "", "null") else str(shard)


def main(args: list[str]) -> int:
    """``adtbench eval <run_dir | tree> [overrides]``: evaluate existing run dir(s)."""
    if not args or args[0] in ("-h", "--help") or args[0].find("=") >= 0:
        print("usage: adtbench eval <run_dir | results tree> eval=<preset> [overrides]", file=sys.stderr)
        return 2
    from adtbench.harness.config import compose_config

    root, overrides = Path(args[0]), args[1:]
    try:
        cfg = compose_config("config", list(overrides))
    except ConfigError as e:
        print(f"adtbench eval: config error: {e}", file=sys.stderr)
        return 2
    try:
        runs = find_run_dirs(root)
    except ConfigError as e:
        print(f"adtbench eval: config error: {e}", file=sys.stderr)
        return 2
    if not runs:
        print(f"adtbench eval: no run dir (with samples.jsonl) at or under {root}", file=sys.stderr)
        return 1
    try:
        if not validate(cfg):
            print("adtbench eval: nothing to evaluate; choose a preset, e.g. eval=mini or eval=clip", file=sys.stderr)
            return 2
        shared: dict[Any, Any] = {}
        for run in runs:
            summary = run_eval(cfg, run, shared=shared)
            print(f"{eval_line(summary)} -> {run}")
            _log_to_tracker(cfg, run, summary, overrides)
    except ConfigError as e:
        print(f"adtbench: config error: {e}", file=sys.stderr)
        return 2
    return 0


def _log_to_tracker(cfg: Any, run: Path, summary: Summary | None, overrides: list[str]) -> None:
    """With ``logger=wandb``: the evaluation is logged into the W&B run of the run it evaluates (same id, job
    type, group and name, that run's config plus this ``eval`` node; ``tracking.build_logger(attach=True)``);
    ``overrides`` (this command's) tell whether ``logger.mode`` was set on the command line."""
    if str(node_get(cfg, "logger.kind", "none")) == "none":
        return
    from adtbench.harness.tracking import build_logger, mode_on_cli

    choices = dict(summary.choices) if summary is not None else {}
    tracker = build_logger(cfg, run, choices, mode_on_cli=mode_on_cli(overrides), attach=True)
    try:
        tracker.log_summary(summary.to_json() if summary is not None else {})
    finally:
        tracker.finish()
