"""User faults end as one key-named line (exit 2), never a traceback or silent data loss (issue 14 A).

Run-dir locking and a unique default run dir; corrupt weights files; c2i prompts; unwritable cache dirs;
``hydra.run.dir`` pointing at a file; over-long prompts and ``top_k``; weights-only loading everywhere;
relative paths resolved against ``paths.root_dir``; eval scores and LANTERN on the printed line; the app's
command line (issue 29): every bad override one line before anything is written, every sweep job checked before
the first starts, a job failing at run time not stopping the sweep, Ctrl-C one line and resumable.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_OVERRIDES, run_in_process, tiny
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from adtbench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "adtbench"
MINI = PKG / "weights" / "mini"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}


def cfg_of(*overrides: str, hydra_cfg: bool = False):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    flags = [a for a in args if a.startswith("-")]  # -m before any override, as Hydra's parser wants
    cmd = [sys.executable, str(ROOT / "run.py"), *flags, *TINY_OVERRIDES, "warmup=0", "progress=false",
           *(a for a in args if a not in flags)]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# --- data loss: the run-dir lock and a unique default run dir ------------------------------------------------


def test_run_dir_lock_refuses_a_second_writer_and_takes_over_a_stale_lock(tmp_path):
    from adtbench.harness.lock import RunDirLock
    from adtbench.harness.rundir import LOCK_FILE

    run_dir = tmp_path / "run"
    first = RunDirLock(run_dir)
    try:
        with pytest.raises(ConfigError) as ei:
            RunDirLock(run_dir)  # flock is per open file: a second open in this process conflicts too
        msg = str(ei.value)
        assert msg.startswith("hydra.run.dir:") and str(run_dir) in msg and f"pid {os.getpid()}" in msg
    finally:
        first.release()
    (run_dir / LOCK_FILE).write_text("999999999\n")  # a dead holder: its flock died with it
    again = RunDirLock(run_dir)
    assert (run_dir / LOCK_FILE).read_text().split() == [str(os.getpid())]
    again.release()


def test_cli_refuses_a_locked_run_dir_before_loading(tmp_path):
    from adtbench.harness.lock import RunDirLock

    run_dir = tmp_path / "busy"
    held = RunDirLock(run_dir)
    try:
        proc = run_cli(f"hydra.run.dir={run_dir}")
    finally:
        held.release()
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "hydra.run.dir" in err[0] and str(run_dir) in err[0] and f"pid {os.getpid()}" in err[0]
    assert "loading model" not in proc.stderr + proc.stdout and not (run_dir / ".hydra").exists()


def test_default_run_and_sweep_dirs_differ_within_one_second():
    hc = cfg_of(hydra_cfg=True).hydra
    for node in (hc.run, hc.sweep):
        raw = OmegaConf.to_container(node, resolve=False)["dir"]
        patterns = re.findall(r"\$\{now:([^}]*)\}", raw)
        t0 = dt.datetime(2026, 11, 23, 14, 59, 3, 100_000)
        t1 = t0 + dt.timedelta(milliseconds=5)
        assert [t0.strftime(p) for p in patterns] != [t1.strftime(p) for p in patterns], raw


def in_process(*args: str) -> subprocess.CompletedProcess:
    """``run_cli``'s command line run in this process (``conftest.run_in_process``: no interpreter start-up); the
    refusals checked this way are also checked once from a real process (the locked run dir, a bad override)."""
    flags = [a for a in args if a.startswith("-")]
    return run_in_process(*flags, *TINY_OVERRIDES, "warmup=0", "progress=false", *(a for a in args if a not in flags),
                          env={"HYDRA_FULL_ERROR": "0"})  # fmt: skip


def test_run_dir_that_is_a_file_is_one_line_exit_2(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    proc = in_process(f"hydra.run.dir={f}")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "hydra.run.dir" in line and str(f) in line


# --- bad input -----------------------------------------------------------------------------------------------


def test_truncated_mini_gpt_weights_fail_validation_naming_key_and_file(tmp_path):
    from adtbench.harness.config import validate
    from adtbench.models.registry import build_target

    ar = tmp_path / "ar16"
    shutil.copytree(MINI / "ar16", ar)
    truncate(ar / "gpt.safetensors")
    cfg = cfg_of(f"model.path={ar}")
    with pytest.raises(ConfigError) as ei:
        validate(cfg)  # before any weights are read
    assert ei.value.key == "model.path" and str(ar / "gpt.safetensors") in str(ei.value)
    assert "corrupt" in str(ei.value)
    with pytest.raises(ConfigError, match="corrupt") as ei:
        build_target(cfg.model)  # the loader says the same
    assert ei.value.key == "model.path"


def test_truncated_drafter_weights_name_drafter_path(tmp_path):
    from adtbench.harness.config import validate
    from adtbench.harness.drafters import build_drafter

    d = tmp_path / "drafter"
    shutil.copytree(MINI / "drafter", d)
    truncate(d / "model.safetensors")
    cfg = cfg_of("policy=static_sampled", f"drafter.path={d}")  # a drafting policy: the drafter is checked
    with pytest.raises(ConfigError, match="corrupt") as ei:
        validate(cfg)
    assert ei.value.key == "drafter.path" and str(d / "model.safetensors") in str(ei.value)
    target, _ = tiny()
    dcfg = OmegaConf.create({"kind": "eagle", "path": str(d / "model.safetensors"), "seed": 0})
    with pytest.raises(ConfigError, match="corrupt") as ei:
        build_drafter(dcfg, target)
    assert ei.value.key == "drafter.path"


def test_truncated_torch_checkpoint_is_corrupt_not_a_traceback(tmp_path):
    from adtbench.io import check_weights, load_weights

    p = tmp_path / "vq.pt"
    torch.save({"model": {"w": torch.zeros(64, 64)}}, p)
    assert set(load_weights("model.vq.path", p)) == {"model"}
    truncate(p)
    for fn in (check_weights, load_weights):
        with pytest.raises(ConfigError, match="corrupt") as ei:
            fn("model.vq.path", p)
        assert ei.value.key == "model.vq.path" and str(p) in str(ei.value)


def test_c2i_text_prompt_is_refused_with_the_dataset_naming_the_prompt(tmp_path):
    from adtbench.harness.app import run
    from adtbench.harness.config import check_prompts
    from adtbench.harness.data.prompts import load_dataset

    cfg = cfg_of("model=llamagen_c2i", "dataset=smoke", "policy=eagle2", "drafter.random=true")
    with pytest.raises(ConfigError) as ei:
        run(cfg, tmp_path / "r", {})  # model.path is a hub id: failing here means no model was touched
    first = load_dataset(cfg)[0].prompt_id
    assert ei.value.key == "dataset" and f"prompt {first} " in str(ei.value) and "class id" in str(ei.value)
    ok = cfg_of("model=llamagen_c2i", "dataset=inline", "dataset.text='207 golden retriever'")
    check_prompts(ok, load_dataset(ok))
    bad = cfg_of("model=llamagen_c2i", "dataset=inline", "dataset.text='1000'")
    with pytest.raises(ConfigError, match=r"inline-0000.*0\.\.999"):
        check_prompts(bad, load_dataset(bad))


def test_unwritable_cache_dirs_fail_with_the_config(tmp_path):
    from adtbench.harness.config import validate

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError) as ei:
        validate(cfg_of("lantern=on", f"lantern.cache_dir={blocker}/lantern"))
    assert ei.value.key == "lantern.cache_dir" and str(blocker) in str(ei.value)
    with pytest.raises(ConfigError) as ei:  # adt with budget: cost (its default) writes cost models there
        validate(cfg_of("policy=adt", f"paths.cache_dir={blocker}/cost"))
    assert ei.value.key == "paths.cache_dir"
    validate(cfg_of("lantern=on", f"lantern.cache_dir={tmp_path}/ok"))


def test_long_prompt_and_huge_top_k_warn_naming_the_limit(caplog):
    from adtbench.harness.job import clamp_top_k, prompt_overflow
    from adtbench.sampling_params import SamplingParams

    target, _ = tiny()
    limit = target.gpt.cfg.cls_token_num
    assert prompt_overflow(target, "a red cube") is None
    n, lim, unit = prompt_overflow(target, "word " * 2000)
    assert (n, lim, unit) == (2000, limit, "words")
    with caplog.at_level(logging.WARNING, logger="adtbench"):
        sp = clamp_top_k(SamplingParams(top_k=100000), target)
    assert sp.top_k == 0 and "100000" in caplog.text and str(target.layout.num_codes) in caplog.text
    assert clamp_top_k(SamplingParams(top_k=5), target).top_k == 5


# --- no silent random drafter (issue 39, item 2) ---------------------------------------------------------------

REAL = ("anole", "lumina_mgpt", "llamagen_t2i", "llamagen_c2i", "tar")  # the model configs that load a checkpoint
POLICY_NAMES = sorted(p.stem for p in (ROOT / "conf" / "policy").glob("*.yaml"))


def test_tiny_anole_with_adt_and_no_drafter_exits_2_before_loading(tmp_path, monkeypatch):
    """The goal: ``python run.py model=anole model.path=<tiny anole> policy=adt`` with no drafter is one line naming
    ``drafter.path``, the published drafter and the smoke-test key, exit 2, before any weights are read (no target is
    built: the registry's builder would fail this test) and before the run dir exists."""
    from adtbench.models import registry
    from adtbench.tools.make_tiny import write_tiny

    write_tiny("anole", tmp_path / "anole")
    run_dir = tmp_path / "run"

    def no_weights(*args, **kwargs):
        raise AssertionError("a target was built")

    monkeypatch.setattr(registry, "build_target", no_weights)
    proc = run_in_process("model=anole", f"model.path={tmp_path / 'anole'}", "policy=adt", f"hydra.run.dir={run_dir}",
                          env={"HYDRA_FULL_ERROR": "0"})  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("adtbench: config error: drafter.path: policy=adt"), proc.stderr
    assert "jadohu/anole_drafter" in err[0] and "drafter.random=true" in err[0]
    assert "loading model" not in proc.stderr + proc.stdout and not run_dir.exists()


@pytest.mark.slow
def test_missing_drafter_from_a_real_process(tmp_path):
    """The same refusal from a fresh interpreter (what a user sees; the checkpoint need not exist to be refused)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "run.py"), "model=lumina_mgpt", f"model.path={tmp_path / 'nothing'}",
           "policy=eagle2", f"hydra.run.dir={run_dir}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "drafter.path" in proc.stderr and "adtbench train drafter model=lumina_mgpt" in proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()


@pytest.mark.parametrize("model", REAL)
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_drafting_policy_on_every_checkpoint_needs_a_drafter(model, policy, tmp_path):
    """Refused iff the policy declares that it drafts with the EAGLE drafter (``drafts_with_eagle``, read from the
    built policy, not from a list of names); the message lists the model's published drafters from its yaml."""
    from adtbench.harness.config import build_policy, validate

    over = [f"model={model}", f"model.path={tmp_path}", f"policy={policy}", f"paths.cache_dir={tmp_path / 'c'}"]
    cfg = cfg_of(*over)
    drafts = build_policy(cfg).drafts_with_eagle
    if not drafts:
        if policy in ("scd", "sjd", "gsd"):  # a Jacobi loop drafts with EAGLE under init=drafter
            with pytest.raises(ConfigError, match=r"^drafter\.path: policy=") as e:
                validate(cfg_of(*over, "policy.init=drafter"))
            assert "drafter.random=true" in str(e.value)
        return
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.key == "drafter.path" and f"policy={cfg.policy.name} " in str(e.value) and "\n" not in str(e.value)
    published = OmegaConf.to_container(cfg.model.published_drafters)
    for d in published:
        assert d["path"] in str(e.value) and d["by"] in str(e.value)
    if not published:
        assert f"no public EAGLE drafter for model={model}" in str(e.value)
        assert f"adtbench train drafter model={model}" in str(e.value)
    validate(cfg_of(*over, "drafter.random=true"))  # the explicit smoke test runs


def test_published_drafters_are_the_papers(tmp_path):
    """The facts the refusal names live in the model yamls (schema-checked), not in Python."""
    got = {m: [d["path"] for d in OmegaConf.to_container(cfg_of(f"model={m}").model.published_drafters)] for m in REAL}
    assert got == {
        "anole": ["jadohu/anole_drafter"],
        "lumina_mgpt": [],
        "llamagen_t2i": ["jadohu/llamagen_drafter", "jadohu/llamagen2_drafter"],
        "llamagen_c2i": [],
        "tar": [],
    }


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["drafter.random=yes"], "drafter.random"),  # a string, not a flag
        (["drafter.random=true", "drafter.path=/x"], "drafter.random"),  # a random drafter loads no weights
        (["model.published_drafters=[jadohu/anole_drafter]"], "model.published_drafters[0]"),  # not {path, by}
        (["model.published_drafters=[{path: a/b}]"], "model.published_drafters[0]"),  # no `by`
        (["model.published_drafters=[{path: a/b, by: x, who: y}]"], "model.published_drafters[0].who"),
    ],
)
def test_drafter_keys_are_checked(overrides, key, tmp_path):
    from adtbench.harness.config import validate

    with pytest.raises(ConfigError) as e:
        validate(cfg_of("model=anole", f"model.path={tmp_path}", "policy=adt", *overrides))
    assert e.value.key.startswith(key), e.value
    cfg = cfg_of("model=anole")
    cfg.model.published_drafters = "jadohu/anole_drafter"  # not a list (as a yaml could write it)
    with pytest.raises(ConfigError, match=r"^model\.published_drafters: must be a list"):
        validate(cfg)


