"""``adtbench make-tiny model=<family> out=DIR [seed=N] [layout=...]``: tiny random checkpoints in real layouts.

Each writer produces a folder that the family's real loader reads exactly as it reads the full-size release
(same file names, wrappers, key names, config fields and traps), scaled down to CPU-millisecond sizes
(models.md §6.3). Facts the real files do not carry (architecture sizes of the tiny nets, the grid, VQ
hyper-parameters) go into the ``adtbench.json`` sidecar (``registry`` conventions). A ``README.txt`` says what the
folder is. Then ``python run.py model=<family> model.path=DIR policy=eagle2`` runs end to end.

Families and layouts:

- ``anole``: ``leloy/Anole-7b-v0.1-hf`` layout — ``config.json`` (``ChameleonForConditionalGeneration``,
  ``vocabulary_map``), sharded ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` with
  q/k-norms ``(heads, head_dim)`` and ``model.vqmodel.*`` encoder weights, a fast tokenizer, and Meta's
  ``tokenizer/vqgan.ckpt`` (``{"state_dict": …}``) + ``tokenizer/vqgan.yaml``.
- ``lumina_mgpt``: ``Alpha-VLLM/Lumina-mGPT-7B-768`` layout — ``ChameleonXLLMXForConditionalGeneration``
  config with ``mask_image_logits``/``dropout``/``z_loss_weight``, q/k-norms saved as ``(1, head_dim)``, no
  ``model.vqmodel.*``, EOL and size tokens in the vocabulary; same VQGAN files.
- ``llamagen_t2i`` / ``llamagen_c2i``: ``t2i_XL_stage1_256.pt`` / ``c2i_B_384.pt`` (``layout=official``:
  ``{"model": sd}``; ``layout=bare``: the bare dict, as the FSDP releases; ``layout=lantern``: LANTERN's HF
  folder ``config.json`` + ``model.safetensors`` with Llama names), ``vq_ds16_{t2i,c2i}.pt``
  (``{"model": sd}`` incl. ``codebook_used``), and for t2i a FLAN-T5 folder ``google/flan-t5-xl/``.
- ``tar``: ``csuhan/Tar-1.5B`` layout (``model_type: llava_qwen``, ids in ``config.json``, tied embeddings,
  extra ``model.vision_tower.*`` weights, Qwen chat template), ``ta_tok.pth`` (``{"model": {"args", "sd"}}``),
  ``ar_dtok_lp_256px.pth`` / ``ar_dtok_lp_512px.pth`` (``{"model": {"name", "args", "sd"}}``; 4×4 and 8×8 code
  grids) and ``vq_ds16_t2i.pt``.
"""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

FAMILIES = ("anole", "lumina_mgpt", "llamagen_t2i", "llamagen_c2i", "tar")
LAYOUTS = ("official", "bare", "lantern")
CHARS = string.ascii_lowercase + string.digits + " .,:'-\n"  # the tiny tokenizers' character vocabulary

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
GRID = 4  # tiny image grid (Anole 32, Lumina 48, LlamaGen 16/32)
K_CODES = 64  # tiny VQ codebooks


# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------


