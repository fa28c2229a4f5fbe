"""Merge the shard runs of one config (``dataset.shard=i/n`` job-array tasks) into one run.

    adtbench merge <shard dir>... | <array dir>  --out <dir> [--allow-partial] [--force] [--no-wandb]
    python -m adtbench.reporting.merge ...

Checks, before anything is written:

- every input holds ``run_config.json`` and the configs are identical except ``dataset.shard``;
- the shard specs share one ``n`` and cover ``0..n-1`` exactly once (``--allow-partial``: a subset);
- no prompt id appears in two shards (nothing counted twice);
- against the prompt set re-loaded from the recorded dataset config (unsharded): every shard holds only its
  own block's ids, and the union is the whole set (nothing lost; ``--allow-partial`` accepts missing ones).

The merged dir gets ``samples.jsonl`` and ``trace.jsonl`` in dataset order, ``images/`` (hard links where
possible), ``run_config.json`` (shard removed; its ``provenance`` lists every shard's commits), ``merge.json``
(sources and checks) and ``summary.json`` recomputed from all samples with :func:`adtbench.harness.stats.summarize`
— so τ and d̄ are ratios of totals and the speedup is mean baseline latency / mean method latency over every sample,
not an average of shard speedups. ``env_consistent`` says whether all shards ran on the same device and software
(speedups are comparable only within one environment; ``env`` names the code's commit too). Every file name comes
from :mod:`adtbench.harness.rundir`, every write is atomic (:mod:`adtbench.io`).

W&B: when the shards were decoded with ``logger=wandb`` (their ``.hydra/config.yaml``), the merged run is logged as
its own W&B run in the shards' group (the array), job type = the policy, config = the merged ``run_config.json``:
every sample (replayed from the merged ``samples.jsonl``), the summary (speedup CI included) and the samples
table; the mode follows ``WANDB_MODE``, else the shards' ``logger.mode``. ``--no-wandb`` skips it. As everywhere,
a W&B failure never fails the merge (:mod:`adtbench.harness.tracking`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from adtbench.errors import ConfigError
from adtbench.harness.config import config_diff
from adtbench.harness.data.prompts import load_prompts, parse_shard, shard_prompts
from adtbench.harness.provenance import merged_provenance
from adtbench.harness.records import Summary
from adtbench.harness.rundir import (
    has_samples,
    has_summary,
    is_merged_run,
    read_hydra_config,
    read_provenance,
    read_run_config,
    read_summary_typed,
    read_tracking,
    run_config_dirs,
)
from adtbench.harness.rundir_write import ResultStore, write_merged_run


class MergeError(ValueError):
    """The inputs cannot be merged without losing or double-counting samples."""


def find_shard_dirs(paths: list[Path]) -> list[Path]:
    """Each path that holds ``run_config.json``, else every such dir below it (sorted)."""
    out: list[Path] = []
    for p in paths:
        if read_run_config(p) is not None:
            out.append(p)
        else:
            out += [d for d in run_config_dirs(p) if not is_merged_run(d)]
    return out


def _without_shard(cfg: dict[str, Any]) -> dict[str, Any]:
    c = json.loads(json.dumps(cfg))
    if isinstance(c.get("dataset"), dict):
        c["dataset"]["shard"] = None
    return c


def _recorded_limit(d: Path) -> tuple[bool, Any]:
    """``dataset.limit`` of a shard run from Hydra's ``.hydra/config.yaml`` (run_config.json omits it: a resume
    may extend the limit). Returns (found, value)."""
    composed = read_hydra_config(d)
    if composed is None:
        return False, None
    ds = composed.get("dataset") or {}
    return ("limit" in ds), ds.get("limit")


def _expected_prompts(
    cfg: dict[str, Any], dirs: dict[int, Path], n: int, sizes: dict[int, int]
) -> tuple[list[str] | None, str]:
    """The unsharded prompt ids of the recorded dataset config (limit applied), or (None, reason).

    The limit comes from the shards' ``.hydra/config.yaml`` (all must agree); without it, from the shards'
    ``n_prompts`` when every shard is present (limit → shard: the shards tile the first Σ n_prompts prompts).
    """
    d = dict(cfg.get("dataset") or {})
    found = {i: _recorded_limit(p) for i, p in dirs.items()}
    limits = {repr(v) for ok, v in found.values() if ok}
    if len(limits) > 1:
        raise MergeError(f"the shards ran with different dataset.limit values: {sorted(limits)}")
    total: int | None = None
    if limits:
        limit = next(v for ok, v in found.values() if ok)
    elif len(dirs) == n and len(sizes) == n:
        limit, total = None, sum(sizes.values())
    else:
        return None, "skipped: dataset.limit unknown (no .hydra/config.yaml) and not every shard present"
    try:
        prompts = load_prompts(
            str(d.get("kind")),
            d.get("path"),
            limit,
            None,
            caption=str(d.get("caption", "first")),
            text=d.get("text"),
        )
    except ConfigError as e:
        return None, f"skipped: the dataset could not be re-loaded ({e})"
    ids = [p.prompt_id for p in prompts]
    if total is not None:
        if total > len(ids):
            raise MergeError(f"the shards claim {total} prompts, the dataset has {len(ids)}")
        ids = ids[:total]
    return ids, "passed"


def merge_runs(shard_dirs: list[Path], out: Path, allow_partial: bool = False, force: bool = False) -> dict[str, Any]:
    """Merge ``shard_dirs`` into ``out`` (module docstring); return the merged summary.

    Raises:
        MergeError: mismatched configs, duplicate or missing shards/prompts (unless ``allow_partial``), or an
            existing run in ``out`` (unless ``force``).
    """
    if not shard_dirs:
        raise MergeError("no shard run dirs (with run_config.json) given")
    if has_samples(out) and not force:
        raise MergeError(f"{out} already holds a run; pass --force to overwrite")
    cfgs = []
    for d in shard_dirs:
        cfg = read_run_config(d)
        if cfg is None:
            raise MergeError(f"{d} holds no run_config.json: not an adtbench run dir")
        cfgs.append(cfg)
    base = _without_shard(cfgs[0])
    for d, c in zip(shard_dirs[1:], cfgs[1:]):
        diff = config_diff(base, _without_shard(c))
        if diff:
            raise MergeError(f"{d} has a different config from {shard_dirs[0]} (differs in: {', '.join(diff)})")
    specs = [parse_shard((c.get("dataset") or {}).get("shard")) for c in cfgs]
    n = specs[0][1]
    if any(s[1] != n for s in specs):
        raise MergeError(f"shard counts differ: {sorted({s[1] for s in specs})}")
    by_index: dict[int, Path] = {}
    for d, (i, _) in zip(shard_dirs, specs):
        if i in by_index:
            raise MergeError(f"shard {i}/{n} appears twice: {by_index[i]} and {d}")
        by_index[i] = d
    missing_shards = sorted(set(range(n)) - set(by_index))
    if missing_shards and not allow_partial:
        raise MergeError(f"missing shard(s) {missing_shards} of {n} (--allow-partial merges the rest)")

    shard_summaries: dict[int, Summary | None] = {
        i: read_summary_typed(d) if has_summary(d) else None for i, d in by_index.items()
    }
    sizes = {i: s.n_prompts for i, s in shard_summaries.items() if s is not None}
    expected, check = _expected_prompts(cfgs[0], by_index, n, sizes)
    records: dict[str, dict[str, Any]] = {}
    traces: dict[str, dict[str, Any]] = {}
    owner: dict[str, Path] = {}
    summaries = []
    for i in sorted(by_index):
        d = by_index[i]
        store = ResultStore(d)
        recs = store.records()
        if expected is not None:
            own = {p.prompt_id for p in shard_prompts([_P(x) for x in expected], i, n)}
            foreign = [r["prompt_id"] for r in recs if r["prompt_id"] not in own]
            if foreign:
                raise MergeError(f"{d} (shard {i}/{n}) holds prompts of another shard: {foreign[:3]}")
        for r in recs:
            pid = r["prompt_id"]
            if pid in records:
                raise MergeError(f"prompt {pid!r} is in both {owner[pid]} and {d}")
            records[pid], owner[pid] = r, d
        traces |= {t["prompt_id"]: t for t in store.traces() if t["prompt_id"] in records}
        summaries.append({"dir": str(d), "shard": f"{i}/{n}", "n_samples": len(recs), "summary": shard_summaries[i]})

    if expected is not None:
        order = [pid for pid in expected if pid in records]
        lost = [pid for pid in expected if pid not in records]
    else:
        order = [pid for i in sorted(by_index) for pid in records if owner[pid] == by_index[i]]
        lost = []
    if lost and not allow_partial:
        raise MergeError(
            f"{len(lost)} prompt(s) have no sample (first: {lost[:3]}); finish the shards or --allow-partial"
        )
    if not order:
        raise MergeError("the shards hold no samples")

    recs = [records[pid] for pid in order]
    merged_cfg = _without_shard(cfgs[0])
    greedy = float((merged_cfg.get("sampling") or {}).get("temperature", 1.0)) == 0.0
    n_prompts = (
        len(expected) if expected is not None else sum(s["summary"].n_prompts for s in summaries if s["summary"])
    )
    sources = [{k: s[k] for k in ("dir", "shard", "n_samples")} for s in summaries]
    summary = Summary.merged(
        recs,
        [s["summary"] for s in summaries],
        sources,
        greedy,
        n_prompts,
        complete=len(recs) == n_prompts and not missing_shards,
    )
    info = {
        "shards": n,
        "merged": sorted(by_index),
        "missing_shards": missing_shards,
        "sources": sources,
        "n_samples": len(recs),
        "missing_prompts": lost,
        "dataset_check": check,
    }
    traced = [traces[pid] for pid in order if pid in traces]
    prov = merged_provenance([read_provenance(by_index[i]) for i in sorted(by_index)])
    write_merged_run(out, [(owner[pid], records[pid]) for pid in order], traced, merged_cfg, summary, info, prov)
    return summary.to_json()


def log_merged_run(shard_dirs: list[Path], out: Path, summary: dict[str, Any]) -> bool:
    """Log the merged run ``out`` to W&B when the shards were decoded with ``logger=wandb`` (module docstring);
    returns whether a tracker was opened. The group is the shards' W&B group (their ``tracking.json``), else the
    array dir's name, as :mod:`adtbench.harness.tracking` groups ``dataset.shard`` jobs."""
    from omegaconf import OmegaConf

    from adtbench.harness.tracking import NullLogger, build_logger

    node = next(
        (h["logger"] for d in shard_dirs if isinstance(h := read_hydra_config(d) or {}, dict) and h.get("logger")),
        None,
    )
    if not node or str(node.get("kind", "none")) != "wandb":
        return False
    group = None
    for d in shard_dirs:
        runs = read_tracking(d)
        group = next((r["group"] for r in runs if r.get("kind") == "wandb" and r.get("group")), None)
        if group:
            break
    cfg = OmegaConf.create({**(read_run_config(out) or {}), "logger": node})
    choices = dict(summary.get("choices") or {})
    tracker = build_logger(cfg, out, choices, mode_on_cli=False, group=group or out.resolve().parent.name)
    try:
        tracker.log_summary(summary)
    finally:
        tracker.finish()
    return not isinstance(tracker, NullLogger)


