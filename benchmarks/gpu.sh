#!/usr/bin/env bash
# The GPU measurements in stages: `benchmarks/gpu.sh STAGE [STAGE ...]`, one stage per device call. Each stage is
# sized to end within 8 minutes on one H100 (the device tool allows 10 per call) and writes at most 5 files into $OUT
# (default outputs/gpu; the tool brings back at most 8). Every stage writes device.txt (date, nvidia-smi, torch, the
# device) and appends its tables to gpu.md under "## <stage>"; a failing step is recorded there and the next one runs
# (exit status 1 when any failed; 2 for an unknown stage or model). The timing stages (speed, jacobi, trees) also
# write their raw result files under $OUT/results/<device>/<stage>/<setting>.json (adtbench/tools/results.py: the
# per-prompt latencies, τ, load, commit, device, torch, prompt ids, date): copy them into results/ and run
# `adtbench results` to publish them (docs/speed.md, "GPU").
#
#   tests   pytest -m gpu tests/test_gpu.py [$TESTS_ARGS] (pytest-xdist with $TEST_WORKERS workers when installed:
#           the tiny models are launch-bound, so workers share the GPU well)     → tests.log
#   cost    `adtbench bench cost` per model of $MODELS × mode of $MODES (eager | graphs = engine.compile=true): t_verify
#           for $SIZES, one drafter level, the fixed work, the AR step against the weight-read floor, and the engine
#           overhead per cycle of the default policy on $OVERHEAD_PROMPTS prompt(s) (0: none)   → cost.json
#   speed   `adtbench bench speed` on $SPEED_MODEL for the rows $ROWS, $PROMPTS prompts each, per mode of
#           $SPEED_MODES (default graphs; AR baseline in each job, and with AA=true — the default — the A/A control:
#           each row's AR baseline timed against itself, aa_ratio beside its speedup) → speed.json, results/…/speed/*.json
#   batch   `adtbench bench batch` per model of $MODELS, eager (the speed of the batched eager step), B in $BATCH_SIZES
#           over $BATCH_PROMPTS prompts; the 7B shape at the grid $ANOLE_BATCH_GRID    → batch.json, batch_<model>.png
#   probe   `adtbench bench probe` per model of $MODELS: pure replay time per verify bucket 1…128 against the
#           weight-read floor, verify(n) in AR steps, graphed − eager logits, an AR step's kernels and launches
#           (torch.profiler), the default policy's overhead and synchronisations per cycle     → probe.json
#   (jacobi and trees below: with AA=true the AR side is timed against itself too, the A/A line above each table)
#   trees   `adtbench bench versus` on $SPEED_MODEL, graphed, acceptance on the device: the tree policies (EAGLE-2,
#           ADT, the static sampled tree: $TREE_POLICIES) with drafting levels and tree verify graphed, the verify eager
#           (engine.graphs.verify=eager), both eager (+ engine.graphs.levels=eager), AR interleaved in one job,
#           $PROMPTS prompts                                                 → trees.json, results/…/trees/*.json
#   jacobi  `adtbench bench versus` on $SPEED_MODEL, graphed, acceptance on the device: SCD at the windows of
#           $JACOBI_WINDOWS (the device-resident step: engine.graphs.step=auto), SCD 32 through the host-driven loop
#           (engine.graphs.step=eager), SJD and GSD at 16, SJD-PAC at 32, window=cost, the default policy, AR interleaved in one job, $PROMPTS
#           prompts (the verify cost against L is the probe's verify(n))       → jacobi.json, results/…/jacobi/*.json
#   policies `adtbench bench probe` on $POLICY_MODEL (the 7B shape at $POLICY_GRID) judging every policy of
#           $POLICY_NAMES at a pinned shape on one set of captured models: per policy the cycle split, the overhead
#           share with a CI over $POLICY_PROMPTS prompts, synchronisations and launches per cycle, a host µs-per-launch
#           figure and the τ × AR step / cycle projection                                  → policies.json
#   all     every stage in turn (a machine without the 10-minute limit; up to 9 files)
#
# Models: anole = the 7B shape (`model=anole model.random_init=true`, bfloat16, random weights) with $ANOLE_ARCH
# appended (leave it empty for the 7B shape); mini = the shipped mini model; tiny = tiny_llamagen with a random EAGLE
# drafter (the CPU smoke's vehicle: 16 tokens per image, no transformers import); emu3 = the Emu3-Gen 8B shape
# (`model=emu3 model.random_init=true`, bfloat16, random weights: GQA 32 / 8 heads, 184,622-token vocabulary, 90 × 90
# codes + end-of-line = 8,191 tokens per image) with $EMU3_ARCH appended (empty: the 8B shape), not in the default
# MODELS (`MODELS=emu3 benchmarks/gpu.sh probe`: its AR step against the weight-read floor, verify(n) against n, the
# SCD 32 overhead on whole 8,191-token images; issue 42's goal: goals.step_floor_x ≤ 2 in probe.json; the same stage
# runs on the CPU at the real layout in tests/test_emu3_shape.py; the batch stage runs it at $EMU3_BATCH_GRID).
# OVERHEAD_TOKENS=N stops the probe's Jacobi overhead images after N tokens (empty: whole images).
# Sizing (docs/speed.md "GPU": measured on an H200 — probe 57 s with a drafting default (375 s with SCD's cost window
# calibrating on the 7B shape: hence STAGE_POLICY), tests 77–83 s with 4 workers, cost with MODES=graphs 58 s, batch
# on mini 13 s, jacobi 13 s; the rest estimated from its step times, an eager 7B step being 52–67 ms and host-bound, a
# graphed one 5.4–6.5 ms; the 7B batch stage did not finish in 220 s):
# cost with both modes ≈ 5–6 min (the 7B eager overhead run, 2 × ≈ 1 000 cycles, is most of it), speed ≈ 3–4 min,
# batch ≈ 6 min (the 7B shape at 16 × 16 tokens, B = 1 and 4 on 4 prompts; mini likewise). Shorten a stage with its
# knobs; split `tests` with TESTS_ARGS (e.g. "-k law" / "-k 'not law'") if a call runs long.
#
# Usage:
#   benchmarks/gpu.sh probe                           a CUDA machine with the README setup (.venv)
#   PY=python3 OUT=$OUT benchmarks/gpu.sh cost        a machine whose python3 holds torch (docs/speed.md, "GPU")
#   ADTBENCH_SIMULATE_DEVICE=cuda DEVICE=cuda MODELS=tiny SPEED_MODEL=tiny … benchmarks/gpu.sh tests cost speed batch probe
#                                                     the CPU smoke on the simulated CUDA device (tests/test_gpu_script.py)
set -uo pipefail -f  # -f: no globbing ("model.grid=[2,2]" in ANOLE_ARCH stays a word); no -e: every step runs
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/gpu}
DEVICE=${DEVICE:-cuda}
MODELS=${MODELS:-anole mini}
MODES=${MODES:-eager graphs}
SIZES=${SIZES:-[1,2,3,4,6,8,12,16,24,32,48,64,96,128]}
REPEATS=${REPEATS:-20}
OVERHEAD_PROMPTS=${OVERHEAD_PROMPTS:-1}
SPEED_MODEL=${SPEED_MODEL:-mini}
SPEED_MODES=${SPEED_MODES:-graphs}
PROMPTS=${PROMPTS:-4}
AA=${AA:-true}  # timing.aa of the speed, jacobi and trees stages: the A/A control beside every speedup
ROWS=${ROWS:-[ar,eagle2_fixed,eagle2_cost,adt_cost,static_sampled,mini_lantern,zipar,mulo,scd,scd_cost,sjd,gsd]}
JACOBI_WINDOWS=${JACOBI_WINDOWS:-16 32 64}
TREE_POLICIES=${TREE_POLICIES:-eagle2 adt static_sampled}  # the trees stage's policies
BATCH_SIZES=${BATCH_SIZES:-[1,4]}
BATCH_PROMPTS=${BATCH_PROMPTS:-4}
ANOLE_BATCH_GRID=${ANOLE_BATCH_GRID-[16,16]}  # set and empty: the model's own grid
PROBE_PROMPTS=${PROBE_PROMPTS:-1}
OVERHEAD_TOKENS=${OVERHEAD_TOKENS:-}
# the policy of the cost, batch and probe stages: the default run's SCD at the window its cost window picks on an H200
# (24–32), without that calibration (48 image decodes: minutes on the 7B shape, most of a stage; empty: the default)
STAGE_POLICY=${STAGE_POLICY-policy=scd policy.window=32}
PROBE_BUCKETS=${PROBE_BUCKETS:-[1,2,4,8,16,32,64,128]}
TEST_WORKERS=${TEST_WORKERS:-4}
TESTS_ARGS=${TESTS_ARGS:-}
ANOLE_ARCH=${ANOLE_ARCH:-}
POLICY_MODEL=${POLICY_MODEL:-anole}
POLICY_GRID=${POLICY_GRID-[8,8]}  # set and empty: the model's own grid (16 × 16 ran past 150 s on an H200)
POLICY_NAMES=${POLICY_NAMES:-[ar,scd,sjd_pac,eagle2,adt,static]}
POLICY_PROMPTS=${POLICY_PROMPTS:-3}
POLICY_BUCKETS=${POLICY_BUCKETS:-[1,16,64]}
EMU3_ARCH=${EMU3_ARCH:-}
EMU3_BATCH_GRID=${EMU3_BATCH_GRID-[16,16]}  # set and empty: the model's own grid (90 × 90)
RUN_DIR=${RUN_DIR:-outputs/gpu_run}
# the commit the result files name where this tree has no git metadata (a copied tree: pass COMMIT=$(git rev-parse HEAD))
export ADTBENCH_RESULTS_COMMIT=${COMMIT:-${ADTBENCH_RESULTS_COMMIT:-}}
STAGES=(tests cost speed batch probe jacobi trees policies)

