"""The app's command line, checked before Hydra runs it: every job's config composed and checked, nothing written.

``python run.py [flags] [overrides]`` / ``adtbench [run] ...`` call :func:`check_command_line` before handing
``sys.argv`` to ``@hydra.main``. It parses the arguments with Hydra's own parser and composes each job's config
the way Hydra will:

- run mode: the config of the overrides (``hydra.*`` overrides included);
- multirun (``-m``): the sweep's master config, then every job of the basic sweeper's expansion (the cartesian
  product of the sweep overrides and ``hydra.sweeper.params``) through Hydra's ``load_sweep_config`` — the same
  composition the launcher gives each job.

Each job's config (without its ``hydra`` node, as the task function sees it, with ``HydraConfig`` set as
``run_job`` sets it, so ``${hydra:...}`` interpolations resolve) then goes through ``check`` (the app's
``check_config``). Any failure — Hydra's composition errors (an unknown key ``policy.bogus=1``, a missing
group option ``policy=foo``, a malformed value) as well as adtbench's own checks — is a ``ConfigError`` naming
the key (in a multirun also the job: ``(job 1 of 3: policy.total_tokens=500)``); the caller prints it as
``adtbench: config error: <key>: ...`` and exits 2 before any run dir, sweep dir or log exists.

Calls that only show something (``--help``, ``--hydra-help``, ``--cfg``, ``--info``, ``--version``,
``--shell-completion``), ``--experimental-rerun``, ``--config-path`` and other sweepers than the basic one
(whose jobs are not known up front) are left to Hydra unchecked.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from adtbench.errors import ConfigError
from adtbench.harness.config import config_error, register_resolvers

__all__ = ["check_command_line", "job_configs"]

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
SHOW_ONLY = ("help", "hydra_help", "cfg", "info", "shell_completion", "experimental_rerun", "config_path")


def _parse(argv: Sequence[str]) -> Any | None:
    """Hydra's parse of ``argv``; None for a call Hydra itself answers (a show-only flag, or a usage error)."""
    from hydra._internal.utils import get_args_parser

    if any(a in ("--version",) for a in argv):
        return None
    try:
        args = get_args_parser().parse_args(list(argv))
    except SystemExit:  # a usage error: Hydra prints it
        return None
    if any(getattr(args, name, None) for name in SHOW_ONLY):
        return None
    return args


def job_configs(
    overrides: Sequence[str], config_dir: str, config_name: str, multirun: bool, extra_dir: str | None = None
) -> list[tuple[list[str], DictConfig]]:
    """``(job overrides, composed config)`` per job of the command line, composed as Hydra composes them (module
    docstring); a composition error is a ``ConfigError`` naming the override's key (``config.config_error``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_resolvers()
    search_path = create_config_search_path(config_dir)
    if extra_dir is not None:
        search_path.append("command-line", f"file://{extra_dir}")
    overrides = list(overrides)
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(task_name="run", config_search_path=search_path)
    job: list[str] = overrides
    try:
        mode = hydra.get_mode(config_name=config_name, overrides=overrides)  # as hydra._internal.utils._run_app
        if mode is None or (multirun and mode == RunMode.RUN):
            mode = RunMode.MULTIRUN if multirun else RunMode.RUN
            overrides = [*overrides, f"hydra.mode={mode.name}"]
        master = hydra.compose_config(config_name, overrides, run_mode=mode, with_log_configuration=False)
        if mode == RunMode.RUN:
            return [(overrides, master)]
        if str(master.hydra.sweeper.get("_target_")) != BASIC_SWEEPER:
            return [(overrides, master)]  # another sweeper decides its jobs as it goes
        params = [f"{k}={v}" for k, v in (master.hydra.sweeper.get("params") or {}).items()]
        task = OmegaConf.to_container(master.hydra.overrides.task, resolve=False)
        assert isinstance(task, list)
        parsed = OverridesParser.create(config_loader=hydra.config_loader).parse_overrides([*params, *task])
        out = []
        for job in BasicSweeper.split_arguments(parsed, None)[0]:
            out.append((list(job), hydra.config_loader.load_sweep_config(master, list(job))))
        return out
    except (HydraException, OmegaConfBaseException) as e:
        raise config_error(e, job) from None
    finally:
        GlobalHydra.instance().clear()


def check_command_line(
    argv: Sequence[str], config_dir: str, config_name: str, check: Callable[[DictConfig], Any]
) -> int:
    """Compose and ``check`` every job of the command line ``argv`` (module docstring); returns how many jobs were
    checked (0: a call left to Hydra). Raises ``ConfigError`` naming the key, and in a multirun the job."""
    args = _parse(argv)
    if args is None:
        return 0
    jobs = job_configs(
        args.overrides, config_dir, args.config_name or config_name, bool(args.multirun), args.config_dir
    )
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    try:
        for n, (overrides, cfg) in enumerate(jobs):
            _as_the_job_sees_it(cfg, n, bool(args.multirun))
            task_cfg = copy.deepcopy(cfg)
            with open_dict(task_cfg):
                task_cfg.pop("hydra", None)
            try:
                check(task_cfg)
            except ConfigError as e:
                if not args.multirun:
                    raise
                where = f"job {n} of {len(jobs)}: {' '.join(overrides) or 'no overrides'}"
                raise ConfigError(e.key, f"{e.message} ({where})") from None
    finally:
        hydra_config.cfg = before
    return len(jobs)


def _as_the_job_sees_it(cfg: DictConfig, num: int, multirun: bool) -> None:
    """What Hydra's launcher and ``run_job`` set before a task runs: the job number and output dir, and
    ``HydraConfig`` (so ``${hydra:...}`` interpolations in the job's config resolve as they will in the job)."""
    hc = cfg.hydra
    with read_write(hc), open_dict(hc):
        if multirun:
            hc.job.num = num
            hc.job.id = f"precheck_{num}"
        try:
            out = (
                OmegaConf.select(cfg, "hydra.run.dir")
                if not multirun
                else os.path.join(
                    str(OmegaConf.select(cfg, "hydra.sweep.dir")), str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
                )
            )
            hc.runtime.output_dir = os.path.abspath(str(out))
        except OmegaConfBaseException:  # an output dir that cannot resolve yet: the job reports it itself
            pass
    HydraConfig.instance().set_config(cfg)
