"""The card's sweep: ``run.py -m policy=adt,eagle2 lantern=on,off`` runs four jobs; ``analysis/sweep_table.py``
prints one row per job. Plus ``load_summaries`` on a hand-made multirun tree."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "analysis" / "sweep_table.py"


def sweep_table():
    spec = importlib.util.spec_from_file_location("sweep_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _job(root: Path, name: str, summary: dict, overrides: list[str]) -> None:
    (root / name / ".hydra").mkdir(parents=True)
    (root / name / "summary.json").write_text(json.dumps(summary))
    (root / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def test_load_summaries_walks_jobs_in_order(tmp_path):
    st = sweep_table()
    adt = {"policy": "adt", "lantern": True, "tau": 2.5, "d_bar": 3.9, "speedup": 1.7, "latency_s": 0.25,
           "choices": {"lantern": "on"}}  # fmt: skip
    eagle2 = {"policy": "eagle2", "lantern": False, "tau": 2.0, "d_bar": 5.0, "speedup": None, "latency_s": 0.3}
    _job(tmp_path, "10_policy=adt", adt, ["policy=adt", "lantern=on"])
    _job(tmp_path, "2_policy=eagle2", eagle2, ["policy=eagle2"])
    (tmp_path / "multirun.yaml").write_text("x: 1\n")
    summaries = st.load_summaries(tmp_path)
    assert [s["policy"] for s in summaries] == ["eagle2", "adt"]  # numeric job order, not lexicographic
    assert summaries[1]["overrides"] == ["policy=adt", "lantern=on"]
    rows = st.table_rows(summaries)
    assert rows[0][1:] == ["eagle2", "off", "2.000", "5.00", "—", "0.3000"]
    assert rows[1][1:] == ["adt", "on", "2.500", "3.90", "1.700", "0.2500"]
    assert st.main([str(tmp_path / "nothing")]) == 1


def test_four_job_sweep_and_table(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ADTBENCH_ROOT": str(tmp_path), "HYDRA_FULL_ERROR": "1"}
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "policy=adt,eagle2", "lantern=on,off", "model=tiny_llamagen",
           "drafter=eagle", "dataset=smoke", "dataset.limit=2", "warmup=0", f"hydra.sweep.dir={sweep}",
           "progress=false"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = sweep_table().load_summaries(sweep)
    assert sorted((s["policy"], s["choices"]["lantern"]) for s in summaries) == [
        ("adt", "off"), ("adt", "on"), ("eagle2", "off"), ("eagle2", "on")
    ]  # fmt: skip
    for s in summaries:
        assert s["complete"] and s["n_samples"] == 2 and s["tau"] >= 1.0
        assert s["acceptance_rule"] == ("lantern" if s["lantern"] else "exact")
        job = Path(s["job_dir"])
        for kind in ("accept", "depth", "width"):
            assert Image.open(job / "maps" / f"run_{kind}.png").size == (256, 256)  # 4 × 4 grid, × 64
        trace = [json.loads(x) for x in (job / "trace.jsonl").read_text().splitlines()]
        if s["policy"] == "adt":
            assert {"alpha", "alpha_D", "N", "init", "D_policy"} <= set(trace[0])
    assert len(list((tmp_path / "outputs" / "cache" / "lantern").glob("*.npy"))) == 1  # shared by both on-jobs
    out = subprocess.run([sys.executable, str(SCRIPT), str(sweep)], env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("| job | policy | lantern | τ | d̄ | speedup | latency (s) |") and len(lines) == 6
    print(out.stdout)  # the measured table (pytest -s)
