"""The one registration style (``adtbench.registry``)."""

from __future__ import annotations

import pytest

from adtbench.errors import ConfigError
from adtbench.registry import Registry


def test_register_build_and_errors() -> None:
    reg: Registry[int] = Registry("policy")

    @reg.register("one")
    def one(x: int) -> int:
        return x + 1

    reg.register("lazy", "math:floor")
    assert reg.build("one", 1) == 2 and reg.build("lazy", 2.7) == 2
    assert "one" in reg and reg.names() == ["lazy", "one"] and list(reg) == ["lazy", "one"]
    with pytest.raises(ConfigError, match=r"policy: unknown policy 'two'; known: \['lazy', 'one'\]"):
        reg.build("two")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("one", one)