def test_models_with_a_drafter_of_their_own_or_random_weights_are_not_refused():
    """The shipped mini model drafts with its trained drafter (``model.drafter_path``); the in-memory tiny models are
    random targets (``model.random_init``), their random drafter is what they test; neither needs drafter.random."""
    from adtbench.harness.config import validate

    for over in (["policy=adt"], ["model=tiny_llamagen", "policy=eagle2"], ["model=tiny_chameleon", "policy=chain"],
                 ["model=anole", "model.random_init=true", "policy=eagle2"]):  # fmt: skip
        validate(cfg_of(*over))


def test_the_record_and_the_line_say_the_drafter_is_random(tmp_path):
    """``drafter_random`` in summary.json: true for a random drafter, false for a trained one, null without one; the
    printed line says RANDOM DRAFTER only for the first."""
    from adtbench.harness.records import Summary

    out = {}
    for name, over in {"random": ["policy=chain", "policy.depth=2"], "none": ["policy=ar"]}.items():
        proc = in_process(*over, "dataset.limit=1", "maps.per_run=false", f"hydra.run.dir={tmp_path / name}")
        assert proc.returncode == 0, proc.stderr
        out[name] = (json.loads((tmp_path / name / "summary.json").read_text()), proc.stdout)
    assert out["random"][0]["drafter_random"] is True and "RANDOM DRAFTER" in out["random"][1]
    assert out["none"][0]["drafter_random"] is None and "RANDOM DRAFTER" not in out["none"][1]
    trained = {**out["random"][0], "drafter_random": False}
    assert "RANDOM DRAFTER" not in Summary.from_json(trained).line()
    assert Summary.from_json(out["random"][0]).run["drafter_random"] is True