def spread_init(module: nn.Module, seed: int, head_names: tuple[str, ...] = ("lm_head", "output")) -> None:
    """Seeded N(0, 1/fan_in) linears (heads ×2), N(0, 1) embeddings, zero biases: non-degenerate logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in module.named_modules():
            if isinstance(mod, nn.Linear):
                std = mod.in_features**-0.5 * (2.0 if name.split(".")[-1] in head_names else 1.0)
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * std)
                if mod.bias is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.Embedding):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen))


def char_tokenizer(
    ids: dict[str, int], unk: str, specials: list[str] | None = None, added: dict[str, int] | None = None
) -> Any:
    """A lower-casing character-level fast tokenizer: ``ids`` maps characters (and specials) to token ids.

    ``added``: extra whole tokens (e.g. ``<im_start>``) matched before the character split.
    """
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = dict(ids)
    for name, i in (added or {}).items():
        vocab[name] = i
    used = set(vocab.values())
    vocab |= {f"<unused{i}>": i for i in range(max(used)) if i not in used}  # no holes in the id range
    tok = Tokenizer(WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials or []])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in (added or {})])
    return tok


def save_fast_tokenizer(tok: Any, out: Path, **kwargs: Any) -> None:
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs).save_pretrained(str(out))


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def run_command(family: str, out: Path) -> str:
    """The command that runs a tiny checkpoint (c2i prompts are class ids: the tiny model has 10 classes)."""
    extra = " dataset=inline dataset.text=3" if family == "llamagen_c2i" else ""
    return f"python run.py model={family} model.path={out} policy=eagle2{extra}"


def write_sidecar(out: Path, family: str, model: dict[str, Any]) -> None:
    from adtbench.models.registry import SIDECAR

    write_json(out / SIDECAR, {"family": family, "model": model})
    (out / "README.txt").write_text(
        f"Tiny RANDOM {family} checkpoint written by `adtbench make-tiny` (real on-disk layout, toy sizes).\n"
        f"It generates noise: use it to smoke-test loading and decoding, never for results.\n"
        f"Run: {run_command(family, out)}\n"
    )


def save_sharded_safetensors(sd: dict[str, torch.Tensor], out: Path, shards: int) -> None:
    """``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` (HF sharded layout)."""
    from safetensors.torch import save_file

    keys = sorted(sd)
    per = -(-len(keys) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k].contiguous() for k in keys[i * per : (i + 1) * per]}
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
        total += sum(t.numel() * t.element_size() for t in part.values())
    write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


# ---------------------------------------------------------------------------------------------------------
# Chameleon family
# ---------------------------------------------------------------------------------------------------------


def _chameleon(out: Path, seed: int, lumina: bool) -> dict[str, Any]:
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from adtbench.models.chameleon import tiny_vocabulary_map
    from adtbench.models.lumina import lumina_extra_names
    from adtbench.models.vq_taming import make_tiny_taming_vq, save_taming_vqgan

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
    lo = max(i for n, i in vm.items() if not n.startswith("<reserved9")) + 1
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


# ---------------------------------------------------------------------------------------------------------
# LlamaGen
# ---------------------------------------------------------------------------------------------------------


def llamagen_arch(kind: str) -> dict[str, Any]:
    base = {"dim": 64, "n_layer": 2, "n_head": 4, "multiple_of": 32, "vocab_size": K_CODES, "block_size": GRID**2}
    if kind == "t2i":
        return {**base, "model_type": "t2i", "cls_token_num": 120, "caption_dim": 32}
    return {**base, "model_type": "c2i", "cls_token_num": 1, "num_classes": 10}


def official_to_lantern(sd: dict[str, torch.Tensor], n_head: int, n_kv: int, dim: int) -> dict[str, torch.Tensor]:
    """Official keys → LANTERN HF keys (inverse of ``llamagen_gpt.lantern_to_official``)."""
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


def _t5(out: Path, seed: int, dim: int) -> None:
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


def _llamagen(out: Path, seed: int, kind: str, layout: str) -> dict[str, Any]:
    from safetensors.torch import save_file

    from adtbench.models.llamagen_gpt import GPTConfig, LlamaGenGPT
    from adtbench.models.vq_common import atomic_torch_save
    from adtbench.models.vq_llamagen import make_tiny_llamagen_vq, save_llamagen_vq, tiny_llamagen_vq_config

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
    vc = tiny_llamagen_vq_config()
    side["vq"] = {"config": {f: getattr(vc, f) for f in ("codebook_size", "codebook_embed_dim", "z_channels", "ch")}}
    side["vq"]["config"] |= {"ch_mult": list(vc.ch_mult), "num_res_blocks": vc.num_res_blocks}
    if kind == "t2i":
        _t5(out / "google" / "flan-t5-xl", seed + 2, cfg.caption_dim)
    write_sidecar(out, f"llamagen_{kind}", side)
    return {"gpt": gpt, "vq": vq}


# ---------------------------------------------------------------------------------------------------------
# Tar
# ---------------------------------------------------------------------------------------------------------

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


def _tar(out: Path, seed: int) -> dict[str, Any]:
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from adtbench.models.tar_ardtok import ARDTok, ARDTokConfig, save_ardtok
    from adtbench.models.tar_tatok import TATokDecoder, save_tatok
    from adtbench.models.vq_llamagen import make_tiny_llamagen_vq, save_llamagen_vq, tiny_llamagen_vq_config

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
            dim=64, n_layer=2, n_head=4, multiple_of=32, cond_dim=32, vocab_size=K_CODES,
            cls_token_num=TAR_GRID**2, max_seq_len=g * g,
        )  # fmt: skip
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + px)
            net = ARDTok(c).eval()
        spread_init(net, seed + px)
        save_ardtok(net, out / f"ar_dtok_lp_{px}px.pth", name="llama-abs-tiny")
        detoks[px] = net
    vq = make_tiny_llamagen_vq(seed + 2)
    save_llamagen_vq(vq, out / "vq_ds16_t2i.pt")
    vc = tiny_llamagen_vq_config()
    vq_config = {f: getattr(vc, f) for f in ("codebook_size", "codebook_embed_dim", "z_channels", "ch")}
    vq_config |= {"ch_mult": list(vc.ch_mult), "num_res_blocks": vc.num_res_blocks}
    write_sidecar(
        out, "tar", {"base_grid": TAR_GRID, "tatok": {"decoder_config": dec_cfg}, "vq": {"config": vq_config}}
    )
    return {"lm": lm, "tatok": tatok, "detok": detoks, "vq": vq}


# ---------------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------------


def write_tiny(family: str, out: str | Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """Write the tiny checkpoint of ``family`` into ``out``; returns the in-memory reference modules."""
    out = Path(out)
    if family == "anole":
        return _chameleon(out, seed, lumina=False)
    if family == "lumina_mgpt":
        return _chameleon(out, seed, lumina=True)
    if family in ("llamagen_t2i", "llamagen_c2i"):
        return _llamagen(out, seed, family.split("_")[1], layout)
    if family == "tar":
        return _tar(out, seed)
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")


USAGE = (
    "usage: adtbench make-tiny model=<family> out=DIR [seed=N] [layout=official|bare|lantern]\n"
    f"  families: {', '.join(FAMILIES)} (layout applies to llamagen_*)"
)


def main(args: list[str]) -> int:
    """CLI: ``key=value`` arguments (``model``, ``out``, ``seed``, ``layout``); returns the exit code."""
    opts: dict[str, str] = {}
    for a in args:
        k, sep, v = a.partition("=")
        if not sep or k not in ("model", "out", "seed", "layout"):
            print(USAGE, file=sys.stderr)
            return 2
        opts[k] = v
    if "model" not in opts or "out" not in opts:
        print(USAGE, file=sys.stderr)
        return 2
    family, layout = opts["model"], opts.get("layout", "official")
    if family not in FAMILIES or layout not in LAYOUTS:
        print(f"adtbench: unknown model={family} or layout={layout}\n{USAGE}", file=sys.stderr)
        return 2
    out = Path(opts["out"]).expanduser().resolve()
    if out.exists() and any(out.iterdir()):
        print(f"adtbench: {out} exists and is not empty; choose a new folder", file=sys.stderr)
        return 2
    torch.set_num_threads(min(4, torch.get_num_threads()))
    write_tiny(family, out, int(opts.get("seed", 0)), layout)
    print(f"wrote tiny {family} ({layout}) to {out}\nrun: {run_command(family, out)}")
    return 0


__all__ = ["FAMILIES", "LAYOUTS", "main", "write_tiny"]
