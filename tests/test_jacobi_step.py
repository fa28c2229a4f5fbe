"""The device-resident Jacobi step (``methods.jacobi.step``, ``engine.graphs.step``) on the simulated CUDA device (the
graph stand-in: a replay must run the captured ops on the captured storages, no read or host copy during capture, no
random op in the graph), float64:

- T = 0: token-identical to AR greedy for SCD / SJD / GSD × the inits × windows 2 … 16 (the room clamp and the
  image's end included), the end-of-line layout with forced tokens; the idle forward at most one per image;
- per forward: one graph replay, one draws fill, one asynchronous copy of the verdict, one fence wait one step late,
  no device read (the tokens and the kept count: one read per image), and ``bench overhead bench.count=true``'s
  engine kernels per forward;
- T = 1: the graph replays the step run eagerly at its fixed shapes draw for draw (same seeds, same images), and
  that step's law is AR's exact law (``adtbench/algorithm/laws.py``'s χ² at stated power; CPU, float64 — the stand-in's
  per-op checks cost ≈ 0.8 s an image, too slow for thousands) for SCD (``up``: the headline tier, TV ≤ 0.05
  detected at 90 % power, its rejection, residual bonus, full accept and coupled redraw each in ≥ 30 % of the images;
  the end-of-line layout), SJD (``random``) and GSD with an empty group; the SCD authors' stored proposal planted
  into the step fails it;
- the choice: ``auto`` runs the step where the verifies are graphed and the eager loop elsewhere, ``graph`` refuses a
  setting it cannot run naming ``engine.graphs.step`` (the keys' reasons before any weights load), ``eager`` keeps
  the host-driven loop; the old key ``policy.step`` is refused naming the new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import Counter
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import test_laws as TL
import torch
from conftest import tiny

import adtbench.algorithm.methods.jacobi.step as JS
from adtbench import accel
from adtbench.algorithm import laws as L
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.policies.jacobi import JacobiModels
from adtbench.errors import ConfigError
from adtbench.graph_modes import GraphModes
from adtbench.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
T1 = SamplingParams(temperature=1.0, cfg_scale=3.0)
EOL = {"num_codes": 3, "eol_token": 3, "eoi_token": 4}


def policy(name: str, step: str = "auto", **node: Any) -> Any:
    """``policy=name`` with ``node``'s keys, under ``engine.graphs.step=step`` (what ``config.build_policy`` sets)."""
    pol = POLICIES.build(name, node)
    pol.graphs = GraphModes(step=step)
    return pol


def graphed_target(vocab: int | None = None, grid: tuple[int, int] | None = None, layout: dict | None = None) -> Any:
    """A float64 tiny LlamaGen on the simulated device with its verifies captured (``engine.compile``'s
    ``request_static(graphs=True)``); ``vocab`` / ``grid`` / ``layout``: the law tests' tiny images."""
    over: dict[str, Any] = {} if vocab is None else {"arch.vocab_size": vocab, "arch.block_size": 16, "vq.kind": "none"}
    target, _ = tiny("tiny_llamagen", device="cuda", **over)
    if grid is not None or layout:
        h, w = grid or (target.layout.grid_h, target.layout.grid_w)
        target.layout = dataclasses.replace(target.layout, grid_h=h, grid_w=w, **(layout or {}))
    target.request_static(graphs=True)
    return target


def test_greedy_equals_ar_through_the_graphed_step() -> None:
    with accel.simulate() as sim:
        target = graphed_target(grid=(4, 6))  # 24 tokens: windows past a row, the room clamp at the end
        cases = [*product(("scd",), ("up", "left", "random"), (2, 5, 16)), ("sjd", "random", 3), ("gsd", "up", 4)]
        for prompt in ("two blue squares on a striped floor",):
            inputs = target.encode_prompt(prompt, cfg=True)
            g = accel.generator(target.device, 0)
            ar = decode_ar(target, inputs, GREEDY, g)
            for name, init, window in cases:
                before = sim.counts.copy()
                res = generate(target, JacobiModels(), policy(name, window=window, init=init), inputs, GREEDY, g)
                assert res.stats["step"] == "graph" and res.tokens == ar.tokens, (prompt, name, init, window)
                forwards = len(res.cycles) + res.stats["idle_forwards"]
                assert res.stats["idle_forwards"] <= 1 and sum(res.stats["accept_hist"]) == len(res.cycles)
                assert all(c.nodes <= window and c.accepted < c.nodes for c in res.cycles)
                assert sum(c.accepted + 1 for c in res.cycles) == len(ar.tokens) - 1
                d = {k: sim.counts[k] - before[k] for k in ("graph_replays", "device_reads", "fence_waits")}
                assert d == {"graph_replays": forwards, "device_reads": 1, "fence_waits": forwards - 1}, d


