"""Shared pieces of the evaluation stage: pairing images with prompts, weight-file checks and hashes, image
preprocessing, devices and the reference set.

Pairing rule (``docs/algorithms.md`` §10 item 23): a run's images are paired with their prompts through
``samples.jsonl`` — each record names its ``prompt_id``, its prompt text and its image file — never by sorting
file names or by position in a caption list.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from adtbench.errors import ConfigError
from adtbench.harness.rundir import has_samples
from adtbench.harness.rundir_write import ResultStore
from adtbench.io import atomic_write_json

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
RESAMPLE = {
    "lanczos": Image.Resampling.LANCZOS,
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}


@dataclass(frozen=True)
class EvalSample:
    """One generated image and the prompt it was generated from."""

    prompt_id: str
    prompt: str
    image_path: Path
    meta: dict[str, Any]


def load_run_samples(run_dir: str | os.PathLike[str]) -> list[EvalSample]:
    """The run's (prompt_id, prompt, image) triples from ``samples.jsonl``, in commit order.

    Raises:
        ConfigError: no ``samples.jsonl``, a record without an image (``save_images=false``) or a missing file.
    """
    run = Path(run_dir)
    if not has_samples(run):
        raise ConfigError("eval", f"{run} holds no samples.jsonl: nothing to evaluate")
    out = []
    for rec in ResultStore(run).records():
        pid = rec["prompt_id"]
        rel = rec.get("image")
        if not rel:
            raise ConfigError("save_images", f"prompt {pid!r} in {run} has no image; decode with save_images=true")
        path = run / rel
        if not path.is_file():
            raise ConfigError("eval", f"image of prompt {pid!r} missing: {path}")
        out.append(EvalSample(pid, str(rec.get("prompt", "")), path, dict(rec.get("meta") or {})))
    return out


def prompt_ids_digest(ids: Sequence[str]) -> str:
    """Order-independent sha256 of a set of prompt ids (to tell which samples an evaluation covered)."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------
# config access, weight files, hashes
# ----------------------------------------------------------------------------------------------------


def node_get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg.a.b`` for dotted ``key`` on DictConfig/dicts; ``default`` when absent or None."""
    node = cfg
    for part in key.split("."):
        if node is None:
            return default
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def require_file(value: Any, key: str, expected: str) -> Path:
    """Check that config value ``value`` (at ``key``) names an existing local file; return it.

    Nothing is ever downloaded: a missing or unset path is a :class:`ConfigError` naming ``key`` and the
    file that was expected (``expected``, e.g. ``"weights-inception-2015-12-05-6726825d.pth"``).
    """
    if value is None or str(value).strip() in ("", "???"):
        raise ConfigError(key, f"not set; point it at a local file: {expected} (weights are never downloaded)")
    p = Path(str(value)).expanduser()
    if not p.is_file():
        raise ConfigError(key, f"no file at {str(value)!r} (resolved {p.absolute()}); expected {expected}")
    return p


def require_dir(value: Any, key: str, expected: str) -> Path:
    """Like :func:`require_file` for a directory."""
    if value is None or str(value).strip() in ("", "???"):
        raise ConfigError(key, f"not set; point it at a local directory: {expected}")
    p = Path(str(value)).expanduser()
    if not p.is_dir():
        raise ConfigError(key, f"no directory at {str(value)!r} (resolved {p.absolute()}); expected {expected}")
    return p


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> str:
    """sha256 of a (weights) file, memoised in ``cache_dir/hashes.json`` under (path, size, mtime).

    Multi-GB checkpoints are hashed once per file version; concurrent jobs may race on the cache, which only
    costs a recomputation (the cache is replaced atomically).
    """
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    cache = Path(cache_dir) / "hashes.json" if cache_dir is not None else None
    table: dict[str, str] = {}
    if cache is not None and cache.exists():
        try:
            table = json.loads(cache.read_text())
        except (OSError, json.JSONDecodeError):
            table = {}
        if key in table:
            return table[key]
    digest = _sha256(p)
    if cache is not None:
        table[key] = digest
        atomic_write_json(cache, table, indent=1, newline=False)
    return digest


def weights_record(path: Path | None, cache_dir: Any) -> dict[str, Any] | None:
    """``{"path", "sha256", "bytes"}`` of a weights file (None when the metric uses no file)."""
    if path is None:
        return None
    return {"path": str(path), "sha256": file_sha256(path, cache_dir), "bytes": path.stat().st_size}


def package_version(name: str) -> str | None:
    """Installed version of distribution ``name`` (None when not installed)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pick_device(spec: Any, target: Any = None) -> torch.device:
    """``auto`` → the target's CUDA device when evaluating right after decoding, else CUDA if present, else CPU."""
    s = str(spec or "auto")
    if s != "auto":
        dev = torch.device(s)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("eval.device", f"{s!r} requested but no CUDA device is available")
        return dev
    dev = getattr(target, "device", None)
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------------------------------
# images
# ----------------------------------------------------------------------------------------------------


