"""A tiny random Emu3-Gen checkpoint in the ``BAAI/Emu3-Gen-hf`` on-disk layout (``adtbench make-tiny model=emu3``).

What the folder holds, as the hub repository does: ``config.json`` (``Emu3ForConditionalGeneration``: ``text_config``,
``vq_config``, the ``vocabulary_map``), ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` written
by transformers' ``save_pretrained`` (the hub's key spelling: ``text_model.model.*``, ``text_model.lm_head.weight``,
``vqmodel.*``), the byte-level BPE tokenizer files (``tokenizer.json``, ``vocab.json``, ``merges.txt``,
``tokenizer_config.json``, ``special_tokens_map.json``; BOS ``<|extra_203|>``, EOS ``<|extra_204|>``, pad
``<|endoftext|>``), ``preprocessor_config.json`` (``Emu3ImageProcessor``), and the ``adtbench.json`` sidecar (the
4 × 4 grid). Sizes: 256 byte tokens + Emu3's 211 specials + 64 visual tokens = 531 ids; 2 layers, hidden 64, 4 query
heads over 2 K/V heads (GQA, as the 8B model's 32 over 8), RoPE θ = 1e6; a tiny ``Emu3VQVAE`` (spatial ×8: 32 px).

The loaders this mirrors: ``emu3.lean.load_emu3_net``, ``emu3.target.load_emu3_vq`` and transformers'
``Emu3ForConditionalGeneration.from_pretrained`` (``model.impl=hf``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from adtbench.models.tiny_common import GRID, K_CODES, spread_init, write_json, write_sidecar

EMU3_TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-5,
    "attention_dropout": 0.0,
}


def byte_tokens() -> list[str]:
    """The 256 byte-level BPE base symbols (GPT-2's byte → unicode map, in byte order): the tiny text vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def tiny_emu3(seed: int) -> Any:
    """The tiny ``Emu3ForConditionalGeneration`` of ``seed`` (same arguments, same weights): spread-out LM weights
    (``tiny_common.spread_init``), non-trivial RMSNorm weights, a seeded VQ-VAE."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from adtbench.models.emu3.target import emu3_vocabulary_map, tiny_vq_config

    vm = emu3_vocabulary_map(byte_tokens(), K_CODES)
    text = EMU3_TEXT | {
        "vocab_size": len(vm),
        "pad_token_id": vm["<|endoftext|>"],
        "bos_token_id": vm["<|extra_203|>"],
        "eos_token_id": vm["<|extra_204|>"],
    }
    config = Emu3Config(text_config=text, vq_config=tiny_vq_config(K_CODES), vocabulary_map=vm)  # type: ignore[arg-type]
    config.architectures = ["Emu3ForConditionalGeneration"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Emu3ForConditionalGeneration(config).eval()
    spread_init(model.model.text_model, seed)
    spread_init(model.lm_head, seed + 3, head_names=("",))
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for name, p in model.model.text_model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    return model


def write_tokenizer(out: Path, vm: dict[str, int]) -> None:
    """The byte-level BPE tokenizer over the 256 byte symbols (no merges) with Emu3's specials, saved as
    ``GPT2TokenizerFast`` (the files the hub repository holds)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2TokenizerFast

    from adtbench.models.emu3.target import SPECIAL_NAMES, VISUAL_PREFIX

    text = {n: i for n, i in vm.items() if i < vm["<|endoftext|>"]}
    tok = Tokenizer(models.BPE(vocab=text, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = sorted((n for n in vm if vm[n] >= vm["<|endoftext|>"]), key=vm.__getitem__)
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in specials])
    if any(tok.token_to_id(n) != vm[n] for n in specials if not n.startswith(VISUAL_PREFIX)):
        raise ValueError("tokenizer ids disagree with the vocabulary map")
    fast = GPT2TokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_NAMES["bos"],
        eos_token=SPECIAL_NAMES["eos"],
        pad_token=SPECIAL_NAMES["pad"],
        extra_special_tokens={
            "boi_token": SPECIAL_NAMES["boi"],
            "eoi_token": SPECIAL_NAMES["eoi"],
            "image_wrapper_token": SPECIAL_NAMES["img"],
            "eof_token": SPECIAL_NAMES["eof"],
        },
    )
    fast.save_pretrained(str(out))
    # the slow-tokenizer files the hub repository also holds (transformers 5 no longer writes them for a fast one)
    if not (out / "vocab.json").is_file():
        write_json(out / "vocab.json", vm)
    if not (out / "merges.txt").is_file():
        (out / "merges.txt").write_text("#version: 0.2\n")
    if not (out / "special_tokens_map.json").is_file():
        names = {"bos_token": "bos", "eos_token": "eos", "pad_token": "pad"}
        write_json(out / "special_tokens_map.json", {k: SPECIAL_NAMES[v] for k, v in names.items()})


def write_tiny(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=emu3`` (one layout: ``layout`` is ignored): the folder of the module docstring; returns
    ``{"model": the in-memory Emu3ForConditionalGeneration, "vocabulary_map": …}``."""
    from transformers import Emu3ImageProcessor

    model = tiny_emu3(seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), max_shard_size="300KB", safe_serialization=True)
    vm = dict(model.config.vocabulary_map)
    write_tokenizer(out, vm)
    Emu3ImageProcessor(spatial_factor=8).save_pretrained(str(out))
    write_sidecar(out, "emu3", {"grid": [GRID, GRID]})
    if not (out / "model.safetensors.index.json").is_file():
        raise RuntimeError("save_pretrained wrote one shard: the tiny Emu3 checkpoint must be sharded")
    return {"model": model, "vocabulary_map": vm}


__all__ = ["EMU3_TEXT", "byte_tokens", "tiny_emu3", "write_tiny", "write_tokenizer"]
