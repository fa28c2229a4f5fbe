"""The run directory: its file names, the crash-safe store and the one writer of every file in it, the walker
that finds runs and the readers. Every module that reads or writes a run dir goes through here; the records
themselves (:class:`SampleRecord`, :class:`TraceRecord`, :class:`Summary`) are typed in
:mod:`adtbench.harness.records`.

Layout of a job directory (one Hydra job; docs/outputs.md documents every field)::

    samples.jsonl        one :class:`SampleRecord` per line per finished prompt (the commit marker)
    trace.jsonl          one :class:`TraceRecord` per line per prompt: the compact per-cycle trace
    images/<stem>.png    the generated image of each prompt (:func:`safe_stem` of its id)
    summary.json         :class:`Summary`: :func:`summarize` of all samples plus the run's context
    run_config.json      the resolved config (resume check; ``adtbench merge`` compares shards by it) and, under
                         ``provenance``, what wrote the run (:func:`record_provenance`; never part of the config)
    merge.json           (merged runs) the shard runs it was built from, and the checks
    eval.json / eval_samples.jsonl / tracking.json / maps/ / .adtbench.lock / .hydra/   (see docs/outputs.md)

Crash safety. :meth:`ResultStore.commit` writes (1) the image atomically (:func:`adtbench.io.atomic_write_bytes`),
(2) the trace line, (3) the samples line, each line with :func:`adtbench.io.append_line_fsync` (a single
``os.write`` on an ``O_APPEND`` descriptor followed by ``fsync``). A prompt is *done* iff its samples line is
complete, so a kill at any point leaves at worst an orphan image (overwritten on rerun), an orphan trace line or
a torn last line; all of these are repaired when the store is reopened. Nothing is ever written twice for a done
prompt. The other files are written whole and atomically (:func:`write_summary`, :func:`check_resume` for
``run_config.json``, :func:`write_eval`, :func:`write_maps`, :func:`update_tracking`, :func:`write_merged_run`).
Readers (:func:`read_samples`, :func:`read_traces`, :func:`find_runs`, :func:`read_summary`, ...) only read: a
JSONL line counts iff it is complete (newline-terminated) and a JSON object with a string ``prompt_id``.

The statistics computed from the records (``summarize`` and the one bootstrap) are in
:mod:`adtbench.harness.stats`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

import numpy as np

from adtbench.errors import ConfigError
from adtbench.harness.provenance import PROVENANCE_KEY, same_code
from adtbench.harness.records import SampleRecord, Summary, TraceRecord, migrate_run_config
from adtbench.io import (
    append_line_fsync,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    atomic_write_with,
    encode_png,
    save_png,
)

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
    "ResultStore",
    "SampleRecord",
    "Summary",
    "TraceRecord",
    "check_resume",
    "count_sample_lines",
    "dpg_images_dir",
    "dumps_line",
    "export_dir",
    "find_runs",
    "has_samples",
    "has_summary",
    "is_merged_run",
    "is_plumbing",
    "lantern_choice",
    "map_file",
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
    "record_provenance",
    "run_config_dirs",
    "safe_stem",
    "sample_dirs",
    "samples_path",
    "summary_time",
    "to_jsonable",
    "update_tracking",
    "write_dpg_grid",
    "write_eval",
    "write_export_index",
    "write_geneval_prompt",
    "write_maps",
    "write_merged_run",
    "write_summary",
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


def _scan_jsonl(path: Path) -> tuple[list[tuple[int, int, dict[str, Any] | None]], int]:
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


def _rewrite_keep(path: Path, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Repair a JSONL file in place, keeping complete valid lines for which ``keep(obj)`` is true.

    If the kept lines form a prefix of the file (the normal case after a crash: a torn or orphan tail), the
    file is truncated to that prefix; otherwise it is rewritten atomically. Returns the kept objects.
    """
    if not path.exists():
        return []
    spans, size = _scan_jsonl(path)
    kept: list[tuple[int, int, dict[str, Any]]] = []
    dropped = 0
    for s, e, obj in spans:
        if obj is not None and keep(obj):
            kept.append((s, e, obj))
        else:
            dropped += 1
    torn_tail = (spans[-1][1] if spans else 0) < size
    if not dropped and not torn_tail:
        return [o for _, _, o in kept]
    # Is the kept set a contiguous prefix of the file?
    prefix_end = 0
    is_prefix = True
    for s, e, _ in kept:
        if s != prefix_end:
            is_prefix = False
            break
        prefix_end = e
    log.warning(
        "repairing %s: dropping %d invalid/orphan line(s)%s",
        path,
        dropped,
        " and a torn last line" if torn_tail else "",
    )
    if is_prefix:
        with open(path, "r+b") as f:
            f.truncate(prefix_end)
            f.flush()
            os.fsync(f.fileno())
    else:
        data = path.read_bytes()
        atomic_write_bytes(path, b"".join(data[s:e] for s, e, _ in kept))
    return [o for _, _, o in kept]


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete, valid lines of a run's JSONL file (objects with a string ``prompt_id``), in file order;
    ``[]`` when the file is absent. Read-only: a torn last line is skipped, not repaired."""
    p = Path(path)
    if not p.exists():
        return []
    spans, _ = _scan_jsonl(p)
    return [obj for _, _, obj in spans if obj is not None]


# ----------------------------------------------------------------------------------------------------
# ResultStore
# ----------------------------------------------------------------------------------------------------


class ResultStore:
    """Append-only, crash-safe store of per-prompt results in one job directory.

    On open it creates ``run_dir/images`` and repairs the files left by an interrupted run:
    ``samples.jsonl`` loses a torn last line (no trailing newline or invalid JSON) and any duplicate
    prompt ids (first kept); ``trace.jsonl`` loses a torn last line and every line whose ``prompt_id`` has
    no samples line; stray ``*.tmp`` files are deleted. Orphan images stay and are overwritten on rerun.

    A single process is expected to write a given ``run_dir`` at a time (one Hydra job = one directory).
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.images_dir = self.run_dir / IMAGES_DIR
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self.samples_path = self.run_dir / SAMPLES_FILE
        self.trace_path = self.run_dir / TRACE_FILE
        self.summary_path = self.run_dir / SUMMARY_FILE

        # Leftovers of interrupted atomic writes (images, summary, a rewrite of a JSONL file).
        stray = [*self.images_dir.glob("*.tmp")]
        for name in (SAMPLES_FILE, TRACE_FILE, SUMMARY_FILE):
            stray += self.run_dir.glob(f"{name}.*.tmp")
        for tmp in stray:
            tmp.unlink(missing_ok=True)

        seen: set[str] = set()

        def first_seen(obj: dict[str, Any]) -> bool:
            pid = obj["prompt_id"]
            if pid in seen:
                return False
            seen.add(pid)
            return True

        _rewrite_keep(self.samples_path, first_seen)
        self._done: set[str] = seen
        _rewrite_keep(self.trace_path, lambda obj: obj["prompt_id"] in self._done)

    # -- queries ------------------------------------------------------------------------------------

    def done_ids(self) -> set[str]:
        """Prompt ids that have a complete samples line (i.e. are committed)."""
        return set(self._done)

    def is_done(self, prompt_id: str) -> bool:
        """Whether ``prompt_id`` is committed."""
        return prompt_id in self._done

    def image_path(self, prompt_id: str) -> Path:
        """``run_dir/images/<safe_stem(prompt_id)>.png`` (:func:`safe_stem`: distinct ids, distinct files)."""
        return self.images_dir / f"{safe_stem(prompt_id)}.png"

    def records(self) -> list[dict[str, Any]]:
        """All samples records, in file (commit) order."""
        return read_jsonl(self.samples_path)

    def traces(self) -> list[dict[str, Any]]:
        """All trace records, in file order."""
        return read_jsonl(self.trace_path)

    # -- writes -------------------------------------------------------------------------------------

    @overload
    def commit(self, record: SampleRecord, trace: dict[str, Any] | None, image: Any) -> SampleRecord: ...
    @overload
    def commit(self, record: dict[str, Any], trace: dict[str, Any] | None, image: Any) -> dict[str, Any]: ...
    def commit(
        self,
        record: SampleRecord | dict[str, Any],
        trace: dict[str, Any] | None,
        image: np.ndarray | None,
    ) -> SampleRecord | dict[str, Any]:
        """Durably store one finished prompt; returns the record as written (with its ``image``).

        Order: (0) serialise both lines (so bad values fail before anything is written), (1) write the image
        atomically if given, (2) append the trace line if given, (3) append the samples line LAST: it is the
        commit marker. The written samples record gets ``"image"`` = ``"images/<safe id>.png"`` (or ``None``
        without an image); the caller's record is not modified. The trace line gets the record's ``prompt_id``.

        Args:
            record: per-prompt metrics (a :class:`SampleRecord`, or its JSON); must have a string ``prompt_id``.
            trace: compact per-cycle trace, or ``None``.
            image: ``uint8`` array of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) (a PIL image is also
                accepted), or ``None``.

        Raises:
            ValueError: if the prompt is already done, the record has no ``prompt_id``, the trace names
                another prompt, or the image has an unsupported dtype/shape.
        """
        typed = isinstance(record, SampleRecord)
        rec = record.to_json() if isinstance(record, SampleRecord) else dict(record)  # the caller's stays as it is
        pid = rec.get("prompt_id")
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"record needs a non-empty string 'prompt_id', got {pid!r}")
        if pid in self._done:
            raise ValueError(f"prompt {pid!r} is already committed in {self.samples_path}")

        img_path = self.image_path(pid)
        rec["image"] = img_path.relative_to(self.run_dir).as_posix() if image is not None else None
        sample_line = dumps_line(rec)
        trace_line = None
        if trace is not None:
            if trace.get("prompt_id", pid) != pid:
                raise ValueError(f"trace prompt_id {trace.get('prompt_id')!r} != record prompt_id {pid!r}")
            trace_line = dumps_line({"prompt_id": pid, **trace})
        png = encode_png(image) if image is not None else None

        if png is not None:
            atomic_write_bytes(img_path, png)  # temp name ends in .tmp, cleaned on reopen
        if trace_line is not None:
            append_line_fsync(self.trace_path, trace_line)
        append_line_fsync(self.samples_path, sample_line)
        self._done.add(pid)
        return SampleRecord.from_json(rec) if typed else rec

    def write_summary(self, summary: Summary | dict[str, Any]) -> Path:
        """Write ``summary.json`` atomically (:func:`write_summary`); return its path."""
        return write_summary(self.run_dir, summary)


