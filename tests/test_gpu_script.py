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


def _env(tmp_path: Path, **over: str) -> dict[str, str]:
    return {
        **os.environ,
        "PY": sys.executable,
        "OUT": str(tmp_path / "out"),
        "RUN_DIR": str(tmp_path / "run"),
        "DEVICE": "cpu",
        "MODES": "eager",
        "SIZES": "[1,2]",
        "REPEATS": "2",
        "PROMPTS": "1",
        "ROWS": "[ar,static_sampled]",
        "BATCH_SIZES": "[1,2]",
        "BATCH_PROMPTS": "2",
        "TESTS": "0",
        "ANOLE_ARCH": SHRUNK,
        "ADTBENCH_ROOT": str(tmp_path),  # cost-model caches and outputs stay in tmp
        **over,
    }


@pytest.mark.slow
def test_gpu_script_smoke_run_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh")], env=_env(tmp_path), capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["batch.json", "batch_anole.png", "batch_mini.png", "cost.json", "device.txt", "gpu.md",
                     "run_default_summary.json"]  # fmt: skip
    assert len(names) <= 8  # what the device tool brings back from $OUT
    table = (out / "gpu.md").read_text()
    costs, batches = json.loads((out / "cost.json").read_text()), json.loads((out / "batch.json").read_text())
    assert sorted(costs) == ["anole_eager", "mini_eager"] and sorted(batches) == ["anole", "mini"]
    for m in ("anole", "mini"):
        r = costs[f"{m}_eager"]
        assert [x["tree_nodes"] for x in r["verify"]] == [1, 2] and r["overhead"]["cycle_ms"] > 0, m
        assert r["weight_bytes"] > 0 and r["engine_compile"] is False
        b = batches[m]
        assert b["environment"]["model"] == m and b["environment"]["prompts"] == 2, m
        assert [x["B"] for x in b["rows"]] == [1, 2] and all(x["speedup"] > 0 for x in b["rows"]), m
    assert table.count("| tree nodes | verify (ms) | × AR step |") == 2 and "policy=ar" in table
    assert table.count("| B | AR img/s | method img/s |") == 2
    assert "speedup=" in table and "torch" in (out / "device.txt").read_text()
    summary = json.loads((out / "run_default_summary.json").read_text())
    assert summary["n_samples"] == 1 and summary["speedup"] > 0


@pytest.mark.slow
def test_a_failing_step_is_recorded_and_the_rest_still_run(tmp_path: Path) -> None:
    """A step that fails (an unknown speed row) does not stop the script: the later steps run, the failure is
    named in gpu.md and the exit status is 1."""
    env = _env(tmp_path, MODELS="mini", ROWS="[no_such_row]")
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], env=env, capture_output=True, text=True)
    assert res.returncode == 1
    table = (tmp_path / "out" / "gpu.md").read_text()
    assert "failed steps: speed eager" in table and "speedup=" in table  # the default run ran after the failure
    assert (tmp_path / "out" / "run_default_summary.json").exists()
