"""The run directory: its file names, its records, the crash-safe store that writes them, the walker that finds
runs, and the statistics computed from them. Every module that reads or writes a run dir goes through here.

Layout of a job directory (one Hydra job; README "Output files" documents every field)::

    samples.jsonl        one :class:`SampleRecord` per line per finished prompt (the commit marker)
    trace.jsonl          one :class:`TraceRecord` per line per prompt: the compact per-cycle trace
    images/<stem>.png    the generated image of each prompt (:func:`safe_stem` of its id)
    summary.json         :class:`Summary`: :func:`summarize` of all samples plus the run's context
    run_config.json      the resolved config (resume check; ``adtbench merge`` compares shards by it)
    merge.json           (merged runs) the shard runs it was built from, and the checks
    eval.json / eval_samples.jsonl / tracking.json / maps/ / .adtbench.lock / .hydra/   (see README)

Crash safety. :meth:`ResultStore.commit` writes (1) the image atomically (:func:`adtbench.io.atomic_write_bytes`),
(2) the trace line, (3) the samples line, each line with :func:`adtbench.io.append_line_fsync` (a single
``os.write`` on an ``O_APPEND`` descriptor followed by ``fsync``). A prompt is *done* iff its samples line is
complete, so a kill at any point leaves at worst an orphan image (overwritten on rerun), an orphan trace line or
a torn last line; all of these are repaired when the store is reopened. Nothing is ever written twice for a done
prompt. Readers (:func:`read_records`, :func:`find_runs`, :func:`read_summary`, ...) only read: a JSONL line
counts iff it is complete (newline-terminated) and a JSON object with a string ``prompt_id``.

Statistics: :func:`summarize` (``docs/algorithms.md`` §1.2) and the one bootstrap
(:func:`bootstrap_distribution`, through which :func:`bootstrap_ci`, :func:`ratio_of_totals_ci`,
``adtbench.reporting.tables`` and ``analysis/`` resample).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from adtbench.io import append_line_fsync, atomic_write_bytes, atomic_write_json

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
    "bootstrap_ci",
    "bootstrap_distribution",
    "dumps_line",
    "find_runs",
    "is_plumbing",
    "lantern_choice",
    "merged_sources",
    "natural_key",
    "percentile_interval",
    "ratio_of_totals_ci",
    "read_jsonl",
    "read_override_list",
    "read_overrides",
    "read_records",
    "read_run_config",
    "read_run_maps",
    "read_summary",
    "safe_stem",
    "summarize",
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

# ----------------------------------------------------------------------------------------------------
# plumbing keys
# ----------------------------------------------------------------------------------------------------

#: Config keys that never change a run's samples (run plumbing, not the experiment): a resume may change them
#: (``config.config_fingerprint`` drops them) and they never define a table row. ``dataset.limit`` is here
#: because a resume may extend the prompt list; the samples of the prompts both runs cover are the same.
PLUMBING_KEYS = ("hydra", "dataset.limit", "paths", "logger", "eval", "progress", "warmup", "threads",
                 "save_images", "maps", "lantern.cache_dir")  # fmt: skip
#: Keys that change which samples a run holds but not what they measure: runs differing only in these
#: (shards of one config, repeats with other seeds) are pooled by ``reporting.tables``. Never ignored on resume.
POOLED_KEYS = ("dataset.shard", "seed")


def is_plumbing(key: str, *, pooled: bool = False) -> bool:
    """Whether the config key / override ``key`` is (under) a :data:`PLUMBING_KEYS` entry (with ``pooled``,
    also a :data:`POOLED_KEYS` one): ``paths.out`` is under ``paths``."""
    keys = PLUMBING_KEYS + POOLED_KEYS if pooled else PLUMBING_KEYS
    return any(key == k or key.startswith(k + ".") for k in keys)


# ----------------------------------------------------------------------------------------------------
# records (the JSON of today's files, typed; README "Output files")
# ----------------------------------------------------------------------------------------------------


class SampleRecord(TypedDict, total=False):
    """One ``samples.jsonl`` line. Required by :func:`summarize`: ``prompt_id``, ``cycles``, ``committed``,
    ``drafted_depth_sum``, ``tree_depth_sum``, ``latency_s``; ``image`` is set by :meth:`ResultStore.commit`."""

    prompt_id: str
    prompt: str
    meta: dict[str, Any]
    seed: int
    tokens: list[int]
    cycles: int
    committed: int
    tau: float | None
    d_bar: float | None
    d_bar_tree: float | None
    drafted_depth_sum: int
    tree_depth_sum: int
    target_forwards: int
    drafter_forwards: int
    latency_s: float
    prefill_s: float
    draft_s: float | None
    verify_s: float | None
    baseline_latency_s: float | None
    baseline_target_forwards: int | None
    speedup: float | None
    tokens_match_baseline: bool | None
    latency_repeats_s: list[float]
    baseline_latency_repeats_s: list[float]
    encode_s: float | None
    baseline_encode_s: float | None
    stats: dict[str, Any]
    image: str | None


class TraceRecord(TypedDict, total=False):
    """One ``trace.jsonl`` line: the per-cycle trace as parallel lists (plus policy-specific fields)."""

    prompt_id: str
    pos: list[int]
    nodes: list[int]
    D: list[int]
    d: list[int]
    K: list[int]
    a: list[int]


class Summary(TypedDict, total=False):
    """``summary.json``: the keys of :func:`summarize` first, then the run's context (app, merge, eval)."""

    n_samples: int
    cycles_total: int
    committed_total: int
    tau: float | None
    tau_per_prompt_mean: float | None
    d_bar: float | None
    d_bar_tree: float | None
    latency_s: float | None
    latency_median_s: float | None
    latency_std_s: float | None
    latency_total_s: float
    baseline_latency_s: float | None
    baseline_latency_median_s: float | None
    baseline_latency_std_s: float | None
    speedup: float | None
    speedup_median: float | None
    speedup_ci: list[float] | None
    speedup_per_prompt: dict[str, float | None] | None
    speedup_aggregation: str
    speedup_n: int
    speedup_ci_level: float
    speedup_ci_method: str
    encode_s: float | None
    speedup_with_encode: float | None
    speedup_ci_caveat: str | None
    timing_repeats: list[int] | None
    timing_spread: float | None
    timing_warning: str | None
    draft_s_total: float | None
    verify_s_total: float | None
    draft_frac: float | None
    verify_frac: float | None
    target_forwards_mean: float | None
    # the run's context (written by the app / merge / eval, not by summarize)
    n_prompts: int
    complete: bool
    model: str
    drafter: str
    policy: str
    dataset: str
    sampling: str
    lantern: Any
    choices: dict[str, Any]
    policy_params: dict[str, Any]
    sampling_params: dict[str, Any]
    greedy_matches_baseline: bool | None
    acceptance_rule: str
    timing_scope: str
    env: dict[str, Any] | None
    envs: list[dict[str, Any]]
    env_consistent: bool
    merged_from: list[dict[str, Any]]
    eval: dict[str, Any]


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

    def commit(
        self,
        record: dict[str, Any],
        trace: dict[str, Any] | None,
        image: np.ndarray | None,
    ) -> None:
        """Durably store one finished prompt.

        Order: (0) serialise both lines (so bad values fail before anything is written), (1) write the image
        atomically if given, (2) append the trace line if given, (3) append the samples line LAST: it is the
        commit marker. The written samples record gets ``"image"`` = ``"images/<safe id>.png"`` (or ``None``
        without an image); the caller's dict is not modified. The trace line gets the record's ``prompt_id``.

        Args:
            record: per-prompt metrics; must contain a string ``prompt_id``.
            trace: compact per-cycle trace, or ``None``.
            image: ``uint8`` array of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) (a PIL image is also
                accepted), or ``None``.

        Raises:
            ValueError: if the prompt is already done, the record has no ``prompt_id``, the trace names
                another prompt, or the image has an unsupported dtype/shape.
        """
        pid = record.get("prompt_id")
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"record needs a non-empty string 'prompt_id', got {pid!r}")
        if pid in self._done:
            raise ValueError(f"prompt {pid!r} is already committed in {self.samples_path}")

        img_path = self.image_path(pid)
        rec = dict(record)
        rec["image"] = img_path.relative_to(self.run_dir).as_posix() if image is not None else None
        sample_line = dumps_line(rec)
        trace_line = None
        if trace is not None:
            if trace.get("prompt_id", pid) != pid:
                raise ValueError(f"trace prompt_id {trace.get('prompt_id')!r} != record prompt_id {pid!r}")
            trace_line = dumps_line({"prompt_id": pid, **trace})
        png = _encode_png(image) if image is not None else None

        if png is not None:
            atomic_write_bytes(img_path, png)  # temp name ends in .tmp, cleaned on reopen
        if trace_line is not None:
            append_line_fsync(self.trace_path, trace_line)
        append_line_fsync(self.samples_path, sample_line)
        self._done.add(pid)

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """Write ``summary.json`` atomically (indent=2, key order kept); return its path."""
        atomic_write_json(self.summary_path, to_jsonable(summary), indent=2, ensure_ascii=False, allow_nan=False)
        return self.summary_path


