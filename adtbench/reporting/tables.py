"""Results tree → pandas → paper tables (markdown / LaTeX booktabs / CSV) with bootstrap confidence intervals.

    adtbench table <results dir>... [--by model,policy] [--metrics clip_score,fid] [--format md|latex|csv]
                   [--n-boot 1000] [--ci 0.95] [--seed 0] [--digits 3] [--out FILE]
                   [--write DIR] [--pivot lantern] [--into README.md --marker NAME]

The one table command: ``python -m analysis.tables`` (paper files) and ``analysis/sweep_table.py`` (one row per
multirun job) call :func:`main` with their options. ``--write DIR`` writes ``main.md``, ``main.tex`` and
``main.csv`` (:func:`write_tables`) and, with ``--pivot COLUMN``, the speedup pivot ``speedup_pivot.md`` /
``.tex`` (:func:`pivot`: ``model`` × ``policy`` rows, one column per value of COLUMN, "v [lo, hi]" cells). Every
file and every printed table ends with one newline.

Loading (:func:`adtbench.reporting.load.load_tree`, through :mod:`adtbench.harness.rundir`:
:func:`~adtbench.harness.rundir.find_runs` and its readers): every job dir under the root that holds ``summary.json`` —
single runs, multirun jobs, shard runs, merged runs — becomes one row of ``runs``; its ``samples.jsonl`` lines (plus the
per-prompt metrics of ``eval_samples.jsonl``) become rows of ``samples``. Files are only read. A merged run and the
shards it was merged from describe the same samples: when both are in the tree the shards are dropped (``merge.json``
lists them). Runs of the same config (repeats, or the shards of a config without a merged run) are pooled.

Aggregation (:func:`aggregate`), per group of runs (``--by``; default: the config choices and overrides that
vary across the tree), over the pooled samples:

- τ = Σ committed / Σ cycles, d̄ = Σ drafted depth / Σ cycles (``docs/algorithms.md`` §1.2);
- speedup = Σ baseline latency / Σ method latency over samples with a baseline (= ratio of means);
- A/A (``aa_ratio``) = Σ baseline latency / Σ A/A latency over samples timed with ``timing.aa=true`` (the AR baseline
  against itself in the speedup's interleaving: the speedup's noise floor); shown beside the speedup in every table
  that has one, ``—`` where not measured, marked ``!`` where its interval excludes 1 (:data:`AA_FLAG_MARK`);
- latency = mean method latency per image (s);
- a per-prompt metric (CLIP, HPS, aesthetic, mini agreement) = mean over images;
- a set metric (FID, IS, precision, recall, ...) = its value (mean over runs when a group holds several).

Confidence intervals: percentile bootstrap over prompts (``n_boot`` resamples, seed ``seed``) — prompts are
resampled with all their samples (cluster bootstrap; with one sample per prompt this is the plain bootstrap of
:func:`adtbench.harness.stats.bootstrap_ci`, and gives identical intervals for the same seed). Ratio statistics
are recomputed on each resample (ratio of resampled sums). Set metrics have no interval.

Rendering (:func:`render`): a CI over fewer than ``SPEEDUP_CI_MIN_PROMPTS`` (5) prompts is marked † (LaTeX
``$^\\dagger$``) and explained in a footnote under the table; LaTeX text (row keys, column names) is escaped by
pandas' own ``Styler`` escaping (``escape="latex"``; headers ``"latex-math"`` so ``$\\tau$`` labels survive);
numeric columns are right-aligned (markdown ``---:``, LaTeX ``r``), row keys left-aligned.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adtbench.harness.rundir import (
    PLUMBING_KEYS,
    POOLED_KEYS,
    is_plumbing,
)
from adtbench.harness.stats import SPEEDUP_CI_MIN_PROMPTS, bootstrap_distribution, percentile_interval
from adtbench.io import atomic_write_text
from adtbench.reporting.load import CHOICE_COLUMNS, SAMPLE_FIELDS, load_tree

#: overrides that never define a table row: run plumbing, and the keys whose runs are pooled (shards, seeds)
IGNORED_OVERRIDES = PLUMBING_KEYS + POOLED_KEYS
PER_PROMPT_METRICS = ("clip_score", "hpsv2", "hpsv21", "aesthetic", "mini_agreement")
LOWER_IS_BETTER = {"fid", "mini_fid", "latency_s"}
#: The value columns that are not quality metrics (the speed, the A/A control and the drafting figures): what the
#: speedup–quality plots never pick as their metric.
NOT_QUALITY = ("tau", "d_bar", "speedup", "speedup_ref", "aa_ratio", "latency_s", "window_mean")
#: The ``speedup`` header when ``speedup_ref`` is shown beside it: each names its baseline.
SPEEDUP_LEAN_LABEL = ("speedup vs lean AR (×)", r"Speedup vs lean AR ($\times$)")
#: The mark after an A/A cell whose interval excludes 1 (markdown, LaTeX): the timing favours one side at that level.
AA_FLAG_MARK = (" !", " !")
LOSSLESS_TEXT = {True: "yes", False: "no", None: "?"}  # the ``lossless`` column (``mixed``: a group of both)
LABELS = {
    "tau": ("τ", r"$\tau$"),
    "d_bar": ("d̄", r"$\bar d$"),
    "speedup": ("speedup (×)", r"Speedup ($\times$)"),
    "speedup_ref": ("speedup vs reference AR (×)", r"Speedup vs reference AR ($\times$)"),
    "aa_ratio": ("A/A (×)", r"A/A ($\times$)"),
    "latency_s": ("latency (s)", r"Latency (s)"),
    "clip_score": ("CLIP", r"CLIP"),
    "hpsv21": ("HPSv2.1", r"HPSv2.1"),
    "hpsv2": ("HPSv2", r"HPSv2"),
    "aesthetic": ("aesthetic", r"Aesthetic"),
    "fid": ("FID", r"FID"),
    "is": ("IS", r"IS"),
    "precision": ("precision", r"Precision"),
    "recall": ("recall", r"Recall"),
    "mini_agreement": ("mini agreement", r"Mini agr."),
    "mini_fid": ("mini FID", r"Mini FID"),
}


# ----------------------------------------------------------------------------------------------------
# bootstrap over prompts
# ----------------------------------------------------------------------------------------------------


def cluster_bootstrap(
    sums: np.ndarray, ratios: dict[str, tuple[int, int]], n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Percentile CIs of ratio-of-sums statistics, resampling rows (prompts) of ``sums`` with replacement.

    ``sums``: ``[P, k]`` per-prompt totals; ``ratios``: ``{name: (numerator column, denominator column)}``.
    The one bootstrap of :func:`adtbench.harness.stats.bootstrap_distribution` (one level: a prompt's samples are
    already pooled into its row), so the resamples are exactly those of :func:`adtbench.harness.stats.bootstrap_ci`.
    """
    if sums.shape[0] == 0:
        return {name: (float("nan"), float("nan")) for name in ratios}
    names = list(ratios)
    num = [ratios[n][0] for n in names]
    den = [ratios[n][1] for n in names]

    def stat(x: np.ndarray) -> np.ndarray:  # [b, P, k] → [b, len(names)]
        tot = x.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return tot[:, num] / tot[:, den]

    boots = bootstrap_distribution(np.asarray(sums, dtype=np.float64), stat, n_boot, seed, vectorized=True)
    bounds = percentile_interval(boots.reshape(n_boot, len(names)), 1.0 - ci)
    return {name: (float(lo), float(hi)) for name, (lo, hi) in zip(names, bounds)}


