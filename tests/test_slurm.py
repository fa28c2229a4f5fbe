"""Cluster path: the SLURM launcher presets compose; a submitit_local multirun of two shard jobs completes and
merges (jobs/decode_array_submitit.sh with the local launcher); the sbatch array script builds the right
shard command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_OVERRIDES
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0", "ADTBENCH_PYTHON": sys.executable}


def lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_launcher_presets_compose():
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        slurm = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher
        local = compose("config", overrides=["hydra/launcher=local"], return_hydra_config=True).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and local._target_.endswith("LocalLauncher")
    assert slurm.gpus_per_node == 1 and slurm.timeout_min > 0 and slurm.array_parallelism >= 1
    assert slurm.max_num_timeout > 0 and slurm.signal_delay_s > 0  # requeue on timeout / preemption
    assert "partition" in slurm and local.gpus_per_node == 0


@pytest.mark.slow
def test_submitit_local_multirun_of_two_shard_jobs_then_merge(tmp_path):
    out = tmp_path / "array"
    proc = subprocess.run(
        ["bash", str(ROOT / "jobs" / "decode_array_submitit.sh"), "2", *TINY_OVERRIDES, "dataset.limit=3",
         "warmup=0", "sampling=greedy", "progress=false", "maps.per_run=false"],
        cwd=ROOT, env={**ENV, "ADTBENCH_LAUNCHER": "submitit_local", "ADTBENCH_OUT": str(out)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = sorted(p.name for p in (out / ".submitit").iterdir() if p.name.isdigit())  # (+ a literal "%j" dir)
    assert len(jobs) == 2, jobs  # two submitit jobs (one array on SLURM)
    assert all(list((out / ".submitit" / j).glob("*_result.pkl")) for j in jobs)
    for i, n_expected in ((0, 2), (1, 1)):
        shard = out / f"shard_{i}_of_2"
        s = json.loads((shard / "summary.json").read_text())
        assert s["complete"] and s["n_samples"] == n_expected and s["greedy_matches_baseline"] is True
        assert "dataset.shard=" + f"{i}/2" in (shard / ".hydra" / "overrides.yaml").read_text()
    merged = json.loads((out / "merged" / "summary.json").read_text())
    assert merged["complete"] and merged["n_samples"] == 3 and merged["n_prompts"] == 3
    assert [r["prompt_id"] for r in lines(out / "merged" / "samples.jsonl")] == ["text-00002", "text-00003",
                                                                                  "text-00004"]  # fmt: skip
    assert json.loads((out / "merged" / "merge.json").read_text())["dataset_check"] == "passed"
    assert "adtbench merge: 2 shard(s), n=3/3" in proc.stdout


def test_sbatch_array_script_builds_the_shard_command(tmp_path):
    env = {**ENV, "ADTBENCH_PYTHON": "echo", "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_ARRAY_TASK_COUNT": "4",
           "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "777"}  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "jobs" / "decode_array.sbatch"), "policy=eagle2", "dataset=parti"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["run.py", "dataset.shard=1/4", "hydra.run.dir=outputs/arrays/777/shard_1_of_4",
                                   "policy=eagle2", "dataset=parti"]  # fmt: skip
    env.pop("SLURM_ARRAY_TASK_ID")
    proc = subprocess.run(["bash", str(ROOT / "jobs" / "decode_array.sbatch")], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0 and "--array" in proc.stderr
    merge = subprocess.run(["bash", str(ROOT / "jobs" / "merge.sbatch"), "outputs/arrays/777"], env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert merge.stdout.split() == ["-m", "adtbench.reporting.merge", "outputs/arrays/777", "--out",
                                    "outputs/arrays/777/merged", "--force"]  # fmt: skip


def _fake_slurm(tmp_path: Path) -> tuple[Path, Path]:
    """A ``scontrol`` on PATH that records its arguments, and an ``ADTBENCH_PYTHON`` that marks its start and
    runs until a ``stop`` file appears (a decode SLURM would kill)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/usr/bin/env bash\necho "$@" >> {tmp_path}/scontrol.log\n')
    (bin_dir / "fakepy").write_text(
        f'#!/usr/bin/env bash\necho "$@" > {tmp_path}/started\n'
        f"for _ in $(seq 200); do [[ -f {tmp_path}/stop ]] && exit 0; sleep 0.05; done\nexit 7\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir, bin_dir / "fakepy"


@pytest.mark.parametrize(("restarts", "requeued"), [("0", True), ("3", False)])
def test_sbatch_array_script_requeues_on_the_time_limit_signal(tmp_path, restarts, requeued):
    """``--signal=B:USR1@180`` makes SLURM signal the batch shell before the time limit; the script then runs
    ``scontrol requeue <array job>_<task>`` (up to ADTBENCH_MAX_REQUEUE times by SLURM_RESTART_COUNT), keeps
    waiting for the decode and exits with its status. The old script exec'd the decode and never requeued on
    timeout (``--requeue`` covers preemption and node failure only)."""
    import signal
    import time

    script = (ROOT / "jobs" / "decode_array.sbatch").read_text()
    assert "#SBATCH --signal=B:USR1@" in script and "#SBATCH --requeue" in script
    bin_dir, fakepy = _fake_slurm(tmp_path)
    env = {**ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ADTBENCH_PYTHON": str(fakepy),
           "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_ID": "1",
           "SLURM_ARRAY_JOB_ID": "777", "SLURM_RESTART_COUNT": restarts}  # fmt: skip
    proc = subprocess.Popen(["bash", str(ROOT / "jobs" / "decode_array.sbatch"), "policy=eagle2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 10
    while not (tmp_path / "started").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(0.5)
    assert proc.poll() is None  # still waiting for the decode
    (tmp_path / "stop").touch()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err  # the decode's own status
    log = tmp_path / "scontrol.log"
    if requeued:
        assert log.read_text().split() == ["requeue", "777_1"] and "requeueing 777_1 (requeue 1 of 3)" in err
    else:
        assert not log.exists() and "3 requeue(s) used: not requeueing" in err
    assert (tmp_path / "started").read_text().split()[:2] == ["run.py", "dataset.shard=1/4"]


def test_eval_job_script_scores_the_merged_run(tmp_path):
    """jobs/eval.sbatch <array dir> runs ``adtbench eval`` on <array dir>/merged (or on a run dir given
    directly) with the extra overrides; an unmerged array dir is refused in one line naming the merge script."""
    arr = tmp_path / "arr"
    (arr / "merged").mkdir(parents=True)
    env = {**ENV, "ADTBENCH_PYTHON": "echo", "SLURM_SUBMIT_DIR": str(ROOT)}
    run = ["bash", str(ROOT / "jobs" / "eval.sbatch")]
    proc = subprocess.run([*run, str(arr), "eval=clip"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "jobs/merge.sbatch" in proc.stderr and len(proc.stderr.splitlines()) == 1
    (arr / "merged" / "samples.jsonl").write_text("{}\n")
    proc = subprocess.run([*run, str(arr), "eval=clip"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["-m", "adtbench.cli", "eval", f"{arr}/merged", "eval=clip"], proc.stderr
    proc = subprocess.run([*run, str(arr / "merged")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["-m", "adtbench.cli", "eval", f"{arr}/merged"]
