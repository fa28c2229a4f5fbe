"""Tiny random Janus-Pro checkpoint in the HF-converted layout (``adtbench make-tiny model=janus_pro``).

The ``deepseek-community/Janus-Pro-1B`` / ``-7B`` layout, written by transformers' own ``save_pretrained`` from a
seeded ``JanusForConditionalGeneration`` at toy sizes: ``config.json`` (``JanusConfig``: ``text_config`` a Llama,
``vision_config``, ``vq_config`` — the VQ's config lives there, as in the release), ``generation_config.json``
(``bos_token_id``, ``pad_token_id``, ``generation_kwargs.boi_token_id``: what ``generate`` reads), sharded
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` with the real key names (the vision encoder,
``model.vqmodel.*``, ``model.generation_*``, ``model.language_model.*``, ``lm_head``), and the processor files
``JanusProcessor.save_pretrained`` writes (``tokenizer.json`` / ``tokenizer_config.json`` of a ``LlamaTokenizerFast``
with the Janus special tokens ``<｜begin▁of▁sentence｜>``, ``<｜▁pad▁｜>``, ``<begin_of_image>``, ``<end_of_image>``,
``<image_placeholder>``; ``preprocessor_config.json``, ``processor_config.json``, the chat template). The text
tokenizer is character-level over a 64-id vocabulary (``tiny_common.char_tokenizer``).

Sizes: LM width 64, 2 layers, 4 heads; 64 codes of dimension 8; a 4 × 4 grid (``vision_config.num_image_tokens`` 16,
so ``generate`` makes 16 tokens); the VQ decoder upsamples ×4 (three levels): 16 × 16 px. The loader this mirrors:
``janus.target.build_target`` (``janus.lean.load_janus_net``, ``janus.vq.load_janus_vq``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from adtbench.models.tiny_common import CHARS, GRID, K_CODES, char_tokenizer, write_sidecar

SPECIALS = {  # the real Janus-Pro token names (ids are the tiny vocabulary's)
    "bos": "<｜begin▁of▁sentence｜>",
    "eos": "<｜end▁of▁sentence｜>",
    "pad": "<｜▁pad▁｜>",
    "boi": "<begin_of_image>",
    "eoi": "<end_of_image>",
    "image": "<image_placeholder>",
    "unk": "<unk>",
}
TEXT_VOCAB = 64
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}<|User|>: {% else %}<|Assistant|>: {% endif %}"
    "{% for content in message['content'] %}{% if content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}\n\n{% endfor %}{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
)


def tiny_janus_config() -> Any:
    """The tiny ``JanusConfig`` (module docstring)."""
    from transformers import JanusConfig

    D = 64
    return JanusConfig(
        text_config={
            "model_type": "llama",
            "vocab_size": TEXT_VOCAB,
            "hidden_size": D,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": 256,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 2,
        },
        vision_config={
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
            "projection_dim": D,
            "depth": 2,
            "num_image_tokens": GRID * GRID,
            "mlp_ratio": 2.0,
        },
        vq_config={
            "embed_dim": 8,
            "num_embeddings": K_CODES,
            "num_patches": GRID,
            "latent_channels": 32,
            "base_channels": 32,
            "channel_multiplier": [1, 1, 2],
            "num_res_blocks": 1,
            "projection_dim": D,
            "image_token_embed_dim": D,
            "num_hidden_layers": 2,
        },
        image_token_id=5,
    )


def tiny_tokenizer_ids() -> dict[str, int]:
    """Token → id of the tiny text vocabulary: the specials at 0 … 6 (bos, eos, pad, boi, eoi, image, unk), then one
    id per character (``CHARS`` and ``<|>``)."""
    ids = {name: i for i, name in enumerate(SPECIALS.values())}
    for c in CHARS + "<|>":
        ids.setdefault(c, len(ids))
    if len(ids) > TEXT_VOCAB:
        raise ValueError(f"tiny text vocabulary too small: {len(ids)} > {TEXT_VOCAB}")
    return ids


def tiny_janus(seed: int) -> Any:
    """The seeded tiny ``JanusForConditionalGeneration`` (linears N(0, 1/fan_in), the generation head ×2, embeddings
    N(0, 1): logits spread over a few units; ``hf_causal.spread_init_``) with its ``generation_config``."""
    from transformers import GenerationConfig, JanusForConditionalGeneration

    from adtbench.models.hf_causal import spread_init_

    config = tiny_janus_config()
    config.architectures = ["JanusForConditionalGeneration"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = JanusForConditionalGeneration(config).eval()
    spread_init_(model, seed, 2.0, ("vision_head",))
    ids = tiny_tokenizer_ids()
    model.generation_config = GenerationConfig(
        bos_token_id=ids[SPECIALS["bos"]],
        eos_token_id=ids[SPECIALS["eos"]],
        pad_token_id=ids[SPECIALS["pad"]],
        generation_kwargs={"boi_token_id": ids[SPECIALS["boi"]]},
    )
    return model


def write_tiny(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=janus_pro`` (one layout: ``layout`` is ignored); returns ``{"model": the reference
    JanusForConditionalGeneration}``."""
    from transformers import JanusImageProcessor, JanusProcessor, LlamaTokenizerFast

    model = tiny_janus(seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), max_shard_size="1MB", safe_serialization=True)
    ids = tiny_tokenizer_ids()
    s = SPECIALS
    tok = char_tokenizer(ids, s["unk"], specials=list(s.values()))
    fast = LlamaTokenizerFast(
        tokenizer_object=tok,
        bos_token=s["bos"],
        eos_token=s["eos"],
        pad_token=s["pad"],
        unk_token=s["unk"],
        add_bos_token=True,
        add_eos_token=False,
        extra_special_tokens={"image_token": s["image"], "boi_token": s["boi"], "eoi_token": s["eoi"]},
    )
    size = model.config.vision_config.image_size
    processor = JanusProcessor(
        image_processor=JanusImageProcessor(size={"height": size, "width": size}),
        tokenizer=fast,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out))
    write_sidecar(out, "janus_pro", {})  # every fact is in the checkpoint's files (the grid: num_image_tokens)
    return {"model": model}


__all__ = ["CHAT_TEMPLATE", "SPECIALS", "tiny_janus", "tiny_janus_config", "tiny_tokenizer_ids", "write_tiny"]
