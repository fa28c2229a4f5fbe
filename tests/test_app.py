"""The Hydra app from the command line: outputs, resume (incl. a kill), bad input, multirun.

``run_cli`` starts ``run.py`` in a new interpreter; ``run_app`` runs the same command line through the same entry
function in this process (``conftest.run_in_process``: no interpreter, torch and Hydra start-up, ≈ 3 s a run).
Real processes stay where a test needs one: the runs that are killed (here and in ``test_batch``), interrupted or
checked for what a fresh interpreter prints (``test_user_faults``); ``test_mini`` and ``test_families`` run a whole
documented command line as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_RUN, run_in_process
from hydra import compose, initialize_config_dir
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
FAST = ["warmup=0", "progress=false", "maps.per_run=false"]


def with_tiny(args: tuple[str, ...] | list[str]) -> list[str]:
    """``TINY_RUN`` for every group that ``args`` does not choose itself."""
    chosen = {a.split("=", 1)[0] for a in args if "=" in a}
    flags = [a for a in args if a.startswith("-")]  # e.g. -m, before any override
    return flags + [f"{k}={v}" for k, v in TINY_RUN.items() if k not in chosen] + [a for a in args if a not in flags]


def run_cli(*args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *with_tiny(args)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_app(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``run_cli``'s command line, run in this process (``conftest.run_in_process``)."""
    proc = run_in_process(*with_tiny(args), env={"HYDRA_FULL_ERROR": "0"})
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "group,options",
    [
        ("model", ["tiny_llamagen", "tiny_chameleon", "mini", "mini_lowres"]),
        (
            "policy",
            [
                "ar",
                "chain",
                "static",
                "static_sampled",
                "eagle2",
                "adt",
                "zipar",
                "mulo",
                "sjd",
                "scd",
                "scd_cost",
                "gsd",
            ],
        ),
        ("lantern", ["on", "off"]),
        ("dataset", ["smoke", "text", "parti", "coco", "inline", "mini", "mini_quick"]),
        ("sampling", ["default", "greedy"]),
        ("drafter", ["eagle", "mini", "none"]),
        ("logger", ["none"]),
        ("experiment", ["lossless_check", "mini_lantern", "mini_adt_lantern"]),
    ],
)
def test_every_option_composes(group, options):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        for opt in options:
            cfg = compose("config", overrides=[f"{group}={opt}"])
            if opt == "lossless_check":  # presets are @package _global_
                assert cfg.sampling.temperature == 0.0 and cfg.model.dtype == "float64"
            elif opt == "mini_lantern":
                assert cfg.policy.name == "static" and cfg.policy.draft_sampling == "sample"
                assert list(map(list, cfg.policy.tree)) == [[0], [0, 0], [0, 0, 0]]
                assert cfg.lantern.enabled and cfg.lantern.delta == 0.3 and cfg.model.name == "mini"
            elif opt == "mini_adt_lantern":
                p = cfg.policy
                assert p.name == "adt" and p.budget == "cost" and p.draft_sampling == "sample"
                assert (p.K0, p.K_min, p.K_max, p.l_k) == (2, 1, 2, 1) and cfg.lantern.enabled
                assert cfg.lantern.delta == 0.3 and cfg.model.name == "mini" and cfg.drafter.path is not None
            else:
                assert group in cfg


def test_run_writes_records_summary_trace_images(tmp_path):
    out = tmp_path / "run"
    proc = run_app("model=tiny_llamagen", "policy=eagle2", "dataset.limit=3", f"hydra.run.dir={out}", *FAST)
    assert "speedup=" in proc.stdout and str(out) in proc.stdout
    assert " median=" in proc.stdout and "(CI over 3 < 5 prompts)" in proc.stdout
    recs = lines(out / "samples.jsonl")
    assert [r["prompt_id"] for r in recs] == ["text-00002", "text-00003", "text-00004"]
    need = (
        "prompt_id prompt seed tokens cycles tau d_bar target_forwards latency_s draft_s verify_s "
        "baseline_latency_s image"
    )
    for r in recs:
        assert set(need.split()) <= set(r)
        assert len(r["tokens"]) == 16 and r["tau"] >= 1.0 and r["baseline_latency_s"] > 0
        assert Image.open(out / r["image"]).size == (8, 8)
        assert r["tau"] == pytest.approx(r["committed"] / r["cycles"])
        assert r["latency_repeats_s"] == [r["latency_s"]]  # timing.repeats = 1: the median of one
        assert r["baseline_latency_repeats_s"] == [r["baseline_latency_s"]]
    s = json.loads((out / "summary.json").read_text())
    for key in [
        "tau",
        "d_bar",
        "d_bar_tree",
        "speedup",
        "latency_s",
        "baseline_latency_s",
        "n_samples",
        "model",
        "policy",
        "drafter",
    ]:
        assert key in s
    assert s["n_samples"] == 3 and s["model"] == "tiny_llamagen" and s["policy"] == "eagle2" and s["complete"]
    assert s["tau"] == pytest.approx(sum(r["committed"] for r in recs) / sum(r["cycles"] for r in recs))
    assert s["speedup"] == pytest.approx(sum(r["baseline_latency_s"] for r in recs) / sum(r["latency_s"] for r in recs))
    # the timing record: paired median, bootstrap CI (flagged: 3 prompts < 5), machine state, set-up times
    assert s["speedup_median"] == pytest.approx(sorted(r["speedup"] for r in recs)[1])
    assert s["speedup_ci"][0] <= s["speedup"] <= s["speedup_ci"][1] and s["speedup_ci_caveat"]
    assert s["speedup_ci_level"] == 0.95 and "bootstrap" in s["speedup_ci_method"] and s["timing_repeats"] == [1]
    assert s["threads"] == 1 and s["cpu_count"] >= s["cpus_available"] >= 1 and s["engine_compile"] is False
    assert s["load_peak"] == max(s["load_before"], s["load_after"]) >= 0  # 1-minute load averages
    assert (s["load_warning"] is None) == (s["load_peak"] <= s["cpus_available"])
    assert s["bind_s"] >= 0 and s["warmup_s"] >= 0
    traces = lines(out / "trace.jsonl")
    assert [t["prompt_id"] for t in traces] == [r["prompt_id"] for r in recs]
    assert all(len(t["a"]) == r["cycles"] and len(t["nodes"]) == r["cycles"] for t, r in zip(traces, recs))


