"""One registration style for everything a config names: policies, model families, metrics.

    FAMILIES = Registry("model.family")           # the config key whose value selects an entry

    @FAMILIES.register("mini")
    def build_target(cfg: DictConfig) -> Target: ...

    FAMILIES.build("mini", cfg)                   # → the entry's result; unknown names are a ConfigError

An entry is any callable (a builder function, a class, or a policy's ``Method``: callable, and carrying what the
method declares). Entries may also be registered lazily by dotted path
(``"pkg.module:attr"``) so that selecting one family never imports another's heavy dependencies. Invariants:
a name is registered once (a second registration is an error, not an override); lookups never import more
than the selected entry's module; the error for an unknown name names the config key and lists the known names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from adtbench.errors import ConfigError

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Name → builder, for the config key ``key`` (used in error messages)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._entries: dict[str, Callable[..., T] | str] = {}

    def register(self, name: str, target: Callable[..., T] | str | None = None) -> Any:
        """``@reg.register("name")`` on a callable, or ``reg.register("name", "pkg.mod:attr")`` (lazy)."""

        def add(obj: Callable[..., T] | str) -> Callable[..., T] | str:
            if name in self._entries:
                raise ValueError(f"{self.key}: {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return add if target is None else add(target)

    def get(self, name: str) -> Callable[..., T]:
        """The builder registered as ``name`` (importing it if registered by path)."""
        if name not in self._entries:
            raise ConfigError(self.key, f"unknown {self.key} {name!r}; known: {sorted(self._entries)}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
            self._entries[name] = entry
        return entry

    def build(self, name: str, *args: Any, **kwargs: Any) -> T:
        return self.get(name)(*args, **kwargs)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)
