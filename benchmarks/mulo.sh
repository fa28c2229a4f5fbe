#!/usr/bin/env bash
# Issue 13's sweep on the mini model: MuLo-SD (policy.tau × policy.l × upsampler × resample), ZipAR windows, and the
# tree methods (ADT, EAGLE-2, ± LANTERN) plus AR for reference — 20 held-out prompts, the AR baseline timed in every
# job, eval=mini (caption agreement) for quality. Then the speed-vs-quality Pareto plot and the table.
# Run on an idle machine (each summary records its load); extra arguments go to every job.
#   [OUT=outputs/mulo_sweep] [TAUS=0.1,0.3,0.6] [LS=0,1,2] benchmarks/mulo.sh [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/mulo_sweep}
TAUS=${TAUS:-0.1,0.3,0.6}   # MuLo-SD thresholds τ
LS=${LS:-0,1,2}              # local expansion radii l
uptime
common=(dataset=mini dataset.limit=20 eval=mini threads=1 progress=false maps.per_run=false "$@")
run() { .venv/bin/adtbench run -m "$@" "${common[@]}"; }
run policy=mulo policy.tau=$TAUS policy.l=$LS policy.upsampler=learned,bicubic \
    policy.resample=sequential,islands hydra.sweep.dir="$OUT/mulo"
run policy=mulo policy.tau=0.1 policy.l=0 policy.resample=islands policy.upsampler=learned,bicubic policy.draft=zipar \
    hydra.sweep.dir="$OUT/mulo_zipar_draft"                      # v2: the drafter ZipAR-parallel too
run policy=zipar policy.window=2,4,8 hydra.sweep.dir="$OUT/zipar"
run policy=ar,adt,eagle2 hydra.sweep.dir="$OUT/trees"
run policy=adt,eagle2 lantern=on hydra.sweep.dir="$OUT/lantern"
uptime
.venv/bin/python -m adtbench.reporting.plots "$OUT" --metric mini_agreement
cp "$OUT/speedup_vs_mini_agreement.png" docs/mulo_pareto.png
.venv/bin/adtbench table "$OUT" --format md --out "$OUT/table.md" \
    --into docs/mini_model.md --marker mulo-table
cat "$OUT/table.md"