def test_greedy_end_of_line_layout_and_a_cost_window() -> None:
    """Forced end-of-line / end-of-image tokens (Lumina's layout) through the step's device init and constraint, and
    ``window: cost`` (the calibrated L handed in) at L = 4."""
    with accel.simulate():
        target = graphed_target(vocab=5, grid=(3, 3), layout=EOL)
        inputs = target.encode_prompt("a red circle", cfg=True)
        g = accel.generator(target.device, 0)
        ar = decode_ar(target, inputs, GREEDY, g)
        assert ar.tokens[3] == 3 and ar.tokens[-1] == 4
        for init in ("up", "left", "random"):
            for window in (3, 4, 7):
                res = generate(target, JacobiModels(), policy("scd", window=window, init=init), inputs, GREEDY, g)
                assert res.stats["step"] == "graph" and res.tokens == ar.tokens, (init, window)
        res = generate(target, JacobiModels(window=4), policy("scd", window="cost"), inputs, GREEDY, g)
        assert res.stats["step"] == "graph" and res.tokens == ar.tokens


def test_the_choice_of_step() -> None:
    """``auto``: the step where the verifies are graphed (and acceptance on the device), the eager loop on a target
    without captured graphs or with host acceptance; ``graph``: the step even without captured graphs (its fixed
    shapes run eagerly), a ``ConfigError`` naming ``engine.graphs.step`` where it cannot run; ``eager``: the loop."""
    with accel.simulate():
        target = graphed_target()
        inputs = target.encode_prompt("a red circle", cfg=True)
        g = accel.generator(target.device, 0)
        run = lambda pol, **k: generate(target, JacobiModels(), pol, inputs, T1, g, **k).stats["step"]  # noqa: E731
        assert run(policy("scd", window=4)) == "graph"
        assert run(policy("scd", window=4, step="eager")) == "eager"
        assert run(policy("scd", window=4), acceptance="host") == "eager"
        assert run(policy("scd", window="adaptive")) == "eager"  # auto: a setting the step cannot run
        for bad in ({"window": "adaptive"}, {"redraw": "gumbel"}, {"window": 1}):
            with pytest.raises(ConfigError, match=r"engine\.graphs\.step"):
                run(policy("scd", step="graph", **bad))
        plain, _ = tiny("tiny_llamagen", device="cuda")
        plain.request_static(graphs=False)
        inputs = plain.encode_prompt("a red circle", cfg=True)
        res = generate(plain, JacobiModels(), policy("scd", window=4), inputs, T1, g)
        assert res.stats["step"] == "eager"
        ar = decode_ar(plain, inputs, GREEDY, g)
        res = generate(plain, JacobiModels(), policy("scd", window=4, step="graph"), inputs, GREEDY, g)
        assert res.stats["step"] == "fixed-shape" and res.tokens == ar.tokens
    with pytest.raises(ConfigError, match=r"engine\.graphs\.step"):
        policy("scd", step="fused")


def test_the_step_keys_are_refused_before_any_weights_load() -> None:
    """The harness's path (``config.build_policy``, no model built): ``engine.graphs.step=graph`` with keys the step
    cannot run is a ``ConfigError`` naming ``engine.graphs.step``; a bad value names the part; the old key
    ``policy.step`` names itself and says the new key (no alias)."""
    from omegaconf import OmegaConf

    from adtbench.harness.config import build_policy

    def build(policy: dict[str, Any], graphs: dict[str, Any]) -> Any:
        return build_policy(OmegaConf.create({"policy": {"name": "scd", **policy}, "engine": {"graphs": graphs}}))

    for bad in ({"window": "adaptive"}, {"redraw": "gumbel"}, {"init": "drafter"}):
        with pytest.raises(ConfigError, match=r"engine\.graphs\.step: graph needs"):
            build(bad, {"step": "graph"})
    assert build({"window": "adaptive"}, {"step": "auto"}).graphs == GraphModes()  # auto: the loop for that setting
    assert build({"window": 8}, {"step": "graph"}).graphs.step == "graph"
    with pytest.raises(ConfigError, match=r"engine\.graphs\.step: must be one of"):
        build({}, {"step": "fused"})
    with pytest.raises(ConfigError, match=r"^policy\.step: moved to engine\.graphs\.step.*engine\.graphs\.step=eager"):
        build({"step": "eager"}, {})


