"""The A/A control (``timing.aa``, issue 52): the AR baseline timed against itself in the speedup's interleaving.

The side order (every side opens a prompt, holds every position and precedes every other side equally often; the
A/A side meets the baseline as the method does), ``aa_ratio`` with its CI in samples and summary on the default run
path and in a ``-m`` sweep, the flag a planted baseline-side delay fires (summary, printed line, table), the columns of
``adtbench table`` / ``adtbench report`` / ``bench speed`` / ``bench versus``, and the config refusals."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY_OVERRIDES, read_jsonl, run_in_process, tiny_app_config, tiny_app_run

import adtbench.harness.timing as timing
from adtbench.errors import ConfigError
from adtbench.harness.config import refuse_reference_in_bench, validate
from adtbench.harness.stats import ratio_of_totals_ci, summarize
from adtbench.reporting.load import load_tree
from adtbench.reporting.tables import aggregate, render

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["warmup=0", "progress=false", "maps.per_run=false", "save_images=false", "policy=ar"]


def config(*overrides: str):
    return tiny_app_config(*QUICK, *overrides)


def decode_in_process(run_dir: Path, *overrides: str) -> dict:
    return tiny_app_run(run_dir, *QUICK, *overrides)


lines = read_jsonl


# ---------------------------------------------------------------------------------------------------------
# the side order
# ---------------------------------------------------------------------------------------------------------

BASES = {
    "plain": timing.sides(True),
    "reference": timing.sides(True, reference=True),
    "aa": timing.sides(True, aa=True),
    "reference+aa": timing.sides(True, reference=True, aa=True),
}


@pytest.mark.parametrize("name", list(BASES))
def test_side_order_balances_positions_openers_and_precedence(name: str) -> None:
    """Over one cycle of prompts (2 for two sides, 2k for k > 2) every side holds every position equally often — the
    opening one, right after a prompt's untimed set-up, included — and precedes every other side as often as it
    follows it; each repeat reverses the previous one."""
    base = BASES[name]
    k = len(base)
    cycle = 2 if k == 2 else 2 * k
    orders = [timing.side_order(base, i, 0) for i in range(cycle)]
    assert len({tuple(o) for o in orders}) == cycle  # no order twice in a cycle
    for pos in range(k):
        assert Counter(o[pos] for o in orders) == {s: cycle // k for s in base}, (name, pos)
    for a, b in itertools.permutations(base, 2):
        assert sum(o.index(a) < o.index(b) for o in orders) == cycle // 2, (name, a, b)
    for i in range(3 * cycle):
        assert timing.side_order(base, i, 1) == timing.side_order(base, i, 0)[::-1]
        assert timing.side_order(base, i, 2) == timing.side_order(base, i, 0)
        assert timing.side_order(base, i, 0) == orders[i % cycle]


@pytest.mark.parametrize("name", ["aa", "reference+aa"])
def test_the_aa_side_meets_the_baseline_as_the_method_does(name: str) -> None:
    """The design is the same set of orders with the method and the A/A side swapped: the (baseline, A/A) pair is
    timed in the interleaving of the (baseline, method) pair, so the A/A ratio is the speedup's noise floor."""
    base = BASES[name]
    cycle = 2 * len(base)
    orders = [tuple(timing.side_order(base, i, r)) for i in range(cycle) for r in (0, 1)]
    swap = {"method": "aa", "aa": "method"}
    assert Counter(orders) == Counter(tuple(swap.get(s, s) for s in o) for o in orders)


@pytest.mark.parametrize("repeats", [1, 2, 3, 4])
def test_two_sides_open_prompts_alternately_whatever_the_repeats(repeats: int) -> None:
    """Before: with an even ``timing.repeats`` the pair index i·R + r made the baseline open every prompt (the first
    decode after the previous prompt's image, records and writes). Through ``timed_results`` (the app's loop) prompt i
    now opens with the baseline iff i is even, for every repeat count; one repeat keeps the old order."""
    calls: list[tuple[str, str]] = []

    class FakeJob:
        batched = None
        reference = None

        def seed_of(self, p):
            return 0

        def decode(self, p, method, seed):
            calls.append((p.prompt_id, "method" if method else "baseline"))
            return SimpleNamespace(tokens=[1], latency_s=1.0)

    prompts = [SimpleNamespace(prompt_id=f"p{i}") for i in range(4)]
    list(timing.timed_results(FakeJob(), prompts, repeats, True))
    openers = [next(side for pid, side in calls if pid == p.prompt_id) for p in prompts]
    assert openers == ["baseline", "method"] * 2
    assert len(calls) == 2 * repeats * len(prompts)


