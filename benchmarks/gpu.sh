#!/usr/bin/env bash
# The GPU table in one command: the GPU tests; for the 7B shape (random-init Anole, bfloat16) and for model=mini the
# cost model eager and with engine.compile=true (CUDA graphs) — t_verify(n) for n = 1…128 as AR steps, the AR step
# against the weight-read floor (weight bytes / the measured device bandwidth), one drafter level, the fixed
# per-cycle work, the engine overhead per cycle; the speed rows on mini (AR baseline in each job), eager and graphed;
# AR and the default policy's throughput against the batch size B = 1…32 for both models (`adtbench bench batch`,
# eager: batched decoding has no graphs); and the default run. A failing step is recorded and the next one runs (the
# script's exit status says whether any failed).
# Everything lands in $OUT (default outputs/gpu; the device tool brings back at most 8 files, and these are 8):
#   device.txt                     date, nvidia-smi, torch and the device name
#   tests.log                      pytest -m gpu tests/test_gpu.py (skipped with TESTS=0)
#   gpu.md                         every table (cost, overhead, speed, batch) and the default run's line, device named
#   cost.json                      {"<model>_<eager|graphs>": `adtbench bench cost`'s every figure}
#   batch.json                     {"<model>": `adtbench bench batch`'s rows and environment}
#   batch_<model>.png              its plot: images/s and the speedup against B
#   run_default_summary.json       `python run.py` on the device (run dir $RUN_DIR, default outputs/gpu_run)
# At the 7B shape B = 1 decodes each of the BATCH_PROMPTS prompts alone on both sides (≈ 2 × 32 × 1024 target forwards
# by default, τ ≈ 1 with random weights): BATCH_PROMPTS, BATCH_SIZES (≤ BATCH_PROMPTS) and MODELS shorten the step.
# Usage:
#   benchmarks/gpu.sh                               a CUDA machine with the README setup (.venv)
#   PY=python3 OUT=$OUT benchmarks/gpu.sh           a machine whose python3 holds torch (docs/speed.md, "GPU")
#   DEVICE=cpu MODELS=mini MODES=eager SIZES='[1,2]' PROMPTS=1 ROWS='[ar]' BATCH_SIZES='[1,2]' BATCH_PROMPTS=2 TESTS=0 \
#       benchmarks/gpu.sh                           (CPU smoke)
# ANOLE_ARCH appends model.arch overrides (the smoke test shrinks the width; leave it empty for the 7B shape).
set -uo pipefail -f  # -f: no globbing ("model.grid=[2,2]" in ANOLE_ARCH stays a word); no -e: every step runs
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/gpu}
DEVICE=${DEVICE:-cuda}
MODELS=${MODELS:-anole mini}
MODES=${MODES:-eager graphs}
SIZES=${SIZES:-[1,2,3,4,6,8,12,16,24,32,48,64,96,128]}
PROMPTS=${PROMPTS:-20}
REPEATS=${REPEATS:-20}
ROWS=${ROWS:-[ar,eagle2_fixed,eagle2_cost,adt_cost,static_sampled,mini_lantern,zipar,mulo]}
BATCH_SIZES=${BATCH_SIZES:-[1,2,4,8,16,32]}
BATCH_PROMPTS=${BATCH_PROMPTS:-32}
ANOLE_ARCH=${ANOLE_ARCH:-}
RUN_DIR=${RUN_DIR:-outputs/gpu_run}
mkdir -p "$OUT" "$RUN_DIR"
failed=()
step() {  # step NAME COMMAND...: run it, record a failure and go on
    local name=$1
    shift
    "$@" || { failed+=("$name"); echo "gpu.sh: step '$name' failed" >&2; }
}
merge_json() {  # merge_json OUT KEY=FILE...: one JSON object {KEY: that file's JSON}, for the files that exist
    local out=$1
    shift
    "$PY" - "$out" "$@" <<'PY'
import json, sys
from pathlib import Path
pairs = [a.split("=", 1) for a in sys.argv[2:]]
merged = {k: json.loads(Path(f).read_text()) for k, f in pairs if Path(f).is_file()}
Path(sys.argv[1]).write_text(json.dumps(merged, indent=1) + "\n")
PY
}
{
    date -u
    nvidia-smi || echo "(no nvidia-smi)"
    "$PY" -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, '|', torch.cuda.get_device_name(0) if c else 'no CUDA')"
} > "$OUT/device.txt" 2>&1
: > "$OUT/gpu.md"
if [[ "${TESTS:-1}" == 1 ]]; then
    step tests "$PY" -m pytest -q -m gpu tests/test_gpu.py > "$OUT/tests.log" 2>&1
