"""``benchmarks/gpu.sh`` (issue 10 §5 in one command) runs end to end on the CPU with a shrunk Anole, so the commands a
GPU session would spend its device time on cannot rot unnoticed (the 7B cost model's command once failed before
building: tests/test_chameleon.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHRUNK = (
    "model.arch.hidden_size=32 model.arch.intermediate_size=64 model.arch.num_hidden_layers=1 "
    "model.arch.num_attention_heads=2 model.arch.num_key_value_heads=2 model.grid=[2,2]"
)


@pytest.mark.slow
def test_gpu_script_smoke_run_on_cpu(tmp_path: Path) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    env = {
        **os.environ,
        "PY": sys.executable,
        "OUT": str(out),
        "RUN_DIR": str(run_dir),
        "DEVICE": "cpu",
        "SIZES": "[1,2]",
        "REPEATS": "2",
        "PROMPTS": "1",
        "TESTS": "0",
        "ANOLE_ARCH": SHRUNK,
        "ADTBENCH_ROOT": str(tmp_path),  # cost-model caches and outputs stay in tmp
    }
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["cost_anole.json", "cost_anole.md", "cost_mini.json", "cost_mini.md", "device.txt",
                     "run_default.log", "run_default_summary.json"]  # fmt: skip
    assert len(names) <= 8  # what the device tool brings back from $OUT
    for m in ("anole", "mini"):
        r = json.loads((out / f"cost_{m}.json").read_text())
        assert [x["tree_nodes"] for x in r["verify"]] == [1, 2] and r["overhead"]["cycle_ms"] > 0, m
        assert "| tree nodes | verify (ms) | × AR step |" in (out / f"cost_{m}.md").read_text()
    summary = json.loads((out / "run_default_summary.json").read_text())
    assert summary["n_samples"] == 1 and summary["speedup"] > 0
    assert "speedup=" in (out / "run_default.log").read_text() and "torch" in (out / "device.txt").read_text()
    bad = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], env={**env, "MODELS": "bogus"},
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "known: anole mini" in bad.stderr
