"""MuLo-SD's resamplers between a low-resolution and a high-resolution VQ code grid (mulo_sd.md §A.4).

``U_r`` (``up``) turns the ``h × w`` codes of the low-resolution drafter into ``h·r × w·r`` draft codes of the
target; ``D_r`` (``down``) maps the verified ``H × W`` target codes back to ``H/r × W/r`` drafter context. Both
work on *codes* (VQ indices ``0 … num_codes − 1``, no token offsets) of one shared VQ ``vq`` (the target's):

- ``learned`` (:class:`LearnedResampler`, weights from ``policy.upsampler_path``): latent space. Up:
  ``e = E[c] ∈ R^{d×h×w}`` (frozen, effective codebook rows) → masked **row-causal** conv stack → 1×1 conv to
  ``d·r²`` channels → pixel shuffle ×r → ``z ∈ R^{d×hr×wr}`` (plus the skip ``e`` repeated r×r) → nearest
  codebook row → codes. Row-causal: every conv pads only *above* (never below), so high-res rows
  ``[k·r, (k+1)·r)`` depend only on low-res rows ``≤ k``; hence ``up(c[:k]) == up(c)[:k·r]`` and U_r can run
  incrementally as low-res rows are drafted. Down: pixel-unshuffle ×r of ``E[C]`` → ordinary (centred) conv stack
  → ``d`` channels (plus the skip: the mean of the r×r block's rows) → nearest code. D_r only sees verified
  tokens, so it needs no causality.
- ``bicubic`` (training-free, v2's route): ``VQ-decode → F.interpolate ×r (up: bicubic; down: area, i.e. the
  r×r box mean, which is the anti-aliased down-scale for an integer factor) → clamp to [−1, 1] → VQ-encode``.
  Needs a VQ with an encoder; not row-causal (the VQ decoder/encoder see the whole image).
- ``nearest`` (code level): up repeats each code r×r; down keeps the **top-left** code of each r×r block.
  Invariant: ``down(up(c)) == c``.

Nearest code: ``argmin_j ‖n(z) − E_j‖²`` with ``E`` the effective codebook (l2-normalised rows for LlamaGen
VQ-16 style tokenizers) and ``n`` the tokenizer's own latent preparation (l2 normalisation there), i.e. exactly
what ``vq.encode`` does with encoder latents (:func:`adtbench.models.vq_common.nearest_codes`).

The shipped mini weights live in ``adtbench/weights/mini/upsampler/`` (``model.safetensors`` with ``up.*`` and
``down.*`` keys, ``config.json``), trained by ``adtbench train upsampler`` (``adtbench/tools/train/upsampler.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adtbench.errors import ConfigError
from adtbench.models.vq_common import nearest_codes

__all__ = [
    "KINDS",
    "BicubicResampler",
    "CodeDown",
    "CodeUp",
    "LearnedResampler",
    "NearestResampler",
    "ResampleNets",
    "Resampler",
    "ResamplerConfig",
    "RowCausalConv2d",
    "build_resampler",
    "codebook_checksum",
    "effective_codebook",
    "load_resample_nets",
    "quantize_latents",
]

KINDS = ("learned", "bicubic", "nearest")
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
#: relative tolerance of the codebook checksum check (float32 sums on another device differ in the last bits)
CHECKSUM_RTOL = 1e-4


@runtime_checkable
class Resampler(Protocol):
    """Code-grid resampler by an integer factor ``r``.

    ``up``: ``LongTensor[h, w] → LongTensor[h·r, w·r]``; ``down``: ``LongTensor[H, W] → LongTensor[H//r, W//r]``
    (``H, W`` multiples of ``r``). Values are VQ codes in ``[0, num_codes)``; the result is on the input's device.
    """

    r: int

    def up(self, codes: Tensor) -> Tensor: ...

    def down(self, codes: Tensor) -> Tensor: ...


# ---------------------------------------------------------------------------------------------------------
# VQ helpers (work with any VQModelBase; fall back to the raw codebook for other VQDecoder objects)
# ---------------------------------------------------------------------------------------------------------


def effective_codebook(vq: Any) -> Tensor:
    """The ``[N, d]`` rows the VQ decodes and searches with (``quantize.effective_codebook()``, else ``codebook()``)."""
    q = getattr(vq, "quantize", None)
    fn = getattr(q, "effective_codebook", None)
    return fn() if callable(fn) else vq.codebook()


def _prepare(vq: Any, z: Tensor) -> Tensor:
    """Latents ``[B, d, h, w]`` as the VQ compares them with its codebook (l2-normalised for LlamaGen VQ-16)."""
    fn = getattr(getattr(vq, "quantize", None), "prepare_latents", None)
    return fn(z) if callable(fn) else z


def quantize_latents(vq: Any, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``z [B, d, h, w]`` → (prepared latents ``n(z)``, nearest rows ``q = E[codes]`` as ``[B, d, h, w]``,
    ``codes [B, h, w]``). ``q`` carries no gradient; the straight-through latent is ``n(z) + sg(q − n(z))``."""
    zn = _prepare(vq, z)
    cb = effective_codebook(vq).to(z.dtype)
    with torch.no_grad():
        codes = nearest_codes(zn.detach(), cb)  # [B, h*w]
    b, _, h, w = z.shape
    q = cb[codes].view(b, h, w, -1).permute(0, 3, 1, 2).detach()
    return zn, q, codes.view(b, h, w)


def codebook_checksum(vq: Any) -> float:
    """``Σ_ij E_ij · cos(0.7 · (i·d + j))`` over the effective codebook ``E [N, d]`` in float64: a cheap fingerprint
    of the codebook's values that changes under row permutations and sign flips (unlike ``Σ |E|``)."""
    e = effective_codebook(vq).detach().double().cpu()
    w = torch.cos(0.7 * torch.arange(e.numel(), dtype=torch.float64)).view_as(e)
    return float((e * w).sum())


def _vq_device(vq: Any) -> torch.device:
    return vq.codebook().device


def _embed(vq: Any, codes: Tensor) -> Tensor:
    """``codes [B, h, w]`` → frozen codebook rows ``[B, d, h, w]`` (float32)."""
    cb = effective_codebook(vq).detach().float()
    return cb[codes.long()].permute(0, 3, 1, 2).contiguous()


def _as_batch(codes: Tensor, r: int, name: str, divisible: bool) -> tuple[Tensor, bool]:
    """``[h, w]`` or ``[B, h, w]`` integer codes → ``[B, h, w]`` plus whether a batch dim was added."""
    if codes.dtype.is_floating_point or codes.dtype == torch.bool or codes.dim() not in (2, 3):
        raise ValueError(
            f"{name}: codes must be an integer tensor [h, w] (or [B, h, w]), got {codes.dtype} {tuple(codes.shape)}"
        )
    if divisible and (codes.shape[-2] % r or codes.shape[-1] % r):
        raise ValueError(f"{name}: grid {tuple(codes.shape[-2:])} is not a multiple of r={r}")
    return (codes[None], True) if codes.dim() == 2 else (codes, False)


# ---------------------------------------------------------------------------------------------------------
# Nets
# ---------------------------------------------------------------------------------------------------------


@dataclass
class ResamplerConfig:
    """Shape of the learned nets (``config.json`` next to the weights) and what they were trained against.

    ``num_codes``, ``embed_dim`` (``d``) and ``r`` must match the VQ they run with; ``codebook_checksum``
    (:func:`codebook_checksum`, ``None`` = unchecked) guards against a different codebook of the same shape.
    """

    r: int = 2
    num_codes: int = 512
    embed_dim: int = 8
    width: int = 48
    up_blocks: int = 2
    down_blocks: int = 1
    kernel: int = 3
    codebook_checksum: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResamplerConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class RowCausalConv2d(nn.Conv2d):
    """``k × k`` convolution whose output row ``i`` sees input rows ``i − k + 1 … i`` only.

    Implemented by zero padding ``k − 1`` rows **above** and none below (columns: ``k // 2`` on both sides), then
    a valid convolution: ``[B, C, h, w] → [B, C', h, w]``. A stack of these is row-causal as a whole.
    """

    def __init__(self, in_ch: int, out_ch: int, k: int) -> None:
        super().__init__(in_ch, out_ch, kernel_size=k, padding=0)
        self.pad = (k // 2, k // 2, k - 1, 0)  # left, right, top, bottom

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, self.pad))


