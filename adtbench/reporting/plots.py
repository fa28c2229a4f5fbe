"""Figures of a results tree, drawn with matplotlib (Agg canvas, no display, no pyplot state; ``pip install -e
".[plots]"``): speedup per config, speedup vs quality with its Pareto front, τ vs d̄, the runs' acceptance maps
side by side, and one acceptance / depth / width figure per run (in the package: ``adtbench report`` draws them
from an installed wheel too).

    python -m adtbench.reporting.plots <results dir> [--out DIR] [--metric clip_score] [--by model,policy]
        [--n-boot 500]

writes into ``--out`` (default: the results dir) ``speedup.png``, ``tau_vs_dbar.png``,
``speedup_vs_<metric>.png`` (when a quality metric was evaluated), ``acceptance_maps.png`` and
``maps_<job>.png`` per run (when the runs wrote ``maps/run_maps.json``: ``maps.per_run=true``, the default).

Invariants every figure keeps:

- every config choice is on the figure: the choices that vary label the points / bars / panels, the ones shared
  by all runs are the figure's subtitle (model, policy, LANTERN on/off, tree budget, sampling T / CFG / top-k /
  top-p, dataset, and every command-line override that defines the experiment);
- map panels always say policy, LANTERN on/off, budget and sampling, and carry a colour bar with the quantity
  and its unit (montage: one shared bar, so runs compare); grey cells = no cycle covered the position;
- points are identified by a legend outside the axes (no label is drawn over the data), intervals are the
  bootstrap CIs of :func:`adtbench.reporting.tables.aggregate`, and figures are saved with a tight bounding box so no
  label is cut off.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adtbench.harness.maps import MAP_LABELS, colormap, map_norm
from adtbench.harness.rundir import has_summary, is_plumbing, read_run_config, read_run_maps, read_summary
from adtbench.io import atomic_write_with
from adtbench.reporting.load import CHOICE_COLUMNS, load_tree
from adtbench.reporting.tables import LOWER_IS_BETTER, NOT_QUALITY, aggregate

__all__ = [
    "accept_histogram",
    "acceptance_grids",
    "acceptance_montage",
    "accepted_lengths",
    "config_labels",
    "montage_figure",
    "pareto_front",
    "run_maps_figure",
    "speedup_bars",
    "speedup_vs_quality",
    "tau_vs_dbar",
]

AXIS_LABELS = {
    "tau": r"$\tau$: tokens committed per cycle (incl. bonus)",
    "d_bar": r"$\bar{d}$: mean drafted depth per cycle",
    "speedup": "speedup vs AR baseline (×, ratio of total times)",
    "latency_s": "latency per image (s)",
}
LANTERN_SHOWN = ("lantern.enabled", "lantern.k", "lantern.delta", "lantern.lam")  # in the ``lantern`` entry, as used
WRAP = 90  # characters per title line
DPI = 120


# ----------------------------------------------------------------------------------------------------
# config descriptions
# ----------------------------------------------------------------------------------------------------


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)


def config_labels(run_dir: str | Path, row: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The experiment choices of one run as short ``{name: value}`` strings, in display order: ``model``,
    ``policy``, ``lantern`` (``on (δ=…, k=…)`` / ``off``: the values the run decoded with, ``summary.json``'s
    ``lantern_params``, e.g. k clipped to the codebook; the configured ones for older runs), ``budget`` (tree
    budget, when the policy has one),
    ``sampling`` (``T=…, CFG=…`` plus top-k / top-p when active), ``dataset``, then every command-line override
    of the run that defines the experiment (``row``'s ``ov.*`` columns, run plumbing and group choices
    excluded). Read from ``run_config.json`` and ``summary.json`` (missing files: fewer entries)."""
    d = Path(run_dir)
    cfg = read_run_config(d) or {}
    summ: dict[str, Any] = dict(read_summary(d)) if has_summary(d) else {}
    choices = summ.get("choices") or {}
    pol = cfg.get("policy") or summ.get("policy_params") or {}
    lan = {**(cfg.get("lantern") or {}), **(summ.get("lantern_params") or {})}  # the values used win (k clipped)
    smp = cfg.get("sampling") or summ.get("sampling_params") or {}
    out: dict[str, str] = {}
    if summ.get("model") or choices.get("model"):
        out["model"] = str(summ.get("model") or choices.get("model"))
    if pol.get("name") or summ.get("policy"):
        out["policy"] = str(pol.get("name") or summ.get("policy"))
    on = lan.get("enabled", choices.get("lantern") == "on" or summ.get("lantern") is True)
    if on:
        bounds = [
            f"{s}={_num(lan[k])}" for k, s in (("delta", "δ"), ("lam", "λ"), ("k", "k")) if lan.get(k) is not None
        ]
        out["lantern"] = "on" + (f" ({', '.join(bounds)})" if bounds else "")
    else:
        out["lantern"] = "off"
    if pol.get("budget") is not None:
        out["budget"] = str(pol["budget"])
    if smp:
        parts = [f"T={_num(smp.get('temperature'))}", f"CFG={_num(smp.get('cfg_scale'))}"]
        if smp.get("top_k"):
            parts.append(f"top-k={_num(smp['top_k'])}")
        if smp.get("top_p") not in (None, 1, 1.0):
            parts.append(f"top-p={_num(smp['top_p'])}")
        out["sampling"] = ", ".join(parts)
    if summ.get("dataset") or choices.get("dataset"):
        out["dataset"] = str(summ.get("dataset") or choices.get("dataset"))
    for col, value in (row or {}).items():
        key = str(col)[3:] if str(col).startswith("ov.") else None
        if key is None or value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if key in out or is_plumbing(key, pooled=True) or key in LANTERN_SHOWN:
            continue
        if "." not in key and key in CHOICE_COLUMNS:
            continue  # a group choice: already shown by its own entry
        if key == "policy.budget":
            continue
        out[key] = str(value)
    return out


