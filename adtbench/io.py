"""Reading weights files a user may supply: safetensors and torch checkpoints, never arbitrary pickles.

Every loader in the package goes through this module, so a missing, truncated or corrupt file is reported the
same way everywhere:

- :func:`read_safetensors`, :func:`safetensors_header` and :func:`read_torch` raise :class:`WeightsError` (a
  ``ValueError``) whose message names the file and says what is wrong with it ("corrupt or truncated ...");
- :func:`load_weights` / :func:`check_weights` turn that into a :class:`~adtbench.errors.ConfigError` naming the
  config key as well, which the app reports as one line with exit code 2.

Invariants: torch files are only ever read with ``weights_only=True`` (a retry allows a short list of known-safe
numpy/python globals, never arbitrary code); a safetensors file is checked structurally (header JSON, tensor
offsets within the file, file size) before its tensors are read, so truncation is caught without touching the
data.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from adtbench.errors import ConfigError

__all__ = [
    "WeightsError",
    "check_weights",
    "load_weights",
    "read_safetensors",
    "read_torch",
    "safetensors_header",
]

SAFETENSORS_SUFFIX = ".safetensors"
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on the JSON header


class WeightsError(ValueError):
    """A weights file that is missing, corrupt, truncated or unsafe to load; ``str`` names the file."""


def safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a safetensors file, after checking that the file holds every tensor it declares.

    Reads only the header (never the tensor data). Raises :class:`WeightsError` when the file is missing, shorter
    than its header or its tensors' byte ranges, or when the header is not valid JSON.
    """
    p = Path(path)
    if not p.is_file():
        raise WeightsError(f"weights file not found: {p}")
    size = p.stat().st_size
    try:
        with p.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise WeightsError(f"{p} is corrupt or truncated ({size} bytes; not a safetensors file)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise WeightsError(f"{p} is corrupt or truncated (header of {n} bytes in a file of {size})")
            header = json.loads(f.read(n))
    except OSError as e:
        raise WeightsError(f"cannot read weights file {p}: {e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{p} is corrupt (unreadable safetensors header: {e})") from e
    if not isinstance(header, dict):
        raise WeightsError(f"{p} is corrupt (safetensors header is not a mapping)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise WeightsError(f"{p} is corrupt (tensor {name!r} has no valid data_offsets)")
        end = max(end, offsets[1])
    if 8 + n + end != size:
        raise WeightsError(f"{p} is corrupt or truncated ({size} bytes; its header describes {8 + n + end})")
    return header


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (checked by :func:`safetensors_header` first)."""
    from safetensors.torch import load_file

    safetensors_header(path)
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError) for bad files
        raise WeightsError(f"{path} is corrupt: {type(e).__name__}: {e}") from e


def _known_safe_globals() -> list[Any]:
    """Non-tensor types that training checkpoints commonly pickle and that are safe to rebuild.

    numpy scalars/dtypes (Lightning callback state), ``argparse.Namespace`` (LlamaGen stores ``args``) and
    ``_codecs.encode`` (how protocol-2 pickles store bytes of numpy scalars). Nothing here runs code.
    """
    import _codecs
    import argparse

    import numpy as np

    out: list[Any] = [argparse.Namespace, _codecs.encode, np.dtype]
    try:  # numpy >= 2 keeps the scalar reconstructor in numpy._core
        from numpy._core.multiarray import scalar  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import scalar  # type: ignore[no-redef]
    # pickles written under numpy 1.x name it numpy.core.multiarray.scalar: allow both spellings
    out += [(scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar")]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        out.extend(getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType"))
    return out


def read_torch(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)`` with clear errors.

    A file refused because of pickled extras is retried once with :func:`_known_safe_globals` allowed; still
    refused, it raises :class:`WeightsError` naming the unsafe globals and how to convert the file. Never falls
    back to ``weights_only=False``. A truncated or corrupt archive is a :class:`WeightsError` saying so.
    """
    p = Path(path)
    if not p.is_file():
        raise WeightsError(f"weights file not found: {p}")
    if zipfile.is_zipfile(p) is False and _looks_like_zip_start(p):
        raise WeightsError(f"{p} is corrupt or truncated (a torch zip archive without its central directory)")
    try:
        try:
            return torch.load(p, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as first:
            with torch.serialization.safe_globals(_known_safe_globals()):
                try:
                    return torch.load(p, map_location="cpu", weights_only=True)
                except pickle.UnpicklingError as second:
                    try:
                        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(p)
                    except Exception:  # best effort only; the torch message below names the global too
                        unsafe = []
                    raise WeightsError(
                        f"{p}: refusing to unpickle non-tensor objects (weights_only=True; unsafe globals: "
                        f"{unsafe or 'see below'}). If you trust this file, convert it once to a plain tensor dict "
                        f"with torch.load + torch.save({{'state_dict': ...}}) and load the converted file instead."
                        f"\nOriginal error: {second}"
                    ) from first
    except WeightsError:
        raise
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        raise WeightsError(f"{p} is corrupt or truncated (torch.load: {type(e).__name__}: {e})") from e


def _looks_like_zip_start(p: Path) -> bool:
    with p.open("rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _read(path: Path) -> Any:
    return read_safetensors(path) if path.suffix == SAFETENSORS_SUFFIX else read_torch(path)


def load_weights(key: str, path: str | os.PathLike[str]) -> Any:
    """The contents of a weights file (safetensors by suffix, else a torch checkpoint read weights-only).

    Raises ``ConfigError(key, ...)`` naming the file and what is wrong with it (missing, corrupt, unsafe).
    """
    try:
        return _read(Path(path))
    except WeightsError as e:
        raise ConfigError(key, str(e)) from e


def check_weights(key: str, path: str | os.PathLike[str]) -> None:
    """Cheap pre-flight of a weights file before any model is built: existence, and for safetensors the header
    and the file size (:func:`safetensors_header`); for torch archives the zip directory. ``ConfigError(key, ...)``
    on failure."""
    p = Path(path)
    try:
        if p.suffix == SAFETENSORS_SUFFIX:
            safetensors_header(p)
        elif not p.is_file():
            raise WeightsError(f"weights file not found: {p}")
        elif _looks_like_zip_start(p) and not zipfile.is_zipfile(p):
            raise WeightsError(f"{p} is corrupt or truncated (a torch zip archive without its central directory)")
    except WeightsError as e:
        raise ConfigError(key, str(e)) from e