def _varying(runs: Any, cols: Sequence[str]) -> list[str]:
    return [c for c in cols if c in runs and runs[c].astype(str).nunique(dropna=False) > 1]


def default_by(runs: Any) -> list[str]:
    """Choice columns and override keys that vary across the runs (model and policy always shown)."""
    ov = [c for c in runs.columns if c.startswith("ov.")]
    ov = [c for c in ov if not is_plumbing(c[3:], pooled=True)]
    group_choices = [c for c in ov if "." not in c[3:] and c[3:] in CHOICE_COLUMNS]
    by = ["model", "policy", *_varying(runs, [c for c in CHOICE_COLUMNS if c not in ("model", "policy")])]
    return by + [c for c in _varying(runs, ov) if c not in group_choices]


def aggregate(
    runs: Any,
    samples: Any,
    by: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> Any:
    """One row per group of runs: ``lossless`` (``yes`` / ``no`` by :func:`~adtbench.reporting.load.run_lossless` of its
    runs; ``mixed``, or ``?`` where a run's cannot be told), ``n``, ``runs``, and for τ, d̄, speedup, ``speedup_ref``
    (only when some run has one: against the reference implementation's AR), ``aa_ratio`` (the A/A control,
    :func:`_group_stats`; kept whenever the table has a speedup, NaN where not measured), latency and each metric the
    value with ``<name>_lo`` / ``<name>_hi`` bootstrap bounds (NaN where not defined). The table's
    ``attrs["reference_baseline"]`` lists what the reference baselines ran on. See the module docstring."""
    import pandas as pd

    if len(runs) == 0:
        return pd.DataFrame()
    by = list(by) if by else default_by(runs)
    metric_cols = list(metrics) if metrics is not None else _metric_columns(runs, samples)
    rows = []
    for key, grp in run_groups(runs, by):
        row: dict[str, Any] = dict(zip(by, key))
        row["lossless"] = group_lossless(grp["lossless"].tolist() if "lossless" in grp else [None])
        smp = samples[samples["run_dir"].isin(grp["run_dir"])] if len(samples) else samples
        row |= _group_stats(smp, grp, metric_cols, n_boot, ci, seed)
        rows.append(row)
    table = pd.DataFrame(rows)
    values = ("tau", "d_bar", "speedup", "speedup_ref", "aa_ratio", "latency_s", *metric_cols)
    if "speedup_ref" in table and table["speedup_ref"].isna().all():  # no run timed the reference: no column
        table = table.drop(columns=["speedup_ref", "speedup_ref_lo", "speedup_ref_hi"])
    if "aa_ratio" in table and table["aa_ratio"].isna().all() and table["speedup"].isna().all():  # nothing timed
        table = table.drop(columns=["aa_ratio", "aa_ratio_lo", "aa_ratio_hi"])
    stats = [f"{m}{s}" for m in values for s in ("", "_lo", "_hi")]
    keys = [*by, *(["lossless"] if "lossless" not in by else [])]
    out = table[[*keys, "n", "runs", *(c for c in stats if c in table)]]
    refs = runs["reference_baseline"].dropna().astype(str) if "reference_baseline" in runs else []
    out.attrs["reference_baseline"] = sorted(set(refs))
    return out


def group_lossless(flags: list[Any]) -> str:
    """The ``lossless`` cell of a group of runs: ``yes`` / ``no`` when every run agrees, ``mixed`` when runs of both
    kinds are pooled, ``?`` when some run's cannot be told (:func:`~adtbench.reporting.load.run_lossless`)."""
    vals = [None if f is None or (isinstance(f, float) and np.isnan(f)) else bool(f) for f in flags]
    known = {v for v in vals if v is not None}
    if len(known) > 1:
        return "mixed"
    return LOSSLESS_TEXT[None] if None in vals or not known else LOSSLESS_TEXT[known.pop()]


def run_groups(runs: Any, by: Sequence[str]) -> list[tuple[tuple[Any, ...], Any]]:
    """The groups of :func:`aggregate`, in its row order: ``(key, runs of the group)`` per row, a missing key value
    spelled ``—``. ``adtbench report`` reads a row's run dirs (images, maps, configs) from here."""
    missing = [c for c in by if c not in runs]
    if missing:
        raise KeyError(f"unknown --by column(s) {missing}; available: {sorted(runs.columns)}")
    runs = runs.copy()
    for c in by:
        runs[c] = runs[c].astype(object).where(runs[c].notna(), "—")
    return [
        (key if isinstance(key, tuple) else (key,), grp)
        for key, grp in runs.groupby(list(by), sort=False, dropna=False)
    ]


def _metric_columns(runs: Any, samples: Any) -> list[str]:
    known = [*PER_PROMPT_METRICS, "fid", "is", "precision", "recall", "mini_fid", "mini_precision", "mini_recall"]
    present = [m for m in known if (m in samples and samples[m].notna().any()) or (m in runs and runs[m].notna().any())]
    other = [c for c in samples.columns if c not in present and c not in _SAMPLE_BASE and samples[c].dtype.kind == "f"]
    return present + other


_SAMPLE_BASE = {"run_dir", "config_id", "prompt_id", *SAMPLE_FIELDS}


def _group_stats(smp: Any, grp: Any, metric_cols: list[str], n_boot: int, ci: float, seed: int) -> dict[str, Any]:
    nan = float("nan")
    out: dict[str, Any] = {"n": int(smp["prompt_id"].nunique()) if len(smp) else 0, "runs": len(grp)}
    if len(smp) == 0:
        keys = ("tau", "d_bar", "speedup", "speedup_ref", "aa_ratio", "latency_s")
        return out | {f"{k}{s}": nan for k in keys for s in ("", "_lo", "_hi")}
    paired = smp["baseline_latency_s"].notna() & smp["latency_s"].notna()
    ref = smp["reference_latency_s"] if "reference_latency_s" in smp else smp["latency_s"] * nan
    paired_ref = ref.notna() & smp["latency_s"].notna()
    aa = smp["aa_latency_s"] if "aa_latency_s" in smp else smp["latency_s"] * nan
    paired_aa = aa.notna() & smp["baseline_latency_s"].notna()
    cols = {
        "committed": smp["committed"],
        "cycles": smp["cycles"],
        "dsum": smp["drafted_depth_sum"],
        "base": smp["baseline_latency_s"].where(paired, 0.0),
        "lat_p": smp["latency_s"].where(paired, 0.0),
        "ref": ref.where(paired_ref, 0.0),
        "lat_r": smp["latency_s"].where(paired_ref, 0.0),
        "base_a": smp["baseline_latency_s"].where(paired_aa, 0.0),
        "aa": aa.where(paired_aa, 0.0),
        "lat": smp["latency_s"],
        "one": smp["latency_s"].notna().astype(float),
    }
    ratios = {
        "tau": ("committed", "cycles"),
        "d_bar": ("dsum", "cycles"),
        "speedup": ("base", "lat_p"),
        "speedup_ref": ("ref", "lat_r"),  # Σ reference / Σ method over the prompts with a reference timing
        "aa_ratio": ("base_a", "aa"),  # Σ baseline / Σ A/A side over the prompts timed with timing.aa
        "latency_s": ("lat", "one"),
    }
    per_prompt_metrics = [m for m in metric_cols if m in smp and smp[m].notna().any()]
    for m in per_prompt_metrics:
        ok = smp[m].notna()
        cols[f"{m}:sum"] = smp[m].where(ok, 0.0).astype(float)
        cols[f"{m}:n"] = ok.astype(float)
        ratios[m] = (f"{m}:sum", f"{m}:n")
    import pandas as pd

    frame = pd.DataFrame({k: pd.to_numeric(v, errors="coerce").fillna(0.0) for k, v in cols.items()})
    frame["prompt_id"] = smp["prompt_id"].to_numpy()
    per_prompt = frame.groupby("prompt_id", sort=True).sum()  # cluster = prompt
    names = list(per_prompt.columns)
    sums = per_prompt.to_numpy(dtype=np.float64)
    index = {n: i for i, n in enumerate(names)}
    total = sums.sum(axis=0)
    bounds = cluster_bootstrap(sums, {k: (index[a], index[b]) for k, (a, b) in ratios.items()}, n_boot, ci, seed)
    for name, (a, b) in ratios.items():
        den = total[index[b]]
        out[name] = float(total[index[a]] / den) if den > 0 else nan
        out[f"{name}_lo"], out[f"{name}_hi"] = bounds[name] if den > 0 else (nan, nan)
    for m in metric_cols:  # set-level metrics from the runs' summaries
        if m not in per_prompt_metrics and m in grp:
            vals = pd.to_numeric(grp[m], errors="coerce").dropna()
            out[m] = float(vals.mean()) if len(vals) else nan
            out[f"{m}_lo"] = out[f"{m}_hi"] = nan
    return out


# ----------------------------------------------------------------------------------------------------
# formatting
# ----------------------------------------------------------------------------------------------------


def _value_columns(table: Any) -> list[str]:
    return [c for c in table.columns if f"{c}_lo" in table.columns]


CAVEAT_MARK = ("†", r"$^\dagger$")  # (markdown, LaTeX)


def caveat_note(latex: bool = False) -> str:
    """The footnote explaining the caveat mark."""
    mark = CAVEAT_MARK[1 if latex else 0]
    return (
        f"{mark} CI over fewer than {SPEEDUP_CI_MIN_PROMPTS} prompts: too few to resample, do not trust the interval."
    )


def _fmt(v: Any, lo: Any, hi: Any, digits: int, latex: bool, caveat: bool = False) -> str:
    """``v [lo, hi]`` (LaTeX: the interval in ``\\scriptsize``), the CI followed by the caveat mark when
    ``caveat``; ``—`` (LaTeX ``--``) for a missing value; no interval (and no mark) when lo/hi are missing."""
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "—" if not latex else "--"
    s = f"{v:.{digits}f}"
    if lo is not None and np.isfinite(lo) and np.isfinite(hi):
        ci = f"[{lo:.{digits}f}, {hi:.{digits}f}]"
        s += f" {{\\scriptsize {ci}}}" if latex else f" {ci}"
        if caveat:
            s += CAVEAT_MARK[1 if latex else 0]
    return s


def aa_excludes_one(lo: Any, hi: Any) -> bool:
    """Whether an A/A interval [lo, hi] excludes 1 (False when it is missing: nothing measured, nothing flagged)."""
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return False
    return bool(lo > 1.0 or hi < 1.0)


def _is_numeric(col: Any) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(col)) and not pd.api.types.is_bool_dtype(col)


