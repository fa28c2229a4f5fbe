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
    """A requeued job (same run dir) writes the W&B run of its first attempt (same id); offline it replays the
    sample already in samples.jsonl at step 0, logs its own at step 1, and moves the first attempt's offline dir
    aside, so wandb/ holds one whole offline run."""
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    job = tmp_path / "job"
    decode(job, "logger=wandb", "logger.system_stats=false", "dataset.limit=1")
    # W&B names offline dirs by the start second (+ run id) and adds "-1" to a second dir of the same second; the
    # first run started before its decode returned, so a second later the requeue starts in a later second
    time.sleep(1.05)
    decode(job, "logger=wandb", "logger.system_stats=false", "dataset.limit=2")  # the requeue
    first, second = tracking(job)
    assert first["id"] == second["id"] and first["status"] == second["status"] == "finished"
    assert (first["first_step"], first["samples_logged"]) == (0, 1)
    assert (second["first_step"], second["replayed"], second["samples_logged"]) == (0, 1, 2)
    assert second["resume"] is None  # offline: no resume, the attempt is whole
    (offline,) = (job / "wandb").glob("offline-run-*")
    superseded = list((job / "wandb" / "superseded").iterdir())
    assert [p.name for p in superseded] == second["superseded"] and offline.name.endswith(first["id"])
    assert second["sync"] == f"wandb sync {offline}"
    assert len(samples(job)) == 2


# ----------------------------------------------------------------------------------------------------
# kill -9, rerun, sync: one W&B run with every sample (offline: each attempt is whole, earlier ones superseded)
# ----------------------------------------------------------------------------------------------------


def history_and_summaries(offline_dir: Path) -> tuple[list[dict], list[dict]]:
    """(history rows, adtbench summary updates) of an offline run's transaction log, as a sync would upload
    them: each history row ``{"_step": n, key: value}``; a summary update counts when it carries ``n_samples``
    (W&B's own ``_runtime`` / per-step summary records do not)."""
    from adtbench.harness.tracking import offline_records

    rows, sums = [], []
    for r in offline_records(offline_dir):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            upd = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.summary.update}
            if "n_samples" in upd:
                sums.append(upd)
    return rows, sums


