"""Shared pieces of the VQ image decoders (LlamaGen VQ-16 and the taming/Chameleon VQGAN).

Both families use the same convolutional building blocks, and their state-dict key names *inside* a block
agree (``norm1/conv1/norm2/conv2/nin_shortcut`` for a residual block, ``norm/q/k/v/proj_out`` for an
attention block, ``conv`` for a resampler), so the blocks live here and each family only arranges them in
its own on-disk layout.

The family-independent skeleton lives here too: :class:`ResLevel` (one resolution level; the family names its
block list), :func:`build_down_levels` / :func:`build_up_levels` (the encoder / decoder level stacks; the family
says where attention goes), :func:`run_levels`, :class:`Codebook` and :class:`VQModelBase` (codes ↔
pixels around ``quant_conv`` / ``post_quant_conv``). Invariant: each family's modules are created and registered
in the same order as the official code, so ``state_dict()`` keys and their order match the released files and a
seeded construction draws the same initial values.

Also here: the :class:`VQDecoder` protocol that the engine codes against, pixel conversion
(:func:`to_uint8_images`), and picking / checking a state dict out of a loaded checkpoint
(:func:`unwrap_state_dict`, :func:`load_filtered_state_dict`). Files are read and written by ``adtbench.io``
(``load_checkpoint``, ``atomic_torch_save``, ``save_png``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, Self, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "AttnBlock",
    "Codebook",
    "Downsample",
    "ResLevel",
    "ResnetBlock",
    "Upsample",
    "VQDecoder",
    "VQModelBase",
    "build_down_levels",
    "build_up_levels",
    "check_codes",
    "load_filtered_state_dict",
    "make_norm",
    "nearest_codes",
    "randomize_parameters",
    "run_levels",
    "swish",
    "to_uint8_images",
    "unwrap_state_dict",
]


@runtime_checkable
class VQDecoder(Protocol):
    """What the engine needs from an image tokenizer: codes → pixels, plus the codebook.

    Invariants: ``decode_codes(codes, h, w)`` maps ``LongTensor[B, h*w]`` (row-major grid, values in
    ``[0, codebook_size)``) to ``FloatTensor[B, 3, h*f, w*f]`` with ``f = downsample_factor``, in roughly
    ``[-1, 1]`` (not clamped); ``codebook()`` is the raw ``[codebook_size, d]`` embedding matrix.
    """

    def decode_codes(self, codes: Tensor, h: int, w: int) -> Tensor: ...

    def codebook(self) -> Tensor: ...

    @property
    def downsample_factor(self) -> int: ...

    @property
    def codebook_size(self) -> int: ...


# ---------------------------------------------------------------------------------------------------------
# Building blocks (key names match taming-transformers and LlamaGen)
# ---------------------------------------------------------------------------------------------------------


def swish(x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (the "nonlinearity" of both reference codebases)."""
    return x * torch.sigmoid(x)


