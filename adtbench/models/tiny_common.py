"""Shared pieces of the tiny-checkpoint writers (``adtbench make-tiny``; one ``*_tiny.py`` writer per family).

Sizes every tiny family agrees on (``GRID``, ``K_CODES``, the character vocabulary ``CHARS``), the seeded
non-degenerate initialisation, the character-level fast tokenizers, the HF sharded-safetensors writer and the
``adtbench.json`` sidecar + ``README.txt`` every tiny folder carries (``registry`` conventions). Invariant: the
same arguments write the same bytes (all randomness comes from seeded local generators or forked RNG state).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adtbench.io import atomic_write_json

CHARS = string.ascii_lowercase + string.digits + " .,:'-\n"  # the tiny tokenizers' character vocabulary
GRID = 4  # tiny image grid (Anole 32, Lumina 48, LlamaGen 16/32)
K_CODES = 64  # tiny VQ codebooks


def spread_init(module: nn.Module, seed: int, head_names: tuple[str, ...] = ("lm_head", "output")) -> None:
    """Seeded N(0, 1/fan_in) linears (heads ×2), N(0, 1) embeddings, zero biases: ``hf_causal.spread_init_``."""
    from adtbench.models.hf_causal import spread_init_

    spread_init_(module, seed, 2.0, head_names)


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
    atomic_write_json(path, data, sort_keys=True)


def run_command(family: str, out: Path) -> str:
    """The command that runs a tiny checkpoint (c2i prompts are class ids: the tiny model has 10 classes). No drafter
    was trained for it: ``drafter.random=true`` asks for a random one (a drafting policy on a checkpoint refuses to
    run without ``drafter.path`` otherwise; the run records ``drafter_random``)."""
    extra = " dataset=inline dataset.text=3" if family == "llamagen_c2i" else ""
    return f"python run.py model={family} model.path={out} policy=eagle2 drafter.random=true{extra}"


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


__all__ = [
    "CHARS",
    "GRID",
    "K_CODES",
    "char_tokenizer",
    "run_command",
    "save_fast_tokenizer",
    "save_sharded_safetensors",
    "spread_init",
    "write_json",
    "write_sidecar",
]