class _ResBlock(nn.Module):
    """``x + conv2(silu(conv1(silu(x))))`` without normalisation (no statistics over rows: keeps causality and makes
    the output at a position independent of the grid size)."""

    def __init__(self, ch: int, k: int, causal: bool) -> None:
        super().__init__()
        self.conv1: nn.Conv2d = RowCausalConv2d(ch, ch, k) if causal else nn.Conv2d(ch, ch, k, padding=k // 2)
        self.conv2: nn.Conv2d = RowCausalConv2d(ch, ch, k) if causal else nn.Conv2d(ch, ch, k, padding=k // 2)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(F.silu(self.conv1(F.silu(x))))


class CodeUp(nn.Module):
    """Up-sampler net on latents: ``e [B, d, h, w] → z [B, d, h·r, w·r]``, row-causal (see module docstring).

    ``z = PixelShuffle_r(head(blocks(stem(e)))) + repeat_r(e)``; ``head`` starts at zero, so an untrained net is
    the code-level ``nearest`` up-sampler.
    """

    def __init__(self, cfg: ResamplerConfig) -> None:
        super().__init__()
        self.r = cfg.r
        self.stem = RowCausalConv2d(cfg.embed_dim, cfg.width, cfg.kernel)
        self.blocks = nn.Sequential(*(_ResBlock(cfg.width, cfg.kernel, causal=True) for _ in range(cfg.up_blocks)))
        self.head = nn.Conv2d(cfg.width, cfg.embed_dim * cfg.r**2, kernel_size=1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, e: Tensor) -> Tensor:
        h = self.head(F.silu(self.blocks(self.stem(e))))
        skip = e.repeat_interleave(self.r, dim=2).repeat_interleave(self.r, dim=3)
        return F.pixel_shuffle(h, self.r) + skip


class CodeDown(nn.Module):
    """Down-sampler net on latents: ``E [B, d, H, W] → z [B, d, H/r, W/r]`` (not causal; D_r sees verified codes).

    ``z = head(blocks(stem(PixelUnshuffle_r(E)))) + avgpool_r(E)``; ``head`` starts at zero.
    """

    def __init__(self, cfg: ResamplerConfig) -> None:
        super().__init__()
        self.r = cfg.r
        k = cfg.kernel
        self.stem = nn.Conv2d(cfg.embed_dim * cfg.r**2, cfg.width, k, padding=k // 2)
        self.blocks = nn.Sequential(*(_ResBlock(cfg.width, k, causal=False) for _ in range(cfg.down_blocks)))
        self.head = nn.Conv2d(cfg.width, cfg.embed_dim, kernel_size=1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, e: Tensor) -> Tensor:
        h = self.head(F.silu(self.blocks(self.stem(F.pixel_unshuffle(e, self.r)))))
        return h + F.avg_pool2d(e, self.r)


class ResampleNets(nn.Module):
    """Both nets in one module (one checkpoint / safetensors file: keys ``up.*`` and ``down.*``)."""

    def __init__(self, cfg: ResamplerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.up = CodeUp(cfg)
        self.down = CodeDown(cfg)


def load_resample_nets(path: str | os.PathLike[str], vq: Any, key: str = "policy.upsampler_path") -> ResampleNets:
    """``path/{model.safetensors, config.json}`` → :class:`ResampleNets` (eval, on the VQ's device), after checking
    the config against ``vq``. ``ConfigError(key, …)`` when files are missing/corrupt or do not match."""
    from adtbench.io import load_weights

    p = Path(path)
    for f in (CONFIG_FILE, WEIGHTS_FILE):
        if not (p / f).is_file():
            raise ConfigError(
                key, f"expected {p / f} (learned resampler weights; train with `adtbench train upsampler`)"
            )
    try:
        cfg = ResamplerConfig.from_dict(json.loads((p / CONFIG_FILE).read_text()))
    except (ValueError, TypeError) as e:
        raise ConfigError(key, f"{p / CONFIG_FILE}: unreadable config ({e})") from e
    cb = effective_codebook(vq)
    n, d = int(cb.shape[0]), int(cb.shape[1])
    if (cfg.num_codes, cfg.embed_dim) != (n, d):
        raise ConfigError(
            key, f"{p}: trained for a codebook of {cfg.num_codes} × {cfg.embed_dim}, but the VQ's is {n} × {d}"
        )
    if cfg.codebook_checksum is not None:
        got = codebook_checksum(vq)
        if abs(got - cfg.codebook_checksum) > CHECKSUM_RTOL * max(1.0, abs(cfg.codebook_checksum)):
            raise ConfigError(
                key, f"{p}: trained with a different codebook (checksum {cfg.codebook_checksum:.6g} ≠ {got:.6g})"
            )
    with torch.random.fork_rng(devices=[]):  # default inits draw from the global RNG: leave it untouched
        nets = ResampleNets(cfg)
    try:
        nets.load_state_dict(load_weights(key, p / WEIGHTS_FILE))
    except RuntimeError as e:  # key / shape mismatch against config.json
        raise ConfigError(key, f"{p / WEIGHTS_FILE} does not match {p / CONFIG_FILE}: {e}") from e
    return nets.to(_vq_device(vq)).eval()


# ---------------------------------------------------------------------------------------------------------
# Resamplers
# ---------------------------------------------------------------------------------------------------------


class NearestResampler:
    """Code-level: ``up`` repeats each code r×r; ``down`` keeps the top-left code of each r×r block.

    ``down(up(c)) == c`` for every grid ``c``. Batched ``[B, h, w]`` input is accepted too.
    """

    def __init__(self, r: int) -> None:
        self.r = r

    def up(self, codes: Tensor) -> Tensor:
        c, added = _as_batch(codes, self.r, "nearest up", divisible=False)
        out = c.repeat_interleave(self.r, dim=1).repeat_interleave(self.r, dim=2)
        return out[0] if added else out

    def down(self, codes: Tensor) -> Tensor:
        c, added = _as_batch(codes, self.r, "nearest down", divisible=True)
        out = c[:, :: self.r, :: self.r].contiguous()
        return out[0] if added else out


class BicubicResampler:
    """Pixel space, training-free: decode → ``F.interpolate`` (up: bicubic ×r; down: area ÷r) → clamp → encode."""

    def __init__(self, vq: Any, r: int) -> None:
        self.vq = vq
        self.r = r

    @torch.no_grad()
    def _route(self, codes: Tensor, name: str, scale: float, mode: str, divisible: bool) -> Tensor:
        c, added = _as_batch(codes, self.r, name, divisible)
        b, h, w = c.shape
        dev = _vq_device(self.vq)
        x = self.vq.decode_codes(c.reshape(b, h * w).to(dev), h, w).float()
        if mode == "bicubic":
            y = F.interpolate(x, scale_factor=scale, mode="bicubic", align_corners=False)
        else:
            y = F.interpolate(x, scale_factor=scale, mode="area")
        out_codes = self.vq.encode(y.clamp(-1.0, 1.0))
        hh, ww = round(h * scale), round(w * scale)
        out = out_codes.view(b, hh, ww).to(codes.device)
        return out[0] if added else out

    def up(self, codes: Tensor) -> Tensor:
        return self._route(codes, "bicubic up", float(self.r), "bicubic", divisible=False)

    def down(self, codes: Tensor) -> Tensor:
        return self._route(codes, "bicubic down", 1.0 / self.r, "area", divisible=True)


class LearnedResampler:
    """Latent space (MuLo-SD's learned U_r / D_r): codes → frozen rows → :class:`CodeUp` / :class:`CodeDown` →
    nearest code. ``up`` is row-causal: ``up(c[:k]) == up(c)[:k·r]``."""

    def __init__(self, vq: Any, nets: ResampleNets) -> None:
        self.vq = vq
        self.nets = nets
        self.r = nets.cfg.r

    @torch.no_grad()
    def _apply(self, net: nn.Module, codes: Tensor, name: str, divisible: bool) -> Tensor:
        c, added = _as_batch(codes, self.r, name, divisible)
        z = net(_embed(self.vq, c.to(_vq_device(self.vq))))
        out = quantize_latents(self.vq, z)[2].to(codes.device)
        return out[0] if added else out

    def up(self, codes: Tensor) -> Tensor:
        return self._apply(self.nets.up, codes, "learned up", divisible=False)

    def down(self, codes: Tensor) -> Tensor:
        return self._apply(self.nets.down, codes, "learned down", divisible=True)


class _Composite:
    """``up`` from one resampler and ``down`` from another (both with the same ``r``)."""

    def __init__(self, up: Resampler, down: Resampler, r: int) -> None:
        self._up, self._down, self.r = up, down, r

    def up(self, codes: Tensor) -> Tensor:
        return self._up.up(codes)

    def down(self, codes: Tensor) -> Tensor:
        return self._down.down(codes)


def build_resampler(up: str, down: str, vq: Any, r: int, path: str | os.PathLike[str] | None) -> Resampler:
    """The resampler for ``policy.upsampler=up`` / ``policy.downsampler=down`` (each of :data:`KINDS`) at factor ``r``.

    ``vq`` is the target's VQ (``target.vq``); ``path`` the learned weights' directory (``policy.upsampler_path``,
    needed when either kind is ``learned``). Raises ``ConfigError`` naming ``policy.upsampler`` /
    ``policy.downsampler`` for an unknown kind (or ``bicubic`` without a VQ encoder), ``policy.upsampler_path``
    when the weights are missing or trained for another codebook size, latent dim, codebook or ``r``.
    """
    for key, kind in (("policy.upsampler", up), ("policy.downsampler", down)):
        if kind not in KINDS:
            raise ConfigError(key, f"unknown resampler {kind!r}; choose one of {', '.join(KINDS)}")
        if kind == "bicubic" and (
            not callable(getattr(vq, "encode", None)) or not getattr(getattr(vq, "config", None), "with_encoder", True)
        ):
            raise ConfigError(key, "bicubic re-encodes pixels and needs a VQ with an encoder; use learned or nearest")
    if int(r) < 1:
        raise ValueError(f"resampling factor r must be a positive integer, got {r}")
    r = int(r)
    parts: dict[str, Resampler] = {"nearest": NearestResampler(r)}
    if "bicubic" in (up, down):
        parts["bicubic"] = BicubicResampler(vq, r)
    if "learned" in (up, down):
        if path is None or str(path) in ("", "None", "null"):
            raise ConfigError("policy.upsampler_path", "the learned resampler needs its weights directory")
        nets = load_resample_nets(path, vq)
        if nets.cfg.r != r:
            raise ConfigError("policy.upsampler_path", f"{path}: trained for r={nets.cfg.r}, but r={r} is configured")
        parts["learned"] = LearnedResampler(vq, nets)
    if up == down:
        return parts[up]
    return _Composite(parts[up], parts[down], r)
