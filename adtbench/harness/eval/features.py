"""Image feature extractors for the set metrics (FID, IS, precision/recall) and the reference-feature cache.

Extractors map a uint8 batch ``[N, 3, R, R]`` (the images after ``eval.preprocess``: centre crop + resize to
``resolution`` with a PIL filter, identical for generated and reference images) to named feature tensors:

- ``inception``: torch-fidelity's ``inception-v3-compat`` (the TF-FID Inception; its own TF1-style bilinear
  resize to 299): ``features`` = 2048-d pool3, ``logits`` = 1008 unbiased logits (for IS).
  Weights: ``eval.weights.inception`` = ``weights-inception-2015-12-05-6726825d.pth``.
- ``vgg16``: torch-fidelity's VGG16 (torchvision weights ``eval.weights.vgg16`` = ``vgg16-397923af.pth``),
  ``features`` = ``fc2_relu`` (or ``fc2``; ``eval.prc.vgg16_layer``) — the improved P&R feature space.
- ``clip``: the ``eval.clip`` open_clip model's L2-normalised image embedding.
- ``mini``: the mini evaluator's ``features(images)`` (CPU default; no external weights).

Reference features are cached in ``eval.cache_dir/reference/`` under a key of the extractor identity (kind,
layer, weights sha256), the reference files (path, size, mtime) and the preprocessing.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import (
    batches,
    center_square,
    file_sha256,
    files_signature,
    node_get,
    open_rgb,
    reference_files,
    require_file,
    to_uint8_tensor,
    weights_record,
)
from adtbench.harness.eval.context import EvalContext
from adtbench.io import atomic_write_with

log = logging.getLogger(__name__)

KINDS = ("inception", "vgg16", "clip", "mini")
WEIGHT_FILES = {
    "inception": "weights-inception-2015-12-05-6726825d.pth (torch-fidelity's TF-ported Inception-v3)",
    "vgg16": "vgg16-397923af.pth (torchvision VGG16 ImageNet weights)",
}


@dataclass
class Extractor:
    """A feature extractor: ``fn(uint8 [N,3,R,R]) -> {name: float [N, d]}``; ``ident`` keys the cache."""

    kind: str
    ident: str
    fn: Callable[[torch.Tensor], dict[str, torch.Tensor]]
    weights: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)


def check_kind(kind: str, key: str) -> str:
    if kind not in KINDS:
        raise ConfigError(key, f"unknown feature extractor {kind!r}; choose from {KINDS}")
    return kind


def validate(ecfg: Any, kind: str, key: str) -> None:
    """Check the weights an extractor needs (nothing loaded)."""
    check_kind(kind, key)
    if kind in WEIGHT_FILES:
        require_file(node_get(ecfg, f"weights.{kind}"), f"eval.weights.{kind}", WEIGHT_FILES[kind])
    elif kind == "clip":
        from adtbench.harness.eval.clip_score import validate as clip_validate

        clip_validate(ecfg)


def build(ecfg: Any, kind: str, ctx: EvalContext, key: str) -> Extractor:
    """The extractor ``kind`` (``ctx.inject["extractor:<kind>"]`` wins), built once per evaluation."""
    check_kind(kind, key)
    layer = str(node_get(ecfg, "prc.vgg16_layer", "fc2_relu")) if kind == "vgg16" else None
    memo_key = ("extractor", kind, layer)
    if memo_key in ctx.memo:
        return ctx.memo[memo_key]
    injected = ctx.inject.get(f"extractor:{kind}")
    if injected is not None:
        ext = injected
    elif kind in ("inception", "vgg16"):
        ext = _torch_fidelity(ecfg, kind, layer, ctx)
    elif kind == "clip":
        ext = _clip(ecfg, ctx)
    else:
        from adtbench.harness.eval.mini_loader import load as load_mini

        ev, ident = load_mini(ecfg, ctx)

        def mini_fn(x: torch.Tensor) -> dict[str, torch.Tensor]:  # its API takes uint8 [N, H, W, 3]
            return {"features": torch.as_tensor(ev.features(x.permute(0, 2, 3, 1).contiguous())).float().cpu()}

        ext = Extractor("mini", f"mini:{ident}", mini_fn, None, {"impl": "adtbench mini evaluator features()"})
    ctx.memo[memo_key] = ext
    return ext


def _torch_fidelity(ecfg: Any, kind: str, layer: str | None, ctx: EvalContext) -> Extractor:
    path = require_file(node_get(ecfg, f"weights.{kind}"), f"eval.weights.{kind}", WEIGHT_FILES[kind])
    sha = file_sha256(path, ctx.cache_dir)
    if kind == "inception":
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048", "logits_unbiased"], str(path))
        names = ["features", "logits"]
        info = {"impl": "torch-fidelity inception-v3-compat", "layer": "pool3 (2048), logits_unbiased"}
    else:
        if layer not in ("fc2", "fc2_relu"):
            raise ConfigError("eval.prc.vgg16_layer", f"must be fc2 or fc2_relu, got {layer!r}")
        from torch_fidelity.feature_extractor_vgg16 import FeatureExtractorVGG16

        net = FeatureExtractorVGG16("vgg16", [layer], str(path))
        names = ["features"]
        info = {"impl": "torch-fidelity vgg16", "layer": layer}
    net = net.to(ctx.device).eval()

    @torch.no_grad()
    def fn(x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: t.float().cpu() for n, t in zip(names, net(x.to(ctx.device)))}

    return Extractor(kind, f"{kind}:{layer or 'pool3+logits'}:{sha}", fn, path, info)


def _clip(ecfg: Any, ctx: EvalContext) -> Extractor:
    from PIL import Image

    from adtbench.harness.eval.clip_score import load_open_clip

    bundle = ctx.inject.get("clip") or load_open_clip(node_get(ecfg, "clip"), "eval.clip", ctx)
    sha = file_sha256(bundle.weights, ctx.cache_dir) if bundle.weights is not None else bundle.model_name

    def fn(x: torch.Tensor) -> dict[str, torch.Tensor]:
        ims = [Image.fromarray(a.permute(1, 2, 0).numpy()) for a in x]
        return {"features": bundle.image_embeddings(ims, ctx.device).cpu()}

    info = {"impl": "open_clip image embedding (L2-normalised)"}
    return Extractor("clip", f"clip:{bundle.model_name}:{sha}", fn, bundle.weights, info)


# ----------------------------------------------------------------------------------------------------
# extraction
# ----------------------------------------------------------------------------------------------------


def preprocess_spec(ecfg: Any) -> tuple[int | None, str]:
    """(resolution or None = native size, PIL filter name) from ``eval.preprocess``."""
    res = node_get(ecfg, "preprocess.resolution")
    return (None if res is None else int(res)), str(node_get(ecfg, "preprocess.resize", "lanczos"))


def extract_files(ext: Extractor, files: Sequence[Path], ecfg: Any, batch_size: int) -> dict[str, torch.Tensor]:
    """Run ``ext`` over image files (preprocessed per ``eval.preprocess``); concatenated outputs."""
    res, resize = preprocess_spec(ecfg)
    out: dict[str, list[torch.Tensor]] = {}
    for chunk in batches(list(files), batch_size):
        ims = [open_rgb(p) for p in chunk]
        if res is not None:
            ims = [center_square(im, res, resize) for im in ims]
        elif len({im.size for im in ims}) > 1:
            raise ConfigError("eval.preprocess.resolution", "images differ in size; set a resolution")
        for name, t in ext.fn(to_uint8_tensor(ims)).items():
            out.setdefault(name, []).append(t.detach().float().cpu())
    return {k: torch.cat(v) for k, v in out.items()}


def generated(ext: Extractor, ecfg: Any, ctx: EvalContext) -> dict[str, torch.Tensor]:
    """Features of the run's images (rows in ``ctx.samples`` order), extracted once per evaluation."""
    key = ("generated", ext.ident)
    if key not in ctx.memo:
        ctx.memo[key] = extract_files(ext, [s.image_path for s in ctx.samples], ecfg, ctx.batch_size)
    return ctx.memo[key]


