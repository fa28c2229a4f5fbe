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


def test_shared_value_checks_name_the_key() -> None:
    """``adtbench.errors``' checks are the one spelling of number / choice / flag errors (MuLo-SD's parameters,
    LANTERN's node and the harness's config checks use them)."""
    from adtbench.algorithm.methods.mulo import mulo_params
    from adtbench.errors import check_choice, check_flag, check_number
    from adtbench.harness.caches import lantern_params

    assert check_number(3, "a.n", int, lo=1) == 3 and check_number(2, "a.x", float, hi=2.0) == 2.0
    for value, kind, msg in ((True, int, "an integer"), (1.5, int, "an integer"), ("1", float, "a number"),
                             (float("nan"), float, "a number"), (0, int, "≥ 1"), (5, int, "≤ 4")):  # fmt: skip
        with pytest.raises(ConfigError, match=msg) as ei:
            check_number(value, "a.n", kind, lo=1, hi=4)
        assert ei.value.key == "a.n"
    assert check_choice("ar", "a.c", ("ar", "zipar")) == "ar" and check_flag(False, "a.f") is False
    with pytest.raises(ConfigError, match=r"must be one of \['ar', 'zipar'\], got 'x'"):
        check_choice("x", "a.c", ("ar", "zipar"))
    with pytest.raises(ConfigError, match="must be true or false, got 'yes'"):
        check_flag("yes", "a.f")
    for node, message in (({"draft": "x"}, "policy.draft: must be one of ['ar', 'zipar'], got 'x'"),
                          ({"k": -1}, "policy.k: must be ≥ 0, got -1"), ({"tau": True}, "policy.tau: must be a number, "
                          "got True")):  # fmt: skip
        with pytest.raises(ConfigError) as ei:
            mulo_params(node)
        assert str(ei.value) == message
    with pytest.raises(ConfigError) as ei:
        lantern_params({"normalize": "yes"})
    assert str(ei.value) == "lantern.normalize: must be true or false, got 'yes'"
