"""What the registry drives: every list that was kept by hand is derived from the methods' declarations
(``algorithm.policies.base.Method``), and these tests hold the derived copies to it.

- the schema registry (``harness.schema.POLICY_SCHEMAS``) is the methods' schemas;
- the table of declarations in docs/development.md is ``harness.check.law_table()``'s;
- every shipped method that declares itself lossless and runs on the tiny models has a law test at the headline
  power: its case in ``tests/test_laws.py``, else ``adtbench check``'s at the full tier, here; the simulated-app
  cases are checked in ``tests/test_simulated.py``;
- every window rule declares whether the device step runs it, and ``engine.graphs.step=graph`` is refused (a
  ``ConfigError`` naming ``engine.graphs.step``, when the policy is built) exactly for the rules that declare it
  cannot;
- ``adtbench check``'s config check passes every shipped method.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from omegaconf import OmegaConf
from test_laws import HEADLINE

from adtbench.algorithm.methods.jacobi.windows import WINDOWS, FixedWindow
from adtbench.algorithm.policies import POLICIES, Method, methods
from adtbench.algorithm.policies.base import method_of
from adtbench.errors import ConfigError
from adtbench.harness import check, schema
from adtbench.harness.config import build_policy

SHIPPED = [m.name for m in methods() if m.build.__module__.startswith("adtbench.")]


def test_the_schema_registry_is_the_methods() -> None:
    assert sorted(schema.POLICY_SCHEMAS) == POLICIES.names()
    for m in methods():
        fields = set(schema.POLICY_SCHEMAS[m.name].__dataclass_fields__)
        assert fields == set(m.schema_type.__dataclass_fields__) | {"name"}, m.name


def test_the_declarations_table_in_the_docs_is_the_registrys() -> None:
    text = (ROOT / "docs" / "development.md").read_text()
    table = text.split("<!-- methods:begin -->\n", 1)[1].split("\n<!-- methods:end -->", 1)[0]
    assert table == check.law_table(), "regenerate it: adtbench check --law-table"


LOSSLESS = [n for n in SHIPPED if method_of(n).lossless and method_of(n).tiny and n != "ar"]  # AR is the law
UNCOVERED = [n for n in LOSSLESS if not any(case.startswith(f"{n}-") for case in HEADLINE)]
NONE_UNCOVERED = pytest.param("", marks=pytest.mark.skip(reason="every lossless method has a headline law case"))


@pytest.mark.slow
@pytest.mark.parametrize("name", UNCOVERED or [NONE_UNCOVERED])
def test_a_lossless_method_without_a_headline_case_passes_the_full_law_test(name: str) -> None:
    """A shipped method that declares itself lossless and has no headline case in ``tests/test_laws.py`` (a new
    one) gets ``adtbench check``'s law test at the full tier (N = 6500, TV ≤ 0.05 at 90 % power) here."""
    verdict = check.check_law(check.compose_subject([f"policy={name}"]), check.TIERS["full"])
    assert verdict.status == "PASS", verdict.line()


def test_a_method_declares_known_graph_paths_only() -> None:
    with pytest.raises(ValueError, match="unknown graph paths"):
        Method("x", lambda node: None, "adtbench.harness.schema:ArConf", graphs=("warp",))  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize("rule", WINDOWS.names())
def test_step_graph_is_refused_exactly_for_the_window_rules_that_say_so(rule: str) -> None:
    cls = WINDOWS.get(rule)
    assert isinstance(cls, type) and issubclass(cls, FixedWindow)
    cfg = OmegaConf.create(
        {"policy": {"name": "scd", "window": rule, "init": "random"}, "engine": {"graphs": {"step": "graph"}}}
    )
    if cls.device_step:
        assert build_policy(cfg).graphs.step == "graph"
    else:
        with pytest.raises(ConfigError) as e:
            build_policy(cfg)
        assert e.value.key == "engine.graphs.step" and f"window={rule}" in str(e.value)


@pytest.mark.parametrize("name", SHIPPED)
def test_adtbench_check_config_passes_every_shipped_method(name: str) -> None:
    verdict = check.check_config(check.compose_subject([f"policy={name}"]))
    assert verdict.status == "PASS", verdict.line()


def test_adtbench_check_refuses_an_unknown_policy_and_a_bad_word(capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main(["policy=no_such_method"]) == 2
    assert "policy: unknown policy 'no_such_method'" in capsys.readouterr().err
    assert check.main(["policy=scd", "tier=full"]) == 2
    assert check.main(["policy=scd", "check.tier=huge"]) == 2


def test_adtbench_check_skips_what_the_tiny_models_cannot_run() -> None:
    """MuLo-SD needs a low-resolution model (``Method.tiny`` False): config is checked, the rest skipped with the
    reason, and the verdict passes (one line per check)."""
    lines: list[str] = []
    assert check.run_checks(["policy=mulo"], out=lines.append)
    assert [line.split(":")[0] for line in lines] == [
        "PASS config",
        "SKIP greedy",
        "SKIP law",
        "SKIP device",
        "PASS policy=mulo",
    ]
    assert "Method.tiny = False" in lines[1]
