"""The state one evaluation shares across metrics: device, batch size, caches, injected modules, results."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from adtbench.harness.eval.common import EvalSample


@dataclass
class MetricOutput:
    """What one metric module returns.

    ``entries``: summary blocks, ``{block name: {"value": ..., "impl": ..., "version": ..., "weights": ...,
    "scale": ..., ...}}`` (a metric module may fill several blocks, e.g. ``fid`` and ``is``).
    ``per_prompt``: ``{column: {prompt_id: value}}`` for metrics defined per image (CLIP score, HPS, ...).
    """

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_prompt: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class EvalContext:
    """Everything a metric needs besides its own config node.

    ``inject`` replaces loaded models (tests, notebooks): ``"clip"``/``"hps"``/``"aesthetic_clip"`` →
    :class:`~adtbench.harness.eval.clip_score.ClipBundle`; ``"aesthetic_mlp"`` → an ``nn.Module``;
    ``"extractor:<kind>"`` → a :class:`~adtbench.harness.eval.features.Extractor`; ``"mini"`` → a mini evaluator.
    """

    run_dir: Path
    samples: list[EvalSample]
    device: torch.device
    batch_size: int
    cache_dir: Path | None
    inject: dict[str, Any] = field(default_factory=dict)
    progress: bool = False  # tqdm bars on stderr (the config's ``progress``)
    # memo: loaded models and extracted features, shared between metrics of one evaluation
    memo: dict[Any, Any] = field(default_factory=dict)
