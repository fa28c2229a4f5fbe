"""Stage ``upsampler``: MuLo-SD's learned code resamplers U_r / D_r (``adtbench.models.resample``) for a frozen VQ.

Data: every step draws ``batch_size`` fresh train-split scenes (indices from the step generator; held-out captions
are skipped), renders each at ``data.high`` px (64) and ``data.low`` px (32) and codes both with the frozen VQ:
``c_lo = encode(x_lo)`` (8×8) and ``c_hi = encode(x_hi)`` (16×16); ``r = high / low``.

Loss (the VQ is frozen; only the two small nets learn). With ``E`` the effective codebook, ``n`` the VQ's latent
preparation (l2 normalisation), ``D`` the VQ decoder and ``sg`` stop-gradient:

    z_up = U(E[c_lo])                 ẑ = n(z_up),  q = E[argmin_j ‖ẑ − E_j‖]
    L_up = ‖D(ẑ_in) − x_hi‖² + β ‖ẑ − sg(q)‖² [+ λ LPIPS(D(ẑ_in), x_hi)] [+ w CE(−‖ẑ − E_j‖² / τ, c_hi)]
    L_dn = the same with z_dn = D_r(E[c_hi]) against x_lo (and c_lo)
    L    = L_up + L_dn

``decode_input`` picks ``ẑ_in``: ``straight_through`` (default) ``ẑ + sg(q − ẑ)``, so the decoder sees exactly the
codes inference will emit and the gradient passes to ``ẑ`` unchanged; or ``continuous`` ``ẑ`` itself. The pixel
MSE is the mean over pixels and channels of images in ``[−1, 1]``; it is taken on the first ``pixel_batch`` items of
the batch only (the frozen decoder's forward + backward is most of a step), the latent terms on all of them.
LPIPS only when ``lpips_path`` names a local TorchScript module ``f(x, y) → distance`` on ``[−1, 1]`` images (e.g.
``torch.jit.trace(lpips.LPIPS(net="vgg"), (x, x)).save(path)`` on a machine that has the weights); no downloads.

The token-level term (``code_w`` = w, ``code_tau`` = τ; a softmax over negative squared distances to every codebook
row, target = the VQ's own code of the other resolution) is an addition to the paper's loss. Without it the nets
learn codes that decode to the right pixels but are rarely the codes the VQ itself assigns (this tokenizer codes
one flat colour with many interchangeable codes): after 150 steps the pixel-only U_r agreed with ``encode(64 px)``
on 9–10 % of positions, *below* repeating each code (14 %), while the drafts must match what the target model was
trained on. The shipped weights use w = 0.5, τ = 0.1.

Evaluation (``final/train_info.json``, ``eval_count`` held-out scenes): for ``learned``, ``bicubic`` and
``nearest``, the code agreement of ``U(c_lo)`` with ``c_hi`` and the PSNR of ``D(U(c_lo))`` against the 64 px render
(``heldout_up_agree_*``, ``heldout_up_psnr_*``), the same for ``D_r(c_hi)`` against ``c_lo`` / the 32 px render
(``heldout_down_*``), and the VQ's own ceiling ``psnr_vq_{high,low}`` = PSNR of ``D(encode(x))``.

Shipped weights (``adtbench/weights/mini/upsampler``, 0.58 MB: U_r 88 k and D_r 56 k parameters): ``nice -n 10
adtbench train upsampler threads=1 export='${pkg:weights/mini/upsampler}'`` (the defaults: 1400 steps × 32 scenes,
8 of them with the pixel term), 16.7 min on one thread of our shared 2-core CPU. Held-out (64 scenes):

    up   (vs encode(64 px)):  agreement  learned 0.244  bicubic 0.221  nearest 0.137;  PSNR 16.57 / 16.32 / 15.83 dB
    down (vs encode(32 px)):  agreement  learned 0.474  bicubic 0.296  nearest 0.141;  PSNR 18.04 / 16.93 / 15.50 dB
    VQ ceiling (decode(encode(x))):  17.80 dB at 64 px, 18.31 dB at 32 px

Seeded and resumable like every stage (``common.train_loop``); outputs ``final/model.safetensors`` (keys ``up.*``,
``down.*``), ``final/config.json`` (:class:`~adtbench.models.resample.ResamplerConfig`) and ``train_info.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from adtbench.errors import ConfigError
from adtbench.io import atomic_write_json
from adtbench.models.registry import resolve_device
from adtbench.models.resample import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    BicubicResampler,
    LearnedResampler,
    NearestResampler,
    ResampleNets,
    Resampler,
    ResamplerConfig,
    codebook_checksum,
    effective_codebook,
    quantize_latents,
)
from adtbench.scenes import caption_split, iter_split, render, sample_scene, to_tensor_range
from adtbench.tools.train.common import export_dir, init_from, psnr, save_safetensors, stage_dir, step_rng, train_loop

DECODE_INPUTS = ("straight_through", "continuous")


def save_nets(nets: ResampleNets, out: Path) -> None:
    """``out/model.safetensors`` + ``out/config.json`` (what :func:`~adtbench.models.resample.load_resample_nets`
    reads)."""
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(nets.state_dict(), out / WEIGHTS_FILE)
    atomic_write_json(out / CONFIG_FILE, asdict(nets.cfg))


def _sizes(cfg: DictConfig, factor: int) -> tuple[int, int, int]:
    lo, hi = int(cfg.data.low), int(cfg.data.high)
    if hi % lo or lo % factor or hi <= lo:
        raise ConfigError(
            "data",
            f"need high > low, high a multiple of low and both multiples of the VQ factor "
            f"{factor}; got low={lo} high={hi}",
        )
    return lo, hi, hi // lo


def _load_lpips(cfg: DictConfig, dev: torch.device) -> Any:
    """The TorchScript LPIPS module of ``lpips_path`` (frozen, eval), or None when unset."""
    path = cfg.get("lpips_path")
    if not path:
        return None
    p = Path(str(path))
    if not p.is_file():
        raise ConfigError("lpips_path", f"not a file: {p} (a TorchScript module f(x, y) -> distance; no downloads)")
    try:
        mod = torch.jit.load(str(p), map_location=dev)
    except RuntimeError as e:
        raise ConfigError("lpips_path", f"{p} is not a loadable TorchScript module: {e}") from e
    for prm in mod.parameters():
        prm.requires_grad_(False)
    return mod.eval()


def scene_batch(seed: int, data_seed: int, step: int, n: int, sizes: tuple[int, ...]) -> list[torch.Tensor]:
    """``n`` train-split scenes drawn by step ``step`` rendered at each of ``sizes`` → ``[n, 3, s, s]`` in [−1, 1]."""
    r = step_rng(seed, step)
    scenes = []
    while len(scenes) < n:
        s = sample_scene(data_seed, int(r.integers(10**9)))
        if caption_split(s.caption) == "train":
            scenes.append(s)
    return [to_tensor_range(np.stack([render(s, size) for s in scenes])) for size in sizes]


def run(cfg: DictConfig) -> dict:
    from adtbench.models.mini.target import load_vq

    out = stage_dir(cfg)
    dev = resolve_device(cfg.device, "device")
    if str(cfg.decode_input) not in DECODE_INPUTS:
        raise ConfigError("decode_input", f"choose one of {DECODE_INPUTS}, got {cfg.decode_input!r}")
    vq_path = Path(str(cfg.vq_path))
    if not (vq_path / "model.safetensors").is_file():
        raise ConfigError("vq_path", f"expected {vq_path / 'model.safetensors'} (a VQ with encoder)")
    vq = load_vq(vq_path, dev, key="vq_path")
    vq.requires_grad_(False)
    lo, hi, r = _sizes(cfg, vq.downsample_factor)
    cb = effective_codebook(vq)
    a = cfg.arch
    rcfg = ResamplerConfig(
        r=r,
        num_codes=int(cb.shape[0]),
        embed_dim=int(cb.shape[1]),
        width=int(a.width),
        up_blocks=int(a.up_blocks),
        down_blocks=int(a.down_blocks),
        kernel=int(a.kernel),
        codebook_checksum=codebook_checksum(vq),
    )
    torch.manual_seed(int(cfg.seed))
    nets = ResampleNets(rcfg)
    init_from(nets, cfg)
    nets = nets.to(dev).train()
    optim = torch.optim.AdamW(
        nets.parameters(), lr=float(cfg.lr), betas=(0.9, 0.95), weight_decay=float(cfg.weight_decay)
    )
    lp = _load_lpips(cfg, dev)
    seed, data_seed, bs = int(cfg.seed), int(cfg.data.seed), int(cfg.batch_size)
    beta, lpips_w, st = float(cfg.beta), float(cfg.lpips_w), str(cfg.decode_input) == "straight_through"
    code_w, code_tau = float(cfg.code_w), float(cfg.code_tau)
    pb = min(bs, int(cfg.get("pixel_batch") or bs))
    f = vq.downsample_factor

    def branch(net: torch.nn.Module, codes: torch.Tensor, target_codes: torch.Tensor, x: torch.Tensor) -> tuple:
        """One resampler's loss against the render ``x`` (see module docstring) and its metrics."""
        e = cb.detach()[codes].permute(0, 3, 1, 2)  # [B, d, h, w], frozen rows
        zn, q, out_codes = quantize_latents(vq, net(e))
        z_in = zn + (q - zn).detach() if st else zn
        rec = vq.decode_latents(z_in[:pb])  # the decoder pass dominates the step: only the first pixel_batch items
        mse, commit = F.mse_loss(rec, x[:pb]), F.mse_loss(zn, q)
        loss = mse + beta * commit
        m = {"rec": float(mse.detach()), "commit": float(commit.detach())}
        if code_w > 0:  # token-level CE over negative squared codebook distances, target = the VQ's own codes
            flat = zn.permute(0, 2, 3, 1).reshape(-1, zn.shape[1])
            logits = -(flat.pow(2).sum(1, keepdim=True) + cb.pow(2).sum(1) - 2 * flat @ cb.t()) / code_tau
            ce = F.cross_entropy(logits, target_codes.reshape(-1))
            loss = loss + code_w * ce
            m["code_ce"] = float(ce.detach())
        if lp is not None:
            perc = lp(rec, x[:pb]).mean()
            loss = loss + lpips_w * perc
            m["lpips"] = float(perc.detach())
        m["agree"] = float((out_codes == target_codes).float().mean())
        return loss, m

    def step_fn(step: int) -> dict[str, float]:
        x_lo, x_hi = (t.to(dev) for t in scene_batch(seed, data_seed, step, bs, (lo, hi)))
        with torch.no_grad():
            c_lo = vq.encode(x_lo).view(bs, lo // f, lo // f)
            c_hi = vq.encode(x_hi).view(bs, hi // f, hi // f)
        l_up, m_up = branch(nets.up, c_lo, c_hi, x_hi)
        l_dn, m_dn = branch(nets.down, c_hi, c_lo, x_lo)
        loss = l_up + l_dn
        loss.backward()
        return {
            "loss": float(loss.detach()),
            **{f"up_{k}": v for k, v in m_up.items()},
            **{f"down_{k}": v for k, v in m_dn.items()},
        }

    res = train_loop(cfg, out, nets, optim, step_fn, "upsampler")
    if not res["complete"]:
        return res  # stopped early (stop_after): resume later
    nets.eval()
    stats = evaluate(nets, vq, cfg, lo, hi)
    final = out / "final"
    save_nets(nets, final)
    info = {
        "stage": "upsampler",
        **res,
        **stats,
        "params_up": sum(p.numel() for p in nets.up.parameters()),
        "params_down": sum(p.numel() for p in nets.down.parameters()),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    atomic_write_json(final / "train_info.json", info)
    export_dir(final, cfg.get("export"))
    return info


@torch.no_grad()
def evaluate(nets: ResampleNets, vq: Any, cfg: DictConfig, lo: int, hi: int) -> dict[str, Any]:
    """Held-out code agreement and PSNR of learned / bicubic / nearest, up and down (see module docstring)."""
    dev = effective_codebook(vq).device
    scenes = [s for _, s in iter_split(int(cfg.data.seed), "heldout", int(cfg.eval_count))]
    x_lo = to_tensor_range(np.stack([render(s, lo) for s in scenes])).to(dev)
    x_hi = to_tensor_range(np.stack([render(s, hi) for s in scenes])).to(dev)
    f, n, r = vq.downsample_factor, len(scenes), nets.cfg.r
    gl, gh = lo // f, hi // f
    c_lo, c_hi = vq.encode(x_lo).view(n, gl, gl), vq.encode(x_hi).view(n, gh, gh)
    kinds: dict[str, Resampler] = {
        "learned": LearnedResampler(vq, nets),
        "bicubic": BicubicResampler(vq, r),
        "nearest": NearestResampler(r),
    }
    stats: dict[str, Any] = {
        "heldout_scenes": n,
        "psnr_vq_high": psnr(vq.decode_codes(c_hi.view(n, -1), gh, gh), x_hi),
        "psnr_vq_low": psnr(vq.decode_codes(c_lo.view(n, -1), gl, gl), x_lo),
    }
    for name, rs in kinds.items():
        up = rs.up(c_lo)
        dn = rs.down(c_hi)
        stats[f"heldout_up_agree_{name}"] = float((up == c_hi).float().mean())
        stats[f"heldout_up_psnr_{name}"] = psnr(vq.decode_codes(up.reshape(n, -1), gh, gh), x_hi)
        stats[f"heldout_down_agree_{name}"] = float((dn == c_lo).float().mean())
        stats[f"heldout_down_psnr_{name}"] = psnr(vq.decode_codes(dn.reshape(n, -1), gl, gl), x_lo)
    return json.loads(json.dumps(stats))
