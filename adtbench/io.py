"""File I/O of the package: atomic writes, fsync'd appends, and reading weights files a user may supply.

Writing (every module that writes a file another process or a later run may read goes through these):

- :func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_write_json`, and
  :func:`atomic_write_with` for writers that need a path (``torch.save``, ``np.save``, safetensors): the data go
  to ``<name>.<pid>.tmp[<suffix>]`` in the target's folder, are fsync'd, moved into place with ``os.replace``
  and the folder is fsync'd. A reader sees the old file or the new one, never half of one; a failed write
  removes its temp file (a killed process may leave one behind, which is never read as the target).
- :func:`append_line_fsync`: one whole line appended with a single ``os.write`` on an ``O_APPEND`` descriptor,
  then fsync; a short write is truncated away, so the file never keeps half a line.

Images: :func:`save_png` is the one PNG writer (run images, maps, exports, training previews): :func:`encode_png`
(a ``uint8`` array or a PIL image, optional text chunks) written with :func:`atomic_write_bytes`.

Reading weights files: safetensors and torch checkpoints, never arbitrary pickles.

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adtbench.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where weights are read, so the write helpers stay light
    import torch

__all__ = [
    "WeightsError",
    "append_line_fsync",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "atomic_write_with",
    "check_weights",
    "encode_png",
    "fsync_dir",
    "load_checkpoint",
    "load_weights",
    "read_safetensors",
    "read_torch",
    "safetensors_header",
    "save_png",
    "temp_path",
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
    import torch

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


def load_checkpoint(path: str | os.PathLike[str]) -> Any:
    """:func:`read_torch` of a checkpoint a model loader was pointed at: ``FileNotFoundError`` naming ``path`` when
    it is missing, :class:`WeightsError` when it is corrupt, truncated or pickles more than tensors."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint not found: {p}")
    return read_torch(p)


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


# ----------------------------------------------------------------------------------------------------
# atomic writes and fsync'd appends
# ----------------------------------------------------------------------------------------------------

PathLike = str | os.PathLike[str]


def fsync_dir(path: PathLike) -> None:
    """fsync a directory so that renames/creations in it are durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(path: PathLike, suffix: str = "") -> Path:
    """The temp file of an atomic write of ``path``: ``<name>.<pid>.tmp<suffix>`` in the same folder."""
    p = Path(path)
    return p.with_name(f"{p.name}.{os.getpid()}.tmp{suffix}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_with(path: PathLike, write: Callable[[Path], Any], *, suffix: str = "") -> None:
    """Atomically create/replace ``path`` with whatever ``write(tmp)`` writes to the temp path ``tmp``.

    ``suffix`` is appended to the temp name for writers that insist on an extension (``np.save``: ``.npy``).
    The parent folder is created when missing. The temp file is fsync'd, moved onto ``path`` with
    ``os.replace`` and the folder fsync'd; on any error the temp file is removed and the error re-raised
    (``path`` keeps its old content).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(p, suffix)
    try:
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(p.parent)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write_with`)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write_with(path, write)


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(
    path: PathLike,
    data: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    newline: bool = True,
    **dumps: Any,
) -> None:
    """``json.dumps(data, indent=indent, sort_keys=sort_keys, **dumps)`` (plus ``\\n`` when ``newline``) written
    atomically as UTF-8. ``dumps`` passes e.g. ``ensure_ascii``, ``allow_nan``, ``default`` through."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, **dumps)
    atomic_write_text(path, text + "\n" if newline else text)


def atomic_torch_save(obj: Any, path: PathLike) -> Path:
    """``torch.save(obj, path)`` atomically, with bytes that depend only on ``obj`` and ``path``'s name.

    ``torch.save`` names the archive inside the file after the file it writes, so a pid-named temp file would
    make every save's bytes different. The temp file therefore has the fixed name ``<name>.tmp`` inside a
    fresh private folder beside ``path`` (unique per writer); it is fsync'd, moved onto ``path`` with
    ``os.replace`` and the folder removed. Returns ``path``.
    """
    import shutil
    import tempfile

    import torch

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent))
    tmp = folder / f"{p.name}.tmp"
    try:
        torch.save(obj, tmp)
        _fsync_file(tmp)
        os.replace(tmp, p)
        fsync_dir(p.parent)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return p


def encode_png(image: Any, text: Mapping[str, str] | None = None) -> bytes:
    """PNG bytes of a ``uint8`` array ``[H, W]``, ``[H, W, 1]``, ``[H, W, 3]`` or ``[H, W, 4]`` (or of a PIL image),
    with ``text`` as tEXt chunks. Any other dtype or shape is a ``ValueError`` naming it."""
    from io import BytesIO

    import numpy as np
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    if isinstance(image, Image.Image):
        pil = image
    else:
        arr = np.asarray(image)
        if arr.dtype != np.uint8:
            raise ValueError(f"image must be uint8, got dtype {arr.dtype}")
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))) or 0 in arr.shape:
            raise ValueError(f"image must have shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got {arr.shape}")
        pil = Image.fromarray(np.ascontiguousarray(arr))
    info = None
    if text:
        info = PngInfo()
        for k, v in text.items():
            info.add_text(k, v)
    buf = BytesIO()
    pil.save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def save_png(image: Any, path: PathLike, text: Mapping[str, str] | None = None) -> Path:
    """Write ``image`` (:func:`encode_png`) to ``path`` atomically, parent folders created; returns ``path``.
    The image is encoded before anything is written, so a bad image leaves ``path`` as it was."""
    data = encode_png(image, text)
    atomic_write_bytes(path, data)
    return Path(path)


def append_line_fsync(path: PathLike, data: bytes | str) -> None:
    """Append ``data`` (one full line, ``\\n``-terminated) with a single ``os.write`` on an O_APPEND fd, then fsync.

    If the kernel reports a short write (disk full), the partial bytes are truncated away before raising, so
    the file never keeps half a line. A newly created file also gets its folder fsync'd.
    """
    p = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if not raw.endswith(b"\n"):
        raise ValueError(f"append_line_fsync needs one full line ending in a newline, got {raw[-20:]!r}")
    created = not p.exists()
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        try:
            n = os.write(fd, raw)
        except OSError:
            os.ftruncate(fd, before)
            raise
        if n != len(raw):
            os.ftruncate(fd, before)
            raise OSError(f"short write to {p}: {n} of {len(raw)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(p.parent)