def test_timed_prompt_runs_the_aa_side_and_checks_its_tokens() -> None:
    calls: list[str] = []

    def decode(p, seed, side):
        calls.append(side)
        return SimpleNamespace(tokens=[1, 2], latency_s=1.0)

    p = SimpleNamespace(prompt_id="x")
    runs, bases, refs, aas = timing.timed_prompt(decode, p, 5, 2, True, 0, aa=True)
    assert calls == ["method", "baseline", "aa", "aa", "baseline", "method"]
    assert len(runs) == len(bases) == len(aas) == 2 and refs == []

    def other(p, seed, side):
        return SimpleNamespace(tokens=[9] if side == "aa" else [1], latency_s=1.0)

    with pytest.raises(RuntimeError, match="A/A side decoded other tokens than the baseline"):
        timing.timed_prompt(other, p, 5, 1, True, 0, aa=True)


# ---------------------------------------------------------------------------------------------------------
# the summary
# ---------------------------------------------------------------------------------------------------------

BASE = [2.0, 2.2, 1.8, 2.5, 2.1, 1.9]
LAT = [1.0, 1.2, 0.9, 1.1, 1.0, 1.05]


def _records(aa_scale: list[float]) -> list[dict]:
    recs = []
    for i, (b, lt, s) in enumerate(zip(BASE, LAT, aa_scale)):
        reps = {"latency_repeats_s": [lt, lt * 1.01], "baseline_latency_repeats_s": [b, b * 0.99],
                "aa_latency_repeats_s": [b * s, b * s * 1.02]}  # fmt: skip
        recs.append({"prompt_id": f"p{i}", "cycles": 2, "committed": 4, "drafted_depth_sum": 0, "tree_depth_sum": 0,
                     "latency_s": statistics.median(reps["latency_repeats_s"]),
                     "baseline_latency_s": statistics.median(reps["baseline_latency_repeats_s"]),
                     "aa_latency_s": statistics.median(reps["aa_latency_repeats_s"]), **reps})  # fmt: skip
    return recs


def test_aa_ratio_is_summarised_like_the_speedup_and_flagged_off_one() -> None:
    """``aa_ratio`` = Σ baseline / Σ A/A side with the speedup's two-level CI; ``aa_warning`` only when the interval
    excludes 1; every A/A value None without A/A timings, the speedup unchanged."""
    recs = _records([1.03, 0.97, 1.01, 0.99, 1.02, 0.98])
    s = summarize(recs)
    base = [r["baseline_latency_s"] for r in recs]
    aa = [r["aa_latency_s"] for r in recs]
    assert s["aa_ratio"] == pytest.approx(sum(base) / sum(aa)) and s["aa_ratio_n"] == 6
    assert s["aa_ratio_median"] == pytest.approx(statistics.median(b / a for b, a in zip(base, aa)))
    ci = ratio_of_totals_ci([r["baseline_latency_repeats_s"] for r in recs], [r["aa_latency_repeats_s"] for r in recs])
    assert s["aa_ratio_ci"] == pytest.approx(list(ci)) and ci[0] <= 1.0 <= ci[1]
    assert s["aa_warning"] is None and s["aa_latency_s"] == pytest.approx(statistics.mean(aa))
    slow_base = summarize(_records([0.9] * 6))  # the A/A side 10 % faster on every prompt: the baseline is slowed
    assert slow_base["aa_ratio"] == pytest.approx(1 / 0.9, rel=0.02) and slow_base["aa_ratio_ci"][0] > 1
    assert "excludes 1:" in slow_base["aa_warning"]  # 6 prompts: no caveat
    few = summarize(_records([0.9] * 6)[:2])
    assert "excludes 1 (CI over 2 < 5 prompts: too few to resample)" in few["aa_warning"]
    plain = summarize([{k: v for k, v in r.items() if not k.startswith("aa_")} for r in recs])
    assert plain["aa_ratio"] is None and plain["aa_ratio_ci"] is None and plain["aa_ratio_n"] == 0
    assert plain["aa_warning"] is None and plain["speedup_ci"] == s["speedup_ci"]
    with pytest.raises(ValueError, match="different repeat counts"):
        summarize([{**recs[0], "aa_latency_repeats_s": [1.0]}])


