"""Heatmaps: per-position values from a trace (EOL dropped, final bonus), PNG size/colours, run means."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from adtbench.harness.maps import ANCHORS, NAN_RGB, colorize, position_grids, write_run_maps, write_sample_maps
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


def test_sample_maps_pngs_have_the_grid_shape_and_ordered_colours(tmp_path):
    paths = write_sample_maps(tmp_path, TRACE, LAYOUT)
    assert [p.name.rsplit("_", 1)[1] for p in paths] == ["accept.png", "depth.png", "width.png"]
    assert all(p.parent == tmp_path / "maps" and p.name.startswith("p_1-") for p in paths)  # unsafe id → hashed
    for p in paths:
        img = Image.open(p)
        w, h = img.size
        assert (w, h) == (3 * (w // 3), 2 * (h // 2)) and w // 3 == h // 2 and max(w, h) >= 256
        assert img.text["grid"] == "2x3"
    width = np.asarray(Image.open(next(p for p in paths if p.name.endswith("_width.png"))))
    s = width.shape[0] // 2
    cells = width[s // 2 :: s, s // 2 :: s]  # one pixel per grid cell
    assert tuple(cells[1, 0]) == tuple(ANCHORS[0].astype(np.uint8))  # K = 8: the minimum
    assert tuple(cells[1, 1]) == tuple(ANCHORS[-1].astype(np.uint8))  # K = 12: the maximum
    side = json.loads(next(tmp_path.glob("maps/*_maps.json")).read_text())
    assert side["prompt_id"] == "p/1" and side["depth"] == [[5, 5, 5], [6, 4, 4]]


def test_run_maps_average_over_prompts(tmp_path):
    other = {"prompt_id": "q", "pos": [0, 4], "a": [3, 4], "D": [3, 3], "K": [4, 4]}
    paths = write_run_maps(tmp_path, [TRACE, other], LAYOUT)
    assert sorted(p.name for p in paths) == ["run_accept.png", "run_depth.png", "run_width.png"]
    side = json.loads((tmp_path / "maps" / "run_maps.json").read_text())
    assert side["n_prompts"] == 2 and side["depth"] == [[4.0, 4.0, 4.0], [4.5, 3.5, 3.5]]
    assert Image.open(paths[0]).size == (258, 172)  # nearest upscaling by ceil(256 / 3) = 86