# --- security ------------------------------------------------------------------------------------------------


def _torch_load_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "load"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "torch"
    ]


def test_package_never_unpickles_arbitrary_objects():
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        for call in _torch_load_calls(ast.parse(f.read_text(), str(f))):
            kw = {k.arg: k.value for k in call.keywords}
            safe = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            if not safe:
                bad.append(f"{f.relative_to(ROOT)}:{call.lineno}")
    assert not bad, f"torch.load without weights_only=True: {bad}"


class _Smuggled:
    """Unpickles to a dict through a global call: only ``weights_only=False`` would run it."""

    def __reduce__(self):
        return (dict, ([("prompt", "a red cube"), ("tokens", list(range(16)))],))


def test_teacher_file_and_shards_load_weights_only(tmp_path):
    from adtbench.tools.train.drafter import build_teacher

    target, _ = tiny(dtype="float32")
    good = tmp_path / "teacher.pt"
    torch.save([{"prompt": f"p{i}", "tokens": list(range(16))} for i in range(3)], good)
    cfg = OmegaConf.create(
        {"seed": 0, "progress": False, "teacher": {"source": "file", "file": str(good), "cfg": True,
                                                   "shard_size": 2, "dtype": "float16"}}
    )  # fmt: skip
    first = build_teacher(cfg, target, tmp_path / "out", "train", 3)
    for shard in sorted((tmp_path / "out" / "teacher_train").glob("*.pt")):
        torch.load(shard, weights_only=True)  # shards hold plain tensors / lists / strings
    again = build_teacher(cfg, target, tmp_path / "out", "train", 3)  # from the shards
    assert [s.prompt for s in again] == [s.prompt for s in first]
    assert all(torch.equal(a.feats, b.feats) for a, b in zip(first, again))
    evil = tmp_path / "evil.pt"
    torch.save([_Smuggled()], evil)
    cfg.teacher.file = str(evil)
    with pytest.raises(ConfigError) as ei:
        build_teacher(cfg, target, tmp_path / "out2", "train", 1)
    assert ei.value.key == "teacher.file" and str(evil) in str(ei.value)