class PixelNorm(nn.Module):
    """Channel LayerNorm at each position (eps 1e-6, affine ``weight``/``bias`` like GroupNorm's): unlike
    GroupNorm it uses no statistic of the rest of the image, so a block's output at a position depends only on
    its receptive field (the ``local`` encoder)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), self.weight, self.bias, 1e-6)
        return y.permute(0, 3, 1, 2)


def make_norm(channels: int, local: bool = False) -> nn.Module:
    """GroupNorm(32 groups, eps 1e-6, affine) — ``channels`` a multiple of 32 — or, ``local``, ``PixelNorm``."""
    if local:
        return PixelNorm(channels)
    if channels % 32 != 0:
        raise ValueError(f"GroupNorm(32) needs a channel count divisible by 32, got {channels}")
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """Pre-activation residual block: ``x + conv2(drop(swish(norm2(conv1(swish(norm1(x)))))))``.

    Keys: ``norm1, conv1, norm2, conv2`` and, when ``in_ch != out_ch``, a 1×1 ``nin_shortcut``.
    Shapes: ``[B, in_ch, H, W] -> [B, out_ch, H, W]``. (No ``temb_proj``: the VQ encoders/decoders use
    ``temb_channels=0``.)
    """

    def __init__(self, in_ch: int, out_ch: int, dropout: float = 0.0, local: bool = False) -> None:
        super().__init__()
        self.in_ch = in_ch
        self.out_ch = out_ch
        pad = "replicate" if local else "zeros"
        self.norm1 = make_norm(in_ch, local)
        self.conv1 = nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=1, padding=1, padding_mode=pad)
        self.norm2 = make_norm(out_ch, local)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, kernel_size=3, stride=1, padding=1, padding_mode=pad)
        if in_ch != out_ch:
            self.nin_shortcut = nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=1, padding=0)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        if self.in_ch != self.out_ch:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1×1-conv projections ``q, k, v, proj_out`` after ``norm``.

    Shapes: ``[B, C, H, W] -> [B, C, H, W]``; softmax scale ``C**-0.5`` (as in the references).
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = make_norm(channels)
        self.q = nn.Conv2d(channels, channels, kernel_size=1)
        self.k = nn.Conv2d(channels, channels, kernel_size=1)
        self.v = nn.Conv2d(channels, channels, kernel_size=1)
        self.proj_out = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, hh, ww = x.shape
        n = self.norm(x)

        def tokens(t: Tensor) -> Tensor:
            # [B, C, H, W] -> [B, 1, H*W, C] (one head)
            return t.reshape(b, c, hh * ww).transpose(1, 2).unsqueeze(1)

        out = F.scaled_dot_product_attention(tokens(self.q(n)), tokens(self.k(n)), tokens(self.v(n)))
        out = out.squeeze(1).transpose(1, 2).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    """Nearest-neighbour ×2 upsampling followed by a 3×3 ``conv``: ``[B,C,H,W] -> [B,C,2H,2W]``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    """Stride-2 3×3 ``conv`` after asymmetric zero padding (right/bottom by 1): ``[B,C,H,W] -> [B,C,H/2,W/2]``."""

    def __init__(self, channels: int, local: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=2, padding=0)
        self.pad_mode = "replicate" if local else "constant"  # local: the border continues the image

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1), mode=self.pad_mode))


# ---------------------------------------------------------------------------------------------------------
# Level stacks (encoder: full resolution first; decoder: built lowest resolution first)
# ---------------------------------------------------------------------------------------------------------


class ResLevel(nn.Module):
    """One resolution level: residual blocks under ``block_attr`` (LlamaGen ``res``, taming ``block``), ``attn``
    (empty, or one attention block after each residual block) and, set by the builder, ``downsample`` or
    ``upsample``. Keys: ``<block_attr>.{j}.*``, ``attn.{j}.*``, ``downsample.conv`` / ``upsample.conv``."""

    def __init__(self, block_attr: str) -> None:
        super().__init__()
        self.block_attr = block_attr
        setattr(self, block_attr, nn.ModuleList())
        self.attn = nn.ModuleList()

    @property
    def blocks(self) -> nn.ModuleList:
        return getattr(self, self.block_attr)

    def run_blocks(self, h: Tensor) -> Tensor:
        has_attn = len(self.attn) > 0
        for i, block in enumerate(self.blocks):
            h = block(h)
            if has_attn:
                h = self.attn[i](h)
        return h


def build_down_levels(
    ch: int,
    ch_mult: Sequence[int],
    num_res_blocks: int,
    dropout: float,
    attn_at: Callable[[int], bool],
    block_attr: str,
    local: bool = False,
) -> tuple[list[ResLevel], int]:
    """Encoder levels, full resolution first (``local``: ``PixelNorm`` and replicate padding, no attention):
    level ``i`` has ``num_res_blocks`` residual blocks
    (``ch·in_mult[i] → ch·ch_mult[i]``), attention after each when ``attn_at(i)``, and a ``downsample`` unless it
    is the last. Returns the levels and the channel count they end at."""
    n = len(ch_mult)
    in_mult = (1, *ch_mult)
    levels: list[ResLevel] = []
    block_in = ch
    for i in range(n):
        level = ResLevel(block_attr)
        block_in = ch * in_mult[i]
        block_out = ch * ch_mult[i]
        for _ in range(num_res_blocks):
            level.blocks.append(ResnetBlock(block_in, block_out, dropout, local))
            block_in = block_out
            if attn_at(i) and not local:
                level.attn.append(AttnBlock(block_in))
        if i != n - 1:
            level.downsample = Downsample(block_in, local)
        levels.append(level)
    return levels, block_in


