"""Drafter construction from ``cfg.drafter`` for a given target.

``drafter.path`` is a local folder, a ``.safetensors`` file or a hub repo id, in adtbench's layout or as a public
EAGLE-1/2 / LANTERN drafter is published (``algorithm.drafters.checkpoint``: ``config.json`` + ``pytorch_model.bin``
or ``model.safetensors``, e.g. ``jadohu/anole_drafter``): no conversion step. Whatever the layout, the drafter must
fit the target — its hidden size, the rows of a stored embedding (the target's vocabulary) and the RoPE θ its config
states — or the run stops with a ``ConfigError`` naming ``drafter.path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from adtbench.algorithm.drafters.checkpoint import KEY, read_drafter, resolve_path
from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.errors import ConfigError
from adtbench.models.base import Target
from adtbench.models.rope import Rope


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
            KEY, f"{where}: the drafter's config states rope_theta={dcfg.rope_theta:g}, the target's drafter RoPE "
            f"has θ = {rope.theta:g}",
        )  # fmt: skip


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
        dcfg = stored or dcfg
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
    from adtbench.algorithm.drafters.checkpoint import check_state

    try:
        check_state(drafter.config, state)
    except ValueError as e:
        raise ConfigError(KEY, f"{where}: {e}") from e
    with torch.no_grad():
        drafter.load_state_dict(state, strict=True)