def test_training_checkpoint_loads_weights_only(tmp_path):
    from adtbench.tools.train.common import Checkpointer

    model = torch.nn.Linear(4, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 4)).sum().backward()
    optim.step()
    cfg = OmegaConf.create({"seed": 0, "steps": 3})
    ck = Checkpointer(tmp_path, cfg)
    ck.save(model, optim, 2, 1.5, {"counts": torch.arange(5)})
    torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    fresh = torch.nn.Linear(4, 3)
    step, elapsed, extra = Checkpointer(tmp_path, cfg).load(fresh, torch.optim.AdamW(fresh.parameters()))
    assert (step, elapsed) == (2, 1.5) and torch.equal(extra["counts"], torch.arange(5))
    assert torch.equal(fresh.weight, model.weight)


# --- paths ---------------------------------------------------------------------------------------------------


def test_relative_paths_resolve_against_root_dir(tmp_path, monkeypatch):
    from adtbench.harness.config import resolve_paths
    from adtbench.harness.data.prompts import load_dataset

    assert Path(cfg_of().paths.root_dir) == ROOT  # default: the checkout holding conf/, whatever the cwd
    root = tmp_path / "clone"
    (root / "data").mkdir(parents=True)
    (root / "data" / "prompts.txt").write_text("a red cube\na blue ball\n")
    shutil.copytree(MINI / "drafter", root / "drafter")
    monkeypatch.setenv("ADTBENCH_ROOT", str(root))
    monkeypatch.chdir(tmp_path)  # not the root: a cwd-relative lookup would miss
    cfg = cfg_of("dataset=text", "dataset.path=data/prompts.txt", "drafter.path=drafter")
    resolve_paths(cfg)
    assert cfg.dataset.path == str(root / "data" / "prompts.txt") and cfg.drafter.path == str(root / "drafter")
    assert [p.text for p in load_dataset(cfg)] == ["a red cube", "a blue ball"]
    cfg = cfg_of("model=anole")  # a hub id stays a hub id
    resolve_paths(cfg)
    assert cfg.model.path == "leloy/Anole-7b-v0.1-hf"
    (root / "up").mkdir()  # policy weight paths too (MuLo-SD's up-sampler, the drafter model's overrides)
    cfg = cfg_of("policy=mulo", "policy.upsampler_path=up", "+policy.drafter_overrides.path=drafter")
    resolve_paths(cfg)
    assert cfg.policy.upsampler_path == str(root / "up")
    assert cfg.policy.drafter_overrides.path == str(root / "drafter")


