"""``adtbench bench batch`` on the tiny model: the rows' figures agree with their wall times, every B decodes the same
prompts with the same seeds, the table, the plot, the docs section between markers, and key-named errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from adtbench.errors import ConfigError
from adtbench.tools.bench import main as bench_main
from adtbench.tools.bench_batch import END, SECTION, START, main, nice_ticks, parse, run

TINY = ["model=tiny_llamagen", "model.dtype=float64", "drafter=eagle", "dataset=smoke", "policy=eagle2"]


def test_bench_batch_rows_table_plot_and_readme(tmp_path: Path, capsys) -> None:
    readme = tmp_path / "speed.md"
    readme.write_text(f"# speed\n\nbefore\n{START}\nold\n{END}\nafter\n")
    out = tmp_path / "batch"
    args = [*TINY, "bench.sizes=[1,2]", "bench.prompts=3", f"bench.out={out}", f"bench.readme={readme}"]
    assert main(args) == 0
    r = json.loads((out / "batch.json").read_text())
    env, rows = r["environment"], r["rows"]
    assert env["prompts"] == 3 and env["sizes"] == [1, 2] and env["policy"] == "eagle2" and env["threads"] == 1
    assert [x["B"] for x in rows] == [1, 2] and [x["first"] for x in rows] == ["ar", "method"]  # ABBA
    n = env["tokens_per_image"]
    for x in rows:
        for side in ("ar", "method"):
            ips, wall = x[f"{side}_images_per_s"], x[f"{side}_wall_s"]
            assert wall > 0 and ips == pytest.approx(3 / wall) and x[f"{side}_tokens_per_s"] == pytest.approx(n * ips)
            assert x[f"{side}_vs_b1"] == pytest.approx(ips / rows[0][f"{side}_images_per_s"])
            # float64: a prompt's tokens do not depend on B (same prompts, same per-prompt seeds at every B)
            assert x[f"{side}_same_tokens_as_b1"] == 1.0
        assert x["speedup"] == pytest.approx(x["method_images_per_s"] / x["ar_images_per_s"])
        assert x["tau"] >= 1.0 and x["d_bar"] > 0 and x["device"] == env["device"] and x["peak_memory_gib"] is None
        assert x["load_before"] is not None and x["load_after"] is not None
    assert rows[0]["ar_vs_b1"] == rows[0]["method_vs_b1"] == 1.0
    assert rows[1]["tau"] == pytest.approx(rows[0]["tau"])  # the same tokens: the same cycles
    table = (out / "batch.md").read_text()
    assert table.count("\n| ") == 3 and "| 1 | " in table and "| 2 | " in table and env["device"] in table
    assert f"| {rows[1]['speedup']:.2f}× |" in table and table.strip() in capsys.readouterr().out
    text = readme.read_text()
    assert text.startswith(f"# speed\n\nbefore\n{START}\n**") and text.endswith(f"{END}\nafter\n") and "old" not in text
    assert table.strip() in text
    png = Image.open(out / "batch.png")
    assert png.format == "PNG" and png.size[0] > 500
    data = json.loads(png.text["data"])
    assert [d["B"] for d in data] == [1, 2] and data[1]["speedup"] == pytest.approx(rows[1]["speedup"])


def test_repeats_time_each_side_that_often_and_keep_the_median(tmp_path: Path) -> None:
    out = tmp_path / "batch"
    assert main([*TINY, "bench.sizes=[1,2]", "bench.prompts=2", "bench.repeats=3", f"bench.out={out}"]) == 0
    r = json.loads((out / "batch.json").read_text())
    assert r["environment"]["repeats"] == 3
    for x in r["rows"]:
        for side in ("ar", "method"):
            walls = x[f"{side}_wall_repeats_s"]
            assert len(walls) == 3 and x[f"{side}_wall_s"] == sorted(walls)[1]
            assert x[f"{side}_images_per_s"] == pytest.approx(2 / sorted(walls)[1])
    assert "timed 3 times per B" in (out / "batch.md").read_text()
    with pytest.raises(ConfigError) as e:
        parse(["bench.repeats=0"])
    assert e.value.key == "bench.repeats"


def test_readme_without_markers_gets_the_section_appended(tmp_path: Path) -> None:
    from adtbench.tools.bench_batch import write_readme

    readme = tmp_path / "speed.md"
    readme.write_text("# speed\n\ntext\n")
    write_readme(readme, "the table")
    assert readme.read_text() == f"# speed\n\ntext\n\n{SECTION}\n\n{START}\nthe table\n{END}\n"
    write_readme(readme, "another")  # the markers are there now: replaced in place
    assert readme.read_text().count(SECTION) == 1 and "the table" not in readme.read_text()


@pytest.mark.parametrize(
    "arg", ["bench.sizes=[0]", "bench.sizes=[]", "bench.sizes=[2,4]", "bench.sizes=[1,1]", "bench.sizes=[1,x]"]
)
def test_bad_sizes_are_config_errors_naming_bench_sizes(arg: str, capsys) -> None:
    with pytest.raises(ConfigError, match=r"^bench\.sizes: "):
        parse([arg])
    assert bench_main(["batch", *TINY, arg]) == 2  # through `adtbench bench`'s dispatch
    assert "config error: bench.sizes" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,key",
    [
        (["bench.sizes=[1,4]", "bench.prompts=3"], "bench.sizes"),  # slots would idle
        (["bench.prompts=0"], "bench.prompts"),
        (["bench.colour=red"], "bench.colour"),
        (["bench.prompts=9", "bench.sizes=[1]"], "bench.prompts"),  # dataset=smoke has 8
        (["policy=zipar", "bench.prompts=4", "bench.sizes=[1,2]"], "bench.sizes"),  # no batched loop policies
        (["bench.prompts=2", "bench.sizes=[1]", "bench.readme=/nonexistent/speed.md"], "bench.readme"),
    ],
)
def test_bad_options_name_their_key_before_any_decoding(args: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ": "):
        run([*TINY, *args])


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0.0, 1.0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    ticks = nice_ticks(0.0, 137.0)
    assert ticks[0] == 0.0 and ticks[-1] >= 137.0 and len(ticks) <= 7
    assert nice_ticks(2.0, 2.0)[0] <= 2.0 <= nice_ticks(2.0, 2.0)[-1]  # a flat series still gets an axis
