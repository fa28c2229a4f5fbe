#!/usr/bin/env bash
# The GPU figures of docs/speed.md in one command: the GPU tests, the cost model of the 7B shape (random-init Anole, bfloat16)
# and of model=mini on CUDA — t_verify(n) for n = 1…128 as multiples of one AR step, one drafter level per step,
# the fixed per-cycle work, the engine overhead per cycle — and the default run's speedup on the GPU.
# Every result lands in $OUT (default outputs/gpu), two folders deep at most:
#   device.txt                  date, nvidia-smi, torch and the device name
#   tests.log                   pytest -m gpu (skipped with TESTS=0)
#   cost_<model>.json / .md     `adtbench bench cost` (the table is the .md; the .json has every figure)
#   run_default.log, run_default_summary.json   `python run.py` on the device, AR baseline timed in the same job
#                               (its run dir, images included, is $RUN_DIR, default outputs/gpu_run: the device tool
#                               brings back at most 8 files from $OUT, and these are the 8)
# Usage:
#   benchmarks/gpu.sh                               a CUDA machine with the README's setup (.venv)
#   PY=python3 OUT=$OUT benchmarks/gpu.sh           a machine whose python3 holds torch (docs/speed.md, "GPU")
#   DEVICE=cpu MODELS=mini SIZES='[1,2]' PROMPTS=1 TESTS=0 benchmarks/gpu.sh     the CPU smoke run (tests)
# ANOLE_ARCH appends model.arch overrides (the smoke test shrinks the width; leave it empty for the 7B shape).
set -euo pipefail -f  # -f: no globbing ("model.grid=[2,2]" in ANOLE_ARCH stays a word)
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/gpu}
DEVICE=${DEVICE:-cuda}
MODELS=${MODELS:-anole mini}
SIZES=${SIZES:-[1,2,3,4,6,8,12,16,24,32,48,64,96,128]}
PROMPTS=${PROMPTS:-20}
REPEATS=${REPEATS:-20}
ANOLE_ARCH=${ANOLE_ARCH:-}
RUN_DIR=${RUN_DIR:-outputs/gpu_run}
mkdir -p "$OUT"
{
    date -u
    nvidia-smi || echo "(no nvidia-smi)"
    "$PY" -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, '|', torch.cuda.get_device_name(0) if c else 'no CUDA')"
} > "$OUT/device.txt" 2>&1
if [[ "${TESTS:-1}" == 1 ]]; then
    "$PY" -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$OUT/tests.log"
fi
for m in $MODELS; do
    case $m in
        anole) over=(model=anole model.random_init=true "model.device=$DEVICE" $ANOLE_ARCH) ;;
        mini) over=(model=mini "model.device=$DEVICE") ;;
        *) echo "gpu.sh: MODELS holds '$m'; known: anole mini" >&2; exit 2 ;;
    esac
    "$PY" -m adtbench.cli bench cost "${over[@]}" "bench.tree_sizes=$SIZES" "bench.repeats=$REPEATS" \
        bench.overhead_prompts=2 dataset=mini "bench.out=$OUT/cost_$m.json" | tee "$OUT/cost_$m.md"
done
"$PY" run.py "model.device=$DEVICE" dataset=mini "dataset.limit=$PROMPTS" "hydra.run.dir=$RUN_DIR" \
    2>&1 | tee "$OUT/run_default.log"
cp "$RUN_DIR/summary.json" "$OUT/run_default_summary.json"
