"""Tracking: W&B offline writes its run dir (a fresh run per job); a failing or crashing W&B never fails the
job and the local records stay complete."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from conftest import TINY_OVERRIDES
from hydra import compose, initialize_config_dir

from adtbench.errors import ConfigError
from adtbench.tracking import NullLogger, build_logger

ROOT = Path(__file__).resolve().parents[1]
FAST = [*TINY_OVERRIDES, "dataset.limit=2", "warmup=0", "progress=false"]


def compose_cfg(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=list(overrides))


def decode(run_dir: Path, *overrides: str) -> dict:
    from adtbench.app import run

    return run(compose_cfg(*FAST, *overrides), run_dir, {"model": "tiny_llamagen", "policy": "eagle2"})


def samples(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]


def tracking(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "tracking.json").read_text())["runs"]


def test_logger_none_and_unknown_kind(tmp_path):
    assert isinstance(build_logger(compose_cfg("logger=none"), tmp_path, {}), NullLogger)
    with pytest.raises(ConfigError) as e:
        build_logger(compose_cfg("logger=none", "logger.kind=mlflow"), tmp_path, {})
    assert e.value.key == "logger.kind"


def test_wandb_offline_writes_its_run_dir_fresh_run_per_job(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    a, b = tmp_path / "job0", tmp_path / "job1"
    decode(a, "logger=wandb", "logger.system_stats=false")
    decode(b, "logger=wandb", "logger.system_stats=false", "policy=chain")
    ids = []
    for job in (a, b):
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1 and list(runs[0].glob("run-*.wandb")), list((job / "wandb").iterdir())
        (entry,) = tracking(job)
        assert entry["mode"] == "offline" and entry["status"] == "finished" and entry["samples_logged"] == 2
        assert entry["id"] in runs[0].name and "wandb sync" in entry["sync"]
        assert len(samples(job)) == 2 and json.loads((job / "summary.json").read_text())["complete"]
        ids.append(entry["id"])
    assert ids[0] != ids[1]  # the second job of the process got its own run
    assert tracking(b)[0]["job_type"] == "eagle2"  # job_type from the choices passed by the app


def fake_wandb(fail_init: bool = False, fail_log_at: int | None = None) -> types.ModuleType:
    """A stand-in ``wandb`` module whose init or log raises like an unreachable / crashing service."""
    mod = types.ModuleType("wandb")
    calls = {"log": 0, "finish": 0}

    class Run:
        id = "fake123"
        dir = ""

        def __init__(self) -> None:
            self.summary: dict = {}

        def log(self, data, step=None):
            calls["log"] += 1
            if fail_log_at is not None and calls["log"] >= fail_log_at:
                raise ConnectionError("wandb-core went away")

        def finish(self):
            calls["finish"] += 1

    def init(**kwargs):
        if fail_init:
            raise TimeoutError("Run initialization has timed out after 60.0 sec.")
        return Run()

    mod.init = init
    mod.Settings = lambda **kw: kw
    mod.Image = lambda *a, **kw: ("image", a, kw)
    mod.Table = lambda **kw: ("table", kw)
    mod.calls = calls
    return mod


def test_failing_wandb_init_does_not_fail_the_job(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(fail_init=True))
    s = decode(tmp_path / "job", "logger=wandb", "logger.mode=online")
    assert s["n_samples"] == 2 and len(samples(tmp_path / "job")) == 2
    (entry,) = tracking(tmp_path / "job")
    assert entry["status"] == "failed" and "timed out" in entry["error"] and entry["mode"] == "online"


def test_wandb_crash_mid_run_keeps_local_records(tmp_path, monkeypatch):
    mod = fake_wandb(fail_log_at=2)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    s = decode(tmp_path / "job", "logger=wandb", "dataset.limit=3")
    assert s["n_samples"] == 3 and s["complete"]
    assert [r["prompt_id"] for r in samples(tmp_path / "job")] == ["text-00002", "text-00003", "text-00004"]
    (entry,) = tracking(tmp_path / "job")
    assert entry["status"] == "failed" and "log_sample" in entry["error"] and "went away" in entry["error"]
    assert mod.calls["log"] == 2 and mod.calls["finish"] == 0  # turned off after the crash, no further calls
