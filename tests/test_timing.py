"""A timer that knows when it cannot be trusted: timing repeats (medians, ABBA order, token determinism), the
two-level bootstrap CI of the speedup, the load-average record and warning, ``engine.compile``, ``policy.bind``
and — end to end — ``policy=ar`` against its own baseline reading 1.00 ± 0.03 on 8 held-out prompts."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import read_jsonl, tiny_app_config, tiny_app_run

import adtbench.harness.job as job
import adtbench.harness.timing as timing
from adtbench.errors import ConfigError
from adtbench.harness.config import validate
from adtbench.harness.stats import bootstrap_ci, ratio_of_totals_ci, summarize
from adtbench.models.base import Capabilities

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["dataset.limit=3", "warmup=0", "progress=false", "maps.per_run=false", "save_images=false"]


def config(*overrides: str):
    return tiny_app_config(*QUICK, *overrides)


def decode_in_process(run_dir: Path, *overrides: str) -> dict:
    return tiny_app_run(run_dir, *QUICK, *overrides)


lines = read_jsonl


# ---------------------------------------------------------------------------------------------------------
# the two-level bootstrap
# ---------------------------------------------------------------------------------------------------------

BASE = [2.0, 2.2, 1.8, 2.5, 2.1, 1.9, 2.4, 2.0]
LAT = [1.0, 1.2, 0.9, 1.1, 1.0, 1.05, 1.3, 0.95]


def test_one_repeat_is_the_prompt_bootstrap() -> None:
    ci = ratio_of_totals_ci([[b] for b in BASE], [[x] for x in LAT], n_boot=500, seed=7)
    ref = bootstrap_ci(np.c_[BASE, LAT], stat=lambda a: a[:, 0].sum() / a[:, 1].sum(), n_boot=500, seed=7)
    assert ci == pytest.approx(ref, abs=1e-12)
    assert ci[0] < sum(BASE) / sum(LAT) < ci[1]


def test_identical_repeats_change_nothing() -> None:
    """Repeats that agree add no noise: the same interval as one repeat (the prompts drawn are the same)."""
    one = ratio_of_totals_ci([[b] for b in BASE], [[x] for x in LAT], n_boot=500)
    same = ratio_of_totals_ci([[b] * 3 for b in BASE], [[x] * 3 for x in LAT], n_boot=500)
    ragged = ratio_of_totals_ci([[b] * (1 + j % 3) for j, b in enumerate(BASE)],
                                [[x] * (1 + j % 3) for j, x in enumerate(LAT)], n_boot=500)  # fmt: skip
    assert same == pytest.approx(one, abs=1e-12) and ragged == pytest.approx(one, abs=1e-12)


def test_ci_widens_when_repeats_disagree() -> None:
    """Same medians (so the same point estimate), but method repeats that scatter ±30 %: a wider interval."""
    agree = ratio_of_totals_ci([[b] * 3 for b in BASE], [[x] * 3 for x in LAT], n_boot=2000)
    noisy = ratio_of_totals_ci([[b] * 3 for b in BASE], [[0.7 * x, x, 1.3 * x] for x in LAT], n_boot=2000)
    point = sum(BASE) / sum(LAT)
    assert noisy[0] < agree[0] < point < agree[1] < noisy[1]
    assert noisy[1] - noisy[0] > 1.5 * (agree[1] - agree[0])
    # a single prompt: no prompt variation at all, the interval is the timing noise alone
    assert ratio_of_totals_ci([[2.0] * 3], [[1.0] * 3]) == (2.0, 2.0)
    lo, hi = ratio_of_totals_ci([[2.0, 2.0, 2.0]], [[0.8, 1.0, 1.25]])
    assert lo < 2.0 < hi


def test_chunking_changes_nothing(monkeypatch) -> None:
    import adtbench.harness.stats as results

    rng = np.random.default_rng(3)
    clusters = [0.5 + rng.random((int(rng.integers(1, 5)), 2)) for _ in range(50)]

    def boots():
        return results.bootstrap_distribution(clusters, lambda x: x[..., 0].sum(-1) / x[..., 1].sum(-1), 300, 1,
                                              vectorized=True)  # fmt: skip

    whole = boots()
    monkeypatch.setattr(results, "BOOT_CHUNK_ELEMENTS", 500)  # many small chunks
    assert np.array_equal(boots(), whole)


def test_ratio_ci_rejects_unpaired_repeats() -> None:
    with pytest.raises(ValueError, match="repeats"):
        ratio_of_totals_ci([[1.0, 1.0]], [[1.0]])
    with pytest.raises(ValueError, match="prompts"):
        ratio_of_totals_ci([[1.0]], [])


def _rec(pid: str, base: list[float], lat: list[float]) -> dict:
    return {"prompt_id": pid, "cycles": 4, "committed": 8, "drafted_depth_sum": 8, "tree_depth_sum": 8,
            "latency_s": statistics.median(lat), "baseline_latency_s": statistics.median(base),
            "latency_repeats_s": lat, "baseline_latency_repeats_s": base}  # fmt: skip


def test_timing_spread_and_warning() -> None:
    """The timer's own noise: the median relative range of a prompt's repeats; above 5 % a warning."""
    quiet = summarize(
        [_rec(f"p{j}", [b, b * 1.01, b * 0.99], [x, x * 1.02, x * 0.98]) for j, (b, x) in enumerate(zip(BASE, LAT))]
    )
    assert quiet["timing_spread"] == pytest.approx(statistics.median([0.02] * len(BASE) + [0.04] * len(LAT)))
    assert quiet["timing_warning"] is None
    noisy = summarize(
        [_rec(f"p{j}", [b, b * 1.1, b * 0.9], [x, x * 1.1, x * 0.9]) for j, (b, x) in enumerate(zip(BASE, LAT))]
    )
    assert noisy["timing_spread"] == pytest.approx(0.2) and "20.0 %" in noisy["timing_warning"]
    single = summarize([_rec("p", [1.0], [1.0])])
    assert single["timing_spread"] is None and single["timing_warning"] is None


def test_summarize_reports_total_ratio_median_and_ci() -> None:
    recs = [_rec(f"p{j}", [b, b * 1.01, b * 0.99], [x, x * 1.02, x * 0.98]) for j, (b, x) in enumerate(zip(BASE, LAT))]
    s = summarize(recs)
    assert s["speedup"] == pytest.approx(sum(BASE) / sum(LAT))  # ratio of totals of the medians
    assert s["speedup_median"] == pytest.approx(statistics.median(b / x for b, x in zip(BASE, LAT)))
    assert s["speedup_median"] == s["speedup_per_prompt"]["median"]
    lo, hi = s["speedup_ci"]
    assert lo < s["speedup"] < hi and s["speedup_ci_level"] == 0.95
    assert "two-level" in s["speedup_ci_method"] and "repeats" in s["speedup_ci_method"]
    assert s["speedup_ci_caveat"] is None and s["timing_repeats"] == [3]
    few = summarize(recs[:4])
    assert "4 prompt(s) < 5" in few["speedup_ci_caveat"]
    none = summarize([dict(r, baseline_latency_s=None, baseline_latency_repeats_s=None) for r in recs])
    assert none["speedup_ci"] is None and none["speedup_median"] is None and none["speedup_ci_caveat"] is None
    with pytest.raises(ValueError, match="repeat counts"):
        summarize([dict(recs[0], latency_repeats_s=[1.0])])
    with pytest.raises(ValueError, match="latency_repeats_s"):
        summarize([dict(recs[0], latency_repeats_s=[])])
    with pytest.raises(ValueError, match="latency_repeats_s"):
        summarize([dict(recs[0], latency_repeats_s=[1.0, 0.0, 1.0])])


# ---------------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["timing.repeats=0"], "timing.repeats"),
        (["timing.repeats=1.5"], "timing.repeats"),
        (["timing.repeats=three"], "timing.repeats"),
        (["~timing.repeats"], "timing.repeats"),
        (["engine.compile=maybe"], "engine.compile"),
        (["engine.compile=true", "warmup=0"], "warmup"),
        (["timing.reference_baseline=yes"], "timing.reference_baseline"),
        # families without a reference implementation other than the baseline's: refused, naming why
        (["timing.reference_baseline=true"], "timing.reference_baseline"),  # tiny_llamagen: LlamaGen
        (["timing.reference_baseline=true", "model=mini", "drafter=mini"], "timing.reference_baseline"),
        (["timing.reference_baseline=true", "model=tar", "policy=ar"], "timing.reference_baseline"),
        (["timing.reference_baseline=true", "model=tiny_chameleon", "model.impl=hf"], "timing.reference_baseline"),
        (["timing.reference_baseline=true", "model=tiny_chameleon", "baseline=false"], "timing.reference_baseline"),
        (
            ["timing.reference_baseline=true", "model=tiny_chameleon", "decode.batch_size=2"],
            "timing.reference_baseline",
        ),
    ],
)
def test_bad_timing_and_engine_config_names_the_key(overrides, key) -> None:
    with pytest.raises(ConfigError) as err:
        validate(config(*overrides))
    assert err.value.key == key


def test_reference_baseline_refusals_say_why() -> None:
    """Each family without a reference implementation is refused with its reason (``models.registry.NO_REFERENCE``);
    Anole / Lumina-mGPT on their lean default are accepted (the reference is ``model.impl=hf``)."""
    from adtbench.harness.config import reference_impl

    for over, why in ((["model=mini", "drafter=mini"], "one implementation"), ([], "LlamaGen's reference"),
                      (["model=tar", "policy=ar"], "already runs through transformers")):  # fmt: skip
        with pytest.raises(ConfigError, match=why):
            validate(config("timing.reference_baseline=true", *over))
    with pytest.raises(ConfigError, match="already is the reference"):
        validate(config("timing.reference_baseline=true", "model=anole", "model.impl=hf", "policy=ar"))
    for model in ("anole", "lumina_mgpt", "tiny_chameleon"):
        cfg = config("timing.reference_baseline=true", f"model={model}", "policy=ar")
        assert validate(cfg).conf.timing.reference_baseline is True and reference_impl(cfg) == "hf"
    assert validate(config()).conf.timing.reference_baseline is False


def test_defaults() -> None:
    cfg = config()
    assert cfg.threads == 1 and cfg.timing.repeats == 1 and cfg.engine.compile is False
    assert str(cfg.paths.cache_dir).endswith(".cache")
    validate(config("engine.compile=true", "warmup=1", "timing.repeats=5"))


# ---------------------------------------------------------------------------------------------------------
# the app: repeats, order, determinism, load, bind, compile, resume
# ---------------------------------------------------------------------------------------------------------


def test_repeats_alternate_abba_and_must_agree() -> None:
    calls: list[str] = []

    def decode(p, seed, side):
        calls.append(side[0].upper())
        return SimpleNamespace(tokens=[1, 2, 3], latency_s=1.0)

    p = SimpleNamespace(prompt_id="x")
    runs, bases, refs, aas = timing.timed_prompt(decode, p, 5, 2, True, 0)
    assert calls == ["B", "M", "M", "B"] and len(runs) == len(bases) == 2 and refs == aas == []
    calls.clear()
    timing.timed_prompt(decode, p, 5, 1, True, 1)
    assert calls == ["M", "B"]  # prompt 1 with one repeat: method first, as before repeats existed
    calls.clear()
    timing.timed_prompt(decode, p, 5, 2, True, 1)
    assert calls == ["M", "B", "B", "M"]  # prompt 1 opens with the method whatever the repeat count
    calls.clear()
    timing.timed_prompt(decode, p, 5, 3, False, 0)
    assert calls == ["M", "M", "M"]

    n = iter(range(10))

    def drifting(p, seed, side):
        return SimpleNamespace(tokens=[next(n)] if side == "method" else [0], latency_s=1.0)

    with pytest.raises(RuntimeError, match="repeat 1 of the method"):
        timing.timed_prompt(drifting, p, 5, 2, True, 0)


def test_reference_baseline_is_interleaved_as_the_baseline_is() -> None:
    """With the reference baseline a repeat is a triple whose order reverses from repeat to repeat (R B M, M B R, …)
    and rotates from prompt to prompt (``timing.side_order``), and the reference's repeats must agree like the
    others'."""
    calls: list[str] = []

    def decode(p, seed, side):
        calls.append(side[0].upper())
        return SimpleNamespace(tokens=[1, 2, 3], latency_s=1.0)

    p = SimpleNamespace(prompt_id="x")
    runs, bases, refs, _ = timing.timed_prompt(decode, p, 5, 3, True, 0, reference=True)
    assert "".join(calls) == "RBMMBRRBM" and len(runs) == len(bases) == len(refs) == 3
    calls.clear()
    timing.timed_prompt(decode, p, 5, 1, True, 1, reference=True)
    assert calls == ["B", "M", "R"]  # the next prompt opens with the next rotation (side_order)
    n = iter(range(10))

    def drifting(p, seed, side):
        return SimpleNamespace(tokens=[next(n)] if side == "reference" else [0], latency_s=1.0)

    with pytest.raises(RuntimeError, match="repeat 1 of the reference"):
        timing.timed_prompt(drifting, p, 5, 2, True, 0, reference=True)


