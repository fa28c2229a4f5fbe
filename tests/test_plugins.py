"""Methods from outside the repo, written as a user would: a package with one module and one yaml, registered by an
``adtbench.policies`` entry point (a ``*.dist-info/entry_points.txt`` on ``PYTHONPATH``: what ``pip install`` would
write; nothing installed, no network), found by ``adtbench.plugins`` and, for its yaml, by Hydra's search path.

- the entropy-gated window (L from ``window_max`` down to ``window_min`` as the target's entropy at the first open
  position rises): a new window rule and a policy using it, editing no file of the repo; the app composes and runs
  it, ``engine.graphs.step=graph`` is refused naming the key before any weights load, and ``adtbench check`` passes
  it;
- a copy of SCD with the SCD authors' stored-proposal rule planted (a kept draft keeps its old proposal q_old, their
  ``…_SCDMC.py``): ``adtbench check`` fails it, naming the law test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_OVERRIDES

ENTROPY_MODULE = '''
"""``policy=sjd_entropy``: SJD whose window shrinks as the target grows unsure.

L = round(window_max − (window_max − window_min) · min(1, H / entropy_max)), H the entropy (nats) of the target's
processed distribution at the first open position of the last forward (the bonus position, row a: its context is
all committed, so L depends on the past only and the law is AR's)."""

from dataclasses import dataclass

from adtbench.algorithm.methods.jacobi.loop import JacobiParams, window_value
from adtbench.algorithm.params import key, parse
from adtbench.algorithm.policies.base import register_method
from adtbench.algorithm.policies.jacobi import JacobiPolicy, jacobi_method
from adtbench.algorithm.methods.jacobi.windows import WINDOWS, FixedWindow


@WINDOWS.register("entropy")
class EntropyWindow(FixedWindow):
    device_step = False  # L changes per forward: the host loop runs it

    def __init__(self, lo, hi, h_max):
        super().__init__(hi)
        self.lo, self.hi, self.h_max = lo, hi, h_max

    @classmethod
    def from_params(cls, params, layout, calibrated):
        return cls(params.window_min, params.window_max, params.entropy_max)

    def reset(self):
        self.L = self.hi

    def observe(self, g, m, a, rows=None):
        p = rows[a].double().softmax(-1)
        h = float(-(p * p.clamp_min(1e-300).log()).sum())
        self.L = round(self.hi - (self.hi - self.lo) * min(1.0, h / self.h_max))


@dataclass(frozen=True)
class EntropyParams(JacobiParams):
    window: int | str = key("entropy", check=window_value)
    redraw: str = key("independent", choices=("independent", "coupled", "gumbel"))
    entropy_max: float = key(4.0, lo=1e-9)


def build(node):
    return JacobiPolicy("sjd_entropy", parse(EntropyParams, node))


register_method(jacobi_method("sjd_entropy", build, EntropyParams, graphs=("verify",),
                              law_keys={"window_min": 2, "window_max": 4}))
'''

ENTROPY_YAML = """# SJD with an entropy-gated window (the plugin's own yaml)
name: sjd_entropy
window: entropy
init: random
redraw: independent
window_min: 2
window_max: 16
entropy_max: 4.0
"""

AUTHORS_SCD_MODULE = '''
"""``policy=scd_authors``: SCD as the authors' code runs it — a draft the coupling keeps stays with its old proposal
q_old (only a replaced draft gets q := p). Lossy: the law test must say so."""

from dataclasses import dataclass

import torch

from adtbench.algorithm.methods.jacobi.loop import JacobiParams, JacobiState
from adtbench.algorithm.params import parse
from adtbench.algorithm.policies.base import register_method
from adtbench.algorithm.policies.jacobi import NAME_DEFAULTS, JacobiPolicy, jacobi_method


class AuthorsState(JacobiState):
    def redraw_rows(self, probs, old, q_old, has_old, noise):
        tok, q, keep = super().redraw_rows(probs, old, q_old, has_old, noise)
        return tok, torch.where(keep[:, None], q_old, q), keep


@dataclass(frozen=True)
class AuthorsParams(JacobiParams):
    @property
    def state_type(self):
        return AuthorsState


def build(node):
    return JacobiPolicy("scd_authors", parse(AuthorsParams, {**NAME_DEFAULTS["scd"], **node}))


register_method(jacobi_method("scd_authors", build, AuthorsParams, graphs=("verify",)))
'''

AUTHORS_SCD_YAML = "name: scd_authors\nwindow: 16\ninit: up\nredraw: coupled\n"


def make_plugin(root: Path, package: str, policy: str, module: str, yaml: str) -> Path:
    """A package ``package`` (``method.py`` + ``conf/policy/<policy>.yaml``) and its dist-info declaring the entry
    point ``<policy> = <package>.method`` under ``root``; returns ``root`` (for PYTHONPATH)."""
    pkg = root / package
    (pkg / "conf" / "policy").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "method.py").write_text(module)
    (pkg / "conf" / "policy" / f"{policy}.yaml").write_text(yaml)
    dist = root / f"{package}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[adtbench.policies]\n{policy} = {package}.method\n")
    return root


def run(args: list[str], plugin: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(ROOT)]), "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def entropy_plugin(tmp_path: Path) -> Path:
    return make_plugin(tmp_path / "site", "entropy_window", "sjd_entropy", ENTROPY_MODULE, ENTROPY_YAML)


def test_a_plugin_registers_its_policy_yaml_and_window_rule(entropy_plugin: Path) -> None:
    """The entry point registers the policy and its window rule; Hydra composes ``policy=sjd_entropy`` from the
    plugin's ``conf/``; the schema (its params class) checks the node; ``engine.graphs.step=graph`` is a
    ``ConfigError`` naming ``engine.graphs.step`` when the policy is built — before any weights load."""
    script = """
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.methods.jacobi.windows import WINDOWS
from adtbench.errors import ConfigError
from adtbench.harness.config import build_policy, compose_config
from adtbench.harness.schema import POLICY_SCHEMAS
cfg = compose_config("config", ["policy=sjd_entropy", "model=tiny_llamagen"])
policy = build_policy(cfg)
print("built", policy.name, policy.params.window, policy.params.entropy_max, policy.lossless)
schema = POLICY_SCHEMAS["sjd_entropy"]
print("names", "sjd_entropy" in POLICIES, "entropy" in WINDOWS, "entropy_max" in schema().__dict__)
for bad in ("engine.graphs.step=graph", "policy.entropy_max=-1", "policy.entropy_maxx=1"):
    try:
        build_policy(compose_config("config", ["policy=sjd_entropy", "model=tiny_llamagen", bad]))
    except ConfigError as e:
        print("refused", e.key)
"""
    proc = run(["-c", script], entropy_plugin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert "built sjd_entropy entropy 4.0 True" in out and "names True True True" in out
    assert [line for line in out if line.startswith("refused")] == [
        "refused engine.graphs.step",
        "refused policy.entropy_max",
        "refused policy.entropy_maxx",
    ]


@pytest.mark.slow
def test_the_entropy_window_as_a_plugin_passes_adtbench_check_and_runs_in_the_app(
    entropy_plugin: Path, tmp_path: Path
) -> None:
    """``adtbench check policy=sjd_entropy``: every check passes (config, greedy = AR, the T = 1 law test, the
    simulated device); ``python run.py policy=sjd_entropy`` decodes with it and writes its summary."""
    proc = run(["-m", "adtbench.cli", "check", "policy=sjd_entropy"], entropy_plugin)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert [line.split(":")[0] for line in lines] == [
        "PASS config",
        "PASS greedy",
        "PASS law",
        "PASS device",
        "PASS policy=sjd_entropy",
    ], lines
    assert "TV detected at 90 % power" in lines[2]
    app = run(["run.py", *TINY_OVERRIDES, "policy=sjd_entropy", "warmup=0", "progress=false",
               "dataset.limit=1", f"hydra.run.dir={tmp_path / 'run'}"], entropy_plugin)  # fmt: skip
    assert app.returncode == 0, app.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.slow
def test_adtbench_check_fails_scd_with_the_authors_stored_proposal(tmp_path: Path) -> None:
    """A copy of SCD whose kept drafts keep q_old (the SCD authors' rule) declares itself lossless;
    ``adtbench check`` fails it on the law test (p < 10⁻³), naming the test, and exits 1."""
    plugin = make_plugin(tmp_path / "site", "scd_authors", "scd_authors", AUTHORS_SCD_MODULE, AUTHORS_SCD_YAML)
    proc = run(["-m", "adtbench.cli", "check", "policy=scd_authors", "policy.init=left"], plugin)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert lines[0].startswith("PASS config") and lines[1].startswith("PASS greedy"), lines
    assert lines[2].startswith("FAIL law: T = 1 law test") and "not AR's" in lines[2], lines
    assert lines[-1] == "FAIL policy=scd_authors: failed law", lines
