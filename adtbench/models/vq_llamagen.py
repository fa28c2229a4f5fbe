"""LlamaGen VQ-16 image tokenizer (``tokenizer/tokenizer_image/vq_model.py`` of FoundationVision/LlamaGen).

The module tree reproduces the official ``VQModel`` so that ``state_dict()`` keys equal the released
checkpoint's (``vq_ds16_t2i.pt`` / ``vq_ds16_c2i.pt``, weights under ``["model"]``):

* ``encoder.conv_in``, ``encoder.conv_blocks.{i}.res.{j}``, ``encoder.conv_blocks.{i}.attn.{j}``,
  ``encoder.conv_blocks.{i}.downsample.conv``, ``encoder.mid.{0,1,2}``, ``encoder.norm_out``,
  ``encoder.conv_out`` (only with ``with_encoder=True``); ``conv_blocks[0]`` is full resolution; each level has
  ``num_res_blocks`` residual blocks;
* ``decoder.conv_in``, ``decoder.mid.{0,1,2}`` (res, attn, res), ``decoder.conv_blocks.{i}.res.{j}``,
  ``decoder.conv_blocks.{i}.attn.{j}``, ``decoder.conv_blocks.{i}.upsample.conv``, ``decoder.norm_out``,
  ``decoder.conv_out``; ``decoder.conv_blocks[0]`` is the LOWEST resolution (opposite of taming's ``up[0]``),
  each level has ``num_res_blocks + 1`` residual blocks, and only the lowest-resolution level has attention
  (one after every residual block);
* ``quantize.embedding.weight`` ``[codebook_size, codebook_embed_dim]`` and the persistent buffer
  ``quantize.codebook_used`` ``[65536]`` (training-time usage tracker, unused here);
* ``quant_conv`` (``z_channels → d``, 1×1; only with the encoder) and ``post_quant_conv`` (``d → z_channels``).

With ``codebook_l2_norm`` the codebook rows are l2-normalised both for the nearest-code search and for the
lookup at decode time; :meth:`LlamaGenVQModel.codebook` returns the RAW rows (what LANTERN uses).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adtbench.models.vq_common import (
    AttnBlock,
    Downsample,
    ResnetBlock,
    Upsample,
    atomic_torch_save,
    check_codes,
    load_checkpoint,
    load_filtered_state_dict,
    make_norm,
    nearest_codes,
    randomize_parameters,
    swish,
    unwrap_state_dict,
)

__all__ = [
    "LlamaGenVQConfig",
    "LlamaGenVQModel",
    "VQModel",
    "load_llamagen_vq",
    "make_tiny_llamagen_vq",
    "save_llamagen_vq",
    "tiny_llamagen_vq_config",
]

CODEBOOK_USED_LEN = 65536  # length of the official ``quantize.codebook_used`` buffer


@dataclass(frozen=True)
class LlamaGenVQConfig:
    """Hyper-parameters of the LlamaGen VQ model (defaults = ``VQ_16``, factor 16).

    ``ch`` and ``num_res_blocks`` are hard-coded (128, 2) in the official Encoder/Decoder; they are exposed
    here so tiny test instances can shrink them. ``ch * m`` must be a multiple of 32 for every ``m`` in
    ``ch_mult`` (GroupNorm(32)).
    """

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    z_channels: int = 256
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    dropout: float = 0.0
    with_encoder: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "ch_mult", tuple(int(m) for m in self.ch_mult))  # lists from YAML/Hydra
        if not self.ch_mult:
            raise ValueError("ch_mult must be non-empty")
        if self.codebook_size <= 0 or self.codebook_embed_dim <= 0 or self.num_res_blocks <= 0:
            raise ValueError(f"invalid LlamaGenVQConfig: {self}")

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


class _Level(nn.Module):
    """One resolution level: ``res`` blocks, ``attn`` blocks (possibly empty) and an optional resampler."""

    def __init__(self) -> None:
        super().__init__()
        self.res = nn.ModuleList()
        self.attn = nn.ModuleList()

    def run_blocks(self, h: Tensor) -> Tensor:
        has_attn = len(self.attn) > 0
        for i, block in enumerate(self.res):
            h = block(h)
            if has_attn:
                h = self.attn[i](h)
        return h


class LlamaGenEncoder(nn.Module):
    """Images ``[B, 3, H, W]`` → features ``[B, z_channels, H/f, W/f]`` (``f = 2**(len(ch_mult)-1)``)."""

    def __init__(self, cfg: LlamaGenVQConfig, in_channels: int = 3) -> None:
        super().__init__()
        n = len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(in_channels, cfg.ch, kernel_size=3, stride=1, padding=1)
        in_mult = (1, *cfg.ch_mult)
        self.conv_blocks = nn.ModuleList()
        block_in = cfg.ch
        for i in range(n):
            level = _Level()
            block_in = cfg.ch * in_mult[i]
            block_out = cfg.ch * cfg.ch_mult[i]
            for _ in range(cfg.num_res_blocks):
                level.res.append(ResnetBlock(block_in, block_out, cfg.dropout))
                block_in = block_out
                if i == n - 1:  # attention only at the lowest resolution
                    level.attn.append(AttnBlock(block_in))
            if i != n - 1:
                level.downsample = Downsample(block_in)
            self.conv_blocks.append(level)
        self.mid = nn.ModuleList(
            [
                ResnetBlock(block_in, block_in, cfg.dropout),
                AttnBlock(block_in),
                ResnetBlock(block_in, block_in, cfg.dropout),
            ]
        )
        self.norm_out = make_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, cfg.z_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        last = len(self.conv_blocks) - 1
        for i, level in enumerate(self.conv_blocks):
            h = level.run_blocks(h)
            if i != last:
                h = level.downsample(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(swish(self.norm_out(h)))


class LlamaGenDecoder(nn.Module):
    """Latents ``[B, z_channels, h, w]`` → pixels ``[B, 3, h*f, w*f]`` (roughly in ``[-1, 1]``, unclamped)."""

    def __init__(self, cfg: LlamaGenVQConfig, out_channels: int = 3) -> None:
        super().__init__()
        n = len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, kernel_size=3, stride=1, padding=1)
        self.mid = nn.ModuleList(
            [
                ResnetBlock(block_in, block_in, cfg.dropout),
                AttnBlock(block_in),
                ResnetBlock(block_in, block_in, cfg.dropout),
            ]
        )
        # conv_blocks[0] is the lowest resolution (i_level = n-1); the list runs towards full resolution
        self.conv_blocks = nn.ModuleList()
        for i_level in reversed(range(n)):
            level = _Level()
            block_out = cfg.ch * cfg.ch_mult[i_level]
            for _ in range(cfg.num_res_blocks + 1):
                level.res.append(ResnetBlock(block_in, block_out, cfg.dropout))
                block_in = block_out
                if i_level == n - 1:
                    level.attn.append(AttnBlock(block_in))
            if i_level != 0:
                level.upsample = Upsample(block_in)
            self.conv_blocks.append(level)
        self.norm_out = make_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        last = len(self.conv_blocks) - 1
        for i, level in enumerate(self.conv_blocks):
            h = level.run_blocks(h)
            if i != last:
                h = level.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class LlamaGenQuantizer(nn.Module):
    """Codebook ``embedding.weight`` ``[N, d]`` plus the official ``codebook_used`` buffer ``[65536]``."""

    def __init__(self, n_codes: int, dim: int, l2_norm: bool) -> None:
        super().__init__()
        self.l2_norm = l2_norm
        self.embedding = nn.Embedding(n_codes, dim)
        # official init: U(-1/N, 1/N), then row-normalised when l2_norm
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / n_codes, 1.0 / n_codes)
            if l2_norm:
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, p=2, dim=-1))
        self.register_buffer("codebook_used", torch.zeros(CODEBOOK_USED_LEN))

    def effective_codebook(self) -> Tensor:
        """The ``[N, d]`` vectors actually used for search and lookup (l2-normalised when enabled)."""
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w


class LlamaGenVQModel(nn.Module):
    """LlamaGen ``VQModel`` with the official state-dict layout; implements :class:`~.vq_common.VQDecoder`.

    Decoding: ``codes [B, h*w]`` → (normalised) lookup ``[B, h, w, d]`` → NCHW → ``post_quant_conv`` →
    ``decoder`` → ``[B, 3, h*f, w*f]``. Encoding (needs ``with_encoder=True``): ``encoder`` → ``quant_conv``
    → nearest code (cosine/L2 on normalised vectors when ``codebook_l2_norm``).
    """

    def __init__(self, config: LlamaGenVQConfig) -> None:
        super().__init__()
        self.config = config
        if config.with_encoder:
            self.encoder = LlamaGenEncoder(config)
        self.decoder = LlamaGenDecoder(config)
        self.quantize = LlamaGenQuantizer(config.codebook_size, config.codebook_embed_dim, config.codebook_l2_norm)
        if config.with_encoder:
            self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, kernel_size=1)

    # -- VQDecoder protocol -------------------------------------------------------------------------------

    @property
    def downsample_factor(self) -> int:
        """Pixels per code along each side: ``2 ** (len(ch_mult) - 1)`` (16 for VQ-16)."""
        return self.config.downsample_factor

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def embed_dim(self) -> int:
        return self.config.codebook_embed_dim

    def codebook(self) -> Tensor:
        """The raw (un-normalised) codebook ``quantize.embedding.weight``, ``[codebook_size, d]``."""
        return self.quantize.embedding.weight

    def lookup(self, codes: Tensor, h: int, w: int) -> Tensor:
        """``LongTensor[B, h*w]`` → quantised latents ``[B, d, h, w]`` (normalised rows when l2_norm)."""
        check_codes(codes, h, w, self.codebook_size)
        z_q = self.quantize.effective_codebook()[codes.long()]  # [B, h*w, d]
        return z_q.reshape(codes.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()

    def decode_latents(self, z_q: Tensor) -> Tensor:
        """Quantised latents ``[B, d, h, w]`` → pixels ``[B, 3, h*f, w*f]`` (unclamped, ≈ ``[-1, 1]``)."""
        return self.decoder(self.post_quant_conv(z_q))

    @torch.no_grad()
    def decode_codes(self, codes: Tensor, h: int, w: int) -> Tensor:
        """Code grid (row-major ``LongTensor[B, h*w]``) → pixels ``FloatTensor[B, 3, h*f, w*f]``, unclamped."""
        return self.decode_latents(self.lookup(codes.to(self.codebook().device), h, w))

    # -- encoder ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[-1, 1]`` (``H, W`` multiples of ``f``) → codes ``LongTensor[B, h*w]``.

        ``h = H // f`` and ``w = W // f``; codes are row-major so ``decode_codes(codes, h, w)`` inverts the grid.
        """
        if not self.config.with_encoder:
            raise RuntimeError("this LlamaGen VQ model was built without an encoder (with_encoder=False)")
        f = self.downsample_factor
        if images.dim() != 4 or images.shape[2] % f or images.shape[3] % f:
            raise ValueError(f"images must be [B, C, H, W] with H, W multiples of {f}, got {tuple(images.shape)}")
        z = self.quant_conv(self.encoder(images))  # [B, d, h, w]
        if self.config.codebook_l2_norm:
            z = F.normalize(z, p=2, dim=1)
        return nearest_codes(z, self.quantize.effective_codebook())


