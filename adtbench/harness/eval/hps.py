"""HPSv2 / HPSv2.1 (human preference score) computed with upstream open_clip — not the ``hpsv2`` package,
whose pins (protobuf<4, pytest==7.2.0) conflict with wandb and whose first call downloads 4 GB.

HPS is a fine-tuned open_clip ViT-H-14: score = cos(normalised image features, normalised text features)
of the prompt (no template), the raw value ``hpsv2.score`` returns; papers report it ×100 (``scale: 100``).
Checkpoint: ``HPS_v2_compressed.pt`` (v2.0) or ``HPS_v2.1_compressed.pt`` (v2.1), loaded into open_clip's
``ViT-H-14`` (open_clip unwraps ``{"state_dict": ...}``).
"""

from __future__ import annotations

from typing import Any

from adtbench.errors import ConfigError
from adtbench.harness.eval.clip_score import describe_scale, load_open_clip, mean_block, score_pairs
from adtbench.harness.eval.common import node_get, package_version, weights_record
from adtbench.harness.eval.context import EvalContext, MetricOutput

VERSIONS = {"v2.0": ("hpsv2", "HPS_v2_compressed.pt"), "v2.1": ("hpsv21", "HPS_v2.1_compressed.pt")}


def metric_name(node: Any) -> str:
    """``hpsv2`` or ``hpsv21`` for ``version`` v2.0 / v2.1."""
    version = str(node_get(node, "version", "v2.1"))
    if version not in VERSIONS:
        raise ConfigError("eval.hps.version", f"unknown HPS version {version!r}; choose v2.0 or v2.1")
    return VERSIONS[version][0]


def validate(ecfg: Any) -> None:
    """Check the version and the checkpoint path of ``eval.hps`` (nothing loaded)."""
    from adtbench.harness.eval.clip_score import check_open_clip

    node = node_get(ecfg, "hps")
    metric_name(node)
    version = str(node_get(node, "version", "v2.1"))
    try:
        check_open_clip(
            node, "eval.hps", "model", "checkpoint",
            table=node_get(ecfg, "sha256"), cache_dir=node_get(ecfg, "cache_dir"),
        )  # fmt: skip
    except ConfigError as e:
        if e.key == "eval.hps.checkpoint":
            raise ConfigError(e.key, f"{e.message} — the HPS {version} file is {VERSIONS[version][1]}") from None
        raise


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """HPS of every (image, prompt) pair of the run."""
    validate(ecfg)
    node = node_get(ecfg, "hps")
    name = metric_name(node)
    bundle = ctx.inject.get("hps") or load_open_clip(node, "eval.hps", ctx, weights_key="checkpoint")
    scale = float(node_get(node, "scale", 100.0))
    per = score_pairs(bundle, ctx, "{prompt}", scale, False)
    block = mean_block(per) | {
        "impl": "open_clip (HPS checkpoint; not the hpsv2 package)",
        "version": package_version("open_clip_torch"),
        "hps_version": str(node_get(node, "version", "v2.1")),
        "model": bundle.model_name,
        "weights": weights_record(bundle.weights, ctx.cache_dir),
        "scale": describe_scale(scale, False),
        "template": "{prompt}",
        "higher_is_better": True,
    }
    return MetricOutput({name: block}, {name: per})
