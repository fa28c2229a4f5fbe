"""Janus-Pro's generation path on the project's lean stack: a static-cache Llama and the image-token modules.

``JanusLM`` computes the function of transformers' ``JanusForConditionalGeneration`` (4.57) as its ``generate``
runs it for images:

- prompt positions: ``x = language_model.embed_tokens(text ids)``;
- generated positions: ``x = generation_aligner(generation_embeddings(code))`` — ``Embedding(K, e)`` (K = 16384,
  e = 8) then the aligner MLP ``fc1 → [GELU → Linear] × (n − 1)`` (``JanusVQVAEAlignerMLP``) into the LM width D;
- the Llama decoder (per layer, ``x`` the residual stream):

      h  = x + o(SDPA(rope(q), rope(k), v; mask)),  q|k|v = RMSNorm(x)·W_qkvᵀ
      x' = h + down(silu(gate) ⊙ up),               gate|up = RMSNorm(h)·W_13ᵀ

  then the final RMSNorm: the features (EAGLE's ``f_t``, transformers' ``last_hidden_state``);
- raw logits over the K codes from the generation head ``vision_head(GELU(proj_out(f)))`` (``JanusVQVAEHead``),
  never the text ``lm_head``.

So the token space of generation is the VQ code space itself: token id = code (``TokenLayout`` offset 0,
vocabulary K), no end-of-line or end-of-image tokens. ``tok_embeddings`` (``GenerationEmbedder``) and ``output``
(``GenerationHead``) are what ``StaticGPTTarget`` drives; ``text_embeddings`` embeds the prompt.

Numerics (float32 equals transformers to float rounding): RMSNorm statistics in float32 (``lean.rms``,
``NORM_DTYPE``), the norm weights folded into the following products; RoPE with the checkpoint's θ, HF's
``rotate_half`` pairing stored interleaved (``lean.interleave_pairs`` on the q and k rows: no attention score
changes), tables in float32; SDPA with an additive 0/−inf mask, scale ``head_dim^-½``; GELU exact (erf), as
``ACT2FN["gelu"]``.

Loading: ``load_janus_net`` reads the HF folder (``config.json`` + safetensors shards, the
``deepseek-community/Janus-Pro-*`` layout) tensor by tensor onto the device, after checking every tensor it needs
is present with its config's shape; ``lean_from_hf`` converts an in-memory ``JanusForConditionalGeneration``.
Architectures this module does not implement (biases, RoPE scaling, another activation) are a ``ConfigError`` on
``model.impl``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adtbench.errors import ConfigError
from adtbench.models.chameleon.lean import ChameleonLM
from adtbench.models.lean import (
    FusedBlock,
    assemble,
    frozen,
    fuse_llama_layer,
    llama_layer_shapes,
)
from adtbench.models.rope import Rope1D

NORM_DTYPE = torch.float32  # HF's Llama RMSNorm and rotary tables are float32 whatever the model dtype
LM = "model.language_model."  # key prefix of the Llama decoder in the HF Janus layout
GEN = "model.generation_"  # key prefix of the generation embedding, aligner and head


@dataclass(frozen=True)
class JanusArch:
    """The sizes ``JanusLM`` needs, read from a ``JanusConfig`` (its ``text_config`` and ``vq_config``)."""

    vocab_size: int  # text vocabulary (prompt ids)
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    num_codes: int  # K: the generation head's width, the generation embedding's rows
    code_dim: int  # e: the generation embedding's width
    projection_dim: int  # the aligner's and head's inner width
    aligner_layers: int  # Linear layers of the aligner MLP (vq_config.num_hidden_layers)

    @classmethod
    def from_config(cls, config: Any, key: str = "model.impl") -> JanusArch:
        """Sizes of a ``JanusConfig``; a feature the lean path does not implement is a ``ConfigError`` on ``key``."""
        from adtbench.models.chameleon.lean import _rope_scaled
        from adtbench.models.hf_causal import _rope_theta

        t, vq = config.text_config, config.vq_config
        act, gen_act = getattr(t, "hidden_act", "silu"), getattr(vq, "hidden_act", "gelu")
        unsupported = [
            name
            for name, on in (
                ("attention_bias", bool(getattr(t, "attention_bias", False))),
                ("mlp_bias", bool(getattr(t, "mlp_bias", False))),
                ("rope_scaling", _rope_scaled(t)),
                (f"text_config.hidden_act={act}", act != "silu"),
                (f"vq_config.hidden_act={gen_act}", gen_act != "gelu"),
            )
            if on
        ]
        if unsupported:
            raise ConfigError(key, f"the lean Janus does not implement {unsupported}; use model.impl=hf")
        heads = int(t.num_attention_heads)
        head_dim = int(getattr(t, "head_dim", None) or int(t.hidden_size) // heads)
        if int(vq.image_token_embed_dim) != int(t.hidden_size):
            raise ConfigError(
                key, f"vq_config.image_token_embed_dim {vq.image_token_embed_dim} ≠ the LM width {t.hidden_size}"
            )
        return cls(
            vocab_size=int(t.vocab_size),
            hidden_size=int(t.hidden_size),
            intermediate_size=int(t.intermediate_size),
            num_layers=int(t.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=int(getattr(t, "num_key_value_heads", None) or heads),
            head_dim=head_dim,
            rms_norm_eps=float(t.rms_norm_eps),
            rope_theta=_rope_theta(t),
            num_codes=int(vq.num_embeddings),
            code_dim=int(vq.embed_dim),
            projection_dim=int(vq.projection_dim),
            aligner_layers=int(vq.num_hidden_layers),
        )

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF key → shape of every tensor this module reads (the vision encoder, its aligner, the VQ model and the
        text ``lm_head`` are not read)."""
        D, F_, hd, H, KV = self.hidden_size, self.intermediate_size, self.head_dim, self.num_heads, self.num_kv_heads
        K, e, P = self.num_codes, self.code_dim, self.projection_dim
        out: dict[str, tuple[int, ...]] = {
            LM + "embed_tokens.weight": (self.vocab_size, D),
            LM + "norm.weight": (D,),
            GEN + "embeddings.weight": (K, e),
            GEN + "aligner.fc1.weight": (P, e),
            GEN + "aligner.fc1.bias": (P,),
            GEN + "head.proj_out.weight": (P, D),
            GEN + "head.proj_out.bias": (P,),
            GEN + "head.vision_head.weight": (K, P),
            GEN + "head.vision_head.bias": (K,),
        }
        for j in range(self.aligner_layers - 1):
            out[GEN + f"aligner.hidden_layers.{j}.weight"] = (P, P)
            out[GEN + f"aligner.hidden_layers.{j}.bias"] = (P,)
        for i in range(self.num_layers):
            out |= llama_layer_shapes(LM + f"layers.{i}.", D, F_, H, KV, hd)
        return out


