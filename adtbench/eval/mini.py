"""The mini evaluator: the CPU default for real quality numbers on a machine with no external weights.

Contract with ``adtbench.models.mini_evaluator`` (loaded through ``eval.mini.loader`` = ``"module:function"``,
called as ``function(path)`` when ``eval.mini.path`` is set, else ``function()`` — the module's shipped weights,
``DEFAULT_PATH``) — the returned object has

- ``score(images, prompts) -> [N]``: caption agreement ∈ [0, 1] of image i with prompt i (the fraction of the
  attributes the caption states that the evaluator recognises); ``None`` for a prompt outside its grammar;
- ``features(images) -> [N, d]``: an image embedding (for FID / precision-recall in its feature space);

where ``images`` is a uint8 tensor ``[N, H, W, 3]`` (the run's images at their native size, or resized to
``eval.mini.image_size``; the evaluator resizes to its own input size). Recorded: ``mini_agreement`` (mean
over the images whose prompt it can score; ``n_scored`` of ``n``; per prompt in ``eval_samples.jsonl``) and,
when ``eval.reference.dir`` is set, ``mini_fid`` / ``mini_precision`` / ``mini_recall`` on its features.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from adtbench.errors import ConfigError
from adtbench.eval.common import batches, file_sha256, node_get, open_rgb, package_version
from adtbench.eval.context import EvalContext, MetricOutput

DEFAULT_LOADER = "adtbench.models.mini_evaluator:load_mini_evaluator"


def _resolve_loader(spec: str) -> tuple[Any, Any]:
    """(module, loader function) of ``"module:function"``."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError("eval.mini.loader", f"expected 'module:function', got {spec!r}")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and module.startswith(e.name):
            raise ConfigError("eval.mini.loader", f"module {module!r} is not available in this version") from None
        raise
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ConfigError("eval.mini.loader", f"{module} has no callable {attr!r}")
    return mod, fn


def _weights_path(ecfg: Any, mod: Any) -> Path | None:
    """``eval.mini.path``, else the module's ``DEFAULT_PATH`` (its shipped weights), else None."""
    path = node_get(ecfg, "mini.path")
    if path is not None:
        return Path(str(path)).expanduser()
    default = getattr(mod, "DEFAULT_PATH", None)
    return None if default is None else Path(default)


def _hash_path(path: Path, ctx: EvalContext) -> str:
    if path.is_file():
        return file_sha256(path, ctx.cache_dir)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(path)}:{file_sha256(p, ctx.cache_dir)}\n".encode())
    return h.hexdigest()


MISSING = "the mini evaluator weights (model.safetensors + config.json; `adtbench train evaluator` writes them)"


def validate(ecfg: Any) -> None:
    """The loader must import and the weights path (set, or the module's default) must exist; nothing loaded."""
    mod, _ = _resolve_loader(str(node_get(ecfg, "mini.loader", DEFAULT_LOADER)))
    path = _weights_path(ecfg, mod)
    if path is not None and not path.exists():
        raise ConfigError("eval.mini.path", f"no file or folder at {str(path)!r}; expected {MISSING}")


def load(ecfg: Any, ctx: EvalContext) -> tuple[Any, str]:
    """The mini evaluator (``ctx.inject["mini"]`` wins) and an identity string (weights sha256) for caches."""
    if ("mini", "model") in ctx.memo:
        return ctx.memo[("mini", "model")]
    if "mini" in ctx.inject:
        ev = ctx.inject["mini"]
        ident = str(getattr(ev, "ident", type(ev).__name__))
        weights = None
    else:
        mod, fn = _resolve_loader(str(node_get(ecfg, "mini.loader", DEFAULT_LOADER)))
        path = node_get(ecfg, "mini.path")
        try:
            ev = fn(str(Path(str(path)).expanduser())) if path is not None else fn()
        except FileNotFoundError as e:
            raise ConfigError("eval.mini.path", f"{e}; expected {MISSING}") from None
        weights = _weights_path(ecfg, mod)
        ident = _hash_path(weights, ctx) if weights is not None and weights.exists() else type(ev).__name__
    if isinstance(ev, torch.nn.Module):
        ev = ev.to(ctx.device).eval()
    ctx.memo[("mini", "model")] = (ev, ident)
    ctx.memo[("mini", "weights")] = weights
    return ev, ident


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
    with torch.no_grad():
        for chunk in batches(ctx.samples, ctx.batch_size):
            scores = ev.score(_images(list(chunk), size), [s.prompt for s in chunk])
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
    if not vals.size:
        block["note"] = "no prompt of the run is in the mini evaluator's caption grammar"
    scored = {k: v for k, v in per.items() if v is not None}
    out = MetricOutput({"mini_agreement": block}, {"mini_agreement": scored})
    if node_get(ecfg, "reference.dir") is not None and bool(node_get(ecfg, "mini.set_metrics", True)):
        out = _set_metrics(ecfg, ctx, out)
    return out


def _set_metrics(ecfg: Any, ctx: EvalContext, out: MetricOutput) -> MetricOutput:
    """FID and improved P&R in the mini evaluator's feature space against ``eval.reference``."""
    from adtbench.eval import features as feat
    from adtbench.eval.fid import FID_IMPL, frechet_distance, rank_note
    from adtbench.eval.prc import precision_recall

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