# ---------------------------------------------------------------------------------------------------------
# the app: the default run path, a planted delay, a -m sweep
# ---------------------------------------------------------------------------------------------------------


def test_aa_on_the_default_run_path(tmp_path: Path, capsys) -> None:
    s = decode_in_process(tmp_path / "r", "timing.aa=true", "timing.repeats=2", "dataset.limit=3")
    recs = lines(tmp_path / "r" / "samples.jsonl")
    for r in recs:
        assert len(r["aa_latency_repeats_s"]) == 2 and r["aa_latency_s"] == statistics.median(r["aa_latency_repeats_s"])
        assert r["aa_ratio"] == pytest.approx(r["baseline_latency_s"] / r["aa_latency_s"])
    base, aa = sum(r["baseline_latency_s"] for r in recs), sum(r["aa_latency_s"] for r in recs)
    assert s["aa_ratio"] == pytest.approx(base / aa) and s["aa_ratio_n"] == 3
    lo, hi = s["aa_ratio_ci"]
    assert lo <= s["aa_ratio"] <= hi
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["aa_ratio_ci"] == [lo, hi]
    out = capsys.readouterr().out
    assert f"aa={s['aa_ratio']:.3f}x [{lo:.3f}, {hi:.3f}] (CI over 3 < 5 prompts)" in out
    assert ("A/A EXCLUDES 1" in out) == (s["aa_warning"] is not None)
    plain = decode_in_process(tmp_path / "plain", "dataset.limit=1")
    assert plain["aa_ratio"] is None and lines(tmp_path / "plain" / "samples.jsonl")[0]["aa_ratio"] is None
    assert " aa=" not in capsys.readouterr().out


