"""``adtbench bench speed`` end to end on the tiny model: one app job per row, the table with its cost-model
account, the README block between the markers, and ``bench.reuse`` re-rendering the same table without decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adtbench.tools.bench_speed import END, START, main, parse
from adtbench.tools.results import check_record


@pytest.mark.slow
def test_speed_table_rows_readme_and_reuse(tmp_path: Path, capsys) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{START}\nold\n{END}\nafter\n")
    out = tmp_path / "speed"
    args = ["bench.rows=[ar,adt_cost]", "bench.prompts=2", f"bench.out={out}", f"bench.readme={readme}",
            "model=tiny_llamagen", "dataset=smoke", "warmup=0", "maps.per_run=false"]  # fmt: skip
    assert main(args) == 0
    rows = json.loads((out / "speed.json").read_text())
    assert [r["row"] for r in rows] == ["ar", "adt_cost"]
    ar, adt = rows
    assert ar["tau"] == 1.0 and ar["draft_steps"] == 0.0 and ar["limit"] == "–" and ar["n"] == 2
    assert adt["nodes"] >= 1.0 and adt["draft_steps"] > 0 and adt["limit"] in ("verify", "draft", "overhead")
    assert adt["bound"] > 0 and adt["speedup_ci"][0] <= adt["speedup"] <= adt["speedup_ci"][1]
    for r in rows:  # timing.aa by default: each row's AR baseline against itself, beside its speedup
        assert r["aa_ratio_ci"][0] <= r["aa_ratio"] <= r["aa_ratio_ci"][1]
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{END}\nafter\n") and "old" not in text
    assert "| policy=ar (sanity: must read 1.00) |" in text and "| adt + budget: cost" in text
    table = (out / "speed.md").read_text()
    # bench.results: one raw result file per row, each checked (its speedup its latencies' ratio of totals)
    results = tmp_path / "results"
    assert main([*args, "bench.reuse=true", f"bench.results={results}"]) == 0
    files = sorted(p.relative_to(results).as_posix() for p in results.rglob("*.json"))
    device = files[0].split("/")[0]
    assert files == [f"{device}/speed/adt_cost.json", f"{device}/speed/ar.json"]
    record = json.loads((results / files[1]).read_text())
    assert (
        check_record(record) == [] and len(record["prompt_ids"]) == 2 and record["figures"]["speedup"] == ar["speedup"]
    )
    assert record["command"] == f"adtbench bench speed bench.prompts=2 {' '.join(args[4:])} bench.rows=[ar]"
    capsys.readouterr()
    assert main([*args, "bench.reuse=true"]) == 0  # no decoding: the jobs in bench.out are read again
    assert (out / "speed.md").read_text() == table


def test_the_documented_command_writes_result_files_and_renders_them() -> None:
    """``benchmarks/speed.sh`` writes one result file per row under ``results/`` and renders the tables from them
    (``adtbench results``); the file the speed table lives in holds its markers once, and the docs name that command."""
    from adtbench.tools.render_results import TABLES

    root = Path(__file__).resolve().parents[1]
    script = (root / "benchmarks" / "speed.sh").read_text()
    assert 'bench speed bench.prompts="$PROMPTS" bench.results=results' in script and "adtbench results" in script
    (doc,) = {name for name, marker, _ in TABLES if marker == "speed-table"}
    text = (root / doc).read_text()
    assert text.count(START) == 1 and text.count(END) == 1 and text.index(START) < text.index(END)
    for name in ("README.md", doc):
        assert "benchmarks/speed.sh" in (root / name).read_text(), name
    assert "bench.results=results" in text


def test_bad_options_are_key_named_errors(tmp_path: Path, capsys) -> None:
    assert main(["bench.rows=[nope]"]) == 2
    assert "bench.rows" in capsys.readouterr().err
    assert main(["bench.colour=red"]) == 2
    assert "bench.colour" in capsys.readouterr().err
    opts, rest = parse(["bench.prompts=3", "policy.budget=fixed"])
    assert opts["prompts"] == 3 and rest == ["policy.budget=fixed"]


def test_bench_overhead_phases_split_the_cycle_and_restore_what_they_wrap(tmp_path: Path, capsys) -> None:
    """``adtbench bench overhead bench.phases=true`` (``policy=static_sampled``, the static sampled tree):
    exclusive phase times that sum, with ``cycle (rest)``, to the cycle time; every phase the static sampled tree goes
    through is seen, the sampled trees' draws are not; and every wrapped function, method and instance attribute is
    the original again."""
    import adtbench.algorithm.engine as E
    import adtbench.algorithm.verify as Vf
    from adtbench.algorithm.drafters.session import DraftSession
    from adtbench.algorithm.policies import sampled, static
    from adtbench.tools.bench import main as bench_main

    originals = (Vf.verify_tree, E.process_logits, DraftSession.expand, static.gumbel_top_k, sampled.gumbel_top_k)
    out = tmp_path / "phases.json"
    args = [
        "overhead",
        "bench.phases=true",
        "bench.prompts=1",
        "threads=1",
        f"bench.out={out}",
        "policy=static_sampled",
    ]
    assert bench_main(args) == 0
    r = json.loads(out.read_text())
    rows = {x["phase"]: x for x in r["phases"]}
    assert abs(sum(x["ms_per_cycle"] for x in r["phases"]) - r["cycle_ms"]) < 1e-9 and r["cycles"] > 10
    seen = ("target network (verify forward)", "verify mask + positions", "KV commit", "acceptance (host walk)",
            "drafter network", "drafter extend (bookkeeping)", "drafting session (expand bookkeeping)",
            "draws without replacement (static)", "policy: tree building", "target logits processing")  # fmt: skip
    for label in seen:
        assert rows[label]["ms_per_cycle"] > 0 and rows[label]["calls_per_cycle"] > 0, label
    assert "draws without replacement (sampled trees)" not in rows and "cycle (rest)" in rows
    # the network dominates the exclusive split; the rest is the cycle's own lines, a small part
    assert rows["target network (verify forward)"]["share"] > 0.2 and abs(rows["cycle (rest)"]["share"]) < 0.3
    assert originals == (
        Vf.verify_tree,
        E.process_logits,
        DraftSession.expand,
        static.gumbel_top_k,
        sampled.gumbel_top_k,
    )
    assert "| target network (verify forward) |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "policy", [["policy=static_sampled"], ["policy=eagle2"], ["policy=adt"], ["policy=adt", "policy.budget=fixed"]]
)
def test_bench_count_reads_the_device_at_most_twice_per_cycle(tmp_path: Path, capsys, policy) -> None:
    """``adtbench bench overhead bench.count=true``: a static sampled tree, EAGLE-2 and ADT (both budgets) read the
    device at most twice per cycle outside the networks (once for the tree's outcome; ``budget: cost`` once more for its
    candidates' scores), the counts by phase add up, and the wrapped functions are restored."""
    import adtbench.algorithm.verify as Vf
    from adtbench.tools.bench import main as bench_main

    original = Vf.accept
    out = tmp_path / "count.json"
    args = ["overhead", "bench.count=true", "bench.prompts=1", "threads=1", f"bench.out={out}", *policy]
    assert bench_main(args) == 0
    r = json.loads(out.read_text())
    assert r["cycles"] > 10 and 1.0 <= r["host_reads_per_cycle"] <= 2.0
    engine = sum(x["ops_per_cycle"] for x in r["phases"] if not x["network"])
    assert engine == pytest.approx(r["engine_ops_per_cycle"]) and r["engine_ops_per_cycle"] > 10
    assert r["read_sites"] and all("adtbench/" in x["site"] for x in r["read_sites"])
    assert Vf.accept is original
    assert "host reads" in capsys.readouterr().out


def test_bench_overhead_of_a_jacobi_loop(tmp_path: Path, capsys) -> None:
    """``adtbench bench overhead`` of the default run (SCD, no drafter): every forward is a cycle, the drafter's share
    is 0 and the overhead is the cycle's time outside the target's verifies; the phase split names the loop's own
    parts (the chain's acceptance, redraws, new drafts) and a policy neither drafting nor Jacobi is a key-named
    error."""
    from adtbench.tools.bench import main as bench_main

    out = tmp_path / "scd.json"
    assert bench_main(["overhead", "bench.prompts=1", "threads=1", f"bench.out={out}"]) == 0
    r = json.loads(out.read_text())
    assert r["policy"] == "scd" and r["cycles"] > 10 and r["drafter_ms"] == 0.0
    assert 0.0 < r["target_forward_ms"] < r["cycle_ms"] and 0.0 < r["overhead_frac"] < 1.0
    out = tmp_path / "phases.json"
    assert bench_main(["overhead", "bench.prompts=1", "bench.phases=true", "threads=1", f"bench.out={out}"]) == 0
    phases = {x["phase"]: x for x in json.loads(out.read_text())["phases"]}
    assert phases["target network (verify forward)"]["calls_per_cycle"] == 1.0
    assert {"jacobi: redraw", "jacobi: advance (bonus, window, records)"} <= set(phases)
    capsys.readouterr()
    assert bench_main(["overhead", "bench.prompts=1", "policy=ar"]) == 2
    got = capsys.readouterr()
    assert "policy: the overhead benchmark needs" in got.out + got.err
