"""Drafter construction from ``cfg.drafter`` for a given target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.errors import ConfigError
from adtbench.models.base import Target


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


def load_eagle_weights(drafter: EagleDrafter, path: str | Path) -> None:
    """Load ``model.safetensors`` (or a ``.safetensors`` file) into the drafter, strictly; a missing or corrupt
    file is a ``ConfigError`` naming ``drafter.path`` and the file."""
    from adtbench.io import load_weights

    p = Path(path)
    file = p / "model.safetensors" if p.is_dir() else p
    if not file.exists():
        raise ConfigError("drafter.path", f"expected {file} (safetensors weights of an EAGLE drafter)")
    state = load_weights("drafter.path", file)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError("drafter.path", f"{file}: missing keys {missing}, unexpected keys {unexpected}")


def build_drafter(cfg: Any, target: Target) -> EagleDrafter | None:
    """``cfg`` is the ``drafter`` node; returns None for ``kind: none``."""
    if str(cfg.kind) == "none":
        return None
    dcfg = eagle_config_for(target, cfg)
    path = cfg.get("path")
    if path is not None:
        meta = Path(str(path)) / "config.json"
        if meta.exists():
            dcfg = EagleConfig(**json.loads(meta.read_text()))
            if dcfg.hidden_size != target.hidden_size:
                raise ConfigError(
                    "drafter.path",
                    f"{meta}: a drafter of hidden size {dcfg.hidden_size} cannot draft for this target (hidden size "
                    f"{target.hidden_size}); choose the drafter trained for this model (e.g. drafter=eagle "
                    "drafter.path=<dir>)",
                )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.get("seed", 0)))
        drafter = EagleDrafter(dcfg, target.drafter_rope(dcfg.head_dim))
        std = cfg.get("init_std")
        if std is not None:
            for p in drafter.parameters():
                if p.dim() > 1:
                    torch.nn.init.normal_(p, 0.0, float(std))
    if path is not None:
        load_eagle_weights(drafter, str(path))
    return drafter.to(device=target.device, dtype=target.dtype).eval()
