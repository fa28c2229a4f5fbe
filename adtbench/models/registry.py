"""Model families: ``model.family`` → the adapter module's ``build_target(cfg)``.

A new model is one adapter file implementing ``Target`` plus one entry here and one yaml in
``conf/model/``.
"""

from __future__ import annotations

import importlib
from typing import Any

from adtbench.errors import ConfigError
from adtbench.models.base import Target

FAMILIES: dict[str, str] = {
    "llamagen": "adtbench.models.llamagen",
    "chameleon": "adtbench.models.chameleon",
    "mini": "adtbench.models.mini",
}


def build_target(cfg: Any) -> Target:
    family = str(cfg.family)
    if family not in FAMILIES:
        raise ConfigError("model.family", f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    return importlib.import_module(FAMILIES[family]).build_target(cfg)
