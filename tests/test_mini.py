"""The shipped mini model: weights load, generation works, greedy speculative decoding equals AR, the trained
drafter and evaluator carry real signal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import model_cfg
from omegaconf import OmegaConf

from adtbench.drafters.build import build_drafter
from adtbench.engine import decode_ar, generate
from adtbench.models.registry import build_target
from adtbench.policies.eagle2 import Eagle2Policy
from adtbench.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "adtbench" / "weights" / "mini"
PROMPTS = [
    ln
    for ln in (ROOT / "adtbench" / "data" / "mini_prompts.txt").read_text().splitlines()
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


def test_greedy_speculative_equals_ar_and_accepts(mini):
    target, drafter = mini
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
    from adtbench.models.mini_evaluator import load_mini_evaluator
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
    from adtbench.config import register_resolvers
    from adtbench.data.prompts import load_prompts

    register_resolvers()
    d = OmegaConf.load(ROOT / "conf" / "dataset" / "mini.yaml")
    prompts = load_prompts(str(d.kind), str(d.path), d.limit, d.shard)
    assert [p.text for p in prompts] == PROMPTS and len(prompts) >= 20
