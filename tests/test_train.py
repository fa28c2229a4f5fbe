"""Training pipeline: tiny smoke runs of every stage, resume = uninterrupted, and the drafter pairing.

The pairing test is the one that matters for correctness (algorithms.md §7, §10 items 2 and 28): the
slots the drafter is *trained* on must be exactly what the engine *feeds* it at inference —
``(f_t, input embedding at t+1)`` — and the training forward must reproduce the inference outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny
from omegaconf import OmegaConf
from safetensors.torch import load_file

from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams
from adtbench.tools.train.cli import main as train_main
from adtbench.tools.train.drafter import collate, drafter_forward, drafter_slots, teacher_sample

VQ_TINY = [
    "data.count=8",
    "data.sizes=[16]",
    "data.crop=16",
    "eval_count=2",
    "arch.codebook_size=64",
    "arch.z_channels=32",
    "steps=4",
    "batch_size=2",
    "restart_every=2",
    "log_every=2",
    "ckpt_every=2",
    "progress=false",
]
AR_TINY = [
    "data.count=8",
    "data.size=16",
    "gpt.dim=32",
    "gpt.n_layer=1",
    "gpt.n_head=2",
    "gpt.vocab_size=64",
    "gpt.caption_dim=16",
    "text_encoder.dim=16",
    "text_encoder.n_layer=1",
    "text_encoder.n_head=2",
    "steps=4",
    "batch_size=2",
    "warmup=1",
    "eval_count=2",
    "sample_count=1",
    "log_every=2",
    "ckpt_every=2",
    "progress=false",
]


def _run(stage: str, out: Path, *over: str) -> dict:
    assert train_main([stage, f"out_dir={out}", *over]) == 0
    return json.loads((out / "final" / "train_info.json").read_text())


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> dict[str, Path]:
    """A tiny VQ → AR chain trained through the CLI (shared by the tests below)."""
    root = tmp_path_factory.mktemp("train")
    cache = root / "cache"
    _run("vq", root / "vq", f"cache_dir={cache}", *VQ_TINY)
    vq = root / "vq" / "final"
    _run("ar", root / "ar", f"cache_dir={cache}", f"vq_path={vq}", *AR_TINY)
    return {"root": root, "cache": cache, "vq": vq, "ar": root / "ar" / "final"}


def _mini_cfg(stack: dict[str, Path], **over):
    cfg = OmegaConf.create({"name": "t", "family": "mini", "path": str(stack["ar"]), "vq_path": str(stack["vq"])})
    cfg.update({"dtype": "float32", "device": "cpu", **over})
    return cfg


def test_vq_and_ar_outputs_load_and_generate(stack):
    vq_info = json.loads((stack["vq"] / "train_info.json").read_text())
    assert vq_info["steps"] == 4 and vq_info["psnr_64"] > 0
    assert (stack["root"] / "vq" / "recon.png").exists()
    target = build_target(_mini_cfg(stack))
    assert target.layout.grid_h == 4 and target.layout.vocab_size == 64
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    res = decode_ar(target, target.encode_prompt("a small red circle on a plain blue background", True), sp, None)
    img = target.decode_image(target.layout.tokens_to_codes(res.tokens))
    assert img.shape == (16, 16, 3)
    assert (stack["root"] / "ar" / "samples.png").exists()
    # the exported GPT uses the official LlamaGen key names
    keys = set(load_file(str(stack["ar"] / "gpt.safetensors")))
    assert {"tok_embeddings.weight", "layers.0.attention.wqkv.weight", "output.weight"} <= keys
    assert "cls_embedding.uncond_embedding" in keys


def test_text_encoder_batch_equals_single(stack):
    from adtbench.models.mini.target import load_ar, right_align

    gpt, text = load_ar(stack["ar"])
    caps = ["a large red circle left of a small blue square on a striped green background", "a small red circle"]
    ids, words = text.batch_ids(caps)
    with torch.no_grad():
        batched, valid = right_align(text(ids, words), words, gpt.cfg.cls_token_num)
    for i, c in enumerate(caps):
        single = text.encode(c)
        n = single.shape[0]
        assert int(valid[i].sum()) == n and bool(valid[i, -n:].all())
        torch.testing.assert_close(batched[i, -n:], single, atol=1e-5, rtol=1e-5)
        assert bool((batched[i, :-n] == 0).all())


def test_ar_resume_equals_uninterrupted(stack, tmp_path):
    over = [f"cache_dir={stack['cache']}", f"vq_path={stack['vq']}", *AR_TINY, "sample_count=0"]
    _run("ar", tmp_path / "a", *over)
    assert train_main(["ar", f"out_dir={tmp_path / 'b'}", *over, "stop_after=3"]) == 0
    assert not (tmp_path / "b" / "final").exists()  # stopped early: no export yet
    _run("ar", tmp_path / "b", *over)
    a = load_file(str(tmp_path / "a" / "final" / "gpt.safetensors"))
    b = load_file(str(tmp_path / "b" / "final" / "gpt.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a resume with a different config is refused
    with pytest.raises(RuntimeError, match="different config"):
        train_main(["ar", f"out_dir={tmp_path / 'b'}", *over, "lr=0.5"])


def test_ar_attribute_loss_trains_resumes_and_is_not_exported(stack, tmp_path):
    """``aux_weight > 0``: the attribute heads train (loss logged), resume bit-exactly, and stay out of the export."""
    over = [f"cache_dir={stack['cache']}", f"vq_path={stack['vq']}", *AR_TINY, "sample_count=0", "aux_weight=0.5"]
    _run("ar", tmp_path / "a", *over)
    assert train_main(["ar", f"out_dir={tmp_path / 'b'}", *over, "stop_after=3"]) == 0
    _run("ar", tmp_path / "b", *over)
    a = load_file(str(tmp_path / "a" / "final" / "gpt.safetensors"))
    b = load_file(str(tmp_path / "b" / "final" / "gpt.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any("attr_heads" in k for k in a)
    assert '"aux"' in (tmp_path / "a" / "log.jsonl").read_text()
    # the GPT differs from the run without the loss: the heads' gradient reaches it
    plain = [f"cache_dir={stack['cache']}", f"vq_path={stack['vq']}", *AR_TINY, "sample_count=0"]
    _run("ar", tmp_path / "c", *plain)
    c = load_file(str(tmp_path / "c" / "final" / "gpt.safetensors"))
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert train_main(["ar", f"out_dir={tmp_path / 'd'}", *plain, "aux_weight=-1"]) == 2  # before any loading
    assert not (tmp_path / "d" / "checkpoint.pt").exists()


def test_attribute_targets_follow_the_canonical_attributes():
    from adtbench.scenes import ATTRIBUTES
    from adtbench.tools.train.ar import AttributeHeads

    t = AttributeHeads.targets(
        [
            "a large red circle right of a small blue square on a striped green background",
            "a small red circle on a plain blue background",
        ]
    )
    # canonical order: left object first, so "b right of a" puts the blue square in slot a
    assert ATTRIBUTES["a_color"][int(t["a_color"][0])] == "blue"
    assert ATTRIBUTES["b_shape"][int(t["b_shape"][0])] == "circle"
    assert int(t["b_color"][1]) == -100 and int(t["axis"][1]) == -100
    with pytest.raises(ValueError, match="outside the scene grammar"):
        AttributeHeads.targets(["a cat"])


def test_drafter_stage_trains_on_the_simulated_device(stack, tmp_path):
    """``adtbench train drafter model.device=cuda`` on the simulated CUDA device (``adtbench.accel``): teacher
    features, training and the engine evaluation run with CUDA's placement rules (a violation raises)."""
    from adtbench import accel

    over = [f"model.path={stack['ar']}", f"model.vq_path={stack['vq']}", "model.device=cuda", "teacher.count=4",
            "teacher.eval_count=2", "teacher.shard_size=4", "steps=2", "batch_size=2", "warmup=1", "eval_prompts=1",
            "log_every=1", "ckpt_every=2", "progress=false"]  # fmt: skip
    with accel.simulate() as sim:
        info = _run("drafter", tmp_path / "d", "model=mini", *over)
    assert info["engine_tau_greedy"] >= 1.0 and sim.counts["device_reads"] > 0