# --- the printed line ----------------------------------------------------------------------------------------


def test_summary_line_shows_eval_scores():
    from adtbench.harness.records import summary_line

    s = {"model": "mini", "policy": "adt", "n_samples": 4, "tau": 2.0, "d_bar": 2.9, "latency_s": 1.0}
    assert "eval" not in summary_line(s)
    s["eval"] = {"kind": "mini", "values": {"mini_agreement": 0.8125, "mini_fid": 12.345678, "clip_score": None}}
    line = summary_line(s)
    assert "eval=mini" in line and "mini_agreement=0.8125" in line and "mini_fid=12.35" in line
    assert "clip_score=n/a" in line
    s["eval"]["error"] = {"metric": "fid", "type": "OSError", "message": "x"}
    assert "FAILED(fid)" in summary_line(s)


@pytest.mark.parametrize(
    ("tool", "args", "key"),
    [
        ("bench", ["overhead", "policy.bogus=1"], "policy.bogus"),
        ("bench", ["cost", "policy=nosuch"], "policy"),
        ("bench", ["versus", "dataset.limit=[1", "--variant", "a"], "dataset.limit"),
        ("bench", ["versus", "policy=adt", "policy.budget=cost", "--variant", "a", "--variant", "b",
                   "policy=static_sampled"], "policy.budget"),
        ("bench", ["speed", "bogus=1", "bench.prompts=1"], "bogus"),
        ("train", ["ar", "bogus.key=1"], "bogus.key"),
        ("train", ["drafter", "teacher.bogus=1"], "teacher.bogus"),
    ],
)  # fmt: skip
def test_tools_report_a_bad_override_as_a_config_error_naming_its_key(tool, args, key, capsys, tmp_path) -> None:
    """Every compose()-based command (``adtbench bench | train | eval``) turns a Hydra composition error — an unknown
    key, a missing group option, a malformed value, a key another variant's group lacks — into one line naming the
    key, exit 2, before anything is built (``run.py`` has Hydra's own CLI for this)."""
    import importlib

    main = importlib.import_module({"bench": "adtbench.tools.bench", "train": "adtbench.tools.train.cli"}[tool]).main
    assert main(args) == 2
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert "config error" in text and f"{key}:" in text and "Traceback" not in text, text