@pytest.mark.slow
def test_kill_9_at_sample_5_of_12_then_rerun_gives_one_wandb_run_with_12_samples(tmp_path, monkeypatch):
    """The issue's check: a real process decoding 12 prompts with W&B offline is killed with SIGKILL once 5
    samples are committed; the rerun into the same run dir ends with ONE offline run in ``wandb/`` (the killed
    attempt's dir moved to ``wandb/superseded/``) whose log holds 12 sample steps 0…11 (one per prompt, in
    ``samples.jsonl`` order), one adtbench summary (n_samples = 12, the speedup CI as lo/hi), a 12-row samples
    table, and the written sync command names exactly that dir. The old code left two offline dirs of the same
    id (a sync replaces the first) and a table of the rerun's 7 rows."""
    pytest.importorskip("wandb")
    import os
    import signal
    import subprocess

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a red cube number {i}\n" for i in range(12)))
    out = tmp_path / "run"
    args = [sys.executable, str(ROOT / "run.py"), *TINY_OVERRIDES, "dataset=text", f"dataset.path={prompts}",
            "warmup=0", "progress=false", "maps.per_run=false", "logger=wandb", "logger.system_stats=false",
            f"hydra.run.dir={out}"]  # fmt: skip
    # no WANDB_* from this process: WANDB_SERVICE (set once an in-process test opened a run) would make both
    # attempts share this process's wandb-core, which keeps the killed attempt's run open ("run ID is in use")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples_file = out / "samples.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not samples_file.exists() or samples_file.read_text().count("\n") < 5):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_killed = samples_file.read_text().count("\n")
    assert 5 <= n_killed < 12, n_killed
    killed = list((out / "wandb").glob("offline-run-*"))
    assert len(killed) == 1  # the killed attempt's offline run
    time.sleep(1.05)  # W&B names offline dirs by the start second
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    recs = samples(out)
    assert len(recs) == 12 and len({r["prompt_id"] for r in recs}) == 12

    (offline,) = list((out / "wandb").glob("offline-run-*"))  # one run to sync
    assert [p.name for p in (out / "wandb" / "superseded").iterdir()] == [killed[0].name]
    rows, sums = history_and_summaries(offline)
    steps = [r["_step"] for r in rows if "sample/tau" in r]
    assert steps == list(range(12))  # every sample, each once, replayed ones first
    assert [r["sample/tau"] for r in rows if "sample/tau" in r] == [r["tau"] for r in recs]
    (summary,) = sums
    s = json.loads((out / "summary.json").read_text())
    assert summary["n_samples"] == 12 and summary["complete"] is True
    if s.get("speedup_ci") is not None:
        assert [summary["speedup_ci/lo"], summary["speedup_ci/hi"]] == pytest.approx(s["speedup_ci"])
    (table,) = list((offline / "files" / "media" / "table").glob("samples_*.table.json"))
    assert [row[0] for row in json.loads(table.read_text())["data"]] == [r["prompt_id"] for r in recs]

    first, second = tracking(out)
    assert first["id"] == second["id"] and first["status"] == "running"  # the killed attempt never finished
    assert second["status"] == "finished" and second["replayed"] == n_killed
    assert (second["samples_logged"], second["history_steps"]) == (12, 12)
    assert second["superseded"] == [killed[0].name]
    assert second["sync"] == f"wandb sync {offline}"
    # the written command, and a sync of the whole wandb/ dir, would upload exactly this one log (no server needed)
    wandb_cli = Path(sys.executable).parent / "wandb"
    for target in (str(offline), str(out / "wandb")):
        dry = subprocess.run([str(wandb_cli), "sync", "--dry-run", target], env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        said = dry.stdout + dry.stderr
        assert "Would sync 1 run(s)" in said and f"run-{first['id']}.wandb" in said, said


# ----------------------------------------------------------------------------------------------------
# adtbench eval attaches to the run it evaluates; merged runs and the speedup CI reach W&B
# ----------------------------------------------------------------------------------------------------


def test_eval_logs_into_the_run_it_evaluates(tmp_path, monkeypatch):
    """``adtbench eval <run dir>`` (``build_logger(attach=True)``) opens the evaluated run's W&B run: the same id,
    job type, group and name as the decode, that run's config (run_config.json, choices) plus the eval node;
    offline it replays the run's samples (its file is whole). The old code opened a separate ``eval`` run with
    the eval command's default config and no group."""
    mod = capture_wandb()
    monkeypatch.setitem(sys.modules, "wandb", mod)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    job = tmp_path / "arr" / "shard_0_of_2"
    decode(job, "logger=wandb", "logger.group=grp", "dataset.shard=0/2")
    dec = mod.inits[0]
    from adtbench.harness.tracking import build_logger

    cfg = compose_cfg("logger=wandb", "logger.group=grp")
    calls_before = mod.calls["log"]
    tracker = build_logger(cfg, job, {"policy": "eagle2", "model": "tiny_llamagen"}, attach=True)
    tracker.log_summary({"n_samples": 1, "eval": {"clip_score": 0.3}})
    tracker.finish()
    ev = mod.inits[1]
    assert (ev["id"], ev["job_type"], ev["group"], ev["name"]) == (dec["id"], "eagle2", "grp", dec["name"])
    run_config = json.loads((job / "run_config.json").read_text())
    assert ev["config"]["policy"] == run_config["policy"] and ev["config"]["dataset"]["shard"] == "0/2"
    assert "eval" in ev["config"] and ev["config"]["choices"]["policy"] == "eagle2"
    entry = tracking(job)[-1]
    assert entry["attached"] == "eval" and entry["replayed"] == len(samples(job))
    assert mod.calls["log"] - calls_before == len(samples(job)) + 1  # the replayed samples, then the table


def test_eval_of_a_run_decoded_without_wandb_uses_the_decode_identity(tmp_path, monkeypatch):
    mod = capture_wandb()
    monkeypatch.setitem(sys.modules, "wandb", mod)
    job = tmp_path / "arr" / "shard_1_of_2"
    decode(job, "dataset.shard=1/2")  # logger=none
    from adtbench.harness.tracking import build_logger, stable_run_id

    build_logger(compose_cfg("logger=wandb"), job, {"policy": "eagle2"}, attach=True).finish()
    (ev,) = mod.inits
    assert ev["id"] == stable_run_id(job, "eagle2") and ev["group"] == "arr" and ev["job_type"] == "eagle2"


def test_summary_flattening_keeps_the_speedup_ci():
    from adtbench.harness.tracking import _flatten

    flat = _flatten({"speedup": 1.5, "speedup_ci": [1.2, 1.8], "speedup_ref_ci": [1, 2], "x": [1, 2, 3],
                     "nested": {"fid_ci": [3.0, 4.0]}, "pair": [1.0, 2.0], "bad_ci": [True, 1.0]})  # fmt: skip
    assert flat == {"speedup": 1.5, "speedup_ci/lo": 1.2, "speedup_ci/hi": 1.8, "speedup_ref_ci/lo": 1.0,
                    "speedup_ref_ci/hi": 2.0, "nested/fid_ci/lo": 3.0, "nested/fid_ci/hi": 4.0}  # fmt: skip


def test_speedup_ci_reaches_wandb_summary(tmp_path, monkeypatch):
    mod = capture_wandb()
    runs = []
    real_init = mod.init
    mod.init = lambda **kw: runs.append(real_init(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", mod)
    s = decode(tmp_path / "job", "logger=wandb", "dataset.limit=5", "timing.repeats=2")
    assert s["speedup_ci"] is not None
    assert [runs[0].summary["speedup_ci/lo"], runs[0].summary["speedup_ci/hi"]] == s["speedup_ci"]


def test_merge_logs_the_merged_run_in_the_shards_group(tmp_path, monkeypatch):
    """``adtbench merge`` of shards decoded with logger=wandb logs the merged run: its own id (its dir), the
    shards' group, every merged sample and the merged summary with its speedup CI."""
    mod = capture_wandb()
    runs = []
    real_init = mod.init
    mod.init = lambda **kw: runs.append(real_init(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", mod)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    arr = tmp_path / "arr"
    for i in range(2):
        d = arr / f"shard_{i}_of_2"
        decode(d, "logger=wandb", "dataset.limit=4", f"dataset.shard={i}/2")
        (d / ".hydra").mkdir()
        (d / ".hydra" / "config.yaml").write_text("logger:\n  kind: wandb\n  mode: offline\n  project: p\n")
    from adtbench.reporting.merge import main

    calls_before = mod.calls["log"]
    assert main([str(arr), "--out", str(arr / "merged")]) == 0
    merged = mod.inits[-1]
    assert merged["group"] == "arr" and merged["job_type"] == "eagle2" and merged["name"] == "merged"
    assert merged["id"] not in {i["id"] for i in mod.inits[:2]} and merged["config"]["policy"]["name"] == "eagle2"
    assert mod.calls["log"] - calls_before == 4 + 1  # four merged samples, then the table
    m = json.loads((arr / "merged" / "summary.json").read_text())
    assert runs[-1].summary["n_samples"] == 4
    if m.get("speedup_ci") is not None:
        assert runs[-1].summary["speedup_ci/lo"] == m["speedup_ci"][0]
    assert main([str(arr), "--out", str(arr / "merged2"), "--no-wandb"]) == 0 and len(mod.inits) == 3


def test_wandb_pin_matches_the_api_used():
    """pyproject pins wandb at the first release with every call tracking.py makes: ``reinit="finish_previous"``
    and the Settings fields (0.19.10); the installed wandb has them, and writes the store version
    ``offline_records`` reads."""
    import inspect
    import re

    wandb = pytest.importorskip("wandb")
    pins = re.findall(r'"wandb>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert len(pins) == 2 and all(tuple(int(x) for x in p.split(".")) == (0, 19, 10) for p in pins), pins
    assert "finish_previous" in str(inspect.signature(wandb.init).parameters["reinit"].annotation)
    fields = wandb.Settings.model_fields
    assert {"init_timeout", "console", "silent", "x_disable_stats"} <= set(fields)


@pytest.mark.slow
def test_adtbench_eval_offline_lands_in_the_decoded_run(tmp_path, monkeypatch):
    """Real wandb, offline: decode 2 prompts with logger=wandb, then ``adtbench eval <run dir> eval=mini
    logger=wandb``: the run dir's wandb/ holds ONE offline run (the decode's dir superseded) with the decode's id,
    both samples at steps 0, 1 and a summary holding the speed metrics and the evaluation together."""
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    from adtbench.harness.eval import main

    job = tmp_path / "job"
    decode(job, "logger=wandb", "logger.system_stats=false")
    time.sleep(1.05)  # a later start second than the decode's offline dir
    rc = main([str(job), "eval=mini", "eval.mini.loader=test_eval:_tiny_loader", "logger=wandb",
               "logger.system_stats=false"])  # fmt: skip
    assert rc == 0
    dec, ev = tracking(job)
    assert ev["id"] == dec["id"] and ev["attached"] == "eval" and ev["replayed"] == 2 and ev["status"] == "finished"
    (offline,) = (job / "wandb").glob("offline-run-*")
    assert offline.name.endswith(dec["id"]) and ev["superseded"] == [Path(dec["sync"].split()[-1]).name]
    rows, sums = history_and_summaries(offline)
    assert [r["_step"] for r in rows if "sample/tau" in r] == [0, 1]
    (summary,) = sums
    assert summary["n_samples"] == 2 and any(k.startswith("eval/") for k in summary) and "tau" in summary
