"""``adtbench`` console script.

adtbench [hydra overrides]                     decode (the Hydra app; same as ``python run.py``)
adtbench run [hydra overrides]                 the same
adtbench bench overhead|cost|probe|speed|versus|batch [overrides]   benchmarks (adtbench.tools.bench)
adtbench bench count [overrides]               aten ops of one target step, per decoder layer (tools.bench_count)
adtbench train vq|ar|drafter|evaluator ...     training pipeline (Hydra configs under conf/train/)
adtbench make-tiny model=<family> out=DIR      write a tiny random checkpoint in a real on-disk layout
adtbench eval <run dir | tree> eval=<preset>   quality metrics on existing run dirs
adtbench merge <shard dirs | array dir> --out DIR   merge prompt shards into one run
adtbench table <results dir> [...]             paper tables from a results tree
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "bench": "adtbench.tools.bench",
    "train": "adtbench.tools.train.cli",
    "make-tiny": "adtbench.tools.make_tiny",
    "eval": "adtbench.harness.eval",
    "merge": "adtbench.reporting.merge",
    "table": "adtbench.reporting.tables",
}
BENCH_SUBCOMMANDS = {"count": "adtbench.tools.bench_count"}  # ``adtbench bench count``: not a ``tools.bench`` mode


def main() -> None:
    from adtbench import accel

    accel.activate_from_env()  # ADTBENCH_SIMULATE_DEVICE=cuda: every command on the simulated CUDA device
    args = sys.argv[1:]
    if args[:1] == ["bench"] and args[1:2] and args[1] in BENCH_SUBCOMMANDS:
        sys.exit(importlib.import_module(BENCH_SUBCOMMANDS[args[1]]).main(args[2:]))
    if args and args[0] in SUBCOMMANDS:
        try:
            module = importlib.import_module(SUBCOMMANDS[args[0]])
        except ModuleNotFoundError as e:
            if e.name is not None and e.name.startswith("adtbench"):
                print(f"adtbench: '{args[0]}' is not available in this version ({e.name} missing)", file=sys.stderr)
                sys.exit(2)
            raise
        sys.exit(module.main(args[1:]))
    if args and args[0] == "run":
        sys.argv = [sys.argv[0], *args[1:]]
    from adtbench.harness.app import main as app_main

    app_main()


if __name__ == "__main__":
    main()
