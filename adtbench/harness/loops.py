"""What a loop policy (``algorithm.policies.LoopPolicy``: ZipAR, MuLo-SD) needs from the harness.

- ``check_loop_config(cfg, policy)``: cross-key rules checked with the config, before any model loads (a loop
  policy has its own acceptance, so ``lantern=on`` with it is an error naming both keys, never ignored), then
  the policy's own check (``LOOP_CHECKS``, e.g. MuLo-SD's drafter-model pairing);
- ``build_loop_models(cfg, policy, target)``: the models the loop runs besides the target (``LOOP_MODELS``,
  e.g. MuLo-SD's low-resolution drafter and resamplers), handed to ``LoopPolicy.generate`` as ``aux``.

A new loop registers its builder and check here by module path (imported only when that policy runs).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from adtbench.algorithm.policies import LoopPolicy, Policy
from adtbench.errors import ConfigError
from adtbench.registry import Registry

LOOP_MODELS: Registry[Any] = Registry("policy")  # policy.name → build(cfg, target) → aux
LOOP_CHECKS: Registry[None] = Registry("policy")  # policy.name → check(cfg) (no weights read)
LOOP_MODELS.register("mulo", "adtbench.harness.mulo:build_mulo_models")
LOOP_CHECKS.register("mulo", "adtbench.harness.mulo:check_mulo_config")


def check_loop_config(cfg: DictConfig, policy: Policy) -> None:
    if not isinstance(policy, LoopPolicy):
        return
    lantern = cfg.get("lantern")
    if lantern is not None and bool(lantern.get("enabled", False)):
        raise ConfigError(
            "lantern.enabled",
            f"policy={policy.name} has its own acceptance rule (policy.*), so lantern=on would be ignored; "
            f"use lantern=off with policy={policy.name}",
        )
    if policy.name in LOOP_CHECKS:
        LOOP_CHECKS.build(policy.name, cfg)


def build_loop_models(cfg: DictConfig, policy: Policy, target: Any) -> Any:
    """``aux`` for a loop policy (None when it needs no model besides the target, or for tree policies)."""
    if isinstance(policy, LoopPolicy) and policy.name in LOOP_MODELS:
        return LOOP_MODELS.build(policy.name, cfg, target)
    return None
