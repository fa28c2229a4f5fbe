"""Experiment-tracking sinks. Local files (``samples.jsonl``, ``trace.jsonl``, ``summary.json``) are always the
source of truth; a tracker only mirrors them and never makes a job fail.

``build_logger(cfg, run_dir, choices)`` returns an object with ``log_sample(record, trace, image)``,
``log_summary(summary)`` and ``finish()``:

- ``logger=none`` → :class:`NullLogger`.
- ``logger=wandb`` → :class:`WandbLogger`: one W&B run per job (``reinit="finish_previous"``, and the app
  calls ``finish()`` in ``finally``, so every multirun job gets a fresh run), grouped by sweep (the Hydra
  sweep dir, or the array dir of ``dataset.shard`` jobs), ``job_type`` = the policy, the resolved config,
  per-sample scalars and the per-cycle trace summary, image samples and acceptance maps as media, the
  summary metrics and a table of all samples. ``mode: offline`` by default (no account; ``wandb sync
  <run_dir>/wandb/offline-run-<time>-<id>`` later, the command is in ``tracking.json``); ``logger.mode=online``
  to opt in — W&B then finds its own credentials (environment or ``~/.netrc``);
  adtbench never reads or writes an API key.

Mode (:func:`resolve_mode`): ``logger.mode`` given on the command line wins; else an explicit, non-empty
``WANDB_MODE`` in the environment; else the config's ``logger.mode``. The winner and its source (``cli`` /
``env`` / ``config``) are logged and recorded in ``tracking.json`` (``mode``, ``mode_source``, ``mode_env``,
``mode_config``).

Resume (one W&B run per run dir, every sample in it): the W&B run id is :func:`stable_run_id` of the run dir (a
hash of its resolved absolute path and the job type), so every attempt on a run dir (a resume, a SLURM requeue, a
rerun after ``kill -9``, ``adtbench eval`` of it) writes the same W&B run.

- Offline (the default) an attempt cannot append to an earlier attempt's transaction log, and W&B has no offline
  resume (wandb ≥ 0.30 dropped ``wandb sync --append``). So every offline attempt is *whole*: it first replays the
  samples ``samples.jsonl`` already holds (steps 0 … k−1, with their traces and saved images), then logs its own
  (steps k …), the summary and the samples table; once its run is open, the earlier attempts' ``offline-run-*-<id>``
  dirs are moved to ``<run_dir>/wandb/superseded/`` (kept, never synced: ``wandb sync`` globs ``*/*.wandb``). The
  run dir's ``wandb/`` then holds exactly one offline run per id, holding every sample; the sync command written to
  ``tracking.json`` names that dir.
- Online the run is resumed (``resume="allow"``): the server holds the earlier attempts' steps, sample steps
  continue after the samples already in ``samples.jsonl`` (nothing is replayed unless no earlier attempt of this
  id is recorded in ``tracking.json``, e.g. a merged run or a run decoded with ``logger=none``).
- Either way the samples table is built at the end from ``samples.jsonl`` + ``trace.jsonl`` (every attempt's rows),
  and the summary (``speedup_ci`` / ``speedup_ref_ci`` as ``…/lo`` and ``…/hi``) is written once per attempt; W&B
  keeps the last.

``attach=True`` (``adtbench eval <run dir>``): the evaluation is one more attempt of the run it evaluates — the same
id, job type, group and name (from that run's entry in ``tracking.json``, else its ``run_config.json``), that run's
config (``run_config.json`` + choices) with the evaluation's ``eval`` node added; its metrics land in that run's
summary. ``adtbench merge`` logs the merged run as its own W&B run in the shards' group.

Failure policy: if ``wandb`` is missing, ``wandb.init`` fails (unreachable server, no credentials) or any
later call raises, a warning is logged, the failure is recorded in ``<run_dir>/tracking.json`` and the
tracker turns itself off; decoding and the local records continue untouched.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from adtbench.harness.rundir import (
    count_sample_lines,
    read_hydra_config,
    read_run_config,
    read_samples,
    read_traces,
    read_tracking,
    safe_stem,
)
from adtbench.harness.rundir_write import map_file, update_tracking

log = logging.getLogger(__name__)


class NullLogger:
    """Tracks nothing."""

    def log_sample(self, record: dict, trace: dict, image: Any) -> None:
        pass

    def log_summary(self, summary: dict) -> None:
        pass

    def finish(self) -> None:
        pass


def _record(run_dir: Path, entry: dict[str, Any]) -> None:
    """Append/update this job's entry (by ``started``) in ``tracking.json``; never raises."""
    try:
        update_tracking(run_dir, entry)
    except Exception as e:  # the tracker's bookkeeping must not fail a job either
        log.warning("could not record this job in %s: %s", run_dir, e)


