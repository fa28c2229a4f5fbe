#!/usr/bin/env bash
# The no-regression rule (docs/development.md): every speed-table row, BASE's code against the working tree's, in
# alternating jobs (ABBA across rounds) on held-out mini prompts, each job timing its own AR baseline.
#   benchmarks/compare.sh BASE [ROWS...] [--rounds 2] [--prompts 12] [--offset 4] [--out DIR] [-- app overrides]
# BASE: a commit (e.g. HEAD~1, main) or a checkout's path. PYTHON: the interpreter (default: the checkout's .venv).
# Run on a quiet machine; the table gives the load averages around every row.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
uptime
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m adtbench.tools.bench_compare "$@"
