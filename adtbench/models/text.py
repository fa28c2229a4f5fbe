"""A deterministic stand-in text encoder for tiny test models (no download, no training).

Each lower-cased word maps to a fixed random vector drawn from a generator seeded by ``crc32(word) ^ seed``,
so the same prompt always gives the same condition features and different prompts give different ones.
Real LlamaGen uses FLAN-T5 features; this class only fills that slot for the tiny vehicles.
"""

from __future__ import annotations

import re
import zlib

import torch


class HashTextEncoder:
    def __init__(self, dim: int, max_len: int, seed: int = 0) -> None:
        self.dim, self.max_len, self.seed = dim, max_len, seed

    def word_vector(self, word: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(word.encode()) ^ self.seed)
        return torch.randn(self.dim, generator=g)

    def __call__(self, text: str) -> torch.Tensor:
        """``text`` → features ``[L, dim]`` with 1 ≤ L ≤ max_len (float32, CPU)."""
        words = re.findall(r"[a-z0-9]+", text.lower())[: self.max_len] or ["<empty>"]
        return torch.stack([self.word_vector(w) for w in words])


def text_token_ids(text: str, lo: int, hi: int, max_len: int) -> list[int]:
    """Stand-in tokenizer for tiny vocabularies: each word → a stable id in ``[lo, hi)``."""
    words = re.findall(r"[a-z0-9]+", text.lower())[:max_len] or ["<empty>"]
    return [lo + zlib.crc32(w.encode()) % (hi - lo) for w in words]
