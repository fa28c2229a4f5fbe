"""Every published speed figure comes from a committed result file (``results/``, ``adtbench.tools.results``):

- the README's and docs/speed.md's tables are exactly what ``adtbench results`` renders from ``results/`` (a changed
  figure, a changed file, or a file naming no commit, device, prompts or date fails);
- every result file's speedup is its own per-prompt latencies' ratio of totals;
- no speedup is stated by hand in README.md or docs/speed.md outside the rendered blocks (one place per figure);
- a GPU device's files get their own column and table; without them the GPU table says none is committed;
- a ``bench versus`` result (``gpu.sh``'s jacobi / trees stages) becomes one file per variant."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest

from adtbench.tools import render_results as R
from adtbench.tools.results import check_record, device_slug, load_records, records_from_versus, write_record

ROOT = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r"\d\.\d\d×")  # a speedup as the tables print it


def _copy_repo_docs(tmp_path: Path) -> Path:
    """README.md, docs/speed.md and results/ copied under ``tmp_path`` (the renderer's root)."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "docs" / "speed.md", tmp_path / "docs" / "speed.md")
    shutil.copytree(ROOT / "results", tmp_path / "results")
    return tmp_path


def _one_file(root: Path) -> Path:
    return sorted((root / "results").glob("*/speed/scd_cost.json"))[0]


def test_the_published_tables_are_their_result_files() -> None:
    assert R.problems(ROOT) == []
    records = load_records(ROOT / "results")
    assert records, "results/ holds no result file"
    assert all(check_record(r) == [] for r in records)


def test_every_figure_names_its_commit_device_prompts_and_date() -> None:
    """Each rendered block carries one provenance line per group of files; every file's commit, device, prompt count
    and date are in the block that prints its figures."""
    records = load_records(ROOT / "results")
    readme = R.between_markers((ROOT / "README.md").read_text(), "results-table")
    speed = R.between_markers((ROOT / "docs" / "speed.md").read_text(), "speed-table")
    assert readme is not None and speed is not None
    for r in records:
        blocks = [speed] if R.is_cpu(r) and r["suite"] == "speed" else []
        blocks += [readme] if r["suite"] == "speed" and r["setting"] in R.README_ROWS else []
        for text in blocks:
            assert f"commit {r['commit'][:7]}" in text and r["device_name"] in text, r["path"]
            assert f"measured {r['date'][:10]}" in text and f"{len(r['prompt_ids'])} prompts" in text, r["path"]


def test_no_speedup_is_stated_by_hand_outside_the_rendered_blocks() -> None:
    for name in ("README.md", "docs/speed.md"):
        text = (ROOT / name).read_text()
        for _, marker, _ in (t for t in R.TABLES if t[0] == name):
            start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
            text = text.split(start)[0] + text.split(end)[1]
        assert FIGURE.findall(text) == [], f"{name} states a speedup by hand: link the rendered table instead"


def test_a_changed_figure_or_file_fails_the_check(tmp_path: Path) -> None:
    root = _copy_repo_docs(tmp_path)
    assert R.problems(root) == []
    # a figure edited by hand in the README's table
    readme = root / "README.md"
    block = R.between_markers(readme.read_text(), "results-table")
    first = FIGURE.search(block).group(0)
    readme.write_text(readme.read_text().replace(block, block.replace(first, "9.99×", 1)))
    assert R.problems(root) == ["README.md (results-table): differs from its result files — run `adtbench results`"]
    assert R.main(["check", "--root", str(root)]) == 1
    assert R.main(["render", "--root", str(root)]) == 0 and R.problems(root) == []
    # a rerun's file that the tables were not rendered from
    path = _one_file(root)
    record = json.loads(path.read_text())
    record["latency_s"] = [x * 0.5 for x in record["latency_s"]]
    record["figures"]["speedup"] *= 2
    path.write_text(json.dumps(record))
    assert any(p.startswith("docs/speed.md (speed-table)") for p in R.problems(root))
    # a speedup that is not its latencies' ratio, and a file naming no commit: reported by file, nothing rendered
    record["figures"]["speedup"] *= 1.01
    path.write_text(json.dumps(record))
    assert any("not its latencies' ratio of totals" in p for p in R.problems(root))
    del record["commit"]
    path.write_text(json.dumps(record))
    assert R.problems(root) == [f"results/{path.relative_to(root / 'results').as_posix()}: no commit"]
    with pytest.raises(ValueError, match="no commit"):
        R.render(root)


def test_rendering_is_idempotent_and_a_gpu_device_gets_its_column(tmp_path: Path) -> None:
    root = _copy_repo_docs(tmp_path)
    R.render(root)
    before = (root / "README.md").read_text(), (root / "docs" / "speed.md").read_text()
    R.render(root)
    assert ((root / "README.md").read_text(), (root / "docs" / "speed.md").read_text()) == before
    gpu = R.between_markers(before[1], "gpu-table")
    if not any(not R.is_cpu(r) for r in load_records(root / "results")):
        assert gpu.strip() == R.NO_GPU
    record = json.loads(_one_file(root).read_text())
    record |= {"device": "cuda", "device_name": "NVIDIA H200", "commit": "f" * 40, "date": "2030-01-02T03:04:05Z"}
    record["figures"] = {**record["figures"], "gpu": "NVIDIA H200"}
    written = write_record(root / "results", record)
    assert written == root / "results" / "nvidia-h200" / "speed" / "scd_cost.json"
    R.render(root)
    readme = R.between_markers((root / "README.md").read_text(), "results-table")
    assert "NVIDIA H200: speedup [95 % CI]" in readme and "commit fffffff" in readme
    assert "measured 2030-01-02" in readme and "no GPU job's raw results" not in readme
    gpu = R.between_markers((root / "docs" / "speed.md").read_text(), "gpu-table")
    assert "**NVIDIA H200**" in gpu and R.fmt_speedup(record["figures"]) in gpu and R.NO_GPU not in gpu


def test_a_bench_versus_result_becomes_one_file_per_variant(tmp_path: Path) -> None:
    """The jacobi / trees stages' JSON (``bench versus bench.out=FILE``): each variant's file holds the job's AR
    latencies as its baseline, medians of the repeats, and a speedup equal to their ratio of totals."""
    result = {
        "common": ["model=mini"], "prompts": 2, "repeats": 2, "threads": 1, "cpu_count": 2,
        "device": "NVIDIA H200", "load_before": 0.1, "load_after": 0.2, "wall_s": 1.0,
        "prompt_ids": ["text-00001", "text-00002"],
        "latencies_s": {"ar": [[1.0, 1.2], [2.0, 2.0]], "scd_16": [[0.5, 0.7], [1.0, 1.0]]},
        "rows": [{"variant": "scd_16", "overrides": ["policy=scd", "policy.window=16"], "tau": 3.5,
                  "speedup_ci": [1.5, 2.5], "median": 2.0}],
    }  # fmt: skip
    (rec,) = records_from_versus(copy.deepcopy(result), suite="jacobi", command="gpu.sh jacobi", date="2030-01-01")
    assert check_record(rec) == [] and rec["latency_s"] == [0.6, 1.0] and rec["baseline_latency_s"] == [1.1, 2.0]
    assert rec["figures"]["speedup"] == pytest.approx(3.1 / 1.6) and rec["device"] == "cuda"
    path = write_record(tmp_path, rec)
    assert path == tmp_path / "nvidia-h200" / "jacobi" / "scd_16.json"
    assert device_slug("CPU: AMD EPYC, 2 cores") == "cpu-amd-epyc-2-cores"
    del result["latencies_s"]
    with pytest.raises(ValueError, match="per-prompt latencies"):
        records_from_versus(result, suite="jacobi", command="x", date="2030-01-01")


def test_the_landing_page_and_speed_page_stay_small_and_true() -> None:
    """README.md ≤ 12 KB and docs/speed.md ≤ 25 KB (issue 50); the README names every config group under conf/ and
    links the output and config references; .ci/run runs exactly the README's setup and test commands."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024 and len((ROOT / "docs" / "speed.md").read_bytes()) <= 25 * 1024
    groups = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir())
    assert groups and all(f"`{g}`" in readme for g in groups), groups
    assert "(docs/outputs.md)" in readme and "(docs/config.md)" in readme
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert [c for c in commands if c.startswith(("python3 -m venv", ".venv/bin/python -m pytest"))] == ci[-2:]


def test_a_copied_tree_names_the_commit_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the code has no git metadata (a tree copied to a lent GPU machine) a result names the commit stated in
    ``$ADTBENCH_RESULTS_COMMIT`` (``gpu.sh``'s ``COMMIT``), its cleanliness unknown; without one it names none, and
    such a file cannot be written."""
    from adtbench.tools.results import COMMIT_ENV, stated_commit

    assert stated_commit("abc", False) == ("abc", False, "git")
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    assert stated_commit(None, None) == (None, None, "none")
    monkeypatch.setenv(COMMIT_ENV, "d" * 40)
    assert stated_commit(None, None) == ("d" * 40, None, f"${COMMIT_ENV} (no git metadata)")
