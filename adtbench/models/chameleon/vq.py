"""Chameleon VQGAN = taming-transformers ``VQModel`` (``taming/models/vqgan.py`` +
``taming/modules/diffusionmodules/model.py``; Chameleon's inference copy is ``chameleon/inference/vqgan.py``).

Files: ``tokenizer/vqgan.ckpt`` (Lightning checkpoint, weights under ``["state_dict"]`` with no prefix, may
also hold ``loss.*`` discriminator/LPIPS weights) and ``tokenizer/vqgan.yaml``
(``model.params.{embed_dim, n_embed, ddconfig}``). The module tree reproduces the official key names:

* ``decoder.conv_in``, ``decoder.mid.{block_1,attn_1,block_2}``, ``decoder.up.{i}.block.{j}``,
  ``decoder.up.{i}.attn.{j}``, ``decoder.up.{i}.upsample.conv``, ``decoder.norm_out``, ``decoder.conv_out``;
  ``up[0]`` is FULL resolution (the forward pass runs ``i = n-1 … 0``), each level has ``num_res_blocks + 1``
  residual blocks, attention after every block of a level whose resolution is in ``attn_resolutions``
  (Chameleon: none, so only ``mid.attn_1``), no upsampler on level 0;
* ``encoder.conv_in``, ``encoder.down.{i}.block.{j}``, ``encoder.down.{i}.attn.{j}``,
  ``encoder.down.{i}.downsample.conv``, ``encoder.mid.*``, ``encoder.norm_out``, ``encoder.conv_out``
  (optional, ``num_res_blocks`` blocks per level);
* ``quantize.embedding.weight`` ``[n_embed, embed_dim]`` (VectorQuantizer2, NO l2 normalisation),
  ``quant_conv`` (``z_channels → embed_dim``, with the encoder) and ``post_quant_conv`` (``embed_dim → z_channels``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn

from adtbench.io import atomic_torch_save, atomic_write_text, load_checkpoint
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
    "TamingVQConfig",
    "TamingVQModel",
    "VQModel",
    "load_taming_vqgan",
    "make_tiny_taming_vq",
    "save_taming_vqgan",
    "tiny_taming_vq_config",
]

_DDCONFIG_KEYS = (
    "double_z",
    "z_channels",
    "resolution",
    "in_channels",
    "out_ch",
    "ch",
    "ch_mult",
    "num_res_blocks",
    "attn_resolutions",
    "dropout",
)


@dataclass(frozen=True)
class TamingVQConfig:
    """``model.params`` of ``vqgan.yaml`` flattened (defaults = Chameleon: 8192×256 codebook, factor 16).

    ``resolution`` only matters for where ``attn_resolutions`` places attention. ``with_encoder`` is ours
    (not in the YAML): build ``encoder`` + ``quant_conv`` too.
    """

    embed_dim: int = 256
    n_embed: int = 8192
    z_channels: int = 256
    resolution: int = 512
    in_channels: int = 3
    out_ch: int = 3
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = ()
    dropout: float = 0.0
    double_z: bool = False
    with_encoder: bool = False

    def __post_init__(self) -> None:
        # YAML/Hydra give lists; keep hashable tuples
        object.__setattr__(self, "ch_mult", tuple(int(m) for m in self.ch_mult))
        object.__setattr__(self, "attn_resolutions", tuple(int(r) for r in self.attn_resolutions))
        if not self.ch_mult:
            raise ValueError("ch_mult must be non-empty")
        if self.with_encoder and self.double_z:
            raise ValueError("double_z=True gives a 2*z_channels encoder output, which a VQ model cannot quantise")

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], with_encoder: bool = False, source: str = "params"
    ) -> TamingVQConfig:
        """Build from ``model.params`` (``embed_dim``, ``n_embed``, ``ddconfig``); extra keys are ignored."""
        try:
            dd = params["ddconfig"]
            kwargs: dict[str, Any] = {
                "embed_dim": int(params["embed_dim"]),
                "n_embed": int(params["n_embed"]),
            }
            for k in _DDCONFIG_KEYS:
                if k in dd:
                    kwargs[k] = dd[k]
            for k in ("z_channels", "ch", "ch_mult", "num_res_blocks"):
                if k not in dd:
                    raise KeyError(f"ddconfig.{k}")
        except (KeyError, TypeError) as e:
            raise ValueError(f"{source}: missing VQGAN config entry {e}") from None
        return cls(**kwargs, with_encoder=with_encoder)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], with_encoder: bool = False) -> TamingVQConfig:
        """Parse a taming ``vqgan.yaml`` (``model.params``) with PyYAML's safe loader."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"VQGAN config not found: {p}")
        with p.open() as f:
            doc = yaml.safe_load(f)
        if not isinstance(doc, Mapping) or not isinstance(doc.get("model"), Mapping):
            raise ValueError(f"{p}: expected a top-level 'model' mapping")
        params = doc["model"].get("params")
        if not isinstance(params, Mapping):
            raise ValueError(f"{p}: expected 'model.params' to be a mapping")
        return cls.from_params(params, with_encoder=with_encoder, source=str(p))

    def to_yaml_dict(self) -> dict[str, Any]:
        """The ``vqgan.yaml`` document (``model.target`` / ``model.params``) for this config."""
        dd = {k: getattr(self, k) for k in _DDCONFIG_KEYS}
        dd["ch_mult"] = list(self.ch_mult)
        dd["attn_resolutions"] = list(self.attn_resolutions)
        return {
            "model": {
                "target": "taming.models.vqgan.VQModel",
                "params": {"embed_dim": self.embed_dim, "n_embed": self.n_embed, "ddconfig": dd},
            }
        }


