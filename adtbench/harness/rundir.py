"""The run directory: its file names, the walker that finds runs and the readers; the crash-safe store and the one
writer of every file in it are :mod:`adtbench.harness.rundir_write`. Every module that reads or writes a run dir goes
through these two; the records
themselves (:class:`SampleRecord`, :class:`TraceRecord`, :class:`Summary`) are typed in
:mod:`adtbench.harness.records`.

Layout of a job directory (one Hydra job; docs/outputs.md documents every field)::

    samples.jsonl        one :class:`SampleRecord` per line per finished prompt (the commit marker)
    trace.jsonl          one :class:`TraceRecord` per line per prompt: the compact per-cycle trace
    images/<stem>.png    the generated image of each prompt (:func:`safe_stem` of its id)
    summary.json         :class:`Summary`: :func:`summarize` of all samples plus the run's context
    run_config.json      the resolved config (resume check; ``adtbench merge`` compares shards by it) and, under
                         ``provenance``, what wrote the run (``rundir_write.record_provenance``; never part of the
                         config)
    merge.json           (merged runs) the shard runs it was built from, and the checks
    eval.json / eval_samples.jsonl / tracking.json / maps/ / .adtbench.lock / .hydra/   (see docs/outputs.md)

Crash safety (``rundir_write``). ``ResultStore.commit`` writes (1) the image atomically
(:func:`adtbench.io.atomic_write_bytes`), (2) the trace line, (3) the samples line, each line with
:func:`adtbench.io.append_line_fsync` (a single ``os.write`` on an ``O_APPEND`` descriptor followed by ``fsync``). A
prompt is *done* iff its samples line is complete, so a kill at any point leaves at worst an orphan image (overwritten
on rerun), an orphan trace line or a torn last line; all of these are repaired when the store is reopened. Nothing is
ever written twice for a done prompt. The other files are written whole and atomically (``write_summary``,
``check_resume`` for ``run_config.json``, ``write_eval``, ``write_maps``, ``update_tracking``, ``write_merged_run``).
Readers (:func:`read_samples`, :func:`read_traces`, :func:`find_runs`, :func:`read_summary`, ...) only read: a JSONL
line counts iff it is complete (newline-terminated) and a JSON object with a string ``prompt_id``.

The statistics computed from the records (``summarize`` and the one bootstrap) are in
:mod:`adtbench.harness.stats`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from adtbench.harness.provenance import PROVENANCE_KEY
from adtbench.harness.records import SampleRecord, Summary, TraceRecord

__all__ = [
    "EVAL_FILE",
    "EVAL_SAMPLES_FILE",
    "HYDRA_CONFIG_FILE",
    "HYDRA_OVERRIDES_FILE",
    "IMAGES_DIR",
    "LOCK_FILE",
    "MAPS_DIR",
    "MERGE_FILE",
    "PLUMBING_KEYS",
    "POOLED_KEYS",
    "RUN_CONFIG_FILE",
    "RUN_MAPS_FILE",
    "SAMPLES_FILE",
    "SUMMARY_FILE",
    "TRACE_FILE",
    "TRACKING_FILE",
    "SampleRecord",
    "Summary",
    "TraceRecord",
    "count_sample_lines",
    "dumps_line",
    "find_runs",
    "has_samples",
    "has_summary",
    "is_merged_run",
    "is_plumbing",
    "lantern_choice",
    "merged_sources",
    "natural_key",
    "read_eval",
    "read_eval_samples",
    "read_hydra_config",
    "read_jsonl",
    "read_override_list",
    "read_overrides",
    "read_provenance",
    "read_run_config",
    "read_run_maps",
    "read_samples",
    "read_summary",
    "read_summary_typed",
    "read_traces",
    "read_tracking",
    "run_config_dirs",
    "safe_stem",
    "sample_dirs",
    "samples_path",
    "summary_time",
    "to_jsonable",
]

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------
# file names (the only place they are spelled)
# ----------------------------------------------------------------------------------------------------

SAMPLES_FILE = "samples.jsonl"
TRACE_FILE = "trace.jsonl"
SUMMARY_FILE = "summary.json"
IMAGES_DIR = "images"
RUN_CONFIG_FILE = "run_config.json"
MERGE_FILE = "merge.json"
EVAL_FILE = "eval.json"
EVAL_SAMPLES_FILE = "eval_samples.jsonl"
TRACKING_FILE = "tracking.json"
MAPS_DIR = "maps"
RUN_MAPS_FILE = f"{MAPS_DIR}/run_maps.json"  # per-position means over the run's prompts (adtbench.harness.maps)
LOCK_FILE = ".adtbench.lock"
HYDRA_OVERRIDES_FILE = ".hydra/overrides.yaml"
HYDRA_CONFIG_FILE = ".hydra/config.yaml"
EXPORT_DIR = "export"  # evaluation exports (GenEval, DPG-Bench layouts)
EXPORT_INDEX_FILE = "adtbench_index.jsonl"  # an export's prompt index

# ----------------------------------------------------------------------------------------------------
# plumbing keys
# ----------------------------------------------------------------------------------------------------

#: Config keys that never change a run's samples (run plumbing, not the experiment): a resume may change them
#: (``config.config_fingerprint`` drops them) and they never define a table row. ``dataset.limit`` is here
#: because a resume may extend the prompt list; the samples of the prompts both runs cover are the same.
PLUMBING_KEYS = (
    "hydra",
    "dataset.limit",
    "paths",
    "logger",
    "eval",
    "progress",
    "warmup",
    "threads",
    "save_images",
    "maps",
    "lantern.cache_dir",
    "model.published_drafters",  # what the error of a missing drafter names (conf/model/*.yaml), never decoded
)
#: Keys that change which samples a run holds but not what they measure: runs differing only in these
#: (shards of one config, repeats with other seeds) are pooled by ``reporting.tables``. Never ignored on resume.
POOLED_KEYS = ("dataset.shard", "seed")


def is_plumbing(key: str, *, pooled: bool = False) -> bool:
    """Whether the config key / override ``key`` is (under) a :data:`PLUMBING_KEYS` entry (with ``pooled``,
    also a :data:`POOLED_KEYS` one): ``paths.out`` is under ``paths``."""
    keys = PLUMBING_KEYS + POOLED_KEYS if pooled else PLUMBING_KEYS
    return any(key == k or key.startswith(k + ".") for k in keys)


# ----------------------------------------------------------------------------------------------------
# JSON helpers
# ----------------------------------------------------------------------------------------------------


def to_jsonable(obj: Any) -> Any:
    """Convert ``obj`` to strict-JSON-safe Python types.

    numpy scalars/arrays -> Python numbers/lists, tuples/sets -> lists, ``Path`` -> str, and non-finite floats
    (NaN, ±inf) -> ``None`` (strict JSON has no NaN). Dict keys are converted to str.
    """
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable: {obj!r}")


def dumps_line(obj: dict[str, Any]) -> bytes:
    """One compact JSON line (UTF-8, ``\\n``-terminated). ``json.dumps`` escapes newlines inside strings."""
    return (json.dumps(to_jsonable(obj), ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_STEM = 150


def safe_stem(prompt_id: str) -> str:
    """File-name-safe stem of a prompt id: every character outside ``[A-Za-z0-9._-]`` becomes ``_``; when that
    changes the id (or the id is empty, ``.``/``..``-like, or too long), a short hash of the original id is
    appended, so two distinct ids never share a file. Safe ids (``parti-0001``, ``coco-139``) map to themselves."""
    safe = _UNSAFE.sub("_", prompt_id)
    if safe != prompt_id or len(safe) > _MAX_STEM or not safe.strip("."):
        digest = hashlib.sha1(prompt_id.encode("utf-8")).hexdigest()[:10]
        safe = f"{safe[:_MAX_STEM]}-{digest}"
    return safe


# ----------------------------------------------------------------------------------------------------
# JSONL: scan, repair, read
# ----------------------------------------------------------------------------------------------------


def scan_jsonl(path: Path) -> tuple[list[tuple[int, int, dict[str, Any] | None]], int]:
    """Parse a JSONL file into ``(start, end, obj_or_None)`` spans of complete lines.

    Returns the spans and the file size. A last line without ``\\n`` is incomplete and is not returned.
    ``obj`` is ``None`` for lines that are not a JSON object with a string ``prompt_id``.
    """
    data = path.read_bytes()
    spans: list[tuple[int, int, dict[str, Any] | None]] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        raw = data[pos:nl]
        obj: dict[str, Any] | None
        try:
            parsed = json.loads(raw.decode("utf-8"))
            obj = parsed if isinstance(parsed, dict) and isinstance(parsed.get("prompt_id"), str) else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            obj = None
        spans.append((pos, nl + 1, obj))
        pos = nl + 1
    return spans, len(data)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete, valid lines of a run's JSONL file (objects with a string ``prompt_id``), in file order;
    ``[]`` when the file is absent. Read-only: a torn last line is skipped, not repaired."""
    p = Path(path)
    if not p.exists():
        return []
    spans, _ = scan_jsonl(p)
    return [obj for _, _, obj in spans if obj is not None]


