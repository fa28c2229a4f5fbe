"""Tiny random Tar checkpoint in its real on-disk layout (``adtbench make-tiny model=tar``).

``csuhan/Tar-1.5B`` layout (``model_type: llava_qwen``, ids in ``config.json``, tied embeddings, extra
``model.vision_tower.*`` weights, Qwen chat template), ``ta_tok.pth`` (``{"model": {"args", "sd"}}``),
``ar_dtok_lp_256px.pth`` / ``ar_dtok_lp_512px.pth`` (``{"model": {"name", "args", "sd"}}``; 4×4 and 8×8 code
grids) and ``vq_ds16_t2i.pt``. The loaders these mirror: ``tar.target.build_target``, ``tar.tatok.load_tatok``,
``tar.ardtok.load_ardtok`` and ``llamagen.vq.load_llamagen_vq``.
"""

from __future__ import annotations

import json
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

TAR_TEXT = 100  # tiny text ids 0..99 (Qwen specials at 97..99)
TAR_GRID = 3  # tiny LM grid (27 real)
QWEN_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tar_ids() -> dict[str, int]:
    t = TAR_TEXT
    return {
        "image_start_tag_id": t,
        "image_end_tag_id": t + 1,
        "scale_start_token_id": t + 2,
        "scale_end_token_id": t + 4,
        "image_start_token_id": t + 5,
        "image_end_token_id": t + 5 + K_CODES - 1,
        "num_image_tokens": K_CODES,
    }


def write_tiny(out: Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """``make-tiny model=tar`` (one layout: ``layout`` is ignored); returns the in-memory reference modules."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from adtbench.models.llamagen.tiny import tiny_vq_sidecar
    from adtbench.models.llamagen.vq import make_tiny_llamagen_vq, save_llamagen_vq
    from adtbench.models.tar.ardtok import ARDTok, ARDTokConfig, save_ardtok
    from adtbench.models.tar.tatok import TATokDecoder, save_tatok

    ids = tar_ids()
    vocab = ids["image_end_token_id"] + 1
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = Qwen2ForCausalLM(config).eval()
    spread_init(lm, seed)
    with torch.no_grad():  # q/k/v biases on (Qwen2): make them non-zero
        gen = torch.Generator().manual_seed(seed + 5)
        for name, p in lm.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    out.mkdir(parents=True, exist_ok=True)
    lm.save_pretrained(str(out))
    # LLaVA-style extras: config fields and vision-tower weights the LM ignores
    cfg = json.loads((out / "config.json").read_text())
    cfg |= ids | {
        "model_type": "llava_qwen",
        "architectures": ["LlavaQwenForCausalLM"],
        "mm_vision_tower": "google/siglip2-so400m-patch14-384",
        "mm_projector_type": "mlp2x_gelu",
        "mm_hidden_size": 1152,
    }
    write_json(out / "config.json", cfg)
    weights = load_file(str(out / "model.safetensors"))
    weights["model.vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    # tokenizer: characters → text ids, Qwen specials, then the added Tar tokens at their config ids
    chars = {c: j for j, c in enumerate(CHARS)}
    specials = {"<|im_start|>": TAR_TEXT - 3, "<|im_end|>": TAR_TEXT - 2, "<|endoftext|>": TAR_TEXT - 1}
    added = {"<im_start>": ids["image_start_tag_id"], "<im_end>": ids["image_end_tag_id"]}
    added |= {f"<S{i}>": ids["scale_start_token_id"] + i for i in range(3)}
    added |= {f"<I{c}>": ids["image_start_token_id"] + c for c in range(K_CODES)}
    tok = char_tokenizer({**chars, **specials}, "<|endoftext|>", specials=list(specials), added=added)
    save_fast_tokenizer(tok, out, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=QWEN_TEMPLATE)
    # TA-Tok (decode path + a few encoder-side keys the loader must ignore)
    dec_cfg = {"num_attention_heads": 2, "intermediate_size": 64, "num_patches": 16}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        tatok = TATokDecoder(K_CODES, 16, 32, True, {"num_hidden_layers": 1, **dec_cfg}).eval()
    save_tatok(tatok, out / "ta_tok.pth")
    obj = torch.load(out / "ta_tok.pth", weights_only=True)
    obj["model"]["sd"] |= {
        "encode_task_layer.0.weight": torch.zeros(32, 32),
        "bottleneck.in_linear.weight": torch.zeros(16, 32),
    }
    torch.save(obj, out / "ta_tok.pth")
    # AR-DTok at two resolutions (4×4 "256 px", 8×8 "512 px"); LlamaGen VQ (codebook = AR-DTok vocab)
    detoks = {}
    for px, g in ((256, GRID), (512, 2 * GRID)):
        c = ARDTokConfig(
            dim=64,
            n_layer=2,
            n_head=4,
            multiple_of=32,
            cond_dim=32,
            vocab_size=K_CODES,
            cls_token_num=TAR_GRID**2,
            max_seq_len=g * g,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + px)
            net = ARDTok(c).eval()
        spread_init(net, seed + px)
        save_ardtok(net, out / f"ar_dtok_lp_{px}px.pth", name="llama-abs-tiny")
        detoks[px] = net
    vq = make_tiny_llamagen_vq(seed + 2)
    save_llamagen_vq(vq, out / "vq_ds16_t2i.pt")
    vq_config = tiny_vq_sidecar()
    write_sidecar(
        out, "tar", {"base_grid": TAR_GRID, "tatok": {"decoder_config": dec_cfg}, "vq": {"config": vq_config}}
    )
    return {"lm": lm, "tatok": tatok, "detok": detoks, "vq": vq}


__all__ = ["QWEN_TEMPLATE", "TAR_GRID", "TAR_TEXT", "tar_ids", "write_tiny"]