@pytest.mark.slow
def test_greedy_run_matches_baseline(tmp_path):
    out = tmp_path / "g"
    run_app(
        "model=tiny_chameleon", "policy=static", "sampling=greedy", "dataset.limit=2", f"hydra.run.dir={out}", *FAST
    )
    s = json.loads((out / "summary.json").read_text())
    assert s["greedy_matches_baseline"] is True


@pytest.mark.slow
def test_resume_skips_done_prompts_and_refuses_other_config(tmp_path):
    out = tmp_path / "r"
    run_app("policy=chain", "dataset.limit=2", f"hydra.run.dir={out}", *FAST)
    first = (out / "samples.jsonl").read_text().splitlines()
    run_app("policy=chain", "dataset.limit=4", f"hydra.run.dir={out}", *FAST)
    after = (out / "samples.jsonl").read_text().splitlines()
    assert after[:2] == first and len(after) == 4
    assert len({json.loads(x)["prompt_id"] for x in after}) == 4
    proc = run_app("policy=eagle2", "dataset.limit=4", f"hydra.run.dir={out}", *FAST, check=False)
    assert proc.returncode == 2 and "hydra.run.dir" in proc.stderr and "policy" in proc.stderr


def kill_after(overrides: list[str], out: Path, lines_written: int = 2) -> int:
    """Start ``run.py`` into ``out``, SIGKILL it once ``samples.jsonl`` holds ``lines_written`` lines; returns the
    lines it held then."""
    args = [sys.executable, str(ROOT / "run.py"), *with_tiny([*overrides, f"hydra.run.dir={out}", *FAST])]
    proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = out / "samples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not samples.exists() or samples.read_text().count("\n") < lines_written):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return samples.read_text().count("\n")


@pytest.mark.slow
def test_kill_mid_run_then_resume_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "k"
    samples = out / "samples.jsonl"
    n_killed = kill_after(["policy=eagle2"], out)
    assert 2 <= n_killed < 8
    run_app("policy=eagle2", f"hydra.run.dir={out}", *FAST)  # the resume: the killed process was the real one
    ids = [r["prompt_id"] for r in lines(samples)]
    assert len(ids) == 8 == len(set(ids))
    assert sorted(p.name for p in (out / "images").iterdir()) == sorted(f"{i}.png" for i in ids)


BAD_INPUT = [
    ("policy.depth=0", "policy.depth"),
    ("policy.top_k=0", "policy.top_k"),
    ("policy.total_tokens=500", "policy.total_tokens"),
    ("sampling.temperature=-1", "sampling.temperature"),
    ("sampling.top_p=0", "sampling.top_p"),
    ("drafter=none", "drafter"),
    ("dataset=text", "dataset.path"),
    ("dataset.path=/nonexistent/prompts.txt", "dataset.path"),
    ("model.dtype=float8", "model.dtype"),
    ("policy.depth=deep", "policy.depth"),  # a type the schema cannot convert
    ("+policy.width=3", "policy.width"),  # a key the schema does not know
]


def compose_app(*overrides: str):
    """The app's config for ``overrides`` (tiny defaults, ``FAST``), composed in-process like ``run.py``."""
    from adtbench.harness.config import register_resolvers

    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=with_tiny([*overrides, *FAST]))


