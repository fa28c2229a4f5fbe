"""The card's sweep: ``run.py -m policy=adt,eagle2 lantern=on,off`` runs four jobs; ``analysis/sweep_table.py``
(``adtbench table --by job,policy,lantern``) prints one row per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_in_process
from PIL import Image

from adtbench.harness.rundir import find_runs, read_summary

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "analysis" / "sweep_table.py"


def summaries(root: Path) -> list[dict]:
    """Every job's summary.json under ``root`` (natural job order) with its ``job_dir``."""
    return [{**read_summary(d), "job_dir": str(d)} for d in find_runs(root)]


@pytest.mark.slow
def test_four_job_sweep_and_table(tmp_path):
    sweep = tmp_path / "sweep"
    env = {"ADTBENCH_ROOT": str(tmp_path), "HYDRA_FULL_ERROR": "1"}
    # the sweep's command line, run in this process (conftest.run_in_process: no interpreter start-up); the table
    # script below runs as its own process
    proc = run_in_process("-m", "policy=adt,eagle2", "lantern=on,off", "model=tiny_llamagen", "drafter=eagle",
                          "dataset=smoke", "dataset.limit=2", "warmup=0", f"hydra.sweep.dir={sweep}", "progress=false",
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = summaries(sweep)
    assert sorted((s["policy"], s["choices"]["lantern"]) for s in jobs) == [
        ("adt", "off"), ("adt", "on"), ("eagle2", "off"), ("eagle2", "on")
    ]  # fmt: skip
    for s in jobs:
        assert s["complete"] and s["n_samples"] == 2 and s["tau"] >= 1.0
        assert s["acceptance_rule"] == ("lantern" if s["lantern"] else "exact")
        job = Path(s["job_dir"])
        for kind in ("accept", "depth", "width"):
            assert Image.open(job / "maps" / f"run_{kind}.png").text["grid"] == "4x4"  # the 4 × 4 grid, with its bar
        trace = [json.loads(x) for x in (job / "trace.jsonl").read_text().splitlines()]
        if s["policy"] == "adt":
            assert {"alpha", "alpha_D", "N", "init", "D_policy"} <= set(trace[0])
    assert len(list((tmp_path / "outputs" / "cache" / "lantern").glob("*.npy"))) == 1  # shared by both on-jobs
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    out = subprocess.run([sys.executable, str(SCRIPT), str(sweep)], env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")][:3] == ["job", "policy", "lantern"]
    assert sum(line.startswith("| ") for line in lines[2:]) == 4  # one row per job
    print(out.stdout)  # the measured table (pytest -s)
