"""Experiment-tracking sinks. Local files (samples.jsonl, summary.json) are always the source of truth;
a tracker only mirrors them and must never make a job fail.

``build_logger(cfg, run_dir, choices)`` returns an object with ``log_sample(record, trace, image)``,
``log_summary(summary)`` and ``finish()``. ``logger=none`` gives ``NullLogger``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class NullLogger:
    def log_sample(self, record: dict, trace: dict, image: Any) -> None:
        pass

    def log_summary(self, summary: dict) -> None:
        pass

    def finish(self) -> None:
        pass


def build_logger(cfg: Any, run_dir: Path, choices: dict[str, Any]) -> Any:
    kind = str(cfg.logger.get("kind", "none"))
    if kind == "none":
        return NullLogger()
    from adtbench.errors import ConfigError

    raise ConfigError("logger.kind", f"unknown logger {kind!r}")
