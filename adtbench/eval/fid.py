"""FID and Inception Score with torchmetrics (statistics, Fréchet distance, IS) over torch-fidelity's Inception.

FID = ‖μ_r − μ_g‖² + Tr(Σ_r + Σ_g − 2 (Σ_r Σ_g)^{1/2}) of the feature means / covariances (ddof = 1) of the
reference and generated sets; torchmetrics accumulates the statistics in float64. IS = exp(E_x KL(p(y|x) ‖
p(y))) per split of the generated set (``eval.is.splits``), mean and std over splits. The features are
extracted once by :mod:`adtbench.eval.features` (so FID, IS and P&R share one Inception pass) and handed to
torchmetrics through an identity feature module.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from adtbench.eval import features as feat
from adtbench.eval.common import node_get, package_version
from adtbench.eval.context import EvalContext, MetricOutput


class _Given(nn.Module):
    """Identity 'feature extractor': the metric receives features that were extracted already."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def frechet_distance(real: torch.Tensor, fake: torch.Tensor) -> float:
    """FID between two feature sets ``[N, d]`` and ``[M, d]`` (N, M ≥ 2) with torchmetrics, in float64."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    if real.ndim != 2 or fake.ndim != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(f"feature sets must be [N, d] with equal d, got {tuple(real.shape)} and {tuple(fake.shape)}")
    if len(real) < 2 or len(fake) < 2:
        raise ValueError("FID needs at least 2 samples in each set")
    metric = FrechetInceptionDistance(feature=_Given(real.shape[1]))
    metric.update(real.double(), real=True)
    metric.update(fake.double(), real=False)
    return float(metric.compute())


def inception_score(logits: torch.Tensor, splits: int = 10, seed: int = 0) -> tuple[float, float]:
    """(mean, std) IS over ``splits`` of the rows of ``logits`` (torchmetrics; its shuffle seeded by ``seed``)."""
    from torchmetrics.image.inception import InceptionScore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "will save all extracted features in buffer"
        metric = InceptionScore(feature=_Given(logits.shape[1]), splits=int(splits))
    metric.update(logits.double())
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # std over a single split is NaN (recorded as null)
        torch.manual_seed(seed)
        mean, std = metric.compute()
    return float(mean), float(std)


def versions() -> dict[str, Any]:
    return {"torchmetrics": package_version("torchmetrics"), "torch-fidelity": package_version("torch-fidelity")}


def validate(ecfg: Any) -> None:
    """Weights of the FID extractor and the reference folder (nothing loaded)."""
    from adtbench.eval.common import reference_files

    feat.validate(ecfg, str(node_get(ecfg, "fid.features", "inception")), "eval.fid.features")
    reference_files(node_get(ecfg, "reference"))


def validate_is(ecfg: Any) -> None:
    feat.validate(ecfg, "inception", "eval.is")


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """FID of the run's images against ``eval.reference``."""
    kind = str(node_get(ecfg, "fid.features", "inception"))
    ext = feat.build(ecfg, kind, ctx, "eval.fid.features")
    gen = feat.generated(ext, ecfg, ctx)["features"]
    ref, ref_desc = feat.reference(ext, ecfg, ctx)
    value = frechet_distance(ref["features"], gen)
    block = {
        "value": value,
        "n": len(gen),
        "impl": "torchmetrics FrechetInceptionDistance (float64 statistics) on pre-extracted features",
        "version": versions(),
        "features": feat.describe(ext, ctx),
        "weights": feat.describe(ext, ctx)["weights"],
        "reference": ref_desc,
        "scale": "FID (squared Fréchet distance, lower is better)",
        "higher_is_better": False,
    }
    if len(gen) < gen.shape[1]:
        block["note"] = f"n={len(gen)} < feature dim {gen.shape[1]}: covariance is rank-deficient, FID is biased"
    return MetricOutput({"fid": block})


def compute_is(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Inception Score of the run's images (Inception logits, ``eval.is.splits`` splits)."""
    ext = feat.build(ecfg, "inception", ctx, "eval.is")
    logits = feat.generated(ext, ecfg, ctx).get("logits")
    if logits is None:
        raise ValueError("the inception extractor returned no 'logits' (an injected extractor must provide them)")
    splits = int(node_get(ecfg, "is.splits", 10))
    mean, std = inception_score(logits, splits, int(node_get(ecfg, "is.seed", 0)))
    block = {
        "value": mean,
        "std": std,
        "n": len(logits),
        "splits": splits,
        "impl": "torchmetrics InceptionScore on torch-fidelity Inception logits_unbiased",
        "version": versions(),
        "weights": feat.describe(ext, ctx)["weights"],
        "scale": "IS = exp(E KL(p(y|x) || p(y))) (higher is better)",
        "higher_is_better": True,
    }
    return MetricOutput({"is": block})
