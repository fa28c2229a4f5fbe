"""Exceptions shared across adtbench."""

from __future__ import annotations

__all__ = ["ConfigError"]


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