@pytest.mark.parametrize("override,key", BAD_INPUT)
def test_bad_input_names_the_key_before_loading(tmp_path, caplog, override, key):
    """In-process: the app's ``run`` raises the ConfigError naming ``key`` before any model is loaded (the
    ``main`` wrapper turns it into one line and exit 2: the end-to-end cases below)."""
    from adtbench.errors import ConfigError
    from adtbench.harness.app import run

    caplog.set_level("INFO", logger="adtbench")
    with pytest.raises(ConfigError) as e:
        run(compose_app(override), tmp_path / "x", {})
    assert e.value.key == key
    assert not any("loading model" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "x").exists()  # checked before the run dir is locked (created)


@pytest.mark.parametrize("override,key", [BAD_INPUT[2], BAD_INPUT[6]])
def test_bad_input_from_the_command_line_is_one_line_exit_2(tmp_path, override, key):
    proc = run_app(override, f"hydra.run.dir={tmp_path / 'x'}", *FAST, check=False)
    assert proc.returncode == 2, proc.stderr
    assert key in proc.stderr and "adtbench: config error:" in proc.stderr
    assert "loading model" not in proc.stderr + proc.stdout


def test_empty_prompt_file_and_unknown_option(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n\n")
    proc = run_app("dataset=text", f"dataset.path={empty}", f"hydra.run.dir={tmp_path / 'e'}", *FAST, check=False)
    assert proc.returncode == 2 and "dataset.path" in proc.stderr and str(empty) in proc.stderr
    proc = run_app("policy=nonexistent", check=False)
    assert proc.returncode == 2 and "eagle2" in proc.stderr  # Hydra's message lists the available options
    assert proc.stderr.strip().startswith("adtbench: config error: policy:") and len(proc.stderr.splitlines()) == 1


@pytest.mark.slow
def test_multirun_models_by_policies(tmp_path):
    sweep = tmp_path / "sweep"
    run_app("-m", "model=tiny_llamagen,tiny_chameleon", "policy=ar,chain,static,eagle2", "dataset.limit=1",
            f"hydra.sweep.dir={sweep}", *FAST)  # fmt: skip
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert len(summaries) == 8
    assert {(s["model"], s["policy"]) for s in summaries} == {
        (m, p) for m in ["tiny_llamagen", "tiny_chameleon"] for p in ["ar", "chain", "static", "eagle2"]
    }
    assert all(s["tau"] == 1.0 for s in summaries if s["policy"] == "ar")


@pytest.fixture(scope="module")
def tiny_anole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Anole checkpoint in the published layout (``adtbench make-tiny model=anole``)."""
    from adtbench.tools.make_tiny import write_tiny

    out = tmp_path_factory.mktemp("tiny") / "anole"
    write_tiny("anole", out)
    return out


def test_reference_baseline_on_a_tiny_anole_checkpoint(tmp_path, tiny_anole):
    """``timing.reference_baseline=true`` from the command line on a tiny Anole checkpoint: the AR baseline is timed
    through the lean network and through transformers (``model.impl=hf``, loaded a second time) in the same repeats;
    every record and the summary hold both ratios (the reference's with the same bootstrap CI), the run info names
    the reference, and the printed line shows ``speedup_ref`` beside ``speedup``. Greedy in float64: both AR
    implementations decode the same tokens (in float32 two implementations' rounding may break a near-tie of a random
    model's logits apart on some CPU)."""
    out = tmp_path / "ref"
    proc = run_app("model=anole", f"model.path={tiny_anole}", "policy=eagle2", "drafter.random=true",
                   "timing.reference_baseline=true", "timing.repeats=2", "dataset.limit=2", "sampling=greedy",
                   "model.device=cpu", "model.dtype=float64", f"hydra.run.dir={out}", *FAST)  # fmt: skip
    log = (out / "app.log").read_text()
    assert "timing.reference_baseline: loading model=anole again with model.impl=hf" in log
    recs = lines(out / "samples.jsonl")
    for r in recs:
        assert len(r["reference_latency_repeats_s"]) == 2 == len(r["baseline_latency_repeats_s"])
        assert r["reference_latency_s"] == pytest.approx(sum(r["reference_latency_repeats_s"]) / 2)  # median of 2
        assert r["speedup_ref"] == pytest.approx(r["reference_latency_s"] / r["latency_s"])
        assert r["reference_tokens_match_baseline"] is True and r["tokens_match_baseline"] is True
    s = json.loads((out / "summary.json").read_text())
    refs, lat = [r["reference_latency_s"] for r in recs], [r["latency_s"] for r in recs]
    assert s["speedup_ref"] == pytest.approx(sum(refs) / sum(lat)) and s["speedup_ref_n"] == 2
    assert s["speedup_ref_ci"][0] <= s["speedup_ref"] <= s["speedup_ref_ci"][1]
    assert s["reference_over_baseline"] == pytest.approx(sum(refs) / sum(r["baseline_latency_s"] for r in recs))
    assert s["reference_baseline"] == "model.impl=hf (transformers, eager, attention sdpa)"
    assert s["reference_tokens_match_baseline"] is True and s["speedup"] is not None
    assert f"speedup_ref={s['speedup_ref']:.3f}x" in proc.stdout and "speedup=" in proc.stdout
