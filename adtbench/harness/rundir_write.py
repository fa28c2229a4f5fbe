"""The writers of a run dir (``rundir``: the layout, its file names and the readers): the crash-safe store
(``ResultStore``) and every other write (``write_summary``, ``check_resume``, ``record_provenance``, ``write_eval``,
``write_maps``, the evaluation exports, ``update_tracking``, ``write_merged_run``). Crash safety: ``rundir``'s module
docstring."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

import numpy as np

from adtbench.errors import ConfigError
from adtbench.harness.provenance import PROVENANCE_KEY, same_code
from adtbench.harness.records import SampleRecord, Summary, migrate_run_config
from adtbench.harness.rundir import (
    EVAL_FILE,
    EVAL_SAMPLES_FILE,
    EXPORT_DIR,
    EXPORT_INDEX_FILE,
    IMAGES_DIR,
    MAPS_DIR,
    MERGE_FILE,
    RUN_CONFIG_FILE,
    SAMPLES_FILE,
    SUMMARY_FILE,
    TRACE_FILE,
    TRACKING_FILE,
    count_sample_lines,
    dumps_line,
    read_jsonl,
    read_run_config,
    safe_stem,
    scan_jsonl,
    to_jsonable,
)
from adtbench.io import (
    append_line_fsync,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    atomic_write_with,
    encode_png,
    save_png,
)

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------
# JSONL repair
# ----------------------------------------------------------------------------------------------------


def _rewrite_keep(path: Path, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Repair a JSONL file in place, keeping complete valid lines for which ``keep(obj)`` is true.

    If the kept lines form a prefix of the file (the normal case after a crash: a torn or orphan tail), the
    file is truncated to that prefix; otherwise it is rewritten atomically. Returns the kept objects.
    """
    if not path.exists():
        return []
    spans, size = scan_jsonl(path)
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


__all__ = [
    "ResultStore",
    "check_resume",
    "dpg_images_dir",
    "export_dir",
    "map_file",
    "record_provenance",
    "update_tracking",
    "write_dpg_grid",
    "write_eval",
    "write_export_index",
    "write_geneval_prompt",
    "write_maps",
    "write_merged_run",
    "write_summary",
]