# ----------------------------------------------------------------------------------------------------
# the other writes (every file of a run dir is written here)
# ----------------------------------------------------------------------------------------------------


def write_summary(run_dir: str | os.PathLike[str], summary: Summary | dict[str, Any]) -> Path:
    """Write the run's ``summary.json`` atomically (:meth:`Summary.to_json`; indent=2, key order kept, strict
    JSON); return its path."""
    path = Path(run_dir) / SUMMARY_FILE
    doc = summary.to_json() if isinstance(summary, Summary) else summary
    atomic_write_json(path, to_jsonable(doc), indent=2, ensure_ascii=False, allow_nan=False)
    return path


def check_resume(run_dir: str | os.PathLike[str], fingerprint: dict[str, Any]) -> None:
    """Open ``run_dir`` for a job whose config has ``fingerprint`` (``config.config_fingerprint``): a new dir gets
    it as ``run_config.json``; a dir holding one of another config is refused (``ConfigError``), the saved config
    of an older run read as today's fingerprint would read it (:func:`~adtbench.harness.records.migrate_run_config`)."""
    run = Path(run_dir)
    if PROVENANCE_KEY in fingerprint:
        raise ConfigError(PROVENANCE_KEY, f"is reserved: run_config.json records the run's {PROVENANCE_KEY} there")
    saved = read_run_config(run)
    if saved is not None:
        old = migrate_run_config(saved)
        if old != fingerprint:
            diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
            raise ConfigError(
                "hydra.run.dir", f"{run} holds results of a different config (differs in: {', '.join(diff)})"
            )
    else:
        run.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run / RUN_CONFIG_FILE, fingerprint, indent=2, newline=False)


