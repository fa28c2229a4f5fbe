"""``adtbench bench speed`` end to end on the tiny model: one app job per row, the table with its cost-model
account, the README block between the markers, and ``bench.reuse`` re-rendering the same table without decoding."""

from __future__ import annotations

import json
from pathlib import Path

from adtbench.tools.bench_speed import END, START, main, parse


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
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{END}\nafter\n") and "old" not in text
    assert "| policy=ar (sanity: must read 1.00) |" in text and "| adt + budget: cost" in text
    table = (out / "speed.md").read_text()
    capsys.readouterr()
    assert main([*args, "bench.reuse=true"]) == 0  # no decoding: the jobs in bench.out are read again
    assert (out / "speed.md").read_text() == table


def test_bad_options_are_key_named_errors(tmp_path: Path, capsys) -> None:
    assert main(["bench.rows=[nope]"]) == 2
    assert "bench.rows" in capsys.readouterr().err
    assert main(["bench.colour=red"]) == 2
    assert "bench.colour" in capsys.readouterr().err
    opts, rest = parse(["bench.prompts=3", "policy.budget=fixed"])
    assert opts["prompts"] == 3 and rest == ["policy.budget=fixed"]