def test_speedup_ref_is_summarised_like_the_speedup() -> None:
    """``speedup_ref`` = Σ reference / Σ method with the same two-level CI as ``speedup`` (the same function over the
    reference's repeats), ``reference_over_baseline`` = Σ reference / Σ baseline; all None without a reference."""
    ref = [10.0, 11.0, 9.5, 12.0, 10.5, 10.0, 11.5, 9.0]
    recs = []
    for i, (b, lt, r) in enumerate(zip(BASE, LAT, ref)):
        reps = {"latency_repeats_s": [lt, lt * 1.02], "baseline_latency_repeats_s": [b, b * 0.99],
                "reference_latency_repeats_s": [r, r * 1.01]}  # fmt: skip
        recs.append({"prompt_id": f"p{i}", "cycles": 2, "committed": 4, "drafted_depth_sum": 0, "tree_depth_sum": 0,
                     "latency_s": statistics.median(reps["latency_repeats_s"]),
                     "baseline_latency_s": statistics.median(reps["baseline_latency_repeats_s"]),
                     "reference_latency_s": statistics.median(reps["reference_latency_repeats_s"]),
                     "reference_tokens_match_baseline": True, **reps})  # fmt: skip
    s = summarize(recs)
    lat = [r["latency_s"] for r in recs]
    refs = [r["reference_latency_s"] for r in recs]
    assert s["speedup_ref"] == pytest.approx(sum(refs) / sum(lat))
    assert s["speedup_ref_median"] == pytest.approx(statistics.median(a / b for a, b in zip(refs, lat)))
    ci = ratio_of_totals_ci([r["reference_latency_repeats_s"] for r in recs], [r["latency_repeats_s"] for r in recs])
    assert s["speedup_ref_ci"] == pytest.approx(list(ci)) and ci[0] < s["speedup_ref"] < ci[1]
    assert s["speedup_ref_n"] == 8 and s["reference_tokens_match_baseline"] is True
    assert s["reference_over_baseline"] == pytest.approx(sum(refs) / sum(r["baseline_latency_s"] for r in recs))
    assert s["speedup_ref"] == pytest.approx(s["speedup"] * s["reference_over_baseline"])
    assert s["reference_latency_s"] == pytest.approx(np.mean(refs))
    plain = summarize([{k: v for k, v in r.items() if not k.startswith("reference")} for r in recs])
    assert plain["speedup_ref"] is None and plain["speedup_ref_n"] == 0 and plain["speedup_ref_ci"] is None
    assert plain["speedup"] == s["speedup"] and plain["speedup_ci"] == s["speedup_ci"]
    with pytest.raises(ValueError, match="different repeat counts"):
        summarize([{**recs[0], "reference_latency_repeats_s": [1.0]}])


