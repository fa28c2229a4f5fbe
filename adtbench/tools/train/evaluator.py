"""Stage ``evaluator``: train the mini evaluator (``adtbench.models.mini.evaluator``) on scene ground truth.

Each step renders ``batch_size`` fresh train-split scenes at ``arch.image_size`` px (scene ``i`` of stream
``data.seed``, indices drawn from the step generator; held-out captions are skipped), applies light augmentation
(Gaussian noise, box blur, brightness/contrast jitter — robustness to VQ decoding) and minimises the
sum over attributes of the cross-entropy with the canonical attributes (``scenes.attributes``); the
two-object attributes (``axis``, ``b_*``) are masked out for one-object scenes.

Evaluation (``final/train_info.json``): per-attribute accuracy and mean caption agreement on
``eval_count`` held-out scenes, the agreement with shuffled captions (negative control), and — when
``vq_path`` holds a tokenizer — the agreement on its 64 px reconstructions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from adtbench.io import atomic_write_json
from adtbench.models.mini.evaluator import EvaluatorConfig, MiniEvaluator, config_dict
from adtbench.models.registry import resolve_device
from adtbench.resources import PACKAGE_DIR
from adtbench.scenes import ATTRIBUTES, attributes, caption_split, iter_split, render, sample_scene, to_tensor_range
from adtbench.tools.train.common import (
    attribute_targets,
    export_dir,
    init_from,
    save_safetensors,
    stage_dir,
    step_rng,
    train_loop,
)

TWO_OBJECT = ("axis", "b_size", "b_color", "b_shape")


def targets(scenes: list) -> dict[str, torch.Tensor]:
    """Class index per attribute ``[B]`` (−100 = not applicable: ignored by the loss)."""
    return attribute_targets([attributes(s) for s in scenes])


def augment(x: torch.Tensor) -> torch.Tensor:
    """Noise, blur and photometric jitter (global RNG: reseeded per step by the loop)."""
    b = x.shape[0]
    blur = torch.rand(b, 1, 1, 1) < 0.3
    x = torch.where(blur, F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), x)
    gain = 1 + 0.1 * (torch.rand(b, 1, 1, 1) - 0.5)
    bias = 0.1 * (torch.rand(b, 1, 1, 1) - 0.5)
    x = x * gain + bias
    x = x + torch.randn_like(x) * torch.rand(b, 1, 1, 1) * 0.1
    return x.clamp(-1, 1)


def run(cfg: DictConfig) -> dict:
    out = stage_dir(cfg)
    dev = resolve_device(cfg.device, "device")
    a = cfg.arch
    ecfg = EvaluatorConfig(
        image_size=int(a.image_size),
        width=int(a.width),
        feature_dim=int(a.feature_dim),
        stem_stride=int(a.get("stem_stride", 1)),
    )
    torch.manual_seed(int(cfg.seed))
    model = MiniEvaluator(ecfg)
    init_from(model, cfg)
    model = model.to(dev).train()
    optim = torch.optim.AdamW(model.parameters(), lr=float(cfg.lr), weight_decay=float(cfg.weight_decay))
    seed, data_seed, bs = int(cfg.seed), int(cfg.data.seed), int(cfg.batch_size)

    def step_fn(step: int) -> dict[str, float]:
        r = step_rng(seed, step)
        scenes = []
        while len(scenes) < bs:
            s = sample_scene(data_seed, int(r.integers(10**9)))
            if caption_split(s.caption) == "train":
                scenes.append(s)
        x = augment(to_tensor_range(np.stack([render(s, ecfg.image_size) for s in scenes]))).to(dev)
        _, logits = model(x)
        tg = targets(scenes)
        losses = {k: F.cross_entropy(logits[k], tg[k].to(dev), ignore_index=-100) for k in logits}
        loss = sum(v for k, v in losses.items() if (tg[k] != -100).any())
        loss.backward()
        acc = np.mean([(logits[k].argmax(-1).cpu() == tg[k])[tg[k] != -100].float().mean().item() for k in logits])
        return {"loss": float(loss.detach()), "acc": float(acc)}

    res = train_loop(cfg, out, model, optim, step_fn, "evaluator")
    if not res["complete"]:
        return res  # stopped early (stop_after): resume later
    model.eval()
    stats = evaluate(model, cfg)
    final = out / "final"
    save_safetensors(model.state_dict(), final / "model.safetensors")
    atomic_write_json(final / "config.json", config_dict(ecfg))
    info = {"stage": "evaluator", **res, **stats, "config": OmegaConf.to_container(cfg, resolve=True)}
    atomic_write_json(final / "train_info.json", info)
    export_dir(final, cfg.get("export"))
    return info


@torch.no_grad()
def evaluate(model: MiniEvaluator, cfg: DictConfig) -> dict:
    """Held-out accuracy per attribute, caption agreement (true / shuffled captions / VQ reconstructions)."""
    scenes = [s for _, s in iter_split(int(cfg.data.seed), "heldout", int(cfg.eval_count))]
    captions = [s.caption for s in scenes]
    imgs64 = np.stack([render(s, 64) for s in scenes])
    preds = model.predict(imgs64)
    acc = {}
    for k in ATTRIBUTES:
        pairs = [(p[k], attributes(s).get(k)) for p, s in zip(preds, scenes) if k in attributes(s)]
        acc[k] = float(np.mean([a == b for a, b in pairs])) if pairs else None
    agree = model.score(imgs64, captions)
    shuffled = model.score(imgs64, captions[1:] + captions[:1])
    stats: dict = {
        "heldout_scenes": len(scenes),
        "attribute_accuracy": acc,
        "agreement_true": float(np.mean(agree)),
        "agreement_shuffled": float(np.mean(shuffled)),
    }
    vq_path = cfg.get("vq_path")
    if vq_path and (Path(str(vq_path)) / "model.safetensors").exists():
        from adtbench.models.mini.target import load_vq

        vq = load_vq(str(vq_path))
        x = to_tensor_range(imgs64)
        codes = vq.encode(x)
        g = 64 // vq.downsample_factor
        from adtbench.models.vq_common import to_uint8_images

        rec = to_uint8_images(vq.decode_codes(codes, g, g).float())
        stats["agreement_vq_recon"] = float(np.mean(model.score(rec, captions)))
    return stats


def rescore(weights: Path, vq_path: Path) -> dict:
    """Re-measure a trained evaluator's held-out statistics (:func:`evaluate`) against the tokenizer at ``vq_path``
    — after the tokenizer changed, its ``agreement_vq_recon`` is stale — and merge them into
    ``weights/train_info.json`` (training fields kept; ``rescored_vq`` names the tokenizer — ``${pkg:weights/…}``
    for a shipped one — and its weights hash)."""
    import hashlib

    from adtbench.models.mini.evaluator import load_mini_evaluator

    info_path = weights / "train_info.json"
    info = json.loads(info_path.read_text())
    cfg = OmegaConf.create(info["config"])
    cfg.vq_path = str(vq_path)
    stats = evaluate(load_mini_evaluator(str(weights)).eval(), cfg)
    info.update(stats)
    digest = hashlib.sha256((vq_path / "model.safetensors").read_bytes()).hexdigest()[:12]
    resolved = vq_path.resolve()  # a shipped VQ is named ${pkg:…} (the config resolver's form), no machine path
    name = f"${{pkg:{resolved.relative_to(PACKAGE_DIR)}}}" if resolved.is_relative_to(PACKAGE_DIR) else str(vq_path)
    info["rescored_vq"] = {"path": name, "sha256": digest}
    atomic_write_json(info_path, info)
    return stats
