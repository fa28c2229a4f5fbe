"""adtbench/reporting/plots.py on a synthetic sweep (policy × LANTERN, two budgets, maps): every config choice is on the
figure (varying ones label points / bars / panels, shared ones in the title), colour bars with their quantity,
legends outside the axes, PNGs written by the Agg canvas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from adtbench.reporting.load import load_tree
from adtbench.reporting.tables import aggregate

RUNS = [  # (job, policy, lantern, budget, tau-ish accepted length)
    ("0_policy=adt,lantern=on", "adt", True, "cost", 2.5),
    ("1_policy=adt,lantern=off", "adt", False, "cost", 1.8),
    ("2_policy=eagle2,lantern=on", "eagle2", True, "fixed", 2.2),
    ("3_policy=eagle2,lantern=off", "eagle2", False, "fixed", 1.5),
]


def make_tree(root: Path, prompts: int = 3, maps: bool = True) -> Path:
    """A 4-job sweep as the app writes it: summary / samples / eval_samples / run_config / overrides / maps."""
    rng = np.random.default_rng(0)
    for job, policy, lantern, budget, acc in RUNS:
        d = root / job
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "overrides.yaml").write_text(f"- policy={policy}\n- lantern={'on' if lantern else 'off'}\n")
        recs, evals = [], []
        for i in range(prompts):
            cycles = int(16 / acc)
            lat, base = 0.4 + 0.1 * i + (0.2 if policy == "eagle2" else 0.0), 0.6 + 0.05 * i
            recs.append({"prompt_id": f"p{i}", "committed": 16, "cycles": cycles, "drafted_depth_sum": 3 * cycles,
                         "tree_depth_sum": 2 * cycles, "latency_s": lat, "baseline_latency_s": base,
                         "tau": 16 / cycles, "speedup": base / lat})  # fmt: skip
            evals.append({"prompt_id": f"p{i}", "clip_score": 30.0 + rng.normal() - (1.0 if lantern else 0.0)})
        (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
        choices = {"model": "mini", "policy": policy, "lantern": "on" if lantern else "off", "dataset": "mini_quick",
                   "sampling": "default", "drafter": "eagle"}  # fmt: skip
        summary = {"model": "mini", "policy": policy, "dataset": "mini_quick", "sampling": "default",
                   "drafter": "eagle", "lantern": lantern, "choices": choices, "n_samples": prompts,
                   "complete": True}  # fmt: skip
        (d / "summary.json").write_text(json.dumps(summary))
        lan = {"enabled": True, "k": 1000, "delta": 0.1, "lam": None} if lantern else {"enabled": False}
        cfg = {"policy": {"name": policy, "budget": budget}, "lantern": lan, "dataset": {"shard": None},
               "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "cfg_scale": 3.0}}  # fmt: skip
        (d / "run_config.json").write_text(json.dumps(cfg))
        if maps:
            grid = np.full((4, 4), acc) + rng.normal(0, 0.3, (4, 4))
            cells = [[None if (r, c) == (3, 3) else float(grid[r, c]) for c in range(4)] for r in range(4)]
            (d / "maps").mkdir()
            (d / "maps" / "run_maps.json").write_text(
                json.dumps({"n_prompts": prompts, "accept": cells, "depth": cells, "width": cells})
            )
    return root


def texts(fig) -> str:
    """Every piece of text drawn on a figure (titles, labels, tick labels, legend entries)."""
    return "\n".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text") and a.get_text()))


def test_config_labels_and_split_common(tmp_path):
    from adtbench.reporting.plots import config_labels, fmt_config, split_common

    root = make_tree(tmp_path / "sw")
    on = config_labels(root / RUNS[0][0], {"ov.policy": "adt", "ov.policy.total_tokens": "30", "ov.dataset.limit": 2})
    assert list(on)[:6] == ["model", "policy", "lantern", "budget", "sampling", "dataset"]
    assert on["lantern"] == "on (δ=0.1, k=1000)" and on["budget"] == "cost" and on["sampling"] == "T=1, CFG=3"
    assert on["policy.total_tokens"] == "30" and "dataset.limit" not in on  # plumbing overrides are not choices
    assert fmt_config({"policy": "adt", "lantern": "off"}) == "policy=adt, LANTERN off"
    common, varying = split_common([{"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}])
    assert common == {"a": "1"} and varying == [{"b": "2"}, {"b": "3", "c": "4"}]


def test_figures_carry_every_config_choice_and_colour_bars(tmp_path):
    from adtbench.reporting.plots import montage_figure, run_maps_figure, scatter_figure, speedup_figure

    root = make_tree(tmp_path / "sw")
    runs, samples = load_tree(root)
    table = aggregate(runs, samples, n_boot=50)
    for fig in (speedup_figure(table, runs=runs), scatter_figure(table, "d_bar", "tau", runs=runs)):
        t = texts(fig)
        for label in ("policy=adt, LANTERN on (δ=0.1, k=1000), budget=cost",
                      "policy=eagle2, LANTERN off, budget=fixed"):  # fmt: skip
            assert label in t  # the varying choices name each bar / point, budget included (not a --by key)
        assert "model=mini" in t and "sampling=T=1, CFG=3" in t and "3 prompts per point" in t  # the shared ones
    fig = scatter_figure(table, "d_bar", "tau", runs=runs)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # the labels sit outside the data area
    mont = montage_figure(runs, "accept")
    panels = [a for a in mont.axes if a.get_images()]
    assert len(panels) == 4 and len(mont.axes) == 5  # 4 maps + 1 shared colour bar
    titles = [a.get_title() for a in panels]
    assert sum("LANTERN on" in t for t in titles) == 2 and sum("LANTERN off" in t for t in titles) == 2
    assert all("budget=" in t and "T=1, CFG=3" in t and "mean of 3 prompts" in t for t in titles)
    assert "accepted length" in mont.axes[-1].get_ylabel()
    lims = {a.get_images()[0].get_clim() for a in panels}
    assert len(lims) == 1  # one colour scale for all runs
    one = run_maps_figure(root / RUNS[2][0], runs.iloc[2].to_dict())
    assert len(one.axes) == 6 and "LANTERN on" in one._suptitle.get_text()  # 3 maps, each with its colour bar
    assert {a.get_ylabel().split(" (")[0] for a in one.axes if not a.get_images()} >= {"drafted depth D"}


def test_plots_command_writes_every_png(tmp_path, capsys):
    from adtbench.reporting.plots import main

    root = make_tree(tmp_path / "sw")
    out = tmp_path / "figs"
    assert main([str(root), "--out", str(out), "--n-boot", "50"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["speedup.png", "tau_vs_dbar.png", "speedup_vs_clip_score.png", "acceptance_maps.png",
                            *(f"maps_{job}.png" for job, *_ in RUNS)])  # fmt: skip
    for p in out.iterdir():
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 200
    assert main([str(tmp_path / "empty")]) == 1
    from adtbench.reporting.plots import acceptance_montage, run_maps_figure

    no_maps = make_tree(tmp_path / "nomaps", maps=False)
    assert acceptance_montage(load_tree(no_maps)[0], tmp_path / "m.png") is None and not (tmp_path / "m.png").exists()
    assert run_maps_figure(no_maps / RUNS[0][0]) is None


def test_legends_show_the_lantern_values_the_runs_used(tmp_path):
    """``lantern.k=1000`` on the command line ran as k = 511 on a 512-code model (``build_lantern_rule`` clips it):
    the summary records what was used (``lantern_params``) and every label shows that, never the 1000."""
    from adtbench.reporting.plots import config_labels, scatter_figure, speedup_figure

    root = make_tree(tmp_path / "sw")
    for job, _, lantern, *_ in RUNS:
        d = root / job
        overrides = d / ".hydra" / "overrides.yaml"
        overrides.write_text(overrides.read_text() + "- lantern.k=1000\n")
        if lantern:
            s = json.loads((d / "summary.json").read_text())
            s["lantern_params"] = {"k": 511, "delta": 0.1, "lam": None, "normalize": False, "reference_residual": False}
            (d / "summary.json").write_text(json.dumps(s))
    runs, samples = load_tree(root)
    assert config_labels(root / RUNS[0][0], runs.iloc[0].to_dict())["lantern"] == "on (δ=0.1, k=511)"
    table = aggregate(runs, samples, by=["policy", "lantern", "ov.lantern.k"], n_boot=20)
    for fig in (speedup_figure(table, runs=runs), scatter_figure(table, "d_bar", "tau", runs=runs)):
        t = texts(fig)
        assert "LANTERN on (δ=0.1, k=511)" in t and "1000" not in t


def test_an_empty_table_is_a_clear_error(tmp_path, monkeypatch):
    import pytest

    from adtbench.reporting.plots import scatter_figure, speedup_figure
    from analysis.results import load, results_dir

    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no run"):
        load(tmp_path / "empty")
    runs, samples = load_tree(tmp_path / "empty")
    table = aggregate(runs, samples)
    for draw in (lambda: speedup_figure(table), lambda: scatter_figure(table, "d_bar", "tau")):
        with pytest.raises(ValueError, match="no rows"):
            draw()
    monkeypatch.delenv("ADTBENCH_ROOT", raising=False)
    assert results_dir("/abs/sweep") == Path("/abs/sweep")
    assert results_dir("outputs/multiruns/x").parts[-3:] == ("outputs", "multiruns", "x")
    assert results_dir("outputs/multiruns/x").is_absolute() and (results_dir("x").parent / "conf").is_dir()
    monkeypatch.setenv("ADTBENCH_ROOT", str(tmp_path))  # paths.root_dir's own override
    assert results_dir("sweep") == tmp_path / "sweep" and results_dir() == tmp_path / "outputs" / "multiruns"