def _encode_png(image: Any) -> bytes:
    """Encode an image array (uint8 HxW / HxWx{1,3,4}) or a PIL image as PNG bytes."""
    from io import BytesIO

    from PIL import Image

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
    buf = BytesIO()
    pil.save(buf, format="PNG")
    return buf.getvalue()


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


def read_summary(run_dir: str | os.PathLike[str]) -> Summary:
    """The run's ``summary.json``."""
    return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())  # type: ignore[no-any-return]


def read_records(run_dir: str | os.PathLike[str], name: str = SAMPLES_FILE) -> list[dict[str, Any]]:
    """The complete lines of the run's ``name`` (``samples.jsonl``, ``trace.jsonl``, ``eval_samples.jsonl``)."""
    return read_jsonl(Path(run_dir) / name)


def _json_or_none(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def read_run_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``run_config.json`` (None when absent)."""
    return _json_or_none(Path(run_dir) / RUN_CONFIG_FILE)  # type: ignore[no-any-return]


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
    """The ``lantern`` option of a run's ``summary.json`` (its Hydra choice; older summaries: the bool)."""
    choice = (s.get("choices") or {}).get("lantern")
    if choice is not None:
        return str(choice)
    return "on" if s.get("lantern") else "off"


def read_run_maps(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``maps/run_maps.json`` (``n_prompts`` and the accept / depth / width grids, None for uncovered
    cells); None when the run wrote no maps (``maps.per_run=false``)."""
    return _json_or_none(Path(run_dir) / RUN_MAPS_FILE)  # type: ignore[no-any-return]


def merged_sources(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The shard run dirs a merged run was built from (``merge.json`` sources; [] for any other run)."""
    doc = _json_or_none(Path(run_dir) / MERGE_FILE) or {}
    return [Path(s["dir"]) for s in doc.get("sources", [])]


# ----------------------------------------------------------------------------------------------------
# summary statistics
# ----------------------------------------------------------------------------------------------------

_REQUIRED = ("prompt_id", "cycles", "committed", "drafted_depth_sum", "tree_depth_sum", "latency_s")
_OPTIONAL_NUM = ("draft_s", "verify_s", "target_forwards", "encode_s", "baseline_encode_s")


def _stats(x: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """(mean, median, std with ddof=1) of ``x``; std is None for n < 2, all None for n = 0."""
    if len(x) == 0:
        return None, None, None
    a = np.asarray(x, dtype=np.float64)
    std = float(np.std(a, ddof=1)) if a.size >= 2 else None
    return float(a.mean()), float(np.median(a)), std


def _num(rec: dict[str, Any], key: str, *, allow_none: bool = False) -> float | None:
    if key not in rec:
        if allow_none:
            return None
        raise ValueError(f"record {rec.get('prompt_id')!r} lacks required key {key!r}")
    v = rec[key]
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be finite and >= 0, got {v!r}")
    return v


SPEEDUP_CI_LEVEL = 0.95
SPEEDUP_N_BOOT = 2000
SPEEDUP_CI_SEED = 0
SPEEDUP_CI_MIN_PROMPTS = 5  # fewer paired prompts: ``speedup_ci_caveat`` is set
TIMING_SPREAD_MAX = 0.05  # median relative range of a prompt's repeats above which ``timing_warning`` is set
SPEEDUP_CI_METHOD = (
    f"two-level percentile bootstrap of the ratio of totals ({SPEEDUP_N_BOOT} resamples, seed {SPEEDUP_CI_SEED}): "
    "prompts with replacement, then each drawn prompt's timing repeats with replacement, reduced to their median"
)


def _repeats(rec: dict[str, Any], key: str, value: float) -> list[float]:
    """The repeated timings ``rec[key]`` (each finite and > 0), or ``[value]`` for a record without repeats."""
    reps = rec.get(key)
    if reps is None:
        return [value]
    if not isinstance(reps, list) or not reps:
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be a non-empty list, got {reps!r}")
    out = [_num({"prompt_id": rec.get("prompt_id"), key: v}, key) for v in reps]
    if not all(out):
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be > 0")
    return out  # type: ignore[return-value]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate per-prompt records into the run summary (definitions of ``docs/algorithms.md`` §1.2).

    Let prompt j have C_j cycles, K_j committed tokens (= Σ over its cycles of (a+1), bonus/root included),
    drafted-depth sum S_j = Σ D, realised tree-depth sum T_j = Σ d, latency L_j and baseline latency B_j.

    * ``tau``                 = Σ_j K_j / Σ_j C_j  (mean over all cycles of a+1; ratio of totals)
    * ``tau_per_prompt_mean`` = mean_j K_j / C_j   (prompts with C_j > 0)
    * ``d_bar``               = Σ_j S_j / Σ_j C_j,   ``d_bar_tree`` = Σ_j T_j / Σ_j C_j
      (τ and the d̄'s are ``None`` when there are no cycles at all.)
    * ``latency_s`` / ``_median_s`` / ``_std_s``: mean, median, std (ddof=1; None if n < 2) of L_j over all
      records; the ``baseline_latency_*`` trio likewise over records with a baseline.
    * ``speedup`` = mean_{j∈P} B_j / mean_{j∈P} L_j, P = records with a baseline (``speedup_aggregation =
      "ratio_of_means"``, which equals the ratio of total latencies); ``speedup_per_prompt`` = mean, median,
      std (ddof=1), min, max, p10, p90 of B_j / L_j over P; ``speedup_n`` = |P|. All ``None`` when P is empty.
    * Timing repeats: a record may hold ``latency_repeats_s`` / ``baseline_latency_repeats_s`` (the app's
      ``timing.repeats``; L_j and B_j are then their medians). ``timing_repeats`` = the distinct repeat counts.
      ``timing_spread`` = the median, over paired prompts and both sides, of (max − min) / median of a prompt's
      repeats (``None`` with one repeat): the timer's own noise. On an idle machine it reads 0.01–0.03; above
      ``TIMING_SPREAD_MAX`` ``timing_warning`` says the timings are unreliable (a busy host shows here even when
      the load average does not).
    * ``speedup_median`` = median_{j∈P} B_j / L_j (the paired per-prompt median); ``speedup_ci`` = [lo, hi], the
      ``speedup_ci_level`` (95 %) two-level bootstrap interval of Σ B_j / Σ L_j (:func:`ratio_of_totals_ci`:
      prompts, then each prompt's repeats → median), described by ``speedup_ci_method``; ``speedup_ci_caveat``
      is a warning string when 0 < |P| < 5, else ``None``.
    * ``draft_s_total`` = Σ draft_s, ``verify_s_total`` = Σ verify_s, ``draft_frac`` = draft_s_total / Σ L_j,
      ``verify_frac`` likewise, ``target_forwards_mean`` = mean target forwards per prompt. These are ``None``
      if any record has the value missing/``None``.

    Raises:
        ValueError: on empty ``records``, missing required keys, or negative/non-finite values (latency must
            also be > 0).
    """
    if not records:
        raise ValueError("summarize() needs at least one record")

    cycles, committed, dsum, tsum, lat = [], [], [], [], []
    base_pairs: list[tuple[float, float]] = []  # (baseline, latency) for prompts with a baseline
    enc_pairs: list[tuple[float, float]] = []  # the same with each side's prompt encoding added
    base_reps: list[list[float]] = []  # per paired prompt: its baseline repeats ...
    lat_reps: list[list[float]] = []  # ... and its method repeats (one each without timing.repeats)
    opt: dict[str, list[float | None]] = {k: [] for k in _OPTIONAL_NUM}
    for rec in records:
        for k in _REQUIRED:
            if k not in rec:
                raise ValueError(f"record {rec.get('prompt_id')!r} lacks required key {k!r}")
        c = _num(rec, "cycles")
        cycles.append(c)
        committed.append(_num(rec, "committed"))
        dsum.append(_num(rec, "drafted_depth_sum"))
        tsum.append(_num(rec, "tree_depth_sum"))
        lt = _num(rec, "latency_s")
        if not lt:
            raise ValueError(f"record {rec['prompt_id']!r}: latency_s must be > 0")
        lat.append(lt)
        b = _num(rec, "baseline_latency_s", allow_none=True)
        if b is not None:
            if b == 0:
                raise ValueError(f"record {rec['prompt_id']!r}: baseline_latency_s must be > 0")
            base_pairs.append((b, lt))
            e, be = _num(rec, "encode_s", allow_none=True), _num(rec, "baseline_encode_s", allow_none=True)
            if e is not None and be is not None:
                enc_pairs.append((b + be, lt + e))
            base_reps.append(_repeats(rec, "baseline_latency_repeats_s", b))
            lat_reps.append(_repeats(rec, "latency_repeats_s", lt))
            if len(base_reps[-1]) != len(lat_reps[-1]):
                raise ValueError(f"record {rec['prompt_id']!r}: baseline and method have different repeat counts")
        for k in _OPTIONAL_NUM:
            opt[k].append(_num(rec, k, allow_none=True))

    n_cycles = sum(cycles)

    def per_cycle(total: float) -> float | None:
        return total / n_cycles if n_cycles > 0 else None

    per_prompt_tau = [k / c for k, c in zip(committed, cycles) if c > 0]
    lat_mean, lat_med, lat_std = _stats(lat)
    lat_total = float(sum(lat))

    out: dict[str, Any] = {
        "n_samples": len(records),
        "cycles_total": int(n_cycles),
        "committed_total": int(sum(committed)),
        "tau": per_cycle(sum(committed)),
        "tau_per_prompt_mean": float(np.mean(per_prompt_tau)) if per_prompt_tau else None,
        "d_bar": per_cycle(sum(dsum)),
        "d_bar_tree": per_cycle(sum(tsum)),
        "latency_s": lat_mean,
        "latency_median_s": lat_med,
        "latency_std_s": lat_std,
        "latency_total_s": lat_total,
    }

    base = [b for b, _ in base_pairs]
    b_mean, b_med, b_std = _stats(base)
    out.update(baseline_latency_s=b_mean, baseline_latency_median_s=b_med, baseline_latency_std_s=b_std)
    if base_pairs:
        paired_lat = [lt for _, lt in base_pairs]
        ratios = np.array([b / lt for b, lt in base_pairs], dtype=np.float64)
        out["speedup"] = float(np.mean(base) / np.mean(paired_lat))
        out["speedup_median"] = float(np.median(ratios))
        lo, hi = ratio_of_totals_ci(base_reps, lat_reps, SPEEDUP_N_BOOT, 1 - SPEEDUP_CI_LEVEL, SPEEDUP_CI_SEED)
        out["speedup_ci"] = [lo, hi]
        out["speedup_per_prompt"] = {
            "mean": float(ratios.mean()),
            "median": float(np.median(ratios)),
            "std": float(np.std(ratios, ddof=1)) if ratios.size >= 2 else None,
            "min": float(ratios.min()),
            "max": float(ratios.max()),
            "p10": float(np.percentile(ratios, 10)),
            "p90": float(np.percentile(ratios, 90)),
        }
    else:
        out["speedup"] = out["speedup_median"] = out["speedup_ci"] = None
        out["speedup_per_prompt"] = None
    out["speedup_aggregation"] = "ratio_of_means"
    out["speedup_n"] = len(base_pairs)
    out["speedup_ci_level"] = SPEEDUP_CI_LEVEL
    out["speedup_ci_method"] = SPEEDUP_CI_METHOD
    out["speedup_ci_caveat"] = (
        f"CI over {len(base_pairs)} prompt(s) < {SPEEDUP_CI_MIN_PROMPTS}: too few to resample; do not trust it"
        if 0 < len(base_pairs) < SPEEDUP_CI_MIN_PROMPTS
        else None
    )
    out["timing_repeats"] = sorted({len(r) for r in lat_reps}) or None  # repeats per prompt (distinct counts)
    spreads = [(max(r) - min(r)) / float(np.median(r)) for r in (*base_reps, *lat_reps) if len(r) > 1]
    out["timing_spread"] = float(np.median(spreads)) if spreads else None
    out["timing_warning"] = (
        f"repeats of one prompt differ by {100 * out['timing_spread']:.1f} % (median) > "
        f"{100 * TIMING_SPREAD_MAX:.0f} %: timings unreliable"
        if out["timing_spread"] is not None and out["timing_spread"] > TIMING_SPREAD_MAX
        else None
    )

    def total(k: str) -> float | None:
        vals = opt[k]
        return None if any(v is None for v in vals) else float(sum(vals))  # type: ignore[arg-type]

    draft_total, verify_total, fwd_total = total("draft_s"), total("verify_s"), total("target_forwards")
    out["draft_s_total"] = draft_total
    out["verify_s_total"] = verify_total
    out["draft_frac"] = draft_total / lat_total if draft_total is not None else None
    out["verify_frac"] = verify_total / lat_total if verify_total is not None else None
    out["target_forwards_mean"] = fwd_total / len(records) if fwd_total is not None else None
    enc_total = total("encode_s")
    out["encode_s"] = enc_total / len(records) if enc_total is not None else None
    out["speedup_with_encode"] = (  # the wider timed scope: prompt encoding (text encoder; Tar's LM) included
        float(sum(b for b, _ in enc_pairs) / sum(lt for _, lt in enc_pairs))
        if base_pairs and len(enc_pairs) == len(base_pairs)
        else None
    )
    return out


# ----------------------------------------------------------------------------------------------------
# bootstrap: the one implementation (summaries, ``adtbench.reporting.tables`` and ``analysis/`` resample through it)
# ----------------------------------------------------------------------------------------------------

BOOT_CHUNK_ELEMENTS = 4_000_000  # bound on the elements of one chunk of resampled data (32 MB; results unchanged)


def _clusters(data: np.ndarray | Sequence[Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """``(rows [P, ...], None)`` for one observation per cluster, else ``(padded [P, R_max, ...], counts [P])``
    with the missing repeats of shorter clusters NaN-padded."""
    if isinstance(data, np.ndarray):
        rows = np.asarray(data, dtype=np.float64)
        if rows.ndim == 0 or rows.shape[0] == 0:
            raise ValueError("the bootstrap needs at least one cluster")
        return rows, None
    reps = [np.asarray(x, dtype=np.float64) for x in data]
    if not reps:
        raise ValueError("the bootstrap needs at least one cluster")
    if any(r.ndim == 0 or r.shape[0] == 0 for r in reps) or len({r.shape[1:] for r in reps}) > 1:
        raise ValueError("every cluster needs ≥ 1 repeat, all repeats of the same shape")
    counts = np.array([r.shape[0] for r in reps])
    if counts.max() == 1:
        return np.stack([r[0] for r in reps]), None
    padded = np.full((len(reps), int(counts.max()), *reps[0].shape[1:]), np.nan)
    for j, r in enumerate(reps):
        padded[j, : r.shape[0]] = r
    return padded, counts


def bootstrap_distribution(
    data: np.ndarray | Sequence[Any],
    stat: Callable[[np.ndarray], Any],
    n_boot: int = 1000,
    seed: int = 0,
    *,
    vectorized: bool = False,
) -> np.ndarray:
    """Bootstrap statistics of a one- or two-level (hierarchical) bootstrap over clusters (prompts).

    ``data``: an array whose axis 0 indexes P clusters with one observation each (a scalar or a row), or a
    sequence of P arrays ``[R_j, ...]`` holding the R_j repeated observations of cluster j.

    * Level 1 (clusters): ``rng.integers(0, P, size=(n_boot, P))`` with ``rng = default_rng(seed)``, drawn in
      one call before anything else, so every caller with the same P, ``n_boot`` and seed resamples the
      same prompts.
    * Level 2 (repeats), only when some R_j > 1: each drawn cluster draws R_j of its own repeats with
      replacement (whole rows, so the columns of one repeat stay paired) and is replaced by their element-wise
      median. With every R_j = 1 nothing is drawn and the result equals the one-level bootstrap of the rows.

    ``stat`` maps one resample ``[P, ...]`` to a scalar or a vector; with ``vectorized`` it maps a chunk of
    resamples ``[b, P, ...]`` to ``[b]`` or ``[b, m]``. Returns the ``[n_boot]`` (or ``[n_boot, m]``)
    statistics, in resample order. Deterministic for a given ``seed``.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    values, counts = _clusters(data)
    p = values.shape[0]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, p, size=(n_boot, p))
    step = max(1, BOOT_CHUNK_ELEMENTS // max(1, values.size))
    ragged = counts is not None and bool((counts != counts.max()).any())
    out = []
    for start in range(0, n_boot, step):
        ix = idx[start : start + step]  # [b, P]
        if counts is None:
            x = values[ix]  # [b, P, ...]
        else:
            r_max = values.shape[1]
            n = counts[ix][..., None]  # [b, P, 1] repeats of each drawn cluster
            j = (rng.random((*ix.shape, r_max)) * n).astype(np.int64)  # uniform in [0, R_j)
            x = values[ix[..., None], j]  # [b, P, R_max, ...]
            if ragged:  # draws beyond a cluster's own R_j do not count
                keep = (np.arange(r_max) < n).reshape(*j.shape, *(1,) * (x.ndim - 3))
                x = np.nanmedian(np.where(keep, x, np.nan), axis=2)
            else:
                x = np.median(x, axis=2)
        if vectorized:
            out.append(np.asarray(stat(x), dtype=np.float64))
        else:
            out.append(np.array([np.asarray(stat(xi), dtype=np.float64) for xi in x]))
    return np.concatenate(out, axis=0)


def percentile_interval(boots: np.ndarray, alpha: float = 0.05) -> np.ndarray:
    """The (α/2, 1 − α/2) percentiles of the finite bootstrap statistics: ``[2]`` for ``[n_boot]`` input,
    ``[m, 2]`` for ``[n_boot, m]`` (one interval per column); NaN where no statistic is finite."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    b = np.asarray(boots, dtype=np.float64)
    cols = b.reshape(b.shape[0], -1)
    out = np.full((cols.shape[1], 2), np.nan)
    for c in range(cols.shape[1]):
        fin = cols[:, c][np.isfinite(cols[:, c])]
        if fin.size:
            out[c] = np.percentile(fin, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return out[0] if b.ndim == 1 else out


def bootstrap_ci(
    values: Iterable[Any] | np.ndarray,
    stat: Callable[[np.ndarray], Any] = np.mean,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``stat`` over prompts (:func:`bootstrap_distribution`, one level).

    Draws ``n_boot`` resamples of the n rows of ``values`` (axis 0) with replacement, evaluates ``stat`` on
    each, and returns the (α/2, 1-α/2) percentiles of those statistics. Rows may be vectors, e.g. pass
    ``np.c_[baseline, latency]`` with ``stat=lambda a: a[:, 0].mean() / a[:, 1].mean()`` for a CI of the
    ratio-of-means speedup (prompts resampled as pairs). Deterministic for a given ``seed``.
    """
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    if arr.ndim == 0 or arr.shape[0] == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo, hi = percentile_interval(bootstrap_distribution(arr, stat, n_boot, seed), alpha)
    return float(lo), float(hi)


def _ratio_of_sums(x: np.ndarray) -> np.ndarray:
    """``[b, P, 2]`` resamples → ``[b]`` ratios Σ column 0 / Σ column 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return x[..., 0].sum(axis=-1) / x[..., 1].sum(axis=-1)


def ratio_of_totals_ci(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Two-level bootstrap CI of Σ_j med(numerator_j) / Σ_j med(denominator_j) (e.g. the speedup: baseline
    over method latency). ``numerator[j]`` and ``denominator[j]`` are prompt j's repeated timings, paired by
    repeat (repeat r of both was timed back to back, so they are resampled together). With one repeat per
    prompt this is the prompt bootstrap of the ratio of totals; repeats that disagree widen the interval."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} numerator vs {len(denominator)} denominator prompts")
    clusters = []
    for j, (a, b) in enumerate(zip(numerator, denominator)):
        if len(a) != len(b):
            raise ValueError(f"prompt {j}: {len(a)} numerator vs {len(b)} denominator repeats")
        clusters.append(np.c_[np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)])
    lo, hi = percentile_interval(bootstrap_distribution(clusters, _ratio_of_sums, n_boot, seed, vectorized=True), alpha)
    return float(lo), float(hi)
