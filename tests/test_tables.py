"""`adtbench table` and analysis/ on a synthetic results tree with hand-computed numbers: ratio-of-sums τ /
d̄ / speedup, per-prompt metric means, set metrics, bootstrap CIs identical to results.bootstrap_ci, merged
runs superseding their shards, repeats pooled by prompt; markdown / LaTeX / CSV with the CI caveat mark, pandas'
LaTeX escaping and right-aligned numbers; analysis/ tables and sweep_table.py through the one command, every
table file ending with a newline (plots: test_plots.py, notebook: test_notebook.py)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from adtbench.harness.stats import bootstrap_ci
from adtbench.reporting.load import load_tree
from adtbench.reporting.tables import aggregate, main, render

ROOT = Path(__file__).resolve().parents[1]


def write_run(d: Path, policy: str, rows: list[tuple], lantern: str = "off", fid: float | None = None,
              shard: str | None = None, overrides: list[str] | None = None) -> Path:  # fmt: skip
    """rows: (prompt_id, committed, cycles, drafted_depth_sum, latency, baseline, clip)."""
    d.mkdir(parents=True)
    recs, evals = [], []
    for pid, k, c, ds, lat, base, clip in rows:
        recs.append({"prompt_id": pid, "committed": k, "cycles": c, "drafted_depth_sum": ds, "tree_depth_sum": ds,
                     "latency_s": lat, "baseline_latency_s": base, "tau": k / c, "speedup": base / lat})  # fmt: skip
        if clip is not None:
            evals.append({"prompt_id": pid, "clip_score": clip})
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"prompt_id": "torn')
    (d / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    choices = {"model": "tiny_llamagen", "policy": policy, "lantern": lantern, "dataset": "smoke"}
    summary = {"model": "tiny_llamagen", "policy": policy, "lantern": lantern == "on", "dataset": "smoke",
               "choices": choices, "n_samples": len(recs), "eval": {"values": {"fid": fid} if fid else {}}}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    cfg = {"policy": {"name": policy}, "lantern": {"enabled": lantern == "on"}, "dataset": {"shard": shard}}
    (d / "run_config.json").write_text(json.dumps(cfg))
    if overrides is not None:
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return d


AR = [("p1", 16, 16, 0, 1.0, 1.0, 30.0), ("p2", 16, 16, 0, 1.0, 1.0, 31.0), ("p3", 16, 16, 0, 1.0, 1.0, 32.0)]
EAGLE = [("p1", 16, 8, 40, 0.5, 1.0, 29.0), ("p2", 16, 4, 20, 0.25, 1.0, 30.0), ("p3", 16, 8, 40, 0.5, 1.0, 34.0)]
LANTERN = [(f"p{i}", 16, 4 + i, 5 * (4 + i), 0.2 * (1 + i), 1.0, None) for i in range(1, 5)]


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "results"
    write_run(root / "sweep" / "0_policy=ar", "ar", AR, overrides=["policy=ar"])
    write_run(root / "sweep" / "1_policy=eagle2", "eagle2", EAGLE, fid=12.5, overrides=["policy=eagle2"])
    s0 = write_run(root / "array" / "shard_0_of_2", "eagle2", LANTERN[:2], "on", shard="0/2")
    s1 = write_run(root / "array" / "shard_1_of_2", "eagle2", LANTERN[2:], "on", shard="1/2")
    merged = write_run(root / "array" / "merged", "eagle2", LANTERN, "on")
    (merged / "merge.json").write_text(json.dumps({"sources": [{"dir": str(s0)}, {"dir": str(s1)}]}))
    return root


def test_load_tree_reads_runs_and_samples_and_drops_superseded_shards(tree):
    runs, samples = load_tree(tree)
    assert sorted(runs["job"]) == ["0_policy=ar", "1_policy=eagle2", "merged"]
    assert len(samples) == 3 + 3 + 4  # the torn last lines are skipped, shards superseded by the merged run
    assert runs.set_index("job").loc["1_policy=eagle2", "fid"] == 12.5
    assert runs.set_index("job").loc["0_policy=ar", "ov.policy"] == "ar"
    assert samples.set_index(["run_dir", "prompt_id"])["clip_score"].notna().sum() == 6


def test_table_numbers_by_hand(tree):
    runs, samples = load_tree(tree)
    t = aggregate(runs, samples, by=["policy", "lantern"], n_boot=500, seed=3).set_index(["policy", "lantern"])
    ar, ea, la = t.loc[("ar", "off")], t.loc[("eagle2", "off")], t.loc[("eagle2", "on")]
    assert (ar["tau"], ar["d_bar"], ar["speedup"], ar["clip_score"]) == (1.0, 0.0, 1.0, 31.0)
    assert (ar["tau_lo"], ar["tau_hi"], ar["speedup_lo"], ar["speedup_hi"]) == (1.0, 1.0, 1.0, 1.0)
    assert ea["tau"] == pytest.approx(48 / 20) and ea["d_bar"] == pytest.approx(100 / 20)
    assert ea["speedup"] == pytest.approx(3.0 / 1.25) and ea["latency_s"] == pytest.approx(1.25 / 3)
    assert ea["clip_score"] == pytest.approx(31.0) and ea["fid"] == 12.5 and np.isnan(ea["fid_lo"])
    assert la["n"] == 4 and la["runs"] == 1 and la["tau"] == pytest.approx(64 / 26) and np.isnan(la["clip_score"])
    # the cluster bootstrap equals results.bootstrap_ci (same seed → same resamples) for one sample per prompt
    k = np.array([[16, 8, 1.0, 0.5], [16, 4, 1.0, 0.25], [16, 8, 1.0, 0.5]])
    lo, hi = bootstrap_ci(k, stat=lambda a: a[:, 0].sum() / a[:, 1].sum(), n_boot=500, seed=3)
    assert (ea["tau_lo"], ea["tau_hi"]) == pytest.approx((lo, hi), abs=1e-12) and lo < ea["tau"] < hi
    lo, hi = bootstrap_ci(k, stat=lambda a: a[:, 2].sum() / a[:, 3].sum(), n_boot=500, seed=3)
    assert (ea["speedup_lo"], ea["speedup_hi"]) == pytest.approx((lo, hi), abs=1e-12)
    lo, hi = bootstrap_ci(np.array([29.0, 30.0, 34.0]), n_boot=500, seed=3)
    assert (ea["clip_score_lo"], ea["clip_score_hi"]) == pytest.approx((lo, hi), abs=1e-12)


def test_repeats_are_pooled_and_resampled_by_prompt(tmp_path):
    root = tmp_path / "r"
    write_run(root / "a", "eagle2", EAGLE)
    write_run(root / "b", "eagle2", [(p, k, c + 8, ds, lat, base, clip) for p, k, c, ds, lat, base, clip in EAGLE])
    t = aggregate(*load_tree(root), by=["policy"], n_boot=200).iloc[0]
    assert t["n"] == 3 and t["runs"] == 2 and t["tau"] == pytest.approx(96 / (20 + 44))
    assert t["tau_lo"] <= t["tau"] <= t["tau_hi"]


def test_table_command_formats(tree, capsys):
    import pandas as pd

    assert main([str(tree), "--format", "csv", "--n-boot", "200", "--by", "policy,lantern"]) == 0
    csv = pd.read_csv(io.StringIO(capsys.readouterr().out)).set_index(["policy", "lantern"])
    assert csv.loc[("eagle2", "off"), "speedup"] == pytest.approx(2.4) and csv.loc[("ar", "off"), "n"] == 3
    assert main([str(tree), "--n-boot", "200"]) == 0  # default --by: what varies (policy, lantern)
    md = capsys.readouterr().out
    assert "| model" in md and "lantern" in md and "2.400 [" in md and "31.000 [" in md and "12.500" in md
    assert main([str(tree), "--format", "latex", "--n-boot", "50"]) == 0
    tex = capsys.readouterr().out
    assert "\\toprule" in tex and "\\bottomrule" in tex and "tiny\\_llamagen" in tex and "$\\tau$" in tex
    assert main([str(tree), "--by", "nonexistent"]) == 2
    assert main([str(tree / "nothing-here")]) == 1
    doc = tree.parent / "doc.md"
    doc.write_text("# x\nbefore\n<!-- t:start -->\nold\n<!-- t:end -->\nafter\n")
    assert main([str(tree), "--n-boot", "50", "--into", str(doc), "--marker", "t"]) == 0
    new = doc.read_text()
    assert new.startswith("# x\nbefore\n<!-- t:start -->\n| ") and new.endswith("<!-- t:end -->\nafter\n")
    assert "old" not in new and main([str(tree), "--into", str(doc), "--marker", "nope"]) == 2
    from adtbench.cli import SUBCOMMANDS

    assert SUBCOMMANDS["table"] == "adtbench.reporting.tables"


def test_analysis_tables(tree, tmp_path, capsys):
    from adtbench.reporting.plots import pareto_front
    from analysis.tables import main as analysis_main
    from analysis.tables import main_table, pivot, write_tables

    assert pareto_front([1.0, 2.0, 3.0, 2.5], [5.0, 4.0, 1.0, 0.5]) == [0, 1, 2]
    assert pareto_front([1.0, 2.0, 3.0], [5.0, 4.0, 1.0], maximize_y=False) == [2]
    table = main_table(tree, by=["policy", "lantern"], n_boot=100)
    pv = pivot(table, "speedup", ["policy"], "lantern")
    assert list(pv.columns) == ["policy", "lantern=off", "lantern=on"] and pv.iloc[0]["lantern=on"] == "—"
    assert [p.suffix for p in write_tables(table, tmp_path / "t")] == [".md", ".tex", ".csv"]
    out = tmp_path / "paper"  # python -m analysis.tables = adtbench table --write: the same numbers, one command
    assert analysis_main([str(tree), "--out", str(out), "--pivot", "lantern", "--n-boot", "100"]) == 0
    printed = capsys.readouterr().out
    assert main([str(tree), "--n-boot", "100"]) == 0 and capsys.readouterr().out in printed
    names = ["main.csv", "main.md", "main.tex", "speedup_pivot.md", "speedup_pivot.tex"]
    assert sorted(p.name for p in out.iterdir()) == names
    for p in out.iterdir():  # every table file ends with exactly one newline
        assert p.read_text().endswith("\n") and not p.read_text().endswith("\n\n"), p.name
    assert "[" in (out / "speedup_pivot.md").read_text()  # the pivot keeps its CIs


def test_every_written_and_printed_table_ends_with_one_newline(tree, tmp_path, capsys):
    for fmt in ("md", "latex", "csv"):
        f = tmp_path / f"t.{fmt}"
        assert main([str(tree), "--n-boot", "20", "--format", fmt, "--out", str(f)]) == 0
        assert f.read_text().endswith("\n") and not f.read_text().endswith("\n\n"), fmt
        assert main([str(tree), "--n-boot", "20", "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert out.endswith("\n") and not out.endswith("\n\n"), fmt
    assert main([str(tree), "--n-boot", "20", "--write", str(tmp_path / "w"), "--pivot", "nonexistent"]) == 2


# ----------------------------------------------------------------------------------------------------
# readable tables: CI caveat mark, pandas' LaTeX escaping, right-aligned numbers
# ----------------------------------------------------------------------------------------------------

SIX = [(f"p{i}", 16, 8, 40, 0.5, 1.0, 30.0 + i) for i in range(6)]


def _separator(md: str) -> list[str]:
    return [c.strip() for c in md.splitlines()[1].strip("|").split("|")]


def test_ci_over_fewer_than_5_prompts_is_marked_with_a_footnote(tmp_path):
    from adtbench.reporting.tables import render

    root = tmp_path / "r"
    write_run(root / "few", "ar", AR)  # 3 prompts
    write_run(root / "many", "eagle2", SIX, fid=3.0)  # 6 prompts
    t = aggregate(*load_tree(root), by=["policy"], n_boot=50)
    md = render(t, "md")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["ar"].count("]†") == 5 and "†" not in rows["eagle2"]  # τ, d̄, speedup, latency, CLIP
    assert "3.000" in rows["eagle2"] and "3.000 †" not in rows["eagle2"]  # a set metric has no CI: no mark
    assert md.count("† CI over fewer than 5 prompts") == 1
    tex = render(t, "latex")
    assert tex.count(r"$^\dagger$") == 5 + 1 and r"CI over fewer than 5 prompts" in tex  # 5 cells + the footnote
    t_many = aggregate(*load_tree(root / "many"), by=["policy"], n_boot=50)
    assert "†" not in render(t_many, "md") and r"\dagger" not in render(t_many, "latex")


def test_latex_escaping_is_pandas_own(tmp_path):
    from adtbench.reporting.tables import render

    root = tmp_path / "r"
    odd = "a_b~c^d{e}&f%g#h$i"
    write_run(root / "x", "eagle2", EAGLE, overrides=[f"policy.tree_name={odd}"])
    t = aggregate(*load_tree(root), by=["policy", "ov.policy.tree_name"], n_boot=20)
    tex = render(t, "latex")
    assert r"a\_b\textasciitilde c\textasciicircum d\{e\}\&f\%g\#h\$i" in tex
    assert r"policy.tree\_name" in tex and r"$\tau$" in tex and r"Speedup ($\times$)" in tex


def test_numeric_columns_are_right_aligned(tree):
    from adtbench.reporting.tables import render

    t = aggregate(*load_tree(tree), by=["policy", "lantern"], n_boot=20)
    md = render(t, "md")
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    align = dict(zip(header, _separator(md)))
    left, right = re.compile(r"^:-+$"), re.compile(r"^-+:$")
    assert left.match(align["policy"]) and left.match(align["lantern"]) and left.match(align["lossless"])
    assert all(right.match(align[c]) for c in header[3:]), align  # n, runs, τ, d̄, speedup, ...
    tex = render(t, "latex")
    n_num = len(header) - 3
    assert "\\begin{tabular}{lll" + "r" * n_num + "}" in tex


def test_sweep_table_and_pivot_alignment_and_escaping(tree, capsys):
    import importlib.util

    from analysis.tables import main_table, pivot, pivot_latex

    spec = importlib.util.spec_from_file_location("sweep_table", ROOT / "analysis" / "sweep_table.py")
    st = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(st)
    assert st.main([str(tree / "sweep")]) == 0  # adtbench table --by job,policy,lantern: one row per job, with CIs
    md = capsys.readouterr().out
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    assert header[:6] == ["job", "policy", "lantern", "lossless", "n", "runs"] and "speedup (×)" in header
    rows = [line for line in md.splitlines()[2:] if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows] == ["0_policy=ar", "1_policy=eagle2"] and "2.400 [" in rows[1]
    assert st.main([str(tree / "nothing")]) == 1 and st.main([]) == 2
    pv = pivot(main_table(tree, by=["model", "policy", "lantern"], n_boot=20), "speedup", ["model", "policy"])
    tex = pivot_latex(pv)
    assert "\\begin{tabular}{llrr}" in tex and "tiny\\_llamagen" in tex and "tiny_llamagen" not in tex


def _run_with_reference(d: Path, policy: str, rows: list[tuple], lossless: bool | None) -> Path:
    """A run whose samples carry ``reference_latency_s`` (rows: prompt, latency, baseline, reference or None) and
    whose summary records ``lossless`` (None: a run from before the flag) and what the reference ran on."""
    d.mkdir(parents=True)
    recs = [{"prompt_id": p, "committed": 8, "cycles": 4, "drafted_depth_sum": 4, "tree_depth_sum": 4, "latency_s": lat,
             "baseline_latency_s": base, "reference_latency_s": ref} for p, lat, base, ref in rows]  # fmt: skip
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    choices = {"model": "tiny_llamagen", "policy": policy, "lantern": "off", "dataset": "smoke"}
    summary = {"model": "tiny_llamagen", "policy": policy, "choices": choices, "n_samples": len(recs),
               "reference_baseline": "model.impl=hf (transformers, eager, attention sdpa)"}  # fmt: skip
    if lossless is not None:
        summary |= {"lossless": lossless, "lossless_reason": f"policy={policy}: as recorded"}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "run_config.json").write_text(json.dumps({"policy": {"name": policy}, "lantern": {"enabled": False}}))
    return d


def test_speedup_ref_beside_speedup_with_each_baseline_named_and_the_lossless_mark(tmp_path):
    """``speedup_ref`` = Σ reference / Σ method over the prompts with a reference timing (by hand), beside
    ``speedup``, both headers naming their baseline and a note naming what the reference ran on; ``lossless`` as
    recorded (``no`` explained under the table), derived for a run without the flag, ``mixed`` for a pooled group."""
    rows = [("p1", 1.0, 2.0, 6.0), ("p2", 2.0, 3.0, 8.0), ("p3", 1.0, 1.5, None)]
    _run_with_reference(tmp_path / "a", "eagle2", rows, True)
    _run_with_reference(tmp_path / "b", "zipar", [("p1", 1.0, 1.2, None)], False)
    _run_with_reference(tmp_path / "c", "ar", [("p1", 1.0, 1.0, None)], None)  # before the flag: derived
    runs, samples = load_tree(tmp_path)
    assert dict(zip(runs["policy"], runs["lossless"])) == {"eagle2": True, "zipar": False, "ar": True}
    assert "derived" in runs.set_index("policy").loc["ar", "lossless_reason"]
    t = aggregate(runs, samples, by=["policy"], n_boot=50).set_index("policy")
    assert t.loc["eagle2", "speedup_ref"] == pytest.approx(14.0 / 3.0)  # p3 has no reference timing
    assert t.loc["eagle2", "speedup"] == pytest.approx(6.5 / 4.0) and np.isnan(t.loc["zipar", "speedup_ref"])
    assert t.loc["eagle2", "speedup_ref_lo"] <= t.loc["eagle2", "speedup_ref"] <= t.loc["eagle2", "speedup_ref_hi"]
    assert list(t["lossless"]) == ["yes", "no", "yes"]
    md = render(aggregate(runs, samples, by=["policy"], n_boot=50), "md")
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    i = header.index("speedup vs lean AR (×)")
    assert header[i + 1] == "speedup vs reference AR (×)" and "speedup (×)" not in header
    assert "model.impl=hf (transformers, eager, attention sdpa)" in md and "a lossy method" in md
    tex = render(aggregate(runs, samples, by=["policy"], n_boot=50), "latex")
    assert "Speedup vs reference AR ($\\times$)" in tex and "model.impl=hf (transformers, eager, attention sdpa)" in tex
    pooled = aggregate(runs, samples, by=["model"], n_boot=20)  # eagle2 + zipar + ar in one group
    assert list(pooled["lossless"]) == ["mixed"]
    alone = aggregate(*load_tree(tmp_path / "b"), n_boot=20)  # no reference timing anywhere: no column, no note
    assert "speedup_ref" not in alone and "reference AR" not in render(alone, "md")
