"""The metrics ``eval.metrics`` can name (:data:`METRICS`) and the up-front check of their configs (:func:`validate`).

Each metric module registers here as a :class:`Metric` (``validate`` without loading anything, ``compute`` its
summary blocks); :mod:`adtbench.harness.eval.runner` runs the selected ones on a run dir.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Sibling modules by their full names, never ``from adtbench.harness.eval import ...``: the package's __init__
# imports this module, so reading its namespace from here would be an import cycle (tests/test_architecture.py).
import adtbench.harness.eval.aesthetic as aesthetic
import adtbench.harness.eval.clip_score as clip_score
import adtbench.harness.eval.export as export
import adtbench.harness.eval.fid as fid
import adtbench.harness.eval.hps as hps
import adtbench.harness.eval.mini as mini
import adtbench.harness.eval.prc as prc
from adtbench.harness.eval.common import node_get
from adtbench.harness.eval.context import EvalContext, MetricOutput
from adtbench.registry import Registry

__all__ = ["METRICS", "Metric", "selected", "validate"]

log = logging.getLogger(__name__)


Validator = Callable[[Any], None]
Computer = Callable[[Any, EvalContext], MetricOutput]


@dataclass(frozen=True)
class Metric:
    """One ``eval.metrics`` entry: ``validate(eval_node)`` checks its config and weight paths without loading
    anything; calling it, ``metric(eval_node, ctx)``, computes its summary blocks."""

    validate: Validator
    compute: Computer

    def __call__(self, ecfg: Any, ctx: EvalContext) -> MetricOutput:
        return self.compute(ecfg, ctx)


METRICS: Registry[MetricOutput] = Registry("eval.metrics")
"""metric name → :class:`Metric` (``METRICS.get(name).validate``, ``METRICS.build(name, ecfg, ctx)``)."""
for _name, _metric in (
    ("clip", Metric(clip_score.validate, clip_score.compute)),
    ("hps", Metric(hps.validate, hps.compute)),
    ("aesthetic", Metric(aesthetic.validate, aesthetic.compute)),
    ("fid", Metric(fid.validate, fid.compute)),
    ("is", Metric(fid.validate_is, fid.compute_is)),
    ("kid", Metric(fid.validate_kid, fid.compute_kid)),
    ("fd_dinov2", Metric(fid.validate_fd_dinov2, fid.compute_fd_dinov2)),
    ("prc", Metric(prc.validate, prc.compute)),
    ("mini", Metric(mini.validate, mini.compute)),
    ("geneval", Metric(export.validate_geneval, export.geneval)),
    ("dpg", Metric(export.validate_dpg, export.dpg)),
):
    METRICS.register(_name, _metric)


def selected(cfg: Any) -> list[str]:
    """The metric names of ``cfg.eval`` (empty for ``eval=none``); unknown names are a ConfigError naming
    ``eval.metrics`` and the known metrics."""
    ecfg = cfg.get("eval") if hasattr(cfg, "get") else None
    if ecfg is None or str(node_get(ecfg, "kind", "none")) == "none":
        return []
    names = [str(m) for m in (node_get(ecfg, "metrics", []) or [])]
    for m in names:
        METRICS.get(m)
    return names


SET_METRICS = ("fid", "prc", "is", "kid", "fd_dinov2")


def validate(cfg: Any, inject: dict[str, Any] | None = None) -> list[str]:
    """Check every selected metric without loading anything (call it before a long decode so that a missing package
    or a bad file fails in seconds): the Python packages it imports (``weights.require_packages``: key
    ``eval.<metric>``, the pip extra), then its config, weight files (format, size, sha256 of known files:
    ``weights.check_weight_file``) and reference. Injected modules stand in for their packages and weights.
    Returns the metric names."""
    from adtbench.harness.eval.weights import require_packages

    names = selected(cfg)
    inject = inject or {}
    stand_ins = {"clip": "clip", "hps": "hps", "mini": "mini", "aesthetic": "aesthetic_mlp"}
    for name in names:
        if stand_ins.get(name) in inject or (name in SET_METRICS and _extractor_injected(cfg, name, inject)):
            continue
        require_packages(name)
        _metric_of(name).validate(cfg.eval)
    return names


def _metric_of(name: str) -> Metric:
    entry = METRICS.get(name)
    assert isinstance(entry, Metric)
    return entry


def _extractor_injected(cfg: Any, name: str, inject: dict[str, Any]) -> bool:
    kind = {
        "fid": node_get(cfg.eval, "fid.features", "inception"),
        "is": "inception",
        "kid": node_get(cfg.eval, "kid.features", "inception"),
        "fd_dinov2": "dinov2",
        "prc": node_get(cfg.eval, "prc.features", "inception"),
    }[name]
    return f"extractor:{kind}" in inject
