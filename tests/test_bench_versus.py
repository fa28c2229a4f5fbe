"""``adtbench bench versus`` on the tiny model: variants and AR in one job, the table, and key-named errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adtbench.errors import ConfigError
from adtbench.tools.bench_versus import main, parse

COMMON = ["model=tiny_llamagen", "dataset=smoke", "warmup=0", "policy=static_sampled"]


def test_variants_and_ar_interleaved_in_one_job(tmp_path: Path, capsys) -> None:
    out = tmp_path / "versus.json"
    args = [*COMMON, "bench.prompts=2", "bench.repeats=2", f"bench.out={out}",
            "--variant", "plain", "--variant", "gated", "policy.gate_tokens=50", "policy.gate_explore=2"]  # fmt: skip
    assert main(args) == 0
    r = json.loads(out.read_text())
    assert [x["variant"] for x in r["rows"]] == ["plain", "gated"] and r["prompts"] == 2 and r["repeats"] == 2
    plain, gated = r["rows"]
    assert plain["vs_first"] == 1.0 and plain["gated_share"] == 0.0 and gated["overrides"] == args[-2:]
    assert gated["gated_share"] > 0  # the random tiny drafter rarely pays: the gate skipped
    for x in r["rows"]:
        assert x["speedup"] > 0 and x["speedup_ci"][0] <= x["speedup"] <= x["speedup_ci"][1] and x["tau"] >= 1
    text = capsys.readouterr().out
    assert "| plain |" in text and "| gated | policy.gate_tokens=50 policy.gate_explore=2 |" in text


def test_variants_may_differ_only_in_policy_and_lantern(capsys) -> None:
    args = [*COMMON, "--variant", "a", "--variant", "b", "sampling=greedy"]
    assert main(args) == 2
    assert "sampling" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,key",
    [
        ([], "--variant"),
        (["--variant"], "--variant"),
        (["--variant", "ar"], "--variant"),
        (["bench.colour=red", "--variant", "a"], "bench.colour"),
        (["bench.prompts=0", "--variant", "a"], "bench.prompts"),
    ],
)
def test_bad_arguments_name_the_option(args, key) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse(args)


def test_versus_decodes_what_the_app_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variant decodes through ``Job.decode`` — the app's call: ``engine.acceptance`` and
    ``engine.graphs`` reach the engine and ``sampling.top_k`` is clamped to the model as in ``python run.py``
    (landed main timed the host walk whatever the setting, with an unclamped top-k and no compile)."""
    import adtbench.harness.job as job

    seen: list[tuple[str, int, str, str]] = []
    real = job.generate

    def spy(target, models, policy, inputs, sp, g, rule, acceptance):
        seen.append((acceptance, sp.top_k, policy.graphs.verify, policy.graphs.levels))
        return real(target, models, policy, inputs, sp, g, rule, acceptance)

    monkeypatch.setattr(job, "generate", spy)
    args = [*COMMON, "engine.acceptance=device", "engine.graphs.verify=eager", "sampling.top_k=100000",
            "bench.prompts=1", "bench.repeats=1", "--variant", "a", "engine.graphs.levels=eager"]  # fmt: skip
    assert main(args) == 0
    assert seen and all(s == ("device", 0, "eager", "eager") for s in seen)


@pytest.mark.parametrize("tool", [["versus", "--variant", "a"], ["overhead"], ["batch"]])
def test_bench_tools_refuse_the_reference_baseline(tool: list[str], capsys) -> None:
    """The bench tools that build their own models time the lean AR step only: ``timing.reference_baseline=true``
    is an error naming the key, not a flag silently ignored."""
    from adtbench.tools.bench import main as bench_main

    assert bench_main([tool[0], *COMMON, "timing.reference_baseline=true", *tool[1:]]) == 2
    out = capsys.readouterr()
    assert "timing.reference_baseline" in out.out + out.err
