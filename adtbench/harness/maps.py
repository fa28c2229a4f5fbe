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

Pictures (:func:`render_map`): with matplotlib installed (the ``plots`` extra) each map is a small figure — the
grid drawn cell by cell (nearest, viridis over [min, max] of the map; a constant map sits mid-scale), uncovered
cells grey, and a colour bar labelled with the quantity (:data:`MAP_LABELS`); a title says whose map it is. Without
matplotlib the fallback is drawn with PIL alone: the same cells on a 5-anchor viridis-like ramp (:data:`ANCHORS`),
nearest-upscaled to ≥ ``MIN_SIDE`` px, with a colour bar strip beside it labelled with its max and min; the first
fallback of a process logs one warning naming the extra. Either way the PNG's text chunks hold ``vmin`` / ``vmax`` /
``grid`` / ``quantity`` / ``renderer`` (``matplotlib`` or ``pil``), and the raw grids go to a JSON sidecar (with the
token layout, ``layout``: ``grid_h``, ``grid_w``, ``row_len``, ``eoi``, so a reader can map another trace onto the
grid). The same PNGs are what W&B logs (:mod:`adtbench.harness.tracking`). Files:
``run_dir/maps/<prompt>_{accept,depth,width}.png`` and
``run_dir/maps/run_{accept,depth,width}.png`` (+ ``run_maps.json``: :data:`adtbench.harness.rundir.RUN_MAPS_FILE`),
each written atomically by :func:`adtbench.harness.rundir_write.write_maps`; ``<prompt>`` is
:func:`adtbench.harness.rundir.safe_stem` of the prompt id.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from PIL import Image, ImageDraw

from adtbench.harness.rundir import safe_stem
from adtbench.harness.rundir_write import write_maps

if TYPE_CHECKING:  # the layout module imports torch; a reader of maps (adtbench report) needs none
    from adtbench.layout import TokenLayout

__all__ = [
    "MAP_LABELS",
    "GridLayout",
    "colorize",
    "colormap",
    "layout_doc",
    "map_norm",
    "position_grids",
    "render_map",
    "renderer",
    "run_grids",
    "safe_stem",
    "write_run_maps",
    "write_sample_maps",
]

log = logging.getLogger("adtbench")

KINDS = ("accept", "depth", "width")
#: the colour-bar label of each map: the quantity and its unit
MAP_LABELS = {
    "accept": "accepted length a + 1 (tokens committed by the cycle)",
    "depth": "drafted depth D (drafter levels)",
    "width": "tree width K (top-k per level)",
}
MIN_SIDE = 256  # nearest upscaling until the longer side has at least this many pixels
NAN_RGB = (128, 128, 128)
# viridis-like anchors (low → high)
ANCHORS = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]],
    dtype=np.float64,
)
FIG_DPI = 100
_warned: list[bool] = []


def renderer() -> str:
    """``matplotlib`` when it imports (the ``plots`` extra), else ``pil`` (the built-in fallback)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "pil"
    return "matplotlib"


def colormap() -> Any:
    """viridis with uncovered (NaN / masked) cells grey: the colour map of every map figure (here and analysis/)."""
    import matplotlib

    return matplotlib.colormaps["viridis"].with_extremes(bad="0.75")


def map_norm(finite: np.ndarray) -> Any:
    """Colour range [min, max] of the finite values; a constant map is centred in [v − ½, v + ½] (mid-colour)."""
    from matplotlib.colors import Normalize

    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    return Normalize(lo, hi) if hi > lo else Normalize(lo - 0.5, lo + 0.5)


class Grid(Protocol):
    """What :func:`position_grids` reads of a layout: :class:`~adtbench.layout.TokenLayout` or :class:`GridLayout`."""

    @property
    def grid_h(self) -> int: ...
    @property
    def grid_w(self) -> int: ...
    @property
    def num_gen_tokens(self) -> int: ...
    def grid_position(self, gen_idx: int) -> tuple[int, int] | None: ...


@dataclass(frozen=True)
class GridLayout:
    """The grid of a :class:`~adtbench.layout.TokenLayout` without its vocabulary (and without torch): a reader's
    view, rebuilt from a maps sidecar's ``layout`` (:func:`layout_doc`). Same invariants: ``row_len`` ∈ {grid_w,
    grid_w + 1} (an end-of-line slot), ``num_gen_tokens = grid_h · row_len + eoi``; ``tests/test_maps.py`` checks
    that :meth:`grid_position` agrees with ``TokenLayout.grid_position`` on every index."""

    grid_h: int
    grid_w: int
    row_len: int
    eoi: bool = False

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> GridLayout:
        """From :func:`layout_doc`'s dict."""
        return cls(int(doc["grid_h"]), int(doc["grid_w"]), int(doc["row_len"]), bool(doc.get("eoi", False)))

    @property
    def num_gen_tokens(self) -> int:
        return self.grid_h * self.row_len + int(self.eoi)

    def grid_position(self, gen_idx: int) -> tuple[int, int] | None:
        """(row, col) of a generation index; None for end-of-line / end-of-image slots."""
        if gen_idx >= self.grid_h * self.row_len:
            return None
        row, col = divmod(gen_idx, self.row_len)
        return (row, col) if col < self.grid_w else None


