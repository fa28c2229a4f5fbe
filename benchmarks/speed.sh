#!/usr/bin/env bash
# The speed table of docs/speed.md (and the README's results table): one app job per row, PROMPTS held-out mini prompts
# (default 12: the committed table's), the AR baseline and its A/A control in each job; one raw result file per row under results/<device>/speed/ (per-prompt latencies, τ, the
# load, commit, device, torch, prompt ids, date), then `adtbench results` renders the tables from results/.
# Run on an idle machine (each file records the load averages); extra arguments go to every job. Commit results/ and
# the rendered docs together; what a rerun replaced goes to CHANGELOG.md.
set -euo pipefail
cd "$(dirname "$0")/.."
uptime
PROMPTS=${PROMPTS:-12}
.venv/bin/adtbench bench speed bench.prompts="$PROMPTS" bench.results=results "$@"
uptime
.venv/bin/adtbench results
