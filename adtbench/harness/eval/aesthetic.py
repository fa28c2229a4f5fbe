"""LAION improved aesthetic predictor (v2): an MLP over the L2-normalised CLIP ViT-L/14 image embedding.

The released ``sac+logos+ava1-l14-linearMSE.pth`` is ``layers = Sequential(Linear(768,1024), Dropout,
Linear(1024,128), Dropout, Linear(128,64), Dropout, Linear(64,16), Linear(16,1))`` with no activations (the
``linearMSE`` variant downstream code uses). The state dict keys are ``layers.N.*`` — a bare
``nn.Sequential`` does not load them. Layer sizes are read from the file, so a predictor over another
embedding size loads too. Score scale: the predictor's raw output (≈1–10).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.harness.eval.clip_score import load_open_clip, mean_block
from adtbench.harness.eval.common import batches, node_get, open_rgb, package_version, weights_record
from adtbench.harness.eval.context import EvalContext, MetricOutput
from adtbench.harness.eval.weights import check_weight_file

PREDICTOR_EXPECTED = "the LAION aesthetic MLP state dict, e.g. sac+logos+ava1-l14-linearMSE.pth"
_LINEARS = (0, 2, 4, 6, 7)  # indices of the Linear layers in the released Sequential


class AestheticMLP(nn.Module):
    """The improved-aesthetic-predictor MLP (``layers`` attribute, so its state dicts load as released)."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        if len(dims) != 6:
            raise ValueError(f"expected 6 layer sizes (in, 1024, 128, 64, 16, 1), got {dims}")
        d = dims
        # Dropouts keep the released module indices; they are inactive in eval mode.
        self.layers = nn.Sequential(
            nn.Linear(d[0], d[1]),
            nn.Dropout(0.2),
            nn.Linear(d[1], d[2]),
            nn.Dropout(0.2),
            nn.Linear(d[2], d[3]),
            nn.Dropout(0.1),
            nn.Linear(d[3], d[4]),
            nn.Linear(d[4], d[5]),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> AestheticMLP:
        """Build with the layer sizes found in ``sd`` and load it (strict)."""
        try:
            dims = [int(sd["layers.0.weight"].shape[1])] + [int(sd[f"layers.{i}.weight"].shape[0]) for i in _LINEARS]
        except KeyError as e:
            raise ConfigError("eval.aesthetic.predictor", f"not an aesthetic-predictor state dict (no {e})") from None
        mlp = cls(dims)
        mlp.load_state_dict(sd, strict=True)
        return mlp.eval()


def validate(ecfg: Any) -> None:
    """Check the predictor and CLIP weight paths of ``eval.aesthetic`` (nothing loaded)."""
    from adtbench.harness.eval.clip_score import check_open_clip

    node = node_get(ecfg, "aesthetic")
    check_weight_file(
        node_get(node, "predictor"), "eval.aesthetic.predictor", PREDICTOR_EXPECTED,
        table=node_get(ecfg, "sha256"), cache_dir=node_get(ecfg, "cache_dir"),
    )  # fmt: skip
    check_open_clip(
        node, "eval.aesthetic", "clip_model", "clip_pretrained", "clip_model_config",
        table=node_get(ecfg, "sha256"), cache_dir=node_get(ecfg, "cache_dir"),
    )  # fmt: skip


def load_predictor(node: Any) -> tuple[AestheticMLP, Any]:
    """The MLP from ``node.predictor`` (a state dict, torch or safetensors; ``{"state_dict": ...}`` unwrapped) and
    its path."""
    path, fmt = check_weight_file(node_get(node, "predictor"), "eval.aesthetic.predictor", PREDICTOR_EXPECTED)
    if fmt == "safetensors":
        from safetensors.torch import load_file

        sd: Any = load_file(str(path), device="cpu")
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(sd, dict) and "state_dict" in sd:
        sd = sd["state_dict"]
    return AestheticMLP.from_state_dict(sd), path


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Aesthetic score of every image of the run."""
    node = node_get(ecfg, "aesthetic")
    if "aesthetic_mlp" in ctx.inject:
        mlp, path = ctx.inject["aesthetic_mlp"], None
    else:
        mlp, path = load_predictor(node)
    bundle = ctx.inject.get("aesthetic_clip") or load_open_clip(
        node,
        "eval.aesthetic",
        ctx,
        model_key="clip_model",
        weights_key="clip_pretrained",
        config_key="clip_model_config",
    )
    mlp = mlp.to(ctx.device).eval()
    per: dict[str, float] = {}
    with torch.no_grad():
        for chunk in batches(ctx.samples, ctx.batch_size):
            emb = bundle.image_embeddings([open_rgb(s.image_path) for s in chunk], ctx.device)
            pred = mlp(emb.to(next(mlp.parameters()).dtype)).view(-1)
            per.update({s.prompt_id: float(v) for s, v in zip(chunk, pred.tolist())})
    block = mean_block(per) | {
        "impl": "LAION improved-aesthetic-predictor MLP (adtbench re-implementation) on open_clip embeddings",
        "version": package_version("open_clip_torch"),
        "clip_model": bundle.model_name,
        "quick_gelu": bundle.quick_gelu,
        "weights": weights_record(path, ctx.cache_dir),
        "clip_weights": weights_record(bundle.weights, ctx.cache_dir),
        "scale": "raw predictor output (about 1-10)",
        "higher_is_better": True,
    }
    return MetricOutput({"aesthetic": block}, {"aesthetic": per})
