"""What the user sets in ``sampling:`` (and a model's ``lm_sampling`` / ``detok_sampling``): ``SamplingParams`` and
its one checked constructor ``build_sampling``. Plain values, so every layer may hold them — the models' own
unspeculated stages (Tar) included; the law that applies them to logits is ``algorithm.sampling``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adtbench.errors import ConfigError, check_number


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; ``top_k <= 0`` and ``top_p >= 1`` switch those filters off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def use_cfg(self) -> bool:
        return self.cfg_scale != 1.0


SAMPLING_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    "temperature": (float, 0.0, None), "top_k": (int, 0, None), "top_p": (float, None, 1.0),
    "cfg_scale": (float, 0.0, None),
}  # fmt: skip


def build_sampling(node: Any, key: str = "sampling") -> SamplingParams:
    """The one place a ``SamplingParams`` is made from config: ``node`` is a sampling mapping (``cfg.sampling``,
    a training stage's ``sampling`` / ``teacher.sampling``, a model's ``lm_sampling``, or a dict) with any of
    ``temperature``, ``top_k``, ``top_p``, ``cfg_scale``; an absent key takes ``SamplingParams``' default, a
    ``???`` one is an error. Checked: types (no bools; ``top_k`` an integer), temperature ≥ 0, top_k ≥ 0,
    top_p in (0, 1], cfg_scale ≥ 0. Errors name ``<key>.<field>`` (``<field>`` when ``key`` is empty).
    Any ``Mapping`` works (an OmegaConf ``DictConfig`` is one), so this layer needs no config library."""
    if node is None or not isinstance(node, Mapping):
        raise ConfigError(key or "sampling", f"must be a mapping of {sorted(SAMPLING_FIELDS)}, got {node!r}")
    values: dict[str, Any] = {}
    for name, (kind, lo, hi) in SAMPLING_FIELDS.items():
        full = f"{key}.{name}" if key else name
        if name not in list(node.keys()):  # a DictConfig is False for `in` on a ??? value; keys() hold it
            continue
        try:
            raw = node[name]
        except Exception as e:  # OmegaConf's MissingMandatoryValue for ``???`` (caught by name: no import here)
            if type(e).__name__ != "MissingMandatoryValue":
                raise
            raise ConfigError(full, f"is required (value ???) — set it on the command line, e.g. {full}=...") from e
        values[name] = check_number(raw, full, kind, lo, hi)
    if values.get("top_p", 1.0) <= 0.0:
        raise ConfigError(f"{key}.top_p" if key else "top_p", f"must be in (0, 1], got {values['top_p']}")
    return SamplingParams(**values)
