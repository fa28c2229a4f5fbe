"""The wheel ships what a non-editable install needs: every subpackage and ``conf/`` as ``adtbench/conf``, from
which ``adtbench.resources.conf_dir`` composes the same config as a checkout."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_explicit_package_list_matches_the_tree() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("adtbench", "hydra_plugins")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert listed == found | {"adtbench.conf"}, "pyproject [tool.setuptools] packages is out of date"


@pytest.mark.slow
def test_wheel_ships_conf_and_composes_outside_a_checkout(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q"]
    build = subprocess.run([*cmd, "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    if build.returncode != 0 and "No module named pip" in build.stderr:
        pytest.skip("pip is not available in this environment")
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("adtbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    yamls = {f"adtbench/conf/{p.relative_to(ROOT / 'conf').as_posix()}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert yamls and yamls <= names, sorted(yamls - names)[:5]
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # an installed wheel: no checkout conf/ beside the package
    probe = (
        "from hydra import compose, initialize_config_dir\n"
        "from adtbench.harness.config import register_resolvers\n"
        "from adtbench.resources import conf_dir\n"
        "register_resolvers()\n"
        "with initialize_config_dir(version_base='1.3', config_dir=str(conf_dir())):\n"
        "    cfg = compose('config')\n"
        "print(conf_dir(), cfg.model.name, cfg.policy.name, cfg.policy.window)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    conf, model, policy, window = out.stdout.split()
    assert Path(conf) == site / "adtbench" / "conf" and (model, policy, window) == ("mini", "scd", "cost")
