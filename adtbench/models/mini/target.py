"""Family ``mini``: the embedded, project-trained text-to-image model (LlamaGen architecture).

A ``LlamaGenTarget`` assembled from shipped safetensors (``adtbench/weights/mini/``):

- ``gpt.safetensors``: ``LlamaGenGPT`` (t2i, official LlamaGen key names, loaded strictly), shape in
  ``config.json["gpt"]`` (``GPTConfig`` fields);
- ``text_encoder.safetensors``: :class:`MiniTextEncoder`, a small learned text encoder trained jointly with
  the GPT; it maps a caption to the ``[L, caption_dim]`` feature prefix (L = number of words ≤
  ``cls_token_num``), which ``LlamaGenTarget.encode_prompt`` right-aligns and masks exactly like LlamaGen's
  T5 features;
- the VQ tokenizer (``vq/model.safetensors`` + ``config.json``, ``LlamaGenVQConfig`` fields, with encoder).

Model config (``conf/model/mini.yaml``): ``path`` (the AR weights dir), ``vq_path``, ``dtype``, ``device``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adtbench.models.llamagen.gpt import GPTConfig, LlamaGenGPT
from adtbench.models.llamagen.target import LlamaGenTarget
from adtbench.models.llamagen.vq import LlamaGenVQConfig, LlamaGenVQModel

PAD, UNK = "<pad>", "<unk>"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TextEncoderConfig:
    """Word vocabulary (ids: 0 = pad, 1 = unknown word, then ``words``) and transformer shape."""

    words: list[str] = field(default_factory=list)
    dim: int = 64
    n_layer: int = 2
    n_head: int = 4
    max_len: int = 16
    caption_dim: int = 64

    @property
    def vocab(self) -> list[str]:
        return [PAD, UNK, *self.words]


class _Block(nn.Module):
    """Pre-norm bidirectional transformer block over the caption words (padding masked as keys)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        mask = valid[:, None, None, :] | torch.eye(L, dtype=torch.bool, device=x.device)[None, None]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, D))
        return x + self.mlp(self.norm2(x))