class GenerationEmbedder(nn.Module):
    """Code ids → LM inputs: ``Embedding(K, e)`` then the aligner ``fc1 → [GELU → Linear] × (n − 1)``
    (``JanusVQVAEAlignerMLP``), ``[..., D]``."""

    def __init__(self, a: JanusArch) -> None:
        super().__init__()
        self.embed = nn.Embedding(a.num_codes, a.code_dim)
        self.fc1 = nn.Linear(a.code_dim, a.projection_dim)
        self.hidden = nn.ModuleList(nn.Linear(a.projection_dim, a.projection_dim) for _ in range(a.aligner_layers - 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.fc1(self.embed(ids))
        for layer in self.hidden:
            h = layer(F.gelu(h))
        return h


class GenerationHead(nn.Module):
    """Features ``[..., D]`` → raw logits over the K codes: ``vision_head(GELU(proj_out(f)))`` (``JanusVQVAEHead``).
    ``bias`` is the last product's (``StaticGPTTarget.logits_head`` reads it: a head with a bias is computed
    whole)."""

    def __init__(self, a: JanusArch) -> None:
        super().__init__()
        self.proj_out = nn.Linear(a.hidden_size, a.projection_dim)
        self.vision_head = nn.Linear(a.projection_dim, a.num_codes)

    @property
    def bias(self) -> torch.Tensor:
        return self.vision_head.bias

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.vision_head(F.gelu(self.proj_out(features)))
        return logits


class LlamaBlock(FusedBlock):
    """One Llama decoder layer of Janus-Pro's LM in inference form: a ``FusedBlock`` (no q/k norm)."""

    def __init__(self, a: JanusArch) -> None:
        D, F_, H, KV, hd = a.hidden_size, a.intermediate_size, a.num_heads, a.num_kv_heads, a.head_dim
        super().__init__(D, F_, H, KV, hd, a.rms_norm_eps, NORM_DTYPE)


class JanusLM(ChameleonLM):
    """Janus-Pro's image-generation network (module docstring): ``text_embeddings``, ``tok_embeddings``
    (``GenerationEmbedder``: codes → D), ``layers`` (``LlamaBlock``), ``norm_weight``, ``output``
    (``GenerationHead``), ``rope``; ``config`` is the checkpoint's ``JanusConfig``.

    The interface ``StaticGPTTarget`` drives — ``tok_embeddings(ids)``, ``output(features)``, ``forward_embeds(x, pos,
    mask, cache, start)``, ``new_cache(rows, capacity)`` and the rotary tables — is ``chameleon.lean.ChameleonLM``'s
    (the same stack, cache and rotary numerics over plain Llama layers); only the embeddings and the head differ.
    Inference only."""

    def __init__(self, arch: JanusArch, config: Any = None) -> None:
        nn.Module.__init__(self)
        self.arch, self.config = arch, config
        self.text_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.tok_embeddings = GenerationEmbedder(arch)
        self.layers = nn.ModuleList(LlamaBlock(arch) for _ in range(arch.num_layers))
        self.norm_weight = frozen(arch.hidden_size)
        self.output = GenerationHead(arch)
        self.rope = Rope1D(arch.head_dim, arch.rope_theta, "interleaved")  # HF's frequencies; pairs: ``wqkv``'s order
        self.requires_grad_(False)


# ---------------------------------------------------------------------------------------------------------
# Building the inference weights from HF-layout tensors
# ---------------------------------------------------------------------------------------------------------


def _fuse(
    arch: JanusArch,
    get: Callable[[str], torch.Tensor],
    dtype: torch.dtype,
    layer_done: Callable[[int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """``JanusLM`` state dict from HF-layout tensors (``get(key)`` → tensor on the target device, any dtype), every
    tensor cast to ``dtype`` first; layer by layer, ``layer_done(i)`` after layer i is fused."""
    H, KV, hd = arch.num_heads, arch.num_kv_heads, arch.head_dim

    def t(key: str) -> torch.Tensor:
        return get(key).to(dtype)

    sd: dict[str, torch.Tensor] = {}
    for i in range(arch.num_layers):
        sd |= fuse_llama_layer(t, LM + f"layers.{i}.", f"layers.{i}.", H, KV, hd)
        if layer_done is not None:
            layer_done(i)
    sd["norm_weight"] = t(LM + "norm.weight")
    sd["text_embeddings.weight"] = t(LM + "embed_tokens.weight")
    sd["tok_embeddings.embed.weight"] = t(GEN + "embeddings.weight")
    for part in ("weight", "bias"):
        sd[f"tok_embeddings.fc1.{part}"] = t(GEN + f"aligner.fc1.{part}")
        for j in range(arch.aligner_layers - 1):
            sd[f"tok_embeddings.hidden.{j}.{part}"] = t(GEN + f"aligner.hidden_layers.{j}.{part}")
        sd[f"output.proj_out.{part}"] = t(GEN + f"head.proj_out.{part}")
        sd[f"output.vision_head.{part}"] = t(GEN + f"head.vision_head.{part}")
    return sd


def _assemble(arch: JanusArch, config: Any, sd: dict[str, torch.Tensor]) -> JanusLM:
    net: JanusLM = assemble(JanusLM, arch, config, sd)
    return net


def lean_from_hf(model: nn.Module) -> JanusLM:
    """The lean form of an in-memory ``JanusForConditionalGeneration`` (its weights are read, not moved: ``model``
    stays usable, the reference of the tests)."""
    config = model.config
    arch = JanusArch.from_config(config)
    sd = model.state_dict()
    return _assemble(arch, config, _fuse(arch, lambda k: sd[k].detach().clone(), next(model.parameters()).dtype))


def open_janus_checkpoint(path: Path, key: str = "model.path") -> tuple[Any, list[Path], dict[str, tuple[int, ...]]]:
    """``(JanusConfig, shard files, tensor name → shape)`` of an HF Janus folder; no tensor is read.

    Checks (``ConfigError(key, …)``): a ``config.json`` of ``model_type`` janus, at least one safetensors shard (the
    index's shards all present), each structurally whole (``io.check_weights``)."""
    import json

    from transformers import JanusConfig

    from adtbench.io import check_weights
    from adtbench.models.hf_checkpoint import checkpoint_shapes, safetensors_files

    cfg_file = path / "config.json"
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(key, f"{cfg_file}: unreadable config.json ({e})") from e
    if raw.get("model_type") != "janus":
        raise ConfigError(
            key,
            f"{cfg_file}: model_type {raw.get('model_type')!r}, expected 'janus' (an HF-converted Janus-Pro folder)",
        )
    config = JanusConfig.from_pretrained(str(path))
    files = safetensors_files(path)
    if not files:
        raise ConfigError(key, f"{path} holds no *.safetensors weights")
    for f in files:
        check_weights(key, f)
    return config, files, checkpoint_shapes(files)


def load_janus_net(path: Path, dtype: torch.dtype, device: torch.device, key: str = "model.path") -> JanusLM:
    """``JanusLM`` from an HF Janus folder (``config.json`` + ``model.safetensors`` or shards + index), read tensor by
    tensor onto ``device``. Every tensor ``JanusArch.hf_shapes`` names must be present with that shape (a
    ``ConfigError`` on ``key`` before any tensor is read); others (the vision encoder, the VQ model, ``lm_head``)
    are not read."""
    from adtbench.models.hf_checkpoint import check_lm_shapes, tensor_reader

    config, files, shapes = open_janus_checkpoint(path, key)
    arch = JanusArch.from_config(config)
    own = arch.hf_shapes()
    check_lm_shapes(shapes, own, path, key)
    return _assemble(arch, config, _fuse(arch, tensor_reader(files, device), dtype))


__all__ = [
    "GenerationEmbedder",
    "GenerationHead",
    "JanusArch",
    "JanusLM",
    "LlamaBlock",
    "lean_from_hf",
    "load_janus_net",
    "open_janus_checkpoint",
]
