"""Loading a results tree (``tables``' module docstring, "Loading"): every job dir under the root that holds
``summary.json`` becomes one row of ``runs`` and its samples rows of ``samples`` (:func:`load_tree`), read through
:mod:`adtbench.harness.rundir` (:func:`~adtbench.harness.rundir.find_runs` and its readers); files are only read."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adtbench.harness.records import Summary, migrate_run_config, moved_graph_keys
from adtbench.harness.rundir import (
    find_runs,
    is_merged_run,
    lantern_choice,
    merged_sources,
    read_eval,
    read_eval_samples,
    read_overrides,
    read_provenance,
    read_run_config,
    read_samples,
    read_summary_typed,
)

CHOICE_COLUMNS = ("model", "drafter", "policy", "lantern", "dataset", "sampling")
"""The runs' choice columns (``runs``: one per config group choice)."""
SAMPLE_FIELDS = (
    "seed",
    "committed",
    "cycles",
    "drafted_depth_sum",
    "tree_depth_sum",
    "latency_s",
    "baseline_latency_s",
    "reference_latency_s",
    "aa_latency_s",
    "tau",
    "speedup",
)
"""The ``samples.jsonl`` fields every sample row carries."""


def _config_id(run_dir: Path, summary: Summary) -> str:
    """Hash of the run's config without its shard (``run_config.json`` as today's fingerprint reads it:
    ``migrate_run_config``, so a run saved before a key moved groups with today's; else the summary's
    choices/params)."""
    cfg = read_run_config(run_dir)
    if cfg is not None:
        cfg = migrate_run_config(cfg)
        if isinstance(cfg.get("dataset"), dict):
            cfg["dataset"].pop("shard", None)
    else:
        choices = {k: v for k, v in (summary.choices or {}).items() if not k.startswith("hydra")}
        cfg = {"choices": choices, "policy_params": summary.policy_params, "sampling_params": summary.sampling_params}
        cfg |= {"model": summary.model, "policy": summary.policy}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_lossless(run_dir: Path, summary: Summary | None = None) -> tuple[bool | None, str]:
    """Whether the run's method is lossless (greedy token-identical, sampled distribution-identical to AR) and why.

    As the run recorded it (``summary.json``'s ``lossless``, else ``run_config.json``'s provenance: ``job.exactness``
    when it decoded); for a run from before the flag, the same :func:`adtbench.harness.job.exactness` of the policy
    the registry builds from its ``run_config.json`` and its acceptance rule (LANTERN's bounds from the summary's
    ``lantern_params``, else the config's ``lantern`` node; the reason then says it was derived). ``(None, why)``
    when it cannot be told (no config, an older config a current policy no longer accepts)."""
    if summary is not None and summary.lossless is not None:
        return summary.lossless, str(summary.lossless_reason)
    prov = read_provenance(run_dir)
    if prov is not None and prov.get("lossless") is not None:
        return bool(prov["lossless"]), str(prov.get("lossless_reason"))
    cfg = moved_graph_keys(read_run_config(run_dir) or {})  # policy.step / graph_levels: engine.graphs now
    node = dict(cfg.get("policy") or {})
    name = node.pop("name", None)
    if name is None:
        return None, "unknown: the run recorded no policy"
    try:
        from adtbench.algorithm.policies import POLICIES
        from adtbench.harness.job import exactness

        got = exactness(POLICIES.build(str(name), node), _recorded_rule(cfg, summary))
    except Exception as e:  # an older config a current policy or rule no longer accepts: say unknown, do not guess
        return None, f"unknown: policy={name} as recorded cannot be rebuilt ({type(e).__name__}: {e})"
    return got.lossless, f"{got.reason} (derived from run_config.json: the run recorded no flag)"


def _recorded_rule(cfg: dict[str, Any], summary: Summary | None) -> Any:
    """The acceptance rule a run decoded with, for :func:`run_lossless`: exact, or LANTERN with its recorded bounds
    over a one-entry stand-in neighbour table (whether a LANTERN rule is lossless depends on its bounds and residual
    only: ``LanternRule.lossless``)."""
    from adtbench.algorithm.verify import EXACT

    node = cfg.get("lantern") or {}
    if not node.get("enabled", False):
        return EXACT
    import torch

    from adtbench.algorithm.methods.lantern import LanternRule
    from adtbench.harness.caches import lantern_params

    p = lantern_params(node)
    used = (summary.lantern_params if summary is not None else None) or {}
    delta, lam = used.get("delta", p.delta), used.get("lam", p.lam)
    residual = bool(used.get("reference_residual", p.reference_residual))
    return LanternRule(torch.zeros((1, 1), dtype=torch.long), 0, delta=delta, lam=lam, k=1, reference_residual=residual)


def find_trees(roots: str | Path | Sequence[str | Path]) -> list[Path]:
    """Every job dir under one results dir or several (:func:`~adtbench.harness.rundir.find_runs` of each, in the
    order given); a dir reached from two roots is listed once."""
    roots = [roots] if isinstance(roots, str | Path) else list(roots)
    seen: set[Path] = set()
    out = []
    for root in roots:
        for d in find_runs(root):
            if d.resolve() not in seen:
                seen.add(d.resolve())
                out.append(d)
    return out


