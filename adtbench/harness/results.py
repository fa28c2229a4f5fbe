"""Former home of the run-directory store and statistics, now :mod:`adtbench.harness.rundir`; kept as a re-export so
existing imports keep working. New code imports from :mod:`adtbench.harness.rundir` (or :mod:`adtbench.io` for writes).
"""

from __future__ import annotations

from adtbench.harness.rundir import (
    BOOT_CHUNK_ELEMENTS,
    IMAGES_DIR,
    SAMPLES_FILE,
    SPEEDUP_CI_LEVEL,
    SPEEDUP_CI_METHOD,
    SPEEDUP_CI_MIN_PROMPTS,
    SPEEDUP_CI_SEED,
    SPEEDUP_N_BOOT,
    SUMMARY_FILE,
    TRACE_FILE,
    ResultStore,
    bootstrap_ci,
    bootstrap_distribution,
    percentile_interval,
    ratio_of_totals_ci,
    summarize,
    to_jsonable,
)

__all__ = [
    "BOOT_CHUNK_ELEMENTS",
    "IMAGES_DIR",
    "SAMPLES_FILE",
    "SPEEDUP_CI_LEVEL",
    "SPEEDUP_CI_METHOD",
    "SPEEDUP_CI_MIN_PROMPTS",
    "SPEEDUP_CI_SEED",
    "SPEEDUP_N_BOOT",
    "SUMMARY_FILE",
    "TRACE_FILE",
    "ResultStore",
    "bootstrap_ci",
    "bootstrap_distribution",
    "percentile_interval",
    "ratio_of_totals_ci",
    "summarize",
    "to_jsonable",
]
