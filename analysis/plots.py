"""Plots of a results tree, drawn with PIL (no matplotlib): speedup vs quality with its Pareto front, τ vs d̄,
and a montage of per-run acceptance maps.

    python -m analysis.plots <results dir> [--out DIR] [--metric clip_score] [--by model,policy]

writes ``speedup_vs_<metric>.png``, ``tau_vs_dbar.png`` and ``acceptance_maps.png`` into ``--out`` (default:
the results dir). Points are groups of :func:`adtbench.tables.aggregate`; whiskers are their bootstrap CIs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from adtbench.maps import colorize
from adtbench.tables import LOWER_IS_BETTER, aggregate, load_tree

__all__ = ["acceptance_montage", "nice_ticks", "pareto_front", "scatter", "speedup_vs_quality", "tau_vs_dbar"]

PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]  # fmt: skip


def _font(size: int) -> Any:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: fixed-size bitmap font
        return ImageFont.load_default()


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


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return []
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + 1e-9 * step:
        if t >= lo - 1e-9 * step:
            ticks.append(round(t, 12))
        t += step
    return ticks


def scatter(
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str],
    path: str | Path,
    xlabel: str,
    ylabel: str,
    title: str = "",
    xerr: Sequence[tuple[float, float]] | None = None,
    yerr: Sequence[tuple[float, float]] | None = None,
    front: Sequence[int] | None = None,
    size: tuple[int, int] = (900, 640),
) -> Path:
    """A labelled scatter plot (PNG) with optional CI whiskers and a Pareto front polyline.

    The bundled PIL font is ASCII-only: keep labels ASCII (``tau``, not ``τ``)."""
    w, h = size
    ml, mr, mt, mb = 90, 30, 50, 70
    img = Image.new("RGB", size, "white")
    dr = ImageDraw.Draw(img)
    f_small, f_big = _font(14), _font(18)
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    lo_hi = [*(v for v in xs if np.isfinite(v))]
    yl = [*(v for v in ys if np.isfinite(v))]
    for errs, acc in ((xerr, lo_hi), (yerr, yl)):
        for lo, hi in errs or []:
            acc += [v for v in (lo, hi) if v is not None and np.isfinite(v)]
    if not lo_hi or not yl:
        lo_hi, yl = [0.0, 1.0], [0.0, 1.0]
    xt, yt = nice_ticks(min(lo_hi), max(lo_hi)), nice_ticks(min(yl), max(yl))
    xt = xt or [min(lo_hi)]
    yt = yt or [min(yl)]
    x0, x1 = min(xt[0], min(lo_hi)), max(xt[-1], max(lo_hi))
    y0, y1 = min(yt[0], min(yl)), max(yt[-1], max(yl))
    padx, pady = 0.06 * ((x1 - x0) or 1.0), 0.06 * ((y1 - y0) or 1.0)  # keep edge points and labels inside
    x0, x1, y0, y1 = x0 - padx, x1 + padx, y0 - pady, y1 + pady

    def px(v: float) -> float:
        return ml + (v - x0) / ((x1 - x0) or 1.0) * (w - ml - mr)

    def py(v: float) -> float:
        return h - mb - (v - y0) / ((y1 - y0) or 1.0) * (h - mt - mb)

    dr.rectangle([ml, mt, w - mr, h - mb], outline="black")
    for t in xt:
        dr.line([px(t), h - mb, px(t), h - mb + 5], fill="black")
        dr.line([px(t), mt, px(t), h - mb], fill=(230, 230, 230))
        dr.text((px(t), h - mb + 8), f"{t:g}", fill="black", font=f_small, anchor="ma")
    for t in yt:
        dr.line([ml - 5, py(t), ml, py(t)], fill="black")
        dr.line([ml, py(t), w - mr, py(t)], fill=(230, 230, 230))
        dr.text((ml - 8, py(t)), f"{t:g}", fill="black", font=f_small, anchor="rm")
    dr.text(((ml + w - mr) / 2, h - 30), xlabel, fill="black", font=f_big, anchor="ma")
    dr.text((10, mt - 30), ylabel, fill="black", font=f_big)
    if title:
        dr.text(((ml + w - mr) / 2, 8), title, fill="black", font=f_big, anchor="ma")
    if front and len(front) > 1:
        dr.line([(px(xs[i]), py(ys[i])) for i in front], fill=(120, 120, 120), width=2)
    for i, (a, b) in enumerate(zip(xs, ys)):
        if not (np.isfinite(a) and np.isfinite(b)):
            continue
        c = PALETTE[i % len(PALETTE)]
        if xerr and all(v is not None and np.isfinite(v) for v in xerr[i]):
            dr.line([px(xerr[i][0]), py(b), px(xerr[i][1]), py(b)], fill=c, width=2)
        if yerr and all(v is not None and np.isfinite(v) for v in yerr[i]):
            dr.line([px(a), py(yerr[i][0]), px(a), py(yerr[i][1])], fill=c, width=2)
        r = 7 if front and i in front else 5
        dr.ellipse([px(a) - r, py(b) - r, px(a) + r, py(b) + r], fill=c, outline="black")
        dr.text((px(a) + 9, py(b) - 9), str(labels[i]), fill=c, font=f_small)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def _key_columns(table: Any) -> list[str]:
    """The row-key (non-numeric) columns of an aggregated table."""
    import pandas as pd

    return [c for c in table.columns if not pd.api.types.is_numeric_dtype(table[c])]


def _labels(table: Any, by: Sequence[str]) -> list[str]:
    return ["/".join(str(r[c]) for c in by) for _, r in table.iterrows()]


def _err(table: Any, col: str) -> list[tuple[float, float]]:
    return list(zip(table[f"{col}_lo"], table[f"{col}_hi"]))


def speedup_vs_quality(table: Any, metric: str, path: str | Path, by: Sequence[str] | None = None) -> Path:
    """Speedup (x) vs ``metric`` (y) per group, CI whiskers, and the Pareto front (higher speedup and better
    quality; FID-like metrics are minimised)."""
    by = by or _key_columns(table)
    maximize_y = metric not in LOWER_IS_BETTER
    front = pareto_front(list(table["speedup"]), list(table[metric]), True, maximize_y)
    return scatter(table["speedup"], table[metric], _labels(table, by), path, "speedup (x) vs AR", metric,
                   f"speedup vs {metric} ({'higher' if maximize_y else 'lower'} is better)",
                   _err(table, "speedup"), _err(table, metric), front)  # fmt: skip


def tau_vs_dbar(table: Any, path: str | Path, by: Sequence[str] | None = None) -> Path:
    """Mean accepted length τ (y) vs mean drafted depth d̄ (x) per group, with CI whiskers."""
    by = by or _key_columns(table)
    labels = _labels(table, by)
    return scatter(table["d_bar"], table["tau"], labels, path, "mean drafted depth d_bar", "tau (incl. bonus)",
                   "tau vs d_bar", _err(table, "d_bar"), _err(table, "tau"))  # fmt: skip


def acceptance_montage(runs: Any, path: str | Path, kind: str = "accept", cell: int = 160) -> Path | None:
    """Per-run acceptance (or depth/width) maps side by side, labelled with model/policy; one shared colour
    range so runs compare. None when no run wrote ``maps/run_maps.json``."""
    from analysis.results import acceptance_grids

    items = []
    for _, r in runs.iterrows():
        g = acceptance_grids(r["run_dir"])
        if g is not None and kind in g:
            items.append((f"{r.get('model')}/{r.get('policy')}", g[kind]))
    if not items:
        return None
    finite = np.concatenate([g[np.isfinite(g)] for _, g in items])
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    cols = min(4, len(items))
    rows = math.ceil(len(items) / cols)
    img = Image.new("RGB", (cols * (cell + 20) + 20, rows * (cell + 40) + 40), "white")
    dr = ImageDraw.Draw(img)
    font = _font(13)
    dr.text(
        (10, 8), f"{kind} per position (range {vmin:.3g} to {vmax:.3g}, grey = not covered)", fill="black", font=font
    )
    for k, (label, grid) in enumerate(items):
        r, c = divmod(k, cols)
        x, y = 20 + c * (cell + 20), 40 + r * (cell + 40)
        tile = Image.fromarray(colorize(grid, vmin, vmax)).resize((cell, cell), Image.Resampling.NEAREST)
        img.paste(tile, (x, y))
        dr.text((x, y + cell + 4), label[:28], fill="black", font=font)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--metric", default=None, help="quality metric for the Pareto plot (default: first evaluated)")
    ap.add_argument("--by", default=None)
    ns = ap.parse_args(sys.argv[1:] if argv is None else argv)
    runs, samples = load_tree(ns.root)
    if len(runs) == 0:
        print(f"no runs under {ns.root}", file=sys.stderr)
        return 1
    by = ns.by.split(",") if ns.by else None
    table = aggregate(runs, samples, by, n_boot=500)
    out = ns.out or ns.root
    written = [tau_vs_dbar(table, out / "tau_vs_dbar.png", by)]
    metric = ns.metric or next((c for c in table.columns if f"{c}_lo" in table and c not in
                                ("tau", "d_bar", "speedup", "latency_s")), None)  # fmt: skip
    if metric is not None:
        written.append(speedup_vs_quality(table, metric, out / f"speedup_vs_{metric}.png", by))
    m = acceptance_montage(runs, out / "acceptance_maps.png")
    written += [m] if m is not None else []
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