def split_common(configs: Sequence[Mapping[str, str]]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(entries equal in every config, per config the entries that differ somewhere) — an entry missing from
    some config counts as differing."""
    if not configs:
        return {}, []
    keys = list(dict.fromkeys(k for c in configs for k in c))
    common = {k: configs[0][k] for k in keys if all(k in c and c[k] == configs[0][k] for c in configs)}
    return common, [{k: v for k, v in c.items() if k not in common} for c in configs]


def fmt_config(items: Mapping[str, str], sep: str = ", ") -> str:
    """``lantern=on (δ=0.1)``-style text; LANTERN is always spelled out."""
    return sep.join(f"LANTERN {v}" if k == "lantern" else f"{k}={v}" for k, v in items.items())


def _wrap(text: str, width: int = WRAP) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) if text else ""


def _run_configs(runs: Any) -> list[dict[str, str]]:
    return [config_labels(r["run_dir"], r.to_dict()) for _, r in runs.iterrows()] if runs is not None else []


# ----------------------------------------------------------------------------------------------------
# matplotlib plumbing (object-oriented, Agg canvas: safe headless and inside a notebook kernel)
# ----------------------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix.lstrip(".") or "png"
    atomic_write_with(
        path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI, bbox_inches="tight", pad_inches=0.15, facecolor="white")
    )
    return path


# ----------------------------------------------------------------------------------------------------
# scatter / bars of an aggregated table
# ----------------------------------------------------------------------------------------------------


def pareto_front(
    xs: Sequence[float], ys: Sequence[float], maximize_x: bool = True, maximize_y: bool = True
) -> list[int]:
    """Indices of the non-dominated points (no other point is at least as good in both and better in one),
    sorted by x. NaN points are never on the front."""
    sx, sy = (1 if maximize_x else -1), (1 if maximize_y else -1)
    pts = [(sx * x, sy * y, i) for i, (x, y) in enumerate(zip(xs, ys)) if np.isfinite(x) and np.isfinite(y)]
    front = []
    for x, y, i in pts:
        dominated = any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for x2, y2, j in pts if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: xs[i])


def _key_columns(table: Any) -> list[str]:
    """The row-key (non-numeric) columns of an aggregated table: its ``by`` keys (``lossless`` is a property of a row,
    not a key: ``tables.aggregate``)."""
    import pandas as pd

    return [c for c in table.columns if c != "lossless" and not pd.api.types.is_numeric_dtype(table[c])]


def _group_configs(table: Any, runs: Any, by: Sequence[str]) -> list[dict[str, str]]:
    """Per table row, the :func:`config_labels` entries shared by all runs of its group (runs matched on the
    ``by`` values), plus the row keys themselves."""
    keys = {c: runs[c].astype(object).where(runs[c].notna(), "—").astype(str) for c in by if c in runs}
    configs = _run_configs(runs)
    out = []
    for _, row in table.iterrows():
        mask = np.ones(len(runs), dtype=bool)
        for c, col in keys.items():
            mask &= (col == str(row[c])).to_numpy()
        common, _ = split_common([cfg for cfg, m in zip(configs, mask) if m])
        own = {(c[3:] if c.startswith("ov.") else c): str(row[c]) for c in by}
        if "budget" in common or own.get("policy.budget") == "—":  # shown as `budget` (or the policy has none)
            own.pop("policy.budget", None)
        if "lantern" in common:  # shown with the values used (a configured lantern.k=1000 may have run as 511)
            own = {k: v for k, v in own.items() if k not in LANTERN_SHOWN}
        out.append(common | {k: v for k, v in own.items() if k not in common})
    return out


def _describe_rows(table: Any, by: Sequence[str], runs: Any) -> tuple[list[str], str]:
    """(per table row a label: the config entries that differ between rows; the entries all rows share)."""
    own = [{(c[3:] if c.startswith("ov.") else c): str(r[c]) for c in by} for _, r in table.iterrows()]
    configs = _group_configs(table, runs, by) if runs is not None and len(runs) else own
    common, varying = split_common(configs)
    if not any(varying):  # a single row (or identical rows): name each by its keys
        varying = own
    return [fmt_config(v) for v in varying], fmt_config(common)


def _subtitle(common: str, n: Sequence[int] | None = None) -> str:
    """The shared config, then how many prompts each point / bar pools."""
    text = common
    if n is not None and len(n):
        lo, hi = int(min(n)), int(max(n))
        text += f"{'; ' if text else ''}{lo if lo == hi else f'{lo}–{hi}'} prompts per point"
    return text


def _require_rows(table: Any, *cols: str) -> None:
    """A figure needs rows and its columns: an empty table (no runs under the results dir) or a missing column is
    a ``ValueError`` saying so, not a ``KeyError`` deep in matplotlib."""
    if len(table) == 0:
        raise ValueError("nothing to plot: the table has no rows (no runs under the results dir?)")
    missing = [c for c in cols if c not in table]
    if missing:
        raise ValueError(f"nothing to plot: the table has no column(s) {missing}; it has {list(table.columns)}")


def _errors(table: Any, col: str) -> np.ndarray | None:
    """``[2, n]`` distances below / above the value for ``errorbar`` (0 where the CI is missing)."""
    if f"{col}_lo" not in table:
        return None
    v = table[col].to_numpy(float)
    lo = np.nan_to_num(v - table[f"{col}_lo"].to_numpy(float), nan=0.0)
    hi = np.nan_to_num(table[f"{col}_hi"].to_numpy(float) - v, nan=0.0)
    return np.clip(np.vstack([lo, hi]), 0.0, None)


def scatter_figure(
    table: Any,
    xcol: str,
    ycol: str,
    by: Sequence[str] | None = None,
    runs: Any = None,
    title: str = "",
    front: Sequence[int] | None = None,
) -> Any:
    """One marker per table row at (``xcol``, ``ycol``) with CI error bars, a legend outside the axes naming
    each row's varying keys, the Pareto front as a dashed line, the shared config as subtitle."""
    import matplotlib

    _require_rows(table, xcol, ycol)
    by = list(by or _key_columns(table))
    labels, common = _describe_rows(table, by, runs)
    fig = _figure(9.5, 5.5)
    ax = fig.add_subplot()
    colours = matplotlib.colormaps["tab10"].colors
    markers = "osD^vP*Xh<>"
    xe, ye = _errors(table, xcol), _errors(table, ycol)
    for i, label in enumerate(labels):
        x, y = float(table[xcol].iloc[i]), float(table[ycol].iloc[i])
        if not (np.isfinite(x) and np.isfinite(y)):
            continue
        ax.errorbar(
            x, y, xerr=None if xe is None else xe[:, i : i + 1], yerr=None if ye is None else ye[:, i : i + 1],
            fmt=markers[i % len(markers)], color=colours[i % len(colours)], markersize=8, capsize=4,
            markeredgecolor="black", label=label, zorder=3,
        )  # fmt: skip
    if front and len(front) > 1:
        fx, fy = table[xcol].to_numpy(float)[list(front)], table[ycol].to_numpy(float)[list(front)]
        ax.plot(fx, fy, "--", color="0.4", lw=1.2, label="Pareto front", zorder=2)
    if xcol == "speedup":
        ax.axvline(1.0, color="0.6", lw=1, ls=":", zorder=1)
    ax.set_xlabel(AXIS_LABELS.get(xcol, xcol), fontsize=11)
    ax.set_ylabel(AXIS_LABELS.get(ycol, ycol) + (" (lower is better)" if ycol in LOWER_IS_BETTER else ""), fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.margins(0.12)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=9)
    sub = _subtitle(common, table["n"].tolist() if "n" in table else None)
    fig.suptitle(title + ("\n" + _wrap(sub) if sub else ""), fontsize=11)
    return fig


def tau_vs_dbar(table: Any, path: str | Path, by: Sequence[str] | None = None, runs: Any = None) -> Path:
    """τ (y) vs d̄ (x) per group with bootstrap CI error bars."""
    fig = scatter_figure(
        table, "d_bar", "tau", by, runs, r"Mean accepted length $\tau$ vs mean drafted depth $\bar{d}$"
    )
    return _save(fig, path)


def speedup_vs_quality(
    table: Any, metric: str, path: str | Path, by: Sequence[str] | None = None, runs: Any = None
) -> Path:
    """Speedup (x) vs ``metric`` (y) per group with CIs and the Pareto front (higher speedup and better quality;
    FID-like metrics are minimised)."""
    maximize_y = metric not in LOWER_IS_BETTER
    front = pareto_front(list(table["speedup"]), list(table[metric]), True, maximize_y)
    title = f"Speedup vs {metric} ({'higher' if maximize_y else 'lower'} is better); dashed: Pareto front"
    return _save(scatter_figure(table, "speedup", metric, by, runs, title, front), path)


def speedup_figure(table: Any, by: Sequence[str] | None = None, runs: Any = None) -> Any:
    """Horizontal bars of the speedup per group (CI whiskers, the AR line at 1×), one labelled row each."""
    _require_rows(table, "speedup")
    by = list(by or _key_columns(table))
    labels, common = _describe_rows(table, by, runs)
    v = table["speedup"].to_numpy(float)
    fig = _figure(9.0, 1.6 + 0.5 * len(table))
    ax = fig.add_subplot()
    y = np.arange(len(table))[::-1]
    err = _errors(table, "speedup")
    ax.barh(y, np.nan_to_num(v), xerr=err, color=["tab:green" if s >= 1 else "tab:red" for s in np.nan_to_num(v)],
            alpha=0.8, capsize=4, edgecolor="black")  # fmt: skip
    for yi, s in zip(y, v):
        if np.isfinite(s):
            ax.annotate(f"{s:.2f}×", (0, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=9,
                        color="white", fontweight="bold")  # fmt: skip
    ax.axvline(1.0, color="black", lw=1.2, ls="--")
    ax.set_yticks(y, labels, fontsize=10)
    ax.set_xlabel(AXIS_LABELS["speedup"] + "; dashed: AR = 1×", fontsize=11)
    ax.grid(True, axis="x", alpha=0.3)
    sub = _subtitle(common, table["n"].tolist() if "n" in table else None)
    fig.suptitle("Speedup per configuration (bars: 95% bootstrap CI over prompts)" + ("\n" + _wrap(sub) if sub else ""),
                 fontsize=11)  # fmt: skip
    return fig


def speedup_bars(table: Any, path: str | Path, by: Sequence[str] | None = None, runs: Any = None) -> Path:
    """:func:`speedup_figure` saved as PNG."""
    return _save(speedup_figure(table, by, runs), path)


def accepted_lengths(run_dirs: Sequence[str | Path]) -> np.ndarray:
    """Every cycle's accepted length a + 1 (tokens it committed: τ is their mean) over the runs' ``trace.jsonl``."""
    from adtbench.harness.rundir import read_traces

    return np.array([a + 1 for d in run_dirs for t in read_traces(d) for a in t.get("a", [])], dtype=np.int64)


def accept_histogram_figure(lengths: Mapping[str, np.ndarray]) -> Any:
    """Per setting (legend label → accepted lengths), the share of cycles that committed 1, 2, … tokens: one
    step line each on shared integer bins, so settings overlay; the mean (τ) of each is in its legend entry."""
    items = [(k, v) for k, v in lengths.items() if len(v)]
    if not items:
        raise ValueError("nothing to plot: no cycle in the runs' traces")
    top = int(max(v.max() for _, v in items))
    edges = np.arange(0.5, top + 1.5)
    fig = _figure(9.0, 4.6)
    ax = fig.add_subplot()
    for label, v in items:
        share, _ = np.histogram(v, bins=edges)
        ax.stairs(share / len(v), edges, lw=1.8, label=f"{label} (τ = {v.mean():.2f}, {len(v)} cycles)")
    ax.set_xlabel("accepted length a + 1 (tokens committed by one cycle / forward)", fontsize=11)
    ax.set_ylabel("share of cycles", fontsize=11)
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=9)
    fig.suptitle("Accepted length per cycle (log scale)", fontsize=11)
    return fig


def accept_histogram(lengths: Mapping[str, np.ndarray], path: str | Path) -> Path:
    """:func:`accept_histogram_figure` saved as PNG."""
    return _save(accept_histogram_figure(lengths), path)


# ----------------------------------------------------------------------------------------------------
# maps
# ----------------------------------------------------------------------------------------------------


def acceptance_grids(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """A run's per-position maps (``maps/run_maps.json``: accept, depth, width) as float arrays (NaN where no
    cycle covered a cell); None when the run wrote no maps (``maps.per_run=false``)."""
    doc = read_run_maps(run_dir)
    if doc is None:
        return None
    out: dict[str, np.ndarray] = {}
    for kind in ("accept", "depth", "width"):
        if kind in doc:
            out[kind] = np.array([[np.nan if v is None else float(v) for v in row] for row in doc[kind]])
    return out


def _grids(run_dir: str | Path) -> tuple[dict[str, np.ndarray], int | None] | None:
    g = acceptance_grids(run_dir)
    if g is None:
        return None
    return g, (read_run_maps(run_dir) or {}).get("n_prompts")


def _map_axes(ax: Any, grid: np.ndarray, norm: Any) -> Any:
    h, w = grid.shape
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=colormap(), norm=norm, interpolation="nearest", origin="upper")
    ax.set_xlabel("grid column", fontsize=9)
    ax.set_ylabel("grid row", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_xticks([0, w // 2, w - 1])
    ax.set_yticks([0, h // 2, h - 1])
    return im


def montage_figure(runs: Any, kind: str = "accept", cols: int = 4) -> Any:
    """The per-run mean ``kind`` maps side by side on one colour scale (one shared colour bar). Each panel's
    title: policy, LANTERN on/off, budget, sampling and whatever else differs between the runs; the suptitle:
    what they share. None when no run wrote ``maps/run_maps.json``."""
    items = []
    for _, r in runs.iterrows():
        got = _grids(r["run_dir"])
        if got is not None and kind in got[0]:
            items.append((config_labels(r["run_dir"], r.to_dict()), got[0][kind], got[1]))
    if not items:
        return None
    common, varying = split_common([c for c, _, _ in items])
    always = ("policy", "lantern", "budget", "sampling")
    finite = np.concatenate([g[np.isfinite(g)] for _, g, _ in items])
    norm = map_norm(finite)
    cols = min(cols, len(items))
    rows = math.ceil(len(items) / cols)
    fig = _figure(3.4 * cols + 1.2, 3.7 * rows + 1.0)
    axes = fig.subplots(rows, cols, squeeze=False)
    im = None
    for k, ((cfg, grid, n), var) in enumerate(zip(items, varying)):
        ax = axes[k // cols][k % cols]
        im = _map_axes(ax, grid, norm)
        shown = {key: cfg[key] for key in always if key in cfg} | var
        title = "\n".join(textwrap.wrap(fmt_config(shown), 34, break_on_hyphens=False))
        ax.set_title(title + (f"\n(mean of {n} prompts)" if n else ""), fontsize=9)
    for k in range(len(items), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    bar = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.85, pad=0.02)
    bar.set_label("\n".join(textwrap.wrap(MAP_LABELS.get(kind, kind), 32)), fontsize=10)
    shared = fmt_config({k: v for k, v in common.items() if k not in always})
    head = f"Per-position {MAP_LABELS.get(kind, kind).split(' (')[0]}, mean over each run's prompts (grey: not covered)"
    fig.suptitle(head + ("\n" + _wrap("shared: " + shared) if shared else ""), fontsize=11)
    return fig


def acceptance_montage(runs: Any, path: str | Path, kind: str = "accept") -> Path | None:
    """:func:`montage_figure` saved as PNG; None when no run has maps."""
    fig = montage_figure(runs, kind)
    return None if fig is None else _save(fig, path)


def run_maps_figure(run_dir: str | Path, row: Mapping[str, Any] | None = None) -> Any:
    """One run's mean accept / depth / width maps, each with its own colour bar; the title is the run's full
    config (:func:`config_labels`). None when the run has no ``maps/run_maps.json``."""
    got = _grids(run_dir)
    if got is None:
        return None
    grids, n = got
    kinds = [k for k in ("accept", "depth", "width") if k in grids]
    fig = _figure(4.3 * len(kinds), 4.6)
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds):
        g = grids[kind]
        im = _map_axes(ax, g, map_norm(g[np.isfinite(g)]))
        bar = fig.colorbar(im, ax=ax, shrink=0.8)
        bar.set_label("\n".join(textwrap.wrap(MAP_LABELS[kind], 30)), fontsize=9)
        ax.set_title({"accept": "accepted length", "depth": "drafted depth D", "width": "width K"}[kind], fontsize=10)
    cfg = fmt_config(config_labels(run_dir, row))
    head = f"{Path(run_dir).name}: per-position means over {n} prompt(s); grey = not covered"
    fig.suptitle(head + "\n" + _wrap(cfg, 110), fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------


def write_all(
    root: str | Path,
    out: str | Path | None = None,
    metric: str | None = None,
    by: Sequence[str] | None = None,
    n_boot: int = 500,
) -> list[Path]:
    """Every figure of the tree under ``root`` (module docstring) into ``out`` (default ``root``)."""
    runs, samples = load_tree(root)
    if len(runs) == 0:
        return []
    table = aggregate(runs, samples, by, n_boot=n_boot)
    out = Path(out or root)
    written = [
        speedup_bars(table, out / "speedup.png", by, runs),
        tau_vs_dbar(table, out / "tau_vs_dbar.png", by, runs),
    ]
    metric = metric or next((c for c in table.columns if f"{c}_lo" in table and c not in NOT_QUALITY), None)
    if metric is not None:
        written.append(speedup_vs_quality(table, metric, out / f"speedup_vs_{metric}.png", by, runs))
    m = acceptance_montage(runs, out / "acceptance_maps.png")
    written += [m] if m is not None else []
    for _, r in runs.iterrows():
        fig = run_maps_figure(r["run_dir"], r.to_dict())
        if fig is not None:
            written.append(_save(fig, out / f"maps_{r['job']}.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--metric", default=None, help="quality metric for the Pareto plot (default: first evaluated)")
    ap.add_argument("--by", default=None, help="comma-separated row keys (default: what varies across runs)")
    ap.add_argument("--n-boot", type=int, default=500)
    ns = ap.parse_args(sys.argv[1:] if argv is None else argv)
    written = write_all(ns.root, ns.out, ns.metric, ns.by.split(",") if ns.by else None, ns.n_boot)
    if not written:
        print(f"no runs under {ns.root}", file=sys.stderr)
        return 1
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
