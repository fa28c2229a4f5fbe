"""Model families (``model.family`` → the adapter module's ``build_target(cfg)``) and the loading helpers
every real-checkpoint loader shares.

A new model is one adapter file implementing ``Target`` plus one entry here and one yaml in ``conf/model/``.

Loading conventions (all adapters):

- **Paths.** Every file or folder is a config key (``model.path``, ``model.vq.path``, …). A value is, in
  order: an existing local path; a path relative to the model folder (``model.path``); for a hub id of a
  single file, that file inside the model folder when present (so one folder may hold every companion); or
  the Hugging Face repo id (``owner/name``),
  fetched with ``huggingface_hub`` when online. Offline (``HF_HUB_OFFLINE=1``, or the hub unreachable) the
  ``ConfigError`` names the key, the value and the file that was expected. All checks run before any weights
  are read.
- **Sidecar.** A checkpoint folder may hold ``adtbench.json`` = ``{"model": {...}}``: facts about the
  checkpoint that are not stored in its own files (architecture sizes of a non-standard checkpoint, the
  image grid, VQ hyper-parameters). Its values override the yaml defaults for that checkpoint.
  ``adtbench make-tiny`` writes one for every tiny checkpoint; full-size checkpoints need none.
- **dtype / device.** ``auto`` = bfloat16 on CUDA, float32 on CPU; ``device: auto`` = ``cuda`` when available.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from adtbench import accel
from adtbench.errors import ConfigError
from adtbench.models.base import PlainDecode, Target
from adtbench.registry import Registry

FAMILIES: Registry[Target] = Registry("model.family")
"""``model.family`` → the adapter's ``build_target(model_cfg)``, registered lazily by dotted path so that
selecting one family never imports another's dependencies (transformers, sentencepiece …)."""
for _family, _module in (
    ("llamagen", "llamagen.target"), ("chameleon", "chameleon.target"), ("anole", "chameleon.target"),
    ("lumina", "chameleon.lumina"), ("tar", "tar.target"), ("mini", "mini.target"),
    ("emu3", "emu3.target"),
    ("janus", "janus.target"),
):  # fmt: skip
    FAMILIES.register(_family, f"adtbench.models.{_module}:build_target")

SIDECAR = "adtbench.json"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


IMPLS = ("lean", "hf")
"""``model.impl`` of the families with two implementations (Chameleon: Anole, Lumina-mGPT; Emu3; Janus-Pro): ``lean``
(default, the project's own static-cache network) or ``hf`` (transformers, the reference)."""


REFERENCE_IMPLS: dict[str, str] = {"chameleon": "hf", "anole": "hf", "lumina": "hf", "emu3": "hf", "janus": "hf"}
"""``model.family`` → the ``model.impl`` that is the published reference implementation (the papers' AR baseline:
transformers' eager forward), for the families whose default implementation is the project's own (``lean``).
``timing.reference_baseline`` times the AR baseline through it too."""

NO_REFERENCE: dict[str, str] = {
    "llamagen": "LlamaGen's reference (FoundationVision's GPT; LANTERN's transformers conversion) is not in adtbench: "
    "its baseline is the in-project GPT, the same network on the project's kernels",
    "mini": "the mini model has one implementation, the in-project GPT it was trained and shipped on: its baseline "
    "already is its reference",
    "tar": "Tar's LM already runs through transformers (Qwen2, the reference's forward) and AR-DTok has no other "
    "implementation: the baseline already is the reference",
}
"""Why a family has no reference baseline (``timing.reference_baseline`` refuses it, naming the key, with this)."""


def model_impl(cfg: Any) -> str:
    """``model.impl`` of a model node (``lean`` when absent); another value is a ConfigError naming ``model.impl``."""
    impl = get(cfg, "impl", "lean")
    if not isinstance(impl, str) or impl not in IMPLS:
        raise ConfigError("model.impl", f"unknown implementation {impl!r}; choose one of {list(IMPLS)}")
    return impl


PLAIN_STAGE_FAMILIES = frozenset({"tar"})
"""Families whose adapter runs a stage of its own plainly: their builder takes ``plain_decode`` (``PlainDecode``)."""


def build_target(cfg: Any, plain_decode: PlainDecode | None = None) -> Target:
    """The target of the model node ``cfg`` (its checkpoint's sidecar merged in first); unknown families are a
    ConfigError naming ``model.family``. ``plain_decode``: the plain AR loop (``algorithm.ar.ar_tokens``) a family
    that runs a stage plainly (``PLAIN_STAGE_FAMILIES``: Tar) is built with; the models import nothing of the
    algorithm layer, so whoever builds a target hands it over (the harness's ``job.build_models`` does)."""
    family = str(cfg.family)
    builder = FAMILIES.get(family)
    apply_sidecar(cfg)
    return builder(cfg, plain_decode=plain_decode) if family in PLAIN_STAGE_FAMILIES else builder(cfg)


# ---------------------------------------------------------------------------------------------------------
# Config access
# ---------------------------------------------------------------------------------------------------------