class _Mid(nn.Module):
    """``block_1`` (res) → ``attn_1`` → ``block_2`` (res), all at ``channels``."""

    def __init__(self, channels: int, dropout: float) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, dropout)
        self.attn_1 = AttnBlock(channels)
        self.block_2 = ResnetBlock(channels, channels, dropout)

    def forward(self, h: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(h)))


class TamingEncoder(nn.Module):
    """Images ``[B, in_channels, H, W]`` → ``[B, z_channels, H/f, W/f]``."""

    def __init__(self, cfg: TamingVQConfig) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, kernel_size=3, stride=1, padding=1)
        # level i runs at resolution // 2**i
        levels, block_in = build_down_levels(
            cfg.ch,
            cfg.ch_mult,
            cfg.num_res_blocks,
            cfg.dropout,
            lambda i: cfg.resolution // 2**i in cfg.attn_resolutions,
            "block",
        )
        self.down = nn.ModuleList(levels)
        self.mid = _Mid(block_in, cfg.dropout)
        self.norm_out = make_norm(block_in)
        out = 2 * cfg.z_channels if cfg.double_z else cfg.z_channels
        self.conv_out = nn.Conv2d(block_in, out, kernel_size=3, stride=1, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.mid(run_levels(self.conv_in(x), self.down, "downsample"))
        return self.conv_out(swish(self.norm_out(h)))


class TamingDecoder(nn.Module):
    """Latents ``[B, z_channels, h, w]`` → pixels ``[B, out_ch, h*f, w*f]`` (≈ ``[-1, 1]``, unclamped)."""

    def __init__(self, cfg: TamingVQConfig) -> None:
        super().__init__()
        n = len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        lowest = cfg.resolution // 2 ** (n - 1)  # level i runs at lowest * 2**(n-1-i)
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, kernel_size=3, stride=1, padding=1)
        self.mid = _Mid(block_in, cfg.dropout)
        levels, block_in = build_up_levels(
            cfg.ch,
            cfg.ch_mult,
            cfg.num_res_blocks,
            cfg.dropout,
            block_in,
            lambda i: lowest * 2 ** (n - 1 - i) in cfg.attn_resolutions,
            "block",
        )  # built lowest resolution first, stored so that up[i] is level i
        self.up = nn.ModuleList(reversed(levels))  # up[0] = full resolution
        self.norm_out = make_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, kernel_size=3, stride=1, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = run_levels(self.mid(self.conv_in(z)), reversed(self.up), "upsample")  # i = n-1 … 0
        return self.conv_out(swish(self.norm_out(h)))


class TamingQuantizer(Codebook):
    """``embedding.weight`` ``[n_embed, embed_dim]``; plain (un-normalised) nearest-neighbour codebook."""


