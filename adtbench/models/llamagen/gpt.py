"""LlamaGen's GPT (FoundationVision/LlamaGen ``autoregressive/models/gpt.py``), re-implemented for tree decoding.

State-dict keys match the official ``.pt`` checkpoints: ``tok_embeddings``, ``cls_embedding.*``
(c2i ``embedding_table``; t2i ``cap_proj.fc1/fc2`` + buffer ``uncond_embedding``),
``layers.{i}.attention.{wqkv,wo}``, ``layers.{i}.feed_forward.{w1,w2,w3}``,
``layers.{i}.{attention_norm,ffn_norm}``, ``norm``, ``output``. Architecture facts: RMSNorm in fp32
(eps 1e-5), fused wqkv rows ``[q | k | v]``, SwiGLU hidden ``find_multiple(int(2·4·dim/3), multiple_of)``,
no biases, 2-D interleaved RoPE with all-zero rows for the ``cls_token_num`` condition positions.

Unlike the original, every forward takes explicit position ids and a 4-D mask (boolean, True = attend, or
additive float) over a static KV cache, so the same code runs prefill, AR steps and tree verification. The modules
are the reference (and the autograd path used by training); under ``no_grad`` ``forward_embeds`` runs the same
function through ``lean.decoder_layer`` with inference-only fused weights (``lean`` module docstring).

Checkpoints (``load_gpt_state_dict``): the official ``.pt`` files hold the weights under ``["model"]`` (DDP) or
as the bare state dict (FSDP: ``c2i_XXL_384.pt``, ``c2i_3B_384.pt``); ``"module"`` / ``"state_dict"`` wrappers
are accepted too. LANTERN's HF conversion (``jadohu/LlamaGen-T2I``: ``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``) uses Llama names with split q/k/v (not permuted: LlamaGen's interleaved RoPE is applied
to them as-is) and is mapped back by ``lantern_to_official``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adtbench.models.kv import StaticKVCache
from adtbench.models.lean import InferenceWeights, LayerWeights, additive_mask, fold_t, rms, stack_fn, stack_memo
from adtbench.models.rope import Rope2D, apply_rope, rotary


@dataclass
class GPTConfig:
    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    vocab_size: int = 16384
    block_size: int = 256  # image tokens (grid²)
    cls_token_num: int = 1
    model_type: str = "c2i"  # "c2i" (class label) or "t2i" (caption features)
    num_classes: int = 1000
    caption_dim: int = 2048
    intermediate_size: int | None = None  # explicit SwiGLU width (LANTERN configs); None = LlamaGen's rule

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_hidden(self) -> int:
        if self.intermediate_size is not None:
            return int(self.intermediate_size)
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @property
    def grid(self) -> int:
        g = round(self.block_size**0.5)
        if g * g != self.block_size:
            raise ValueError(f"block_size {self.block_size} is not a square grid")
        return g


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x · rsqrt(mean(x²) + eps) · weight``; half types normalise in fp32, cast back, then scale (LlamaGen)."""
        return rms(x, self.eps, self.weight)


class LabelEmbedder(nn.Module):
    """Class-label condition; row ``num_classes`` is the null (CFG) class."""

    def __init__(self, num_classes: int, dim: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)


