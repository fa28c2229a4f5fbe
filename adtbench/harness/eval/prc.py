"""Improved precision and recall (Kynkäänniemi et al., 2019) on image features, k = 3 by default, computed by
torch-fidelity's own ``metric_prc.prc_features_to_metric`` (the features come from our injectable extractors,
:mod:`adtbench.harness.eval.features`).

Feature space (``eval.prc.features``): ``inception`` by default — the 2048-d pool3 features of the FID Inception, the
protocol of ADM's evaluator suite (``evaluations/evaluator.py``: FID, IS, precision and recall with k = 3 on the same
pool features), which LlamaGen and LANTERN report; ``vgg16`` (``fc2_relu``) is the feature space of Kynkäänniemi
et al.'s paper and of torch-fidelity's own default.

Each set's manifold is the union of balls centred at its points with radius = the distance to the point's
k-th nearest neighbour within the same set (the point itself excluded: torch-fidelity's ``kthvalue(k + 1)``).
Precision = fraction of generated points inside the reference manifold; recall = fraction of reference points
inside the generated manifold. A point on a ball's boundary counts as inside (``≤``, as in torch-fidelity and
the paper's reference code; ``prdc`` uses ``<``, which differs only on exact ties). Distances are Euclidean,
computed in float64.
"""

from __future__ import annotations

from typing import Any

import torch

import adtbench.harness.eval.features as feat
from adtbench.harness.eval.common import node_get, package_version
from adtbench.harness.eval.context import EvalContext, MetricOutput

_BLOCK = 10000  # torch-fidelity's prc_batch_size default
IMPL = "torch-fidelity prc_features_to_metric (improved P&R, Kynkäänniemi et al. 2019; inside = ≤ k-NN radius)"


def precision_recall(real: torch.Tensor, fake: torch.Tensor, k: int = 3) -> tuple[float, float]:
    """Improved (precision, recall) of ``fake`` against ``real`` (feature rows ``[N, d]``, ``[M, d]``; each set
    needs more than ``k`` rows), by torch-fidelity in float64."""
    from torch_fidelity.metric_prc import KEY_METRIC_PRECISION, KEY_METRIC_RECALL, prc_features_to_metric

    real, fake = real.detach().double().cpu(), fake.detach().double().cpu()
    if real.ndim != 2 or fake.ndim != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(f"feature sets must be [N, d] with equal d, got {tuple(real.shape)} and {tuple(fake.shape)}")
    if min(len(real), len(fake)) <= k:
        raise ValueError(f"need more than k={k} points per set, got {len(real)} and {len(fake)}")
    out = prc_features_to_metric(  # torch-fidelity's convention: features_1 = generated, features_2 = real
        fake, real, prc_neighborhood=int(k), prc_batch_size=_BLOCK, save_cpu_ram=False, verbose=False
    )
    return float(out[KEY_METRIC_PRECISION]), float(out[KEY_METRIC_RECALL])


def validate(ecfg: Any) -> None:
    from adtbench.harness.eval.common import reference_source

    feat.validate(ecfg, str(node_get(ecfg, "prc.features", "inception")), "eval.prc.features")
    reference_source(node_get(ecfg, "reference"))


def compute(ecfg: Any, ctx: EvalContext) -> MetricOutput:
    """Improved precision / recall of the run's images against ``eval.reference``."""
    kind = str(node_get(ecfg, "prc.features", "inception"))
    k = int(node_get(ecfg, "prc.k", 3))
    ext = feat.build(ecfg, kind, ctx, "eval.prc.features")
    gen = feat.generated(ext, ecfg, ctx)["features"]
    ref, ref_desc = feat.reference(ext, ecfg, ctx)
    common = {
        "n": len(gen),
        "k": k,
        "impl": IMPL,
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
