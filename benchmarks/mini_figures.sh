#!/usr/bin/env bash
# Every figure of the mini model card and docs/mini_model.md from the shipped weights (after a retraining,
# jobs/train_mini.sh): cost ratios, the sample grid + caption agreement, the two policy sweeps, the diagnosis,
# then the card. 1 thread; run on an idle machine (the sweeps' summaries record the load). The speed table
# (benchmarks/speed.sh) and the MuLo-SD table (benchmarks/mulo.sh) are separate scripts.
#   benchmarks/mini_figures.sh [OUT=outputs/mini_figures]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/mini_figures}
PY=.venv/bin/python
mkdir -p "$OUT"; uptime
$PY -m adtbench.tools.train.report evaluator > "$OUT/evaluator.json"   # its agreement through the new VQ
$PY -m adtbench.tools.train.report ratios threads=1 repeats=40
$PY -m adtbench.tools.train.report grid n=20 threads=1
t1=(dataset=mini dataset.limit=20 policy=chain,static,eagle2,adt lantern=off,on eval=mini)
greedy=(dataset=mini dataset.limit=20 policy=chain,static,eagle2,adt sampling=greedy eval=mini)
quiet=(progress=false maps.per_run=false)   # not part of the recorded command: they change no figure
$PY run.py -m "${t1[@]}" "${quiet[@]}" hydra.sweep.dir="$OUT/sweep_t1"
$PY -m adtbench.tools.train.report sweep "$OUT/sweep_t1" name=t1 command="python run.py -m ${t1[*]}" > /dev/null
$PY run.py -m "${greedy[@]}" "${quiet[@]}" hydra.sweep.dir="$OUT/sweep_greedy"
$PY -m adtbench.tools.train.report sweep "$OUT/sweep_greedy" name=greedy command="python run.py -m ${greedy[*]}" > /dev/null
$PY -m analysis.diagnose out="$OUT/diagnosis.json" > "$OUT/diagnosis.txt"
$PY -m adtbench.tools.train.report card
uptime
