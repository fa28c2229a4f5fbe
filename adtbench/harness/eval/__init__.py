"""The evaluation stage: score a run's images after decoding (same job) or later on an existing run dir.

    adtbench eval <run_dir | results tree> [hydra overrides]      # e.g. eval=clip eval.clip.pretrained=/w/clip.bin
    python -m adtbench.harness.eval <run_dir | results tree> [overrides]  # the same

``eval.metrics`` (set by the ``eval=`` preset) lists the metrics, run in order (metric → summary blocks):

- ``clip`` → ``clip_score`` (also per prompt) — :mod:`adtbench.harness.eval.clip_score`
- ``hps`` → ``hpsv21`` / ``hpsv2`` (also per prompt) — :mod:`adtbench.harness.eval.hps`
- ``aesthetic`` → ``aesthetic`` (also per prompt) — :mod:`adtbench.harness.eval.aesthetic`
- ``fid`` → ``fid`` (against ``eval.reference``: images or precomputed statistics); ``is`` → ``is``; ``kid`` → ``kid``;
  ``fd_dinov2`` → ``fd_dinov2`` — :mod:`adtbench.harness.eval.fid`
- ``prc`` → ``precision``, ``recall`` (improved P&R, k = 3, Inception features: ADM's suite) —
  :mod:`adtbench.harness.eval.prc`
- ``mini`` → ``mini_agreement`` (+ ``mini_fid`` / ``mini_precision`` / ``mini_recall``) — :mod:`.mini`
- ``geneval`` / ``dpg`` → exports for GenEval / DPG-Bench — :mod:`adtbench.harness.eval.export`

Every block records ``value``, ``n``, the implementation and its version, the weights file (path + sha256)
and the scale; ``summary["eval"]["values"]`` maps block → value. Per-prompt scores go to
``eval_samples.jsonl`` (one line per prompt id); the whole block also to ``eval.json``. Images are paired
with prompts by ``prompt_id`` through ``samples.jsonl``. Before any model loads, each metric's packages and weight
files (format, size, sha256 of known files) are checked (:mod:`adtbench.harness.eval.weights`); a failure is a
``ConfigError`` naming the key.
"""

from __future__ import annotations

from adtbench.harness.eval.metrics import METRICS, Metric, selected, validate
from adtbench.harness.eval.runner import eval_line, find_run_dirs, main, run_eval
from adtbench.harness.rundir import EVAL_FILE, EVAL_SAMPLES_FILE

__all__ = [
    "EVAL_FILE", "EVAL_SAMPLES_FILE", "METRICS", "Metric", "eval_line", "find_run_dirs", "main", "run_eval",
    "selected", "validate",
]  # fmt: skip
