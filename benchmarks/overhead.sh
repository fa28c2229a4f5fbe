#!/usr/bin/env bash
# Engine overhead per cycle on the mini model (the table in docs/speed.md): the default run (SCD, window=cost) and SCD at
# L = 16 (a cycle is one forward), the static sampled tree, the same tree gated (gate_tokens 2.2), adt with sampled
# drafts, adt (budget: cost), adt with the fixed 58-node tree, eagle2, and the sampled 3-chain with LANTERN at δ 0.3
# (experiment=mini_lantern); 8 held-out prompts, 1 thread. Extra arguments are passed to every job.
set -euo pipefail
cd "$(dirname "$0")/.."
uptime
for policy in "policy=scd_cost" "policy=scd" "policy=static_sampled" "policy=static_sampled policy.gate_tokens=2.2" "policy=adt policy.draft_sampling=sample" "policy=adt" "policy=adt policy.budget=fixed" "policy=eagle2" "experiment=mini_lantern"; do
  # shellcheck disable=SC2086
  .venv/bin/adtbench bench overhead model=mini ${policy} dataset=mini bench.prompts=8 threads=1 "$@" | tail -1
done