# ----------------------------------------------------------------------------------------------------
# finding and reading runs (read-only)
# ----------------------------------------------------------------------------------------------------


def read_tracking(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of the run's ``tracking.json`` (one per tracked job, oldest first); [] when it has none or the
    file is unreadable (a half-written file from a killed job is not an error: the tracker starts afresh)."""
    path = Path(run_dir) / TRACKING_FILE
    try:
        runs = json.loads(path.read_text()).get("runs", []) if path.exists() else []
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in runs if isinstance(r, dict)]


def natural_key(path: str | os.PathLike[str]) -> list[Any]:
    """Sort key with numbers compared as numbers (multirun job ``10_…`` after ``9_…``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Every job dir (holding ``summary.json``) at or under ``root``, in natural path order (:func:`natural_key`).

    The one walker of a results tree: single runs, multirun jobs, shard runs and merged runs alike."""
    root = Path(root)
    dirs = [p.parent for p in root.rglob(SUMMARY_FILE)]
    if (root / SUMMARY_FILE).exists():
        dirs.append(root)
    return sorted(set(dirs), key=natural_key)


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's ``summary.json`` as JSON (:func:`read_summary_typed` types it)."""
    return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())  # type: ignore[no-any-return]


def read_summary_typed(run_dir: str | os.PathLike[str]) -> Summary:
    """The run's ``summary.json`` as a :class:`Summary` (:meth:`Summary.from_json`): what readers that use its
    fields read."""
    return Summary.from_json(read_summary(run_dir))


def has_summary(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds a ``summary.json`` (a job dir: :func:`find_runs`)."""
    return (Path(run_dir) / SUMMARY_FILE).is_file()


def summary_time(run_dir: str | os.PathLike[str]) -> float | None:
    """When the run's ``summary.json`` was last written (seconds since the epoch; None without one)."""
    path = Path(run_dir) / SUMMARY_FILE
    return path.stat().st_mtime if path.is_file() else None


def samples_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where the run's ``samples.jsonl`` is (to name it in a message; read it with :func:`read_samples`)."""
    return Path(run_dir) / SAMPLES_FILE


def sample_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Every dir at or under ``root`` holding a ``samples.jsonl`` (finished or not), sorted by path."""
    return sorted(p.parent for p in Path(root).rglob(SAMPLES_FILE))


def has_samples(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds a ``samples.jsonl`` (a run dir, finished or not)."""
    return (Path(run_dir) / SAMPLES_FILE).exists()


def read_samples(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The run's ``samples.jsonl`` lines, in commit order (:meth:`SampleRecord.from_json` types one)."""
    return read_jsonl(Path(run_dir) / SAMPLES_FILE)


def read_traces(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The run's ``trace.jsonl`` lines."""
    return read_jsonl(Path(run_dir) / TRACE_FILE)


def read_eval_samples(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The run's ``eval_samples.jsonl`` lines (the per-prompt metrics of an evaluation; [] without one)."""
    return read_jsonl(Path(run_dir) / EVAL_SAMPLES_FILE)


def count_sample_lines(run_dir: str | os.PathLike[str]) -> int:
    """Newline-terminated lines of ``samples.jsonl``, read as bytes (0 if absent or unreadable)."""
    path = Path(run_dir) / SAMPLES_FILE
    try:
        return path.read_bytes().count(b"\n") if path.exists() else 0
    except OSError:
        return 0


def _json_or_none(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def read_run_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's config as ``run_config.json`` holds it, without its ``provenance`` (:func:`read_provenance`; the
    config alone, what resume and ``adtbench merge`` compare); None when absent."""
    doc = _json_or_none(Path(run_dir) / RUN_CONFIG_FILE)
    if isinstance(doc, dict):
        doc.pop(PROVENANCE_KEY, None)
    return doc  # type: ignore[no-any-return]


def read_provenance(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What wrote the run (``run_config.json``'s ``provenance``: :func:`record_provenance`); None for a run dir
    written before it was recorded, or without a ``run_config.json``."""
    doc = _json_or_none(Path(run_dir) / RUN_CONFIG_FILE)
    block = doc.get(PROVENANCE_KEY) if isinstance(doc, dict) else None
    return block if isinstance(block, dict) else None


def run_config_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Every dir at or under ``root`` holding a ``run_config.json`` (a job's dir, decoded or merged), sorted."""
    return sorted(q.parent for q in Path(root).rglob(RUN_CONFIG_FILE))


def is_merged_run(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` is a merged run (``adtbench merge`` wrote a ``merge.json`` there)."""
    return (Path(run_dir) / MERGE_FILE).exists()


def read_hydra_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The job's composed config as Hydra recorded it (``.hydra/config.yaml``; None when absent)."""
    path = Path(run_dir) / HYDRA_CONFIG_FILE
    if not path.exists():
        return None
    import yaml

    return dict(yaml.safe_load(path.read_text()) or {})


def read_override_list(run_dir: str | os.PathLike[str]) -> list[str]:
    """The job's command-line overrides as Hydra recorded them (``.hydra/overrides.yaml``; [] when absent)."""
    path = Path(run_dir) / HYDRA_OVERRIDES_FILE
    if not path.exists():
        return []
    import yaml

    return list(yaml.safe_load(path.read_text()) or [])


def read_overrides(run_dir: str | os.PathLike[str]) -> dict[str, str]:
    """:func:`read_override_list` as ``{key: value}`` (``+``/``~`` prefixes dropped)."""
    out = {}
    for item in read_override_list(run_dir):
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def lantern_choice(s: Summary | dict[str, Any]) -> str:
    """The ``lantern`` option of a run's summary, typed or its JSON (its Hydra choice; older summaries: the bool)."""
    choices, on = (s.choices, s.lantern) if isinstance(s, Summary) else (s.get("choices"), s.get("lantern"))
    choice = (choices or {}).get("lantern")
    if choice is not None:
        return str(choice)
    return "on" if on else "off"


def read_eval(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``eval.json`` (the last evaluation's block; None without one)."""
    return _json_or_none(Path(run_dir) / EVAL_FILE)  # type: ignore[no-any-return]


def read_run_maps(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``maps/run_maps.json`` (``n_prompts`` and the accept / depth / width grids, None for uncovered
    cells); None when the run wrote no maps (``maps.per_run=false``)."""
    return _json_or_none(Path(run_dir) / RUN_MAPS_FILE)  # type: ignore[no-any-return]


def merged_sources(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The shard run dirs a merged run was built from (``merge.json`` sources; [] for any other run)."""
    doc = _json_or_none(Path(run_dir) / MERGE_FILE) or {}
    return [Path(s["dir"]) for s in doc.get("sources", [])]