def test_eval_reports_a_bad_override_as_a_config_error(capsys, tmp_path) -> None:
    from adtbench.harness.eval import main

    (tmp_path / "samples.jsonl").write_text("")
    assert main([str(tmp_path), "eval=mini", "eval.bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "config error: eval.bogus:" in err


# --- the app's command line: every error one line, nothing written; Ctrl-C; sweeps -----------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [("policy.bogus=1", "policy.bogus"), ("bogus=1", "bogus"), ("policy=foo", "policy"),
     ("policy.depth=deep", "policy.depth"), ("+policy.width=3", "policy.width"),
     ("sampling.top_p=0", "sampling.top_p")],
)  # fmt: skip
def test_precheck_names_the_key_of_every_bad_override(override, key, tmp_path):
    """Hydra's own composition errors (the first four: an unknown key or group option, a key the default policy
    lacks) and adtbench's checks alike are a ``ConfigError`` naming the key, before Hydra runs anything."""
    from adtbench.harness.app import CONF_DIR, check_config
    from adtbench.harness.precheck import check_command_line

    with pytest.raises(ConfigError) as ei:
        check_command_line([override, f"hydra.run.dir={tmp_path / 'r'}"], CONF_DIR, "config", check_config)
    assert ei.value.key == key, str(ei.value)
    assert "\n" not in str(ei.value) and not (tmp_path / "r").exists()
    assert check_command_line(["--cfg", "job", override], CONF_DIR, "config", check_config) == 0  # Hydra shows it


def test_precheck_resolves_hydra_interpolations_as_the_job_will():
    """``${hydra:...}`` in a job's config resolves in the precheck (HydraConfig set as ``run_job`` sets it); an
    interpolation that cannot resolve names its key once (``logger.name``)."""
    from adtbench.harness.app import CONF_DIR, check_config
    from adtbench.harness.precheck import check_command_line

    assert check_command_line(["logger=wandb", "logger.name=${hydra:job.name}"], CONF_DIR, "config", check_config) == 1
    sweep = ["-m", "policy=ar,eagle2", "logger=wandb", "logger.name=${hydra:job.num}"]
    assert check_command_line(sweep, CONF_DIR, "config", check_config) == 2
    with pytest.raises(ConfigError) as ei:
        check_command_line(["logger=wandb", "logger.name=${nosuch:x}"], CONF_DIR, "config", check_config)
    assert ei.value.key == "logger.name"


@pytest.mark.parametrize(
    ("override", "key", "run"), [("policy.bogus=1", "policy.bogus", run_cli), ("policy=foo", "policy", in_process)]
)
def test_a_bad_override_is_one_line_exit_2_and_leaves_no_run_dir(override, key, run, tmp_path):
    """A schema key error from a real process, a composition error (no such option) in this process."""
    run_dir = tmp_path / "runs" / "r"
    proc = run(override, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"adtbench: config error: {key}:")
    assert not (tmp_path / "runs").exists()  # no .adtbench.lock, .hydra/ or app.log


