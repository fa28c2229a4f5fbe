"""The Emu3 LM (Emu3-Gen) on the project's lean stack: fused inference weights, a static KV cache.

``Emu3LM`` computes the function of transformers' ``Emu3TextModel`` + ``lm_head`` (4.57, ``models/emu3``): a Llama
decoder (pre-norm RMSNorm, GQA — 32 query heads over 8 K/V heads in the 8B model —, RoPE θ = 1e6, SwiGLU MLP, no
q/k norm, no biases) over a 184,622-token vocabulary whose image tokens are ordinary ids. Per layer, with ``x`` the
residual stream:

    h = x + o(SDPA(rope(q), rope(k), v; mask)),   q|k|v = RMSNorm(x)·W_qkvᵀ
    x' = h + down(silu(gate) ⊙ up),               gate|up = RMSNorm(h)·W_13ᵀ

then the final RMSNorm (the features) and ``lm_head`` (``output``). It is ``chameleon.lean.ChameleonLM`` without the
q/k LayerNorms, on the same kernels and with the same numerics (RMSNorm statistics and rotary tables in float32; the
RMSNorm weights folded into the projection that follows; q/k rows stored in interleaved rotary pairs,
``lean.interleave_pairs``; grouped K/V heads repeated as HF's ``repeat_kv``), so that it equals transformers in
float32 to rounding (``tests/test_emu3.py``).

Weights: checkpoint keys are read in either spelling — the hub's (``text_model.model.*``, ``text_model.lm_head.*``,
``vqmodel.*``: what ``save_pretrained`` writes, the pre-4.52 layout) or the in-memory 4.57 one
(``model.text_model.*``, ``lm_head.*``, ``model.vqmodel.*``) — through ``canonical_key``. ``load_emu3_net`` reads a
folder tensor by tensor onto the device (the VQ tensors are left to ``target.load_emu3_vq``); ``lean_from_hf``
converts an in-memory ``Emu3ForCausalLM`` / ``Emu3ForConditionalGeneration`` (``random_init``), emptying it as it goes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.models.chameleon.lean import NORM_DTYPE, ChameleonArch, ChameleonLM
from adtbench.models.chameleon.lean import _fuse as fuse_chameleon
from adtbench.models.lean import FusedBlock, assemble, llama_layer_shapes

_PREFIXES = (  # (checkpoint prefix, canonical prefix): the hub's spelling, then transformers 4.57's in memory
    ("text_model.model.", "model."),
    ("text_model.lm_head.", "lm_head."),
    ("model.text_model.", "model."),
    ("vqmodel.", "vq."),
    ("model.vqmodel.", "vq."),
)


def canonical_key(key: str) -> str:
    """A checkpoint key in the canonical spelling: ``model.*`` (the text model), ``lm_head.*``, ``vq.*`` (the VQ-VAE);
    keys already canonical (``Emu3ForCausalLM``'s ``model.*`` / ``lm_head.*``) pass through."""
    for old, new in _PREFIXES:
        if key.startswith(old):
            return new + key[len(old) :]
    return key


@dataclass(frozen=True)
class Emu3Arch(ChameleonArch):
    """The sizes ``Emu3LM`` needs, read from an ``Emu3TextConfig`` (``ChameleonArch.from_config``'s checks: no biases,
    no RoPE scaling, SiLU)."""

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical key → shape of every LM tensor this module reads (``lm_head`` absent when tied)."""
        D, F, V, hd = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
        if not self.tie_word_embeddings:
            out["lm_head.weight"] = (V, D)
        for i in range(self.num_layers):
            out |= llama_layer_shapes(f"model.layers.{i}.", D, F, self.num_heads, self.num_kv_heads, hd)
        return out


class Emu3Block(FusedBlock):
    """One Emu3 decoder layer in inference form: a ``FusedBlock`` (no q/k norm)."""

    def __init__(self, a: ChameleonArch) -> None:
        super().__init__(
            a.hidden_size, a.intermediate_size, a.num_heads, a.num_kv_heads, a.head_dim, a.rms_norm_eps, NORM_DTYPE
        )


class Emu3LM(ChameleonLM):
    """Emu3's LM for tree decoding: ``ChameleonLM``'s interface (``tok_embeddings``, ``output``, ``forward_embeds``,
    ``new_cache``, ``rope_tables``) over ``Emu3Block`` layers; ``config`` is the checkpoint's ``Emu3Config`` (its
    ``vocabulary_map`` names the image tokens). Inference only."""

    block = Emu3Block


def _fuse(
    arch: ChameleonArch,
    get: Callable[[str], torch.Tensor],
    dtype: torch.dtype,
    layer_done: Callable[[int], None] | None,
) -> dict[str, torch.Tensor]:
    """``Emu3LM`` state dict from canonical-key tensors (``get``), cast to ``dtype``, layer by layer: Chameleon's
    fusion (``chameleon.lean._fuse``) without the q/k norms."""
    return fuse_chameleon(arch, get, dtype, layer_done, qk_norm=False)


def _assemble(arch: ChameleonArch, config: Any, sd: dict[str, torch.Tensor]) -> Emu3LM:
    net: Emu3LM = assemble(Emu3LM, arch, config, sd)
    return net


def lean_from_hf(lm: nn.Module, config: Any) -> Emu3LM:
    """The lean form of an in-memory ``Emu3ForCausalLM`` or ``Emu3ForConditionalGeneration`` (``config``: the
    ``Emu3Config`` the target reads its vocabulary from). ``lm``'s decoder layers are emptied as they are fused: do
    not use it afterwards."""
    arch = Emu3Arch.from_config(config.text_config)
    sd = {canonical_key(k): v for k, v in lm.state_dict().items() if not canonical_key(k).startswith("vq.")}
    text: Any = lm.model.text_model if hasattr(lm.model, "text_model") else lm.model

    def layer_done(i: int) -> None:
        for k in [k for k in sd if k.startswith(f"model.layers.{i}.")]:
            del sd[k]
        text.layers[i] = nn.Module()

    return _assemble(arch, config, _fuse(arch, sd.__getitem__, next(lm.parameters()).dtype, layer_done))


def open_emu3_checkpoint(path: Path, key: str = "model.path") -> tuple[Any, list[Path], dict[str, tuple[int, ...]]]:
    """``(Emu3Config, shard files, canonical key → shape)`` of an HF Emu3 folder; no tensor is read. Checks
    (``ConfigError(key, …)``): at least one safetensors shard, each structurally whole, a ``config.json`` of an Emu3
    checkpoint with a ``vocabulary_map``."""
    from transformers import Emu3Config

    from adtbench.io import check_weights
    from adtbench.models.hf_checkpoint import checkpoint_shapes, safetensors_files

    files = safetensors_files(path)
    if not files:
        raise ConfigError(key, f"{path} holds no *.safetensors weights")
    for f in files:
        check_weights(key, f)
    try:
        config = Emu3Config.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(key, f"{path / 'config.json'} is not an Emu3 config: {e}") from e
    if not getattr(config, "vocabulary_map", None):
        raise ConfigError(key, f"{path / 'config.json'} has no vocabulary_map (needed for the image-token ids)")
    shapes = {canonical_key(k): s for k, s in checkpoint_shapes(files).items()}
    return config, files, shapes


def load_emu3_net(path: Path, dtype: torch.dtype, device: torch.device, key: str = "model.path") -> Emu3LM:
    """``Emu3LM`` from an HF Emu3 folder (sharded safetensors + index), read tensor by tensor onto ``device``.

    Every LM tensor must be present with its config's shape (checked from the headers before any tensor is read;
    ``ConfigError`` on ``key``); the VQ-VAE tensors (``vqmodel.*``) are not read here."""
    from adtbench.models.hf_checkpoint import check_lm_shapes, tensor_reader

    config, files, shapes = open_emu3_checkpoint(path, key)
    arch = Emu3Arch.from_config(config.text_config)
    own = arch.hf_shapes()
    check_lm_shapes(shapes, own, path, key)
    return _assemble(arch, config, _fuse(arch, tensor_reader(files, device, canonical_key), dtype, None))


__all__ = ["Emu3Arch", "Emu3Block", "Emu3LM", "canonical_key", "lean_from_hf", "load_emu3_net", "open_emu3_checkpoint"]
