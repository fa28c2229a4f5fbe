"""What a metric needs before it can run, checked without loading any model: its Python packages and its weight files.

- **Packages** (:func:`require_packages`): each metric names the top-level modules it imports (:data:`PACKAGES`);
  one that cannot be found is a ``ConfigError`` naming the metric's key and the pip extra (``adtbench[metrics]``).
  The check is ``importlib.util.find_spec`` (milliseconds) rather than an import (open_clip alone takes seconds), so
  ``python run.py eval=clip`` without the extra fails within the command-line check.
- **Weight files** (:func:`check_weight_file`): the file exists, is not empty, and is in a format the loader reads —
  safetensors (header and declared byte ranges within the file), a torch zip archive (its central directory readable,
  so a truncated download fails here), a TorchScript zip archive (``constants.pkl`` / ``code/`` entries; OpenAI's
  CLIP ``ViT-L-14.pt`` is one, read with ``torch.jit.load``) or a legacy torch pickle (first byte ``0x80``). A format
  the key does not take (a TorchScript archive as a state dict) is refused with the fix.
- **sha256 of known files** (:func:`expected_sha256`): a file whose expected hash is known is hashed and compared.
  Known are (1) ``eval.sha256`` (file name → hex digest, empty by default: no hash is recorded that was not computed
  from the file), (2) torch hub's naming convention ``<name>-<hex prefix>.<ext>`` (``weights-inception-2015-12-05-
  6726825d.pth``, ``vgg16-397923af.pth``: the name carries the first hex digits of the file's sha256, which
  ``torch.hub`` checks on download), (3) OpenAI's CLIP files (``ViT-L-14.pt``, ...), whose download URL in
  open_clip's pretrained table carries the file's sha256 (``.../clip/models/<sha256>/ViT-L-14.pt``; OpenAI's
  ``clip._download`` checks it) — read from the text of open_clip's own table, for files named like them.
  Hashes are memoised in ``eval.cache_dir/hashes.json`` when that folder exists.
"""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

from adtbench.errors import ConfigError
from adtbench.harness.eval.common import file_sha256, require_file

EXTRA = "metrics"
PIP_NAMES = {"open_clip": "open_clip_torch", "torch_fidelity": "torch-fidelity", "scipy": "scipy"}
PACKAGES: dict[str, tuple[str, ...]] = {
    "clip": ("open_clip",),
    "hps": ("open_clip",),
    "aesthetic": ("open_clip",),
    "fid": ("torch_fidelity", "scipy"),
    "is": ("torch_fidelity",),
    "kid": ("torch_fidelity",),
    "prc": ("torch_fidelity",),
    "fd_dinov2": ("torch_fidelity", "scipy"),
}
"""metric → the top-level modules it imports (the ``metrics`` extra installs them)."""

FORMATS = ("safetensors", "torch-zip", "torchscript", "pickle")
STATE_DICT = ("safetensors", "torch-zip", "pickle")
HUB_NAME = re.compile(r"-([a-f0-9]{8,64})\.(?:pth|pt|bin|ckpt)$")
OPENAI_CLIP_URL = re.compile(r"/clip/models/([a-f0-9]{64})/([^/\"']+\.pt)")


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package missing, or sys.modules[module] = None (blocked)
        return True


def require_packages(metric: str, key: str | None = None) -> None:
    """Every module :data:`PACKAGES` lists for ``metric`` can be imported; else ``ConfigError(key, ...)`` (key:
    ``eval.<metric>``) naming the package and ``pip install 'adtbench[metrics]'``."""
    for module in PACKAGES.get(metric, ()):
        if _missing(module):
            pip = PIP_NAMES.get(module, module)
            raise ConfigError(
                key or f"eval.{metric}",
                f"eval metric {metric!r} needs the Python package {pip} (import {module}), which is not installed; "
                f"pip install 'adtbench[{EXTRA}]' (or pip install {pip})",
            )


