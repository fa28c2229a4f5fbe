"""CLIP score with open_clip (any architecture, weights from a local file).

Per image: ``scale · cos(E_img(image), E_txt(template.format(prompt=...)))`` with L2-normalised embeddings;
``clamp: true`` gives torchmetrics' ``max(100·cos, 0)`` convention. Reported: the mean over images, with the
scale, template, preprocessing and weights hash recorded next to it: papers' CLIP scores differ in backbone,
scale (cosine or ×100), clamping and prompt template, so a number without them cannot be compared
(docs/evaluation.md, "Quality metrics").

OpenAI weights loaded from a file need ``quick_gelu: true``: open_clip turns QuickGELU on only through the
``openai`` pretrained tag's config (its ``pretrained.py``, https://github.com/mlfoundations/open_clip), so the same
weights read from a path would otherwise run with plain GELU and score differently, silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import (
    batches,
    node_get,
    open_rgb,
    package_version,
    require_dir,
    require_file,
    weights_record,
)
from adtbench.harness.eval.context import EvalContext, MetricOutput

OPEN_CLIP_EXPECTED = "an open_clip checkpoint of {model} (e.g. open_clip_pytorch_model.bin / .safetensors)"


@dataclass
class ClipBundle:
    """A loaded open_clip model with its eval transform and tokenizer."""

    model: Any
    preprocess: Any
    tokenizer: Any
    model_name: str
    weights: Path | None = None
    quick_gelu: bool = False

    @torch.no_grad()
    def image_embeddings(self, images: list[Any], device: torch.device) -> torch.Tensor:
        """L2-normalised image embeddings ``[N, d]`` (float32) of PIL images."""
        x = torch.stack([self.preprocess(im) for im in images]).to(device)
        return F.normalize(self.model.encode_image(x).float(), dim=-1)

    @torch.no_grad()
    def text_embeddings(self, texts: list[str], device: torch.device) -> torch.Tensor:
        """L2-normalised text embeddings ``[N, d]`` (float32)."""
        tokens = self.tokenizer(texts).to(device)
        return F.normalize(self.model.encode_text(tokens).float(), dim=-1)

    def cosine(self, images: list[Any], texts: list[str], device: torch.device) -> torch.Tensor:
        """Per-pair cosine similarity ``[N]`` of image i and text i."""
        return (self.image_embeddings(images, device) * self.text_embeddings(texts, device)).sum(-1)


def check_open_clip(
    node: Any, prefix: str, model_key: str, weights_key: str, config_key: str = "model_config"
) -> tuple[str, Path | None]:
    """Validate the model name / weights of an open_clip config block without loading anything."""
    name = str(node_get(node, model_key, ""))
    if not name:
        raise ConfigError(f"{prefix}.{model_key}", "an open_clip model name is required, e.g. ViT-L-14")
    cfg_file = node_get(node, config_key)
    if cfg_file is not None:
        require_file(cfg_file, f"{prefix}.{config_key}", "an open_clip model config json")
    if name.startswith("local-dir:"):
        require_dir(name.removeprefix("local-dir:"), f"{prefix}.{model_key}", "an open_clip model folder")
        return name, None
    expected = OPEN_CLIP_EXPECTED.format(model=name)
    return name, require_file(node_get(node, weights_key), f"{prefix}.{weights_key}", expected)


def load_open_clip(
    node: Any,
    prefix: str,
    ctx: EvalContext,
    *,
    model_key: str = "model",
    weights_key: str = "pretrained",
    config_key: str = "model_config",
) -> ClipBundle:
    """Build (once per evaluation) the open_clip model named by ``node[model_key]`` with local weights."""
    name, weights = check_open_clip(node, prefix, model_key, weights_key, config_key)
    quick = bool(node_get(node, "quick_gelu", False))
    cfg_file = node_get(node, config_key)
    key = ("open_clip", name, str(weights), quick, str(cfg_file))
    if key in ctx.memo:
        return ctx.memo[key]
    import open_clip

    if cfg_file is not None:
        open_clip.add_model_config(str(cfg_file))
    if not name.startswith("local-dir:") and name not in open_clip.list_models():
        msg = f"open_clip has no model {name!r} (set model_config for a custom architecture)"
        raise ConfigError(f"{prefix}.{model_key}", msg)
    model, _, preprocess = open_clip.create_model_and_transforms(
        name,
        pretrained=None if weights is None else str(weights),
        force_quick_gelu=quick,
        device=ctx.device,
        weights_only=bool(node_get(node, "weights_only", True)),
    )
    model.eval()
    bundle = ClipBundle(model, preprocess, open_clip.get_tokenizer(name), name, weights, quick)
    ctx.memo[key] = bundle
    return bundle


def score_pairs(bundle: ClipBundle, ctx: EvalContext, template: str, scale: float, clamp: bool) -> dict[str, float]:
    """``{prompt_id: scale · cos}`` over the run's samples (batched, paired by prompt id)."""
    if "{prompt}" not in template:
        raise ConfigError("eval.clip.template", f"must contain '{{prompt}}', got {template!r}")
    out: dict[str, float] = {}
    for chunk in batches(ctx.samples, ctx.batch_size):
        images = [open_rgb(s.image_path) for s in chunk]
        cos = bundle.cosine(images, [template.format(prompt=s.prompt) for s in chunk], ctx.device)
        vals = scale * cos
        if clamp:
            vals = vals.clamp_min(0.0)
        for s, v in zip(chunk, vals.tolist()):
            out[s.prompt_id] = float(v)
    return out


def mean_block(values: dict[str, float]) -> dict[str, Any]:
    """``value`` (mean), ``std`` (ddof=1), ``n`` of per-prompt values."""
    a = np.asarray(list(values.values()), dtype=np.float64)
    return {
        "value": float(a.mean()) if a.size else None,
        "std": float(a.std(ddof=1)) if a.size > 1 else None,
        "n": int(a.size),
    }


def describe_scale(scale: float, clamp: bool) -> str:
    s = "cos" if scale == 1 else f"{scale:g}·cos"
    return f"{s}(image, text) of L2-normalised embeddings" + (", clamped at 0" if clamp else ", not clamped")


def validate(ecfg: Any) -> None:
    """Check the model name and weights path of ``eval.clip`` (nothing loaded)."""
    check_open_clip(node_get(ecfg, "clip"), "eval.clip", "model", "pretrained")


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """CLIP score of every (image, prompt) pair of the run."""
    node = node_get(ecfg, "clip")
    bundle = ctx.inject.get("clip") or load_open_clip(node, "eval.clip", ctx)
    template = str(node_get(node, "template", "{prompt}"))
    scale, clamp = float(node_get(node, "scale", 100.0)), bool(node_get(node, "clamp", False))
    per = score_pairs(bundle, ctx, template, scale, clamp)
    block = mean_block(per) | {
        "impl": "open_clip",
        "version": package_version("open_clip_torch"),
        "model": bundle.model_name,
        "quick_gelu": bundle.quick_gelu,
        "weights": weights_record(bundle.weights, ctx.cache_dir),
        "scale": describe_scale(scale, clamp),
        "template": template,
        "preprocess": "open_clip eval transform of the model (resize shorter side, centre crop, normalise)",
        "higher_is_better": True,
    }
    return MetricOutput({"clip_score": block}, {"clip_score": per})
