"""Stage ``vq``: train the in-project LlamaGen VQ architecture (small, factor 4) on procedural scenes.

Model: ``LlamaGenVQModel`` with encoder (official key layout), l2-normalised codebook (as VQ-16).
Loss per batch of images ``x ∈ [-1, 1]``:

    z   = normalize(quant_conv(encoder(x)))          # [B, d, h, w], unit vectors when codebook_l2_norm
    q   = nearest codebook row of z (normalised rows)  # straight-through: ẑ = z + sg(q − z)
    L   = |D(ẑ) − x|₁ + |D(ẑ) − x|₂² + ‖sg(z) − q‖² + β ‖z − sg(q)‖²

(no perceptual / GAN terms: there are no pretrained perceptual weights offline, and flat procedural
scenes do not need them). Dead codes — used less than ``restart_below × mean usage`` since the last
restart — are re-seeded every ``restart_every`` steps from encoder outputs of the current batch.

Data: random ``crop × crop`` windows (with horizontal flips) of 64 px and 32 px renders of the first
``data.count`` train-split scenes; the model is fully convolutional, so it encodes 32 px (8×8 codes) and
64 px (16×16 codes) images alike.

Outputs in ``out_dir``: ``model.safetensors`` + ``config.json`` (``LlamaGenVQConfig`` fields),
``train_info.json`` (losses, PSNR, codebook usage, wall time), ``recon.png``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from adtbench.io import atomic_write_json, save_png
from adtbench.models.llamagen.vq import LlamaGenVQConfig, LlamaGenVQModel
from adtbench.models.registry import resolve_device
from adtbench.scenes import to_tensor_range
from adtbench.tools.train.common import (
    export_dir,
    init_from,
    psnr,
    save_safetensors,
    scene_pool,
    stage_dir,
    step_rng,
    train_loop,
)


def vq_forward(model: LlamaGenVQModel, x: torch.Tensor, beta: float) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """Loss, metrics and the codes ``[B, h*w]`` of a batch (see module docstring)."""
    z = model.quant_conv(model.encoder(x))
    if model.config.codebook_l2_norm:
        z = F.normalize(z, p=2, dim=1)
    cb = model.quantize.effective_codebook()
    b, d, h, w = z.shape
    flat = z.permute(0, 2, 3, 1).reshape(-1, d)
    with torch.no_grad():
        codes = torch.cdist(flat, cb).argmin(1)
    q = cb[codes]
    codebook_loss = F.mse_loss(q, flat.detach())
    commit = F.mse_loss(flat, q.detach())
    st = flat + (q - flat).detach()
    rec = model.decode_latents(st.view(b, h, w, d).permute(0, 3, 1, 2))
    rec_loss = F.l1_loss(rec, x) + F.mse_loss(rec, x)
    loss = rec_loss + codebook_loss + beta * commit
    m = {
        k: float(v.detach())
        for k, v in [("loss", loss), ("rec", rec_loss), ("codebook", codebook_loss), ("commit", commit)]
    }
    return loss, m, codes.view(b, h * w)


def build_vq(cfg: DictConfig) -> LlamaGenVQModel:
    arch = LlamaGenVQConfig(**dict(cfg.arch), with_encoder=True)
    torch.manual_seed(int(cfg.seed))
    return LlamaGenVQModel(arch)


def run(cfg: DictConfig) -> dict:
    out = stage_dir(cfg)
    dev = resolve_device(cfg.device, "device")
    d = cfg.data
    cache = Path(str(cfg.cache_dir)) if cfg.get("cache_dir") else None
    pools = [scene_pool(int(d.seed), "train", int(d.count), int(s), cache)[1] for s in d.sizes]
    model = build_vq(cfg)
    init_from(model, cfg)
    model = model.to(dev).train()
    optim = torch.optim.AdamW(
        model.parameters(), lr=float(cfg.lr), betas=(0.9, 0.95), weight_decay=float(cfg.weight_decay)
    )
    n_codes = model.config.codebook_size
    usage = {"counts": torch.zeros(n_codes)}
    crop, bs, seed = int(d.crop), int(cfg.batch_size), int(cfg.seed)

    def batch(step: int) -> torch.Tensor:
        r = step_rng(seed, step)
        imgs = []
        for _ in range(bs):
            pool = pools[int(r.integers(len(pools)))]
            img = pool[int(r.integers(len(pool)))]
            y, x = (int(v) for v in r.integers(0, img.shape[0] - crop + 1, size=2))
            c = img[y : y + crop, x : x + crop]
            imgs.append(c[:, ::-1] if r.random() < 0.5 else c)
        return to_tensor_range(np.ascontiguousarray(np.stack(imgs))).to(dev)

    def step_fn(step: int) -> dict[str, float]:
        x = batch(step)
        loss, m, codes = vq_forward(model, x, float(cfg.beta))
        loss.backward()
        usage["counts"] += torch.bincount(codes.flatten().cpu(), minlength=n_codes).float()
        every = int(cfg.restart_every)
        if every and (step + 1) % every == 0 and step + 1 < int(cfg.steps):
            m["restarted"] = float(restart_dead_codes(model, x, usage["counts"], float(cfg.restart_below)))
            usage["counts"].zero_()
        return m

    res = train_loop(
        cfg,
        out,
        model,
        optim,
        step_fn,
        "vq",
        extra_state=lambda: {"counts": usage["counts"].clone()},
        load_extra=lambda e: usage.update(counts=e["counts"].clone()),
    )
    if not res["complete"]:
        return res  # stopped early (stop_after): resume later
    info = evaluate_and_export(model.eval(), cfg, out, res)
    export_dir(out / "final", cfg.get("export"))
    return info


@torch.no_grad()
def restart_dead_codes(model: LlamaGenVQModel, x: torch.Tensor, counts: torch.Tensor, below: float) -> int:
    """Re-seed codes with usage < ``below × mean`` from this batch's encoder outputs (+ small noise)."""
    dead = (counts < below * counts.mean()).nonzero().flatten()
    if dead.numel() == 0:
        return 0
    z = model.quant_conv(model.encoder(x))
    flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
    if model.config.codebook_l2_norm:
        flat = F.normalize(flat, dim=-1)
    pick = torch.randint(flat.shape[0], (dead.numel(),), device=flat.device)
    w = model.quantize.embedding.weight
    w[dead.to(w.device)] = flat[pick] + 0.01 * torch.randn_like(flat[pick])
    return int(dead.numel())


