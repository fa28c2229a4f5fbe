"""Tar's AR de-tokenizer (AR-DTok, ``tok/ar_dtok/ar_model.py`` ``ARModel``) and its ``Target``.

A LlamaGen-like GPT (RMSNorm, fused ``wqkv``, SwiGLU, no biases) with **learned absolute position
embeddings** ``abs_pe [1, max_seq_len + cls_token_num − 1, dim]`` added to the input, **no RoPE**, and a
``clip_cond`` prefix: the ``cls_token_num`` TA-Tok features (``cond_dim`` = 1152) enter through ``clip_proj``
(Linear with bias). Sequence position = index: condition token i at i, image token k at ``cls_token_num + k``
(the last image token is never fed, hence the −1). Outputs LlamaGen VQ-16 codes (vocab 16384, token id =
code): 16×16 at 256 px, 32×32 at 512 px, 64×64 at 1024 px. ``cls_token_num`` = the LM grid (729 for ``<S0>``;
the official scripts set ``ar_model.cls_token_num = gen_seq_len``).

Checkpoint ``ar_dtok_lp_{256,512,1024}px.pth`` = ``{"model": {"name": "llama-abs-LP", "args": {...}, "sd":
{...}}}`` (``models.make`` spec; ``args`` are ``ModelArgs`` fields). Keys: ``clip_proj.{weight,bias}``,
``tok_embeddings``, ``layers.{i}.attention.{wqkv,wo}``, ``layers.{i}.feed_forward.{w1,w2,w3}``,
``layers.{i}.{attention_norm,ffn_norm}``, ``norm``, ``output``, ``abs_pe``.

CFG (official ``generate``): batched, uncond = all-zero features (so its prefix is ``clip_proj``'s bias),
mixed ``u + s·(c − u)``; defaults CFG 4.0, T 1.0, top-k 0, top-p 1.0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from adtbench.layout import TokenLayout
from adtbench.models.base import PrefillResult, PromptInputs, StaticGPTTarget
from adtbench.models.kv import StaticKVCache
from adtbench.models.lean import InferenceWeights, LayerWeights
from adtbench.models.llamagen.gpt import Block, GPTConfig, RMSNorm, blocks_inference_weights, run_blocks
from adtbench.models.rope import Rope, Rope1D

# ``llama-abs-*`` presets: (n_layer, n_head, dim)
PRESETS: dict[str, tuple[int, int, int]] = {
    "llama-abs-S": (12, 6, 384),
    "llama-abs-B": (12, 12, 768),
    "llama-abs-L": (24, 16, 1024),
    "llama-abs-LP": (30, 20, 1280),
    "llama-abs-XL": (36, 20, 1280),
    "llama-abs-XXL": (48, 24, 1536),
    "llama-abs-XXXL": (48, 40, 2560),
}


@dataclass
class ARDTokConfig:
    """The ``ModelArgs`` fields AR-DTok inference depends on (defaults = the official dataclass)."""

    dim: int = 1280
    n_layer: int = 30
    n_head: int = 20
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    model_type: str = "clip_cond"
    cond_dim: int = 1152
    vocab_size: int = 16384
    cls_token_num: int = 729
    max_seq_len: int = 256

    @property
    def grid(self) -> int:
        g = round(self.max_seq_len**0.5)
        if g * g != self.max_seq_len:
            raise ValueError(f"max_seq_len {self.max_seq_len} is not a square grid")
        return g

    def gpt(self) -> GPTConfig:
        """The equivalent ``GPTConfig`` for the shared transformer blocks."""
        return GPTConfig(
            dim=self.dim,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_kv_head=self.n_kv_head,
            multiple_of=self.multiple_of,
            ffn_dim_multiplier=self.ffn_dim_multiplier,
            norm_eps=self.norm_eps,
            vocab_size=self.vocab_size,
            block_size=self.max_seq_len,
            cls_token_num=self.cls_token_num,
        )

    @classmethod
    def from_spec(cls, name: str, args: Mapping[str, Any]) -> ARDTokConfig:
        """From a ``models.make`` spec: preset ``name`` sizes + ``args`` (unknown ``ModelArgs`` fields ignored)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in args.items() if k in known}
        if name in PRESETS:
            n_layer, n_head, dim = PRESETS[name]
            kw = {"n_layer": n_layer, "n_head": n_head, "dim": dim, **kw}
        elif not {"n_layer", "n_head", "dim"} <= set(kw):
            raise ValueError(f"unknown AR-DTok model {name!r} and no n_layer/n_head/dim in args")
        cfg = cls(**kw)
        if cfg.model_type != "clip_cond":
            raise ValueError(f"only clip_cond AR-DTok models are supported, got {cfg.model_type!r}")
        return cfg


class ARDTok(InferenceWeights, nn.Module):
    """AR-DTok inference network (module docstring); explicit positions, masks and a static KV cache."""

    def __init__(self, cfg: ARDTokConfig) -> None:
        super().__init__()
        self.cfg = cfg
        g = cfg.gpt()
        self.clip_proj = nn.Linear(cfg.cond_dim, cfg.dim)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(g) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.abs_pe = nn.Parameter(torch.randn(1, cfg.max_seq_len + cfg.cls_token_num - 1, cfg.dim) * 0.02)
        self.head_dim, self.kv_heads, self.ffn_hidden = g.head_dim, g.kv_heads, g.ffn_hidden

    def new_cache(self, rows: int, capacity: int) -> StaticKVCache:
        p = self.output.weight
        return StaticKVCache(self.cfg.n_layer, rows, self.kv_heads, capacity, self.head_dim, p.dtype, p.device)

    def forward_embeds(
        self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, start: int
    ) -> torch.Tensor:
        """Input embeddings ``[R, n, dim]`` at positions ``[R, n]`` → post-norm features ``[R, n, dim]``."""
        if int(pos.max()) >= self.abs_pe.shape[1]:
            raise IndexError(f"position {int(pos.max())} beyond the abs_pe table ({self.abs_pe.shape[1]})")
        x = x + self.abs_pe[0, pos].to(x.dtype)
        return run_blocks(self, x, None, pos, mask, cache, start)

    def _build_inference_weights(self) -> tuple[list[LayerWeights], torch.Tensor, float]:
        return blocks_inference_weights(self)