def _is_interval(key: str, v: Any) -> bool:
    """Whether ``v`` is a confidence interval: a ``*_ci`` key holding ``[lo, hi]`` (two numbers)."""
    return (
        key.endswith("_ci")
        and isinstance(v, list | tuple)
        and len(v) == 2
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
    )


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict → ``{"a/b": scalar}`` (numbers, strings, bools); an interval ``x_ci = [lo, hi]`` becomes
    ``x_ci/lo`` and ``x_ci/hi`` (``speedup_ci``, ``speedup_ref_ci``, …); other lists and None are dropped."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= _flatten(v, f"{key}/")
        elif isinstance(v, bool | int | float | str):
            out[key] = v
        elif _is_interval(str(k), v):
            out[f"{key}/lo"], out[f"{key}/hi"] = float(v[0]), float(v[1])
    return out


def _mean(xs: list[Any]) -> float | None:
    vals = [float(x) for x in xs if isinstance(x, int | float)]
    return sum(vals) / len(vals) if vals else None


SAMPLE_KEYS = ("tau", "d_bar", "d_bar_tree", "cycles", "latency_s", "baseline_latency_s", "speedup", "target_forwards")
TRACE_KEYS = ("a", "nodes", "D", "K")
TABLE_COLUMNS = ["prompt_id", "prompt", *SAMPLE_KEYS, *(f"{k}_mean" for k in TRACE_KEYS)]
SUPERSEDED_DIR = "superseded"  # <run_dir>/wandb/superseded/: earlier offline attempts, kept but never synced


def _trace_means(trace: dict[str, Any]) -> dict[str, float | None]:
    return {f"{k}_mean": _mean(trace.get(k, [])) for k in TRACE_KEYS}


def table_rows(run_dir: Path) -> list[list[Any]]:
    """The samples table: one row per line of ``samples.jsonl`` (every attempt's), in commit order, with the
    per-cycle means of its ``trace.jsonl`` line (None where the trace is missing)."""
    traces = {t.get("prompt_id"): t for t in read_traces(run_dir)}
    return [
        [
            r.get("prompt_id"),
            r.get("prompt"),
            *(r.get(k) for k in SAMPLE_KEYS),
            *_trace_means(traces.get(r.get("prompt_id"), {})).values(),
        ]
        for r in read_samples(run_dir)
    ]


