"""Loading the mini evaluator (``eval.mini.loader`` / ``eval.mini.path``): one more model behind the eval layer.

Below both users: ``eval.features`` (the ``mini`` feature extractor for FID / precision-recall) and
``eval.mini`` (caption agreement and the ``mini_*`` set metrics), so neither imports the other to get it.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from typing import Any

import torch

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import file_sha256, node_get
from adtbench.harness.eval.context import EvalContext

DEFAULT_LOADER = "adtbench.models.mini.evaluator:load_mini_evaluator"


def _resolve_loader(spec: str) -> tuple[Any, Any]:
    """(module, loader function) of ``"module:function"``."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError("eval.mini.loader", f"expected 'module:function', got {spec!r}")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and module.startswith(e.name):
            raise ConfigError("eval.mini.loader", f"module {module!r} is not available in this version") from None
        raise
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ConfigError("eval.mini.loader", f"{module} has no callable {attr!r}")
    return mod, fn


def _weights_path(ecfg: Any, mod: Any) -> Path | None:
    """``eval.mini.path``, else the module's ``DEFAULT_PATH`` (its shipped weights), else None."""
    path = node_get(ecfg, "mini.path")
    if path is not None:
        return Path(str(path)).expanduser()
    default = getattr(mod, "DEFAULT_PATH", None)
    return None if default is None else Path(default)


def _hash_path(path: Path, ctx: EvalContext) -> str:
    if path.is_file():
        return file_sha256(path, ctx.cache_dir)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(path)}:{file_sha256(p, ctx.cache_dir)}\n".encode())
    return h.hexdigest()


MISSING = "the mini evaluator weights (model.safetensors + config.json; `adtbench train evaluator` writes them)"


def validate(ecfg: Any) -> None:
    """The loader must import and the weights path (set, or the module's default) must exist; nothing loaded."""
    mod, _ = _resolve_loader(str(node_get(ecfg, "mini.loader", DEFAULT_LOADER)))
    path = _weights_path(ecfg, mod)
    if path is not None and not path.exists():
        raise ConfigError("eval.mini.path", f"no file or folder at {str(path)!r}; expected {MISSING}")


def load(ecfg: Any, ctx: EvalContext) -> tuple[Any, str]:
    """The mini evaluator (``ctx.inject["mini"]`` wins) and an identity string (weights sha256) for caches."""
    if ("mini", "model") in ctx.memo:
        return ctx.memo[("mini", "model")]
    if "mini" in ctx.inject:
        ev = ctx.inject["mini"]
        ident = str(getattr(ev, "ident", type(ev).__name__))
        weights = None
    else:
        mod, fn = _resolve_loader(str(node_get(ecfg, "mini.loader", DEFAULT_LOADER)))
        path = node_get(ecfg, "mini.path")
        try:
            ev = fn(str(Path(str(path)).expanduser())) if path is not None else fn()
        except FileNotFoundError as e:
            raise ConfigError("eval.mini.path", f"{e}; expected {MISSING}") from None
        weights = _weights_path(ecfg, mod)
        ident = _hash_path(weights, ctx) if weights is not None and weights.exists() else type(ev).__name__
    if isinstance(ev, torch.nn.Module):
        ev = ev.to(ctx.device).eval()
    ctx.memo[("mini", "model")] = (ev, ident)
    ctx.memo[("mini", "weights")] = weights
    return ev, ident