def build_up_levels(
    ch: int,
    ch_mult: Sequence[int],
    num_res_blocks: int,
    dropout: float,
    block_in: int,
    attn_at: Callable[[int], bool],
    block_attr: str,
) -> tuple[list[ResLevel], int]:
    """Decoder levels in build order, lowest resolution first (``i_level = n-1 … 0``): ``num_res_blocks + 1``
    residual blocks to ``ch·ch_mult[i_level]``, attention after each when ``attn_at(i_level)``, and an
    ``upsample`` unless ``i_level == 0``. Returns the levels and the channel count they end at."""
    levels: list[ResLevel] = []
    for i_level in reversed(range(len(ch_mult))):
        level = ResLevel(block_attr)
        block_out = ch * ch_mult[i_level]
        for _ in range(num_res_blocks + 1):
            level.blocks.append(ResnetBlock(block_in, block_out, dropout))
            block_in = block_out
            if attn_at(i_level):
                level.attn.append(AttnBlock(block_in))
        if i_level != 0:
            level.upsample = Upsample(block_in)
        levels.append(level)
    return levels, block_in


def run_levels(h: Tensor, levels: Iterable[Any], resample: str) -> Tensor:
    """Levels in order (encoder: full resolution first, ``resample="downsample"``; decoder: lowest resolution
    first, ``"upsample"``); every level but the last ends with its ``resample`` module."""
    levels = list(levels)
    for i, level in enumerate(levels):
        h = level.run_blocks(h)
        if i != len(levels) - 1:
            h = getattr(level, resample)(h)
    return h


# ---------------------------------------------------------------------------------------------------------
# The VQ model skeleton (codebook, quant convs, codes ↔ pixels)
# ---------------------------------------------------------------------------------------------------------