def cells(table: Any, digits: int = 3, latex: bool = False) -> tuple[Any, int, bool]:
    """The aggregated table as text cells, the one formatting of ``adtbench table`` and ``adtbench report``:
    (DataFrame of strings with the display headers, number of row-key columns, whether a caveat mark was set).

    Row keys first (``ov.`` dropped from override names; ``lossless``: yes / no), then the counts, then per value
    column ``v [lo, hi]`` (:func:`_fmt`) under its label (:data:`LABELS`, ↓ where lower is better; with
    ``speedup_ref`` beside it, ``speedup`` is headed :data:`SPEEDUP_LEAN_LABEL`); CIs of groups with fewer than
    ``SPEEDUP_CI_MIN_PROMPTS`` prompts carry the caveat mark; an A/A cell whose interval excludes 1
    (:func:`aa_excludes_one`) carries :data:`AA_FLAG_MARK`; a group without an A/A timing reads ``—``."""
    import pandas as pd

    vals = _value_columns(table)
    rest = [c for c in table.columns if c not in vals and not c.endswith(("_lo", "_hi"))]
    keys = [c for c in rest if not _is_numeric(table[c])]
    counts = [c for c in rest if c not in keys]
    few = (
        pd.to_numeric(table["n"], errors="coerce").fillna(0).lt(SPEEDUP_CI_MIN_PROMPTS).to_numpy()
        if "n" in table
        else np.zeros(len(table), dtype=bool)
    )
    out = pd.DataFrame(index=range(len(table)))
    for c in keys:
        out[c[3:] if c.startswith("ov.") else c] = table[c].astype(str).to_numpy()
    for c in counts:
        out[c] = ["—" if pd.isna(v) else str(int(v)) if float(v).is_integer() else f"{v:g}" for v in table[c]]
    marked = False
    for c in vals:
        label = LABELS.get(c, (c, c))[1 if latex else 0]
        if c == "speedup" and "speedup_ref" in vals:  # both shown: each header names its baseline
            label = SPEEDUP_LEAN_LABEL[1 if latex else 0]
        arrow = ("↓" if not latex else r"$\downarrow$") if c in LOWER_IS_BETTER else ""
        column = [
            _fmt(v, lo, hi, digits, latex, bool(f))
            for v, lo, hi, f in zip(table[c], table[f"{c}_lo"], table[f"{c}_hi"], few)
        ]
        if c == "aa_ratio":  # an A/A interval that excludes 1: the row's timing favours one side
            flags = [aa_excludes_one(lo, hi) for lo, hi in zip(table[f"{c}_lo"], table[f"{c}_hi"])]
            column = [x + AA_FLAG_MARK[1 if latex else 0] if f else x for x, f in zip(column, flags)]
        marked |= any(CAVEAT_MARK[1 if latex else 0] in x for x in column)
        out[f"{label} {arrow}".strip()] = column
    return out, len(keys), marked


