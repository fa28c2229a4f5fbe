"""Tiny random Anole / Lumina-mGPT checkpoints in their real on-disk layouts (``adtbench make-tiny``).

- ``anole``: ``leloy/Anole-7b-v0.1-hf`` layout — ``config.json`` (``ChameleonForConditionalGeneration``,
  ``vocabulary_map``), sharded ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` with
  q/k-norms ``(heads, head_dim)`` and ``model.vqmodel.*`` encoder weights, a fast tokenizer, and Meta's
  ``tokenizer/vqgan.ckpt`` (``{"state_dict": …}``) + ``tokenizer/vqgan.yaml``.
- ``lumina_mgpt``: ``Alpha-VLLM/Lumina-mGPT-7B-768`` layout — ``ChameleonXLLMXForConditionalGeneration``
  config with ``mask_image_logits``/``dropout``/``z_loss_weight``, q/k-norms saved as ``(1, head_dim)``, no
  ``model.vqmodel.*``, EOL and size tokens in the vocabulary; same VQGAN files.

The loaders these mirror: ``hf_checkpoint.load_chameleon_lm`` and ``chameleon.vq.load_taming_vqgan``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from adtbench.models.tiny_common import (
    CHARS,
    GRID,
    K_CODES,
    char_tokenizer,
    save_fast_tokenizer,
    save_sharded_safetensors,
    spread_init,
    write_json,
    write_sidecar,
)

# tiny Chameleon (models.md §6.3)
CHAMELEON_ARCH: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "vq_config": {
        "embed_dim": 8,
        "num_embeddings": 64,
        "latent_channels": 32,
        "base_channels": 32,
        "channel_multiplier": [1, 2],
        "resolution": 16,
        "attn_resolutions": [],
    },
}


def write_chameleon_tiny(out: Path, seed: int, lumina: bool) -> dict[str, Any]:
    """Write the tiny Anole (``lumina=False``) or Lumina-mGPT folder; returns the in-memory reference modules."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from adtbench.models.chameleon.lumina import lumina_extra_names
    from adtbench.models.chameleon.target import FILLER_PREFIX, tiny_vocabulary_map
    from adtbench.models.chameleon.vq import make_tiny_taming_vq, save_taming_vqgan

    extra = lumina_extra_names((GRID, GRID)) if lumina else ()
    vm = tiny_vocabulary_map(CHAMELEON_ARCH["vocab_size"], K_CODES, extra)
    config = ChameleonConfig(**CHAMELEON_ARCH, vocabulary_map=vm)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = ChameleonForConditionalGeneration(config).eval()
    spread_init(lm, seed)
    if lumina:  # Lumina stores one q/k-norm vector per layer: make every head share it (non-trivially)
        gen = torch.Generator().manual_seed(seed + 7)
        with torch.no_grad():
            for name, p in lm.named_parameters():
                if ".q_norm." in name or ".k_norm." in name:
                    p.copy_((1.0 + 0.5 * torch.randn(p.shape[1:], generator=gen)).expand_as(p))
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    cfg_dict = config.to_dict()
    if lumina:
        sd = {k: (v[:1].clone() if (".q_norm." in k or ".k_norm." in k) else v) for k, v in sd.items()}
        sd = {k: v for k, v in sd.items() if not k.startswith("model.vqmodel.")}
        cfg_dict |= {
            "architectures": ["ChameleonXLLMXForConditionalGeneration"],
            "mask_image_logits": False,
            "dropout": 0.05,
            "z_loss_weight": 1e-5,
            "rope_theta": 10000.0,
        }
    else:
        cfg_dict["architectures"] = ["ChameleonForConditionalGeneration"]
    write_json(out / "config.json", cfg_dict)
    save_sharded_safetensors(sd, out, 2 if lumina else 3)
    # text tokenizer over the filler ids (characters), Chameleon specials by name
    lo = max(i for n, i in vm.items() if not n.startswith(FILLER_PREFIX)) + 1
    chars = {c: lo + j for j, c in enumerate(CHARS)}
    if lo + len(CHARS) > CHAMELEON_ARCH["vocab_size"]:
        raise ValueError("tiny vocabulary too small for the character tokenizer")
    tok = char_tokenizer({**chars, "<unk>": vm["<unk>"], "<s>": vm["<s>"], "</s>": vm["</s>"]}, "<unk>")
    save_fast_tokenizer(tok, out, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    vq = make_tiny_taming_vq(seed + 1)
    save_taming_vqgan(vq, out / "tokenizer" / "vqgan.ckpt", out / "tokenizer" / "vqgan.yaml")
    family = "lumina_mgpt" if lumina else "anole"
    write_sidecar(out, family, {"grid": [GRID, GRID]})
    return {"lm": lm, "vq": vq, "vocabulary_map": vm}


def write_tiny_anole(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=anole`` (one layout: ``layout`` is ignored)."""
    return write_chameleon_tiny(out, seed, lumina=False)


def write_tiny_lumina(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=lumina_mgpt`` (one layout: ``layout`` is ignored)."""
    return write_chameleon_tiny(out, seed, lumina=True)


__all__ = ["CHAMELEON_ARCH", "write_chameleon_tiny", "write_tiny_anole", "write_tiny_lumina"]
