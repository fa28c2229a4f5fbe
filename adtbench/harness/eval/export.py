"""Exports for benchmarks that run in their own environments: GenEval and DPG-Bench.

GenEval (``djghosh13/geneval``, ``evaluation/evaluate_images.py <dir>``) reads ``<dir>/<NNNNN>/metadata.jsonl``
(one JSON object: the prompt's line of ``evaluation_metadata.jsonl``, with ``tag``/``include``/...) and
``<dir>/<NNNNN>/samples/<MMMM>.png``; NNNNN is the prompt's 0-based line in the metadata file. Our images are
matched to metadata lines by prompt text (exact, after stripping), never by position. Several run dirs
(``extra_runs``, e.g. other seeds) give several samples per prompt (GenEval uses 4).

DPG-Bench (``TencentQQGYLab/ELLA``, ``dpg_bench/compute_dpg_bench.py --image-root-path <dir> --resolution R
--pic-num P``) reads ``<dir>/<item_id>.png``: a 2×2 grid of R×R tiles of which the first P are scored
(row-major). ``item_id`` is the prompt file's stem in ``dpg_bench/prompts/`` (matched by text when
``prompts_dir`` is given, else ``meta.item_id`` or the prompt id). Nothing but images goes into the image
dir (the script lists it); the index goes next to it.

Both write through the run directory's one writer (``harness.rundir``: ``write_geneval_prompt``, ``write_dpg_grid``,
``write_export_index``), into ``export/<name>`` of the run dir unless ``eval.<name>.out`` names another folder.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from PIL import Image

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import EvalSample, load_run_samples, node_get, open_rgb, require_dir, require_file
from adtbench.harness.eval.context import EvalContext, MetricOutput
from adtbench.harness.rundir_write import (
    dpg_images_dir,
    export_dir,
    write_dpg_grid,
    write_export_index,
    write_geneval_prompt,
)


def _sample_sets(node: Any, ctx: EvalContext, key: str) -> list[dict[str, EvalSample]]:
    """This run's samples plus those of ``extra_runs``, each as ``{prompt_id: sample}``."""
    sets = [{s.prompt_id: s for s in ctx.samples}]
    for i, extra in enumerate(node_get(node, "extra_runs", []) or []):
        d = require_dir(extra, f"{key}.extra_runs[{i}]", "an adtbench run dir of the same prompts")
        sets.append({s.prompt_id: s for s in load_run_samples(d)})
    return sets


def _out_dir(node: Any, ctx: EvalContext, name: str) -> Path:
    out = node_get(node, "out")
    return Path(str(out)).expanduser() if out is not None else export_dir(ctx.run_dir, name)


def validate_geneval(ecfg: Any) -> None:
    require_file(node_get(ecfg, "geneval.metadata"), "eval.geneval.metadata", "GenEval's evaluation_metadata.jsonl")


def geneval(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Write the GenEval folder layout; returns a summary block (no score: GenEval runs elsewhere)."""
    node = node_get(ecfg, "geneval")
    meta_path = require_file(node_get(node, "metadata"), "eval.geneval.metadata", "GenEval's evaluation_metadata.jsonl")
    lines = [ln for ln in meta_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    by_text: dict[str, list[int]] = defaultdict(list)
    for i, ln in enumerate(lines):
        by_text[str(json.loads(ln).get("prompt", "")).strip()].append(i)
    sets = _sample_sets(node, ctx, "eval.geneval")
    out = _out_dir(node, ctx, "geneval")
    used: dict[str, int] = {}
    unmatched, index = [], []
    for s in ctx.samples:  # one folder per prompt of this run; duplicated texts take successive lines
        cands = by_text.get(s.prompt.strip(), [])
        taken = used.get(s.prompt.strip(), 0)
        if taken >= len(cands):
            unmatched.append(s.prompt_id)
            continue
        used[s.prompt.strip()] = taken + 1
        row = cands[taken]
        images = [Path(samples[s.prompt_id].image_path) for samples in sets if s.prompt_id in samples]
        folder = write_geneval_prompt(out, row, lines[row], images)
        index.append({"folder": folder, "prompt_id": s.prompt_id, "samples": len(images)})
    if unmatched:
        raise ConfigError(
            "eval.geneval.metadata",
            f"{len(unmatched)} prompt(s) of the run are not in {meta_path} (first: {unmatched[:3]}); "
            "decode GenEval's prompts (dataset=text with its generation_prompts.txt)",
        )
    write_export_index(out, index)
    block = {
        "value": None,
        "n": len(index),
        "samples_per_prompt": len(sets),
        "impl": "export only: run GenEval's evaluation/evaluate_images.py in its own environment",
        "path": str(out),
        "metadata": str(meta_path),
        "command": f"python evaluation/evaluate_images.py {out} --outfile {out}/results.jsonl --model-path <models>",
    }
    return MetricOutput({"geneval": block})


def validate_dpg(ecfg: Any) -> None:
    d = node_get(ecfg, "dpg.prompts_dir")
    if d is not None:
        require_dir(d, "eval.dpg.prompts_dir", "DPG-Bench's dpg_bench/prompts folder (<item_id>.txt files)")


def dpg(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Write ``<item_id>.png`` 2×2 grids (first ``len(runs)`` tiles filled) for DPG-Bench."""
    node = node_get(ecfg, "dpg")
    res = int(node_get(node, "resolution", 512))
    item_of: dict[str, list[str]] = defaultdict(list)
    pdir = node_get(node, "prompts_dir")
    if pdir is not None:
        for p in sorted(require_dir(pdir, "eval.dpg.prompts_dir", "dpg_bench/prompts").glob("*.txt")):
            item_of[p.read_text(encoding="utf-8").strip()].append(p.stem)
    sets = _sample_sets(node, ctx, "eval.dpg")
    if len(sets) > 4:
        raise ConfigError("eval.dpg.extra_runs", f"at most 3 extra runs (4 tiles), got {len(sets) - 1}")
    out = _out_dir(node, ctx, "dpg")
    index, unmatched = [], []
    for s in ctx.samples:
        if pdir is not None:
            ids = item_of.get(s.prompt.strip(), [])
            if not ids:
                unmatched.append(s.prompt_id)
                continue
            item = ids[0]
        else:
            item = str(s.meta.get("item_id", s.prompt_id))
        grid = Image.new("RGB", (2 * res, 2 * res))
        tiles = [d[s.prompt_id] for d in sets if s.prompt_id in d]
        for t, smp in enumerate(tiles):
            im = open_rgb(smp.image_path).resize((res, res), Image.Resampling.BICUBIC)
            grid.paste(im, ((t % 2) * res, (t // 2) * res))
        write_dpg_grid(out, item, grid)
        index.append({"item_id": item, "prompt_id": s.prompt_id, "tiles": len(tiles)})
    if unmatched:
        raise ConfigError("eval.dpg.prompts_dir", f"{len(unmatched)} prompt(s) not found (first: {unmatched[:3]})")
    write_export_index(out, index)
    images = dpg_images_dir(out)
    pic = min(r["tiles"] for r in index) if index else 0
    block = {
        "value": None,
        "n": len(index),
        "pic_num": pic,
        "resolution": res,
        "impl": "export only: run DPG-Bench's compute_dpg_bench.py in its own environment",
        "path": str(images),
        "command": f"accelerate launch dpg_bench/compute_dpg_bench.py --image-root-path {images} "
        f"--resolution {res} --pic-num {pic} --vqa-model mplug",
    }
    return MetricOutput({"dpg": block})