def render(table: Any, fmt: str = "md", digits: int = 3, ci: float = 0.95) -> str:
    """The aggregated table as markdown (``md``), LaTeX booktabs (``latex``) or ``csv`` (raw numbers).

    Row keys first (left-aligned), then the counts and every value column (right-aligned): :func:`cells`; CIs of
    groups with fewer than ``SPEEDUP_CI_MIN_PROMPTS`` prompts carry the caveat mark, explained under the table."""
    if fmt == "csv":
        return table.to_csv(index=False)
    latex = fmt == "latex"
    out, n_left, marked = cells(table, digits, latex)
    if latex:
        styler = out.style.hide(axis="index")
        styler = styler.format(escape="latex", subset=list(out.columns[:n_left]))
        styler = styler.format_index(escape="latex-math", axis=1)
        body = styler.to_latex(hrules=True, column_format="l" * n_left + "r" * (len(out.columns) - n_left))
        note = f"% mean [{100 * ci:.0f}% bootstrap CI over prompts]; needs \\usepackage{{booktabs}}"
        notes = [caveat_note(True)] if marked else []
        notes += [_latex_text(n) for n in table_notes(table)]
        foot = "".join(f"\\par\\smallskip{{\\footnotesize {n}}}\n" for n in notes)
        return f"{note}\n{body}{foot}".rstrip("\n")
    align = ["left"] * n_left + ["right"] * (len(out.columns) - n_left)
    note = (
        f"\n\nValues: point estimate [{100 * ci:.0f}% bootstrap CI over prompts]; set metrics (FID, IS, P&R) have none."
    )
    if marked:
        note += f"\n{caveat_note(False)}"
    note += "".join(f"\n{n}" for n in table_notes(table))
    return out.to_markdown(index=False, colalign=align, disable_numparse=True) + note