usage() { echo "usage: benchmarks/gpu.sh STAGE [STAGE ...]; stages: ${STAGES[*]} all" >&2; exit 2; }
(($#)) || usage
todo=()
for s in "$@"; do
    case $s in
        all) todo+=("${STAGES[@]}") ;;
        tests | cost | speed | batch | probe | jacobi | trees | policies) todo+=("$s") ;;
        *) echo "gpu.sh: unknown stage '$s'" >&2; usage ;;
    esac
done
over_of() {  # over_of MODEL: the model's overrides into the array `over`
    case $1 in
        anole) over=(model=anole model.random_init=true "model.device=$DEVICE" $ANOLE_ARCH) ;;
        mini) over=(model=mini "model.device=$DEVICE") ;;
        tiny) over=(model=tiny_llamagen drafter=eagle "model.device=$DEVICE") ;;  # the CPU smoke's vehicle
        emu3) over=(model=emu3 model.random_init=true "model.device=$DEVICE" $EMU3_ARCH) ;;
        *) echo "gpu.sh: MODELS holds '$1'; known: anole mini tiny emu3" >&2; exit 2 ;;
    esac
}
for m in $MODELS $SPEED_MODEL $POLICY_MODEL; do over_of "$m"; done  # unknown models fail before anything runs
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
compile_of() { [[ $1 == graphs ]] && echo engine.compile=true || echo engine.compile=false; }
bench() { "$PY" -m adtbench.cli bench "$@"; }
md() { echo "$@" >> "$OUT/gpu.md"; }
results_of() {  # results_of STAGE: its bench versus JSON → $OUT/results/<device>/STAGE/<variant>.json (raw results)
    "$PY" -m adtbench.tools.results versus "$OUT/$1.json" --suite "$1" --out "$OUT/results" \
        --command "benchmarks/gpu.sh $1 (SPEED_MODEL=$SPEED_MODEL PROMPTS=$PROMPTS)" >> "$OUT/gpu.md"
}

