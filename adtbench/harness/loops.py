"""What a loop policy (``algorithm.policies.LoopPolicy``: ZipAR, MuLo-SD, the Jacobi loops) needs from the harness,
as its ``Method`` declares it (``algorithm.policies.base.Method``: ``check`` and ``models``, lazy paths here):

- ``check_loop_config(cfg, policy)``: cross-key rules checked with the config, before any model loads (a loop
  policy with its own acceptance — ZipAR, MuLo-SD, GSD — refuses ``lantern=on``, an error naming the key, never
  ignored; ``sjd`` / ``scd`` accept with the app's rule, so LANTERN relaxes them), then the method's own ``check``
  (e.g. MuLo-SD's drafter-model pairing, the Jacobi loops' ``init=drafter``);
- ``build_loop_models(cfg, conf, policy, target)``: the models the loop runs besides the target (the method's
  ``models``, e.g. MuLo-SD's low-resolution drafter and resamplers; the Jacobi loops' EAGLE drafter for
  ``init=drafter`` and the machine's calibrated L for a window rule that declares ``calibrated``), handed to
  ``LoopPolicy.generate`` as ``aux``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from adtbench.algorithm.policies import LoopPolicy, Policy
from adtbench.algorithm.policies.base import method_of, resolve
from adtbench.errors import ConfigError
from adtbench.harness.schema import AppConf


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
    check = method_of(policy.name).check
    if check is not None:
        resolve(check)(cfg, policy)


def build_loop_models(cfg: DictConfig, conf: AppConf, policy: Policy, target: Any) -> Any:
    """``aux`` for a loop policy (None when it needs no model besides the target, or for tree policies); ``conf``:
    ``cfg``'s typed values (``config.Checked.conf``)."""
    models = method_of(policy.name).models if isinstance(policy, LoopPolicy) else None
    return None if models is None else resolve(models)(cfg, conf, target)


def check_jacobi_config(cfg: DictConfig, policy: Any) -> None:
    """A Jacobi loop (values already checked by its params class): a policy that drafts with the EAGLE drafter
    (``init=drafter``) needs ``drafter=eagle`` (its weights are checked here when a path is set); a calibrated window
    (``window=cost``) writes its cost model under ``paths.cache_dir`` (checked with the other caches:
    ``config.validate_cache_dirs``)."""
    if policy.drafts_with_eagle:
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

    node = OmegaConf.to_container(cfg.policy, resolve=True)
    assert isinstance(node, dict)
    policy = method_of(str(node["name"]))(node)  # checked already (config.validate): its declarations
    drafter = None
    if policy.drafts_with_eagle:
        from adtbench.harness.drafters import build_drafter

        drafter = build_drafter(cfg.drafter, target)
    models = JacobiModels(drafter)
    if policy.calibrated_window:
        from adtbench.harness.caches import load_or_calibrate_window

        table = load_or_calibrate_window(cfg, conf, target, drafter)
        models.window, models.calibration = int(table["L"]), table
    return models
