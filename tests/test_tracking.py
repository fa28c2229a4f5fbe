"""Tracking: W&B offline writes its run dir (a fresh run per job); a failing or crashing W&B never fails the
job and the local records stay complete."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import TINY_OVERRIDES
from hydra import compose, initialize_config_dir

from adtbench.errors import ConfigError
from adtbench.harness.tracking import NullLogger, build_logger

ROOT = Path(__file__).resolve().parents[1]
FAST = [*TINY_OVERRIDES, "dataset.limit=2", "warmup=0", "progress=false"]


def compose_cfg(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=list(overrides))


def decode(run_dir: Path, *overrides: str) -> dict:
    from adtbench.harness.app import run

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


@pytest.mark.slow
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


# ----------------------------------------------------------------------------------------------------
# mode: WANDB_MODE vs logger.mode; stable run id and resume
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "cfg", "on_cli", "expected"),
    [
        ("online", "offline", False, ("online", "env")),  # an explicit environment setting wins over the config
        ("online", "offline", True, ("offline", "cli")),  # ... unless logger.mode was given on the command line
        (None, "offline", False, ("offline", "config")),
        ("", "online", False, ("online", "config")),  # an empty variable is no setting
        ("disabled", "online", True, ("online", "cli")),
        ("  offline ", "online", False, ("offline", "env")),
    ],
)
def test_resolve_mode(env, cfg, on_cli, expected):
    from adtbench.harness.tracking import resolve_mode

    assert resolve_mode(env, cfg, on_cli) == expected


def test_mode_on_cli_reads_override_keys():
    from adtbench.harness.tracking import mode_on_cli

    assert mode_on_cli(["logger=wandb", "logger.mode=online"]) is True
    assert mode_on_cli(["++logger.mode=offline"]) is True
    assert mode_on_cli(["logger=wandb", "logger.project=x", "policy=adt"]) is False
    assert mode_on_cli([]) is False


def test_mode_on_cli_from_hydra_config():
    """Inside a Hydra app the flag comes from HydraConfig.get().overrides.task."""
    from hydra.core.hydra_config import HydraConfig

    from adtbench.harness.tracking import mode_on_cli

    assert mode_on_cli() is False  # no Hydra app running
    for overrides, expected in ((["logger=wandb", "logger.mode=online"], True), (["logger=wandb"], False)):
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        try:
            assert mode_on_cli() is expected
        finally:
            HydraConfig.instance().cfg = None


def capture_wandb() -> types.ModuleType:
    """A fake ``wandb`` whose ``init`` records its keyword arguments."""
    mod = fake_wandb()
    mod.inits = []
    real_init = mod.init

    def init(**kwargs):
        mod.inits.append(kwargs)
        return real_init(**kwargs)

    mod.init = init
    return mod


@pytest.mark.parametrize(
    ("env", "on_cli", "mode", "source"),
    [("online", False, "online", "env"), ("online", True, "offline", "cli"), (None, False, "offline", "config")],
)
def test_environment_mode_reaches_wandb_and_tracking_json(tmp_path, monkeypatch, env, on_cli, mode, source):
    mod = capture_wandb()
    monkeypatch.setitem(sys.modules, "wandb", mod)
    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    tracker = build_logger(compose_cfg("logger=wandb"), tmp_path, {"policy": "adt"}, mode_on_cli=on_cli)
    tracker.finish()
    assert mod.inits[0]["mode"] == mode
    (entry,) = tracking(tmp_path)
    assert (entry["mode"], entry["mode_source"], entry["mode_config"]) == (mode, source, "offline")
    assert entry["mode_env"] == env


def test_stable_run_id_from_the_resolved_run_dir(tmp_path):
    from adtbench.harness.tracking import stable_run_id

    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    rid = stable_run_id(tmp_path / "a", "adt")
    assert rid == stable_run_id(tmp_path / "link", "adt") == stable_run_id(tmp_path / "x" / ".." / "a", "adt")
    assert rid != stable_run_id(tmp_path / "b", "adt")
    assert rid != stable_run_id(tmp_path / "a", "eval")  # evaluating a run dir is its own W&B run
    assert len(rid) <= 64 and rid.replace("-", "").isalnum()


@pytest.mark.slow
def test_resumed_job_continues_its_own_wandb_run(tmp_path, monkeypatch):
    """A requeued job (same run dir) resumes the W&B run of its first attempt: same id, resume='allow', and its
    sample steps continue after the samples already in samples.jsonl."""
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    job = tmp_path / "job"
    decode(job, "logger=wandb", "logger.system_stats=false", "dataset.limit=1")
    # W&B names offline dirs by the start second (+ run id) and adds "-1" to a second dir of the same second; the
    # first run started before its decode returned, so a second later the requeue starts in a later second (timing
    # from before the first decode was not enough: its cold imports can delay that run's start past the sleep)
    time.sleep(1.05)
    decode(job, "logger=wandb", "logger.system_stats=false", "dataset.limit=2")  # the requeue
    first, second = tracking(job)
    assert first["id"] == second["id"] and first["status"] == second["status"] == "finished"
    assert (first["first_step"], first["samples_logged"]) == (0, 1)
    assert (second["first_step"], second["samples_logged"]) == (1, 1)  # steps continue after the first attempt
    assert second["resume"] == "allow"
    offline = sorted((job / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(p.name.endswith(first["id"]) for p in offline)
    assert len(samples(job)) == 2