def test_repeats_stored_and_medians_used(tmp_path: Path, capsys) -> None:
    s = decode_in_process(tmp_path / "r", "timing.repeats=3")
    recs = lines(tmp_path / "r" / "samples.jsonl")
    for r in recs:
        assert len(r["latency_repeats_s"]) == 3 and len(r["baseline_latency_repeats_s"]) == 3
        assert r["latency_s"] == statistics.median(r["latency_repeats_s"])
        assert r["baseline_latency_s"] == statistics.median(r["baseline_latency_repeats_s"])
        assert r["speedup"] == pytest.approx(r["baseline_latency_s"] / r["latency_s"])
    assert s["timing_repeats"] == [3]
    assert s["speedup"] == pytest.approx(sum(r["baseline_latency_s"] for r in recs) / sum(r["latency_s"] for r in recs))
    assert s["speedup_median"] == pytest.approx(statistics.median(r["speedup"] for r in recs))
    lo, hi = s["speedup_ci"]
    assert lo <= s["speedup"] <= hi and s["speedup_ci_caveat"]  # 3 prompts < 5
    for key in ("threads", "cpu_count", "cpus_available", "load_before", "load_after", "load_peak",
                "bind_s", "warmup_s", "engine_compile"):  # fmt: skip
        assert key in s, key
    assert s["threads"] == 1 and s["cpus_available"] >= 1 and s["engine_compile"] is False
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["speedup_ci"] == [lo, hi]
    out = capsys.readouterr().out
    assert f"speedup={s['speedup']:.3f}x [{lo:.3f}, {hi:.3f}] (CI over 3 < 5 prompts) median=" in out


