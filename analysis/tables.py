"""Paper tables from a results tree: the main table (τ, d̄, speedup, quality metrics with bootstrap CIs) and a
speedup pivot (e.g. policy × lantern), as markdown, LaTeX (booktabs) and CSV.

    python -m analysis.tables <results dir> [--out DIR] [--by model,policy] [--metrics clip_score,fid]

writes ``main.md``, ``main.tex``, ``main.csv`` (and ``speedup_pivot.md``/``.tex`` when ``--pivot`` names a
column) into ``--out`` (default: the results dir). The numbers come from :func:`adtbench.reporting.tables.aggregate`
(ratio-of-sums τ / d̄ / speedup, mean per-prompt metrics, cluster bootstrap over prompts).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adtbench.io import atomic_write_text
from adtbench.reporting.tables import aggregate, load_tree, render

__all__ = ["main_table", "pivot", "pivot_latex", "write_tables"]


def main_table(root: str | Path, by: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
               **options: Any) -> Any:  # fmt: skip
    """The aggregated main table (one row per ``by`` group) of the tree under ``root``; ``options``: ``n_boot``,
    ``ci``, ``seed`` of :func:`adtbench.reporting.tables.aggregate`."""
    return aggregate(*load_tree(root), by, metrics, **options)


def pivot(table: Any, value: str = "speedup", index: Sequence[str] = ("model", "policy"), column: str = "lantern",
          digits: int = 2) -> Any:  # fmt: skip
    """``table[value]`` laid out as ``index`` × ``column`` with "v [lo, hi]" cells (missing cells: —)."""
    import pandas as pd

    cells = table.copy()
    cells["cell"] = [
        "—" if pd.isna(v) else (f"{v:.{digits}f}" + ("" if pd.isna(lo) else f" [{lo:.{digits}f}, {hi:.{digits}f}]"))
        for v, lo, hi in zip(cells[value], cells[f"{value}_lo"], cells[f"{value}_hi"])
    ]
    out = cells.pivot_table(index=list(index), columns=column, values="cell", aggfunc="first").fillna("—")
    out.columns = [f"{column}={c}" for c in out.columns]
    return out.reset_index()


def pivot_latex(pv: Any) -> str:
    """A :func:`pivot` as LaTeX booktabs: text escaped by pandas (``escape="latex"``), value columns right-aligned."""
    n_keys = sum(1 for c in pv.columns if "=" not in str(c))
    styler = pv.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    return styler.to_latex(hrules=True, column_format="l" * n_keys + "r" * (len(pv.columns) - n_keys))


def write_tables(table: Any, out_dir: str | Path, stem: str = "main", digits: int = 3, ci: float = 0.95) -> list[Path]:
    """``<stem>.md``, ``<stem>.tex`` (booktabs) and ``<stem>.csv`` of an aggregated table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt, ext in (("md", "md"), ("latex", "tex"), ("csv", "csv")):
        p = out / f"{stem}.{ext}"
        atomic_write_text(p, render(table, fmt, digits, ci) + ("\n" if fmt != "csv" else ""))
        paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--by", default=None)
    ap.add_argument("--metrics", default=None)
    ap.add_argument("--pivot", default=None, help="column for a speedup pivot, e.g. lantern")
    ap.add_argument("--n-boot", type=int, default=1000)
    ns = ap.parse_args(sys.argv[1:] if argv is None else argv)
    table = main_table(ns.root, ns.by.split(",") if ns.by else None, ns.metrics.split(",") if ns.metrics else None,
                       n_boot=ns.n_boot)  # fmt: skip
    if len(table) == 0:
        print(f"no runs under {ns.root}", file=sys.stderr)
        return 1
    out = ns.out or ns.root
    paths = write_tables(table, out)
    if ns.pivot:
        pv = pivot(table, "speedup", [c for c in ("model", "policy") if c in table and c != ns.pivot], ns.pivot)
        atomic_write_text(out / "speedup_pivot.md", pv.to_markdown(index=False) + "\n")
        atomic_write_text(out / "speedup_pivot.tex", pivot_latex(pv))
        paths += [out / "speedup_pivot.md", out / "speedup_pivot.tex"]
    print(render(table, "md"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