def weight_format(path: Path) -> str:
    """The format of a weights file (one of :data:`FORMATS`); ``ValueError`` naming what is wrong when it is empty,
    truncated or none of them."""
    size = path.stat().st_size
    if size == 0:
        raise ValueError("is empty (0 bytes): an interrupted download? fetch the file again")
    with path.open("rb") as f:
        head = f.read(8)
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise ValueError(f"is a truncated or corrupt zip archive ({e}): fetch the file again") from None
        if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
            return "torchscript"
        if any(n.endswith("data.pkl") for n in names):
            return "torch-zip"
        raise ValueError("is a zip archive but not a torch checkpoint (no data.pkl)")
    if head[:1] == b"\x80":  # pickle protocol ≥ 2: torch's legacy (non-zip) format
        return "pickle"
    if len(head) == 8:
        n = struct.unpack("<Q", head)[0]
        if 2 <= n <= min(size - 8, 100_000_000):
            with path.open("rb") as f:
                f.seek(8)
                raw = f.read(n)
            try:
                header = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                header = None
            if isinstance(header, dict):
                ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
                if 8 + n + max(ends, default=0) > size:
                    raise ValueError(f"is a truncated safetensors file ({size} bytes, its header declares more)")
                return "safetensors"
    raise ValueError("is not a safetensors, torch or TorchScript weights file (unknown header)")


def _openai_hashes() -> dict[str, str]:
    """OpenAI CLIP file name → sha256, from the download URLs in open_clip's pretrained table — read from the text of
    the installed open_clip package's ``pretrained`` module, without importing it (that takes seconds)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return {}
    source = Path(next(iter(spec.submodule_search_locations))) / "pretrained.py"
    text = source.read_text() if source.is_file() else ""
    return {m.group(2): m.group(1) for m in OPENAI_CLIP_URL.finditer(text)}


def expected_sha256(path: Path, table: Any = None) -> tuple[str, str] | None:
    """``(expected hex digest or prefix, where it comes from)`` for a known file, else None (module docstring)."""
    name = path.name
    entry = table.get(name) if hasattr(table, "get") else None  # a file name has dots: never a dotted lookup
    if entry is not None:
        return str(entry).lower(), "eval.sha256"
    hit = HUB_NAME.search(name)
    if hit is not None:
        return hit.group(1), "the torch hub file name's hash prefix"
    if name.endswith(".pt") and name.startswith(("RN", "ViT-")) and not _missing("open_clip"):
        digest = _openai_hashes().get(name)
        if digest is not None:
            return digest, "OpenAI's download URL (open_clip's pretrained table)"
    return None


def check_weight_file(
    value: Any,
    key: str,
    expected: str,
    *,
    formats: tuple[str, ...] = STATE_DICT,
    table: Any = None,
    cache_dir: Any = None,
) -> tuple[Path, str]:
    """The checks of the module docstring on config value ``value`` at ``key``: returns ``(path, format)``; every
    failure is one ``ConfigError(key, ...)`` naming the file, what is wrong and what was expected."""
    path = require_file(value, key, expected)
    try:
        fmt = weight_format(path)
    except ValueError as e:
        raise ConfigError(key, f"{path} {e}; expected {expected}") from None
    if fmt not in formats:
        if fmt == "torchscript":
            why = "a TorchScript archive, which this key does not load; give the state-dict checkpoint"
        else:
            why = f"a {fmt} file; this key takes {', '.join(formats)}"
        raise ConfigError(key, f"{path} is {why} (expected {expected})")
    known = expected_sha256(path, table)
    if known is not None:
        digest, source = known
        cache = Path(str(cache_dir)).expanduser() if cache_dir is not None else None
        actual = file_sha256(path, cache if cache is not None and cache.is_dir() else None)
        if not actual.startswith(digest):
            raise ConfigError(
                key,
                f"{path} has sha256 {actual[:16]}…, expected {digest[:16]}… ({source}): a corrupt or different file",
            )
    return path, fmt
