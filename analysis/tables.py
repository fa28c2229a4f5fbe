"""Paper table files from a results tree: ``adtbench table`` (:mod:`adtbench.reporting.tables`) writing its files.

    python -m analysis.tables <results dir> [--out DIR] [--by model,policy] [--metrics clip_score,fid]
        [--pivot lantern] [--n-boot 1000]

is ``adtbench table <results dir> --write DIR`` (DIR: ``--out``, default the results dir): ``main.md``,
``main.tex`` (booktabs) and ``main.csv`` with bootstrap CIs, and with ``--pivot COLUMN`` the speedup pivot
``speedup_pivot.md`` / ``.tex``; the markdown table is printed. The notebook API (``main_table``, ``pivot``,
``pivot_latex``, ``write_tables``) is the one of :mod:`adtbench.reporting.tables`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adtbench.reporting.load import load_tree
from adtbench.reporting.tables import aggregate, pivot, pivot_latex, write_tables
from adtbench.reporting.tables import main as table_main

__all__ = ["main_table", "pivot", "pivot_latex", "write_tables"]


def main_table(root: str | Path, by: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
               **options: Any) -> Any:  # fmt: skip
    """The aggregated main table (one row per ``by`` group) of the tree under ``root``; ``options``: ``n_boot``,
    ``ci``, ``seed`` of :func:`adtbench.reporting.tables.aggregate`."""
    return aggregate(*load_tree(root), by, metrics, **options)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--by", default=None)
    ap.add_argument("--metrics", default=None)
    ap.add_argument("--pivot", default=None, help="column for a speedup pivot, e.g. lantern")
    ap.add_argument("--n-boot", type=int, default=1000)
    ns = ap.parse_args(sys.argv[1:] if argv is None else argv)
    args = [str(ns.root), "--write", str(ns.out or ns.root), "--n-boot", str(ns.n_boot)]
    for flag, value in (("--by", ns.by), ("--metrics", ns.metrics), ("--pivot", ns.pivot)):
        args += [flag, value] if value else []
    return table_main(args)


if __name__ == "__main__":
    sys.exit(main())