class WandbLogger:
    """Mirror one job into one W&B run; any W&B error disables the tracker (see module docstring)."""

    def __init__(
        self, wandb: Any, run: Any, run_dir: Path, node: Any, entry: dict[str, Any], first_step: int = 0
    ) -> None:
        self.wandb, self.run, self.run_dir, self.entry = wandb, run, run_dir, entry
        self.max_images = int(node.get("max_images", 16))
        self.log_images = bool(node.get("log_images", True))
        self.first_step = first_step  # samples of earlier attempts (resume): steps continue after them
        self.n = 0  # samples this attempt logged (replayed ones included)
        self.images = 0

    def replay(self, count: int) -> int:
        """Log the first ``count`` samples of ``samples.jsonl`` (earlier attempts') at steps 0 … count−1, with
        their traces and saved images; returns how many were logged. Sample steps then continue at ``count``."""
        if self.run is None or count <= 0:
            return 0
        traces = {t.get("prompt_id"): t for t in read_traces(self.run_dir)}
        records = read_samples(self.run_dir)[:count]
        self.first_step, self.n = 0, 0
        for r in records:
            image = self.run_dir / str(r["image"]) if r.get("image") else None
            self.log_sample(r, traces.get(r.get("prompt_id"), {}), str(image) if image and image.exists() else None)
        return self.n

    def _fail(self, what: str, e: BaseException) -> None:
        log.warning(
            "W&B %s failed (%s: %s); W&B logging is off for this job, local records are unaffected",
            what,
            type(e).__name__,
            e,
        )
        self.entry |= {"status": "failed", "error": f"{what}: {type(e).__name__}: {e}"}
        _record(self.run_dir, self.entry)
        self.run = None

    def log_sample(self, record: dict, trace: dict, image: Any) -> None:
        if self.run is None:
            return
        try:
            data: dict[str, Any] = {f"sample/{k}": record[k] for k in SAMPLE_KEYS if record.get(k) is not None}
            summ = _trace_means(trace)
            data |= {f"trace/{k}": v for k, v in summ.items() if v is not None}
            caption = f"{record.get('prompt_id')}: {record.get('prompt', '')}"[:200]
            if self.log_images and image is not None and self.images < self.max_images:
                data["media/image"] = self.wandb.Image(image, caption=caption)
                self.images += 1
                amap = map_file(self.run_dir, safe_stem(str(record.get("prompt_id"))), "accept")
                if amap.exists():  # per-image acceptance map (maps.per_image=true)
                    data["media/accept_map"] = self.wandb.Image(str(amap), caption=caption)
            self.run.log(data, step=self.first_step + self.n)
            self.n += 1
        except Exception as e:
            self._fail("log_sample", e)

    def log_summary(self, summary: dict) -> None:
        if self.run is None:
            return
        try:
            flat = _flatten({k: v for k, v in summary.items() if k not in ("policy_params", "sampling_params")})
            self.run.summary.update(flat)
            media = {
                f"media/run_{kind}_map": self.wandb.Image(str(p))
                for kind in ("accept", "depth", "width")
                if (p := map_file(self.run_dir, "run", kind)).exists()
            }
            rows = table_rows(self.run_dir)  # every attempt's samples, from the local records
            if rows:
                media["samples"] = self.wandb.Table(columns=TABLE_COLUMNS, data=rows)
            if media:
                self.run.log(media)
        except Exception as e:
            self._fail("log_summary", e)

    def finish(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
            self.entry |= {"status": "finished", "samples_logged": self.n, "history_steps": self.first_step + self.n}
            _record(self.run_dir, self.entry)
        except Exception as e:
            self._fail("finish", e)


MODE_KEY = "logger.mode"
RESUME = "allow"


def resolve_mode(env_value: str | None, cfg_value: str, cli_override: bool) -> tuple[str, str]:
    """(mode, source) of the W&B run: ``logger.mode`` set on the command line (``cli_override``) wins, then an
    explicit, non-empty ``WANDB_MODE`` (``env_value``, stripped), then the config's ``logger.mode``."""
    if cli_override:
        return str(cfg_value), "cli"
    if env_value is not None and env_value.strip():
        return env_value.strip(), "env"
    return str(cfg_value), "config"


def mode_on_cli(overrides: Sequence[str] | None = None) -> bool:
    """Whether ``logger.mode`` is among the command-line ``overrides`` (``key=value`` strings, ``+``/``++``/``~``
    prefixes allowed); with None, those of the running Hydra app (``HydraConfig.get().overrides.task``), False
    outside one."""
    if overrides is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            if not HydraConfig.initialized():
                return False
            overrides = list(HydraConfig.get().overrides.task)
        except Exception:  # Hydra is optional context here
            return False
    return any(str(o).partition("=")[0].lstrip("+~") == MODE_KEY for o in overrides)


def stable_run_id(run_dir: str | os.PathLike[str], job_type: str) -> str:
    """W&B run id of the job of ``job_type`` writing ``run_dir``: the same for every attempt on the same dir
    (resolved absolute path, symlinks followed), different across dirs and job types; 20 hex digits."""
    key = f"{Path(run_dir).resolve()}\n{job_type}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:20]


def _samples_done(run_dir: Path) -> int:
    """Complete lines of ``samples.jsonl`` (the samples earlier attempts already logged); 0 if absent."""
    return count_sample_lines(run_dir)


def _hydra_context(run_dir: Path, cfg: Any) -> tuple[str | None, str]:
    """(group, name): the sweep (multirun) or array (sharded run) this job belongs to, and a job name."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            if hc.mode == RunMode.MULTIRUN:
                sweep = Path(str(hc.sweep.dir))
                return f"{sweep.parent.name}/{sweep.name}", str(hc.job.override_dirname) or run_dir.name
    except Exception:  # Hydra is optional context here
        pass
    shard = cfg.get("dataset", {}).get("shard") if hasattr(cfg, "get") else None
    if shard is not None:
        return run_dir.parent.name, run_dir.name
    return None, run_dir.name


def _earlier_entries(run_dir: Path) -> list[dict[str, Any]]:
    """The W&B entries of ``tracking.json`` (earlier attempts on this run dir), oldest first; [] if none."""
    return [r for r in read_tracking(run_dir) if r.get("kind") == "wandb"]


def evaluated_run(run_dir: Path, choices: dict[str, Any]) -> dict[str, Any]:
    """Who ``adtbench eval`` attaches to: the W&B identity (``job_type``, ``group``, ``name``) of the run decoded
    into ``run_dir`` — its latest opened entry in ``tracking.json`` that is not a (legacy) eval run — else, for a
    run decoded without W&B, the identity the decode would have had (job type = its policy, the array dir as
    group for a shard, the run dir name)."""
    for r in reversed(_earlier_entries(run_dir)):
        if r.get("id") and r.get("job_type") and r.get("job_type") != "eval":
            return {k: r.get(k) for k in ("job_type", "group", "name")}
    run_cfg = read_run_config(run_dir) or {}
    shard = (run_cfg.get("dataset") or {}).get("shard")
    policy = choices.get("policy") or (run_cfg.get("policy") or {}).get("name") or "decode"
    return {"job_type": str(policy), "group": run_dir.parent.name if shard is not None else None, "name": None}


def supersede_offline(run_dir: Path, run_id: str, keep: Path | None) -> list[str]:
    """Move every ``<run_dir>/wandb/offline-run-*-<run_id>`` dir but ``keep`` (the current attempt's) into
    ``<run_dir>/wandb/superseded/``; returns the moved dirs' names. Each offline attempt is whole (it replays the
    earlier samples), so the superseded dirs hold nothing the kept one lacks; they are kept, never synced."""
    wdir = run_dir / "wandb"
    moved: list[str] = []
    for d in sorted(wdir.glob(f"offline-run-*-{run_id}*")):  # (W&B adds "-1" to a same-second dir)
        if keep is not None and d.resolve() == keep.resolve():
            continue
        dest = wdir / SUPERSEDED_DIR / d.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while dest.exists():  # a second attempt of the same second
            dest, n = wdir / SUPERSEDED_DIR / f"{d.name}.{n}", n + 1
        d.rename(dest)
        moved.append(d.name)
    return moved


def _build_wandb(
    cfg: Any,
    run_dir: Path,
    choices: dict[str, Any],
    job_type: str | None,
    on_cli: bool | None,
    attach: bool = False,
    group: str | None = None,
) -> Any:
    from omegaconf import OmegaConf

    node = cfg.logger
    cfg_mode = str(node.get("mode", "offline"))
    env_mode = os.environ.get("WANDB_MODE")
    on_cli = mode_on_cli() if on_cli is None else on_cli
    mode, source = resolve_mode(env_mode, cfg_mode, on_cli)
    log.info(
        "W&B mode %s (from %s; WANDB_MODE=%r, logger.mode=%r, logger.mode on the command line: %s)",
        mode,
        source,
        env_mode,
        cfg_mode,
        on_cli,
    )
    started = datetime.now().isoformat(timespec="microseconds")
    entry: dict[str, Any] = {
        "kind": "wandb",
        "mode": mode,
        "mode_source": source,
        "mode_env": env_mode,
        "mode_config": cfg_mode,
        "started": started,
    }
    try:
        import wandb
    except ImportError as e:
        entry |= {"status": "failed", "error": f"import wandb: {e}"}
        log.warning("logger=wandb but wandb is not installed (%s); continuing with local records only", e)
        _record(run_dir, entry)
        return NullLogger()
    earlier = _earlier_entries(run_dir)
    container = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    resolved: dict[str, Any] = dict(container)  # type: ignore[arg-type]  # a config's root is a mapping
    if attach:  # adtbench eval: one more attempt of the evaluated run, with that run's config and identity
        target = evaluated_run(run_dir, choices)
        job_type, group, name = str(target["job_type"]), target["group"], target["name"] or run_dir.name
        # the decode's composed config (.hydra/config.yaml: plumbing keys too), its resolved experiment keys on top
        config: dict[str, Any] = {**(read_hydra_config(run_dir) or {}), **(read_run_config(run_dir) or {})}
        config["eval"] = resolved.get("eval")
        entry["attached"] = "eval"
    else:
        ctx_group, name = _hydra_context(run_dir, cfg)
        group = group or ctx_group
        job_type = job_type or str(choices.get("policy") or cfg.get("policy", {}).get("name", "decode"))
        config = resolved
        config.pop("hydra", None)
    group = node.get("group") or group
    name = str(node.get("name") or name)
    config["choices"] = dict(choices)
    config["run_dir"] = str(run_dir)
    run_id = stable_run_id(run_dir, job_type)
    opened_before = any(
        r.get("id") == run_id and r.get("status") != "failed" and r.get("mode") == mode for r in earlier
    )
    # offline: every attempt replays the earlier samples (its file is whole); online: the server has them
    replay = mode == "offline" or not opened_before
    tags = [str(t) for t in (node.get("tags") or [])]
    try:
        # values checked by the schema (logger.console, logger.mode) go through as keyword dicts
        settings_kw: dict[str, Any] = {
            "init_timeout": float(node.get("init_timeout", 60)),
            "console": str(node.get("console", "off")),
            "silent": bool(node.get("silent", True)),
            "x_disable_stats": not bool(node.get("system_stats", True)),
        }
        init_kw: dict[str, Any] = {
            "project": str(node.get("project", "adtbench")),
            "entity": node.get("entity"),
            "dir": str(run_dir),
            "mode": mode,
            "group": None if group is None else str(group),
            "job_type": job_type,
            "name": name,
            "tags": tags,
            "config": config,
            "id": run_id,
            "resume": None if mode == "offline" else RESUME,  # offline has no resume: the attempt is whole
            "reinit": "finish_previous",
        }
        run = wandb.init(**init_kw, settings=wandb.Settings(**settings_kw))
    except Exception as e:
        entry |= {"status": "failed", "error": f"wandb.init: {type(e).__name__}: {e}"}
        log.warning("wandb.init failed (%s: %s); continuing with local records only", type(e).__name__, e)
        _record(run_dir, entry)
        return NullLogger()
    done = _samples_done(run_dir)
    first_step = 0 if replay else max(done, int(getattr(run, "step", 0) or 0))
    run_files = str(getattr(run, "dir", "") or "")
    offline_dir = Path(run_files).parent if mode == "offline" and run_files else None
    entry |= {
        "status": "running",
        "id": getattr(run, "id", None),
        "resume": None if mode == "offline" else RESUME,
        "first_step": first_step,
        "group": group,
        "job_type": job_type,
        "name": name,
        "dir": run_files,
        "sync": f"wandb sync {offline_dir}" if offline_dir is not None else None,
    }
    _record(run_dir, entry)
    tracker = WandbLogger(wandb, run, run_dir, node, entry, first_step)
    if replay and done:
        entry["replayed"] = tracker.replay(done)
        _record(run_dir, entry)
    if offline_dir is not None and tracker.run is not None:
        try:
            moved = supersede_offline(run_dir, run_id, offline_dir)
        except OSError as e:  # bookkeeping only: the kept dir is whole either way
            log.warning("could not move earlier offline W&B attempts aside: %s", e)
            moved = []
        if moved:
            entry["superseded"] = moved
            _record(run_dir, entry)
    return tracker


def build_logger(
    cfg: Any,
    run_dir: Path,
    choices: dict[str, Any],
    job_type: str | None = None,
    mode_on_cli: bool | None = None,
    attach: bool = False,
    group: str | None = None,
) -> Any:
    """The tracker of ``cfg.logger.kind`` for the job writing ``run_dir`` (``job_type`` overrides the policy).

    ``mode_on_cli``: whether ``logger.mode`` was set on the command line (decides against ``WANDB_MODE``, see
    :func:`resolve_mode`); None reads it from the running Hydra app (False outside one). ``attach``: log into the
    W&B run of the run decoded into ``run_dir`` (``adtbench eval``, see the module docstring). ``group``: the W&B
    group when no sweep / array gives one (``adtbench merge``: the shards')."""
    kind = str(cfg.logger.get("kind", "none"))
    if kind == "none":
        return NullLogger()
    if kind == "wandb":
        return _build_wandb(cfg, Path(run_dir), choices, job_type, mode_on_cli, attach, group)
    from adtbench.errors import ConfigError

    raise ConfigError("logger.kind", f"unknown logger {kind!r}; choose none or wandb")


def offline_records(path: str | os.PathLike[str]) -> list[Any]:
    """The records (``wandb.proto.wandb_internal_pb2.Record``) of an offline run's transaction log
    ``run-<id>.wandb`` (or of the one in the offline run dir ``path``), in file order, to check what a sync would
    upload without a server.

    Format (wandb-core's ``transactionlog``, store version 0 as wandb 0.31 writes it): a 7-byte header
    (``:W&B``, magic ``0xBEE1``, version) then a LevelDB log: 32 KiB blocks of chunks, each a 7-byte header
    (CRC-32, little-endian length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4) and its bytes; a record is one FULL
    chunk or FIRST, MIDDLE…, LAST. A block tail shorter than a header is padding; a torn last chunk (the writer
    was killed) ends the log. CRCs are not checked."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    p = Path(path)
    if p.is_dir():
        (p,) = p.glob("*.wandb")
    data = p.read_bytes()
    if data[:4] != b":W&B" or len(data) < 7:
        raise ValueError(f"{p} is not a W&B transaction log")
    if data[6] != 0:
        raise ValueError(f"{p}: W&B store version {data[6]}; this reader knows version 0 (wandb 0.19.10 … 0.31)")
    block, pos, parts, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero fill (preallocated / padded block)
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        if len(chunk) < length:
            break  # torn tail
        pos += 7 + length
        if kind == 1:
            out.append(pb.Record.FromString(chunk))  # type: ignore[attr-defined]
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            out.append(pb.Record.FromString(parts + chunk))  # type: ignore[attr-defined]
            parts = b""
    return out