def load_tree(root: str | Path | Sequence[str | Path]) -> tuple[Any, Any]:
    """(``runs``, ``samples``) DataFrames of a results tree, or of several (:func:`find_trees`; module docstring).

    ``runs``: one row per job dir — ``run_dir``, ``job``, ``config_id``, the choices (``model``, ``drafter``,
    ``policy``, ``lantern``, ``dataset``, ``sampling``), ``shard``, ``merged``, ``n_samples``, ``n_prompts``,
    ``complete``, ``tau``, ``d_bar``, ``d_bar_tree``, ``speedup``, ``latency_s``, ``baseline_latency_s``,
    ``speedup_ref`` and ``reference_baseline`` (``timing.reference_baseline``: the speedup against the reference
    implementation's AR and what that ran on; None without), ``aa_ratio`` (``timing.aa``: the A/A control; None
    without), ``lossless`` / ``lossless_reason`` (:func:`run_lossless`),
    ``device``, ``load_before`` / ``load_peak`` (the 1-minute load average at the start / its peak) and
    ``cpu_count``, one column per evaluated metric (``summary["eval"]["values"]``), ``ov.<key>`` per override.
    ``samples``: one row per sample — ``run_dir``, ``config_id``, ``prompt_id``, ``seed``, ``committed``,
    ``cycles``, ``drafted_depth_sum``, ``tree_depth_sum``, ``latency_s``, ``baseline_latency_s``,
    ``reference_latency_s``, ``aa_latency_s`` (None without ``timing.aa``), ``tau``, ``speedup``, ``window_mean``
    (the Jacobi loops' mean verified window, from ``stats``; absent for other policies, so the table shows it only
    for them) and the per-prompt metrics of ``eval_samples.jsonl``.
    """
    import pandas as pd

    dirs = find_trees(root)
    superseded: set[str] = set()
    for d in dirs:  # merged runs supersede their shard sources
        superseded |= {str(src.resolve()) for src in merged_sources(d)}
    run_rows, sample_rows = [], []
    for d in dirs:
        if str(d.resolve()) in superseded:
            continue
        s = read_summary_typed(d)
        cid = _config_id(d, s)
        ev = s.eval or {}
        if not ev:  # summary rewritten by a resume: the eval block of eval.json, if still current
            ev = read_eval(d) or {}
            if ev.get("n_images") != s.stats.get("n_samples"):
                ev = {}
        env = s.env or {}
        lossless, why = run_lossless(d, s)
        row: dict[str, Any] = {
            "run_dir": str(d),
            "job": d.name,
            "config_id": cid,
            **{c: lantern_choice(s) if c == "lantern" else getattr(s, c) for c in CHOICE_COLUMNS},
            "shard": (s.choices or {}).get("dataset.shard") or _shard_of(d),
            "merged": is_merged_run(d),
            "n_samples": s.stats.get("n_samples"),
            "n_prompts": s.n_prompts,
            "complete": s.complete,
            **{k: s.stats.get(k) for k in ("tau", "d_bar", "d_bar_tree", "speedup", "latency_s", "baseline_latency_s")},
            "speedup_ref": s.stats.get("speedup_ref"),
            "aa_ratio": s.stats.get("aa_ratio"),  # timing.aa: the run's own A/A figure (None without)
            "reference_baseline": (s.run or {}).get("reference_baseline"),
            "lossless": lossless,
            "lossless_reason": why,
            "device": env.get("gpu") or env.get("device"),
            **{k: (s.run or {}).get(k) for k in ("load_before", "load_peak", "cpu_count")},
            **{k: v for k, v in (ev.get("values") or {}).items() if isinstance(v, int | float) or v is None},
        }
        row |= {f"ov.{k}": v for k, v in read_overrides(d).items()}
        run_rows.append(row)
        per_prompt = {r["prompt_id"]: r for r in read_eval_samples(d)}
        for rec in read_samples(d):
            srow = {"run_dir": str(d), "config_id": cid, "prompt_id": rec["prompt_id"]}
            for k in SAMPLE_FIELDS:
                srow[k] = rec.get(k)
            st = rec.get("stats")
            if isinstance(st, dict) and isinstance(st.get("window_mean"), int | float):
                srow["window_mean"] = float(st["window_mean"])  # the Jacobi loops' verified window (a column)
            extra = per_prompt.get(rec["prompt_id"], {})
            srow |= {k: v for k, v in extra.items() if k != "prompt_id"}
            sample_rows.append(srow)
    runs = pd.DataFrame(run_rows)
    samples = pd.DataFrame(sample_rows)
    if len(samples):
        numeric = ("committed", "cycles", "drafted_depth_sum", "tree_depth_sum", "latency_s", "baseline_latency_s")
        for k in (*numeric, "reference_latency_s", "aa_latency_s"):
            samples[k] = pd.to_numeric(samples[k], errors="coerce")
    return runs, samples


def _shard_of(d: Path) -> str | None:
    cfg = read_run_config(d)
    return None if cfg is None else (cfg.get("dataset") or {}).get("shard")


__all__ = ["CHOICE_COLUMNS", "SAMPLE_FIELDS", "find_trees", "load_tree", "run_lossless"]
