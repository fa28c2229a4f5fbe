#!/usr/bin/env bash
# Host reads and engine ops per draft–verify cycle (`adtbench bench overhead bench.count=true`) for the rows of the
# "What a cycle asks of the device" section of docs/speed.md: the default run (SCD, window=cost: a cycle is a forward),
# the static sampled tree, EAGLE-2, ADT-Tree (budget cost and fixed) and experiment=mini_lantern on model=mini; the
# default, EAGLE-2 and ADT-Tree on model=tiny_chameleon. Counts do not depend on the
# machine's load (no timing). One JSON per row in $OUT, then the markdown table on stdout.
# Usage:  benchmarks/count.sh                       (PY=.venv/bin/python OUT=outputs/count PROMPTS=4)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/count}
PROMPTS=${PROMPTS:-4}
mkdir -p "$OUT"
rows=(
    "mini|default (SCD, window=cost)|"
    "mini|static sampled tree|policy=static_sampled"
    "mini|eagle2|policy=eagle2"
    "mini|adt (cost)|policy=adt"
    "mini|adt (fixed)|policy=adt policy.budget=fixed"
    "mini|mini_lantern|experiment=mini_lantern"
    "tiny_chameleon|default|"
    "tiny_chameleon|eagle2|policy=eagle2"
    "tiny_chameleon|adt (cost)|policy=adt"
    "tiny_chameleon|adt (fixed)|policy=adt policy.budget=fixed"
)
for row in "${rows[@]}"; do
    IFS='|' read -r model name over <<< "$row"
    file="$OUT/${model}_$(echo "$name" | tr -c 'a-z0-9\n' '_').json"
    # shellcheck disable=SC2086
    "$PY" -m adtbench.cli bench overhead "model=$model" $over bench.count=true "bench.prompts=$PROMPTS" threads=1 \
        "bench.out=$file" > /dev/null
    echo "$model|$name|$file"
done | "$PY" -c '
import json, sys
print("| model | policy | host reads / cycle | engine ops / cycle | of them kernels | cycles |")
print("|---|---|---:|---:|---:|---:|")
for line in sys.stdin:
    model, name, path = line.rstrip("\n").split("|")
    r = json.load(open(path))
    reads, ops = r["host_reads_per_cycle"], r["engine_ops_per_cycle"]
    kernels = r["engine_kernels_per_cycle"]
    print("| %s | %s | %.2f | %.1f | %.1f | %d |" % (model, name, reads, ops, kernels, r["cycles"]))
'
