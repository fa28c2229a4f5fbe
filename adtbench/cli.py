"""``adtbench`` console script.

adtbench [hydra overrides]            decode (the Hydra app; same as ``python run.py``)
adtbench bench overhead [overrides]   engine overhead per cycle (time outside target/drafter forwards)
"""

from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "bench":
        from adtbench.bench import main as bench_main

        sys.exit(bench_main(args[1:]))
    if args and args[0] == "run":
        sys.argv = [sys.argv[0], *args[1:]]
    from adtbench.app import main as app_main

    app_main()