def load_ardtok(path: str | os.PathLike[str]) -> ARDTok:
    """Load ``ar_dtok_*.pth`` (``{"model": {"name", "args", "sd"}}``, ``weights_only=True``) strictly."""
    from adtbench.io import load_checkpoint

    obj = load_checkpoint(path)
    try:
        spec = obj["model"]
        name, args, sd = str(spec.get("name", "")), dict(spec.get("args") or {}), spec["sd"]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: expected {{'model': {{'name', 'args', 'sd'}}}} (an AR-DTok checkpoint)") from e
    cfg = ARDTokConfig.from_spec(name, args)
    with torch.device("meta"):
        model = ARDTok(cfg)
    own = model.state_dict()
    missing = sorted(k for k in own if k not in sd)
    bad = sorted(k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape))
    if missing or bad:
        raise ValueError(f"{path}: AR-DTok mismatch ({name}); missing {missing[:6]}; shape mismatches {bad[:6]}")
    model.load_state_dict({k: sd[k] for k in own}, strict=True, assign=True)
    return model.eval()


def save_ardtok(model: ARDTok, path: str | os.PathLike[str], name: str = "llama-abs-LP") -> None:
    """Write the official ``{"model": {"name", "args", "sd"}}`` layout (tiny checkpoints)."""
    from dataclasses import asdict

    from adtbench.io import atomic_torch_save

    args = asdict(model.cfg)
    if name in PRESETS:
        for k in ("n_layer", "n_head", "dim"):
            args.pop(k)
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    atomic_torch_save({"model": {"name": name, "args": args, "sd": sd}}, path)


class ARDTokTarget(StaticGPTTarget):
    """AR-DTok behind ``Target``: condition = TA-Tok features ``[cls_token_num, cond_dim]``; CFG row = zeros.

    ``encode_prompt(text, cfg)`` needs a ``feature_source(text) → [cls, cond_dim]`` (the Tar LM + TA-Tok, see
    ``adtbench.models.tar.target``); ``encode_features`` takes features directly.
    """

    def __init__(
        self,
        net: ARDTok,
        vq: Any,
        feature_source: Any = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.net = net.to(device=device, dtype=dtype).eval()
        self.vq = vq.to(device=device).eval() if vq is not None else None
        self.feature_source = feature_source
        self.device, self.dtype = torch.device(device), dtype
        c = net.cfg
        if self.vq is not None and self.vq.codebook_size != c.vocab_size:
            from adtbench.errors import ConfigError

            raise ConfigError("model.vq", f"VQ codebook {self.vq.codebook_size} ≠ AR-DTok vocabulary {c.vocab_size}")
        self.layout = TokenLayout(
            vocab_size=c.vocab_size, image_token_offset=0, num_codes=c.vocab_size, grid_h=c.grid, grid_w=c.grid
        )
        self.hidden_size, self.num_heads, self.num_kv_heads = c.dim, c.n_head, net.kv_heads
        self.head_dim, self.intermediate_size = net.head_dim, net.ffn_hidden
        self.cache: StaticKVCache | None = None

    def encode_features(self, text: str, features: torch.Tensor, cfg: bool) -> PromptInputs:
        c = self.net.cfg
        if tuple(features.shape) != (c.cls_token_num, c.cond_dim):
            raise ValueError(f"AR-DTok expects features [{c.cls_token_num}, {c.cond_dim}], got {tuple(features.shape)}")
        return PromptInputs(text=text, cfg=cfg, data={"features": features.detach().float().cpu()})

    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        if self.feature_source is None:
            raise RuntimeError("AR-DTok needs a feature source (the Tar LM + TA-Tok) to encode text prompts")
        return self.encode_features(text, self.feature_source(text), cfg)

    def prompt_length(self, inputs: PromptInputs) -> int:
        return self.net.cfg.cls_token_num

    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        feats_in = inputs.data["features"].to(self.device, self.dtype)[None]
        if inputs.cfg:
            feats_in = torch.cat([feats_in, torch.zeros_like(feats_in)])  # uncond = all-zero features
        x = self.net.clip_proj(feats_in)
        R, P, _ = x.shape
        self.cache = self.kv_cache(R, capacity)
        mask = torch.ones(P, P, dtype=torch.bool, device=self.device).tril()[None, None].expand(R, 1, P, P)
        pos = torch.arange(P, device=self.device)[None].expand(R, P)
        f = self.net.forward_embeds(x, pos, mask, self.cache, 0)
        valid = torch.ones(R, P, dtype=torch.bool, device=self.device)
        return PrefillResult(logits=self.net.output(f[:, -1]), features=f, input_embeds=x, positions=pos, valid=valid)

    def drafter_rope(self, head_dim: int) -> Rope:
        return Rope1D(head_dim)  # AR-DTok has no RoPE of its own; drafters trained here use 1-D RoPE


__all__ = ["PRESETS", "ARDTok", "ARDTokConfig", "ARDTokTarget", "load_ardtok", "save_ardtok"]
