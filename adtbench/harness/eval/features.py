"""Image feature extractors for the set metrics (FID, IS, precision/recall) and the reference-feature cache.

Extractors map a uint8 batch ``[N, 3, R, R]`` (the images after ``eval.preprocess``: centre crop + resize to
``resolution`` with a PIL filter, identical for generated and reference images) to named feature tensors:

- ``inception``: torch-fidelity's ``inception-v3-compat`` (the TF-FID Inception; its own TF1-style bilinear
  resize to 299): ``features`` = 2048-d pool3, ``logits`` = 1008 unbiased logits (for IS).
  Weights: ``eval.weights.inception`` = ``weights-inception-2015-12-05-6726825d.pth``.
- ``vgg16``: torch-fidelity's VGG16 (torchvision weights ``eval.weights.vgg16`` = ``vgg16-397923af.pth``),
  ``features`` = ``fc2_relu`` (or ``fc2``; ``eval.prc.vgg16_layer``) — the improved P&R feature space.
- ``dinov2``: torch-fidelity's DINOv2 extractor (``dinov2-vit-l-14``: its TF1-style bilinear resize to 224, ImageNet
  normalisation, the ViT-L/14 CLS embedding, 1024-d) — the FD-DINOv2 space (Stein et al. 2023). The network is
  built from a local copy of the ``facebookresearch/dinov2`` hub repository (``eval.dinov2.repo``; null = torch hub's
  cache, ``$TORCH_HOME/hub/facebookresearch_dinov2_main``) with ``pretrained=False`` and loaded from
  ``eval.weights.dinov2`` = ``dinov2_vitl14_pretrain.pth``: torch-fidelity itself only downloads.
- ``clip``: the ``eval.clip`` open_clip model's L2-normalised image embedding.
- ``mini``: the mini evaluator's ``features(images)`` (CPU default; no external weights).

The reference set is ``eval.reference.dir``: a folder of images, an adtbench run dir, or an ADM reference batch
(``VIRTUAL_*.npz``: ``arr_0`` = uint8 images ``[N, H, W, 3]``, as ADM's ``evaluations/evaluator.py`` reads it).
Reference features are cached in ``eval.cache_dir/reference/`` under a key of the extractor identity (kind,
layer, weights sha256), the reference files (path, size, mtime) and the preprocessing. Extraction shows a tqdm bar
on stderr unless ``progress=false``.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import (
    batches,
    center_square,
    file_sha256,
    node_get,
    open_rgb,
    reference_source,
    to_uint8_tensor,
    weights_record,
)
from adtbench.harness.eval.context import EvalContext
from adtbench.io import atomic_write_with

log = logging.getLogger(__name__)

KINDS = ("inception", "vgg16", "dinov2", "clip", "mini")
WEIGHT_FILES = {
    "inception": "weights-inception-2015-12-05-6726825d.pth (torch-fidelity's TF-ported Inception-v3)",
    "vgg16": "vgg16-397923af.pth (torchvision VGG16 ImageNet weights)",
    "dinov2": "dinov2_vitl14_pretrain.pth (facebookresearch/dinov2 ViT-L/14)",
}
DINOV2_HUB = "facebookresearch_dinov2_main"
DINOV2_MODEL = ("dinov2-vit-l-14", "dinov2_vitl14")  # torch-fidelity's name, the hub entry point


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


def dinov2_repo(ecfg: Any) -> Path:
    """The local ``facebookresearch/dinov2`` hub repository (``eval.dinov2.repo``, else torch hub's cache)."""
    value = node_get(ecfg, "dinov2.repo")
    return Path(str(value)).expanduser() if value is not None else Path(torch.hub.get_dir()) / DINOV2_HUB


def validate(ecfg: Any, kind: str, key: str) -> None:
    """Check the packages and weights an extractor needs (nothing loaded; ``weights.check_weight_file``)."""
    from adtbench.harness.eval.weights import check_weight_file, require_packages

    check_kind(kind, key)
    if kind in WEIGHT_FILES:
        require_packages("fid", key)
        check_weight_file(
            node_get(ecfg, f"weights.{kind}"), f"eval.weights.{kind}", WEIGHT_FILES[kind],
            table=node_get(ecfg, "sha256"), cache_dir=node_get(ecfg, "cache_dir"),
        )  # fmt: skip
    if kind == "dinov2":
        repo = dinov2_repo(ecfg)
        if not (repo / "hubconf.py").is_file():
            raise ConfigError(
                "eval.dinov2.repo",
                f"no facebookresearch/dinov2 hub repository at {repo} (hubconf.py); nothing is downloaded: copy "
                "a clone of github.com/facebookresearch/dinov2 there, or set eval.dinov2.repo=<its folder>",
            )
    elif kind == "clip":
        from adtbench.harness.eval.clip_score import validate as clip_validate

        require_packages("clip", key)
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
    elif kind == "dinov2":
        ext = _dinov2(ecfg, ctx)
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
    from adtbench.harness.eval.weights import check_weight_file

    path, _ = check_weight_file(node_get(ecfg, f"weights.{kind}"), f"eval.weights.{kind}", WEIGHT_FILES[kind])
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


def dinov2_extractor(model: torch.nn.Module) -> torch.nn.Module:
    """torch-fidelity's ``FeatureExtractorDinoV2`` (its forward: TF1-style bilinear resize to 224, ImageNet
    normalisation, ``model``) around a DINOv2 network built here: its own constructor only downloads."""
    from torch_fidelity.feature_extractor_base import FeatureExtractorBase
    from torch_fidelity.feature_extractor_dinov2 import FeatureExtractorDinoV2

    class LocalDinoV2(FeatureExtractorDinoV2):
        def __init__(self, net: torch.nn.Module) -> None:
            FeatureExtractorBase.__init__(self, DINOV2_MODEL[0], ["dinov2"])
            self.feature_extractor_internal_dtype = torch.float32
            self.model = net
            self.to(torch.float32)
            self.requires_grad_(False)
            self.eval()

    return LocalDinoV2(model)


def _dinov2(ecfg: Any, ctx: EvalContext) -> Extractor:
    from adtbench.harness.eval.weights import check_weight_file

    path, _ = check_weight_file(node_get(ecfg, "weights.dinov2"), "eval.weights.dinov2", WEIGHT_FILES["dinov2"])
    repo = dinov2_repo(ecfg)
    net = torch.hub.load(str(repo), DINOV2_MODEL[1], source="local", pretrained=False)
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    ext = dinov2_extractor(net).to(ctx.device)

    @torch.no_grad()
    def fn(x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"features": ext(x.to(ctx.device))[0].float().cpu()}

    sha = file_sha256(path, ctx.cache_dir)
    info = {"impl": f"torch-fidelity {DINOV2_MODEL[0]} (network from {repo})", "layer": "CLS embedding (1024)"}
    return Extractor("dinov2", f"dinov2:{DINOV2_MODEL[1]}:{sha}", fn, path, info)


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


def _bar(total: int, desc: str, progress: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=not progress, file=sys.stderr, leave=False)


def _prepare(ims: list[Any], res: int | None, resize: str) -> torch.Tensor:
    if res is not None:
        ims = [center_square(im, res, resize) for im in ims]
    elif len({im.size for im in ims}) > 1:
        raise ConfigError("eval.preprocess.resolution", "images differ in size; set a resolution")
    return to_uint8_tensor(ims)


def extract_files(
    ext: Extractor, files: Sequence[Path], ecfg: Any, batch_size: int, progress: bool = False, desc: str = ""
) -> dict[str, torch.Tensor]:
    """Run ``ext`` over image files (preprocessed per ``eval.preprocess``); concatenated outputs."""
    res, resize = preprocess_spec(ecfg)
    out: dict[str, list[torch.Tensor]] = {}
    with _bar(len(files), desc or f"{ext.kind} features", progress) as bar:
        for chunk in batches(list(files), batch_size):
            for name, t in ext.fn(_prepare([open_rgb(p) for p in chunk], res, resize)).items():
                out.setdefault(name, []).append(t.detach().float().cpu())
            bar.update(len(chunk))
    return {k: torch.cat(v) for k, v in out.items()}


def extract_batch(
    ext: Extractor, path: Path, limit: int | None, ecfg: Any, batch_size: int, progress: bool = False
) -> dict[str, torch.Tensor]:
    """Run ``ext`` over the images of an ADM reference batch (``arr_0`` of ``path``, first ``limit``)."""
    from PIL import Image

    res, resize = preprocess_spec(ecfg)
    with np.load(path, mmap_mode="r") as z:
        arr = z["arr_0"]
        n = len(arr) if limit is None else min(len(arr), limit)
        out: dict[str, list[torch.Tensor]] = {}
        with _bar(n, f"{ext.kind} features (reference batch)", progress) as bar:
            for i in range(0, n, max(1, batch_size)):
                ims = [Image.fromarray(np.asarray(a, dtype=np.uint8)) for a in arr[i : min(n, i + batch_size)]]
                for name, t in ext.fn(_prepare(ims, res, resize)).items():
                    out.setdefault(name, []).append(t.detach().float().cpu())
                bar.update(len(ims))
    return {k: torch.cat(v) for k, v in out.items()}


def generated(ext: Extractor, ecfg: Any, ctx: EvalContext) -> dict[str, torch.Tensor]:
    """Features of the run's images (rows in ``ctx.samples`` order), extracted once per evaluation."""
    key = ("generated", ext.ident)
    if key not in ctx.memo:
        files = [s.image_path for s in ctx.samples]
        ctx.memo[key] = extract_files(ext, files, ecfg, ctx.batch_size, ctx.progress, f"{ext.kind} features (run)")
    return ctx.memo[key]


def reference(ext: Extractor, ecfg: Any, ctx: EvalContext) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Features of the reference set (cached on disk) and a description of the set for the summary."""
    ref = node_get(ecfg, "reference")
    source = reference_source(ref)
    res, resize = preprocess_spec(ecfg)
    h = hashlib.sha256(f"{ext.ident}|{res}|{resize}|{source.signature}".encode()).hexdigest()[:20]
    desc: dict[str, Any] = {
        "dir": str(node_get(ref, "dir")),
        "n": source.n,
        "resolution": res,
        "resize": f"centre crop + {resize}" if res is not None else "native size",
        "key": h,
    }
    if source.batch is not None:
        desc["format"] = "ADM reference batch (arr_0)"
    memo_key = ("reference", h)
    if memo_key in ctx.memo:
        return ctx.memo[memo_key], desc | {"cached": True}
    path = None if ctx.cache_dir is None else ctx.cache_dir / "reference" / f"{ext.kind}-{h}.pt"
    if path is not None and path.exists():
        feats = torch.load(path, map_location="cpu", weights_only=True)
        desc["cached"] = True
    else:
        log.info("extracting %s features of %d reference images", ext.kind, source.n)
        if source.batch is not None:
            feats = extract_batch(ext, source.batch, source.n, ecfg, ctx.batch_size, ctx.progress)
        else:
            feats = extract_files(ext, source.files, ecfg, ctx.batch_size, ctx.progress, f"{ext.kind} features (ref)")
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
