"""Per-position heatmaps over the image grid (PNG): accepted length, drafted depth D and width K.

Input is a trace line of ``trace.jsonl`` (``pos``, ``a``, ``D``, ``K`` per cycle). A cycle rooted at
generation index g commits g..g+a; each committed position gets that cycle's values:

- ``accept``: the cycle's accepted length a + 1 (committed tokens, the τ convention: τ = mean over cycles);
- ``depth``: its drafted depth D;  ``width``: its width K.

The last token of an image is the final bonus and no cycle root; it gets the values of the cycle that
chose it (the last one). Loop policies (ZipAR, MuLo-SD) finalise scattered positions: their trace lists them per
forward (``positions``), and each listed position gets that forward's values (``accept`` = tokens the forward
finalised: ZipAR's parallel rows; MuLo-SD's verify vs one per resample forward).
End-of-line/-image slots are dropped (grid_h × grid_w), cells no cycle covered
stay NaN (drawn grey). Per run, maps are the NaN-mean over prompts.

Pictures: a fixed 5-anchor blue→green→yellow colormap over [min, max] of the map (the range is written
into the PNG's text chunks ``vmin``/``vmax``), nearest-neighbour upscaling to ≥ ``MIN_SIDE`` px. The raw
grids go to a JSON sidecar. Files: ``run_dir/maps/<prompt>_{accept,depth,width}.png`` and
``run_dir/maps/run_{accept,depth,width}.png`` (+ ``run_maps.json``: :data:`adtbench.harness.rundir.RUN_MAPS_FILE`),
each written atomically by :func:`adtbench.harness.rundir.write_maps`; ``<prompt>`` is
:func:`adtbench.harness.rundir.safe_stem` of the prompt id.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from adtbench.harness.rundir import safe_stem, write_maps
from adtbench.layout import TokenLayout

__all__ = [
    "colorize",
    "position_grids",
    "render_map",
    "run_grids",
    "safe_stem",
    "write_run_maps",
    "write_sample_maps",
]

KINDS = ("accept", "depth", "width")
MIN_SIDE = 256  # nearest upscaling until the longer side has at least this many pixels
NAN_RGB = (128, 128, 128)
# viridis-like anchors (low → high)
ANCHORS = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]],
    dtype=np.float64,
)


def position_grids(trace: dict[str, Any], layout: TokenLayout) -> dict[str, np.ndarray]:
    """``{kind: float [grid_h, grid_w]}`` from one trace line (module docstring); NaN where uncovered."""
    grids = {kind: np.full((layout.grid_h, layout.grid_w), np.nan) for kind in KINDS}
    pos, acc = trace.get("pos", []), trace.get("a", [])
    depth, width = trace.get("D", []), trace.get("K", [])
    scattered = trace.get("positions")  # loop policies: the indices each forward finalised
    n = layout.num_gen_tokens
    for i, (g, a) in enumerate(zip(pos, acc)):
        last = g + a + 1 if i == len(pos) - 1 else g + a  # the final bonus belongs to the last cycle
        values = {"accept": a + 1, "depth": depth[i], "width": width[i]}
        for j in scattered[i] if scattered is not None else range(g, min(last, n - 1) + 1):
            cell = layout.grid_position(j)
            if cell is not None:
                for kind in KINDS:
                    grids[kind][cell] = values[kind]
    return grids


def colorize(grid: np.ndarray, vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
    """Float ``[h, w]`` → uint8 RGB ``[h, w, 3]``: linear map of [vmin, vmax] onto ``ANCHORS``; NaN grey."""
    finite = np.isfinite(grid)
    if vmin is None:
        vmin = float(grid[finite].min()) if finite.any() else 0.0
    if vmax is None:
        vmax = float(grid[finite].max()) if finite.any() else 1.0
    t = np.zeros_like(grid) if vmax <= vmin else (np.where(finite, grid, vmin) - vmin) / (vmax - vmin)
    x = np.clip(t, 0.0, 1.0) * (len(ANCHORS) - 1)
    i = np.minimum(np.floor(x).astype(int), len(ANCHORS) - 2)
    f = (x - i)[..., None]
    rgb = ANCHORS[i] * (1 - f) + ANCHORS[i + 1] * f
    rgb[~finite] = NAN_RGB
    return np.rint(rgb).astype(np.uint8)


def render_map(grid: np.ndarray) -> tuple[Image.Image, dict[str, str]]:
    """``grid`` as an upscaled heatmap image (nearest) and the PNG text chunks with its value range."""
    finite = grid[np.isfinite(grid)]
    rgb = colorize(grid)
    h, w = grid.shape
    scale = max(1, math.ceil(MIN_SIDE / max(h, w)))
    img = Image.fromarray(rgb).resize((w * scale, h * scale), Image.NEAREST)
    text = {
        "vmin": f"{finite.min():.6g}" if finite.size else "nan",
        "vmax": f"{finite.max():.6g}" if finite.size else "nan",
        "grid": f"{h}x{w}",
    }
    return img, text


def _write(run_dir: str | Path, stem: str, grids: dict[str, np.ndarray], extra: dict[str, Any]) -> list[Path]:
    side = {kind: [[None if not np.isfinite(v) else float(v) for v in row] for row in grids[kind]] for kind in KINDS}
    return write_maps(run_dir, stem, {kind: render_map(grids[kind]) for kind in KINDS}, {**extra, **side})


def write_sample_maps(run_dir: str | Path, trace: dict[str, Any], layout: TokenLayout) -> list[Path]:
    """``maps/<prompt>_{accept,depth,width}.png`` (+ ``_maps.json``) for one prompt's trace."""
    pid = str(trace.get("prompt_id", "sample"))
    return _write(run_dir, safe_stem(pid), position_grids(trace, layout), {"prompt_id": pid})


def run_grids(traces: Sequence[dict[str, Any]], layout: TokenLayout) -> dict[str, np.ndarray]:
    """NaN-mean over prompts of ``position_grids`` (NaN where no prompt covered a cell)."""
    per = [position_grids(t, layout) for t in traces]
    out = {}
    for kind in KINDS:
        stack = np.stack([g[kind] for g in per]) if per else np.full((1, layout.grid_h, layout.grid_w), np.nan)
        count = np.isfinite(stack).sum(0)
        total = np.where(np.isfinite(stack), stack, 0.0).sum(0)
        out[kind] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return out


def write_run_maps(run_dir: str | Path, traces: Sequence[dict[str, Any]], layout: TokenLayout) -> list[Path]:
    """``maps/run_{accept,depth,width}.png`` (+ ``run_maps.json``): per-position means over the run's prompts."""
    return _write(run_dir, "run", run_grids(traces, layout), {"n_prompts": len(traces)})