class Codebook(nn.Module):
    """``embedding.weight`` ``[n_codes, dim]``, official init ``U(-1/n, 1/n)``; plain nearest-neighbour search.

    Subclasses may transform the rows (:meth:`effective_codebook`) and the latents (:meth:`prepare_latents`) used
    for search and lookup; ``embedding.weight`` stays the raw rows.
    """

    def __init__(self, n_codes: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_codes, dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / n_codes, 1.0 / n_codes)

    def effective_codebook(self) -> Tensor:
        """The ``[N, d]`` vectors used for search and lookup."""
        return self.embedding.weight

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Encoder latents ``[B, d, h, w]`` as compared against :meth:`effective_codebook`."""
        return z


class VQModelBase(nn.Module):
    """A VQ image tokenizer in an official layout; implements :class:`VQDecoder`.

    Subclasses provide ``_make_encoder``, ``_make_decoder``, ``_make_quantizer`` (a :class:`Codebook`),
    ``codebook_size`` and ``embed_dim``; their ``config`` has ``z_channels``, ``with_encoder`` and
    ``downsample_factor``. Modules are created in the official order: ``encoder`` (with the encoder only),
    ``decoder``, ``quantize``, ``quant_conv`` (``z_channels → d``, encoder only), ``post_quant_conv``
    (``d → z_channels``). Decoding: ``codes [B, h*w]`` → effective rows ``[B, h, w, d]`` → NCHW →
    ``post_quant_conv`` → ``decoder`` → ``[B, 3, h*f, w*f]``.
    """

    config: Any
    no_encoder_message = "this VQ model was built without an encoder (with_encoder=False)"

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        if config.with_encoder:
            self.encoder = self._make_encoder()
        self.decoder = self._make_decoder()
        self.quantize = self._make_quantizer()
        if config.with_encoder:
            self.quant_conv = nn.Conv2d(config.z_channels, self.embed_dim, kernel_size=1)
        self.post_quant_conv = nn.Conv2d(self.embed_dim, config.z_channels, kernel_size=1)

    @classmethod
    def from_state_dict(
        cls,
        config: Any,
        sd: Mapping[str, Tensor],
        path: str | os.PathLike[str],
        prefixes: tuple[str, ...],
        device: str | torch.device = "cpu",
        optional_keys: frozenset[str] = frozenset(),
    ) -> Self:
        """``cls(config)`` built without touching the global RNG, loaded from ``sd`` by
        :func:`load_filtered_state_dict` over ``prefixes`` (plus ``encoder.`` / ``quant_conv.`` with the encoder);
        eval mode on ``device``. Raises ``ValueError`` naming ``path`` and the offending keys."""
        with torch.random.fork_rng(devices=[]):  # default inits draw from the global CPU RNG; restore it
            model = cls(config)
        if config.with_encoder:
            prefixes += ("encoder.", "quant_conv.")
        load_filtered_state_dict(model, sd, path, prefixes, optional_keys=optional_keys)
        return model.to(device).eval()

    @classmethod
    def tiny_random(cls, config: Any, seed: int) -> Self:
        """``cls(config)`` with every parameter drawn by :func:`randomize_parameters` from ``seed`` (eval mode, CPU).

        Same ``seed`` → identical weights; the global RNG state is neither read nor changed.
        """
        with torch.random.fork_rng(devices=[]):  # default inits draw from the global CPU RNG; restore it
            model = cls(config)
        randomize_parameters(model, seed)
        return model.eval()

    def _make_encoder(self) -> nn.Module:
        raise NotImplementedError

    def _make_decoder(self) -> nn.Module:
        raise NotImplementedError

    def _make_quantizer(self) -> Codebook:
        raise NotImplementedError

    @property
    def codebook_size(self) -> int:
        raise NotImplementedError

    @property
    def embed_dim(self) -> int:
        raise NotImplementedError

    @property
    def downsample_factor(self) -> int:
        """Pixels per code along each side: ``2 ** (len(ch_mult) - 1)`` (16 for the released models)."""
        return self.config.downsample_factor

    def codebook(self) -> Tensor:
        """The raw codebook ``quantize.embedding.weight``, ``[codebook_size, d]`` (what LANTERN uses)."""
        return self.quantize.embedding.weight

    def lookup(self, codes: Tensor, h: int, w: int) -> Tensor:
        """``LongTensor[B, h*w]`` → quantised latents ``[B, d, h, w]`` (the effective codebook rows)."""
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

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[-1, 1]`` (``H, W`` multiples of ``f``) → codes ``LongTensor[B, h*w]``.

        ``h = H // f`` and ``w = W // f``; codes are row-major so ``decode_codes(codes, h, w)`` inverts the grid.
        """
        if not self.config.with_encoder:
            raise RuntimeError(self.no_encoder_message)
        f = self.downsample_factor
        if images.dim() != 4 or images.shape[2] % f or images.shape[3] % f:
            raise ValueError(f"images must be [B, C, H, W] with H, W multiples of {f}, got {tuple(images.shape)}")
        z = self.quantize.prepare_latents(self.quant_conv(self.encoder(images)))  # [B, d, h, w]
        return nearest_codes(z, self.quantize.effective_codebook())


# ---------------------------------------------------------------------------------------------------------
# Codes
# ---------------------------------------------------------------------------------------------------------


def check_codes(codes: Tensor, h: int, w: int, codebook_size: int) -> None:
    """Validate ``codes`` as ``LongTensor[B, h*w]`` with values in ``[0, codebook_size)``; raise ValueError."""
    if codes.dim() != 2 or codes.shape[1] != h * w:
        raise ValueError(f"codes must have shape [B, h*w] = [B, {h * w}], got {tuple(codes.shape)}")
    if codes.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"codes must be an integer tensor, got {codes.dtype}")
    if codes.numel() > 0:
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0 or hi >= codebook_size:
            raise ValueError(f"codes must lie in [0, {codebook_size}), got min {lo} max {hi}")


def nearest_codes(z: Tensor, embedding: Tensor) -> Tensor:
    """Index of the nearest codebook row (squared L2) for each spatial vector.

    ``z``: ``[B, d, h, w]``; ``embedding``: ``[N, d]``. Returns ``LongTensor[B, h*w]`` (row-major).
    Uses ``|z|² + |e|² − 2 z·e`` like the references, so ties resolve to the lowest index.
    """
    b, d, hh, ww = z.shape
    flat = z.permute(0, 2, 3, 1).reshape(-1, d).to(embedding.dtype)
    dist = flat.pow(2).sum(1, keepdim=True) + embedding.pow(2).sum(1) - 2.0 * flat @ embedding.t()
    return dist.argmin(dim=1).reshape(b, hh * ww)