_LATEX_TEXT = {"\\": r"\textbackslash{}", "_": r"\_", "&": r"\&", "%": r"\%", "#": r"\#", "$": r"\$",
               "×": r"$\times$", "δ": r"$\delta$", ">": r"$>$", "<": r"$<$"}  # fmt: skip


def _latex_text(text: str) -> str:
    """Plain text (a table note) as LaTeX text: its special characters escaped, × δ > < as math."""
    return "".join(_LATEX_TEXT.get(ch, ch) for ch in text)


def table_notes(table: Any) -> list[str]:
    """The notes under a rendered table: which baseline each speedup is against (when ``speedup_ref`` is shown,
    naming what the reference baselines ran on: the table's ``attrs["reference_baseline"]``), what the A/A column
    and its marks mean (when shown), and that a row with ``lossless`` no is a lossy method."""
    notes = []
    if "speedup_ref" in table:
        ran = "; ".join(table.attrs.get("reference_baseline") or []) or "the model's reference implementation"
        notes.append(
            "speedup vs lean AR: against AR on this repo's lean decode step, the same target (CUDA-graphed under "
            f"engine.compile); speedup vs reference AR: against AR through the reference implementation ({ran}), "
            "the baseline the papers report against."
        )
    if "aa_ratio" in table:
        notes.append(
            "A/A: the AR baseline timed against itself in the speedup's interleaving (timing.aa=true), Σ AR / Σ AR: "
            "1 up to timing noise, so its interval is the speedup's noise floor; — = not measured; "
            "! = its interval excludes 1: the timing favours one side at that level."
        )
    if "lossless" in table and (table["lossless"] != LOSSLESS_TEXT[True]).any():
        notes.append(
            "lossless: yes = greedy token-identical and sampled distribution-identical to AR; no = a lossy method "
            "(e.g. lantern=on with δ > 0, ZipAR, MuLo-SD's pooled rule, GSD): its speedup is not an exact method's."
        )
    return notes