class CaptionMLP(nn.Module):
    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """Caption features → model width; ``uncond_embedding`` is the learned CFG null caption."""

    def __init__(self, caption_dim: int, dim: int, token_num: int) -> None:
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim**0.5)

    def forward(self, captions: torch.Tensor) -> torch.Tensor:
        return self.cap_proj(captions)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv, self.hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        mask: torch.Tensor,
        cache: StaticKVCache,
        layer: int,
        start: int,
    ) -> torch.Tensor:
        R, n, _ = x.shape
        q, k, v = self.wqkv(x).split([self.n_head * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = q.view(R, n, self.n_head, self.hd).transpose(1, 2)
        k = k.view(R, n, self.n_kv, self.hd).transpose(1, 2)
        if cos is not None:  # None: no rotary embedding (absolute-PE models such as Tar's AR-DTok)
            q = apply_rope(q, cos, sin, "interleaved")
            k = apply_rope(k, cos, sin, "interleaved")
        v = v.view(R, n, self.n_kv, self.hd).transpose(1, 2)
        k_all, v_all = cache.write(layer, start, k, v)
        if self.n_kv != self.n_head:
            k_all = k_all.repeat_interleave(self.n_head // self.n_kv, dim=1)
            v_all = v_all.repeat_interleave(self.n_head // self.n_kv, dim=1)
        out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(R, n, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x, cos, sin, mask, cache, layer, start):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, cache, layer, start)
        return h + self.feed_forward(self.ffn_norm(h))

    def inference_weights(self) -> LayerWeights:
        """This block in ``lean.decoder_layer`` form (norm weights folded into wqkv and w1|w3)."""
        a, f = self.attention, self.feed_forward
        up = torch.cat([f.w1.weight, f.w3.weight], 0)
        return LayerWeights(
            qkv=fold_t(a.wqkv.weight, self.attention_norm.weight),
            qkv_bias=None,
            o=fold_t(a.wo.weight),
            up=fold_t(up, self.ffn_norm.weight),
            down=fold_t(f.w2.weight),
            heads=a.n_head,
            kv_heads=a.n_kv,
            head_dim=a.hd,
            norm_in=True,
            eps_in=self.attention_norm.eps,
            eps_ffn=self.ffn_norm.eps,
        )


def blocks_inference_weights(net: nn.Module) -> tuple[list[LayerWeights], torch.Tensor, float]:
    """``run_blocks``'s inference form of ``net.layers`` and ``net.norm``: (layer weights, norm weight, eps)."""
    return [b.inference_weights() for b in net.layers], net.norm.weight.detach(), net.norm.eps


def run_blocks(
    net: nn.Module,
    x: torch.Tensor,
    rope: Rope2D | None,
    pos: torch.Tensor,
    mask: torch.Tensor,
    cache: StaticKVCache,
    start: int | torch.Tensor,
) -> torch.Tensor:
    """``net.layers`` (``Block``s) then ``net.norm`` over ``x [R, n, D]`` → post-norm features ``[R, n, D]``.

    The mask is made additive once. With grad enabled: the reference modules; otherwise ``lean.decoder_layer``
    with ``net.inference_weights()`` (the same function up to float rounding).
    """
    mask = additive_mask(mask, x.dtype)
    if torch.is_grad_enabled():
        cos, sin = rope.cos_sin(pos, x.dtype) if rope is not None else (None, None)
        for i, layer in enumerate(net.layers):
            x = layer(x, cos, sin, mask, cache, i, start)
        return net.norm(x)
    layers, norm_w, eps = net.inference_weights()
    rot = None
    if rope is not None:
        w0 = layers[0]
        rot = rotary(rope, pos, x.dtype, w0.heads + w0.kv_heads, w0.kv_heads)
    return stack_fn(net)(layers, norm_w, eps, x, rot, mask, cache, start, memo=stack_memo(net))


class LlamaGenGPT(InferenceWeights, nn.Module):
    """LlamaGen's ``Transformer`` (inference only, explicit masks/positions)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.model_type == "c2i":
            self.cls_embedding: nn.Module = LabelEmbedder(cfg.num_classes, cfg.dim)
        elif cfg.model_type == "t2i":
            self.cls_embedding = CaptionEmbedder(cfg.caption_dim, cfg.dim, cfg.cls_token_num)
        else:
            raise ValueError(f"model_type must be 'c2i' or 't2i', got {cfg.model_type!r}")
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.rope = Rope2D(cfg.head_dim, cfg.grid, cfg.cls_token_num, cfg.rope_base)

    def new_cache(self, rows: int, capacity: int) -> StaticKVCache:
        p = self.output.weight
        return StaticKVCache(self.cfg.n_layer, rows, self.cfg.kv_heads, capacity, self.cfg.head_dim, p.dtype, p.device)

    def _build_inference_weights(self) -> tuple[list[LayerWeights], torch.Tensor, float]:
        return blocks_inference_weights(self)

    def forward_embeds(
        self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, start: int | torch.Tensor
    ) -> torch.Tensor:
        """Input embeddings ``[R, n, dim]`` at positions ``[R, n]`` → features ``[R, n, dim]`` (post-norm).

        ``mask [R, 1, n, start + n]``: boolean (True = attend) or additive float in x's dtype (``run_blocks``).
        """
        return run_blocks(self, x, self.rope, pos, mask, cache, start)


# ---------------------------------------------------------------------------------------------------------
# Presets and checkpoint loading
# ---------------------------------------------------------------------------------------------------------

# ``GPT_models`` of ``autoregressive/models/gpt.py``: (n_layer, n_head, dim)
PRESETS: dict[str, tuple[int, int, int]] = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-3B": (24, 32, 3200),
}


def preset_config(name: str, **overrides: Any) -> GPTConfig:
    """``GPTConfig`` of a LlamaGen size preset (``GPT-B`` … ``GPT-3B``) plus ``overrides``."""
    if name not in PRESETS:
        raise ValueError(f"unknown LlamaGen model {name!r}; choose one of {sorted(PRESETS)}")
    n_layer, n_head, dim = PRESETS[name]
    return GPTConfig(**{"n_layer": n_layer, "n_head": n_head, "dim": dim, **overrides})


def config_from_lantern(config: Mapping[str, Any]) -> GPTConfig:
    """``GPTConfig`` from a LANTERN HF ``config.json`` (Llama names + ``input_type``/``block_size``/…)."""
    model_type = str(config.get("input_type", config.get("model_type_llamagen", "t2i")))
    if model_type not in ("t2i", "c2i"):
        raise ValueError(f"config.json input_type must be t2i or c2i, got {model_type!r}")
    return GPTConfig(
        dim=int(config["hidden_size"]),
        n_layer=int(config["num_hidden_layers"]),
        n_head=int(config["num_attention_heads"]),
        n_kv_head=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        intermediate_size=int(config["intermediate_size"]),
        norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        rope_base=float(config.get("rope_base", 10000.0)),
        vocab_size=int(config["vocab_size"]),
        block_size=int(config["block_size"]),
        cls_token_num=int(config.get("cls_token_num", 120 if model_type == "t2i" else 1)),
        model_type=model_type,
        num_classes=int(config.get("num_classes", 1000)),
        caption_dim=int(config.get("caption_dim", 2048)),
    )


_LANTERN_LAYER = {
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}


def lantern_to_official(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LANTERN HF keys → official keys (q/k/v rows concatenated into ``wqkv`` as ``[q | k | v]``).

    ``model.embed_tokens`` → ``tok_embeddings``, ``model.cls_embedding.*`` → ``cls_embedding.*``,
    ``model.layers.i.self_attn.{q,k,v}_proj`` → ``layers.i.attention.wqkv``, ``o_proj`` → ``wo``,
    ``mlp.{gate,up,down}_proj`` → ``feed_forward.{w1,w3,w2}``, ``{input,post_attention}_layernorm`` →
    ``{attention,ffn}_norm``, ``model.norm`` → ``norm``, ``lm_head`` → ``output``. Unknown keys raise.
    """
    out: dict[str, torch.Tensor] = {}
    qkv: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in sd.items():
        if key == "model.embed_tokens.weight":
            out["tok_embeddings.weight"] = t
        elif key.startswith("model.cls_embedding."):
            out[key[len("model.") :]] = t
        elif key == "model.norm.weight":
            out["norm.weight"] = t
        elif key == "lm_head.weight":
            out["output.weight"] = t
        elif key.startswith("model.layers."):
            i_str, rest = key[len("model.layers.") :].split(".", 1)
            i, name = int(i_str), rest.rsplit(".", 1)[0]
            if name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                qkv.setdefault(i, {})[name[-6]] = t
            elif name in _LANTERN_LAYER and rest.endswith(".weight"):
                out[f"layers.{i}.{_LANTERN_LAYER[name]}.weight"] = t
            else:
                raise ValueError(f"unexpected LANTERN LlamaGen key {key!r}")
        elif key.endswith("freqs_cis") or key.endswith("rotary_emb.inv_freq"):
            continue  # derived tables, never weights
        else:
            raise ValueError(f"unexpected LANTERN LlamaGen key {key!r}")
    for i, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise ValueError(f"layer {i}: q/k/v projections incomplete ({sorted(parts)})")
        out[f"layers.{i}.attention.wqkv.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def _read_lantern_dir(path: Path) -> dict[str, torch.Tensor]:
    """Every weight of a LANTERN HF folder (``WeightsError``, a ``ValueError``, names a corrupt file)."""
    from adtbench.io import read_safetensors, read_torch

    shards = sorted(path.glob("*.safetensors"))
    if shards:
        sd: dict[str, torch.Tensor] = {}
        for f in shards:
            sd.update(read_safetensors(f))
        return sd
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"{path}: no *.safetensors or pytorch_model*.bin weights next to config.json")
    sd = {}
    for f in bins:
        sd.update(read_torch(f))
    return sd


def load_gpt_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], GPTConfig | None]:
    """Official-key state dict from a LlamaGen checkpoint, and the ``GPTConfig`` when the file carries one.

    ``path``: an official ``.pt``/``.pth``/``.bin`` file (``["model"]``, ``["module"]``, ``["state_dict"]`` or a
    bare dict; ``torch.load(weights_only=True)``), a ``.safetensors`` file, or a LANTERN HF folder
    (``config.json`` + weights) — the latter also returns its ``GPTConfig``.
    """
    from adtbench.io import load_checkpoint
    from adtbench.models.vq_common import unwrap_state_dict

    p = Path(path)
    if p.is_dir():
        cfg_file = p / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{p}: no config.json (LANTERN HF layout) — pass the .pt file instead")
        config = config_from_lantern(json.loads(cfg_file.read_text()))
        return lantern_to_official(_read_lantern_dir(p)), config
    if p.suffix == ".safetensors":
        from adtbench.io import read_safetensors

        sd: dict[str, torch.Tensor] = read_safetensors(p)
    else:
        sd = unwrap_state_dict(load_checkpoint(p), p, ("model", "module", "state_dict"))
    if any(k.startswith("model.layers.") for k in sd):
        raise ValueError(f"{p}: LANTERN HF keys; point model.path at the folder holding its config.json")
    return dict(sd), None


def load_gpt(sd: Mapping[str, torch.Tensor], config: GPTConfig, source: str = "checkpoint") -> LlamaGenGPT:
    """Build ``LlamaGenGPT(config)`` on the meta device and assign ``sd`` into it.

    Every model key must be present with the model's shape (raises ``ValueError`` naming ``source`` and the
    offending keys); checkpoint keys the model lacks (e.g. a training-time ``freqs_cis``) are ignored.
    """
    with torch.device("meta"):
        gpt = LlamaGenGPT(config)
    own = gpt.state_dict()
    missing = sorted(k for k in own if k not in sd)
    bad = sorted(
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)
    )
    if missing or bad:
        raise ValueError(
            f"{source}: does not match the configured LlamaGen architecture; missing keys {missing[:6]}; "
            f"shape mismatches {bad[:6]}"
        )
    gpt.load_state_dict({k: sd[k] for k in own}, strict=True, assign=True)
    return gpt.eval()


def gpt_config_fields() -> set[str]:
    return {f.name for f in fields(GPTConfig)}
