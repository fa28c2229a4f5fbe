"""``benchmarks/gpu.sh STAGE …`` runs every stage end to end on the CPU under the simulated CUDA device
(``ADTBENCH_SIMULATE_DEVICE=cuda DEVICE=cuda``: the graphed path, CUDA's placement rules and the synchronisation
counts of a GPU run) with the tiny model at tiny sizes, in one invocation, so the commands a GPU session would spend
its device time on cannot rot unnoticed; each stage's files are checked, and a failing step is recorded while the next
ones run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adtbench.harness.provenance import code_version
from adtbench.tools.results import check_record, load_records

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"


def _env(tmp_path: Path, **over: str) -> dict[str, str]:
    return {
        **os.environ,
        "PY": sys.executable,
        "OUT": str(tmp_path / "out"),
        "RUN_DIR": str(tmp_path / "run"),
        "ADTBENCH_SIMULATE_DEVICE": "cuda",
        "DEVICE": "cuda",
        "MODELS": "tiny",
        "MODES": "graphs",
        "SIZES": "[1,2]",
        "REPEATS": "1",
        "OVERHEAD_PROMPTS": "1",
        "SPEED_MODEL": "tiny",
        "PROMPTS": "1",
        "ROWS": "[ar]",
        "BATCH_SIZES": "[1,2]",
        "BATCH_PROMPTS": "2",
        "PROBE_BUCKETS": "[1,2]",
        "TESTS_ARGS": "-k test_clock_synchronises_only_on_cuda",
        "TEST_WORKERS": "2",  # the script's xdist path with 3 interpreters, not its GPU default's 5 (one test runs)
        "JACOBI_WINDOWS": "4",
        "TREE_POLICIES": "eagle2",  # the trees stage's variants for one policy (3, not 9)
        "POLICY_MODEL": "tiny",
        # AR and SCD: a drafter policy's judgement (13 of this stage's 28 s) is test_bench_device.py's, on six policies
        "POLICY_NAMES": "[ar,scd]",
        "POLICY_PROMPTS": "2",
        "POLICY_BUCKETS": "[1,2]",
        "ADTBENCH_ROOT": str(tmp_path),  # cost-model caches and outputs stay in tmp
        **over,
    }


@pytest.mark.slow
def test_every_gpu_stage_runs_on_the_simulated_device(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stages = ["tests", "cost", "speed", "batch", "probe", "jacobi", "trees", "policies"]
    res = subprocess.run(["bash", str(SCRIPT), *stages], env=_env(tmp_path), capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["batch.json", "batch_tiny.png", "cost.json", "device.txt", "gpu.md", "jacobi.json",
                     "policies.json", "probe.json", "results", "speed.json", "tests.log", "trees.json"]  # fmt: skip
    table = (out / "gpu.md").read_text()
    assert [line for line in table.splitlines() if line.startswith("## ")] == [f"## {s}" for s in stages]
    assert "ADTBENCH_SIMULATE_DEVICE=cuda" in (out / "device.txt").read_text()
    # tests: pytest -m gpu on the simulated device (conftest's simulated mode), the selection passed through
    assert "1 passed" in (out / "tests.log").read_text()
    assert "pytest -m gpu tests/test_gpu.py -n 2 -k test_clock_synchronises_only_on_cuda: 1 passed" in table
    # cost: measured through the graphs (stand-in replays), the overhead with model time and synchronisations
    r = json.loads((out / "cost.json").read_text())["tiny_graphs"]
    assert [x["tree_nodes"] for x in r["verify"]] == [1, 2] and r["engine_compile"] is True
    assert r["measured_graph_replays"] > 0 and r["measured_graph_replays"] == r["measured_static_runs"]
    o = r["overhead"]
    # the default run (SCD, graphed: the device-resident step, engine.graphs.step=auto): one read per image, none per
    # forward
    assert o["target_forward_ms"] > 0 and o["graph_replays_per_cycle"] >= 1
    assert o["syncs_per_cycle"] == pytest.approx(o["prompts"] / o["cycles"])
    assert r["device"] == "simulated cuda (cpu)" and r["device_bandwidth_gbs"] is None  # no GPU figure invented
    # speed: the row's job ran simulated and graphed
    speed = json.loads((out / "speed.json").read_text())["graphs"]
    assert [x["row"] for x in speed] == ["ar"] and speed[0]["gpu"] == "simulated cuda (cpu)" and speed[0]["tau"] == 1
    assert speed[0]["aa_ratio"] > 0 and "| A/A [95 % CI] |" in table  # AA=true: the A/A control beside the speedup
    # batch: B = 1 and 2 on the simulated device, the plot copied out
    b = json.loads((out / "batch.json").read_text())["tiny"]
    assert [x["B"] for x in b["rows"]] == [1, 2] and b["environment"]["device"] == "simulated cuda (cpu)"
    assert (out / "batch_tiny.png").stat().st_size > 1000
    # probe: buckets replayed, graphed = eager logits (float32), the AR step's work, the synchronisation goal judged
    p = json.loads((out / "probe.json").read_text())["tiny"]
    assert [x["bucket"] for x in p["verify"]] == [1, 2] and all(x["argmax_agree"] == 1.0 for x in p["verify"])
    assert p["ar_step"]["graphed_work"]["graph_replays"] == 1 and p["ar_step"]["eager_work"]["graph_replays"] == 0
    assert p["goals"]["syncs_per_cycle"]["met"] is True and p["goals"]["verify64_steps"]["met"] is None
    assert table.count("| bucket | replay (ms) |") == 2 and "(stage probe: " in table  # probe, policies
    # jacobi: SCD / SJD / GSD / window=cost and the default head to head with AR, graphed, on the device
    j = json.loads((out / "jacobi.json").read_text())
    variants = ["scd_4", "sjd_16", "gsd_16", "sjd_pac_32", "scd_cost", "static_sampled", "scd_32_eager"]
    assert [x["variant"] for x in j["rows"]] == variants
    assert all(x["tau"] >= 1 for x in j["rows"])
    assert j["aa_ratio"] > 0 and table.count("A/A (AR against itself, one more side of the rotation): ") == 2
    # trees: the tree policies with graphed levels and verify, the verify eager, both eager, against AR in one job
    t = json.loads((out / "trees.json").read_text())
    assert {x["variant"] for x in t["rows"]} == {"eagle2", "eagle2_eager_verify", "eagle2_eager"}
    # the raw result files of the timing stages (speed, jacobi, trees), in results/'s format, under the device's name
    records = load_records(out / "results")
    assert sorted(r["path"] for r in records) == sorted(
        ["simulated-cuda-cpu/speed/ar.json"]
        + [f"simulated-cuda-cpu/jacobi/{v}.json" for v in variants]
        + [f"simulated-cuda-cpu/trees/{v}.json" for v in ("eagle2", "eagle2_eager_verify", "eagle2_eager")]
    )
    assert all(check_record(r) == [] and r["device_name"] == "simulated cuda (cpu)" for r in records)
    assert {r["commit"] for r in records} == {code_version()["commit"]} and all(
        len(r["prompt_ids"]) == 1 for r in records
    )
    # policies: every named policy judged on one set of captured models, with its CI and projection
    pol = json.loads((out / "policies.json").read_text())
    assert [x["policy"] for x in pol["policies"]] == ["ar", "scd"] and pol["host_launch_us"] > 0
    assert all(len(x["cycle_ms_per_image"]) == 2 for x in pol["policies"][1:])


def test_a_failing_step_is_recorded_and_the_next_ones_still_run(tmp_path: Path) -> None:
    """Every step failing (no python: ``PY=false``) does not stop the script: each later step still runs, each failure
    is named in gpu.md and the exit status is 1; an unknown stage is a usage error (2) before anything runs."""
    res = subprocess.run(["bash", str(SCRIPT), "probe", "batch"], env=_env(tmp_path, PY="false"), capture_output=True,
                         text=True)  # fmt: skip
    assert res.returncode == 1
    table = (tmp_path / "out" / "gpu.md").read_text()
    assert "failed steps: probe tiny merge probe.json batch tiny merge batch.json" in table and "## batch" in table
    bad = subprocess.run(
        ["bash", str(SCRIPT), "cost", "nope"], env=_env(tmp_path / "x"), capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown stage 'nope'" in bad.stderr and not (tmp_path / "x").exists()


EMU3_TINY_ARCH = (
    "model.arch.vocab_size=300 model.arch.hidden_size=32 model.arch.intermediate_size=64 "
    "model.arch.num_hidden_layers=2 model.arch.num_attention_heads=4 model.arch.num_key_value_heads=2 "
    "model.arch.num_codes=16 model.grid=[3,3] "
    "model.dtype=float32"
)


@pytest.mark.slow
def test_the_emu3_shape_probes_on_the_simulated_device(tmp_path: Path) -> None:
    """``MODELS=emu3`` (the Emu3-Gen shape: random init, GQA, end-of-line layout), here at tiny sizes through
    ``EMU3_ARCH``: the probe stage replays its verify buckets (graphed = eager argmax), times its AR step and counts
    its weights (the floor's bytes: every parameter of the lean network)."""
    out = tmp_path / "out"
    env = _env(tmp_path, MODELS="emu3", EMU3_ARCH=EMU3_TINY_ARCH, PROBE_PROMPTS="1")
    res = subprocess.run(["bash", str(SCRIPT), "probe"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    p = json.loads((out / "probe.json").read_text())["emu3"]
    assert p["model"] == "emu3" and p["cfg_rows"] == 2
    assert [x["bucket"] for x in p["verify"]] == [1, 2] and all(x["argmax_agree"] == 1.0 for x in p["verify"])
    assert p["ar_step"]["graphed_work"]["graph_replays"] == 1
    # 2 layers of (q 32×32 + k, v 16×32 each + o 32×32 + 3 MLP 32×64) + embedding and head 300×32 + final norm, fp32
    assert p["weight_bytes"] == 4 * (2 * (32 * 32 * 2 + 16 * 32 * 2 + 3 * 32 * 64) + 2 * 300 * 32 + 32)