class TamingVQModel(VQModelBase):
    """taming ``VQModel`` (inference part) in the official layout; implements :class:`~.vq_common.VQDecoder`.

    Decoding: ``codes [B, h*w]`` → ``embedding`` → ``[B, h, w, d]`` → NCHW → ``post_quant_conv`` → ``decoder``
    → ``[B, out_ch, h*f, w*f]``. Encoding (``with_encoder=True``): ``encoder`` → ``quant_conv`` → nearest code.
    """

    config: TamingVQConfig
    no_encoder_message = "this VQGAN was built without an encoder (with_encoder=False)"

    def _make_encoder(self) -> nn.Module:
        return TamingEncoder(self.config)

    def _make_decoder(self) -> nn.Module:
        return TamingDecoder(self.config)

    def _make_quantizer(self) -> TamingQuantizer:
        return TamingQuantizer(self.config.n_embed, self.config.embed_dim)

    @property
    def codebook_size(self) -> int:
        return self.config.n_embed

    @property
    def embed_dim(self) -> int:
        return self.config.embed_dim


VQModel = TamingVQModel  # the official class name


# ---------------------------------------------------------------------------------------------------------
# Checkpoint I/O (official layout: Lightning ``{"state_dict": sd}`` + ``vqgan.yaml``)
# ---------------------------------------------------------------------------------------------------------


def load_taming_vqgan(
    ckpt_path: str | os.PathLike[str],
    yaml_path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    with_encoder: bool = False,
) -> TamingVQModel:
    """Load ``vqgan.ckpt`` + ``vqgan.yaml`` (Chameleon/Anole/Lumina tokenizer) with ``weights_only=True``.

    Weights are read from ``["state_dict"]`` (or a bare tensor dict). Every ``decoder.*``,
    ``quantize.embedding.weight`` and ``post_quant_conv.*`` key (plus ``encoder.*`` / ``quant_conv.*`` with
    ``with_encoder``) must be present with the configured shape; anything else (``loss.*``, an unused encoder)
    is ignored. Raises ``FileNotFoundError`` / ``ValueError`` naming the file and the missing keys. Returns the
    model in eval mode on ``device``; does not touch the global RNG.
    """
    config = TamingVQConfig.from_yaml(yaml_path, with_encoder=with_encoder)
    sd = unwrap_state_dict(load_checkpoint(ckpt_path), ckpt_path, ("state_dict",))
    prefixes = ("decoder.", "quantize.embedding.", "post_quant_conv.")
    return TamingVQModel.from_state_dict(config, sd, ckpt_path, prefixes, device)


def save_taming_vqgan(
    model: TamingVQModel, ckpt_path: str | os.PathLike[str], yaml_path: str | os.PathLike[str]
) -> tuple[Path, Path]:
    """Write ``{"state_dict": sd}`` to ``ckpt_path`` and the matching ``vqgan.yaml`` to ``yaml_path``."""
    sd = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    ckpt = atomic_torch_save({"state_dict": sd}, ckpt_path)
    ypath = Path(yaml_path)
    atomic_write_text(ypath, yaml.safe_dump(model.config.to_yaml_dict(), sort_keys=False))
    return ckpt, ypath


# ---------------------------------------------------------------------------------------------------------
# Tiny random instances (tests)
# ---------------------------------------------------------------------------------------------------------


def tiny_taming_vq_config(with_encoder: bool = False) -> TamingVQConfig:
    """n_embed 64, embed_dim 8, ch 32, ch_mult (1, 1, 2) (factor 4), 1 res block, z 32, no level attention."""
    return TamingVQConfig(
        embed_dim=8,
        n_embed=64,
        z_channels=32,
        resolution=16,
        in_channels=3,
        out_ch=3,
        ch=32,
        ch_mult=(1, 1, 2),
        num_res_blocks=1,
        attn_resolutions=(),
        dropout=0.0,
        double_z=False,
        with_encoder=with_encoder,
    )


def make_tiny_taming_vq(seed: int, with_encoder: bool = False) -> TamingVQModel:
    """Tiny VQGAN with parameters drawn from a local generator seeded by ``seed`` (eval mode, CPU).

    Same ``seed`` → identical weights; the global RNG state is neither read nor changed.
    """
    return TamingVQModel.tiny_random(tiny_taming_vq_config(with_encoder), seed)