class _P:
    """A bare prompt-id holder for :func:`shard_prompts`."""

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id


def main(args: list[str]) -> int:
    """``adtbench merge``: see the module docstring."""
    ap = argparse.ArgumentParser(prog="adtbench merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", type=Path, help="shard run dirs, or a dir holding them")
    ap.add_argument("--out", type=Path, required=True, help="the merged run dir")
    ap.add_argument("--allow-partial", action="store_true", help="merge present shards/prompts only")
    ap.add_argument("--force", action="store_true", help="overwrite an existing merged run in --out")
    ap.add_argument("--no-wandb", action="store_true", help="do not log the merged run to W&B")
    ns = ap.parse_args(args)
    try:
        dirs = find_shard_dirs(ns.inputs)
        s = merge_runs(dirs, ns.out, ns.allow_partial, ns.force)
    except (MergeError, ConfigError) as e:
        print(f"adtbench merge: {e}", file=sys.stderr)
        return 2
    if not ns.no_wandb:
        try:
            log_merged_run(dirs, ns.out, s)
        except Exception as e:  # W&B mirrors the merged files; it never fails the merge
            print(f"adtbench merge: W&B logging skipped ({type(e).__name__}: {e})", file=sys.stderr)
    sp = "n/a" if s.get("speedup") is None else f"{s['speedup']:.3f}x"
    tau = "n/a" if s.get("tau") is None else f"{s['tau']:.3f}"
    print(
        f"adtbench merge: {len(dirs)} shard(s), n={s['n_samples']}/{s['n_prompts']} tau={tau} speedup={sp} "
        f"complete={s['complete']} -> {ns.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