{
    date -u
    nvidia-smi || echo "(no nvidia-smi)"
    "$PY" -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, '|', torch.cuda.get_device_name(0) if c else 'no CUDA')"
    echo "ADTBENCH_SIMULATE_DEVICE=${ADTBENCH_SIMULATE_DEVICE:-} DEVICE=$DEVICE stages: ${todo[*]}"
} > "$OUT/device.txt" 2>&1
touch "$OUT/gpu.md"

stage_tests() {
    local par=()
    "$PY" -c "import xdist" 2>/dev/null && ((TEST_WORKERS > 1)) && par=(-n "$TEST_WORKERS")
    # shellcheck disable=SC2086  # TESTS_ARGS is a list of pytest arguments
    step tests "$PY" -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider "${par[@]}" $TESTS_ARGS > "$OUT/tests.log" 2>&1
    md "pytest -m gpu tests/test_gpu.py ${par[*]} $TESTS_ARGS: $(grep -E '(passed|failed|error|no tests ran)' "$OUT/tests.log" | tail -n 1)"
}

stage_cost() {
    local costs=() m mode f
    for m in $MODELS; do
        over_of "$m"
        for mode in $MODES; do
            f="$RUN_DIR/cost_${m}_$mode.json"
            rm -f "$f"  # a failed step leaves no stale figures to merge
            md "### $m, $mode"
            # shellcheck disable=SC2086  # STAGE_POLICY is a list of overrides
            step "cost $m $mode" bench cost "${over[@]}" $STAGE_POLICY "$(compile_of "$mode")" "bench.tree_sizes=$SIZES" \
                "bench.repeats=$REPEATS" "bench.overhead_prompts=$OVERHEAD_PROMPTS" dataset=mini "bench.out=$f" \
                >> "$OUT/gpu.md"
            md ""
            costs+=("${m}_$mode=$f")
        done
    done
    step "merge cost.json" merge_json "$OUT/cost.json" "${costs[@]}"
}

