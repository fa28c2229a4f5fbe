"""Where the package's own files are (the Hydra config tree, the project root) and what the machine offers
(the cores this process may use, the load average) — read by the timer, the cost model and the benchmarks.

``conf/`` lives at the top of the checkout (``conf/<group>/<option>.yaml``, as in lightning-hydra-template) and
is also shipped inside the wheel as ``adtbench/conf`` (``pyproject.toml`` maps it), so an installed, non-editable
adtbench composes the same configs. Invariant: a checkout (or editable install) always uses its own ``conf/``
— edits there take effect — and only an installed wheel falls back to the packaged copy.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_CONF = PACKAGE_DIR.parent / "conf"
_PACKAGED_CONF = PACKAGE_DIR / "conf"


def conf_dir() -> Path:
    """The Hydra config directory: the checkout's ``conf/``, else the copy shipped in the wheel."""
    for candidate in (_CHECKOUT_CONF, _PACKAGED_CONF):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"adtbench's configs are missing: neither {_CHECKOUT_CONF} nor {_PACKAGED_CONF} exists")


def project_root() -> Path:
    """The folder relative paths resolve against by default (``paths.root_dir``): the checkout holding ``conf/``,
    or, for an installed wheel, the current working directory."""
    return _CHECKOUT_CONF.parent if (_CHECKOUT_CONF / "config.yaml").is_file() else Path.cwd()


def root_dir() -> Path:
    """The default of ``paths.root_dir`` (``conf/paths/default.yaml``): ``$ADTBENCH_ROOT`` when set, else
    :func:`project_root` — where ``outputs/`` goes and what relative paths mean."""
    env = os.environ.get("ADTBENCH_ROOT")
    return Path(env).expanduser() if env else project_root()


def cpus_available() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where affinity is unsupported)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None
