"""Tiny random Anole / Lumina-mGPT checkpoints in their real on-disk layouts (``adtbench make-tiny``).

- ``anole``: ``leloy/Anole-7b-v0.1-hf`` layout — ``config.json`` (``ChameleonForConditionalGeneration``,
  ``vocabulary_map``), sharded ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` with
  q/k-norms ``(heads, head_dim)`` and ``model.vqmodel.*`` encoder weights, a fast tokenizer, and Meta's
  ``tokenizer/vqgan.ckpt`` (``{"state_dict": …}``) + ``tokenizer/vqgan.yaml``.
- ``lumina_mgpt``: ``Alpha-VLLM/Lumina-mGPT-7B-768`` layout — ``ChameleonXLLMXForConditionalGeneration``
  config with ``mask_image_logits``/``dropout``/``z_loss_weight``, q/k-norms saved as ``(1, head_dim)``, no
  ``model.vqmodel.*``, EOL and size tokens in the vocabulary; same VQGAN files.

- ``anole_drafter`` / ``lumina_mgpt_drafter``: LANTERN's drafters as published (``jadohu/anole_drafter``):
  ``config.json`` (a one-layer ``ChameleonConfig``) + ``pytorch_model.bin`` with LANTERN's key names, float32, the
  embedding a copy of the tiny target's; Lumina-mGPT's q/k norms ``(1, head_dim)``.

The loaders these mirror: ``hf_checkpoint.load_chameleon_lm``, ``chameleon.vq.load_taming_vqgan`` and
``harness.drafters.read_drafter``.
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


def tiny_chameleon_lm(seed: int, lumina: bool) -> tuple[Any, dict[str, int]]:
    """The tiny Anole / Lumina-mGPT ``ChameleonForConditionalGeneration`` of ``seed`` and its vocabulary map (what
    ``write_chameleon_tiny`` saves; the same arguments give the same weights)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from adtbench.models.chameleon.lumina import lumina_extra_names
    from adtbench.models.chameleon.target import tiny_vocabulary_map

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
    return lm, vm


def write_chameleon_tiny(out: Path, seed: int, lumina: bool) -> dict[str, Any]:
    """Write the tiny Anole (``lumina=False``) or Lumina-mGPT folder; returns the in-memory reference modules."""
    from adtbench.models.chameleon.target import FILLER_PREFIX
    from adtbench.models.chameleon.vq import make_tiny_taming_vq, save_taming_vqgan

    lm, vm = tiny_chameleon_lm(seed, lumina)
    config = lm.config
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