def _plant_baseline_delay(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every baseline-side decode (not the A/A side's) reads ``seconds`` slower: a systematic side advantage."""
    real = timing.timed_prompt

    def planted(decode, *args, **kwargs):
        def slowed(p, seed, side):
            res = decode(p, seed, side)
            if side == "baseline":
                res.latency_s += seconds
            return res

        return real(slowed, *args, **kwargs)

    monkeypatch.setattr(timing, "timed_prompt", planted)


def test_a_planted_baseline_delay_fires_the_aa_flag(tmp_path: Path, monkeypatch, capsys) -> None:
    """A baseline side 20 ms slower than the A/A side (tiny AR decodes take 10–20 ms): ``aa_warning`` in the summary,
    ``A/A EXCLUDES 1`` in the printed line and the ``!`` mark in ``adtbench table``."""
    _plant_baseline_delay(monkeypatch, 0.02)
    s = decode_in_process(tmp_path / "runs" / "planted", "timing.aa=true", "dataset.limit=5")
    assert s["aa_ratio_ci"][0] > 1 and "excludes 1" in s["aa_warning"]
    assert "A/A EXCLUDES 1" in capsys.readouterr().out
    md = render(aggregate(*load_tree(tmp_path / "runs"), n_boot=200), "md")
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    row = [c.strip() for c in md.splitlines()[2].strip("|").split("|")]
    assert row[header.index("A/A (×)")].endswith(" !") and "! = its interval excludes 1" in md


@pytest.mark.slow
def test_aa_in_a_multirun(tmp_path: Path) -> None:
    """``run.py -m … timing.aa=true``: every job records ``aa_ratio`` with its CI in its samples and summary."""
    from adtbench.harness.rundir import find_runs, read_samples, read_summary

    sweep = tmp_path / "sweep"
    proc = run_in_process("-m", "policy=ar,static_sampled", *TINY_OVERRIDES[:3], "dataset.limit=2", "warmup=0",
                          "timing.aa=true", "save_images=false", "maps.per_run=false", "progress=false",
                          f"hydra.sweep.dir={sweep}", env={"ADTBENCH_ROOT": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = find_runs(sweep)
    assert len(jobs) == 2
    for d in jobs:
        s = read_summary(d)
        assert s["aa_ratio_n"] == 2 and s["aa_ratio_ci"][0] <= s["aa_ratio"] <= s["aa_ratio_ci"][1]
        assert all(r["aa_ratio"] > 0 and len(r["aa_latency_repeats_s"]) == 1 for r in read_samples(d))
    assert proc.stdout.count(" aa=") == 2


# ---------------------------------------------------------------------------------------------------------
# tables, report, bench speed, bench versus
# ---------------------------------------------------------------------------------------------------------


def _write_run(d: Path, policy: str, rows: list[tuple], aa: bool) -> Path:
    """rows: (prompt, latency, baseline, A/A latency)."""
    d.mkdir(parents=True)
    recs = [{"prompt_id": p, "committed": 8, "cycles": 4, "drafted_depth_sum": 4, "tree_depth_sum": 4,
             "latency_s": lat, "baseline_latency_s": base, **({"aa_latency_s": a} if aa else {})}
            for p, lat, base, a in rows]  # fmt: skip
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    choices = {"model": "tiny_llamagen", "policy": policy, "lantern": "off", "dataset": "smoke"}
    summary = {"model": "tiny_llamagen", "policy": policy, "choices": choices, "n_samples": len(recs),
               "lossless": True, "lossless_reason": "as recorded"}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "run_config.json").write_text(json.dumps({"policy": {"name": policy}, "lantern": {"enabled": False}}))
    return d


@pytest.fixture
def aa_tree(tmp_path: Path) -> Path:
    ids = [f"p{i}" for i in range(6)]
    _write_run(tmp_path / "t" / "ar", "ar", [(p, 1.0, 1.0 + 0.01 * (i % 3 - 1), 1.0) for i, p in enumerate(ids)], True)
    _write_run(tmp_path / "t" / "biased", "eagle2", [(p, 0.5, 1.2, 1.0) for p in ids], True)  # A/A 1.2: flagged
    _write_run(tmp_path / "t" / "plain", "adt", [(p, 0.5, 1.0, None) for p in ids], False)  # no A/A timed
    return tmp_path / "t"


def test_table_shows_aa_beside_the_speedup_with_absent_and_flagged_cells(aa_tree: Path) -> None:
    t = aggregate(*load_tree(aa_tree), by=["policy"], n_boot=200).set_index("policy")
    assert t.loc["ar", "aa_ratio"] == pytest.approx(1.0) and t.loc["eagle2", "aa_ratio"] == pytest.approx(1.2)
    assert t.loc["ar", "aa_ratio_lo"] <= 1.0 <= t.loc["ar", "aa_ratio_hi"] and t.loc["eagle2", "aa_ratio_lo"] > 1
    assert t.loc["adt", "speedup"] == pytest.approx(2.0) and math.isnan(t.loc["adt", "aa_ratio"])  # not measured
    md = render(aggregate(*load_tree(aa_tree), by=["policy"], n_boot=200), "md")
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    assert header[header.index("speedup (×)") + 1] == "A/A (×)"  # beside the speedup
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in md.splitlines()[2:5]}
    col = header.index("A/A (×)")
    assert cells["ar"][col].startswith("1.000 [") and not cells["ar"][col].endswith("!")
    assert cells["eagle2"][col].startswith("1.200 [1.200, 1.200]") and cells["eagle2"][col].endswith(" !")
    assert cells["adt"][col] == "—"  # absent: shown as such, not as a number
    assert "— = not measured" in md
    tex = render(aggregate(*load_tree(aa_tree), by=["policy"], n_boot=50), "latex")
    assert "A/A ($\\times$)" in tex


def test_report_shows_aa(aa_tree: Path, tmp_path: Path) -> None:
    from adtbench.reporting.report import build_report

    page = build_report([aa_tree], tmp_path / "rep", ["policy"], n_boot=50, plots=False).read_text()
    assert ">A/A (×)</th>" in page and "1.200 [1.200, 1.200] !" in page and "timing.aa=true" in page


def test_bench_speed_table_shows_aa_or_its_absence() -> None:
    from adtbench.tools.bench_speed import table

    common = {"tau": 1.0, "d_bar": 0.0, "nodes": 1.0, "speedup": 1.0, "speedup_ci": [0.98, 1.02],
              "speedup_median": 1.0, "load": {}}  # fmt: skip
    rows = [("timed", {**common, "aa_ratio": 1.01, "aa_ratio_ci": [0.99, 1.03], "aa_warning": None}),
            ("biased", {**common, "aa_ratio": 1.08, "aa_ratio_ci": [1.04, 1.12], "aa_warning": "excludes 1"}),
            ("old", common)]  # fmt: skip
    text = table(rows, "header")
    head = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    assert head[head.index("speedup [95 % CI]") + 1] == "A/A [95 % CI]"
    cell = {
        r.split("|")[1].strip(): r.split("|")[head.index("A/A [95 % CI]") + 1].strip() for r in text.splitlines()[4:7]
    }
    assert cell == {"timed": "1.01× [0.99, 1.03]", "biased": "1.08× [1.04, 1.12] !", "old": "–"}


def test_bench_versus_times_ar_against_itself(tmp_path: Path, capsys) -> None:
    from adtbench.tools.bench_versus import main, parse

    out = tmp_path / "versus.json"
    common = ["model=tiny_llamagen", "dataset=smoke", "warmup=0", "policy=static_sampled", "bench.prompts=2",
              "bench.repeats=1", f"bench.out={out}"]  # fmt: skip
    assert main([*common, "timing.aa=true", "--variant", "plain"]) == 0
    r = json.loads(out.read_text())
    assert r["aa_ratio"] > 0 and r["aa_ratio_ci"][0] <= r["aa_ratio"] <= r["aa_ratio_ci"][1]
    assert "A/A (AR against itself, one more side of the rotation): " in capsys.readouterr().out
    assert main([*common, "--variant", "plain"]) == 0
    assert json.loads(out.read_text())["aa_ratio"] is None
    with pytest.raises(ConfigError, match="reserved name 'aa'"):  # the A/A side's name
        parse(["--variant", "aa"])
    assert "A/A (AR against itself): not timed (timing.aa=false)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides", [["timing.aa=true", "baseline=false"], ["timing.aa=true", "decode.batch_size=2"], ["timing.aa=2"]]
)
def test_aa_config_refusals_name_the_key(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"timing\.aa"):
        validate(config(*overrides))


def test_bench_tools_without_a_speedup_refuse_aa() -> None:
    cfg = config("timing.aa=true")
    with pytest.raises(ConfigError, match=r"timing\.aa"):
        refuse_reference_in_bench(cfg, "cost")
    refuse_reference_in_bench(cfg, "versus")  # versus times it


def test_plots_never_read_aa_as_a_quality_metric(aa_tree: Path, tmp_path: Path) -> None:
    """``write_all`` picks the first value column that is a quality metric for its speedup–quality plot: the A/A
    column (a timing figure, in every timed table) is not one, so a tree without metrics draws no such plot."""
    pytest.importorskip("matplotlib")
    from adtbench.reporting.plots import write_all

    names = {p.name for p in write_all(aa_tree, tmp_path / "figs", n_boot=20)}
    assert "speedup.png" in names and not any(n.startswith("speedup_vs_") for n in names)


@pytest.mark.slow
def test_the_floor_script_runs_the_app_and_judges_each_run(tmp_path: Path) -> None:
    """``benchmarks/aa_floor.py`` (the A/A floor benchmark) runs the app as a user would and prints each run's speedup
    and ``aa_ratio`` and the medians; on the tiny model, one prompt, one repeat (smoke size: its verdict unread)."""
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "aa_floor.py"), "--runs", "1", "model=tiny_llamagen",
         "dataset=smoke", "dataset.limit=1", "timing.repeats=1", "sampling.cfg_scale=1.0"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "run 0: speedup " in proc.stdout and " aa " in proc.stdout, proc.stdout
    assert "aa_ratio: median " in proc.stdout and "speedup: median " in proc.stdout
