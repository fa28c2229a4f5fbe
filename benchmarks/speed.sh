#!/usr/bin/env bash
# The speed table of docs/speed.md (and the README's results table): one app job per row, 20 held-out mini prompts,
# AR baseline in each job; one raw result file per row under results/<device>/speed/ (per-prompt latencies, τ, the
# load, commit, device, torch, prompt ids, date), then `adtbench results` renders the tables from results/.
# Run on an idle machine (each file records the load averages); extra arguments go to every job. Commit results/ and
# the rendered docs together; what a rerun replaced goes to CHANGELOG.md.
set -euo pipefail
cd "$(dirname "$0")/.."
uptime
.venv/bin/adtbench bench speed bench.prompts=20 bench.results=results "$@"
uptime
.venv/bin/adtbench results