def test_load_above_cores_is_flagged(tmp_path: Path, monkeypatch, capsys, caplog) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 32.0, 16.0))
    s = decode_in_process(tmp_path / "l")
    assert s["load_before"] == 64.0 == s["load_after"] and s["load_peak"] == 64.0
    assert "exceeded" in s["load_warning"]
    assert "LOAD 64.00 > " in capsys.readouterr().out
    assert any(r.levelname == "WARNING" and "exceeded" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    s = decode_in_process(tmp_path / "quiet")
    assert s["load_warning"] is None and "LOAD" not in capsys.readouterr().out


def test_load_warning_rule(monkeypatch) -> None:
    assert timing.load_warning(1.9, 2.0, 2) is None  # at most the cores: fine
    assert "2.10 exceeded the 2 available core(s)" in timing.load_warning(0.5, 2.1, 2)
    assert timing.load_warning(None, None, 2) is None and timing.load_peak(None, 3.0) == 3.0

    def no_loadavg():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_loadavg)
    assert timing.load_average() is None


def test_bind_gets_the_cache_dir_and_is_timed(tmp_path: Path, monkeypatch) -> None:
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy

    seen, sources = [], []
    monkeypatch.setattr(job, "cost_source", lambda t, d, sp, cache: sources.append((t, d, cache)) or "source")
    monkeypatch.setattr(Eagle2Policy, "bind", lambda self, cost: seen.append(cost))
    s = decode_in_process(tmp_path / "b", f"paths.root_dir={tmp_path}")
    assert seen == ["source"] and len(sources) == 1 and sources[0][0] is not None and sources[0][1] is not None
    assert sources[0][2] == tmp_path / ".cache" and s["bind_s"] >= 0