# ---------------------------------------------------------------------------------------------------------
# T = 1: the graph replays the fixed-shape step draw for draw, and that step's law is AR's
# ---------------------------------------------------------------------------------------------------------


def test_the_graph_replays_the_fixed_shape_step_draw_for_draw() -> None:
    """At T = 1 (SCD, SJD, GSD) the graphed step (captured, replayed by the stand-in) and the same step run eagerly
    at its fixed shapes (``engine.graphs.step=graph`` on a target whose verifies are not captured) give the same images
    from the same seeds: the graph adds no draw, drops none and reorders none — so the law tests of the eager
    fixed-shape step below are the graphed path's."""
    with accel.simulate():
        graphed = graphed_target(grid=(3, 4))
        plain, _ = tiny("tiny_llamagen", device="cuda")
        plain.layout = graphed.layout
        plain.request_static(graphs=False)
        for name, node in (("scd", {"window": 4}), ("sjd", {"window": 3, "init": "random"}), ("gsd", {"window": 5})):
            runs = []
            for target in (graphed, plain):
                inputs = target.encode_prompt("a red circle", cfg=True)
                g = accel.generator(target.device, 3)
                pol = policy(name, step="graph", **node)
                runs.append([generate(target, JacobiModels(), pol, inputs, T1, g) for _ in range(4)])
            assert [r.stats["step"] for r in runs[0]] == ["graph"] * 4
            assert [r.stats["step"] for r in runs[1]] == ["fixed-shape"] * 4
            assert [r.tokens for r in runs[0]] == [r.tokens for r in runs[1]], name
            assert [r.stats["accept_hist"] for r in runs[0]] == [r.stats["accept_hist"] for r in runs[1]]


LAW_SETUPS = {"t1": ({"grid_h": 2, "grid_w": 2}, 3), "eol": ({"grid_h": 2, "grid_w": 2, **EOL}, 5)}
_LAWS: dict[str, tuple[Any, Any, dict]] = {}


def law_setup(name: str) -> tuple[Any, Any, dict]:
    """(target, inputs, AR's exact law) of ``tests/test_laws.py``'s tiny images on the CPU, float64, its verifies
    through the static buckets (built once per process)."""
    if name not in _LAWS:
        layout, vocab = LAW_SETUPS[name]
        target, _ = tiny("tiny_llamagen", **{"arch.vocab_size": vocab, "arch.block_size": 16, "vq.kind": "none"})
        target.layout = dataclasses.replace(target.layout, **layout)
        target.request_static(graphs=False)
        inputs = target.encode_prompt("a red circle", cfg=True)
        _LAWS[name] = (target, inputs, L.exact_law(target, inputs, T1))
    return _LAWS[name]


HEADLINE = "scd-up-step-t1"
"""The step's headline case: ``tests/test_laws.py``'s headline tier (TV ≤ 0.05 detected at 90 % power, its paths each
in ≥ 30 % of the images, ``PathWatch`` from the records)."""
CASES = {
    HEADLINE: ("t1", "scd", {"window": 3}, TL.HEADLINE_N["t1"]),
    "sjd-random-step-t1": ("t1", "sjd", {"window": 3, "init": "random"}, 1000),
    "gsd0-left-step-t1": ("t1", "gsd", {"window": 3, "init": "left", "group_size": 0}, 1000),  # an empty group
    "scd-up-step-eol": ("eol", "scd", {"window": 4}, 1000),
}


def step_images(
    target: Any, inputs: Any, method: str, node: dict, n: int, g: torch.Generator, reuse: bool = True
) -> list[Any]:
    """``n`` images of the fixed-shape step from one generator; ``reuse``: the prompt's prefill run once and restored
    for the others (``StaticGPTTarget.reuse_prefill``: the same tokens, ``tests/test_prefill_reuse.py``)."""
    with target.reuse_prefill(inputs) if reuse else contextlib.nullcontext():
        return [generate(target, JacobiModels(), policy(method, step="graph", **node), inputs, T1, g) for _ in range(n)]


