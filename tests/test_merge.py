"""Shard + merge equals the unsharded run (same prompt ids in order, same tokens at T=0, τ and d̄ exact, the
speedup recomputed from all samples); merging refuses anything that would lose or double-count samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY_OVERRIDES
from hydra import compose, initialize_config_dir

from adtbench.harness.rundir import read_provenance, read_run_config
from adtbench.reporting.merge import MergeError, _without_shard, find_shard_dirs, main, merge_runs

ROOT = Path(__file__).resolve().parents[1]
COMMON = [*TINY_OVERRIDES, "sampling=greedy", "dataset.limit=3", "warmup=0", "progress=false", "maps.per_run=false"]


def decode(run_dir: Path, *overrides: str) -> Path:
    from adtbench.harness.app import run

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=[*COMMON, *overrides])
    run(cfg, run_dir, {"model": "tiny_llamagen", "policy": str(cfg.policy.name), "sampling": "greedy"})
    return run_dir


def lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("merge")
    return {
        "full": decode(d / "full"),
        "s0": decode(d / "array" / "shard_0_of_2", "dataset.shard=0/2"),
        "s1": decode(d / "array" / "shard_1_of_2", "dataset.shard=1/2"),
        "root": d,
    }


def test_shard_then_merge_equals_the_unsharded_run(runs):
    out = runs["root"] / "merged"
    s = merge_runs(find_shard_dirs([runs["root"] / "array"]), out)
    full, merged = lines(runs["full"] / "samples.jsonl"), lines(out / "samples.jsonl")
    assert [r["prompt_id"] for r in merged] == [r["prompt_id"] for r in full] == ["text-00002", "text-00003",
                                                                                   "text-00004"]  # fmt: skip
    assert [r["tokens"] for r in merged] == [r["tokens"] for r in full]
    assert all(r["tokens_match_baseline"] for r in merged) and s["greedy_matches_baseline"] is True
    fs = json.loads((runs["full"] / "summary.json").read_text())
    for key in ("n_samples", "tau", "d_bar", "d_bar_tree", "cycles_total", "committed_total", "n_prompts"):
        assert s[key] == fs[key], key
    # speedup recomputed from every sample (ratio of means), not averaged over shards
    assert s["speedup"] == pytest.approx(sum(r["baseline_latency_s"] for r in merged) /
                                         sum(r["latency_s"] for r in merged), rel=1e-12)  # fmt: skip
    assert s["complete"] and s["env_consistent"] and s["speedup_n"] == 3
    assert [m["shard"] for m in s["merged_from"]] == ["0/2", "1/2"] and s["policy"] == fs["policy"]
    assert [t["prompt_id"] for t in lines(out / "trace.jsonl")] == [r["prompt_id"] for r in merged]
    for r in merged:  # images present and identical to the shard's
        src = runs["s0"] if r["prompt_id"] != "text-00004" else runs["s1"]
        assert (out / r["image"]).read_bytes() == (src / r["image"]).read_bytes()
    info = json.loads((out / "merge.json").read_text())
    assert info["dataset_check"] == "passed" and info["missing_prompts"] == []
    assert json.loads((out / "run_config.json").read_text())["dataset"]["shard"] is None
    prov, shard = read_provenance(out), read_provenance(runs["s0"])  # the shards' commits and lossless flag
    assert prov is not None and shard is not None and prov["merged"] and prov["commits"] == shard["commits"]
    assert prov["lossless"] is s["lossless"] is True
    assert read_run_config(out) == _without_shard(read_run_config(runs["s0"]) or {})  # the config alone
    with pytest.raises(MergeError, match="--force"):
        merge_runs([runs["s0"], runs["s1"]], out)


def test_merge_refuses_what_would_lose_or_double_count(runs, tmp_path):
    with pytest.raises(MergeError, match=r"missing shard\(s\) \[1\]"):
        merge_runs([runs["s0"]], tmp_path / "a")
    with pytest.raises(MergeError, match="appears twice"):
        merge_runs([runs["s0"], runs["s0"], runs["s1"]], tmp_path / "b")
    partial = merge_runs([runs["s0"]], tmp_path / "c", allow_partial=True)
    assert partial["n_samples"] == 2 and partial["complete"] is False
    # a copy of shard 0 that claims to be shard 1: its prompts belong to another shard
    fake = tmp_path / "fake1"
    shutil.copytree(runs["s0"], fake)
    cfg = json.loads((fake / "run_config.json").read_text())
    cfg["dataset"]["shard"] = "1/2"
    (fake / "run_config.json").write_text(json.dumps(cfg))
    with pytest.raises(MergeError, match="holds prompts of another shard"):
        merge_runs([runs["s0"], fake], tmp_path / "d")
    # without the dataset to check against, the same overlap is caught as a duplicate prompt
    blind = []
    for name, d in (("s0", runs["s0"]), ("fake1", fake)):
        shutil.copytree(d, tmp_path / f"{name}_nodata")
        c = json.loads((d / "run_config.json").read_text())
        c["dataset"]["path"] = "/nonexistent/prompts.txt"
        (tmp_path / f"{name}_nodata" / "run_config.json").write_text(json.dumps(c))
        blind.append(tmp_path / f"{name}_nodata")
    with pytest.raises(MergeError, match="is in both"):
        merge_runs(blind, tmp_path / "e")


def test_merge_refuses_different_configs_and_the_command(runs, tmp_path, capsys):
    other = decode(tmp_path / "other1", "dataset.shard=1/2", "policy=chain")
    with pytest.raises(MergeError, match="policy"):
        merge_runs([runs["s0"], other], tmp_path / "x")
    assert main([str(runs["s0"]), str(runs["s1"]), "--out", str(tmp_path / "m")]) == 0
    assert "n=3/3" in capsys.readouterr().out
    assert main([str(runs["s0"]), "--out", str(tmp_path / "m2")]) == 2
    assert "missing shard" in capsys.readouterr().err