def reference(ext: Extractor, ecfg: Any, ctx: EvalContext) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Features of the reference set (cached on disk) and a description of the set for the summary."""
    ref = node_get(ecfg, "reference")
    files = reference_files(ref)
    res, resize = preprocess_spec(ecfg)
    h = hashlib.sha256(f"{ext.ident}|{res}|{resize}|{files_signature(files)}".encode()).hexdigest()[:20]
    desc: dict[str, Any] = {
        "dir": str(node_get(ref, "dir")),
        "n": len(files),
        "resolution": res,
        "resize": f"centre crop + {resize}" if res is not None else "native size",
        "key": h,
    }
    memo_key = ("reference", h)
    if memo_key in ctx.memo:
        return ctx.memo[memo_key], desc | {"cached": True}
    path = None if ctx.cache_dir is None else ctx.cache_dir / "reference" / f"{ext.kind}-{h}.pt"
    if path is not None and path.exists():
        feats = torch.load(path, map_location="cpu", weights_only=True)
        desc["cached"] = True
    else:
        log.info("extracting %s features of %d reference images", ext.kind, len(files))
        feats = extract_files(ext, files, ecfg, ctx.batch_size)
        desc["cached"] = False
        if path is not None:
            atomic_write_with(path, lambda tmp: torch.save(feats, tmp))
    if path is not None:
        desc["cache_file"] = str(path)
    ctx.memo[memo_key] = feats
    return feats, desc


def describe(ext: Extractor, ctx: EvalContext) -> dict[str, Any]:
    """Summary record of an extractor: kind, implementation, layer and weights (path + sha256)."""
    return {"kind": ext.kind, **ext.info, "weights": weights_record(ext.weights, ctx.cache_dir)}