def pivot(
    table: Any,
    value: str = "speedup",
    index: Sequence[str] = ("model", "policy"),
    column: str = "lantern",
    digits: int = 2,
) -> Any:
    """``table[value]`` laid out as ``index`` × ``column`` with "v [lo, hi]" cells (missing cells: —)."""
    import pandas as pd

    cells = table.copy()
    cells["cell"] = [
        "—" if pd.isna(v) else (f"{v:.{digits}f}" + ("" if pd.isna(lo) else f" [{lo:.{digits}f}, {hi:.{digits}f}]"))
        for v, lo, hi in zip(cells[value], cells[f"{value}_lo"], cells[f"{value}_hi"])
    ]
    out = cells.pivot_table(index=list(index), columns=column, values="cell", aggfunc="first").fillna("—")
    out.columns = [f"{column}={c}" for c in out.columns]
    return out.reset_index()


def pivot_latex(pv: Any) -> str:
    """A :func:`pivot` as LaTeX booktabs: text escaped by pandas (``escape="latex"``), value columns right-aligned."""
    n_keys = sum(1 for c in pv.columns if "=" not in str(c))
    styler = pv.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    return styler.to_latex(hrules=True, column_format="l" * n_keys + "r" * (len(pv.columns) - n_keys))


def _one_newline(text: str) -> str:
    """``text`` ending in exactly one newline (every table file and printed table)."""
    return text.rstrip("\n") + "\n"


