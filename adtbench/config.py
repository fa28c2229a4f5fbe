"""Config validation and component builders. Everything here runs before any model is built.

Every error is a ``ConfigError`` naming the offending key (and the path, for files).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from adtbench.errors import ConfigError
from adtbench.policies.ar import ArPolicy
from adtbench.policies.base import TreePolicy
from adtbench.policies.eagle2 import Eagle2Policy
from adtbench.policies.static import SHAPES, ChainPolicy, StaticTreePolicy
from adtbench.sampling import SamplingParams
from adtbench.verify import EXACT, AcceptanceRule

PACKAGE_DIR = Path(__file__).resolve().parent


def register_resolvers() -> None:
    """``${pkg:relative/path}`` → a file shipped inside the adtbench package."""
    if not OmegaConf.has_resolver("pkg"):
        OmegaConf.register_new_resolver("pkg", lambda rel: str(PACKAGE_DIR / rel))


def _get(cfg: DictConfig, key: str) -> Any:
    """``cfg[key]`` with a ConfigError (naming the key) for missing values."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            raise ConfigError(key, "missing")
        if OmegaConf.is_missing(node, part):
            raise ConfigError(key, f"is required (value ???) — set it on the command line, e.g. {key}=...")
        node = node[part]
    return node


def _number(cfg: DictConfig, key: str, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    v = _get(cfg, key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise ConfigError(key, f"must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    if lo is not None and v < lo:
        raise ConfigError(key, f"must be ≥ {lo}, got {v}")
    if hi is not None and v > hi:
        raise ConfigError(key, f"must be ≤ {hi}, got {v}")
    return kind(v)


def build_sampling(cfg: DictConfig) -> SamplingParams:
    t = _number(cfg, "sampling.temperature", float, lo=0.0)
    k = _number(cfg, "sampling.top_k", int, lo=0)
    p = _number(cfg, "sampling.top_p", float, hi=1.0)
    if p <= 0.0:
        raise ConfigError("sampling.top_p", f"must be in (0, 1], got {p}")
    s = _number(cfg, "sampling.cfg_scale", float, lo=0.0)
    return SamplingParams(temperature=t, top_k=k, top_p=p, cfg_scale=s)


def build_policy(cfg: DictConfig) -> TreePolicy:
    """Tree policy from ``cfg.policy`` (constructors validate their own fields)."""
    name = str(_get(cfg, "policy.name"))
    if name == "ar":
        return ArPolicy()
    if name == "chain":
        return ChainPolicy(_number(cfg, "policy.depth", int), str(_get(cfg, "policy.draft_sampling")))
    if name == "static":
        tree = _get(cfg, "policy.tree")
        if isinstance(tree, str):
            if tree not in SHAPES:
                raise ConfigError("policy.tree", f"unknown shape {tree!r}; shipped shapes: {sorted(SHAPES)}")
            paths = SHAPES[tree]
        else:
            paths = OmegaConf.to_container(tree) if OmegaConf.is_config(tree) else tree
        return StaticTreePolicy(paths, str(_get(cfg, "policy.draft_sampling")), name="static")  # type: ignore[arg-type]
    if name == "eagle2":
        return Eagle2Policy(
            _number(cfg, "policy.depth", int),
            _number(cfg, "policy.top_k", int),
            _number(cfg, "policy.total_tokens", int),
            str(cfg.policy.get("budget", "fixed")),
            cfg.policy.get("calibrate", True),
        )
    if name == "adt":
        from adtbench.policies.adt import build_adt_policy

        return build_adt_policy(cfg.policy)
    raise ConfigError("policy.name", f"unknown policy {name!r}")


def validate_model(cfg: DictConfig) -> None:
    from adtbench.models.registry import FAMILIES

    family = str(_get(cfg, "model.family"))
    if family not in FAMILIES:
        raise ConfigError("model.family", f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    from adtbench.models.registry import resolve_device, resolve_dtype

    dev = resolve_device(_get(cfg, "model.device"))  # accepts auto (cuda if available)
    resolve_dtype(_get(cfg, "model.dtype"), dev)  # accepts auto (bf16 on GPU, fp32 on CPU)


def validate_drafter(cfg: DictConfig, policy: TreePolicy) -> None:
    kind = str(_get(cfg, "drafter.kind"))
    if kind not in ("eagle", "none"):
        raise ConfigError("drafter.kind", f"unknown drafter {kind!r}; choose eagle or none")
    if policy.uses_drafter and kind == "none":
        raise ConfigError("drafter", f"policy={policy.name} drafts a tree and needs a drafter (drafter=eagle)")
    if kind == "eagle":
        path = cfg.drafter.get("path")
        if path is not None and not Path(str(path)).exists():
            raise ConfigError("drafter.path", f"no drafter checkpoint at {path}")


def build_rule(cfg: DictConfig, target: Any) -> AcceptanceRule:
    """The acceptance rule: exact unless ``lantern.enabled`` (relaxed acceptance, ``adtbench.lantern``)."""
    node = cfg.get("lantern")
    if node is None or not bool(node.get("enabled", False)):
        return EXACT
    from adtbench.lantern import build_lantern_rule

    return build_lantern_rule(node, target)


def validate(cfg: DictConfig) -> tuple[SamplingParams, TreePolicy]:
    """Check everything that can be checked without weights. Returns the sampling params and the policy."""
    _number(cfg, "seed", int)
    _number(cfg, "warmup", int, lo=0)
    _number(cfg, "max_tree_nodes", int, lo=1)
    if cfg.get("threads") is not None:
        _number(cfg, "threads", int, lo=1)
    timing_repeats(cfg)
    if engine_compile(cfg) and int(cfg.warmup) < 1:
        raise ConfigError("warmup", "must be ≥ 1 with engine.compile=true (compilation happens in the warm-up)")
    sp = build_sampling(cfg)
    policy = build_policy(cfg)
    if cfg.get("lantern") is not None and bool(cfg.lantern.get("enabled", False)):
        from adtbench.lantern import lantern_params

        lantern_params(cfg.lantern)
    validate_model(cfg)
    validate_drafter(cfg, policy)
    return sp, policy


def timing_repeats(cfg: DictConfig) -> int:
    """``timing.repeats``: timed repetitions of each prompt (an integer ≥ 1; 1 without a ``timing`` node)."""
    if cfg.get("timing") is None:
        return 1
    if not isinstance(cfg.timing, DictConfig):
        raise ConfigError("timing", f"must be a mapping (timing.repeats=...), got {cfg.timing!r}")
    return _number(cfg, "timing.repeats", int, lo=1)


def engine_compile(cfg: DictConfig) -> bool:
    """``engine.compile``: compile the target's (and drafter's) forward before warm-up (false without the node)."""
    if cfg.get("engine") is None:
        return False
    if not isinstance(cfg.engine, DictConfig):
        raise ConfigError("engine", f"must be a mapping (engine.compile=...), got {cfg.engine!r}")
    v = cfg.engine.get("compile", False)
    if not isinstance(v, bool):
        raise ConfigError("engine.compile", f"must be true or false, got {v!r}")
    return v


def prompt_seed(base: int, prompt_id: str) -> int:
    """Per-prompt seed: the first 60 bits of sha256(f"{base}:{prompt_id}") (stable under sharding/resume)."""
    return int(hashlib.sha256(f"{base}:{prompt_id}".encode()).hexdigest()[:15], 16)


RESUME_IGNORED = (
    "dataset.limit", "warmup", "progress", "logger", "save_images", "paths", "threads", "maps",
    "lantern.cache_dir", "eval",
)  # fmt: skip


def config_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config minus keys that may change between a run and its resume."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    for key in RESUME_IGNORED:
        head, _, tail = key.partition(".")
        if tail and isinstance(data.get(head), dict):
            data[head].pop(tail, None)
        elif not tail:
            data.pop(head, None)
    return json.loads(json.dumps(data, sort_keys=True, default=str))