@torch.no_grad()
def evaluate_and_export(model: LlamaGenVQModel, cfg: DictConfig, out: Path, res: dict) -> dict:
    """Held-out PSNR at 64 and 32 px, codebook usage; writes ``final/`` (weights + config + info)."""

    from adtbench.models.vq_common import to_uint8_images

    cache = Path(str(cfg.cache_dir)) if cfg.get("cache_dir") else None
    dev = next(model.parameters()).device
    stats: dict[str, float] = {}
    grids = []
    used = torch.zeros(model.config.codebook_size, dtype=torch.bool)
    for size in (64, 32):
        _, imgs = scene_pool(int(cfg.data.seed), "heldout", int(cfg.eval_count), size, cache)
        x = to_tensor_range(imgs).to(dev)
        codes = model.encode(x)
        used[codes.flatten().cpu()] = True
        g = size // model.downsample_factor
        rec = model.decode_codes(codes, g, g)
        stats[f"psnr_{size}"] = psnr(rec.cpu(), x.cpu())
        if size == 64:
            k = min(8, len(imgs))
            grids = [imgs[:k], to_uint8_images(rec[:k].float().cpu())]
    stats["codes_used_heldout"] = int(used.sum())
    final = out / "final"
    final.mkdir(exist_ok=True)
    save_safetensors(model.state_dict(), final / "model.safetensors")
    atomic_write_json(final / "config.json", asdict(model.config))
    info = {"stage": "vq", **res, **stats, "config": json.loads(json.dumps(dict(_plain(cfg))))}
    atomic_write_json(final / "train_info.json", info)
    if grids:
        rows = [np.concatenate(list(g), axis=1) for g in grids]
        save_png(np.concatenate(rows, axis=0), out / "recon.png")
    return info


def _plain(cfg: DictConfig) -> dict:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data
