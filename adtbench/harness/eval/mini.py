"""The mini evaluator: the CPU default for real quality numbers on a machine with no external weights.

Contract with ``adtbench.models.mini.evaluator`` (loaded through ``eval.mini.loader`` = ``"module:function"``,
called as ``function(path)`` when ``eval.mini.path`` is set, else ``function()`` — the module's shipped weights,
``DEFAULT_PATH``) — the returned object has

- ``score(images, prompts) -> [N]``: caption agreement ∈ [0, 1] of image i with prompt i (the fraction of the
  attributes the caption states that the evaluator recognises); ``None`` for a prompt outside its grammar;
- ``features(images) -> [N, d]``: an image embedding (for FID / precision-recall in its feature space);
- optionally ``attribute_hits(images, prompts) -> [N]``: per image ``{attribute: recognised?}`` for the attributes
  its prompt states (None off-grammar); then the evaluator runs once per batch, an image's agreement is the mean of
  its hits (what the shipped evaluator's ``score`` computes), and ``mini_agreement.by_attribute`` records, per
  attribute, the share of the images stating it in which it was recognised (``value``) and their count (``n``);

where ``images`` is a uint8 tensor ``[N, H, W, 3]`` (the run's images at their native size, or resized to
``eval.mini.image_size``; the evaluator resizes to its own input size). Recorded: ``mini_agreement`` (mean
over the images whose prompt it can score; ``n_scored`` of ``n``; per prompt in ``eval_samples.jsonl``) and,
when ``eval.reference.dir`` is set, ``mini_fid`` / ``mini_precision`` / ``mini_recall`` on its features.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import batches, node_get, open_rgb, package_version
from adtbench.harness.eval.context import EvalContext, MetricOutput
from adtbench.harness.eval.mini_loader import DEFAULT_LOADER, MISSING, load, validate  # noqa: F401 (public here)


def _images(chunk: list[Any], size: int | None) -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` of a batch of samples."""
    ims = [open_rgb(s.image_path) for s in chunk]
    if size is not None:
        ims = [im.resize((size, size), Image.Resampling.BOX) if im.size != (size, size) else im for im in ims]
    elif len({im.size for im in ims}) > 1:
        raise ConfigError("eval.mini.image_size", "the run's images differ in size; set eval.mini.image_size")
    return torch.from_numpy(np.stack([np.asarray(im, dtype=np.uint8) for im in ims]))


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Caption agreement of every (image, prompt) pair; mini-feature FID / P&R when a reference set is given."""
    ev, ident = load(ecfg, ctx)
    size = node_get(ecfg, "mini.image_size")
    size = None if size is None else int(size)
    per: dict[str, float | None] = {}
    hits: dict[str, list[bool]] = {}
    with torch.no_grad():
        for chunk in batches(ctx.samples, ctx.batch_size):
            images, prompts = _images(list(chunk), size), [s.prompt for s in chunk]
            if hasattr(ev, "attribute_hits"):  # one evaluator pass gives both the hits and the agreement
                chunk_hits = ev.attribute_hits(images, prompts)
                for h in chunk_hits:
                    for k, ok in (h or {}).items():
                        hits.setdefault(k, []).append(bool(ok))
                scores = [sum(map(bool, h.values())) / len(h) if h else None for h in chunk_hits]
            else:
                scores = ev.score(images, prompts)
                scores = scores.detach().cpu().tolist() if isinstance(scores, torch.Tensor) else list(scores)
            if len(scores) != len(chunk):
                raise ValueError(f"mini evaluator score() returned {len(scores)} values for {len(chunk)} images")
            per.update({s.prompt_id: None if v is None else float(v) for s, v in zip(chunk, scores)})
    vals = np.asarray([v for v in per.values() if v is not None], dtype=np.float64)
    if not np.isfinite(vals).all():
        raise ValueError("mini evaluator score() returned non-finite values")
    weights = ctx.memo.get(("mini", "weights"))
    info = {
        "impl": "adtbench mini evaluator",
        "version": package_version("adtbench"),
        "weights": None if weights is None else {"path": str(weights), "sha256": ident},
        "ident": ident,
    }
    block = {
        "value": float(vals.mean()) if vals.size else None,
        "std": float(vals.std(ddof=1)) if vals.size > 1 else None,
        "n": len(per),
        "n_scored": int(vals.size),
        **info,
        "scale": "caption agreement in [0, 1]: fraction of the stated attributes recognised (higher is better)",
        "higher_is_better": True,
    }
    if hits:
        block["by_attribute"] = {k: {"value": float(np.mean(v)), "n": len(v)} for k, v in hits.items()}
    if not vals.size:
        block["note"] = "no prompt of the run is in the mini evaluator's caption grammar"
    scored = {k: v for k, v in per.items() if v is not None}
    out = MetricOutput({"mini_agreement": block}, {"mini_agreement": scored})
    if node_get(ecfg, "reference.dir") is not None and bool(node_get(ecfg, "mini.set_metrics", True)):
        out = _set_metrics(ecfg, ctx, out)
    return out


def _set_metrics(ecfg: Any, ctx: EvalContext, out: MetricOutput) -> MetricOutput:
    """FID and improved P&R in the mini evaluator's feature space against ``eval.reference``."""
    import adtbench.harness.eval.features as feat
    from adtbench.harness.eval.fid import FID_IMPL, frechet_distance, rank_note
    from adtbench.harness.eval.prc import precision_recall

    ext = feat.build(ecfg, "mini", ctx, "eval.mini")
    gen = feat.generated(ext, ecfg, ctx)["features"]
    ref, desc = feat.reference(ext, ecfg, ctx)
    base = {"n": len(gen), "reference": desc, "features": "mini evaluator features()"}
    out.entries["mini_fid"] = base | {
        "value": frechet_distance(ref["features"], gen),
        "impl": f"{FID_IMPL} on mini evaluator features",
        "scale": "FID in mini-feature space (lower is better; not comparable to Inception FID)",
        "higher_is_better": False,
    }
    note = rank_note(len(gen), len(ref["features"]), gen.shape[1], "mini_fid")
    if note is not None:
        out.entries["mini_fid"]["note"] = note
    k = int(node_get(ecfg, "prc.k", 3))
    if min(len(gen), len(ref["features"])) > k:
        p, r = precision_recall(ref["features"], gen, k)
        for name, v in (("mini_precision", p), ("mini_recall", r)):
            out.entries[name] = base | {"value": v, "k": k, "scale": "fraction in [0, 1]", "higher_is_better": True}
    return out
