"""Load any adtbench results tree (single runs, multiruns, shards, merged runs) into pandas DataFrames.

Notebook API over :mod:`adtbench.harness.rundir` (the walker and readers of a run dir) and
:mod:`adtbench.reporting.tables` (the loader behind ``adtbench table``); nothing here reads a file on its own::

    from analysis.results import load
    runs, samples = load("outputs/multiruns/2026-11-20/12-00-00")

``runs``: one row per job dir (choices, τ, d̄, speedup, latency, evaluated metrics, ``ov.<key>`` overrides);
``samples``: one row per generated image (per-prompt counters, latencies, per-prompt metrics). A merged run
supersedes the shard dirs it was built from. Files are only read.

A results dir given as a relative path (``ADTBENCH_SWEEP=outputs/multiruns/…`` for the notebook) is taken against
the checkout, as every relative path of the app (:func:`results_dir`), not against the notebook's own folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from adtbench.harness.rundir import find_runs
from adtbench.reporting.load import load_tree
from adtbench.reporting.plots import acceptance_grids
from adtbench.reporting.tables import aggregate
from adtbench.resources import root_dir

__all__ = ["acceptance_grids", "aggregate", "find_runs", "load", "load_runs", "load_samples", "results_dir"]


def results_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """``path`` as an absolute results dir: a relative one is taken against ``paths.root_dir``'s default (the
    checkout, or ``$ADTBENCH_ROOT``: :func:`adtbench.resources.root_dir`), where the app writes ``outputs/``;
    None → ``<root>/outputs/multiruns``."""
    root = root_dir()
    if path is None or str(path) == "":
        return root / "outputs" / "multiruns"
    p = Path(path).expanduser()
    return p if p.is_absolute() else root / p


def load(root: str | Path) -> tuple[Any, Any]:
    """(runs, samples) DataFrames of the tree under ``root``; ``FileNotFoundError`` naming ``root`` when it holds
    no run (no ``summary.json`` at or below it), so an empty or mistyped results dir is not an empty table."""
    runs, samples = load_tree(root)
    if len(runs) == 0:
        what = "does not exist" if not Path(root).exists() else "holds no run (no summary.json at or below it)"
        raise FileNotFoundError(f"results dir {Path(root).absolute()} {what}; run a sweep first (python run.py -m ...) "
                                "or point ADTBENCH_SWEEP at one")  # fmt: skip
    return runs, samples


def load_runs(root: str | Path) -> Any:
    """The per-run DataFrame only."""
    return load_tree(root)[0]


def load_samples(root: str | Path) -> Any:
    """The per-sample DataFrame only."""
    return load_tree(root)[1]
