"""The shipped mini model: weights load, generation works, greedy speculative decoding equals AR, the trained
drafter and evaluator carry real signal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import model_cfg
from omegaconf import OmegaConf

from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.harness.drafters import build_drafter
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "adtbench" / "weights" / "mini"
PROMPTS = [
    ln
    for ln in (ROOT / "adtbench" / "harness" / "data" / "mini_prompts.txt").read_text().splitlines()
    if ln.strip() and not ln.startswith("#")
]


@pytest.fixture(scope="module")
def mini():
    target = build_target(model_cfg("mini"))
    drafter = build_drafter(OmegaConf.load(ROOT / "conf" / "drafter" / "mini.yaml"), target)
    return target, drafter


def test_shipped_weights_fit_the_budget():
    files = [p for p in WEIGHTS.rglob("*") if p.is_file()]
    names = {str(p.relative_to(WEIGHTS)) for p in files}
    for d in ("vq", "ar16", "ar8", "drafter", "evaluator"):
        assert f"{d}/config.json" in names
    assert "MODEL_CARD.md" in names
    assert sum(p.stat().st_size for p in files) <= 40 * 2**20


def test_models_load(mini):
    target, drafter = mini
    lay = target.layout
    assert (lay.grid_h, lay.grid_w, lay.vocab_size) == (16, 16, 512)
    assert target.vq.downsample_factor == 4 and target.gpt.cfg.n_layer == 12
    assert drafter.config.hidden_size == target.hidden_size
    low = build_target(model_cfg("mini_lowres"))
    assert (low.layout.grid_h, low.layout.vocab_size) == (8, 512)
    # the learned text encoder distinguishes captions; unknown words map to <unk> and still encode
    a = target.encode_prompt(PROMPTS[0], cfg=True).data["caption"]
    b = target.encode_prompt(PROMPTS[1], cfg=True).data["caption"]
    assert not torch.allclose(a, b)
    assert target.encode_prompt("an orange cat on a wooden chair", cfg=True).data["valid"].sum() == 7


def test_short_generation_lowres():
    low = build_target(model_cfg("mini_lowres"))
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    res = decode_ar(low, low.encode_prompt(PROMPTS[2], cfg=True), sp, torch.Generator().manual_seed(0))
    img = low.decode_image(low.layout.tokens_to_codes(res.tokens))
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8 and img.std() > 1.0


def test_greedy_speculative_equals_ar_and_accepts():
    """Greedy EAGLE-2 on the trained mini model and drafter decodes AR's tokens, in float64: the tree's verify and
    AR's step are matmuls of other shapes, whose float32 rounding could break a near-tie apart on some CPU."""
    target = build_target(model_cfg("mini", dtype="float64"))
    drafter = build_drafter(OmegaConf.load(ROOT / "conf" / "drafter" / "mini.yaml"), target)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = target.encode_prompt(PROMPTS[3], cfg=True)
    ar = decode_ar(target, inputs, sp, None)
    spec = generate(target, drafter, Eagle2Policy(4, 10, 59), inputs, sp, None)
    assert spec.tokens == ar.tokens
    assert spec.tau > 1.5  # a trained drafter: a random one gives τ ≈ 1
    img = target.decode_image(target.layout.tokens_to_codes(spec.tokens))
    assert img.shape == (64, 64, 3)


def test_sampled_generation_is_valid(mini):
    target, drafter = mini
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    g = torch.Generator().manual_seed(1)
    res = generate(target, drafter, Eagle2Policy(4, 10, 59), target.encode_prompt(PROMPTS[4], cfg=True), sp, g)
    assert len(res.tokens) == 256 and res.committed == 255 and res.tau > 1.0  # token 0 comes from the prefill
    assert all(0 <= t < 512 for t in res.tokens)


def test_evaluator_agrees_with_ground_truth():
    from adtbench.models.mini.evaluator import load_mini_evaluator
    from adtbench.scenes import iter_split, render

    ev = load_mini_evaluator()
    scenes = [s for _, s in iter_split(0, "heldout", 32)]
    imgs = np.stack([render(s, 64) for s in scenes])
    caps = [s.caption for s in scenes]
    true = np.mean(ev.score(imgs, caps))
    shuffled = np.mean(ev.score(imgs, caps[1:] + caps[:1]))
    assert true > 0.85 and true - shuffled > 0.25
    assert ev.features(imgs).shape == (32, ev.cfg.feature_dim)


def test_dataset_config_lists_heldout_prompts():
    from adtbench.harness.config import register_resolvers
    from adtbench.harness.data.prompts import load_prompts

    register_resolvers()
    d = OmegaConf.load(ROOT / "conf" / "dataset" / "mini.yaml")
    prompts = load_prompts(str(d.kind), str(d.path), d.limit, d.shard)
    assert [p.text for p in prompts] == PROMPTS and len(prompts) >= 20