def test_drafter_stage_trains_and_resumes(stack, tmp_path):
    over = [
        "model=mini",
        f"model.path={stack['ar']}",
        f"model.vq_path={stack['vq']}",
        "teacher.count=6",
        "teacher.eval_count=2",
        "teacher.shard_size=4",
        "steps=6",
        "batch_size=2",
        "warmup=1",
        "eval_prompts=1",
        "log_every=2",
        "ckpt_every=2",
        "progress=false",
    ]
    info = _run("drafter", tmp_path / "a", *over)
    assert info["teacher_train"] == 6 and info["engine_tau_greedy"] >= 1.0
    assert {"heldout_vloss", "heldout_ploss", "heldout_cfg", "heldout_acc_mix"} <= set(info)
    cfg = json.loads((tmp_path / "a" / "final" / "config.json").read_text())
    assert cfg["hidden_size"] == 32 and cfg["num_layers"] == 1
    assert train_main(["drafter", f"out_dir={tmp_path / 'b'}", *over, "stop_after=4"]) == 0
    _run("drafter", tmp_path / "b", *over)
    a = load_file(str(tmp_path / "a" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the exported drafter loads through the harness' builder
    from adtbench.harness.drafters import build_drafter

    target = build_target(_mini_cfg(stack))
    d = build_drafter(OmegaConf.create({"kind": "eagle", "path": str(tmp_path / "a" / "final"), "seed": 1}), target)
    assert sum(p.numel() for p in d.parameters()) == info["params"]
    # a warm start on the target's own samples (teacher.source=generated) begins from a's weights: with lr 0 it
    # ends there exactly
    warm = [*over, "teacher.source=generated", "lr=0.0", f"init_from={tmp_path / 'a' / 'final'}"]
    _run("drafter", tmp_path / "c", *warm)
    c = load_file(str(tmp_path / "c" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_evaluator_stage(stack, tmp_path):
    over = ["steps=3", "batch_size=4", "eval_count=4", "arch.width=8", "arch.feature_dim=16", "progress=false"]
    info = _run("evaluator", tmp_path / "e", f"vq_path={stack['vq']}", *over)
    assert 0.0 <= info["agreement_true"] <= 1.0 and "agreement_vq_recon" in info
    from adtbench.models.mini.evaluator import load_mini_evaluator

    ev = load_mini_evaluator(tmp_path / "e" / "final")
    imgs = torch.zeros(2, 64, 64, 3, dtype=torch.uint8)
    assert ev.features(imgs).shape == (2, 16)
    s = ev.score(imgs, ["a small red circle on a plain blue background", "not a caption"])
    assert s[1] is None and 0.0 <= s[0] <= 1.0
    # a warm start begins from the exported weights (and trains on)
    info2 = _run("evaluator", tmp_path / "e2", "vq_path=null", f"init_from={tmp_path / 'e' / 'final'}", *over)
    assert info2["steps"] == 3


def test_cli_usage_errors():
    assert train_main([]) == 2
    assert train_main(["nope"]) == 2


# ----------------------------------------------------------------------------------------------------
# The drafter shift: training slots == engine inference inputs
# ----------------------------------------------------------------------------------------------------


class _Recorder:
    """Records every ``drafter.extend`` call (the committed slots) and its returned output."""

    def __init__(self, drafter) -> None:
        self.calls: list[tuple] = []
        fn = drafter.extend

        def extend(feats, embeds, pos, valid=None):
            out = fn(feats, embeds, pos, valid)
            if valid is None:  # the decode loop's committed tokens: all valid
                valid = torch.ones(pos.shape, dtype=torch.bool)
            self.calls.append((feats.clone(), embeds.clone(), pos.clone(), valid.clone(), out.clone()))
            return out

        drafter.extend = extend


@pytest.mark.parametrize("use_cfg", [True, False])
def test_drafter_pairing_matches_engine_inference(use_cfg):
    target, drafter = tiny("tiny_llamagen", dtype="float64")
    rec = _Recorder(drafter)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0 if use_cfg else 1.0)
    prompt = "a large red circle left of a small blue square"
    res = generate(target, drafter, Eagle2Policy(2, 3, 8), target.encode_prompt(prompt, use_cfg), sp, None)
    assert len(rec.calls) >= 2

    # what the engine fed the drafter over the whole image (committed slots, in order)
    feats = torch.cat([c[0] for c in rec.calls], dim=1)
    embeds = torch.cat([c[1] for c in rec.calls], dim=1)
    pos = torch.cat([c[2] for c in rec.calls], dim=1)
    valid = torch.cat([c[3] for c in rec.calls], dim=1)
    m = feats.shape[1]

    # what training builds from a teacher-forced pass over the same tokens
    sample = teacher_sample(target, prompt, res.tokens, cfg_rows=use_cfg)
    slots = drafter_slots(sample, target.embed_tokens)
    assert slots.feats.shape[1] >= m  # training covers every slot the engine uses
    torch.testing.assert_close(slots.feats[:, :m], feats, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(slots.embeds[:, :m], embeds, atol=0, rtol=0)
    assert torch.equal(slots.positions[:, :m], pos) and torch.equal(slots.key_valid[:, :m], valid)
    # the regression target of slot s is the next slot's feature
    torch.testing.assert_close(slots.target[:, : m - 1], feats[:, 1:], atol=1e-9, rtol=1e-9)
    P = sample.prompt_len
    # image slots pair f_t with e(x_{t+1}): slot P-1+k holds the embedding of x_k
    tok = torch.tensor(res.tokens)
    k = m - P
    torch.testing.assert_close(
        embeds[:, P - 1 : m], target.embed_tokens(tok[: k + 1])[None].expand(embeds.shape[0], -1, -1)
    )

    # negative control: the unshifted pairing (f_t, x_t) of the reference Lumina/Anole trainers differs
    unshifted = torch.cat([sample.prompt_embeds, target.embed_tokens(tok)[None].expand(embeds.shape[0], -1, -1)], 1)
    assert not torch.allclose(unshifted[:, :m], embeds)

    # the training forward reproduces the outputs the engine got from ``extend`` (last slot of each call)
    batch = collate([slots])
    with torch.no_grad():
        g = drafter_forward(drafter, batch)[0]
    ends = torch.tensor([c[0].shape[1] for c in rec.calls]).cumsum(0) - 1
    for end, call in zip(ends.tolist(), rec.calls):
        torch.testing.assert_close(g[:, end], call[4], atol=1e-9, rtol=1e-9)