def record_provenance(
    run_dir: str | os.PathLike[str], current: dict[str, Any], decoding: bool
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Record what this job is (``current``: ``provenance.job_provenance``) in the run's ``run_config.json``
    (:func:`check_resume` wrote it) under ``provenance``, atomically; return (the last ``commits`` entry recorded
    before, or None; the block written).

    ``provenance.commits`` lists every code version that opened the dir to decode prompts, oldest first: when
    ``decoding`` (the job has prompts to decode) and the last entry is other code (``provenance.same_code``), this
    job's ``{commit, dirty, version}`` is appended. A dir whose samples were written before provenance was recorded
    starts the list with ``{"commit": null, …, "reason": …}``. The block's other keys are this job's."""
    path = Path(run_dir) / RUN_CONFIG_FILE
    doc = json.loads(path.read_text())
    old = doc.get(PROVENANCE_KEY)
    commits = [c for c in (old.get("commits") or []) if isinstance(c, dict)] if isinstance(old, dict) else []
    if not commits and count_sample_lines(run_dir) > 0:
        reason = "samples written before run dirs recorded provenance"
        commits.append({"commit": None, "dirty": None, "version": None, "reason": reason})
    previous = commits[-1] if commits else None
    entry = {k: current.get(k) for k in ("commit", "dirty", "version")}
    if decoding and (previous is None or not same_code(previous, entry)):
        commits.append(entry)
    block = {**current, "commits": commits}
    atomic_write_json(path, {**doc, PROVENANCE_KEY: to_jsonable(block)}, indent=2, newline=False)
    return previous, block


def write_eval(
    run_dir: str | os.PathLike[str], block: dict[str, Any], rows: list[dict[str, Any]], summary: Summary | None
) -> Summary:
    """Write an evaluation: its per-prompt ``rows`` (``eval_samples.jsonl``), the ``block`` (``eval.json``) and
    ``summary`` with the block as its ``eval`` (``summary.json``; a run without a summary gets one holding the
    ``eval`` block only); returns that summary."""
    run = Path(run_dir)
    _write_jsonl(run / EVAL_SAMPLES_FILE, rows, ensure_ascii=True)
    atomic_write_json(run / EVAL_FILE, to_jsonable(block), indent=2)
    if summary is None:
        write_summary(run, {"eval": block})
        return Summary.from_json({"eval": block})
    summary = dataclasses.replace(summary, eval=block)
    write_summary(run, summary)
    return summary


def write_maps(
    run_dir: str | os.PathLike[str], stem: str, pngs: dict[str, tuple[Any, dict[str, str]]], doc: dict[str, Any]
) -> list[Path]:
    """``maps/<stem>_<name>.png`` per ``pngs`` entry (an image and its text chunks) and ``maps/<stem>_maps.json``
    (``doc``); returns the PNG paths."""
    paths = [save_png(img, map_file(run_dir, stem, name), text) for name, (img, text) in pngs.items()]
    atomic_write_json(Path(run_dir) / MAPS_DIR / f"{stem}_maps.json", doc, indent=None, newline=False)
    return paths


def map_file(run_dir: str | os.PathLike[str], stem: str, kind: str) -> Path:
    """Where a map picture of the run is: ``maps/<stem>_<kind>.png`` (``stem`` ``run`` or a prompt's
    :func:`safe_stem`; it may not exist)."""
    return Path(run_dir) / MAPS_DIR / f"{stem}_{kind}.png"


def export_dir(run_dir: str | os.PathLike[str], name: str) -> Path:
    """The default folder of an evaluation export inside the run dir (``export/<name>``: GenEval / DPG layouts,
    written by ``harness.eval.export`` through :func:`write_geneval_prompt`, :func:`write_dpg_grid` and
    :func:`write_export_index`, in the layout those benchmarks read; ``eval.<name>.out`` may put it elsewhere)."""
    return Path(run_dir) / EXPORT_DIR / name


def write_geneval_prompt(out: str | os.PathLike[str], row: int, metadata: str, images: list[Path]) -> str:
    """One prompt of a GenEval export (``evaluation/evaluate_images.py <out>``): ``<out>/<row:05d>/metadata.jsonl``
    (its line of GenEval's metadata) and ``samples/<n:04d>.png`` (copies of ``images``, in order). Returns the
    folder's name."""
    folder = Path(out) / f"{row:05d}"
    (folder / "samples").mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "metadata.jsonl", metadata + "\n")
    for n, image in enumerate(images):
        shutil.copyfile(image, folder / "samples" / f"{n:04d}.png")
    return folder.name


def dpg_images_dir(out: str | os.PathLike[str]) -> Path:
    """The image folder of a DPG-Bench export (``compute_dpg_bench.py --image-root-path``): nothing but its grids."""
    return Path(out) / IMAGES_DIR


def write_dpg_grid(out: str | os.PathLike[str], item: str, grid: Any) -> Path:
    """One prompt of a DPG-Bench export: its 2×2 grid as ``<out>/images/<item>.png`` (:func:`dpg_images_dir`);
    returns the path."""
    return save_png(grid, dpg_images_dir(out) / f"{item}.png")


def write_export_index(out: str | os.PathLike[str], rows: list[dict[str, Any]]) -> Path:
    """An export's ``adtbench_index.jsonl``: which prompt of the run each exported folder or file holds."""
    path = Path(out) / EXPORT_INDEX_FILE
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path


def update_tracking(run_dir: str | os.PathLike[str], entry: dict[str, Any]) -> None:
    """Add or replace (by ``started``) this job's entry in the run's ``tracking.json``."""
    path = Path(run_dir) / TRACKING_FILE
    doc = json.loads(path.read_text()) if path.exists() else {"runs": []}
    runs = [r for r in doc.get("runs", []) if r.get("started") != entry.get("started")]
    doc["runs"] = [*runs, entry]
    atomic_write_json(path, doc, indent=2, default=str, newline=False)


def read_tracking(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of the run's ``tracking.json`` (one per tracked job, oldest first); [] when it has none or the
    file is unreadable (a half-written file from a killed job is not an error: the tracker starts afresh)."""
    path = Path(run_dir) / TRACKING_FILE
    try:
        runs = json.loads(path.read_text()).get("runs", []) if path.exists() else []
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in runs if isinstance(r, dict)]


def write_merged_run(
    out: str | os.PathLike[str],
    records: list[tuple[Path, dict[str, Any]]],
    traces: list[dict[str, Any]],
    run_config: dict[str, Any],
    summary: Summary,
    info: dict[str, Any],
    provenance: dict[str, Any] | None = None,
) -> None:
    """Write a merged run into ``out``: each ``(source run dir, record)``'s image (a hard link where possible),
    ``trace.jsonl`` and ``samples.jsonl`` (in the given order, replacing any), ``run_config.json`` (with the shards'
    ``provenance``, ``provenance.merged_provenance``, when any recorded one), ``summary.json`` and ``merge.json``
    (``info``)."""
    run = Path(out)
    run.mkdir(parents=True, exist_ok=True)
    for name in (SAMPLES_FILE, TRACE_FILE):
        (run / name).unlink(missing_ok=True)
    ResultStore(run)  # creates images/, clears leftovers
    for src, rec in records:
        if rec.get("image"):
            _link_or_copy(src / rec["image"], run / rec["image"])
    _write_jsonl(run / TRACE_FILE, traces)
    _write_jsonl(run / SAMPLES_FILE, [rec for _, rec in records])
    doc = run_config if provenance is None else {**run_config, PROVENANCE_KEY: to_jsonable(provenance)}
    atomic_write_json(run / RUN_CONFIG_FILE, doc, indent=2, newline=False)
    write_summary(run, summary)
    atomic_write_json(run / MERGE_FILE, to_jsonable(info), indent=2, newline=False)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _write_jsonl(path: Path, rows: list[dict[str, Any]], ensure_ascii: bool = False) -> None:
    """``rows`` as a JSONL file, written atomically (streamed: a merged run may hold many samples)."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(to_jsonable(r), ensure_ascii=ensure_ascii) + "\n")

    atomic_write_with(path, write)


# ----------------------------------------------------------------------------------------------------
# finding and reading runs (read-only)
# ----------------------------------------------------------------------------------------------------


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