def open_rgb(path: Path) -> Image.Image:
    """Open an image file as RGB (palette/alpha/grey converted)."""
    with Image.open(path) as im:
        return im.convert("RGB")


def center_square(im: Image.Image, side: int, resize: str) -> Image.Image:
    """Centre-crop to a square, then resize to ``side`` × ``side`` with PIL filter ``resize``."""
    if resize not in RESAMPLE:
        raise ConfigError("eval.preprocess.resize", f"unknown filter {resize!r}; choose from {sorted(RESAMPLE)}")
    w, h = im.size
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    im = im.crop((left, top, left + s, top + s))
    return im if s == side else im.resize((side, side), RESAMPLE[resize])


def to_uint8_tensor(images: Sequence[Image.Image]) -> torch.Tensor:
    """PIL RGB images of one size → uint8 ``[N, 3, H, W]``."""
    arr = np.stack([np.asarray(im, dtype=np.uint8) for im in images])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()


def batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Consecutive slices of ``items`` of at most ``size`` elements."""
    size = max(1, int(size))
    for i in range(0, len(items), size):
        yield items[i : i + size]


def npz_arrays(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """``{name: (shape, dtype)}`` of the arrays in an ``.npz`` file, read from their ``.npy`` headers only (an ADM
    reference batch holds gigabytes of images)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            with z.open(name) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
            out[name.removesuffix(".npy")] = (tuple(shape), dtype)
    return out


@dataclass(frozen=True)
class ReferenceSource:
    """The reference images of ``eval.reference``: ``files`` (a folder or a run dir), or ``batch`` (an ADM reference
    batch ``.npz``, images in ``arr_0``); ``n`` images (after ``limit``); ``signature`` keys the feature cache."""

    files: list[Path]
    batch: Path | None
    n: int
    signature: str


def reference_source(ref: Any, key: str = "eval.reference.dir") -> ReferenceSource:
    """The reference set: every image file under ``ref.dir`` (sorted by relative path), or the images of an adtbench
    run dir (it holds ``samples.jsonl``; commit order), or the ``arr_0`` images ``[N, H, W, 3]`` uint8 of an ADM
    reference batch ``.npz`` (``VIRTUAL_*.npz``); the first ``ref.limit``. At least 2 images."""
    value = node_get(ref, "dir")
    limit = node_get(ref, "limit")
    n_max = int(limit) if limit is not None and int(limit) > 0 else None
    if value is not None and str(value).endswith(".npz"):
        path = Path(str(value)).expanduser()
        if not path.is_file():
            raise ConfigError(key, f"no file at {str(value)!r}; expected an ADM reference batch .npz (arr_0 = images)")
        try:
            arrays = npz_arrays(path)
        except (zipfile.BadZipFile, ValueError, OSError) as e:
            raise ConfigError(key, f"{path} is not a readable .npz ({e})") from None
        shape, dtype = arrays.get("arr_0", ((), np.dtype("float64")))
        if len(shape) != 4 or shape[-1] != 3 or dtype != np.uint8:
            raise ConfigError(
                key, f"{path} has no image batch arr_0 [N, H, W, 3] uint8 (arrays: {sorted(arrays)}); ADM's "
                "reference batches hold one; a file of mu/sigma only goes to eval.reference.stats",
            )  # fmt: skip
        n = shape[0] if n_max is None else min(shape[0], n_max)
        if n < 2:
            raise ConfigError(key, f"{path} holds {n} reference image(s); set metrics need at least 2")
        st = path.stat()
        return ReferenceSource([], path, n, f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{n}")
    files = reference_files(ref, key)
    return ReferenceSource(files, None, len(files), files_signature(files))


def reference_files(ref: Any, key: str = "eval.reference.dir") -> list[Path]:
    """Reference images: every image file under ``ref.dir`` (sorted by relative path), first ``ref.limit``.

    ``ref.dir`` may also be an adtbench run dir (it holds ``samples.jsonl``): its images, in commit order.
    """
    root = require_dir(
        node_get(ref, "dir"), key,
        "a folder of reference images (e.g. COCO val2017), a run dir or an ADM reference batch .npz",
    )  # fmt: skip
    if has_samples(root):
        files = [s.image_path for s in load_run_samples(root)]
    else:
        files = sorted((p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTS), key=lambda p: str(p))
    limit = node_get(ref, "limit")
    if limit is not None and int(limit) > 0:
        files = files[: int(limit)]
    if len(files) < 2:
        raise ConfigError(key, f"{root} holds {len(files)} reference image(s); set metrics need at least 2")
    return files


def files_signature(files: Sequence[Path]) -> str:
    """Cheap identity of a file list: sha256 over (path, size, mtime) — for the reference-feature cache key."""
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()
