"""What a loop policy (``algorithm.policies.LoopPolicy``: ZipAR, MuLo-SD, the Jacobi loops) needs from the harness.

- ``check_loop_config(cfg, policy)``: cross-key rules checked with the config, before any model loads (a loop
  policy with its own acceptance — ZipAR, MuLo-SD, GSD — refuses ``lantern=on``, an error naming the key, never
  ignored; ``sjd`` / ``scd`` accept with the app's rule, so LANTERN relaxes them), then the policy's own check
  (``LOOP_CHECKS``, e.g. MuLo-SD's drafter-model pairing, the Jacobi loops' ``init=drafter`` / ``window=cost``);
- ``build_loop_models(cfg, conf, policy, target)``: the models the loop runs besides the target (``LOOP_MODELS``,
  e.g. MuLo-SD's low-resolution drafter and resamplers; the Jacobi loops' EAGLE drafter for ``init=drafter`` and
  the machine's cost model for ``window=cost``), handed to ``LoopPolicy.generate`` as ``aux``.

A new loop registers its builder and check here by module path (imported only when that policy runs).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from adtbench.algorithm.policies import LoopPolicy, Policy
from adtbench.errors import ConfigError
from adtbench.harness.schema import AppConf
from adtbench.registry import Registry

LOOP_MODELS: Registry[Any] = Registry("policy")  # policy.name → build(cfg, conf, target) → aux
LOOP_CHECKS: Registry[None] = Registry("policy")  # policy.name → check(cfg) (no weights read)
LOOP_MODELS.register("mulo", "adtbench.harness.mulo:build_mulo_models")
LOOP_CHECKS.register("mulo", "adtbench.harness.mulo:check_mulo_config")
for _jacobi in ("sjd", "scd", "gsd", "sjd_pac"):
    LOOP_MODELS.register(_jacobi, "adtbench.harness.loops:build_jacobi_models")
    LOOP_CHECKS.register(_jacobi, "adtbench.harness.loops:check_jacobi_config")


def check_loop_config(cfg: DictConfig, policy: Policy) -> None:
    if not isinstance(policy, LoopPolicy):
        return
    lantern = cfg.get("lantern")
    if lantern is not None and bool(lantern.get("enabled", False)) and not policy.accepts_rule:
        raise ConfigError(
            "lantern.enabled",
            f"policy={policy.name} has its own acceptance rule (policy.*), so lantern=on would be ignored; "
            f"use lantern=off with policy={policy.name}",
        )
    if policy.name in LOOP_CHECKS:
        LOOP_CHECKS.build(policy.name, cfg)


def build_loop_models(cfg: DictConfig, conf: AppConf, policy: Policy, target: Any) -> Any:
    """``aux`` for a loop policy (None when it needs no model besides the target, or for tree policies); ``conf``:
    ``cfg``'s typed values (``config.Checked.conf``)."""
    if isinstance(policy, LoopPolicy) and policy.name in LOOP_MODELS:
        return LOOP_MODELS.build(policy.name, cfg, conf, target)
    return None


def check_jacobi_config(cfg: DictConfig) -> None:
    """``policy=sjd|scd|gsd`` (values already checked by ``jacobi.jacobi_params``): ``init=drafter`` needs an EAGLE
    drafter (``drafter=eagle``; its weights are checked here when a path is set); ``window=cost`` writes its cost
    model under ``paths.cache_dir`` (checked with the other caches: ``config.validate_cache_dirs``)."""
    node = cfg.policy
    if str(node.get("init")) == "drafter":
        kind = str(cfg.drafter.get("kind")) if cfg.get("drafter") is not None else "none"
        if kind != "eagle":
            raise ConfigError(
                "policy.init",
                f"init=drafter drafts with the EAGLE drafter; set drafter=eagle "
                f"(got drafter.kind={kind}) or choose init=random|left|up",
            )
        path = cfg.drafter.get("path")
        if path is not None:
            from adtbench.harness.drafters import check_path

            check_path(path)


def build_jacobi_models(cfg: DictConfig, conf: AppConf, target: Any) -> Any:
    """``JacobiModels``: the EAGLE drafter (``init=drafter``) and, for ``window=cost``, the calibrated L
    (``caches.load_or_calibrate_window``: this machine's cost model and τ(L) on the calibration prompts, measured
    once outside the timed scope and cached under ``paths.cache_dir``)."""
    from adtbench.algorithm.policies.jacobi import JacobiModels

    node = cfg.policy
    drafter = None
    if str(node.get("init")) == "drafter":
        from adtbench.harness.drafters import build_drafter

        drafter = build_drafter(cfg.drafter, target)
    models = JacobiModels(drafter)
    if str(node.get("window")) == "cost":
        from adtbench.harness.caches import load_or_calibrate_window

        table = load_or_calibrate_window(cfg, conf, target, drafter)
        models.window, models.calibration = int(table["L"]), table
    return models
