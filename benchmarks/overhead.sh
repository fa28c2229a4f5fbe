#!/usr/bin/env bash
# Engine overhead per cycle for every tiny model × drafting policy, and the mini model (the README table).
set -euo pipefail
cd "$(dirname "$0")/.."
for model in tiny_llamagen tiny_chameleon; do
  for policy in eagle2 static chain; do
    .venv/bin/adtbench bench overhead "model=${model}" "policy=${policy}" dataset=smoke threads=1 "$@" | tail -1
  done
done
for policy in eagle2 chain; do
  .venv/bin/adtbench bench overhead model=mini "policy=${policy}" dataset=mini_quick threads=2 "$@" | tail -1
done
