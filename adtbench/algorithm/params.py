"""A method's keys declared once: one frozen dataclass is its schema, its parser and its defaults.

    @dataclass(frozen=True)
    class MyParams:
        window: int = key(16, lo=1)                       # an integer ≥ 1
        init: str = key("random", choices=INITS)          # one of INITS
        gap: float = key(0.15, lo=0.0)                    # a real number ≥ 0
        def __post_init__(self) -> None: ...              # cross-key rules: raise ConfigError naming the key

    parse(MyParams, {"window": 8}, prefix="policy")       # → MyParams(window=8, …)

``parse`` checks every key of the node (an unknown key, a wrong type, a value out of range or not among the choices
is a ``ConfigError`` naming ``<prefix>.<key>``; a string is never coerced to a number or a flag) and builds the
dataclass, whose ``__post_init__`` holds the rules between keys. The same class is the typed schema the harness
merges the composed config into (``harness.schema``: the policy's ``Method.schema``), so the yaml, the schema and the
parser cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from adtbench.errors import ConfigError, check_choice, check_flag, check_number

T = TypeVar("T")

__all__ = ["key", "parse"]


def key(
    default: Any,
    *,
    choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    check: Callable[[Any, str], Any] | None = None,
) -> Any:
    """A dataclass field with its default and its rule: ``choices`` (or a callable returning them, for a registry),
    ``lo`` / ``hi`` bounds (the kind — int, float, flag — is the default's type), or ``check(value, full_key) →
    value`` for anything else."""
    rule = {"choices": choices, "lo": lo, "hi": hi, "check": check}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=rule)
    return dataclasses.field(default=default, metadata=rule)


def check_value(f: dataclasses.Field, value: Any, full: str) -> Any:
    """``value`` of field ``f`` checked by its rule (``key``); None passes where the default is None."""
    rule, default = f.metadata, f.default
    if rule.get("check") is not None:
        return rule["check"](value, full)
    if value is None and default is None:
        return None
    choices = rule.get("choices")
    if choices is not None:
        return check_choice(value, full, choices() if callable(choices) else choices)
    if isinstance(default, bool):
        return check_flag(value, full)
    if isinstance(default, int | float):
        return check_number(value, full, type(default), rule.get("lo"), rule.get("hi"))
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(full, f"must be a string, got {value!r}")
    return value


def parse(cls: type[T], node: dict[str, Any], prefix: str = "policy", ignore: Iterable[str] = ("name",)) -> T:
    """``cls`` (a dataclass declared with ``key`` fields) from a plain node: every key checked (module docstring);
    keys in ``ignore`` (the registry's ``name``) are skipped."""
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    skip = set(ignore)
    values = {}
    for k, v in node.items():
        if k in skip:
            continue
        if k not in known:
            raise ConfigError(f"{prefix}.{k}", f"unknown key; known: {sorted(known)}")
        values[k] = check_value(known[k], v, f"{prefix}.{k}")
    return cls(**values)