def layout_doc(layout: Grid | TokenLayout) -> dict[str, Any]:
    """What a reader needs to place a trace's generation indices on the grid (``TokenLayout.grid_position``)."""
    return {
        "grid_h": layout.grid_h,
        "grid_w": layout.grid_w,
        "row_len": getattr(layout, "row_len", layout.grid_w),
        "eoi": layout.eoi if isinstance(layout, GridLayout) else getattr(layout, "eoi_token", None) is not None,
    }


def position_grids(trace: dict[str, Any], layout: Grid) -> dict[str, np.ndarray]:
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


def render_map(
    grid: np.ndarray,
    kind: str = "accept",
    title: str = "",
    how: str | None = None,
    vrange: tuple[float, float] | None = None,
) -> tuple[Image.Image, dict[str, str]]:
    """``grid`` as a heat-map picture with its colour bar (module docstring) and the PNG text chunks.

    ``how``: ``matplotlib`` / ``pil`` (default: :func:`renderer`). ``kind`` names the quantity on the colour bar.
    ``vrange``: the colour scale's (min, max) — several maps on one scale (``adtbench report``: one prompt's maps
    across settings); default the grid's own finite range."""
    if how is None and (how := renderer()) == "pil" and not _warned:
        _warned.append(True)
        log.warning("maps: matplotlib is not installed (pip install -e '.[plots]'); drawing maps with PIL")
    if how not in ("matplotlib", "pil"):
        raise ValueError(f"map renderer must be 'matplotlib' or 'pil', got {how!r}")
    finite = grid[np.isfinite(grid)]
    if vrange is not None:
        finite = np.array(vrange, dtype=np.float64)
    h, w = grid.shape
    img = _render_matplotlib(grid, kind, title, finite) if how == "matplotlib" else _render_pil(grid, finite)
    text = {
        "vmin": f"{finite.min():.6g}" if finite.size else "nan",
        "vmax": f"{finite.max():.6g}" if finite.size else "nan",
        "grid": f"{h}x{w}",
        "quantity": MAP_LABELS.get(kind, kind),
        "renderer": how,
    }
    return img, text


def _render_matplotlib(grid: np.ndarray, kind: str, title: str, finite: np.ndarray) -> Image.Image:
    """A fixed-layout Agg figure (no pyplot state, no layout engine: ≈ 0.1 s): map left, colour bar right."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.9, 3.0), dpi=FIG_DPI, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0.03, 0.03, 0.62, 0.80))
    cax = fig.add_axes((0.69, 0.06, 0.045, 0.74))
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=colormap(), norm=map_norm(finite), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    bar = fig.colorbar(im, cax=cax)
    bar.ax.tick_params(labelsize=7)
    bar.set_label("\n".join(_wrap(MAP_LABELS.get(kind, kind), 26)), fontsize=7)
    h, w = grid.shape
    ax.set_title("\n".join(_wrap(title or f"{kind} ({h}×{w}; grey: not covered)", 34)), fontsize=8)
    canvas.draw()
    return Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy())


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def _render_pil(grid: np.ndarray, finite: np.ndarray) -> Image.Image:
    """The fallback: the cells (:func:`colorize`, nearest-upscaled) and a colour bar strip labelled max / min."""
    h, w = grid.shape
    scale = max(1, math.ceil(MIN_SIDE / max(h, w)))
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (None, None)
    heat = Image.fromarray(colorize(grid, lo, hi)).resize((w * scale, h * scale), Image.Resampling.NEAREST)
    ramp = colorize(np.linspace(1.0, 0.0, heat.height)[:, None].repeat(16, axis=1), 0.0, 1.0)
    canvas = Image.new("RGB", (heat.width + 16 + 12 + 64, heat.height), "white")
    canvas.paste(heat, (0, 0))
    canvas.paste(Image.fromarray(ramp), (heat.width + 12, 0))
    draw = ImageDraw.Draw(canvas)
    x = heat.width + 12 + 16 + 4
    draw.text((x, 0), "n/a" if hi is None else f"{hi:.3g}", fill="black")
    draw.text((x, heat.height - 12), "n/a" if lo is None else f"{lo:.3g}", fill="black")
    return canvas


def _write(
    run_dir: str | Path, stem: str, grids: dict[str, np.ndarray], extra: dict[str, Any], title: str
) -> list[Path]:
    side = {kind: [[None if not np.isfinite(v) else float(v) for v in row] for row in grids[kind]] for kind in KINDS}
    pngs = {kind: render_map(grids[kind], kind, f"{title}: {kind}") for kind in KINDS}
    return write_maps(run_dir, stem, pngs, {**extra, **side})


def write_sample_maps(run_dir: str | Path, trace: dict[str, Any], layout: TokenLayout) -> list[Path]:
    """``maps/<prompt>_{accept,depth,width}.png`` (+ ``_maps.json``) for one prompt's trace."""
    pid = str(trace.get("prompt_id", "sample"))
    extra = {"prompt_id": pid, "layout": layout_doc(layout)}
    return _write(run_dir, safe_stem(pid), position_grids(trace, layout), extra, pid)


def run_grids(traces: Sequence[dict[str, Any]], layout: Grid) -> dict[str, np.ndarray]:
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
    extra = {"n_prompts": len(traces), "layout": layout_doc(layout)}
    return _write(run_dir, "run", run_grids(traces, layout), extra, f"mean of {len(traces)} prompt(s)")
