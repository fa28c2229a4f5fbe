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

import sys
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


@dataclass(frozen=True)
class OpenClipSource:
    """Where an open_clip model's weights come from, resolved without loading anything: the architecture ``name``,
    the local ``weights`` file (None for ``local-dir:``), its ``fmt`` (``weights.FORMATS``), the pretrained ``tag``
    it was found for in the local Hugging Face cache (None for a path) and the QuickGELU the tag prescribes."""

    name: str
    weights: Path | None
    fmt: str | None = None
    tag: str | None = None
    tag_quick_gelu: bool | None = None


def _looks_like_tag(value: Any) -> bool:
    """A bare name such as ``openai`` or ``laion2b_s32b_b82k`` (no folder, no file suffix), not a path."""
    s = str(value)
    return bool(s) and "/" not in s and "\\" not in s and "." not in s and not Path(s).expanduser().exists()


def hf_cache_dir(node: Any) -> str | None:
    """``cache_dir`` of the node (null: the Hugging Face default, ``HF_HUB_CACHE`` / ``HF_HOME``)."""
    value = node_get(node, "cache_dir")
    return None if value is None else str(Path(str(value)).expanduser())


def resolve_tag(name: str, tag: str, key: str, cache_dir: str | None) -> tuple[Path, bool]:
    """The local file of open_clip pretrained tag ``tag`` of architecture ``name``, found in the Hugging Face cache
    (``hf_hub`` entries: the safetensors file first, as open_clip prefers it) or open_clip's URL cache
    (``~/.cache/clip``), and the tag's QuickGELU. Nothing is downloaded: a tag not cached is a ``ConfigError(key)``
    naming the hub id and the file to fetch."""
    from huggingface_hub import constants, try_to_load_from_cache
    from open_clip.pretrained import get_pretrained_cfg, list_pretrained_tags_by_model

    cfg = get_pretrained_cfg(name, tag)
    if not cfg:
        tags = list_pretrained_tags_by_model(name)
        raise ConfigError(key, f"{tag!r} is neither a file nor an open_clip pretrained tag of {name} (tags: {tags})")
    quick = bool(cfg.get("quick_gelu", False))
    hub = str(cfg.get("hf_hub", ""))
    tried: list[str] = []
    where = cache_dir or constants.HF_HUB_CACHE
    if hub:
        repo, filename = hub.rstrip("/"), None
        if not hub.endswith("/"):
            repo, filename = hub.rsplit("/", 1)
        names = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        if filename and filename.endswith(".bin"):
            names = [filename.removesuffix(".bin") + ".safetensors", filename]
        for fname in names:
            hit = try_to_load_from_cache(repo, fname, cache_dir=cache_dir)
            tried.append(f"{repo}/{fname}")
            if isinstance(hit, str):
                return Path(hit), quick
    url = str(cfg.get("url", ""))
    if url:
        local = Path("~/.cache/clip").expanduser() / Path(url).name
        tried.append(str(local))
        if local.is_file():
            return local, quick
        where = where if hub else str(local.parent)
    raise ConfigError(
        key,
        f"open_clip tag {name}/{tag} is not in the local cache ({where}) and nothing is downloaded; fetch "
        f"{' or '.join(tried)} where there is network (huggingface-cli download <repo> <file>) and copy the cache, "
        f"or set {key}=<the weights file>",
    )


def check_open_clip(
    node: Any, prefix: str, model_key: str, weights_key: str, config_key: str = "model_config", table: Any = None,
    cache_dir: Any = None,
) -> OpenClipSource:  # fmt: skip
    """Validate the model name and weights of an open_clip config block without loading anything: a local file
    (format, size, sha256 of known files: ``weights.check_weight_file``; a TorchScript archive such as OpenAI's
    ``ViT-L-14.pt`` is accepted and read with ``torch.jit.load``), an open_clip pretrained tag found in the local cache
    (:func:`resolve_tag`), or ``local-dir:<folder>``."""
    from adtbench.harness.eval.weights import FORMATS, check_weight_file

    name = str(node_get(node, model_key, ""))
    if not name:
        raise ConfigError(f"{prefix}.{model_key}", "an open_clip model name is required, e.g. ViT-L-14")
    cfg_file = node_get(node, config_key)
    if cfg_file is not None:
        require_file(cfg_file, f"{prefix}.{config_key}", "an open_clip model config json")
    if name.startswith("local-dir:"):
        require_dir(name.removeprefix("local-dir:"), f"{prefix}.{model_key}", "an open_clip model folder")
        return OpenClipSource(name, None)
    key = f"{prefix}.{weights_key}"
    value = node_get(node, weights_key)
    if value is not None and _looks_like_tag(value):
        path, quick = resolve_tag(name, str(value), key, hf_cache_dir(node))
        path, fmt = check_weight_file(path, key, f"the cached file of tag {value}", formats=FORMATS, table=table)
        return OpenClipSource(name, path, fmt, str(value), quick)
    expected = OPEN_CLIP_EXPECTED.format(model=name)
    path, fmt = check_weight_file(value, key, expected, formats=FORMATS, table=table, cache_dir=cache_dir)
    return OpenClipSource(name, path, fmt)


