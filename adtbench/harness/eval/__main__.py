"""``python -m adtbench.harness.eval <run_dir | results tree> [hydra overrides]`` (same as ``adtbench eval``)."""

import sys

from adtbench.harness.eval import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
