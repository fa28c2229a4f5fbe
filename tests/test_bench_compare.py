"""``benchmarks/compare.sh`` (``adtbench.tools.bench_compare``): the no-regression comparison's plumbing — held-out
prompt files, ABBA order, the verdicts, one cost model for both sides, BASE in a temporary git worktree, and one
1-prompt, 1-row comparison of the working tree against itself on the tiny model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from adtbench.harness.data.prompts import load_prompts
from adtbench.tools import bench_compare as C

ROOT = Path(__file__).resolve().parents[1]


def test_held_out_prompts_skip_the_first_and_keep_the_ids(tmp_path: Path) -> None:
    dest = tmp_path / "p.txt"
    assert C.held_out_prompts(ROOT / C.PROMPTS_FILE, dest, offset=4, n=12) == 12
    mini = load_prompts(kind="text", path=str(ROOT / C.PROMPTS_FILE), limit=16, shard=None, caption="first")
    got = load_prompts(kind="text", path=str(dest), limit=None, shard=None, caption="first")
    assert [(p.prompt_id, p.text) for p in got] == [(p.prompt_id, p.text) for p in mini[4:]]  # ids → seeds


def test_jobs_alternate_abba_across_rounds() -> None:
    assert C.job_order(3) == [(0, "old"), (0, "new"), (1, "new"), (1, "old"), (2, "old"), (2, "new")]


def _jobs(old: list[float], new: list[float]) -> list[dict]:
    out = []
    for r, (a, b) in enumerate(zip(old, new)):
        for side, sp in (("old", a), ("new", b)):
            out.append({"round": r, "side": side, "tau": 2.0, "speedup": sp, "load_before": 0.5, "load_after": 1.5})
    return out


def test_verdicts_compare_the_median_speedups_against_the_noise() -> None:
    slow = C.row_result("x", _jobs([1.00, 1.02], [0.90, 0.91]), noise=0.03)
    assert slow["verdict"] == "SLOWER" and slow["ratio"] == pytest.approx(0.905 / 1.01)
    assert slow["load"] == [0.5, 1.5] and slow["paired"] == pytest.approx([0.91 / 1.02, 0.90 / 1.00])
    assert C.row_result("x", _jobs([1.00, 1.02], [1.01, 1.00]), noise=0.03)["verdict"] == "≈"
    assert C.row_result("x", _jobs([1.00, 1.00], [1.10, 1.12]), noise=0.03)["verdict"] == "faster"
    wide = C.row_result("x", _jobs([1.00, 1.00], [0.80, 1.00]), noise=0.03)  # rounds disagree: no verdict
    assert wide["noise"] == pytest.approx(0.1) and wide["verdict"] == "≈"
    other = C.row_result("x", [{**j, "tau": 2.2 if j["side"] == "new" else 2.0} for j in _jobs([1.0], [1.05])], 0.03)
    assert (
        other["ratio_equal_tau"] == pytest.approx(1.05 * 2.0 / 2.2)
        and other["verdict"] == "SLOWER at equal τ (τ +10.0 %)"
    )
    failed = C.row_result("x", [*_jobs([1.0], [1.0]), {"round": 1, "side": "old", "error": "exit 1"}], 0.03)
    assert failed["verdict"] == "FAILED (old)"
    assert "| x | 2.000 | 2.000 |" in C.table([slow, failed], "head")


def test_one_cost_model_serves_both_sides(tmp_path: Path) -> None:
    cost = tmp_path / "cost"
    cost.mkdir()
    model = {"verify_nodes": [1, 64], "verify_ms": [1.0, 2.0], "level_nodes": [1], "level_ms": [0.1], "fixed_ms": 0.1,
             "meta": {"load": 0.4, "measured_at": "t"}}  # fmt: skip
    mini, tiny = {"target": "Mini", "params": 10}, {"target": "Tiny", "params": 1}
    (cost / "new.json").write_text(json.dumps({"key": {**mini, "method": "b"}, "model": model}))
    big = {**model, "verify_nodes": [1, 128], "verify_ms": [5.0, 5.0]}  # another model: never shared into mini's
    (cost / "tiny.json").write_text(json.dumps({"key": {**tiny, "method": "b"}, "model": big}))
    (cost / "old.json").write_text(json.dumps({"key": {**mini, "method": "a"}, "model": {**model, "verify_ms": [9.0]}}))
    line = C.share_cost_models(tmp_path, {cost / "new.json", cost / "tiny.json"})
    old = json.loads((cost / "old.json").read_text())
    assert old["key"] == {**mini, "method": "a"} and old["model"]["verify_ms"] == [1.0, 2.0] and "load 0.4" in line
    assert old["model"]["meta"]["shared_from"] == "new.json"
    assert json.loads((cost / "tiny.json").read_text())["model"] == big
    (cost / "old.json").unlink()  # BASE keyed its model as the working tree does: it loaded the same file
    assert C.share_cost_models(tmp_path, {cost / "new.json", cost / "tiny.json"}).startswith("one cost model for both")
    (cost / "old2.json").write_text(json.dumps({"key": {"target": "Other"}, "model": model}))
    assert "none to share" in C.share_cost_models(tmp_path, {cost / "new.json", cost / "tiny.json"})


def test_base_commit_is_checked_out_into_a_temporary_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)  # fmt: skip

    git("init", "-q")
    for text in ("old", "new"):
        (repo / "f.txt").write_text(text)
        git("add", "f.txt")
        git("commit", "-qm", text)
    with C.checkout("HEAD~1", tmp_path, repo) as (path, what):
        assert (path / "f.txt").read_text() == "old" and what.startswith("HEAD~1 (")
    assert not path.exists()
    with pytest.raises(SystemExit, match="rev-parse"), C.checkout("no-such-ref", tmp_path, repo):
        pass


def test_bad_rows_are_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        C.parse(["HEAD", "no_such_row"])
    assert "no_such_row" in capsys.readouterr().err
    ns = C.parse(["HEAD~1", "ar", "--rounds", "3", "--cost-from", ".cache", "--", "model=tiny_llamagen"])
    assert ns.rows == ["ar"] and ns.rounds == 3 and ns.overrides == ["model=tiny_llamagen"]
    assert ns.cost_from == Path(".cache") and not ns.own_cost_models
    assert C.parse(["HEAD"]).rows == list(C.ROWS)


def test_a_one_prompt_one_row_comparison_writes_its_table(tmp_path: Path, capsys) -> None:
    """The working tree against itself (BASE given as a checkout's path): two app jobs on the tiny model, greedy, so
    both sides decode the same tokens: the same τ."""
    out = tmp_path / "cmp"
    args = [str(ROOT), "adt_cost_greedy", "--rounds", "1", "--prompts", "1", "--out", str(out), "--own-cost-models",
            "--", "model=tiny_llamagen", "warmup=0", "maps.per_run=false"]  # fmt: skip
    assert C.main(args) == 0
    (row,) = json.loads((out / "compare.json").read_text())
    assert row["row"] == "adt_cost_greedy" and [j["side"] for j in row["jobs"]] == ["old", "new"]
    assert row["tau_old"] == row["tau_new"] and row["speedup_old"] > 0 and row["verdict"] in ("≈", "SLOWER", "faster")
    assert all(j["n_samples"] == 1 for j in row["jobs"])
    assert "| adt_cost_greedy |" in (out / "compare.md").read_text()
    assert "| adt_cost_greedy |" in capsys.readouterr().out


def test_the_time_columns_tell_which_side_moved_and_a_saved_table_renders_again(tmp_path: Path, capsys) -> None:
    """``method time`` / ``AR time`` new/old: the ratio of each side's median latency — an unchanged method beside a
    faster AR baseline reads SLOWER by speedup, 1.0 by method time; ``--table`` prints a saved compare.json again."""
    jobs = [
        {**j, "latency_s": 1.0, "baseline_latency_s": 1.0 if j["side"] == "old" else 0.8}
        for j in _jobs([1.0, 1.0], [0.8, 0.8])
    ]
    r = C.row_result("x", jobs, noise=0.03)
    assert r["verdict"] == "SLOWER" and r["method_time"] == pytest.approx(1.0) and r["ar_time"] == pytest.approx(0.8)
    saved = tmp_path / "compare.json"
    saved.write_text(json.dumps([{"row": "x", "jobs": jobs}]))
    assert C.main(["-", "--table", str(saved)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| x |"))
    assert "| 1.000 | 0.800 |" in line and line.endswith("| SLOWER |")
