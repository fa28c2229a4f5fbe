"""Heatmaps: per-position values from a trace (EOL dropped, final bonus), PNG colours and colour bars (matplotlib and
the PIL fallback), run means, the layout in the sidecar."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from adtbench.harness import maps
from adtbench.harness.maps import (
    ANCHORS,
    MIN_SIDE,
    NAN_RGB,
    colorize,
    position_grids,
    render_map,
    write_run_maps,
    write_sample_maps,
)
from adtbench.layout import TokenLayout

# 2 × 3 grid with an EOL token after every row and an EOI: generation indices 0 1 2 [3] 4 5 6 [7] [8]
LAYOUT = TokenLayout(vocab_size=12, image_token_offset=0, num_codes=10, grid_h=2, grid_w=3, eol_token=10, eoi_token=11)
# cycles: root 0 commits 0..2; root 3 (EOL) commits 3..4; root 5 commits 5..6; root 7 commits 7; final bonus 8
TRACE = {"prompt_id": "p/1", "pos": [0, 3, 5, 7], "a": [2, 1, 1, 0], "D": [5, 6, 4, 1], "K": [10, 8, 12, 10]}


def test_position_grids_assign_the_committing_cycle_and_drop_eol():
    g = position_grids(TRACE, LAYOUT)
    assert g["accept"].tolist() == [[3, 3, 3], [2, 2, 2]]
    assert g["depth"].tolist() == [[5, 5, 5], [6, 4, 4]]
    assert g["width"].tolist() == [[10, 10, 10], [8, 12, 12]]


def test_scattered_positions_of_loop_policies():
    """ZipAR / MuLo-SD forwards finalise scattered indices (trace ``positions``): each gets its forward's values."""
    trace = {
        "pos": [1, 2, 4],
        "a": [0, 2, 3],
        "D": [0, 0, 0],
        "K": [0, 0, 0],
        "positions": [[1], [2, 5, 8], [3, 4, 6, 7]],
    }
    g = position_grids(trace, LAYOUT)  # index 0 came from the prefill: no forward finalised it
    assert np.isnan(g["accept"][0, 0]) and g["accept"][0, 1:].tolist() == [1, 3]
    assert g["accept"][1].tolist() == [4, 3, 4]  # indices 4, 5, 6 (3 and 7 are EOL, 8 the EOI)


def test_uncovered_cells_are_nan_and_grey():
    g = position_grids({"pos": [0], "a": [1], "D": [3], "K": [4]}, LAYOUT)
    assert g["depth"][0].tolist() == [3, 3, 3] and np.isnan(g["depth"][1]).all()  # 0..1 + the final bonus 2
    rgb = colorize(g["depth"])
    assert tuple(rgb[1, 0]) == NAN_RGB


def test_sample_maps_pngs_carry_their_range_and_the_layout(tmp_path):
    paths = write_sample_maps(tmp_path, TRACE, LAYOUT)
    assert [p.name.rsplit("_", 1)[1] for p in paths] == ["accept.png", "depth.png", "width.png"]
    assert all(p.parent == tmp_path / "maps" and p.name.startswith("p_1-") for p in paths)  # unsafe id → hashed
    for p in paths:
        text = Image.open(p).text
        assert text["grid"] == "2x3" and text["renderer"] == maps.renderer()
    width = Image.open(next(p for p in paths if p.name.endswith("_width.png")))
    assert (width.text["vmin"], width.text["vmax"]) == ("8", "12")
    assert width.text["quantity"] == maps.MAP_LABELS["width"]
    side = json.loads(next(tmp_path.glob("maps/*_maps.json")).read_text())
    assert side["prompt_id"] == "p/1" and side["depth"] == [[5, 5, 5], [6, 4, 4]]
    assert side["layout"] == {"grid_h": 2, "grid_w": 3, "row_len": 4, "eoi": True}


def _colours(img: Image.Image) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in px) for px in np.asarray(img.convert("RGB")).reshape(-1, 3)}


