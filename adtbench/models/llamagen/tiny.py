"""Tiny random LlamaGen checkpoints in their real on-disk layouts (``adtbench make-tiny``).

``llamagen_t2i`` / ``llamagen_c2i``: ``t2i_XL_stage1_256.pt`` / ``c2i_B_384.pt`` (``layout=official``:
``{"model": sd}``; ``layout=bare``: the bare dict, as the FSDP releases; ``layout=lantern``: LANTERN's HF folder
``config.json`` + ``model.safetensors`` with Llama names), ``vq_ds16_{t2i,c2i}.pt`` (``{"model": sd}`` incl.
``codebook_used``), and for t2i a FLAN-T5 folder ``google/flan-t5-xl/``. The loaders these mirror:
``llamagen.gpt`` (official and LANTERN key layouts), ``llamagen.vq.load_llamagen_vq`` and ``t5``.
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
    spread_init,
    write_json,
    write_sidecar,
)

LAYOUTS = ("official", "bare", "lantern")


def tiny_vq_sidecar() -> dict[str, Any]:
    """The sidecar ``vq.config`` of the tiny LlamaGen VQ (the sizes a ``vq_ds16_*.pt`` file does not record)."""
    from adtbench.models.llamagen.vq import tiny_llamagen_vq_config

    vc = tiny_llamagen_vq_config()
    cfg: dict[str, Any] = {f: getattr(vc, f) for f in ("codebook_size", "codebook_embed_dim", "z_channels", "ch")}
    return cfg | {"ch_mult": list(vc.ch_mult), "num_res_blocks": vc.num_res_blocks}


def llamagen_arch(kind: str) -> dict[str, Any]:
    base = {"dim": 64, "n_layer": 2, "n_head": 4, "multiple_of": 32, "vocab_size": K_CODES, "block_size": GRID**2}
    if kind == "t2i":
        return {**base, "model_type": "t2i", "cls_token_num": 120, "caption_dim": 32}
    return {**base, "model_type": "c2i", "cls_token_num": 1, "num_classes": 10}


def official_to_lantern(sd: dict[str, torch.Tensor], n_head: int, n_kv: int, dim: int) -> dict[str, torch.Tensor]:
    """Official keys → LANTERN HF keys (inverse of ``llamagen.gpt.lantern_to_official``)."""
    out: dict[str, torch.Tensor] = {}
    hd = dim // n_head
    inv = {
        "attention.wo": "self_attn.o_proj",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    for k, t in sd.items():
        if k == "tok_embeddings.weight":
            out["model.embed_tokens.weight"] = t
        elif k.startswith("cls_embedding."):
            out["model." + k] = t
        elif k == "norm.weight":
            out["model.norm.weight"] = t
        elif k == "output.weight":
            out["lm_head.weight"] = t
        elif k.startswith("layers."):
            _, i, rest = k.split(".", 2)
            name = rest.rsplit(".", 1)[0]
            if name == "attention.wqkv":
                q, kk, v = t.split([n_head * hd, n_kv * hd, n_kv * hd], dim=0)
                for part, w in (("q", q), ("k", kk), ("v", v)):
                    out[f"model.layers.{i}.self_attn.{part}_proj.weight"] = w.clone()
            else:
                out[f"model.layers.{i}.{inv[name]}.weight"] = t
        else:
            raise ValueError(k)
    return out


def write_t5_tiny(out: Path, seed: int, dim: int) -> None:
    """A one-layer FLAN-T5 encoder folder (``T5EncoderModel`` + fast tokenizer) of width ``dim``."""
    from tokenizers.processors import TemplateProcessing
    from transformers import T5Config, T5EncoderModel

    ids = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{c: 3 + j for j, c in enumerate(CHARS)}}
    config = T5Config(
        vocab_size=len(ids), d_model=dim, d_kv=8, d_ff=64, num_layers=1, num_heads=4, feed_forward_proj="gated-gelu"
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        enc = T5EncoderModel(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    enc.save_pretrained(str(out))
    tok = char_tokenizer(ids, "<unk>", specials=["<pad>", "</s>"])
    tok.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    save_fast_tokenizer(tok, out, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def write_llamagen_tiny(out: Path, seed: int, kind: str, layout: str) -> dict[str, Any]:
    """Write the tiny ``llamagen_{kind}`` folder in ``layout``; returns the in-memory reference modules."""
    from safetensors.torch import save_file

    from adtbench.io import atomic_torch_save
    from adtbench.models.llamagen.gpt import GPTConfig, LlamaGenGPT
    from adtbench.models.llamagen.vq import make_tiny_llamagen_vq, save_llamagen_vq

    arch = llamagen_arch(kind)
    cfg = GPTConfig(**arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gpt = LlamaGenGPT(cfg).eval()
    spread_init(gpt, seed)
    if kind == "t2i":
        with torch.no_grad():
            gpt.cls_embedding.uncond_embedding.copy_(
                torch.randn(gpt.cls_embedding.uncond_embedding.shape, generator=torch.Generator().manual_seed(seed + 3))
            )
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().clone() for k, v in gpt.state_dict().items()}
    name = "t2i_XL_stage1_256.pt" if kind == "t2i" else "c2i_B_384.pt"
    side: dict[str, Any] = {"gpt_model": None, "image_size": None, "arch": arch}
    if layout == "official":
        atomic_torch_save({"model": sd}, out / name)
    elif layout == "bare":
        atomic_torch_save(sd, out / name)
    elif layout == "lantern":
        hf = official_to_lantern(sd, cfg.n_head, cfg.kv_heads, cfg.dim)
        save_file({k: v.contiguous() for k, v in hf.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
        write_json(
            out / "config.json",
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": cfg.dim,
                "intermediate_size": cfg.ffn_hidden,
                "num_hidden_layers": cfg.n_layer,
                "num_attention_heads": cfg.n_head,
                "num_key_value_heads": cfg.kv_heads,
                "rms_norm_eps": cfg.norm_eps,
                "vocab_size": cfg.vocab_size,
                "block_size": cfg.block_size,
                "cls_token_num": cfg.cls_token_num,
                "input_type": kind,
                "caption_dim": cfg.caption_dim,
                "num_classes": cfg.num_classes,
                "rope_base": cfg.rope_base,
                "class_dropout_p": 0.1,
                "token_dropout_p": 0.1,
            },
        )
        side = {"checkpoint": None}
    else:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    vq = make_tiny_llamagen_vq(seed + 1)
    vq_name = "vq_ds16_t2i.pt" if kind == "t2i" else "vq_ds16_c2i.pt"
    save_llamagen_vq(vq, out / vq_name)
    side["vq"] = {"config": tiny_vq_sidecar()}
    if kind == "t2i":
        write_t5_tiny(out / "google" / "flan-t5-xl", seed + 2, cfg.caption_dim)
    write_sidecar(out, f"llamagen_{kind}", side)
    return {"gpt": gpt, "vq": vq}


# ---------------------------------------------------------------------------------------------------------


def write_tiny_t2i(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=llamagen_t2i [layout=...]``."""
    return write_llamagen_tiny(out, seed, "t2i", layout)


def write_tiny_c2i(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=llamagen_c2i [layout=...]``."""
    return write_llamagen_tiny(out, seed, "c2i", layout)


__all__ = [
    "LAYOUTS",
    "llamagen_arch",
    "official_to_lantern",
    "tiny_vq_sidecar",
    "write_llamagen_tiny",
    "write_t5_tiny",
    "write_tiny_c2i",
    "write_tiny_t2i",
]