# ---------------------------------------------------------------------------------------------------------
# Deterministic random init for the tiny test instances
# ---------------------------------------------------------------------------------------------------------


def randomize_parameters(module: nn.Module, seed: int) -> None:
    """Re-initialise every parameter of ``module`` from a local generator seeded with ``seed``.

    Independent of PyTorch's default initialisers and of the global RNG state (neither is read or changed).
    Convs/linears: normal with std ``1/sqrt(fan_in)``; biases: normal std 0.02; GroupNorm weight ``1 + N(0, 0.05)``,
    bias ``N(0, 0.05)``; embeddings: standard normal. Buffers are left unchanged.
    """
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                std = 1.0 if "embedding" in name else fan_in**-0.5
                vals = torch.randn(p.shape, generator=gen) * std
            elif leaf == "weight":  # GroupNorm scale
                vals = 1.0 + 0.05 * torch.randn(p.shape, generator=gen)
            else:
                vals = 0.02 * torch.randn(p.shape, generator=gen)
            p.copy_(vals.to(device=p.device, dtype=p.dtype))


# ---------------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------------


def to_uint8_images(x: Tensor) -> np.ndarray:
    """``Tensor[B, 3, H, W]`` in ``[-1, 1]`` → ``np.ndarray[B, H, W, 3]`` uint8.

    Clamps to ``[-1, 1]``, maps with ``(x + 1) / 2 * 255`` and rounds to nearest (computed in float32 on CPU).
    """
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"expected images of shape [B, 3, H, W], got {tuple(x.shape)}")
    y = x.detach().to(device="cpu", dtype=torch.float32).clamp(-1.0, 1.0)
    y = torch.round((y + 1.0) * 0.5 * 255.0).to(torch.uint8)
    return y.permute(0, 2, 3, 1).contiguous().numpy()


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------


def unwrap_state_dict(obj: Any, path: str | os.PathLike[str], keys: Iterable[str]) -> dict[str, Tensor]:
    """Pick the tensor dict out of a loaded checkpoint: the first of ``keys`` present, else ``obj`` itself.

    Raises ``ValueError`` naming ``path`` when the result is not a ``str -> Tensor`` mapping.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected a dict checkpoint, got {type(obj).__name__}")
    sd: Any = obj
    for k in keys:
        if k in obj and isinstance(obj[k], Mapping):
            sd = obj[k]
            break
    tensors = {k: v for k, v in sd.items() if isinstance(v, Tensor)}
    if not tensors:
        raise ValueError(f"{path}: no tensors found (top-level keys: {sorted(map(str, obj))[:20]})")
    return tensors


def load_filtered_state_dict(
    model: nn.Module,
    sd: Mapping[str, Tensor],
    path: str | os.PathLike[str],
    required_prefixes: tuple[str, ...],
    optional_keys: frozenset[str] = frozenset(),
) -> None:
    """Load ``sd`` into ``model`` checking every key of the model under ``required_prefixes``.

    * every model key starting with one of ``required_prefixes`` must be present (except ``optional_keys``),
      with the model's shape;
    * a checkpoint key under ``required_prefixes`` that the model lacks is an error (config mismatch);
    * checkpoint keys outside ``required_prefixes`` are ignored (loss/discriminator, unused encoder);
    * model keys outside ``required_prefixes`` keep their current values.

    Raises ``ValueError`` naming ``path`` and listing the offending keys.
    """
    own = model.state_dict()
    wanted = {k for k in own if k.startswith(required_prefixes)}
    missing = sorted(k for k in wanted - optional_keys if k not in sd)
    unexpected = sorted(k for k in sd if k.startswith(required_prefixes) and k not in own)
    bad_shape = sorted(
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
        for k in wanted
        if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)
    )
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {missing}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {unexpected}")
    if bad_shape:
        problems.append(f"shape mismatches ({len(bad_shape)}): {bad_shape}")
    if problems:
        raise ValueError(f"{path}: checkpoint does not match the model config; " + "; ".join(problems))
    model.load_state_dict({k: sd[k] for k in wanted if k in sd}, strict=False)