def test_matplotlib_map_has_the_cells_colours_and_a_colour_bar():
    """The figure shows the min and max cells in viridis's end colours, grey uncovered cells, and a colour bar: a
    vertical strip whose colour changes down its length (a gradient of many colours)."""
    pytest.importorskip("matplotlib")
    import matplotlib

    grid = np.array([[8.0, 10.0, np.nan], [12.0, 9.0, 11.0]])
    img, text = render_map(grid, "width", "t", how="matplotlib")
    assert text["renderer"] == "matplotlib" and (text["vmin"], text["vmax"]) == ("8", "12")
    colours = _colours(img)
    ends = [255 * np.array(matplotlib.colormaps["viridis"](x)[:3]) for x in (0.0, 1.0)]
    table = np.array(sorted(colours), dtype=float)
    for want in [*ends, np.full(3, 0.75 * 255)]:  # the K = 8 and K = 12 cells, the uncovered cell (grey 0.75)
        assert np.abs(table - want).max(axis=1).min() <= 1.0, want
    arr = np.asarray(img)
    right = arr[:, int(0.69 * arr.shape[1]) + 5]  # a column through the colour bar (axes at x = 0.69 … 0.735)
    assert len({tuple(px) for px in right}) > 50  # a gradient, not a flat band


def test_pil_fallback_has_the_cells_and_a_labelled_bar():
    """Without matplotlib: cell colours on the anchor ramp (min → first anchor, max → last), upscaled to
    ≥ MIN_SIDE, and a colour bar strip running max (top) → min (bottom) beside the map."""
    grid = np.array([[8.0, 10.0, np.nan], [12.0, 9.0, 11.0]])
    img, text = render_map(grid, "width", how="pil")
    assert text["renderer"] == "pil"
    s = MIN_SIDE // 3 + (MIN_SIDE % 3 > 0)  # nearest upscaling by ceil(256 / 3)
    arr = np.asarray(img)
    assert arr.shape[0] == 2 * s and arr.shape[1] > 3 * s
    cells = arr[s // 2 : 2 * s : s, s // 2 : 3 * s : s]
    assert tuple(cells[0, 0]) == tuple(ANCHORS[0].astype(np.uint8))  # 8: the minimum
    assert tuple(cells[1, 0]) == tuple(ANCHORS[-1].astype(np.uint8))  # 12: the maximum
    assert tuple(cells[0, 2]) == NAN_RGB
    bar = arr[:, 3 * s + 12 + 8]
    assert tuple(bar[0]) == tuple(ANCHORS[-1].astype(np.uint8)) and tuple(bar[-1]) == tuple(ANCHORS[0].astype(np.uint8))


def test_unknown_renderer_is_an_error():
    with pytest.raises(ValueError, match="renderer"):
        render_map(np.ones((2, 2)), how="svg")


def test_run_maps_average_over_prompts(tmp_path):
    other = {"prompt_id": "q", "pos": [0, 4], "a": [3, 4], "D": [3, 3], "K": [4, 4]}
    paths = write_run_maps(tmp_path, [TRACE, other], LAYOUT)
    assert sorted(p.name for p in paths) == ["run_accept.png", "run_depth.png", "run_width.png"]
    side = json.loads((tmp_path / "maps" / "run_maps.json").read_text())
    assert side["n_prompts"] == 2 and side["depth"] == [[4.0, 4.0, 4.0], [4.5, 3.5, 3.5]]
    assert Image.open(paths[1]).text["vmin"] == "3.5"


@pytest.mark.parametrize("eol, eoi", [(None, None), (10, None), (10, 11), (None, 11)])
def test_grid_layout_places_every_index_as_the_token_layout(eol, eoi):
    """The torch-free reader's view (rebuilt from the sidecar's ``layout``) agrees with ``TokenLayout`` on every
    generation index, and so gives the same grids for a trace."""
    layout = TokenLayout(vocab_size=12, image_token_offset=0, num_codes=10, grid_h=3, grid_w=4, eol_token=eol,
                         eoi_token=eoi)  # fmt: skip
    grid = maps.GridLayout.from_doc(json.loads(json.dumps(maps.layout_doc(layout))))
    assert grid.num_gen_tokens == layout.num_gen_tokens
    assert [grid.grid_position(g) for g in range(layout.num_gen_tokens + 2)] == [
        layout.grid_position(g) for g in range(layout.num_gen_tokens + 2)
    ]
    trace = {"pos": [0, 5], "a": [4, layout.num_gen_tokens - 7], "D": [1, 2], "K": [3, 4]}
    a, b = position_grids(trace, layout), position_grids(trace, grid)
    assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
