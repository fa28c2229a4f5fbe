"""TA-Tok decode path (csuhan/Tar ``tok/ta_tok.py``, ``TextAlignedTokenizer.decode_from_bottleneck``).

Generation needs only the decoder half of TA-Tok: codes ``[B, n]`` → SimVQ codebook lookup (``get_emb()``:
``embedding_proj(embedding.weight)``, l2-normalised when ``l2_normalized``) → ``bottleneck.out_linear``
(D → D) → a transformers ``Siglip2VisionModel`` "pixel decoder" over the ``p × p`` grid (patch size 1,
``num_channels = D``, ``hidden_size = H`` = the SigLIP2 teacher width, ``decoder_depth`` layers, other fields
``Siglip2VisionConfig()`` defaults; its ``last_hidden_state`` is post-``post_layernorm``) →
``decode_task_layer`` (Linear, Tanh, Linear) → features ``[B, n, H]`` that condition the AR de-tokenizer.

Checkpoint ``ta_tok.pth`` = ``{"model": {"args": {...}, "sd": {...}}}``; ``args["bottleneck"]`` is a
``{"name", "args"}`` spec whose ``args.regularizer.args`` hold ``codebook_size`` and ``l2_normalized``.
Module names here equal the checkpoint's (``bottleneck.regularizer.embedding``,
``bottleneck.regularizer.embedding_proj``, ``bottleneck.out_linear``, ``decoder.vision_model.*``,
``decode_task_layer.{0,2}``); the SigLIP2 encoder, ``encode_task_layer``, ``bottleneck.in_linear`` and any
teacher weights are ignored. No network access is needed (the teacher config is not read: H comes from the
weights).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adtbench.io import load_checkpoint


class SimVQCodebook(nn.Module):
    """``embedding`` (K × D) and ``embedding_proj`` (D → D): the text-aligned codebook ``C = E·W``."""

    def __init__(self, codebook_size: int, dim: int, l2_normalized: bool) -> None:
        super().__init__()
        self.l2_normalized = l2_normalized
        self.embedding = nn.Embedding(codebook_size, dim)
        self.embedding_proj = nn.Linear(dim, dim)

    def get_emb(self) -> torch.Tensor:
        emb = self.embedding_proj(self.embedding.weight)
        return F.normalize(emb, p=2, dim=-1) if self.l2_normalized else emb


class Bottleneck(nn.Module):
    def __init__(self, codebook_size: int, dim: int, l2_normalized: bool) -> None:
        super().__init__()
        self.regularizer = SimVQCodebook(codebook_size, dim, l2_normalized)
        self.out_linear = nn.Linear(dim, dim)


class TATokDecoder(nn.Module):
    """codes ``[B, p·p]`` → features ``[B, p·p, H]`` (module docstring)."""

    def __init__(
        self, codebook_size: int, dim: int, hidden: int, l2_normalized: bool, decoder_config: Mapping[str, Any]
    ) -> None:
        super().__init__()
        from transformers import Siglip2VisionConfig, Siglip2VisionModel

        self.bottleneck = Bottleneck(codebook_size, dim, l2_normalized)
        cfg = Siglip2VisionConfig()
        cfg.update(dict(decoder_config))
        cfg.update({"patch_size": 1, "num_channels": dim, "hidden_size": hidden})
        self.decoder = Siglip2VisionModel(cfg)
        self.decode_task_layer = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        self.codebook_size, self.dim, self.hidden = codebook_size, dim, hidden

    def codebook(self) -> torch.Tensor:
        """The effective codebook ``get_emb()`` ``[K, D]`` (what quantisation compares against)."""
        return self.bottleneck.regularizer.get_emb()

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, n]`` (n a square) → ``[B, n, H]`` (float, the decoder's dtype)."""
        B, n = codes.shape
        p = round(n**0.5)
        if p * p != n:
            raise ValueError(f"TA-Tok codes must form a square grid, got {n}")
        if int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size:
            raise ValueError(f"TA-Tok codes outside 0..{self.codebook_size - 1}")
        z = F.embedding(codes, self.codebook())
        z = self.bottleneck.out_linear(z)
        mask = torch.ones(B, n, dtype=torch.int, device=z.device)
        shapes = torch.tensor([[p, p]] * B, device=z.device)
        h = self.decoder(z, mask, shapes).last_hidden_state
        return self.decode_task_layer(h)


