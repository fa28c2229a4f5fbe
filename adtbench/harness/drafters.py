"""Drafter construction from ``cfg.drafter`` for a given target.

``drafter.path`` is a local folder, a ``.safetensors`` file or a hub repo id, in adtbench's layout or as a public
EAGLE-1/2 / LANTERN drafter is published (``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``, e.g.
``jadohu/anole_drafter``): no conversion step. This module reads the files (``read_drafter``); the key mapping and
the layouts are ``algorithm.drafters.checkpoint``'s. Whatever the layout, the drafter must fit the target — its hidden
size, the rows of a stored embedding (the target's vocabulary) and the RoPE θ its config states — or the run stops
with a ``ConfigError`` naming ``drafter.path``.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from adtbench.algorithm.drafters.checkpoint import EMBED, check_state, convert_state_dict, is_public_config
from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.errors import ConfigError
from adtbench.io import load_weights
from adtbench.models.base import Target
from adtbench.models.rope import Rope

KEY = "drafter.path"
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")  # the first present is read (LANTERN's loader's order)


def eagle_config_for(target: Target, cfg: Any) -> EagleConfig:
    """Size the drafter like one decoder layer of the target."""
    return EagleConfig(
        hidden_size=target.hidden_size,
        num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads,
        head_dim=target.head_dim,
        intermediate_size=target.intermediate_size,
        fc_bias=bool(cfg.get("fc_bias", True)),
        input_norm=bool(cfg.get("input_norm", False)),
        num_layers=int(cfg.get("num_layers", 1)),
    )


def weights_file(folder: Path) -> Path:
    """The weights of a drafter folder: ``pytorch_model.bin``, else ``model.safetensors`` (``FileNotFoundError``)."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder}: no {' or '.join(WEIGHT_FILES)}")


def resolve_path(value: Any, key: str = KEY) -> Path:
    """A local folder or file as given; a hub repo id → its downloaded snapshot (its JSON files and the weights)."""
    from adtbench.models.registry import _hub, looks_like_repo_id

    p = Path(str(value)).expanduser()
    if p.exists() or not looks_like_repo_id(str(value)):
        return p
    return _hub(key, str(value), ["*.json", *WEIGHT_FILES], f"a drafter folder ({' or '.join(WEIGHT_FILES)})")


def check_path(value: Any) -> None:
    """Pre-flight of ``drafter.path`` before any model is built: a local folder or file whose weights file is sound
    (``io.check_weights``), or a hub repo id (fetched by the loader); else a ``ConfigError`` naming ``drafter.path``."""
    from adtbench.io import check_weights
    from adtbench.models.registry import looks_like_repo_id

    p = Path(str(value)).expanduser()
    if not p.exists():
        if looks_like_repo_id(str(value)):
            return
        raise ConfigError(KEY, f"no drafter checkpoint at {value}")
    if p.is_dir():
        try:
            p = weights_file(p)
        except FileNotFoundError as e:
            raise ConfigError(KEY, str(e)) from e
    check_weights(KEY, p)


