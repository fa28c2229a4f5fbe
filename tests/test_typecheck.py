"""The algorithm layer type-checks clean under mypy (configured in ``pyproject.toml`` ``[tool.mypy]``).

Invariant: ``ALGORITHM_LAYER`` is exactly the ``files`` list of ``[tool.mypy]``, so ``mypy`` with no arguments
(pre-commit, a developer's shell) and this test check the same modules. Skipped when mypy is not installed.
mypy's incremental cache lives in pytest's cache dir (``.pytest_cache/d/mypy``, git-ignored): about 13 s on one
idle core when it is cold (torch's inline types dominate), about 2 s when warm; mypy re-checks whatever changed.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ALGORITHM_LAYER = [
    "adtbench/algorithm",
    "adtbench/layout.py",
    "adtbench/errors.py",
    "adtbench/registry.py",
    "adtbench/sampling_params.py",
]


def test_mypy_files_are_the_algorithm_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["files"] == ALGORITHM_LAYER
    assert config["follow_imports"] == "silent"


@pytest.mark.slow
def test_algorithm_layer_is_mypy_clean(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[dev]')")
    store = getattr(request.config, "cache", None)  # None under ``-p no:cacheprovider``: a cold temp cache
    cache = store.mkdir("mypy") if store is not None else tmp_path / "mypy_cache"
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache)]
    proc = subprocess.run([*cmd, *ALGORITHM_LAYER], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = sum(len(list((ROOT / f).rglob("*.py"))) if (ROOT / f).is_dir() else 1 for f in ALGORITHM_LAYER)
    assert f"no issues found in {n} source files" in proc.stdout