def load_open_clip(
    node: Any,
    prefix: str,
    ctx: EvalContext,
    *,
    model_key: str = "model",
    weights_key: str = "pretrained",
    config_key: str = "model_config",
) -> ClipBundle:
    """Build (once per evaluation) the open_clip model named by ``node[model_key]`` with local weights: a state-dict
    file through open_clip, a TorchScript archive (OpenAI's released ``*.pt``) by ``torch.jit.load`` and a strict
    ``load_state_dict`` into the open_clip architecture (as open_clip's own loader does with a ScriptModule, without
    the unpickling ``weights_only=False`` would need), a pretrained tag from its cached file with the tag's
    QuickGELU."""
    src = check_open_clip(node, prefix, model_key, weights_key, config_key, cache_dir=ctx.cache_dir)
    name, weights = src.name, src.weights
    quick = bool(node_get(node, "quick_gelu", False)) if src.tag_quick_gelu is None else src.tag_quick_gelu
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
    jit = src.fmt == "torchscript"
    model, _, preprocess = open_clip.create_model_and_transforms(
        name,
        pretrained=None if weights is None or jit else str(weights),
        force_quick_gelu=quick,
        device="cpu" if jit else ctx.device,
        weights_only=bool(node_get(node, "weights_only", True)),
    )
    if jit:
        assert weights is not None
        load_torchscript_weights(model, weights, f"{prefix}.{weights_key}")
        model = model.to(ctx.device)
    model.eval()
    bundle = ClipBundle(model, preprocess, open_clip.get_tokenizer(name), name, weights, quick)
    ctx.memo[key] = bundle
    return bundle


JIT_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size", "attn_mask")


def load_torchscript_weights(model: torch.nn.Module, path: Path, key: str) -> None:
    """Copy the parameters of the TorchScript archive ``path`` into ``model`` (strict; the archive's scalar
    attributes ``input_resolution`` / ``context_length`` / ``vocab_size`` and ``attn_mask`` dropped, as open_clip does).
    A mismatch is a ``ConfigError(key)``: the archive is not of that architecture."""
    sd = torch.jit.load(str(path), map_location="cpu").state_dict()
    for k in JIT_EXTRA_KEYS:
        sd.pop(k, None)
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise ConfigError(key, f"{path} (TorchScript) does not match the open_clip architecture: {first}") from None


def score_pairs(bundle: ClipBundle, ctx: EvalContext, template: str, scale: float, clamp: bool) -> dict[str, float]:
    """``{prompt_id: scale · cos}`` over the run's samples (batched, paired by prompt id)."""
    if "{prompt}" not in template:
        raise ConfigError("eval.clip.template", f"must contain '{{prompt}}', got {template!r}")
    from tqdm import tqdm

    out: dict[str, float] = {}
    bar = tqdm(total=len(ctx.samples), desc=bundle.model_name, unit="img", disable=not ctx.progress, file=sys.stderr,
               leave=False)  # fmt: skip
    with bar:
        for chunk in batches(ctx.samples, ctx.batch_size):
            images = [open_rgb(s.image_path) for s in chunk]
            cos = bundle.cosine(images, [template.format(prompt=s.prompt) for s in chunk], ctx.device)
            vals = scale * cos
            if clamp:
                vals = vals.clamp_min(0.0)
            for s, v in zip(chunk, vals.tolist()):
                out[s.prompt_id] = float(v)
            bar.update(len(chunk))
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
    """Check the model name and weights of ``eval.clip`` (nothing loaded)."""
    check_open_clip(
        node_get(ecfg, "clip"), "eval.clip", "model", "pretrained",
        table=node_get(ecfg, "sha256"), cache_dir=node_get(ecfg, "cache_dir"),
    )  # fmt: skip


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