stage_speed() {
    local runs=() mode
    over_of "$SPEED_MODEL"
    for mode in $SPEED_MODES; do
        rm -rf "$RUN_DIR/speed_$mode"
        md "### speed rows, $SPEED_MODEL, $mode"
        step "speed $mode" bench speed "${over[@]}" "$(compile_of "$mode")" "timing.aa=$AA" "bench.rows=$ROWS" \
            "bench.prompts=$PROMPTS" "bench.out=$RUN_DIR/speed_$mode" "bench.results=$OUT/results" >> "$OUT/gpu.md"
        md ""
        runs+=("$mode=$RUN_DIR/speed_$mode/speed.json")
    done
    step "merge speed.json" merge_json "$OUT/speed.json" "${runs[@]}"
}

stage_batch() {
    local batches=() m extra
    for m in $MODELS; do
        over_of "$m"
        extra=()
        [[ $m == anole && -n $ANOLE_BATCH_GRID ]] && extra=("model.grid=$ANOLE_BATCH_GRID")
        [[ $m == emu3 && -n $EMU3_BATCH_GRID ]] && extra=("model.grid=$EMU3_BATCH_GRID")
        rm -rf "$RUN_DIR/batch_$m"
        md "### batch sizes, $m, eager"
        # shellcheck disable=SC2086  # STAGE_POLICY is a list of overrides
        step "batch $m" bench batch "${over[@]}" "${extra[@]}" $STAGE_POLICY dataset=mini "bench.sizes=$BATCH_SIZES" \
            "bench.prompts=$BATCH_PROMPTS" "bench.out=$RUN_DIR/batch_$m" >> "$OUT/gpu.md"
        md ""
        batches+=("$m=$RUN_DIR/batch_$m/batch.json")
        cp "$RUN_DIR/batch_$m/batch.png" "$OUT/batch_$m.png" 2>/dev/null
    done
    step "merge batch.json" merge_json "$OUT/batch.json" "${batches[@]}"
}