def read_source(src: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(state_dict, config.json)`` of a public drafter folder (``.bin`` read weights-only)."""
    cfg_file = src / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{src}: no config.json (expected an EAGLE/LANTERN drafter folder)")
    state = load_weights(KEY, weights_file(src))
    if not isinstance(state, dict):
        raise ValueError(f"{src}: the weights file holds a {type(state).__name__}, not a state dict")
    return dict(state), json.loads(cfg_file.read_text())


def read_drafter(path: str | Path) -> tuple[EagleConfig | None, dict[str, torch.Tensor], str, Path]:
    """``drafter.path`` (a local folder or ``.safetensors`` file) → ``(EagleConfig or None: size it like the target,
    state dict in EagleDrafter's keys, layout "adtbench" | "public", the weights file)``; every fault a
    ``ConfigError`` naming ``drafter.path`` and the file."""
    p = Path(path)
    if p.is_file():
        return None, dict(load_weights(KEY, p)), "adtbench", p
    if not p.is_dir():
        raise ConfigError(KEY, f"no such folder or file: {p}")
    try:
        file = weights_file(p)
    except FileNotFoundError as e:
        raise ConfigError(KEY, f"{e} (the weights of an EAGLE / LANTERN drafter)") from e
    meta = p / "config.json"
    if not meta.is_file():
        state = dict(load_weights(KEY, file))
        if EMBED in state:  # a public drafter: its sizes and norms are in the config it came with
            raise ConfigError(
                KEY,
                f"{p} has no config.json: an EAGLE / LANTERN drafter needs the config it was trained with (LANTERN's "
                "data/configs/anole_config.json for jadohu/anole_drafter) beside its weights",
            )
        return None, state, "adtbench", file
    try:
        config = json.loads(meta.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(KEY, f"{meta} is not JSON ({e})") from e
    state = load_weights(KEY, file)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(KEY, f"{file} does not hold a state dict of tensors")
    if is_public_config(config):
        try:
            ours, ecfg, _ = convert_state_dict(dict(state), config)
        except ValueError as e:
            raise ConfigError(KEY, f"{file} (an EAGLE / LANTERN drafter, config {meta.name}): {e}") from e
        return EagleConfig(**ecfg), ours, "public", file
    known = {f.name for f in fields(EagleConfig)}
    if unknown := sorted(set(config) - known):
        raise ConfigError(
            KEY,
            f"{meta}: unknown fields {unknown} (expected EagleConfig fields, or a Hugging Face config with "
            "num_attention_heads for an EAGLE / LANTERN drafter)",
        )
    try:
        return EagleConfig(**config), dict(state), "adtbench", file
    except TypeError as e:
        raise ConfigError(KEY, f"{meta}: {e}") from e


def _check_fits(dcfg: EagleConfig, target: Target, rope: Rope, where: Path) -> None:
    """The drafter drafts for this target: hidden size, stored-embedding rows and RoPE θ agree (``ConfigError``)."""
    if dcfg.hidden_size != target.hidden_size:
        raise ConfigError(
            KEY,
            f"{where}: a drafter of hidden size {dcfg.hidden_size} cannot draft for this target (hidden size "
            f"{target.hidden_size}); choose the drafter trained for this model (e.g. drafter=eagle drafter.path=<dir>)",
        )
    if dcfg.vocab_size and dcfg.vocab_size != target.layout.vocab_size:
        raise ConfigError(
            KEY,
            f"{where}: the drafter's embedding has {dcfg.vocab_size} rows, the target's vocabulary "
            f"{target.layout.vocab_size}: a drafter trained for another model",
        )
    if dcfg.rope_theta is not None and abs(dcfg.rope_theta - rope.theta) > 1e-6 * rope.theta:
        raise ConfigError(
            KEY,
            f"{where}: the drafter's config states rope_theta={dcfg.rope_theta:g}, the target's drafter RoPE has "
            f"θ = {rope.theta:g}",
        )


def build_drafter(cfg: Any, target: Target) -> EagleDrafter | None:
    """``cfg`` is the ``drafter`` node; returns None for ``kind: none``. The drafter runs at the target's device and
    dtype (a stored embedding too)."""
    if str(cfg.kind) == "none":
        return None
    dcfg = eagle_config_for(target, cfg)
    path = cfg.get("path")
    state: dict[str, torch.Tensor] | None = None
    where = Path()
    if path is not None:
        stored, state, _, where = read_drafter(resolve_path(path))
        dcfg = stored if stored is not None else dcfg
    rope = target.drafter_rope(dcfg.head_dim)
    if path is not None:
        _check_fits(dcfg, target, rope, where)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.get("seed", 0)))
        drafter = EagleDrafter(dcfg, rope)
        std = cfg.get("init_std")
        if std is not None:
            for p in drafter.parameters():
                if p.dim() > 1:
                    torch.nn.init.normal_(p, 0.0, float(std))
    if state is not None:
        load_state(drafter, state, where)
    return drafter.to(device=target.device, dtype=target.dtype).eval()


def load_state(drafter: EagleDrafter, state: dict[str, torch.Tensor], where: Path) -> None:
    """Load ``state`` strictly (names and shapes); a mismatch is a ``ConfigError`` naming ``drafter.path``."""
    try:
        check_state(drafter.config, state)
    except ValueError as e:
        raise ConfigError(KEY, f"{where}: {e}") from e
    with torch.no_grad():
        drafter.load_state_dict(state, strict=True)


__all__ = [
    "KEY",
    "WEIGHT_FILES",
    "build_drafter",
    "check_path",
    "eagle_config_for",
    "read_drafter",
    "read_source",
    "resolve_path",
]