def test_a_multirun_checks_every_job_before_the_first_starts(tmp_path):
    sweep = tmp_path / "sweep"
    proc = in_process("-m", "policy.total_tokens=10,500,20", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("adtbench: config error: policy.total_tokens:")
    assert "job 1 of 3" in err and "policy.total_tokens=500" in err
    assert not sweep.exists() and "Launching" not in proc.stdout  # no job ran, nothing written


@pytest.mark.slow
def test_a_multirun_job_refused_at_run_time_does_not_stop_the_others(tmp_path):
    """Anole's weights are not here (hub id, offline): its job is refused once its dir exists, the dir is removed,
    and the next job still runs (Hydra's launcher semantics: every job of the sweep runs, then the first failure
    is reported and the exit code is 1)."""
    sweep = tmp_path / "sweep"
    proc = run_in_process("-m", "model=anole,tiny_llamagen", "drafter=eagle", "drafter.random=true", "dataset=smoke",
                          "dataset.limit=1", "policy=eagle2", "warmup=0", "progress=false", f"hydra.sweep.dir={sweep}",
                          env={"HYDRA_FULL_ERROR": "0", "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "adtbench: config error: model.path:" in proc.stderr and "Traceback" not in proc.stderr
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 1 and jobs[0].startswith("1_") and (sweep / jobs[0] / "summary.json").exists()


PACED_RUN = """
import runpy, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as at a terminal, also under a background launcher
from adtbench.harness.rundir_write import ResultStore
commit = ResultStore.commit
def paced(self, *args, **kwargs):
    out = commit(self, *args, **kwargs)
    time.sleep(1.0)
    return out
ResultStore.commit = paced
sys.argv = ["run.py", *sys.argv[1:]]
runpy.run_path("run.py", run_name="__main__")
"""
"""``python run.py`` with a second's pause after each committed prompt: the interrupt lands mid-run however loaded the
machine (tiny prompts could otherwise all finish between the first commit and the signal). SIGINT is set to Python's
own handler first: a process started from a background job inherits SIGINT ignored (a shell's ``cmd &``), and the
test is of the app's handling of a Ctrl-C, which a terminal always delivers."""


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_run_dir_resumes(tmp_path):
    run_dir = tmp_path / "r"
    args = [*TINY_OVERRIDES, "warmup=0", "progress=false", "maps.per_run=false", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-c", PACED_RUN, *args], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    samples = run_dir / "samples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not samples.exists() or samples.read_text().count("\n") < 1):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [f"adtbench: interrupted; every finished prompt is kept: rerun the same "
                                        f"command with hydra.run.dir={run_dir} to resume"]  # fmt: skip
    done = samples.read_text().count("\n")
    assert 1 <= done < 8
    # the resume and a refused resume: the same command line, in this process (the interrupted one was real)
    again = run_in_process(*args, env={"HYDRA_FULL_ERROR": "0"})
    assert again.returncode == 0, again.stderr
    ids = [json.loads(x)["prompt_id"] for x in samples.read_text().splitlines()]
    assert len(ids) == 8 == len(set(ids))
    other = run_in_process(*args, "seed=1", env={"HYDRA_FULL_ERROR": "0"})  # the dir a previous run left stays
    assert other.returncode == 2 and "hydra.run.dir" in other.stderr
    assert samples.read_text().count("\n") == 8 and (run_dir / "summary.json").exists()


def test_discard_new_run_dir_removes_only_what_this_process_created(tmp_path):
    from adtbench.harness.lock import RunDirLock, discard_new_run_dir

    new = tmp_path / "a" / "b" / "run"
    lock = RunDirLock(new)
    (new / "run_config.json").write_text("{}")
    assert discard_new_run_dir(new) and not (tmp_path / "a").exists() and lock.fd is None
    old = tmp_path / "old"
    old.mkdir()
    RunDirLock(old).release()
    assert not discard_new_run_dir(old) and old.exists()  # it existed before: never removed
    kept = tmp_path / "kept"
    lock = RunDirLock(kept)
    (kept / "samples.jsonl").write_text('{"prompt_id": "p0"}\n')
    assert not discard_new_run_dir(kept) and (kept / "samples.jsonl").exists()  # a committed prompt stays
    lock.release()


def test_summary_line_says_whether_lantern_was_on():
    from adtbench.harness.records import summary_line

    s = {"model": "mini", "policy": "adt", "n_samples": 4, "tau": 2.0, "d_bar": 2.9, "latency_s": 1.0}
    assert " lantern=off " in summary_line(s)
    s |= {"lantern": True, "lantern_params": {"k": 511, "delta": 0.1, "lam": None}}
    assert " lantern=on(delta=0.1,k=511) " in summary_line(s)