stage_probe() {
    local probes=() m f
    for m in $MODELS; do
        over_of "$m"
        f="$RUN_DIR/probe_$m.json"
        rm -f "$f"
        md "### probe, $m"
        # shellcheck disable=SC2086  # STAGE_POLICY is a list of overrides
        step "probe $m" bench probe "${over[@]}" $STAGE_POLICY "bench.repeats=$REPEATS" "bench.prompts=$PROBE_PROMPTS" \
            "bench.buckets=$PROBE_BUCKETS" ${OVERHEAD_TOKENS:+"bench.overhead_tokens=$OVERHEAD_TOKENS"} dataset=mini \
            "bench.out=$f" >> "$OUT/gpu.md"
        md ""
        probes+=("$m=$f")
    done
    step "merge probe.json" merge_json "$OUT/probe.json" "${probes[@]}"
}

stage_jacobi() {
    local variants=() w
    over_of "$SPEED_MODEL"
    for w in $JACOBI_WINDOWS; do variants+=(--variant "scd_$w" policy=scd "policy.window=$w"); done
    variants+=(--variant sjd_16 policy=sjd policy.window=16 --variant gsd_16 policy=gsd policy.window=16
               --variant sjd_pac_32 policy=sjd_pac policy.window=32
               --variant scd_cost policy=scd policy.window=cost --variant static_sampled policy=static_sampled
               --variant scd_32_eager policy=scd policy.window=32 engine.graphs.step=eager)  # the host-driven SCD loop
    md "### Jacobi decoding head to head, $SPEED_MODEL, graphed, acceptance on the device"
    step "jacobi" bench versus "${over[@]}" engine.compile=true engine.acceptance=device dataset=mini "timing.aa=$AA" \
        "bench.prompts=$PROMPTS" bench.repeats=1 "bench.out=$OUT/jacobi.json" "${variants[@]}" >> "$OUT/gpu.md"
    step "jacobi results" results_of jacobi
    md ""
}

stage_trees() {  # graphed drafting levels and tree verify (drafters/graphed.py, tree_step.py) against eager, one job
    local variants=() p
    over_of "$SPEED_MODEL"
    for p in $TREE_POLICIES; do
        variants+=(--variant "$p" "policy=$p"
                   --variant "${p}_eager_verify" "policy=$p" engine.graphs.verify=eager
                   --variant "${p}_eager" "policy=$p" engine.graphs.levels=eager engine.graphs.verify=eager)
    done
    md "### Tree policies: levels + verify graphed, verify eager, both eager; $SPEED_MODEL, acceptance on the device"
    step "trees" bench versus "${over[@]}" engine.compile=true engine.acceptance=device dataset=mini "timing.aa=$AA" \
        "bench.prompts=$PROMPTS" bench.repeats=1 "bench.out=$OUT/trees.json" "${variants[@]}" >> "$OUT/gpu.md"
    step "trees results" results_of trees
    md ""
}

stage_policies() {
    local extra=()
    over_of "$POLICY_MODEL"
    [[ $POLICY_MODEL == anole && -n $POLICY_GRID ]] && extra=("model.grid=$POLICY_GRID")
    md "### every policy at a pinned shape, $POLICY_MODEL ${extra[*]}"
    # shellcheck disable=SC2086  # STAGE_POLICY is a list of overrides
    step "policies" bench probe "${over[@]}" "${extra[@]}" $STAGE_POLICY "bench.buckets=$POLICY_BUCKETS" \
        "bench.repeats=$REPEATS" "bench.prompts=$POLICY_PROMPTS" "bench.policies=$POLICY_NAMES" dataset=mini \
        "bench.out=$OUT/policies.json" >> "$OUT/gpu.md"
    md ""
}

for s in "${todo[@]}"; do
    t0=$SECONDS
    md "## $s"
    md ""
    "stage_$s"
    md "(stage $s: $((SECONDS - t0)) s)"
    md ""
done
if ((${#failed[@]})); then
    printf 'gpu.sh: failed steps: %s\n' "${failed[*]}" | tee -a "$OUT/gpu.md" >&2
    exit 1
fi