VQModel = LlamaGenVQModel  # the official class name


# ---------------------------------------------------------------------------------------------------------
# Checkpoint I/O (official layout: ``torch.save({"model": state_dict})``)
# ---------------------------------------------------------------------------------------------------------

_OPTIONAL_KEYS = frozenset({"quantize.codebook_used"})


def load_llamagen_vq(
    path: str | os.PathLike[str], config: LlamaGenVQConfig, device: str | torch.device = "cpu"
) -> LlamaGenVQModel:
    """Load a LlamaGen VQ checkpoint (``{"model": sd}``, ``{"state_dict": sd}``, ``{"module": sd}`` or bare).

    Every ``decoder.*``, ``quantize.embedding.weight`` and ``post_quant_conv.*`` key (plus ``encoder.*`` and
    ``quant_conv.*`` when ``config.with_encoder``) must be present with the configured shape; encoder keys in
    the file are ignored without the encoder, ``quantize.codebook_used`` is optional (zeros if absent).
    Raises ``FileNotFoundError`` / ``ValueError`` naming ``path`` (and the missing keys). Returns the model in
    eval mode on ``device``. Does not touch the global RNG.
    """
    obj = load_checkpoint(path)
    sd = unwrap_state_dict(obj, path, ("model", "state_dict", "module"))
    with torch.random.fork_rng(devices=[]):  # default inits draw from the global CPU RNG; restore it
        model = LlamaGenVQModel(config)
    prefixes: tuple[str, ...] = ("decoder.", "quantize.", "post_quant_conv.")
    if config.with_encoder:
        prefixes += ("encoder.", "quant_conv.")
    load_filtered_state_dict(model, sd, path, prefixes, optional_keys=_OPTIONAL_KEYS)
    return model.to(device).eval()