def plain(node: Any) -> Any:
    """OmegaConf node → plain Python containers (resolved); plain values pass through."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[a][b]…`` for a dotted ``key`` on DictConfigs or dicts; ``default`` when any level is absent/None."""
    node = cfg
    for part in key.split("."):
        if node is None:
            return default
        node = node.get(part, None) if isinstance(node, Mapping) or hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def apply_sidecar(cfg: Any) -> None:
    """Merge ``<model.path>/adtbench.json`` (``{"model": {...}}``) into the model node ``cfg`` in place."""
    path = get(cfg, "path")
    if path is None or get(cfg, "random_init", False):
        return
    p = Path(str(path)).expanduser()
    side = (p if p.is_dir() else p.parent) / SIDECAR
    if not side.is_file():
        return
    try:
        data = json.loads(side.read_text())["model"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError("model.path", f"{side}: not a valid adtbench sidecar ({{'model': {{...}}}}): {e}") from e
    from omegaconf import OmegaConf

    if not isinstance(data, dict):
        raise ConfigError("model.path", f"{side}: 'model' must be a mapping")
    OmegaConf.set_struct(cfg, False)
    cfg.merge_with({k: v for k, v in data.items() if k != "family"})


# ---------------------------------------------------------------------------------------------------------
# dtype / device
# ---------------------------------------------------------------------------------------------------------


def resolve_device(value: Any, key: str = "model.device") -> torch.device:
    """``auto`` → ``cuda`` if available else ``cpu``; anything else must be a valid, available torch device. Under the
    simulated device (``accel``, ``ADTBENCH_SIMULATE_DEVICE=cuda``) ``auto`` and ``cuda`` are the simulated one."""
    name = "auto" if value is None else str(value)
    try:
        return accel.resolve(name)
    except RuntimeError as e:
        raise ConfigError(key, f"invalid device {name!r}") from e
    except ValueError as e:
        raise ConfigError(key, str(e)) from e


def resolve_dtype(value: Any, device: torch.device, key: str = "model.dtype") -> torch.dtype:
    """``auto`` → bfloat16 on CUDA, float32 elsewhere; otherwise one of ``DTYPES``."""
    name = "auto" if value is None else str(value)
    if name == "auto":
        return torch.bfloat16 if accel.is_cuda(device) else torch.float32
    if name not in DTYPES:
        raise ConfigError(key, f"unknown dtype {name!r}; choose auto or one of {sorted(DTYPES)}")
    return DTYPES[name]


# ---------------------------------------------------------------------------------------------------------
# Paths (local, relative to the model folder, or a Hugging Face repo id)
# ---------------------------------------------------------------------------------------------------------


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def looks_like_repo_id(value: str) -> bool:
    return bool(_REPO_ID.match(value)) and not value.startswith((".", "/", "~"))


def _local(value: str, base: Path | None) -> Path | None:
    p = Path(value).expanduser()
    if p.exists():
        return p
    if base is not None and not p.is_absolute():
        q = base / value
        if q.exists():
            return q
    return None


def _hub(key: str, value: str, files: Sequence[str], what: str) -> Path:
    """Download ``files`` (glob patterns) of repo ``value``; returns the snapshot folder."""
    if _offline():
        raise ConfigError(
            key, f"{value!r} is not a local path and HF_HUB_OFFLINE is set; expected {what} (download it and set {key})"
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(value, allow_patterns=list(files) or None))
    except Exception as e:  # network, auth, missing repo: one user-facing error naming the key
        raise ConfigError(
            key,
            f"{value!r} is neither a local path nor a reachable Hugging Face repo ({type(e).__name__}: {e}); "
            f"expected {what}",
        ) from e


def resolve_dir(key: str, value: Any, expected: Sequence[str], base: Path | None = None) -> Path:
    """A folder that must hold every file in ``expected`` (glob patterns; the first match counts).

    ``value`` is a local folder, a folder relative to ``base`` or a hub repo id (only ``expected`` files are
    downloaded). Raises ``ConfigError(key, …)`` naming the path and the missing file.
    """
    if value is None or str(value) in ("", "???"):
        raise ConfigError(key, f"is required: a folder holding {', '.join(expected)}")
    v = str(value)
    p = _local(v, base)
    if p is None:
        if not looks_like_repo_id(v):
            raise ConfigError(key, f"no such folder: {v} (expected a folder holding {', '.join(expected)})")
        p = _hub(key, v, [*expected, "*.json"], f"a folder holding {', '.join(expected)}")
    if not p.is_dir():
        raise ConfigError(key, f"{p} is a file; expected a folder holding {', '.join(expected)}")
    for pat in expected:
        if not any(p.glob(pat)):
            raise ConfigError(key, f"{p} has no {pat} (expected {', '.join(expected)})")
    return p


def resolve_file(key: str, value: Any, what: str, base: Path | None = None, repo_file: str | None = None) -> Path:
    """One file: a local path, a path relative to ``base``, ``base / repo_file`` (when ``value`` is a hub id), or
    ``repo_id`` (+ ``repo_file``) on the hub — in that order.

    ``what`` describes the expected file in error messages (e.g. ``"vq_ds16_t2i.pt (LlamaGen VQ-16)"``).
    """
    if value is None or str(value) in ("", "???"):
        raise ConfigError(key, f"is required: {what}")
    v = str(value)
    p = _local(v, base)
    if p is None and looks_like_repo_id(v) and repo_file and base is not None and (base / repo_file).is_file():
        p = base / repo_file  # a hub default whose file already sits in the model folder
    if p is None:
        if repo_file is None or not looks_like_repo_id(v):
            raise ConfigError(key, f"file not found: {v} (expected {what})")
        p = _hub(key, v, [repo_file], what) / repo_file
    if p.is_dir():
        if repo_file is not None and (p / repo_file).is_file():
            return p / repo_file
        raise ConfigError(key, f"{p} is a folder; expected {what}")
    if not p.is_file():
        raise ConfigError(key, f"file not found: {p} (expected {what})")
    return p


__all__ = [
    "DTYPES",
    "FAMILIES",
    "IMPLS",
    "SIDECAR",
    "apply_sidecar",
    "build_target",
    "get",
    "looks_like_repo_id",
    "model_impl",
    "plain",
    "resolve_device",
    "resolve_dir",
    "resolve_dtype",
    "resolve_file",
]
