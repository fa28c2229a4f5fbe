"""One row per job of a Hydra multirun: ``adtbench table <multirun_dir> --by job,policy,lantern``.

    python analysis/sweep_table.py <multirun_dir>

τ includes the bonus token, d̄ is the mean drafted depth, speedup the ratio of total latencies vs the AR baseline
timed in the same job, latency the mean per-image latency (algorithms.md §1.2), each with its bootstrap CI over
the job's prompts (:mod:`adtbench.reporting.tables`, the one table command).
"""

from __future__ import annotations

import sys

BY = "job,policy,lantern"


def main(argv: list[str] | None = None) -> int:
    from adtbench.reporting.tables import main as table_main

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python analysis/sweep_table.py <multirun_dir>", file=sys.stderr)
        return 2
    return table_main([args[0], "--by", BY])


if __name__ == "__main__":
    sys.exit(main())
