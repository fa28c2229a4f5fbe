"""LlamaGen's GPT (FoundationVision/LlamaGen ``autoregressive/models/gpt.py``), re-implemented for tree decoding.

State-dict keys match the official ``.pt`` checkpoints: ``tok_embeddings``, ``cls_embedding.*``
(c2i ``embedding_table``; t2i ``cap_proj.fc1/fc2`` + buffer ``uncond_embedding``),
``layers.{i}.attention.{wqkv,wo}``, ``layers.{i}.feed_forward.{w1,w2,w3}``,
``layers.{i}.{attention_norm,ffn_norm}``, ``norm``, ``output``. Architecture facts: RMSNorm in fp32
(eps 1e-5), fused wqkv rows ``[q | k | v]``, SwiGLU hidden ``find_multiple(int(2·4·dim/3), multiple_of)``,
no biases, 2-D interleaved RoPE with all-zero rows for the ``cls_token_num`` condition positions.

Unlike the original, every forward takes explicit position ids and a 4-D boolean mask over a static KV
cache, so the same code runs prefill, AR steps and tree verification.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from adtbench.models.kv import StaticKVCache
from adtbench.models.rope import Rope2D, apply_rope


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

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_hidden(self) -> int:
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
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


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
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: StaticKVCache,
        layer: int,
        start: int,
    ) -> torch.Tensor:
        R, n, _ = x.shape
        q, k, v = self.wqkv(x).split([self.n_head * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = apply_rope(q.view(R, n, self.n_head, self.hd).transpose(1, 2), cos, sin, "interleaved")
        k = apply_rope(k.view(R, n, self.n_kv, self.hd).transpose(1, 2), cos, sin, "interleaved")
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


class LlamaGenGPT(nn.Module):
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

    def forward_embeds(
        self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: StaticKVCache, start: int
    ) -> torch.Tensor:
        """Input embeddings ``[R, n, dim]`` at positions ``[R, n]`` → features ``[R, n, dim]`` (post-norm)."""
        cos, sin = self.rope.cos_sin(pos, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i, start)
        return self.norm(x)