def save_llamagen_vq(model: LlamaGenVQModel, path: str | os.PathLike[str]) -> Path:
    """Write ``{"model": state_dict}`` (CPU tensors) to ``path`` atomically; the official on-disk layout."""
    sd = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    return atomic_torch_save({"model": sd}, path)


# ---------------------------------------------------------------------------------------------------------
# Tiny random instances (tests)
# ---------------------------------------------------------------------------------------------------------


def tiny_llamagen_vq_config(with_encoder: bool = False) -> LlamaGenVQConfig:
    """ch 32, ch_mult (1, 2) (factor 2), z 32, codebook 64×8 with l2-norm, 1 res block per encoder level."""
    return LlamaGenVQConfig(
        codebook_size=64,
        codebook_embed_dim=8,
        codebook_l2_norm=True,
        z_channels=32,
        ch=32,
        ch_mult=(1, 2),
        num_res_blocks=1,
        dropout=0.0,
        with_encoder=with_encoder,
    )


def make_tiny_llamagen_vq(seed: int, with_encoder: bool = False) -> LlamaGenVQModel:
    """Tiny LlamaGen VQ with parameters drawn from a local generator seeded by ``seed`` (eval mode, CPU).

    Same ``seed`` → identical weights; the global RNG state is neither read nor changed.
    """
    cfg = tiny_llamagen_vq_config(with_encoder)
    with torch.random.fork_rng(devices=[]):  # default inits draw from the global CPU RNG; restore it
        model = LlamaGenVQModel(cfg)
    randomize_parameters(model, seed)
    return model.eval()
