#!/usr/bin/env bash
# The speed table of docs/speed.md: one app job per row, 20 held-out mini prompts, AR baseline in each job.
# Run on an idle machine (the table records the load averages); extra arguments go to every job.
set -euo pipefail
cd "$(dirname "$0")/.."
uptime
.venv/bin/adtbench bench speed bench.prompts=20 bench.readme=docs/speed.md "$@"
