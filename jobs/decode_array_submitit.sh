#!/usr/bin/env bash
# Submitit equivalent of decode_array.sbatch + merge.sbatch: one Hydra multirun over dataset.shard=0/n..n-1/n,
# submitted as ONE SLURM job array by hydra-submitit-launcher (conf/hydra/launcher/slurm.yaml: partition, GPUs,
# time, array parallelism, requeue), then the merge. The script blocks until the array is done (run it in tmux).
#   jobs/decode_array_submitit.sh 8 model=tiny_llamagen policy=eagle2 dataset=parti dataset.path=... \
#       hydra.launcher.partition=gpu hydra.launcher.timeout_min=240
# Env: ADTBENCH_LAUNCHER (slurm | local | submitit_local; default slurm), ADTBENCH_OUT (array dir; default
# outputs/arrays/<date>_<time>), ADTBENCH_PYTHON (default .venv/bin/python).
# Shard i decodes into <array dir>/shard_<i>_of_<n> (the sbatch layout); the merged run is <array dir>/merged.
# A requeued (preempted/timed-out) task resumes in its own dir; rerunning this script with the same
# ADTBENCH_OUT resumes every unfinished shard.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:?usage: decode_array_submitit.sh <number of shards> [hydra overrides]}"
shift
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "shard count must be a positive integer, got '$n'" >&2; exit 2; }
py="${ADTBENCH_PYTHON:-.venv/bin/python}"
out="${ADTBENCH_OUT:-outputs/arrays/$(date +%Y-%m-%d_%H-%M-%S)}"
shards="$(seq -s, -f "%g/${n}" 0 $((n - 1)))"
"$py" run.py -m "hydra/launcher=${ADTBENCH_LAUNCHER:-slurm}" "dataset.shard=${shards}" "hydra.sweep.dir=${out}" \
    "hydra.sweep.subdir=shard_\${hydra.job.num}_of_${n}" "$@"
"$py" -m adtbench.reporting.merge "$out" --out "$out/merged" --force
