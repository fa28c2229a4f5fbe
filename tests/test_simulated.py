"""Every entry point on the simulated CUDA device (``adtbench.accel``): the code a GPU runs — device acceptance, the
device clock, CUDA graphs (through their stand-in) of every verify and drafter bucket, bf16 where the config says
auto — executed on the CPU with CUDA's placement rules enforced. A placement violation raises, so each run passing
is the check "0 violations"; the counters say how often the host waited for the device.

Kept short for CI (tiny models, one prompt): the app for every policy with each relaxation and each sampling mode
among them, cost measurement, the draft gate, ZipAR and MuLo-SD included; every policy × rule × greedy / T = 1 on the
engine (greedy = AR greedy on the device); batched decoding; the command line with ``ADTBENCH_SIMULATE_DEVICE``;
``train drafter`` and the mini model card's cost figures. ``tests/test_accel.py`` holds the rules themselves and the
planted-bug negative controls."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_OVERRIDES, run_in_process, synthetic_cost_model, tiny
from hydra import compose, initialize_config_dir

from adtbench import accel
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.lantern import LanternRule, nearest_codes
from adtbench.algorithm.policies import methods
from adtbench.algorithm.verify import EXACT
from adtbench.graph_modes import GraphModes
from adtbench.harness.config import build_policy, register_resolvers
from adtbench.sampling_params import SamplingParams

FAST = ["warmup=1", "progress=false", "maps.per_run=false", "dataset=smoke", "dataset.limit=1", "model.device=cuda"]

# every registered method that runs on the tiny models, from the registry (``Method.smoke`` sizes it), then the
# variants: exact and LANTERN, greedy and T = 1 alternate among them; engine.compile=true: the graph path
APP_CASES = {
    **{m.name: [f"policy={m.name}", *m.smoke] for m in methods() if m.tiny},
    "static_sampled": ["policy=static_sampled", "lantern=on"],
    "chain_lantern_greedy": ["policy=chain", "lantern=on", "sampling=greedy"],
    "adt_gate": ["policy=adt", "policy.draft_sampling=sample", "policy.gate_tokens=2.0"],
    "eagle2_cost_greedy": ["policy=eagle2", "policy.budget=cost", "sampling=greedy"],
    "sjd_batched": ["policy=sjd", "policy.init=left", "decode.batch_size=2", "decode.window=1", "dataset.limit=3"],
    "batched": ["policy=eagle2", "decode.batch_size=2", "decode.window=1", "dataset.limit=3"],
}


def test_the_app_cases_cover_every_registered_method() -> None:
    """The list above is the registry's: every method that runs on the tiny models has its case (MuLo-SD, which
    needs a low-resolution model, has its own test below)."""
    assert {m.name for m in methods() if m.tiny} <= set(APP_CASES)
    shipped = [m for m in methods() if m.build.__module__.startswith("adtbench.")]
    assert {m.name for m in shipped if not m.tiny} == {"mulo"}


def _compose(overrides: list[str]):
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=overrides)


@functools.cache
def _policy_config(overrides: tuple[str, ...]):
    """``_compose`` of a policy's overrides, once per process: the every-policy test builds each policy (afresh:
    ``build_policy`` reads the config, never writes it) for 4 rule × temperature cases."""
    return _compose(list(overrides))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(APP_CASES))
def test_the_app_runs_every_policy_on_the_simulated_device(case: str, tmp_path: Path) -> None:
    from adtbench.harness.app import run

    compile_on = "engine.compile=false" not in APP_CASES[case]
    cfg = _compose([*TINY_OVERRIDES, *FAST, "engine.compile=true", *APP_CASES[case]])
    with accel.simulate() as sim:
        summary = run(cfg, tmp_path / "run", {})
    info = summary
    assert summary["n_samples"] >= 1 and info["simulated_device"]["device_reads"] >= 1
    assert summary["env"]["gpu"] == "simulated cuda (cpu)"
    if compile_on and case != "zipar":  # ZipAR feeds tokens out of raster order (forward_at): no buckets
        assert info["graph_capture_s"] is not None and sim.counts["graph_replays"] > 0
    if case == "ar":  # the AR baseline reads the device once per image (and the prefill's first token)
        assert info["simulated_device"]["device_reads"] <= 4 * (1 + int(cfg.warmup)) * summary["n_samples"]


@pytest.mark.slow
def test_the_reference_baseline_runs_on_the_simulated_device(tmp_path: Path) -> None:
    """``timing.reference_baseline``: the lean Chameleon replays its graphs while the transformers reference, built
    beside it, runs eagerly on the same (simulated) device, both AR sides on every prompt."""
    from adtbench.harness.app import run

    over = [o for o in TINY_OVERRIDES if not o.startswith("model=")]
    cfg = _compose(["model=tiny_chameleon", *over, *FAST, "engine.compile=true", "timing.reference_baseline=true",
                    "sampling=greedy", "model.dtype=float64"])  # fmt: skip
    with accel.simulate() as sim:
        summary = run(cfg, tmp_path / "run", {})
    assert summary["graph_capture_s"] is not None and sim.counts["graph_replays"] > 0
    assert summary["speedup_ref"] is not None and summary["reference_baseline"].startswith("model.impl=hf")
    assert summary["reference_tokens_match_baseline"] is True


@pytest.mark.slow
def test_mulo_runs_on_the_simulated_device(tmp_path: Path) -> None:
    from adtbench.harness.app import run

    cfg = _compose(["model=mini", "policy=mulo", "policy.block_rows=2", *FAST, "warmup=0", "dataset=mini_quick",
                    "dataset.limit=1", "save_images=false"])  # fmt: skip
    with accel.simulate():
        summary = run(cfg, tmp_path / "run", {})
    assert summary["n_samples"] == 1


RULES = ("exact", "lantern")
POLICY_NODES = {  # the yaml of each tree policy, shrunk to the tiny model where it has a size key
    "chain": [],
    "static": [],
    "static_sampled": [],
    "eagle2": ["policy.total_tokens=12", "policy.top_k=3", "policy.depth=3"],
    "adt": ["policy.N_max=10", "policy.K0=3", "policy.K_min=2", "policy.K_max=4", "policy.D0=3"],
    "adt_live": [  # budget: cost deciding its rounds live on the device (one read per round)
        *["policy.N_max=10", "policy.K0=3", "policy.K_min=2", "policy.K_max=4", "policy.D0=3", "policy.rounds=live"]
    ],
    "adt_sampled_gate": [
        *["policy.N_max=10", "policy.K0=3", "policy.K_min=2", "policy.K_max=4", "policy.D0=3"],
        *["policy.draft_sampling=sample", "policy.gate_tokens=2.0"],
    ],
}


@pytest.fixture(scope="module")
def device_models():
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", dtype="float32", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
    return target, drafter


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("relax", RULES)
def test_every_policy_and_rule_on_the_simulated_device(device_models, relax: str, temperature: float) -> None:
    """Each tree policy (its yaml, budget: cost where the yaml says so — with a synthetic cost model here: the app
    cases measure one —, the gate) × rule on the device path with CUDA graphs; greedy with the exact rule equals AR
    greedy token for token."""
    target, drafter = device_models
    sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
    with accel.simulate() as sim:
        inputs = target.encode_prompt("a red circle", cfg=True)
        rule = EXACT if relax == "exact" else LanternRule(nearest_codes(target.codebook(), 3),
                                                          target.layout.image_token_offset, delta=0.2)  # fmt: skip
        ar = decode_ar(target, inputs, sp, accel.generator(target.device, 0))
        for name, extra in POLICY_NODES.items():
            base = "adt" if name.startswith("adt") else name
            policy = build_policy(_policy_config((f"policy={base}", *extra)))
            policy.bind(lambda *_: synthetic_cost_model())
            out = generate(target, drafter, policy, inputs, sp, accel.generator(target.device, 0), rule)
            assert len(out.tokens) == target.layout.num_gen_tokens
            if temperature == 0.0 and relax == "exact":
                assert out.tokens == ar.tokens, name
        assert sim.counts["graph_replays"] > 0


@pytest.mark.slow
def test_the_command_line_runs_on_the_simulated_device(tmp_path: Path) -> None:
    """``ADTBENCH_SIMULATE_DEVICE=cuda python run.py … model.device=cuda``: the whole process on the simulated device;
    the summary records what it counted and the exit line reports it."""
    env = {**os.environ, accel.SIMULATE_ENV: "cuda", "HYDRA_FULL_ERROR": "0"}
    args = [*TINY_OVERRIDES, *FAST, "engine.compile=true", "policy=static_sampled", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["simulated_device"]["graph_replays"] > 0
    assert "adtbench: simulated cuda:" in proc.stderr


@pytest.mark.parametrize("model", ["default", "tiny"])
def test_compile_on_the_simulated_device_without_model_device_cuda_says_what_to_set(model: str, tmp_path: Path) -> None:
    """``ADTBENCH_SIMULATE_DEVICE=cuda python run.py engine.compile=true`` with the model on the host (the mini
    model's ``model.device: cpu``, or the tiny one's): torch.compile cannot trace under the simulation, so the command
    line refuses it in one line naming ``model.device=cuda`` (exit 2, nothing written) rather than a traceback."""
    args = ["engine.compile=true", f"hydra.run.dir={tmp_path / 'run'}"]
    if model == "tiny":
        args = [*TINY_OVERRIDES, "dataset=smoke", "dataset.limit=1", "model.device=cpu", *args]
    proc = run_in_process(*args, env={accel.SIMULATE_ENV: "cuda", "HYDRA_FULL_ERROR": "0"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("adtbench: config error")]
    assert len(lines) == 1 and "model.device=cuda" in lines[0] and "Traceback" not in proc.stderr
    assert "adtbench: simulated cuda:" in proc.stderr and accel.simulation() is None
    assert not (tmp_path / "run").exists()


def test_an_unknown_simulated_device_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(accel.SIMULATE_ENV, "rocm")
    with pytest.raises(SystemExit, match=accel.SIMULATE_ENV):
        accel.activate_from_env()
    assert accel.simulation() is None


def test_the_model_cards_cost_figures_on_the_simulated_device() -> None:
    from adtbench.tools.train.figures import cost_ratios, load_models

    with accel.simulate():
        target, drafter = load_models(device="cuda")
        assert accel.is_cuda(target.device) and target.dtype == torch.float32  # the yaml's dtype, not auto's bf16
        r = cost_ratios(target, drafter, repeats=1, prefix=16)
    assert r["tree_nodes"] > 1 and r["step_ms"] > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_batched_decoding_equals_eager_on_the_simulated_device(temperature: float) -> None:
    """``engine.compile`` with B > 1 and CFG: every batched verify runs as a captured graph of the batch's buckets
    (``BatchTarget.request_static``) and decodes the eager batch's tokens (float64: the same sums), speculation and the
    AR baseline alike; three prompts through two slots, so slots are refilled mid-run. At T > 0 the speculation's
    verify is the op-by-op one over the captured forward (``engine.graphs.verify=eager``): the batched verify step
    draws its own uniforms (other tokens, the same law: ``tests/test_batch_step.py``)."""
    from adtbench.algorithm.batch import decode_ar_batch, generate_batch
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.models.batch import BatchTarget

    sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
    with accel.simulate() as sim:
        target, drafter = tiny("tiny_llamagen", dtype="float64", device="cuda")
        inputs = [target.encode_prompt(t, cfg=True) for t in ("a red circle", "two blue squares", "a green cat")]
        policy = Eagle2Policy(depth=2, top_k=3, total_tokens=9)
        policy.graphs = GraphModes(verify="auto" if temperature == 0 else "eager")
        need = max(target.prompt_length(x) for x in inputs) + target.layout.num_gen_tokens + 16 + 1  # bucket 16
        out = []
        for graphs in (False, True):
            bt = BatchTarget(target, 2, True, need)
            if graphs:
                bt.request_static(graphs=True)
                replays = sim.counts["graph_replays"]
            items = [(i, x, accel.generator(target.device, i)) for i, x in enumerate(inputs)]
            got: dict[int, list[int]] = {}
            generate_batch(bt, drafter, policy, items, sp, lambda k, r, got=got: got.__setitem__(k, r.tokens))
            ar = decode_ar_batch(bt, [(i, x, accel.generator(target.device, 9)) for i, x in enumerate(inputs[:2])], sp)
            out.append(([got[i] for i in range(3)], [r.tokens for r in ar]))
        assert sim.counts["graph_replays"] - replays >= bt.forwards > 0
        assert all(s.graph is not None for s in bt.static.steps.values())
    assert out[0] == out[1]
