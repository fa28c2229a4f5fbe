"""Markdown table of a Hydra multirun: one row per job (policy, lantern, τ, d̄, speedup, latency).

    python analysis/sweep_table.py <multirun_dir>

A thin CLI over :mod:`adtbench.harness.rundir`: :func:`~adtbench.harness.rundir.find_runs`
walks ``<multirun_dir>`` for every
job's ``summary.json`` (written by the app, always current; natural job order) and the job's command-line
overrides come from its ``.hydra/overrides.yaml``. τ includes the bonus token, d̄ is the
mean drafted depth, speedup the ratio of mean latencies vs the AR baseline timed in the same job, latency the
mean per-image latency (algorithms.md §1.2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from adtbench.harness.rundir import find_runs, lantern_choice, read_override_list, read_summary

COLUMNS = ("job", "policy", "lantern", "τ", "d̄", "speedup", "latency (s)")
NUMERIC = frozenset({"τ", "d̄", "speedup", "latency (s)"})  # right-aligned (markdown ``---:``)


def load_summaries(root: str | Path) -> list[dict[str, Any]]:
    """Every ``summary.json`` under ``root`` (job order), each with ``job_dir`` and ``overrides`` added."""
    out = []
    for d in find_runs(root):
        s: dict[str, Any] = dict(read_summary(d))
        s["job_dir"] = str(d)
        s["overrides"] = read_override_list(d)
        out.append(s)
    return out


def _fmt(v: Any, digits: int) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def table_rows(summaries: list[dict[str, Any]]) -> list[list[str]]:
    """One row of strings per summary, in ``COLUMNS`` order."""
    return [
        [
            Path(s.get("job_dir", "")).name,
            str(s.get("policy")),
            lantern_choice(s),
            _fmt(s.get("tau"), 3),
            _fmt(s.get("d_bar"), 2),
            _fmt(s.get("speedup"), 3),
            _fmt(s.get("latency_s"), 4),
        ]
        for s in summaries
    ]


def markdown_table(summaries: list[dict[str, Any]]) -> str:
    """The rows of :func:`table_rows` as a markdown table; numeric columns right-aligned."""
    sep = "|" + "|".join("---:" if c in NUMERIC else "---" for c in COLUMNS) + "|"
    lines = ["| " + " | ".join(COLUMNS) + " |", sep]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(summaries)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python analysis/sweep_table.py <multirun_dir>", file=sys.stderr)
        return 2
    summaries = load_summaries(args[0])
    if not summaries:
        print(f"no summary.json under {args[0]}", file=sys.stderr)
        return 1
    print(markdown_table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