fi
costs=()
batches=()
compile_of() { [[ $1 == graphs ]] && echo engine.compile=true || echo engine.compile=false; }
for m in $MODELS; do
    case $m in
        anole) over=(model=anole model.random_init=true "model.device=$DEVICE" $ANOLE_ARCH) ;;
        mini) over=(model=mini "model.device=$DEVICE") ;;
        *) echo "gpu.sh: MODELS holds '$m'; known: anole mini" >&2; exit 2 ;;
    esac
    for mode in $MODES; do
        echo "### $m, $mode" >> "$OUT/gpu.md"
        rm -f "$RUN_DIR/cost_${m}_$mode.json"  # a failed step leaves no stale figures to merge
        step "cost $m $mode" "$PY" -m adtbench.cli bench cost "${over[@]}" "$(compile_of "$mode")" "bench.tree_sizes=$SIZES" \
            "bench.repeats=$REPEATS" bench.overhead_prompts=2 dataset=mini "bench.out=$RUN_DIR/cost_${m}_$mode.json" \
            >> "$OUT/gpu.md"
        echo >> "$OUT/gpu.md"
        costs+=("${m}_$mode=$RUN_DIR/cost_${m}_$mode.json")
    done
    echo "### batch sizes, $m, eager" >> "$OUT/gpu.md"
    rm -rf "$RUN_DIR/batch_$m"
    step "batch $m" "$PY" -m adtbench.cli bench batch "${over[@]}" dataset=mini "bench.sizes=$BATCH_SIZES" \
        "bench.prompts=$BATCH_PROMPTS" "bench.out=$RUN_DIR/batch_$m" >> "$OUT/gpu.md"
    echo >> "$OUT/gpu.md"
    batches+=("$m=$RUN_DIR/batch_$m/batch.json")
    cp "$RUN_DIR/batch_$m/batch.png" "$OUT/batch_$m.png" 2>/dev/null
done
step "merge cost.json" merge_json "$OUT/cost.json" "${costs[@]}"
step "merge batch.json" merge_json "$OUT/batch.json" "${batches[@]}"
for mode in $MODES; do
    echo "### speed rows, mini, $mode" >> "$OUT/gpu.md"
    step "speed $mode" "$PY" -m adtbench.cli bench speed "model.device=$DEVICE" "$(compile_of "$mode")" \
        "bench.rows=$ROWS" "bench.prompts=$PROMPTS" "bench.out=$RUN_DIR/speed_$mode" >> "$OUT/gpu.md"
    echo >> "$OUT/gpu.md"
done
echo "### the default run" >> "$OUT/gpu.md"
step "default run" "$PY" run.py "model.device=$DEVICE" dataset=mini "dataset.limit=$PROMPTS" "hydra.run.dir=$RUN_DIR/run" \
    > "$RUN_DIR.log" 2>&1
tail -n 1 "$RUN_DIR.log" >> "$OUT/gpu.md"
cp "$RUN_DIR/run/summary.json" "$OUT/run_default_summary.json" 2>/dev/null || failed+=("default run summary")
if ((${#failed[@]})); then
    printf 'gpu.sh: failed steps: %s\n' "${failed[*]}" | tee -a "$OUT/gpu.md" >&2
    exit 1
fi
