"""Improved precision and recall (Kynkäänniemi et al., 2019) on image features, k = 3 by default.

Each set's manifold is the union of balls centred at its points with radius = the distance to the point's
k-th nearest neighbour within the same set (the point itself excluded). Precision = fraction of generated
points inside the reference manifold; recall = fraction of reference points inside the generated manifold.
A point on a ball's boundary counts as inside (``≤``, as in the paper's reference code; ``prdc`` uses ``<``,
which differs only on exact ties). Distances are Euclidean, computed in float64 in row blocks.
"""

from __future__ import annotations

from typing import Any

import torch

from adtbench.eval import features as feat
from adtbench.eval.common import node_get, package_version
from adtbench.eval.context import EvalContext, MetricOutput

_BLOCK = 1024


def knn_radii(x: torch.Tensor, k: int) -> torch.Tensor:
    """Distance of every row of ``x`` to its k-th nearest other row (self excluded)."""
    if len(x) <= k:
        raise ValueError(f"need more than k={k} points per set, got {len(x)}")
    out = []
    for i in range(0, len(x), _BLOCK):
        d = torch.cdist(x[i : i + _BLOCK], x)
        # the k+1 smallest include the point itself (distance 0): take the (k+1)-th
        out.append(d.topk(k + 1, dim=1, largest=False).values[:, k])
    return torch.cat(out)


def _covered(points: torch.Tensor, centres: torch.Tensor, radii: torch.Tensor) -> torch.Tensor:
    """Bool per row of ``points``: inside at least one ball (centre, radius)."""
    hits = []
    for i in range(0, len(points), _BLOCK):
        d = torch.cdist(points[i : i + _BLOCK], centres)
        hits.append((d <= radii.unsqueeze(0)).any(dim=1))
    return torch.cat(hits)


def precision_recall(real: torch.Tensor, fake: torch.Tensor, k: int = 3) -> tuple[float, float]:
    """Improved (precision, recall) of ``fake`` against ``real`` (feature rows ``[N, d]``, ``[M, d]``)."""
    real, fake = real.double(), fake.double()
    if real.ndim != 2 or fake.ndim != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(f"feature sets must be [N, d] with equal d, got {tuple(real.shape)} and {tuple(fake.shape)}")
    precision = _covered(fake, real, knn_radii(real, k)).double().mean().item()
    recall = _covered(real, fake, knn_radii(fake, k)).double().mean().item()
    return precision, recall


def validate(ecfg: Any) -> None:
    from adtbench.eval.common import reference_files

    feat.validate(ecfg, str(node_get(ecfg, "prc.features", "vgg16")), "eval.prc.features")
    reference_files(node_get(ecfg, "reference"))


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Improved precision / recall of the run's images against ``eval.reference``."""
    kind = str(node_get(ecfg, "prc.features", "vgg16"))
    k = int(node_get(ecfg, "prc.k", 3))
    ext = feat.build(ecfg, kind, ctx, "eval.prc.features")
    gen = feat.generated(ext, ecfg, ctx)["features"]
    ref, ref_desc = feat.reference(ext, ecfg, ctx)
    common = {
        "n": len(gen),
        "k": k,
        "impl": "adtbench improved precision/recall (Kynkäänniemi et al. 2019; inside = distance ≤ k-NN radius)",
        "version": {"torch": torch.__version__, "torch-fidelity": package_version("torch-fidelity")},
        "features": feat.describe(ext, ctx),
        "weights": feat.describe(ext, ctx)["weights"],
        "reference": ref_desc,
        "scale": "fraction in [0, 1]",
        "higher_is_better": True,
    }
    if min(len(gen), len(ref["features"])) <= k:
        reason = f"needs more than k={k} images in each set (generated {len(gen)}, reference {len(ref['features'])})"
        skipped = common | {"value": None, "skipped": reason}
        return MetricOutput({"precision": skipped, "recall": dict(skipped)})
    p, r = precision_recall(ref["features"], gen, k)
    return MetricOutput({"precision": common | {"value": p}, "recall": common | {"value": r}})
