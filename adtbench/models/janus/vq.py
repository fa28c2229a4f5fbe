"""Janus-Pro's VQ image decoder: transformers' ``JanusVQVAE`` (the reference) behind the ``VQDecoder`` protocol.

Decode (``JanusVQVAE.decode``, for any grid): codes ``[B, h·w]`` → the codebook rows, L2-normalised over the
embedding dim (``get_codebook_entry``) → ``[B, e, h, w]`` → ``post_quant_conv`` → the decoder (``2^(levels − 1)``
upsampling: 16 for Janus-Pro's five levels, 24 × 24 codes → 384²) → pixels in about ``[−1, 1]``.
transformers' own ``decode`` insists on ``num_patches²`` codes; ``decode_codes`` runs the same modules for the
grid it is given.

Weights: the ``model.vqmodel.*`` tensors of the checkpoint's safetensors (its ``config.json``'s ``vq_config``), read
into a ``JanusVQVAE`` built on the meta device (no init pass); a missing or misshapen tensor is a ``ConfigError`` on
``model.path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adtbench.errors import ConfigError

PREFIX = "model.vqmodel."


class JanusVQ(nn.Module):
    """``VQDecoder`` over a transformers ``JanusVQVAE`` (module docstring)."""

    vqvae: Any

    def __init__(self, vqvae: nn.Module) -> None:
        super().__init__()
        self.vqvae = vqvae.eval()

    @property
    def codebook_size(self) -> int:
        return int(self.vqvae.quantize.num_embeddings)

    @property
    def downsample_factor(self) -> int:
        levels: int = len(self.vqvae.config.channel_multiplier)
        return int(2 ** (levels - 1))

    def codebook(self) -> torch.Tensor:
        """The raw codebook ``[K, e]`` (``VQDecoder``: decode L2-normalises its rows)."""
        weight: torch.Tensor = self.vqvae.quantize.embedding.weight
        return weight.detach()

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """``[B, h·w]`` codes → ``[B, 3, h·f, w·f]`` pixels (``JanusVQVAE.decode`` for an ``h × w`` grid)."""
        q = self.vqvae.quantize
        emb = F.normalize(q.embedding(codes), p=2, dim=-1)
        z = emb.view(codes.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()
        pixels: torch.Tensor = self.vqvae.decoder(self.vqvae.post_quant_conv(z))
        return pixels


def load_janus_vq(path: Path, config: Any, device: torch.device | str, key: str = "model.path") -> JanusVQ:
    """``JanusVQ`` from the ``model.vqmodel.*`` tensors of an HF Janus folder (float32: the decoder runs once an
    image)."""
    from safetensors import safe_open
    from transformers.models.janus.modeling_janus import JanusVQVAE

    from adtbench.models.hf_checkpoint import safetensors_device, safetensors_files

    sd: dict[str, torch.Tensor] = {}
    for f in safetensors_files(path):
        with safe_open(str(f), framework="pt", device=safetensors_device(device)) as h:
            for k in h.keys():  # noqa: SIM118 - safe_open has no __iter__
                if k.startswith(PREFIX):
                    sd[k[len(PREFIX) :]] = h.get_tensor(k).float()
    vqvae: Any
    with torch.device("meta"):
        vqvae = JanusVQVAE(config.vq_config)
    try:
        vqvae.load_state_dict(sd, strict=True, assign=True)
    except RuntimeError as e:
        raise ConfigError(key, f"{path}: the VQ tensors ({PREFIX}*) do not match vq_config: {e}") from e
    return JanusVQ(vqvae.to(device)).requires_grad_(False)


__all__ = ["JanusVQ", "load_janus_vq"]
