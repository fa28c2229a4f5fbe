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


class _Level(nn.Module):
    """One resolution level: ``block`` (res blocks), ``attn`` (empty or one per block), optional resampler."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.ModuleList()
        self.attn = nn.ModuleList()

    def run_blocks(self, h: Tensor) -> Tensor:
        has_attn = len(self.attn) > 0
        for i, b in enumerate(self.block):
            h = b(h)
            if has_attn:
                h = self.attn[i](h)
        return h


class TamingEncoder(nn.Module):
    """Images ``[B, in_channels, H, W]`` → ``[B, z_channels, H/f, W/f]``."""

    def __init__(self, cfg: TamingVQConfig) -> None:
        super().__init__()
        n = len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, kernel_size=3, stride=1, padding=1)
        in_mult = (1, *cfg.ch_mult)
        curr_res = cfg.resolution
        self.down = nn.ModuleList()
        block_in = cfg.ch
        for i in range(n):
            level = _Level()
            block_in = cfg.ch * in_mult[i]
            block_out = cfg.ch * cfg.ch_mult[i]
            for _ in range(cfg.num_res_blocks):
                level.block.append(ResnetBlock(block_in, block_out, cfg.dropout))
                block_in = block_out
                if curr_res in cfg.attn_resolutions:
                    level.attn.append(AttnBlock(block_in))
            if i != n - 1:
                level.downsample = Downsample(block_in)
                curr_res //= 2
            self.down.append(level)
        self.mid = _Mid(block_in, cfg.dropout)
        self.norm_out = make_norm(block_in)
        out = 2 * cfg.z_channels if cfg.double_z else cfg.z_channels
        self.conv_out = nn.Conv2d(block_in, out, kernel_size=3, stride=1, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        last = len(self.down) - 1
        for i, level in enumerate(self.down):
            h = level.run_blocks(h)
            if i != last:
                h = level.downsample(h)
        h = self.mid(h)
        return self.conv_out(swish(self.norm_out(h)))


class TamingDecoder(nn.Module):
    """Latents ``[B, z_channels, h, w]`` → pixels ``[B, out_ch, h*f, w*f]`` (≈ ``[-1, 1]``, unclamped)."""

    def __init__(self, cfg: TamingVQConfig) -> None:
        super().__init__()
        n = len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        curr_res = cfg.resolution // 2 ** (n - 1)
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, kernel_size=3, stride=1, padding=1)
        self.mid = _Mid(block_in, cfg.dropout)
        levels: list[_Level] = []  # built lowest resolution first, stored so that up[i] is level i
        for i_level in reversed(range(n)):
            level = _Level()
            block_out = cfg.ch * cfg.ch_mult[i_level]
            for _ in range(cfg.num_res_blocks + 1):
                level.block.append(ResnetBlock(block_in, block_out, cfg.dropout))
                block_in = block_out
                if curr_res in cfg.attn_resolutions:
                    level.attn.append(AttnBlock(block_in))
            if i_level != 0:
                level.upsample = Upsample(block_in)
                curr_res *= 2
            levels.append(level)
        self.up = nn.ModuleList(reversed(levels))  # up[0] = full resolution
        self.norm_out = make_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, kernel_size=3, stride=1, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid(self.conv_in(z))
        for i_level in reversed(range(len(self.up))):
            level = self.up[i_level]
            h = level.run_blocks(h)
            if i_level != 0:
                h = level.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class TamingQuantizer(nn.Module):
    """``embedding.weight`` ``[n_embed, embed_dim]``; plain (un-normalised) nearest-neighbour codebook."""

    def __init__(self, n_embed: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_embed, embed_dim)
        with torch.no_grad():  # official init
            self.embedding.weight.uniform_(-1.0 / n_embed, 1.0 / n_embed)


class TamingVQModel(nn.Module):
    """taming ``VQModel`` (inference part) in the official layout; implements :class:`~.vq_common.VQDecoder`.

    Decoding: ``codes [B, h*w]`` → ``embedding`` → ``[B, h, w, d]`` → NCHW → ``post_quant_conv`` → ``decoder``
    → ``[B, out_ch, h*f, w*f]``. Encoding (``with_encoder=True``): ``encoder`` → ``quant_conv`` → nearest code.
    """

    def __init__(self, config: TamingVQConfig) -> None:
        super().__init__()
        self.config = config
        if config.with_encoder:
            self.encoder = TamingEncoder(config)
        self.decoder = TamingDecoder(config)
        self.quantize = TamingQuantizer(config.n_embed, config.embed_dim)
        if config.with_encoder:
            self.quant_conv = nn.Conv2d(config.z_channels, config.embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, kernel_size=1)

    @property
    def downsample_factor(self) -> int:
        """Pixels per code along each side: ``2 ** (len(ch_mult) - 1)`` (16 for Chameleon)."""
        return self.config.downsample_factor

    @property
    def codebook_size(self) -> int:
        return self.config.n_embed

    @property
    def embed_dim(self) -> int:
        return self.config.embed_dim

    def codebook(self) -> Tensor:
        """``quantize.embedding.weight``, ``[n_embed, embed_dim]`` (the vectors used for lookup as they are)."""
        return self.quantize.embedding.weight

    def lookup(self, codes: Tensor, h: int, w: int) -> Tensor:
        """``LongTensor[B, h*w]`` → quantised latents ``[B, embed_dim, h, w]``."""
        check_codes(codes, h, w, self.codebook_size)
        z_q = self.codebook()[codes.long()]  # [B, h*w, d]
        return z_q.reshape(codes.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()

    def decode_latents(self, z_q: Tensor) -> Tensor:
        """Quantised latents ``[B, embed_dim, h, w]`` → pixels ``[B, out_ch, h*f, w*f]`` (unclamped)."""
        return self.decoder(self.post_quant_conv(z_q))

    @torch.no_grad()
    def decode_codes(self, codes: Tensor, h: int, w: int) -> Tensor:
        """Code grid (row-major ``LongTensor[B, h*w]``) → pixels ``FloatTensor[B, 3, h*f, w*f]``, unclamped."""
        return self.decode_latents(self.lookup(codes.to(self.codebook().device), h, w))

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[-1, 1]`` (``H, W`` multiples of ``f``) → codes ``LongTensor[B, h*w]``."""
        if not self.config.with_encoder:
            raise RuntimeError("this VQGAN was built without an encoder (with_encoder=False)")
        f = self.downsample_factor
        if images.dim() != 4 or images.shape[2] % f or images.shape[3] % f:
            raise ValueError(f"images must be [B, C, H, W] with H, W multiples of {f}, got {tuple(images.shape)}")
        return nearest_codes(self.quant_conv(self.encoder(images)), self.codebook())


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
    obj = load_checkpoint(ckpt_path)
    sd = unwrap_state_dict(obj, ckpt_path, ("state_dict",))
    with torch.random.fork_rng(devices=[]):  # default inits draw from the global CPU RNG; restore it
        model = TamingVQModel(config)
    prefixes: tuple[str, ...] = ("decoder.", "quantize.embedding.", "post_quant_conv.")
    if with_encoder:
        prefixes += ("encoder.", "quant_conv.")
    load_filtered_state_dict(model, sd, ckpt_path, prefixes)
    return model.to(device).eval()


def save_taming_vqgan(
    model: TamingVQModel, ckpt_path: str | os.PathLike[str], yaml_path: str | os.PathLike[str]
) -> tuple[Path, Path]:
    """Write ``{"state_dict": sd}`` to ``ckpt_path`` and the matching ``vqgan.yaml`` to ``yaml_path``."""
    sd = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    ckpt = atomic_torch_save({"state_dict": sd}, ckpt_path)
    ypath = Path(yaml_path)
    ypath.parent.mkdir(parents=True, exist_ok=True)
    tmp = ypath.with_name(ypath.name + ".tmp")
    tmp.write_text(yaml.safe_dump(model.config.to_yaml_dict(), sort_keys=False))
    os.replace(tmp, ypath)
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
    cfg = tiny_taming_vq_config(with_encoder)
    with torch.random.fork_rng(devices=[]):  # default inits draw from the global CPU RNG; restore it
        model = TamingVQModel(cfg)
    randomize_parameters(model, seed)
    return model.eval()