def test_engine_compile_before_warmup(tmp_path: Path, monkeypatch) -> None:
    events: list[str] = []
    real_decode_ar = job.decode_ar
    monkeypatch.setattr(job, "compile_models", lambda target, drafter, cfg, **_: events.append("compile"))
    monkeypatch.setattr(job, "decode_ar", lambda *a: events.append("decode") or real_decode_ar(*a))
    s = decode_in_process(tmp_path / "c", "engine.compile=true", "warmup=1", "dataset.limit=1")
    assert events[0] == "compile" and events.count("compile") == 1 and "decode" in events
    assert s["engine_compile"] is True and s["warmup_s"] > 0


def test_compile_models_needs_the_method() -> None:
    cfg = config()
    called = []
    compiles = Capabilities(compile=True)
    ok = SimpleNamespace(compile_forward=lambda: called.append("x"), capabilities=compiles, device="cpu")
    job.compile_models(ok, ok, cfg)
    job.compile_models(ok, None, cfg)
    assert called == ["x"] * 3
    with pytest.raises(ConfigError, match="model family llamagen does not support compile"):
        job.compile_models(SimpleNamespace(capabilities=Capabilities(), device="cpu"), ok, cfg)
    with pytest.raises(ConfigError, match="model family llamagen does not support compile"):  # declared, not probed
        job.compile_models(SimpleNamespace(compile_forward=ok.compile_forward, capabilities=Capabilities()), ok, cfg)