class MiniTextEncoder(nn.Module):
    """Caption → features ``[L, caption_dim]``: word + position embeddings → blocks → LayerNorm → Linear.

    Invariant: a caption's features do not depend on the batch it is encoded in (positions are word
    indices, padding is masked as keys), so training (batched, padded) and inference (one caption) agree.
    """

    def __init__(self, cfg: TextEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.index = {w: i for i, w in enumerate(cfg.vocab)}
        self.tok = nn.Embedding(len(cfg.vocab), cfg.dim)
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)
        self.blocks = nn.ModuleList(_Block(cfg.dim, cfg.n_head) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.caption_dim)

    def tokenize(self, text: str) -> list[int]:
        """Lower-cased words → ids (unknown words → ``<unk>``); at least one, at most ``max_len``."""
        words = re.findall(r"[a-z0-9]+", text.lower())[: self.cfg.max_len] or [UNK]
        return [self.index.get(w, 1) for w in words]

    def batch_ids(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-aligned ids ``[B, max_len]`` (0 = pad) and the word mask."""
        ids = torch.zeros(len(texts), self.cfg.max_len, dtype=torch.long)
        for i, t in enumerate(texts):
            tok = self.tokenize(t)
            ids[i, : len(tok)] = torch.tensor(tok)
        return ids, ids != 0

    def forward(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Left-aligned ``ids [B, L]`` with mask ``valid`` → features ``[B, L, caption_dim]`` (pads: garbage)."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)[None]
        for blk in self.blocks:
            x = blk(x, valid)
        return self.out(self.norm(x))

    @torch.no_grad()
    def encode(self, text: str) -> torch.Tensor:
        """One caption → ``[L, caption_dim]`` float32 on CPU (what ``LlamaGenTarget`` expects)."""
        dev = self.tok.weight.device
        ids = torch.tensor([self.tokenize(text)], device=dev)
        return self(ids, torch.ones_like(ids, dtype=torch.bool))[0].float().cpu()


def right_align(feats: torch.Tensor, valid: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-aligned ``feats [B, L, C]`` (``n_b = valid[b].sum() ≤ width`` words) → ``[B, width, C]`` + mask.

    Same layout as ``LlamaGenTarget.encode_prompt``: word j of caption b sits in slot ``width − n_b + j``;
    earlier slots are zero and invalid.
    """
    B, L, C = feats.shape
    n = valid.sum(1, keepdim=True)  # [B, 1]
    if int(n.max()) > width:
        raise ValueError(f"captions of up to {int(n.max())} words do not fit {width} condition slots")
    word = torch.arange(width, device=feats.device)[None] - (width - n)  # [B, W]
    ok = word >= 0
    g = feats.gather(1, word.clamp(0, L - 1)[..., None].expand(B, width, C))
    return g * ok[..., None], ok


def load_vq(path: str | Path, device: str | torch.device = "cpu", key: str = "model.vq_path") -> LlamaGenVQModel:
    """The mini tokenizer from ``path/{model.safetensors, config.json}`` (strict); a corrupt file is a
    ``ConfigError`` naming ``key`` and the file."""
    from adtbench.io import load_weights

    p = Path(path)
    raw = json.loads((p / "config.json").read_text())
    cfg = LlamaGenVQConfig(**{**raw, "ch_mult": tuple(raw["ch_mult"])})
    with torch.random.fork_rng(devices=[]):
        vq = LlamaGenVQModel(cfg)
    vq.load_state_dict(load_weights(key, p / "model.safetensors"))
    return vq.to(device).eval()


def load_ar(path: str | Path, key: str = "model.path") -> tuple[LlamaGenGPT, MiniTextEncoder]:
    """GPT + text encoder from ``path/{gpt.safetensors, text_encoder.safetensors, config.json}`` (strict); a
    corrupt file is a ``ConfigError`` naming ``key`` and the file."""
    from adtbench.io import load_weights

    p = Path(path)
    for f in ("config.json", "gpt.safetensors", "text_encoder.safetensors"):
        if not (p / f).exists():
            raise FileNotFoundError(f"mini model: missing {p / f}")
    meta = json.loads((p / "config.json").read_text())
    with torch.random.fork_rng(devices=[]):
        gpt = LlamaGenGPT(GPTConfig(**meta["gpt"]))
        text = MiniTextEncoder(TextEncoderConfig(**meta["text_encoder"]))
    gpt.load_state_dict(load_weights(key, p / "gpt.safetensors"), strict=True)
    text.load_state_dict(load_weights(key, p / "text_encoder.safetensors"), strict=True)
    return gpt.eval(), text.eval()


def ar_config_dict(gpt_cfg: GPTConfig, text_cfg: TextEncoderConfig) -> dict[str, Any]:
    return {"gpt": asdict(gpt_cfg), "text_encoder": asdict(text_cfg)}


def build_target(cfg: Any) -> LlamaGenTarget:
    """``model`` node → ``LlamaGenTarget`` (GPT + learned text encoder + trained VQ), eval mode."""
    from adtbench.errors import ConfigError

    path, vq_path = Path(str(cfg.path)), Path(str(cfg.vq_path))
    for key, p in (("model.path", path / "gpt.safetensors"), ("model.vq_path", vq_path / "model.safetensors")):
        if not p.exists():
            raise ConfigError(key, f"expected {p} (the shipped mini weights; retrain with `adtbench train`)")
    gpt, text = load_ar(path)
    vq = load_vq(vq_path)
    if vq.config.codebook_size != gpt.cfg.vocab_size:
        raise ConfigError("model.vq_path", f"codebook {vq.config.codebook_size} ≠ GPT vocabulary {gpt.cfg.vocab_size}")
    if text.cfg.max_len != gpt.cfg.cls_token_num:
        raise ConfigError("model.path", "text encoder max_len must equal the GPT's cls_token_num")
    dtype = str(cfg.get("dtype", "float32"))
    if dtype not in DTYPES:
        raise ConfigError("model.dtype", f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    device = str(cfg.get("device", "cpu"))
    text = text.to(device)
    return LlamaGenTarget(gpt, vq, text.encode, device=device, dtype=DTYPES[dtype])