def step_law(name: str, setup: str, method: str, node: dict, n: int, record: Any) -> L.LawResult:
    """χ² of ``n`` images of the fixed-shape step (``engine.graphs.step=graph``) against AR's exact law."""
    target, inputs, law = law_setup(setup)
    counts: Counter = Counter()
    g = torch.Generator().manual_seed(7)
    accepted = 0
    watch = TL.PathWatch()  # from the records: the step's chain verdict is its own
    for res in step_images(target, inputs, method, node, n, g):
        assert res.stats["step"] == "fixed-shape"
        counts[tuple(res.tokens)] += 1
        accepted += sum(c.accepted for c in res.cycles)
        watch.image(g, res, chain=True)
    result = L.report(L.chi2_law(name, counts, law, n), record)
    print(f"  paths per image: {watch.fractions()}")
    assert accepted / n > 0.3, accepted / n  # the acceptance, rejection and redraw paths all ran
    if name == HEADLINE:
        short = {k: watch.ran[k] / n for k in ("rejected", "residual bonus", "leaf bonus", "redraw")
                 if watch.ran[k] < TL.PATHS_MIN * n}  # fmt: skip
        assert not short, (name, short)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_law_of_the_fixed_shape_step(name: str, record_property) -> None:
    """The T = 1 law of the step's images is AR's (p > 10⁻³), float64 (``adtbench/algorithm/laws.py``; the power
    printed)."""
    r = step_law(name, *CASES[name], record_property)
    assert r.pvalue > L.ALPHA, r.line()
    if name == HEADLINE:
        assert r.tv90 <= TL.HEADLINE_TV, r.line()


_REDRAW = JS.redraw


def authors_redraw(kind, probs, old, q_old, has_old, generator, noise=None, draws=None):  # type: ignore[no-untyped-def]
    """The SCD authors' rule planted into the step: a kept draft stays with its old proposal q_old."""
    tok, q, keep = _REDRAW(kind, probs, old, q_old, has_old, generator, noise, draws)
    return tok, torch.where(keep[:, None], q_old, q), keep


@pytest.mark.slow
def test_the_scd_authors_stored_proposal_fails_in_the_step(monkeypatch, record_property) -> None:
    """The planted control: the SCD authors' stored proposal inside the step fails the same test at N = 1000."""
    monkeypatch.setattr(JS, "redraw", authors_redraw)
    r = step_law("scd-left-step-t1 + the SCD authors' stored proposal", "t1", "scd", {"window": 3, "init": "left"},
                 1000, record_property)  # fmt: skip
    assert r.pvalue < L.ALPHA, r.line()


# ---------------------------------------------------------------------------------------------------------
# launches per forward, counted (``bench overhead bench.count=true``)
# ---------------------------------------------------------------------------------------------------------

TINY = ["model=tiny_llamagen", "policy=scd", "policy.window=6", "dataset=smoke", "model.device=cuda", "threads=1"]


@pytest.mark.parametrize("compile_on", [True, False])
def test_an_scd_forward_is_three_launches_and_no_read(tmp_path: Path, compile_on: bool) -> None:
    """``bench.count=true`` over SCD on the simulated device: with ``engine.compile=true`` (the step graphed) the
    engine issues 2 kernels per forward outside the step's graph (the draws, the verdict's copy) plus its one replay,
    and reads the device once per image (the tokens); the eager loop (``engine.compile=false``) ≈ 80 and one read per
    forward."""
    from adtbench.tools.bench import main as bench_main

    out = tmp_path / "count.json"
    args = ["overhead", *TINY, f"engine.compile={str(compile_on).lower()}", "bench.count=true", "bench.prompts=2"]
    with accel.simulate():
        assert bench_main([*args, f"bench.out={out}"]) == 0
    r = json.loads(out.read_text())
    per_image = r["prompts"] / r["cycles"]
    phases = {p["phase"]: p for p in r["phases"]}
    if compile_on:
        assert phases["jacobi: step (one graph replay)"]["ops_per_cycle"] > 0  # the replay's ops: one launch
        # per forward (the idle one included): the draws and the copy; per image: the end's read and commit (≤ 6)
        assert r["engine_kernels_per_cycle"] <= 2.0 * (1.0 + per_image) + 6 * per_image, r["phases"]
        assert r["host_reads_per_cycle"] == pytest.approx(per_image)
    else:
        assert r["engine_kernels_per_cycle"] > 40
        assert r["host_reads_per_cycle"] == pytest.approx(1.0 + per_image)
