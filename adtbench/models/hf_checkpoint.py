"""Checkpoint and tokenizer loading for the transformers families (HF folders of safetensors shards).

``load_chameleon_lm``: an HF folder (``config.json`` + safetensors shards) → ``ChameleonForConditionalGeneration``.
q/k-norm tensors stored as ``(d0, head_dim)`` with ``d0`` < heads (Lumina-mGPT's pre-release layout, models.md
§1.4) are expanded with ``repeat_interleave`` to ``(heads, head_dim)``; every other shape must match, and only
``model.vqmodel.*`` (the unused VQ encoder) may be missing. ``open_chameleon_checkpoint`` (file checks, config,
shapes) and ``shape_mismatches`` are shared with the lean loader (``chameleon.lean.load_chameleon_net``).
Tokenizers: ``HFTokenizer`` (a transformers tokenizer folder) and ``HashTokenizer`` (the stand-in over a tiny
vocabulary's filler ids).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError


def safetensors_files(path: Path) -> list[Path]:
    """The weight shards of an HF folder: from ``model.safetensors.index.json`` if present, else ``*.safetensors``."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ConfigError("model.path", f"{index} lists shards that are missing: {missing}")
        return files
    return sorted(path.glob("*.safetensors"))


def checkpoint_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape for every tensor in ``files`` (safetensors headers only; no data is read)."""
    from safetensors import safe_open

    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[k] = tuple(h.get_slice(k).get_shape())
    return out


def is_qk_norm(key: str) -> bool:
    return ".q_norm." in key or ".k_norm." in key


def expand_qk_norm(t: torch.Tensor, heads: int, key: str = "") -> torch.Tensor:
    """``(d0, head_dim)`` → ``(heads, head_dim)`` by ``repeat_interleave(heads // d0)`` (models.md §1.4)."""
    d0 = t.shape[0]
    if d0 == heads:
        return t
    if t.dim() != 2 or heads % d0:
        raise ValueError(f"{key}: q/k-norm of shape {tuple(t.shape)} cannot be expanded to {heads} heads")
    return t.repeat_interleave(heads // d0, dim=0)


def open_chameleon_checkpoint(
    path: Path, key: str = "model.path"
) -> tuple[Any, list[Path], dict[str, tuple[int, ...]]]:
    """``(ChameleonConfig, shard files, tensor name → shape)`` of an HF Chameleon folder; no tensor is read.

    Checks (``ConfigError(key, …)``): at least one safetensors shard, each structurally whole (``check_weights``),
    and a ``config.json`` with a ``vocabulary_map``. Both loaders (``load_chameleon_lm``, the lean
    ``chameleon.lean.load_chameleon_net``) start here.
    """
    from transformers import ChameleonConfig

    from adtbench.io import check_weights

    files = safetensors_files(path)
    if not files:
        raise ConfigError(key, f"{path} holds no *.safetensors weights")
    for f in files:  # a truncated shard: ConfigError naming key and file, before any tensor is read
        check_weights(key, f)
    config = ChameleonConfig.from_pretrained(str(path))
    if getattr(config, "vocabulary_map", None) is None:
        raise ConfigError(key, f"{path / 'config.json'} has no vocabulary_map (needed for the image-token ids)")
    return config, files, checkpoint_shapes(files)


def shape_mismatches(shapes: dict[str, tuple[int, ...]], own: dict[str, tuple[int, ...]]) -> list[str]:
    """``"key: checkpoint … vs model …"`` for every tensor whose shape differs from the model's, except q/k-norms
    stored ``(d0, head_dim)`` (expanded at load, ``expand_qk_norm``)."""
    return [
        f"{k}: checkpoint {s} vs model {own[k]}"
        for k, s in shapes.items()
        if k in own and own[k] != s and not (is_qk_norm(k) and len(s) == 2 and s[1:] == own[k][1:])
    ]


def check_lm_shapes(
    shapes: dict[str, tuple[int, ...]],
    own: dict[str, tuple[int, ...]],
    path: Path,
    key: str,
    extra: list[str] | None = None,
) -> None:
    """A ``ConfigError`` on ``key`` unless every tensor of ``own`` (the lean network's HF key → shape) is in the
    checkpoint's ``shapes`` with that shape (``shape_mismatches``) and ``extra`` (a family's own findings) is empty."""
    bad = [*shape_mismatches(shapes, own), *(extra or [])]
    missing = [k for k in own if k not in shapes]
    if bad or missing:
        raise ConfigError(
            key, f"{path}: checkpoint does not match its config; shapes: {bad[:5]}; missing: {missing[:5]}"
        )


def safetensors_device(device: torch.device | str) -> str:
    """``safe_open``'s device string: ``cpu`` for any CPU device (the simulated CUDA device is ``cpu:0``, which
    safetensors refuses), else the device as named."""
    d = torch.device(device)
    return "cpu" if d.type == "cpu" else str(d)


def tensor_reader(files: list[Path], device: torch.device | str, rename: Any = None) -> Any:
    """``get(key)`` → the tensor ``key`` of the safetensors ``files``, read onto ``device`` when asked (headers only
    up front); ``rename`` maps a stored key to the key callers use (e.g. Emu3's two spellings)."""
    from safetensors import safe_open

    handles: dict[str, tuple[Any, str]] = {}
    for f in files:
        h = safe_open(str(f), framework="pt", device=safetensors_device(device))
        handles.update({(rename(k) if rename else k): (h, k) for k in h.keys()})  # noqa: SIM118

    def get(key: str) -> torch.Tensor:
        h, raw = handles[key]
        t: torch.Tensor = h.get_tensor(raw)
        return t

    return get


def load_chameleon_lm(path: Path, dtype: torch.dtype, attn: str, key: str = "model.path") -> nn.Module:
    """``ChameleonForConditionalGeneration`` from an HF folder, with the q/k-norm fix (module docstring).

    Checks (``ConfigError(key, …)``): those of ``open_chameleon_checkpoint``; every checkpoint tensor's shape
    equals the model's, except q/k-norms of shape ``(d0, head_dim)`` with ``d0`` dividing the head count; only
    ``model.vqmodel.*`` may be missing. Extra keys (e.g. a VQ decoder) are ignored.
    """
    from safetensors import safe_open
    from transformers import ChameleonForConditionalGeneration

    config, files, shapes = open_chameleon_checkpoint(path, key)
    qk = {k: s for k, s in shapes.items() if is_qk_norm(k)}
    need_fix = any(len(s) == 2 and s[0] != heads_for(k, config) for k, s in qk.items())
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the expected q/k-norm / VQ-encoder reports are checked below instead
    try:
        lm, info = ChameleonForConditionalGeneration.from_pretrained(
            str(path), dtype=dtype, attn_implementation=attn, ignore_mismatched_sizes=need_fix, output_loading_info=True
        )
    finally:
        hf_logging.set_verbosity(level)
    own = lm.state_dict()
    bad = shape_mismatches(shapes, {k: tuple(t.shape) for k, t in own.items()})
    missing = [k for k in info["missing_keys"] if not k.startswith("model.vqmodel.")]
    if bad or missing:
        raise ConfigError(
            key, f"{path}: checkpoint does not match its config; shapes: {bad[:5]}; missing: {missing[:5]}"
        )
    if need_fix:  # copy every q/k-norm from the files, expanded to (heads, head_dim)
        with torch.no_grad():
            for f in files:
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():  # noqa: SIM118
                        if is_qk_norm(k) and k in own:
                            t = expand_qk_norm(h.get_tensor(k), heads_for(k, config), k)
                            own[k].copy_(t.to(own[k].dtype))
    return lm.eval()


def heads_for(key: str, config: Any) -> int:
    """Rows of a full q/k-norm tensor: the head count for ``q_norm``, the KV-head count for ``k_norm``."""
    return config.num_attention_heads if ".q_norm." in key else config.num_key_value_heads


# ---------------------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------------------


class HFTokenizer:
    """``text → ids`` through a transformers tokenizer (no special tokens added: the prompt adds them)."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(path))

    def __call__(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])


class HashTokenizer:
    """Stand-in tokenizer for tiny vocabularies: each word → a stable id in the filler range ``[lo, hi)``."""

    def __init__(self, lo: int, hi: int, max_len: int) -> None:
        if not 0 <= lo < hi:
            raise ValueError(f"empty text-id range [{lo}, {hi})")
        self.lo, self.hi, self.max_len = lo, hi, max_len

    def __call__(self, text: str) -> list[int]:
        from adtbench.models.text import text_token_ids

        return text_token_ids(text, self.lo, self.hi, self.max_len)


__all__ = [
    "HFTokenizer",
    "HashTokenizer",
    "check_lm_shapes",
    "checkpoint_shapes",
    "expand_qk_norm",
    "heads_for",
    "is_qk_norm",
    "load_chameleon_lm",
    "open_chameleon_checkpoint",
    "safetensors_device",
    "safetensors_files",
    "shape_mismatches",
    "tensor_reader",
]
