"""FID and Inception Score by torch-fidelity's own feature-level functions, on features extracted once by
:mod:`adtbench.harness.eval.features` (so FID, IS and P&R share one Inception pass; the extractor stays injectable).

- FID = ‖μ_r − μ_g‖² + Tr(Σ_r) + Tr(Σ_g) − 2 Σ √eig(Σ_r Σ_g): ``metric_fid.fid_features_to_statistics`` (mean,
  ``np.cov`` with ddof = 1) and ``fid_statistics_to_metric``, in float64.
- IS: ``metric_isc.isc_features_to_metric`` on the logits: the N rows are permuted with
  ``numpy.random.RandomState(eval.is.seed)``; split i (of s = ``eval.is.splits``, at most N) is rows
  [i·N // s, (i + 1)·N // s) of that order; each split scores exp(mean_x KL(p(y|x) ‖ p̄(y))) with p̄ the split's
  mean prediction; IS = the mean over splits, ``std`` = their population std (ddof = 0).

- KID (Bińkowski et al. 2018): ``metric_kid.kid_features_to_metric`` on the same Inception features: the mean
  (and std) over ``eval.kid.subsets`` random subsets of ``eval.kid.subset_size`` rows of each set (drawn with
  ``numpy.random.RandomState(eval.kid.seed)``, generated set first, as torch-fidelity's ``input1``) of the unbiased
  MMD² with the cubic polynomial kernel k(x, y) = (xᵀy / d + 1)³. The subset size is capped at the smaller set.
- FD-DINOv2 (Stein et al. 2023): the same Fréchet distance on torch-fidelity's DINOv2 ViT-L/14 features.

**Precomputed reference statistics** (``eval.reference.stats``): FID then compares the run's statistics with a file's
``mu`` [d] and ``sigma`` [d, d] instead of extracting the reference images: a ``.npz`` with keys ``mu`` / ``sigma``
(ADM's ``VIRTUAL_*.npz`` reference batches hold them beside ``arr_0``; pytorch-fid / clean-fid write the same keys) or
torch-fidelity's cached statistics (``*-stat-fid-2048.pt``: a torch-saved dict ``{"mu", "sigma"}`` of numpy arrays,
read with ``weights_only=True``). Every FID over an image reference writes the reference's statistics to
``eval.cache_dir/reference/<kind>-<key>.fid.npz`` (keys ``mu``, ``sigma``, float64), a file ``eval.reference.stats``
takes; FID from it equals FID from the images. ADM's own statistics come from ADM's TensorFlow Inception graph:
torch-fidelity's ``inception-v3-compat`` is a port of the same network, close to it but not bit-identical.

With fewer images than feature dimensions the covariances are rank-deficient and FID is biased: the block gets
a ``note`` and a warning is logged (:func:`rank_note`; also for ``mini_fid``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

import adtbench.harness.eval.features as feat
from adtbench.errors import ConfigError
from adtbench.harness.eval.common import node_get, package_version
from adtbench.harness.eval.context import EvalContext, MetricOutput
from adtbench.io import atomic_write_with

try:  # what torch.save pickles numpy arrays with (torch-fidelity's cached statistics)
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

log = logging.getLogger(__name__)

FID_IMPL = "torch-fidelity fid_features_to_statistics + fid_statistics_to_metric (float64)"
IS_IMPL = "torch-fidelity isc_features_to_metric (numpy-seeded shuffle, contiguous splits, std ddof=0)"


Stats = dict[str, np.ndarray]
FEATURE_DIMS = {"inception": 2048, "vgg16": 4096, "dinov2": 1024}  # feature sizes of the fixed extractors
KID_IMPL = "torch-fidelity kid_features_to_metric (unbiased MMD², polynomial kernel degree 3, coef0 1, γ = 1/d)"


def statistics(features: torch.Tensor) -> Stats:
    """``{"mu", "sigma"}`` of a feature set ``[N, d]`` (N ≥ 2): torch-fidelity's ``fid_features_to_statistics``
    (mean, ``np.cov`` ddof = 1) in float64."""
    from torch_fidelity.metric_fid import fid_features_to_statistics

    if features.ndim != 2 or len(features) < 2:
        raise ValueError(f"FID needs a feature set [N ≥ 2, d], got {tuple(features.shape)}")
    return dict(fid_features_to_statistics(features.detach().double().cpu()))


def statistics_distance(gen: Stats, ref: Stats) -> float:
    """The Fréchet distance of two ``{"mu", "sigma"}`` (both cast to float64): torch-fidelity's
    ``fid_statistics_to_metric`` with the generated set first, as its ``input1``."""
    from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_statistics_to_metric

    a, b = ({k: np.asarray(s[k], dtype=np.float64) for k in ("mu", "sigma")} for s in (gen, ref))
    if a["mu"].shape != b["mu"].shape or a["sigma"].shape != b["sigma"].shape:
        raise ValueError(f"statistics of different dimension: {a['mu'].shape} and {b['mu'].shape}")
    return float(fid_statistics_to_metric(a, b, verbose=False)[KEY_METRIC_FID])


def frechet_distance(real: torch.Tensor, fake: torch.Tensor) -> float:
    """FID between two feature sets ``[N, d]`` and ``[M, d]`` (N, M ≥ 2), by torch-fidelity in float64."""
    if real.ndim != 2 or fake.ndim != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(f"feature sets must be [N, d] with equal d, got {tuple(real.shape)} and {tuple(fake.shape)}")
    if len(real) < 2 or len(fake) < 2:
        raise ValueError("FID needs at least 2 samples in each set")
    return statistics_distance(statistics(fake), statistics(real))


def write_statistics(stats: Stats, path: Path) -> Path:
    """Write ``{"mu", "sigma"}`` as a ``.npz`` (float64), the format ``eval.reference.stats`` reads."""
    mu, sigma = (np.asarray(stats[k], dtype=np.float64) for k in ("mu", "sigma"))

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, mu=mu, sigma=sigma)

    atomic_write_with(path, write)
    return path


def load_statistics(value: Any, key: str = "eval.reference.stats") -> Stats:
    """``{"mu", "sigma"}`` from a ``.npz`` (ADM, pytorch-fid, clean-fid, :func:`write_statistics`) or torch-fidelity's
    cached ``.pt``; a ``ConfigError(key)`` naming what is wrong (missing keys, shapes, unreadable)."""
    from adtbench.harness.eval.common import require_file

    path = require_file(value, key, "a .npz with mu [d] and sigma [d, d] (e.g. ADM's VIRTUAL_*.npz)")
    try:
        if path.suffix == ".pt":
            safe: list[Any] = [_reconstruct, np.ndarray, np.dtype, np.dtypes.Float64DType, np.dtypes.Float32DType]
            with torch.serialization.safe_globals(safe):
                data = torch.load(path, map_location="cpu", weights_only=True)
            stats = {k: np.asarray(data[k]) for k in ("mu", "sigma") if k in data}
        else:
            with np.load(path) as z:
                stats = {k: np.asarray(z[k]) for k in ("mu", "sigma") if k in z.files}
    except Exception as e:  # a broken file, whatever the reader raises
        raise ConfigError(key, f"cannot read {path}: {type(e).__name__}: {e}") from None
    if set(stats) != {"mu", "sigma"}:
        lacking = sorted({"mu", "sigma"} - set(stats))
        raise ConfigError(key, f"{path} lacks {lacking} (FID statistics need mu and sigma)")
    mu, sigma = stats["mu"], stats["sigma"]
    if mu.ndim != 1 or sigma.shape != (len(mu), len(mu)):
        raise ConfigError(key, f"{path}: mu {mu.shape} and sigma {sigma.shape} are not [d] and [d, d]")
    return stats


def kernel_inception_distance(
    real: torch.Tensor, fake: torch.Tensor, subsets: int = 100, subset_size: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """(mean, std) KID of ``fake`` against ``real`` by torch-fidelity (module docstring), in float64."""
    from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric

    out = kid_features_to_metric(
        fake.detach().double().cpu(), real.detach().double().cpu(),
        kid_subsets=int(subsets), kid_subset_size=int(subset_size), rng_seed=int(seed), verbose=False,
    )  # fmt: skip
    return float(out[KEY_METRIC_KID_MEAN]), float(out[KEY_METRIC_KID_STD])


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
    """Packages, the FID extractor's weights, and the reference: precomputed statistics (read now: a few MB), or
    the reference images (nothing loaded)."""
    from adtbench.harness.eval.common import reference_source

    kind = str(node_get(ecfg, "fid.features", "inception"))
    feat.validate(ecfg, kind, "eval.fid.features")
    if node_get(ecfg, "reference.stats") is not None:
        stats = load_statistics(node_get(ecfg, "reference.stats"))
        dim = FEATURE_DIMS.get(kind)
        if dim is not None and len(stats["mu"]) != dim:
            raise ConfigError(
                "eval.reference.stats",
                f"holds {len(stats['mu'])}-d statistics; eval.fid.features={kind} gives {dim}-d features",
            )
    else:
        reference_source(node_get(ecfg, "reference"))


def validate_is(ecfg: Any) -> None:
    feat.validate(ecfg, "inception", "eval.is")


def validate_kid(ecfg: Any) -> None:
    from adtbench.harness.eval.common import reference_source

    feat.validate(ecfg, str(node_get(ecfg, "kid.features", "inception")), "eval.kid.features")
    reference_source(node_get(ecfg, "reference"))


def validate_fd_dinov2(ecfg: Any) -> None:
    from adtbench.harness.eval.common import reference_source

    feat.validate(ecfg, "dinov2", "eval.fd_dinov2")
    reference_source(node_get(ecfg, "reference"))


def _fid_block(
    name: str, kind: str, ecfg: Any, ctx: EvalContext, use_stats: bool
) -> dict[str, Any]:  # fmt: skip
    ext = feat.build(ecfg, kind, ctx, f"eval.{name}.features" if name == "fid" else f"eval.{name}")
    gen = feat.generated(ext, ecfg, ctx)["features"]
    stats_file = node_get(ecfg, "reference.stats") if use_stats else None
    if stats_file is not None:
        ref_stats = load_statistics(stats_file)
        ref_desc: dict[str, Any] = {"stats": str(stats_file), "dim": len(ref_stats["mu"])}
        n_ref = None
    else:
        ref, ref_desc = feat.reference(ext, ecfg, ctx)
        ref_stats = statistics(ref["features"])
        n_ref = len(ref["features"])
        if ctx.cache_dir is not None:
            out = ctx.cache_dir / "reference" / f"{ext.kind}-{ref_desc['key']}.fid.npz"
            ref_desc["stats_file"] = str(write_statistics(ref_stats, out))
    value = statistics_distance(statistics(gen), ref_stats)
    block = {
        "value": value,
        "n": len(gen),
        "impl": FID_IMPL,
        "version": versions(),
        "features": feat.describe(ext, ctx),
        "weights": feat.describe(ext, ctx)["weights"],
        "reference": ref_desc,
        "scale": "squared Fréchet distance (lower is better)",
        "higher_is_better": False,
    }
    note = rank_note(len(gen), n_ref if n_ref is not None else gen.shape[1], gen.shape[1], name.upper())
    if note is not None:
        block["note"] = note
    return block


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """FID of the run's images against ``eval.reference`` (its images, or ``eval.reference.stats``)."""
    kind = str(node_get(ecfg, "fid.features", "inception"))
    return MetricOutput({"fid": _fid_block("fid", kind, ecfg, ctx, use_stats=True)})


