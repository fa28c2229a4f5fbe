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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adtbench.io import atomic_torch_save, load_checkpoint
from adtbench.models.vq_common import (
    AttnBlock,
    Codebook,
    ResnetBlock,
    VQModelBase,
    build_down_levels,
    build_up_levels,
    make_norm,
    run_levels,
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
    encoder: str = "global"  # global (official: GroupNorm, zero padding, attention) | local (no image-wide path)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ch_mult", tuple(int(m) for m in self.ch_mult))  # lists from YAML/Hydra
        if not self.ch_mult:
            raise ValueError("ch_mult must be non-empty")
        if self.codebook_size <= 0 or self.codebook_embed_dim <= 0 or self.num_res_blocks <= 0:
            raise ValueError(f"invalid LlamaGenVQConfig: {self}")
        if self.encoder not in ("global", "local"):
            raise ValueError(f"encoder must be global or local, got {self.encoder!r}")

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


def _attn_at_lowest(n: int) -> Callable[[int], bool]:
    """LlamaGen places level attention only at the lowest resolution (level ``n - 1``)."""
    return lambda i: i == n - 1


class LlamaGenEncoder(nn.Module):
    """Images ``[B, 3, H, W]`` → features ``[B, z_channels, H/f, W/f]`` (``f = 2**(len(ch_mult)-1)``).

    ``encoder: local`` (not in the official model; the mini-model diagnosis): no attention (``mid`` = res, res),
    ``PixelNorm`` instead of GroupNorm and replicate padding, so a code depends only on its receptive field and
    never on where it sits: a flat image encodes to one code everywhere, whatever the weights (tested).
    """

    def __init__(self, cfg: LlamaGenVQConfig, in_channels: int = 3) -> None:
        super().__init__()
        n, local = len(cfg.ch_mult), cfg.encoder == "local"
        pad = "replicate" if local else "zeros"
        self.conv_in = nn.Conv2d(in_channels, cfg.ch, kernel_size=3, stride=1, padding=1, padding_mode=pad)
        levels, block_in = build_down_levels(
            cfg.ch, cfg.ch_mult, cfg.num_res_blocks, cfg.dropout, _attn_at_lowest(n), "res", local
        )
        self.conv_blocks = nn.ModuleList(levels)
        self.mid = (
            nn.ModuleList([ResnetBlock(block_in, block_in, cfg.dropout, True) for _ in range(2)])
            if local
            else _mid(block_in, cfg.dropout)
        )
        self.norm_out = make_norm(block_in, local)
        self.conv_out = nn.Conv2d(block_in, cfg.z_channels, kernel_size=3, stride=1, padding=1, padding_mode=pad)

    def forward(self, x: Tensor) -> Tensor:
        h = run_levels(self.conv_in(x), self.conv_blocks, "downsample")
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
        self.mid = _mid(block_in, cfg.dropout)
        # conv_blocks[0] is the lowest resolution (i_level = n-1); the list runs towards full resolution
        levels, block_in = build_up_levels(
            cfg.ch, cfg.ch_mult, cfg.num_res_blocks, cfg.dropout, block_in, _attn_at_lowest(n), "res"
        )
        self.conv_blocks = nn.ModuleList(levels)
        self.norm_out = make_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        return self.conv_out(swish(self.norm_out(run_levels(h, self.conv_blocks, "upsample"))))


def _mid(channels: int, dropout: float) -> nn.ModuleList:
    """``mid.{0,1,2}``: res, attn, res at ``channels``."""
    return nn.ModuleList(
        [ResnetBlock(channels, channels, dropout), AttnBlock(channels), ResnetBlock(channels, channels, dropout)]
    )


class LlamaGenQuantizer(Codebook):
    """Codebook ``embedding.weight`` ``[N, d]`` plus the official ``codebook_used`` buffer ``[65536]``.

    With ``l2_norm`` the rows are normalised at init and for search and lookup, and so are the encoder latents.
    """

    def __init__(self, n_codes: int, dim: int, l2_norm: bool) -> None:
        super().__init__(n_codes, dim)  # official init: U(-1/N, 1/N), then row-normalised when l2_norm
        self.l2_norm = l2_norm
        if l2_norm:
            with torch.no_grad():
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, p=2, dim=-1))
        self.register_buffer("codebook_used", torch.zeros(CODEBOOK_USED_LEN))

    def effective_codebook(self) -> Tensor:
        """The ``[N, d]`` vectors actually used for search and lookup (l2-normalised when enabled)."""
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def prepare_latents(self, z: Tensor) -> Tensor:
        return F.normalize(z, p=2, dim=1) if self.l2_norm else z


class LlamaGenVQModel(VQModelBase):
    """LlamaGen ``VQModel`` with the official state-dict layout; implements :class:`~.vq_common.VQDecoder`.

    Decoding: ``codes [B, h*w]`` → (normalised) lookup ``[B, h, w, d]`` → NCHW → ``post_quant_conv`` →
    ``decoder`` → ``[B, 3, h*f, w*f]``. Encoding (needs ``with_encoder=True``): ``encoder`` → ``quant_conv``
    → nearest code (cosine/L2 on normalised vectors when ``codebook_l2_norm``). :meth:`codebook` returns the RAW
    (un-normalised) rows.
    """

    config: LlamaGenVQConfig
    quantize: LlamaGenQuantizer
    no_encoder_message = "this LlamaGen VQ model was built without an encoder (with_encoder=False)"

    def _make_encoder(self) -> nn.Module:
        return LlamaGenEncoder(self.config)

    def _make_decoder(self) -> nn.Module:
        return LlamaGenDecoder(self.config)

    def _make_quantizer(self) -> LlamaGenQuantizer:
        c = self.config
        return LlamaGenQuantizer(c.codebook_size, c.codebook_embed_dim, c.codebook_l2_norm)

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def embed_dim(self) -> int:
        return self.config.codebook_embed_dim


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
    sd = unwrap_state_dict(load_checkpoint(path), path, ("model", "state_dict", "module"))
    prefixes = ("decoder.", "quantize.", "post_quant_conv.")
    return LlamaGenVQModel.from_state_dict(config, sd, path, prefixes, device, _OPTIONAL_KEYS)


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
    return LlamaGenVQModel.tiny_random(tiny_llamagen_vq_config(with_encoder), seed)
