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
  <run_dir>/wandb/offline-run-*`` later); ``logger.mode=online`` to opt in — W&B then finds its own
  credentials (environment or ``~/.netrc``); adtbench never reads or writes an API key.

Mode (:func:`resolve_mode`): ``logger.mode`` given on the command line wins; else an explicit, non-empty
``WANDB_MODE`` in the environment; else the config's ``logger.mode``. The winner and its source (``cli`` /
``env`` / ``config``) are logged and recorded in ``tracking.json`` (``mode``, ``mode_source``, ``mode_env``,
``mode_config``).

Resume: the W&B run id is :func:`stable_run_id` of the run dir (a hash of its resolved absolute path and the job
type) and ``wandb.init`` gets ``resume="allow"``, so a resumed, requeued or preempted job continues its own
W&B run (offline: one ``offline-run-*`` dir per attempt, all with that id; ``wandb sync`` uploads them to one
run in start order). Sample steps continue after the samples already in ``samples.jsonl``.

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

from adtbench.harness.rundir import count_sample_lines, map_file, safe_stem, update_tracking

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


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict → ``{"a/b": scalar}`` (numbers, strings, bools; lists and None dropped)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= _flatten(v, f"{key}/")
        elif isinstance(v, bool | int | float | str):
            out[key] = v
    return out


def _mean(xs: list[Any]) -> float | None:
    vals = [float(x) for x in xs if isinstance(x, int | float)]
    return sum(vals) / len(vals) if vals else None


SAMPLE_KEYS = ("tau", "d_bar", "d_bar_tree", "cycles", "latency_s", "baseline_latency_s", "speedup", "target_forwards")
TABLE_COLUMNS = ["prompt_id", "prompt", *SAMPLE_KEYS, "a_mean", "nodes_mean", "D_mean", "K_mean"]


class WandbLogger:
    """Mirror one job into one W&B run; any W&B error disables the tracker (see module docstring)."""

    def __init__(
        self, wandb: Any, run: Any, run_dir: Path, node: Any, entry: dict[str, Any], first_step: int = 0
    ) -> None:
        self.wandb, self.run, self.run_dir, self.entry = wandb, run, run_dir, entry
        self.max_images = int(node.get("max_images", 16))
        self.log_images = bool(node.get("log_images", True))
        self.first_step = first_step  # samples of earlier attempts (resume): steps continue after them
        self.n = 0
        self.images = 0
        self.rows: list[list[Any]] = []

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
            summ = {f"{k}_mean": _mean(trace.get(k, [])) for k in ("a", "nodes", "D", "K")}
            data |= {f"trace/{k}": v for k, v in summ.items() if v is not None}
            caption = f"{record.get('prompt_id')}: {record.get('prompt', '')}"[:200]
            if self.log_images and image is not None and self.images < self.max_images:
                data["media/image"] = self.wandb.Image(image, caption=caption)
                self.images += 1
                amap = map_file(self.run_dir, safe_stem(str(record.get("prompt_id"))), "accept")
                if amap.exists():  # per-image acceptance map (maps.per_image=true)
                    data["media/accept_map"] = self.wandb.Image(str(amap), caption=caption)
            self.run.log(data, step=self.first_step + self.n)
            self.rows.append(
                [record.get("prompt_id"), record.get("prompt"), *(record.get(k) for k in SAMPLE_KEYS), *summ.values()]
            )
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
            if self.rows:
                media["samples"] = self.wandb.Table(columns=TABLE_COLUMNS, data=self.rows)
            if media:
                self.run.log(media)
        except Exception as e:
            self._fail("log_summary", e)

    def finish(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
            self.entry |= {"status": "finished", "samples_logged": self.n}
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


def _build_wandb(cfg: Any, run_dir: Path, choices: dict[str, Any], job_type: str | None, on_cli: bool | None) -> Any:
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
    group, name = _hydra_context(run_dir, cfg)
    group = node.get("group") or group
    job_type = job_type or str(choices.get("policy") or cfg.get("policy", {}).get("name", "decode"))
    run_id = stable_run_id(run_dir, job_type)
    config = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    config.pop("hydra", None)
    config["choices"] = dict(choices)
    config["run_dir"] = str(run_dir)
    tags = [str(t) for t in (node.get("tags") or [])]
    try:
        settings = wandb.Settings(
            init_timeout=float(node.get("init_timeout", 60)),
            console=str(node.get("console", "off")),
            silent=bool(node.get("silent", True)),
            x_disable_stats=not bool(node.get("system_stats", True)),
        )
        run = wandb.init(
            project=str(node.get("project", "adtbench")),
            entity=node.get("entity"),
            dir=str(run_dir),
            mode=mode,
            group=None if group is None else str(group),
            job_type=job_type,
            name=str(node.get("name") or name),
            tags=tags,
            config=config,
            id=run_id,
            resume=RESUME,
            reinit="finish_previous",
            settings=settings,
        )
    except Exception as e:
        entry |= {"status": "failed", "error": f"wandb.init: {type(e).__name__}: {e}"}
        log.warning("wandb.init failed (%s: %s); continuing with local records only", type(e).__name__, e)
        _record(run_dir, entry)
        return NullLogger()
    first_step = max(_samples_done(run_dir), int(getattr(run, "step", 0) or 0))
    entry |= {
        "status": "running",
        "id": getattr(run, "id", None),
        "resume": RESUME,
        "first_step": first_step,
        "group": group,
        "job_type": job_type,
        "dir": str(getattr(run, "dir", "") or ""),
        "sync": f"wandb sync {run_dir / 'wandb'}/offline-run-*" if mode == "offline" else None,
    }
    _record(run_dir, entry)
    return WandbLogger(wandb, run, run_dir, node, entry, first_step)


def build_logger(
    cfg: Any, run_dir: Path, choices: dict[str, Any], job_type: str | None = None, mode_on_cli: bool | None = None
) -> Any:
    """The tracker of ``cfg.logger.kind`` for the job writing ``run_dir`` (``job_type`` overrides the policy).

    ``mode_on_cli``: whether ``logger.mode`` was set on the command line (decides against ``WANDB_MODE``, see
    :func:`resolve_mode`); None reads it from the running Hydra app (False outside one)."""
    kind = str(cfg.logger.get("kind", "none"))
    if kind == "none":
        return NullLogger()
    if kind == "wandb":
        return _build_wandb(cfg, Path(run_dir), choices, job_type, mode_on_cli)
    from adtbench.errors import ConfigError

    raise ConfigError("logger.kind", f"unknown logger {kind!r}; choose none or wandb")