def lantern_drafter_config(lumina: bool) -> dict[str, Any]:
    """A tiny LANTERN drafter ``config.json``, shaped like LANTERN's ``data/configs/{anole,lumina_mgpt}_config.json``
    (a ``ChameleonConfig`` with ``num_hidden_layers`` 1; Lumina-mGPT's adds ``dropout``) at the tiny sizes; the
    special-token ids and ``vq_config``, which no drafter loader reads, are left out."""
    a = CHAMELEON_ARCH
    cfg: dict[str, Any] = {
        "architectures": ["ChameleonForConditionalGeneration"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": a["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": a["intermediate_size"],
        "max_position_embeddings": a["max_position_embeddings"],
        "mlp_bias": False,
        "model_parallel_size": 1,
        "model_type": "chameleon",
        "num_attention_heads": a["num_attention_heads"],
        "num_hidden_layers": 1,
        "num_key_value_heads": a["num_key_value_heads"],
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "swin_norm": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",  # as published (the base model's; the tensors themselves are float32)
        "use_cache": True,
        "vocab_size": a["vocab_size"],
    }
    if lumina:
        cfg["dropout"] = 0.05
    return cfg


def _target_embedding(target: Path) -> torch.Tensor:
    """``model.embed_tokens.weight`` of a Chameleon checkpoint folder (sharded or single safetensors)."""
    import json

    from safetensors import safe_open

    index = target / "model.safetensors.index.json"
    name = "model.embed_tokens.weight"
    if index.is_file():
        file = target / json.loads(index.read_text())["weight_map"][name]
    elif (target / "model.safetensors").is_file():
        file = target / "model.safetensors"
    else:
        raise ValueError(f"target={target}: no model.safetensors(.index.json) of a Chameleon checkpoint")
    with safe_open(str(file), framework="pt") as f:
        emb: torch.Tensor = f.get_tensor(name)
    return emb


def write_lantern_drafter_tiny(out: Path, seed: int, lumina: bool, target: Path | None = None) -> dict[str, Any]:
    """A tiny random LANTERN drafter in its published layout (``cnets_anole`` / ``cnets_lumina_mgpt``): ``config.json``
    (``lantern_drafter_config``) + ``pytorch_model.bin`` (``torch.save`` of the state dict, float32 — what LANTERN's
    training saves: fp32 master weights, the embedding copied with ``.float()``). Keys ``embed_tokens.weight`` (a
    copy of the tiny target's embedding: ``target``'s folder, else the tiny target of the same ``seed``),
    ``fc.{weight,bias}``, and layer 0 = a transformers ``ChameleonDecoderLayer`` (LANTERN's is its copy) with
    non-trivial norms; Lumina-mGPT's q/k norms stored ``[1, head_dim]`` (``model_parallel_size`` 1). Returns
    ``{"state": …, "config": …}`` (the written tensors)."""
    from transformers import ChameleonConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer

    config = lantern_drafter_config(lumina)
    hf = ChameleonConfig(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 11)
        layer = ChameleonDecoderLayer(hf, 0)
        fc = torch.nn.Linear(2 * hf.hidden_size, hf.hidden_size, bias=True)
    spread_init(layer, seed + 11)
    spread_init(fc, seed + 12)
    gen = torch.Generator().manual_seed(seed + 13)
    state: dict[str, torch.Tensor] = {}
    emb = tiny_chameleon_lm(seed, lumina)[0].model.embed_tokens.weight if target is None else _target_embedding(target)
    state["embed_tokens.weight"] = emb.detach().float().clone()
    state["fc.weight"] = fc.weight.detach().clone()
    state["fc.bias"] = 0.1 * torch.randn(hf.hidden_size, generator=gen)
    for k, v in layer.state_dict().items():
        v = v.detach().float().clone()
        if k.endswith("layernorm.weight"):
            v = 1.0 + 0.2 * torch.randn(v.shape, generator=gen)
        elif ".q_norm." in k or ".k_norm." in k:
            shape = (1, v.shape[1]) if lumina else tuple(v.shape)  # Lumina: one row shared by every head
            v = (1.0 if k.endswith("weight") else 0.0) + 0.3 * torch.randn(shape, generator=gen)
        state[f"layers.0.{k}"] = v
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    torch.save(state, out / "pytorch_model.bin")
    family = "lumina_mgpt" if lumina else "anole"
    (out / "README.txt").write_text(
        f"Tiny RANDOM LANTERN {family} drafter written by `adtbench make-tiny` (LANTERN's published layout: "
        "config.json + pytorch_model.bin, toy sizes).\nIt drafts noise: use it to smoke-test loading and decoding.\n"
        f"Run: python run.py model={family} model.path=<tiny {family} folder> drafter.path={out} policy=adt "
        "lantern=on\n"
    )
    return {"state": state, "config": config}


def write_tiny_anole(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=anole`` (one layout: ``layout`` is ignored)."""
    return write_chameleon_tiny(out, seed, lumina=False)


def write_tiny_lumina(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=lumina_mgpt`` (one layout: ``layout`` is ignored)."""
    return write_chameleon_tiny(out, seed, lumina=True)


def write_tiny_anole_drafter(
    out: Path, seed: int = 0, layout: str = "official", target: Path | None = None
) -> dict[str, Any]:
    """``make-tiny model=anole_drafter [target=DIR]`` (LANTERN's ``jadohu/anole_drafter`` layout)."""
    return write_lantern_drafter_tiny(out, seed, lumina=False, target=target)


def write_tiny_lumina_drafter(
    out: Path, seed: int = 0, layout: str = "official", target: Path | None = None
) -> dict[str, Any]:
    """``make-tiny model=lumina_mgpt_drafter [target=DIR]`` (LANTERN's ``cnets_lumina_mgpt`` layout)."""
    return write_lantern_drafter_tiny(out, seed, lumina=True, target=target)


__all__ = [
    "CHAMELEON_ARCH",
    "lantern_drafter_config",
    "tiny_chameleon_lm",
    "write_chameleon_tiny",
    "write_lantern_drafter_tiny",
    "write_tiny_anole",
    "write_tiny_anole_drafter",
    "write_tiny_lumina",
    "write_tiny_lumina_drafter",
]
