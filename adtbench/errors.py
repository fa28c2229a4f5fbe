"""The user-facing configuration error, and the value checks every config validator shares.

``ConfigError(key, message)`` always names the config key. :func:`check_number`, :func:`check_choice` and
:func:`check_flag` are the one spelling of "a number / integer in a range", "one of these options" and "true or
false" for every validator (the harness's config checks, MuLo-SD's parameters, ...): each returns the value
(numbers converted to the asked kind) or raises ``ConfigError`` naming the key and the value it got.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["ConfigError", "check_choice", "check_flag", "check_number"]


class ConfigError(ValueError):
    """A user-facing configuration error that names the offending config key.

    ``str(err)`` is ``"<key>: <message>"`` (e.g. ``"dataset.path: file not found: /x/y.tsv"``), so the
    message always tells the user which Hydra key to fix. The key is also available as ``err.key``.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str]]:
        # Keep the two-argument constructor working across pickling (multiprocessing / joblib launchers).
        return (type(self), (self.key, self.message))


def check_number(value: Any, key: str, kind: type = float, lo: float | None = None, hi: float | None = None) -> Any:
    """``value`` as ``kind`` (``int``: an integer, never a bool or a float; ``float``: any real number but a bool
    or NaN) within ``[lo, hi]`` (each bound optional); else ``ConfigError`` naming ``key``."""
    v = value
    if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not isinstance(v, int)):
        raise ConfigError(key, f"must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    if isinstance(v, float) and math.isnan(v):
        raise ConfigError(key, f"must be a number, got {v!r}")
    if lo is not None and v < lo:
        raise ConfigError(key, f"must be ≥ {lo}, got {v}")
    if hi is not None and v > hi:
        raise ConfigError(key, f"must be ≤ {hi}, got {v}")
    return kind(v)


def check_choice(value: Any, key: str, options: Iterable[str]) -> str:
    """``value`` if it is one of ``options``; else ``ConfigError`` naming ``key`` and the options."""
    opts = list(options)
    if not isinstance(value, str) or value not in opts:
        raise ConfigError(key, f"must be one of {opts}, got {value!r}")
    return value


def check_flag(value: Any, key: str) -> bool:
    """``value`` if it is ``True`` or ``False`` (not a string or a number); else ``ConfigError`` naming ``key``."""
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")
    return value