def compute_fd_dinov2(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """FD-DINOv2: the Fréchet distance in torch-fidelity's DINOv2 ViT-L/14 feature space against the reference
    images (``eval.reference.stats`` holds Inception statistics and is not used)."""
    return MetricOutput({"fd_dinov2": _fid_block("fd_dinov2", "dinov2", ecfg, ctx, use_stats=False)})


def compute_kid(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """KID of the run's images against the reference images (torch-fidelity's ``kid_features_to_metric``)."""
    kind = str(node_get(ecfg, "kid.features", "inception"))
    ext = feat.build(ecfg, kind, ctx, "eval.kid.features")
    gen = feat.generated(ext, ecfg, ctx)["features"]
    ref, ref_desc = feat.reference(ext, ecfg, ctx)
    requested = int(node_get(ecfg, "kid.subset_size", 1000))
    size = min(requested, len(gen), len(ref["features"]))
    subsets, seed = int(node_get(ecfg, "kid.subsets", 100)), int(node_get(ecfg, "kid.seed", 0))
    mean, std = kernel_inception_distance(ref["features"], gen, subsets, size, seed)
    block = {
        "value": mean,
        "std": std,
        "n": len(gen),
        "subsets": subsets,
        "subset_size": size,
        "subset_size_requested": requested,
        "seed": seed,
        "impl": KID_IMPL,
        "version": versions(),
        "features": feat.describe(ext, ctx),
        "weights": feat.describe(ext, ctx)["weights"],
        "reference": ref_desc,
        "scale": "MMD² (lower is better; papers often print ×1000)",
        "higher_is_better": False,
    }
    return MetricOutput({"kid": block})


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