PREFIXES = ("bottleneck.regularizer.", "bottleneck.out_linear.", "decoder.", "decode_task_layer.")


def tatok_hparams(args: Mapping[str, Any], sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``codebook_size, dim, hidden, l2_normalized, decoder_depth`` from ``args`` (and weight shapes)."""
    bott = (args.get("bottleneck") or {}).get("args", {})
    reg = (bott.get("regularizer") or {}).get("args", {})
    emb = sd["bottleneck.regularizer.embedding.weight"]
    return {
        "codebook_size": int(reg.get("codebook_size", emb.shape[0])),
        "dim": int(bott.get("bottleneck_dim", emb.shape[1])),
        "hidden": int(sd["decode_task_layer.0.weight"].shape[0]),
        "l2_normalized": bool(reg.get("l2_normalized", False)),
        "decoder_depth": int(args.get("decoder_depth", 3)),
    }


def load_tatok(path: str | os.PathLike[str], decoder_config: Mapping[str, Any] | None = None) -> TATokDecoder:
    """Load the decode path of ``ta_tok.pth`` (``weights_only=True``); ``decoder_config`` overrides
    ``Siglip2VisionConfig`` fields of the pixel decoder (only needed for non-standard checkpoints).

    Every decode-path tensor must be present with the built shape; raises ``ValueError`` naming the file.
    """
    obj = load_checkpoint(path)
    try:
        args, sd = obj["model"]["args"], obj["model"]["sd"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: expected {{'model': {{'args': ..., 'sd': ...}}}} (a TA-Tok checkpoint)") from e
    for k in ("bottleneck.regularizer.embedding.weight", "decode_task_layer.0.weight"):
        if k not in sd:
            raise ValueError(f"{path}: missing {k} (not a TA-Tok checkpoint?)")
    hp = tatok_hparams(args, sd)
    dec = {"num_hidden_layers": hp["decoder_depth"], **dict(decoder_config or {})}
    with torch.random.fork_rng(devices=[]):
        model = TATokDecoder(hp["codebook_size"], hp["dim"], hp["hidden"], hp["l2_normalized"], dec)
    own = model.state_dict()
    wanted = {k for k in own if k.startswith(PREFIXES)}
    missing = sorted(k for k in wanted if k not in sd)
    bad = sorted(k for k in wanted if k in sd and tuple(sd[k].shape) != tuple(own[k].shape))
    if missing or bad:
        raise ValueError(f"{path}: TA-Tok decode path mismatch; missing {missing[:6]}; shape mismatches {bad[:6]}")
    model.load_state_dict({k: sd[k] for k in wanted}, strict=True)
    return model.eval()


def save_tatok(model: TATokDecoder, path: str | os.PathLike[str], extra_args: Mapping[str, Any] | None = None) -> None:
    """Write ``{"model": {"args": ..., "sd": ...}}`` in the official layout (tiny checkpoints)."""
    from adtbench.io import atomic_torch_save

    reg = model.bottleneck.regularizer
    args = {
        "bottleneck": {
            "name": "bottleneck",
            "args": {
                "bottleneck_dim": model.dim,
                "norm": "none",
                "regularizer": {
                    "name": "simvq",
                    "args": {"codebook_size": model.codebook_size, "l2_normalized": reg.l2_normalized},
                },
            },
        },
        "bottleneck_token_num": 729,
        "input_size": 384,
        "teacher": "google/siglip2-so400m-patch14-384",
        "input_type": "quant",
        "pool_scale": 1,
        "decoder_depth": model.decoder.config.num_hidden_layers,
        "select_layer_id": -2,
        **dict(extra_args or {}),
    }
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    atomic_torch_save({"model": {"args": args, "sd": sd}}, path)


__all__ = ["TATokDecoder", "load_tatok", "save_tatok", "tatok_hparams"]