def test_default_config_is_the_mini_model_with_its_drafter():
    """``python run.py`` with no arguments: model=mini, its trained drafter, held-out prompts; drafter=eagle loads
    the model's own trained drafter (``model.drafter_path``) unless ``drafter.path`` is given."""
    from hydra import compose, initialize_config_dir

    from adtbench.harness.config import register_resolvers

    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", return_hydra_config=True)
        other = compose("config", overrides=["model=tiny_llamagen"])
        explicit = compose("config", overrides=["drafter.path=null"])
        named = compose("config", overrides=["drafter=mini"])
    choices = cfg.hydra.runtime.choices
    assert (choices.model, choices.drafter, choices.dataset, choices.lantern) == ("mini", "eagle", "mini_quick", "off")
    assert choices.policy == "scd_cost"
    assert (cfg.policy.name, cfg.policy.window, cfg.policy.init) == ("scd", "cost", "up")
    assert cfg.drafter.path.endswith("weights/mini/drafter") and cfg.sampling.temperature == 1.0
    assert named.drafter.path == cfg.drafter.path
    assert other.drafter.path is None and explicit.drafter.path is None


def test_mini_drafter_refuses_another_target(tmp_path):
    from adtbench.errors import ConfigError

    tiny = build_target(model_cfg("tiny_llamagen"))
    with pytest.raises(ConfigError, match=r"drafter\.path"):
        build_drafter(OmegaConf.load(ROOT / "conf" / "drafter" / "mini.yaml"), tiny)


@pytest.mark.slow
def test_default_run_from_the_command_line(tmp_path):
    """The default run, shortened to one prompt: images, samples.jsonl, summary.json, the summary line."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "default"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "run.py"), "dataset.limit=1", "warmup=0", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "adtbench: model=mini" in proc.stdout and "speedup=" in proc.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["model"] == "mini" and s["policy"] == "scd_cost" and s["n_samples"] == 1
    # SCD drafts from the upper neighbour: no draft ever accepted would read τ = 1 (the bonus token only); the default
    # reads τ 2.5–2.9 per prompt on the mini model: a margin over no acceptance, not a figure
    assert s["tau"] > 1.5
    rec = json.loads((out / "samples.jsonl").read_text())
    assert rec["prompt"] == PROMPTS[0] and len(rec["tokens"]) == 256 and rec["baseline_latency_s"] > 0
    from PIL import Image

    assert Image.open(out / rec["image"]).size == (64, 64)


def test_model_card_is_generated_from_the_recorded_figures():
    """MODEL_CARD.md is exactly what ``report card`` renders from train_info.json + figures.json (no hand edits)."""
    import json

    from adtbench.tools.train.card import render_card
    from adtbench.tools.train.figures import FIGURES

    assert (WEIGHTS / "MODEL_CARD.md").read_text() == render_card()
    figs = json.loads(FIGURES.read_text())
    assert {"ratios_t1", "ratios_t2", "grid", "sweep_t1", "sweep_greedy"} <= set(figs)
    rows = figs["sweep_t1"]["rows"]
    assert {(r["policy"], r["lantern"]) for r in rows} == {
        (p, lan) for p in ("chain", "static", "eagle2", "adt") for lan in ("on", "off")
    }
    assert all(r["n"] >= 20 and r["tau"] >= 1.0 for r in rows)


def test_evaluator_rescore_against_another_tokenizer(tmp_path):
    """``report evaluator`` after a tokenizer change: the held-out stats are re-measured through the given VQ and
    merged into train_info.json; the training record is kept and the VQ named (a copy, not the shipped file)."""
    import shutil

    from adtbench.tools.train.evaluator import rescore

    ev = tmp_path / "evaluator"
    shutil.copytree(WEIGHTS / "evaluator", ev)
    info = json.loads((ev / "train_info.json").read_text())
    info["config"]["eval_count"] = 16
    info["agreement_vq_recon"] = -1.0  # stale marker
    (ev / "train_info.json").write_text(json.dumps(info))
    stats = rescore(ev, WEIGHTS / "vq")
    new = json.loads((ev / "train_info.json").read_text())
    assert 0.0 <= stats["agreement_vq_recon"] <= 1.0 and new["agreement_vq_recon"] == stats["agreement_vq_recon"]
    assert new["heldout_scenes"] == 16 and new["steps"] == info["steps"] and new["final"] == info["final"]
    assert new["rescored_vq"]["path"] == "${pkg:weights/mini/vq}" and len(new["rescored_vq"]["sha256"]) == 12
