"""FID and Inception Score by torch-fidelity's own feature-level functions, on features extracted once by
:mod:`adtbench.harness.eval.features` (so FID, IS and P&R share one Inception pass; the extractor stays injectable).

- FID = ‖μ_r − μ_g‖² + Tr(Σ_r) + Tr(Σ_g) − 2 Σ √eig(Σ_r Σ_g): ``metric_fid.fid_features_to_statistics`` (mean,
  ``np.cov`` with ddof = 1) and ``fid_statistics_to_metric``, in float64.
- IS: ``metric_isc.isc_features_to_metric`` on the logits: the N rows are permuted with
  ``numpy.random.RandomState(eval.is.seed)``; split i (of s = ``eval.is.splits``, at most N) is rows
  [i·N // s, (i + 1)·N // s) of that order; each split scores exp(mean_x KL(p(y|x) ‖ p̄(y))) with p̄ the split's
  mean prediction; IS = the mean over splits, ``std`` = their population std (ddof = 0).

With fewer images than feature dimensions the covariances are rank-deficient and FID is biased: the block gets
a ``note`` and a warning is logged (:func:`rank_note`; also for ``mini_fid``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

import adtbench.harness.eval.features as feat
from adtbench.harness.eval.common import node_get, package_version
from adtbench.harness.eval.context import EvalContext, MetricOutput

log = logging.getLogger(__name__)

FID_IMPL = "torch-fidelity fid_features_to_statistics + fid_statistics_to_metric (float64)"
IS_IMPL = "torch-fidelity isc_features_to_metric (numpy-seeded shuffle, contiguous splits, std ddof=0)"


def frechet_distance(real: torch.Tensor, fake: torch.Tensor) -> float:
    """FID between two feature sets ``[N, d]`` and ``[M, d]`` (N, M ≥ 2), by torch-fidelity in float64."""
    from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric

    if real.ndim != 2 or fake.ndim != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(f"feature sets must be [N, d] with equal d, got {tuple(real.shape)} and {tuple(fake.shape)}")
    if len(real) < 2 or len(fake) < 2:
        raise ValueError("FID needs at least 2 samples in each set")
    stats = [fid_features_to_statistics(x.detach().double().cpu()) for x in (real, fake)]
    return float(fid_statistics_to_metric(stats[0], stats[1], verbose=False)[KEY_METRIC_FID])


def rank_note(n_gen: int, n_ref: int, dim: int, name: str = "FID") -> str | None:
    """The warning text when a set has fewer rows than feature dimensions (rank-deficient covariance), else
    None; logged as a warning when returned."""
    if min(n_gen, n_ref) >= dim:
        return None
    n = n_gen if n_gen < dim else n_ref
    which = "generated" if n_gen < dim else "reference"
    note = f"n={n} < feature dim {dim} ({which} set): covariance is rank-deficient, {name} is biased"
    log.warning("%s: %s", name, note)
    return note


def inception_score(logits: torch.Tensor, splits: int = 10, seed: int = 0) -> tuple[float, float]:
    """(mean, std) IS over ``min(splits, N)`` splits of the rows of ``logits`` (module docstring), by torch-fidelity
    with its shuffle seeded by ``seed``."""
    from torch_fidelity.metric_isc import KEY_METRIC_ISC_MEAN, KEY_METRIC_ISC_STD, isc_features_to_metric

    x = logits.detach().double().cpu()
    out = isc_features_to_metric(x, splits=max(1, min(int(splits), len(x))), shuffle=True, rng_seed=int(seed))
    return float(out[KEY_METRIC_ISC_MEAN]), float(out[KEY_METRIC_ISC_STD])


def versions() -> dict[str, Any]:
    """Versions of the code computing FID / IS (torch-fidelity's functions run on numpy and torch)."""
    return {
        "torch-fidelity": package_version("torch-fidelity"),
        "numpy": package_version("numpy"),
        "torch": torch.__version__,
    }


def validate(ecfg: Any) -> None:
    """Weights of the FID extractor and the reference folder (nothing loaded)."""
    from adtbench.harness.eval.common import reference_files

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
        "impl": FID_IMPL,
        "version": versions(),
        "features": feat.describe(ext, ctx),
        "weights": feat.describe(ext, ctx)["weights"],
        "reference": ref_desc,
        "scale": "FID (squared Fréchet distance, lower is better)",
        "higher_is_better": False,
    }
    note = rank_note(len(gen), len(ref["features"]), gen.shape[1])
    if note is not None:
        block["note"] = note
    return MetricOutput({"fid": block})


def compute_is(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Inception Score of the run's images (Inception logits, ``eval.is.splits`` splits)."""
    ext = feat.build(ecfg, "inception", ctx, "eval.is")
    logits = feat.generated(ext, ecfg, ctx).get("logits")
    if logits is None:
        raise ValueError("the inception extractor returned no 'logits' (an injected extractor must provide them)")
    requested = int(node_get(ecfg, "is.splits", 10))
    splits = max(1, min(requested, len(logits)))
    mean, std = inception_score(logits, splits, int(node_get(ecfg, "is.seed", 0)))
    block = {
        "value": mean,
        "std": std,
        "n": len(logits),
        "splits": splits,
        "splits_requested": requested,
        "seed": int(node_get(ecfg, "is.seed", 0)),
        "impl": IS_IMPL + " on the extractor's logits (inception: torch-fidelity logits_unbiased)",
        "version": versions(),
        "weights": feat.describe(ext, ctx)["weights"],
        "scale": "IS = exp(E KL(p(y|x) || p(y))) (higher is better)",
        "higher_is_better": True,
    }
    return MetricOutput({"is": block})