def test_resume_with_repeats(tmp_path: Path) -> None:
    out = tmp_path / "res"
    decode_in_process(out, "timing.repeats=2", "dataset.limit=2")
    first = (out / "samples.jsonl").read_text().splitlines()
    s = decode_in_process(out, "timing.repeats=2", "dataset.limit=4")
    after = (out / "samples.jsonl").read_text().splitlines()
    assert after[:2] == first and len(after) == 4 and s["n_samples"] == 4 and s["complete"]
    assert all(len(json.loads(x)["latency_repeats_s"]) == 2 for x in after) and s["timing_repeats"] == [2]
    with pytest.raises(ConfigError, match="timing"):  # other repeats: another measurement protocol
        decode_in_process(out, "timing.repeats=3", "dataset.limit=4")


# ---------------------------------------------------------------------------------------------------------
# end to end: policy=ar against its own baseline
# ---------------------------------------------------------------------------------------------------------


def test_resume_of_a_run_dir_from_before_timing_and_engine(tmp_path: Path) -> None:
    out = tmp_path / "old"
    decode_in_process(out, "dataset.limit=1")
    rc = json.loads((out / "run_config.json").read_text())
    (out / "run_config.json").write_text(json.dumps({k: v for k, v in rc.items() if k not in ("timing", "engine")}))
    assert decode_in_process(out, "dataset.limit=2")["n_samples"] == 2  # the defaults match the old protocol
    rc = json.loads((out / "run_config.json").read_text())  # an engine node from before engine.acceptance
    (out / "run_config.json").write_text(json.dumps({**rc, "engine": {"compile": False}}))
    assert decode_in_process(out, "dataset.limit=2")["n_samples"] == 2
    with pytest.raises(ConfigError, match="timing"):
        decode_in_process(out, "dataset.limit=3", "timing.repeats=2")


def test_prompt_encoding_is_timed_apart_and_in_the_wider_scope(tmp_path: Path) -> None:
    s = decode_in_process(tmp_path / "e", "dataset.limit=2")
    rec = lines(tmp_path / "e" / "samples.jsonl")[0]
    assert rec["encode_s"] > 0 and rec["baseline_encode_s"] > 0 and s["encode_s"] > 0
    assert s["speedup_with_encode"] is not None and s["speedup_with_encode"] > 0