def write_text(path: str | Path, text: str) -> Path:
    """Write a table file atomically, ending in exactly one newline."""
    atomic_write_text(Path(path), _one_newline(text))
    return Path(path)


def write_tables(table: Any, out_dir: str | Path, stem: str = "main", digits: int = 3, ci: float = 0.95) -> list[Path]:
    """``<stem>.md``, ``<stem>.tex`` (booktabs) and ``<stem>.csv`` of an aggregated table into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        write_text(out / f"{stem}.{ext}", render(table, fmt, digits, ci))
        for fmt, ext in (("md", "md"), ("latex", "tex"), ("csv", "csv"))
    ]


def write_pivot(table: Any, out_dir: str | Path, column: str) -> list[Path]:
    """``speedup_pivot.md`` / ``.tex``: the speedup (with its CI) of ``model`` × ``policy`` by ``column``."""
    pv = pivot(table, "speedup", [c for c in ("model", "policy") if c in table and c != column], column)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        write_text(out / "speedup_pivot.md", pv.to_markdown(index=False)),
        write_text(out / "speedup_pivot.tex", pivot_latex(pv)),
    ]


def write_between_markers(path: Path, marker: str, text: str) -> None:
    """Replace what lies between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` in ``path`` (atomic)."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    content = Path(path).read_text()
    if start not in content or end not in content:
        raise ValueError(f"no {start} … {end} markers")
    head, _, rest = content.partition(start)
    _, _, tail = rest.partition(end)
    atomic_write_text(path, f"{head}{start}\n{_one_newline(text)}{end}{tail}")


def main(args: list[str]) -> int:
    """``adtbench table <dir>``: print (or write) a paper table of a results tree."""
    ap = argparse.ArgumentParser(prog="adtbench table", description="Paper tables from a results tree.")
    ap.add_argument("root", type=Path, nargs="+", help="results dir(s): a run, a multirun, shards, or any tree of them")
    ap.add_argument("--by", default=None, help="comma-separated row keys (default: what varies across runs)")
    ap.add_argument("--metrics", default=None, help="comma-separated metric columns (default: all evaluated)")
    ap.add_argument("--format", choices=("md", "latex", "csv"), default="md")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--ci", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    ap.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write main.md, main.tex and main.csv (and the --pivot files) into DIR",
    )
    ap.add_argument(
        "--pivot",
        default=None,
        metavar="COLUMN",
        help="with --write: the speedup pivot by COLUMN, e.g. lantern (speedup_pivot.md/.tex)",
    )
    ap.add_argument(
        "--into",
        type=Path,
        action="append",
        default=[],
        help="also replace the text between <!-- MARKER:start --> and <!-- MARKER:end --> in this file (repeatable)",
    )
    ap.add_argument("--marker", default="table", help="the marker name of --into (default: table)")
    ns = ap.parse_args(args)
    if not 0 < ns.ci < 1 or ns.n_boot < 1:
        print("adtbench table: need 0 < --ci < 1 and --n-boot >= 1", file=sys.stderr)
        return 2
    runs, samples = load_tree(ns.root)
    if len(runs) == 0:
        print(f"adtbench table: no summary.json under {' '.join(map(str, ns.root))}", file=sys.stderr)
        return 1
    by = ns.by.split(",") if ns.by else None
    metrics = ns.metrics.split(",") if ns.metrics else None
    try:
        table = aggregate(runs, samples, by, metrics, ns.n_boot, ns.ci, ns.seed)
    except KeyError as e:
        print(f"adtbench table: {e.args[0]}", file=sys.stderr)
        return 2
    if ns.pivot is not None and ns.pivot not in table:
        print(
            f"adtbench table: --pivot {ns.pivot} is not a row key; keys: {[c for c in table if '_' not in c]}",
            file=sys.stderr,
        )
        return 2
    text = render(table, ns.format, ns.digits, ns.ci)
    for doc in ns.into:
        try:
            write_between_markers(doc, ns.marker, text)
        except (OSError, ValueError) as e:
            print(f"adtbench table: --into {doc}: {e}", file=sys.stderr)
            return 2
        print(f"adtbench table: {len(table)} row(s) -> {doc} ({ns.marker})")
    if ns.write is not None:
        paths = write_tables(table, ns.write, digits=ns.digits, ci=ns.ci)
        paths += write_pivot(table, ns.write, ns.pivot) if ns.pivot else []
        print(f"adtbench table: {len(table)} row(s) -> {', '.join(str(p) for p in paths)}")
    if ns.out is not None:
        write_text(ns.out, text)
        print(f"adtbench table: {len(table)} row(s) -> {ns.out}")
    else:
        print(_one_newline(text), end="")
    return 0
