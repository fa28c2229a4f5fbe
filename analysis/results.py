"""Load any adtbench results tree (single runs, multiruns, shards, merged runs) into pandas DataFrames.

Notebook API over :mod:`adtbench.harness.rundir` (the walker and readers of a run dir) and
:mod:`adtbench.reporting.tables` (the loader behind ``adtbench table``); nothing here reads a file on its own::

    from analysis.results import load
    runs, samples = load("outputs/multiruns/2026-11-20/12-00-00")

``runs``: one row per job dir (choices, τ, d̄, speedup, latency, evaluated metrics, ``ov.<key>`` overrides);
``samples``: one row per generated image (per-prompt counters, latencies, per-prompt metrics). A merged run
supersedes the shard dirs it was built from. Files are only read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from adtbench.harness.rundir import find_runs, read_run_maps
from adtbench.reporting.tables import aggregate, load_tree

__all__ = ["acceptance_grids", "aggregate", "find_runs", "load", "load_runs", "load_samples"]


def load(root: str | Path) -> tuple[Any, Any]:
    """(runs, samples) DataFrames of the tree under ``root``."""
    return load_tree(root)


def load_runs(root: str | Path) -> Any:
    """The per-run DataFrame only."""
    return load_tree(root)[0]


def load_samples(root: str | Path) -> Any:
    """The per-sample DataFrame only."""
    return load_tree(root)[1]


def acceptance_grids(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """A run's per-position maps (``maps/run_maps.json``: accept, depth, width) as float arrays (NaN where no
    cycle covered a cell); None when the run wrote no maps (``maps.per_run=false``)."""
    doc = read_run_maps(run_dir)
    if doc is None:
        return None
    out = {}
    for kind in ("accept", "depth", "width"):
        if kind in doc:
            out[kind] = np.array([[np.nan if v is None else float(v) for v in row] for row in doc[kind]])
    return out
