"""One writer per run dir, and no run dir left by a job that was refused.

- :class:`RunDirLock` — an exclusive ``fcntl.flock`` on ``<run_dir>/.adtbench.lock`` for the life of a job; on a
  filesystem without flock (some NFS / Lustre / GPFS mounts: ``ENOLCK``, ``EOPNOTSUPP``, ``ENOSYS``) an
  ``O_EXCL`` lock file ``.adtbench.lock.owner`` holding ``<pid> <host>``, with stale-lock detection.
  ``ADTBENCH_RUN_LOCK`` chooses: ``auto`` (default: flock, else the lock file), ``flock`` (flock or a one-line
  error), ``file`` (the lock file only), ``none`` (no lock: the user guarantees one writer).
- :class:`RunDirGuard` — the Hydra callback (``conf/hydra/default.yaml``) that takes the lock before Hydra writes
  ``.hydra/`` into a run dir, checks that a sweep dir can be created, and remembers which dirs this process
  created (a multirun job's dir: one the sweep dir did not hold when the sweep started).
- :func:`discard_new_run_dir` — remove a run dir this process created once its job was refused (a
  ``ConfigError`` raised after the dir exists, e.g. a model family's loader rejecting its weights), provided no
  prompt was committed there. A dir that existed before the job (a resume, a previous run) is never touched.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from adtbench.errors import ConfigError
from adtbench.harness.rundir import LOCK_FILE, read_samples

__all__ = ["RunDirGuard", "RunDirLock", "discard_new_run_dir", "held_lock", "refuse"]

log = logging.getLogger("adtbench")

LOCK_ENV = "ADTBENCH_RUN_LOCK"
LOCK_MODES = ("auto", "flock", "file", "none")
OWNER_FILE = f"{LOCK_FILE}.owner"  # the O_EXCL lock file of filesystems without flock: "<pid> <host>"
#: errnos of a filesystem that has no (working) flock, as opposed to a lock held by another process
NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL})

_LOCKS: dict[str, RunDirLock] = {}  # run dirs this process holds (absolute path → lock)
_CREATED: dict[str, Path] = {}  # run dirs this process created (absolute path → the highest dir it created)


def _first_missing(path: Path) -> Path | None:
    """The highest ancestor of ``path`` (itself included) that does not exist yet; None when ``path`` exists."""
    if path.exists():
        return None
    top = path
    while not top.parent.exists():
        top = top.parent
    return top


def lock_mode() -> str:
    """``ADTBENCH_RUN_LOCK`` (stripped, lower case; unset or empty → ``auto``); another value is a ConfigError."""
    mode = (os.environ.get(LOCK_ENV) or "").strip().lower() or "auto"
    if mode not in LOCK_MODES:
        raise ConfigError(LOCK_ENV, f"unknown run-dir lock {mode!r}; choose one of {', '.join(LOCK_MODES)}")
    return mode


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0; a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunDirLock:
    """An exclusive lock on ``<run_dir>`` held until :meth:`release` (or process death); ``kind`` says which:
    ``flock`` on ``.adtbench.lock``, ``file`` (``.adtbench.lock.owner``, created with ``O_EXCL``) or ``none``
    (module docstring: ``ADTBENCH_RUN_LOCK``).

    Invariant: at most one adtbench job writes into a run dir. A second writer gets ``ConfigError`` naming the
    dir and the holder's pid (and host, for the lock file). A flock left by a dead process is free again (the
    kernel drops flocks with the process) and is taken over; a lock file whose pid is dead on this host is stale
    and taken over; one held from another host cannot be checked, and the error says to delete it if that job is
    gone. Creating the dir fails with a ``ConfigError`` too (e.g. ``hydra.run.dir`` names a file). A dir the lock
    creates is recorded for :func:`discard_new_run_dir`.
    """

    def __init__(self, run_dir: str | os.PathLike[str], key: str = "hydra.run.dir") -> None:
        self.run_dir = Path(os.path.abspath(run_dir))  # as Hydra names runtime.output_dir
        self.fd: int | None = None
        self.owner: Path | None = None  # the lock file this lock created (kind "file")
        mode = lock_mode()
        created = _first_missing(self.run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            what = "is a file" if self.run_dir.is_file() else f"cannot be created or written ({e.strerror})"
            raise ConfigError(key, f"{self.run_dir} {what}; choose another run dir") from e
        if mode == "none":
            log.warning("%s=none: %s is not locked; make sure no other job writes into it", LOCK_ENV, self.run_dir)
            self.kind = "none"
        elif mode == "file":
            self._lock_file(key)
        else:
            self._flock(key, fall_back=mode == "auto")
        _LOCKS[str(self.run_dir)] = self
        if created is not None:
            _CREATED[str(self.run_dir)] = created

    def _flock(self, key: str, fall_back: bool) -> None:
        try:
            fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(key, f"{self.run_dir} cannot be written ({e.strerror}); choose another run dir") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                key,
                f"{self.run_dir} is in use by another adtbench job (pid {holder}); wait for it or choose another "
                "run dir",
            ) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in NO_FLOCK:
                raise ConfigError(key, f"{self.run_dir}: flock failed ({e.strerror}); set {LOCK_ENV}=file") from e
            if not fall_back:
                raise ConfigError(
                    LOCK_ENV,
                    f"the filesystem of {self.run_dir} has no flock ({e.strerror}); set {LOCK_ENV}=file (a lock "
                    f"file with pid and host) or {LOCK_ENV}=none (no lock)",
                ) from e
            log.warning("no flock on the filesystem of %s (%s): locking with %s", self.run_dir, e.strerror, OWNER_FILE)
            self._lock_file(key)
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd, self.kind = fd, "flock"

    def _lock_file(self, key: str) -> None:
        """Create ``.adtbench.lock.owner`` with ``O_EXCL`` (atomic on local filesystems and NFS v3+), holding
        ``<pid> <host>``; a file left by a dead process of this host is removed and the creation retried once."""
        path = self.run_dir / OWNER_FILE
        me = f"{os.getpid()} {socket.gethostname()}"
        for attempt in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    pid_s, _, host = path.read_text().strip().partition(" ")
                    pid = int(pid_s)
                except (OSError, ValueError):  # vanished or half-written: the holder is there or just left
                    pid, host = -1, "?"
                if attempt == 0 and host == socket.gethostname() and pid > 0 and not _alive(pid):
                    log.warning("removing the stale lock %s of dead process %d", path, pid)
                    path.unlink(missing_ok=True)
                    continue
                raise ConfigError(
                    key,
                    f"{self.run_dir} is in use by another adtbench job (pid {pid} on {host}, lock file {path}); "
                    f"wait for it, or delete {path} if that job is gone",
                ) from None
            except OSError as e:
                raise ConfigError(
                    LOCK_ENV, f"cannot create the lock file {path} ({e.strerror}); set {LOCK_ENV}=none (no lock)"
                ) from e
            os.write(fd, f"{me}\n".encode())
            os.close(fd)
            self.owner, self.kind = path, "file"
            return

    def release(self) -> None:
        """Unlock (idempotent): close the flock (its file stays) or remove our own lock file."""
        _LOCKS.pop(str(self.run_dir), None)
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        if self.owner is not None:
            try:
                if self.owner.read_text().split() == [str(os.getpid()), socket.gethostname()]:
                    self.owner.unlink()
            except OSError:
                pass
            self.owner = None


def held_lock(run_dir: str | os.PathLike[str]) -> RunDirLock | None:
    """The lock this process holds on ``run_dir`` (taken by :class:`RunDirGuard` in run mode), else None."""
    return _LOCKS.get(os.path.abspath(run_dir))


def discard_new_run_dir(run_dir: str | os.PathLike[str]) -> bool:
    """Remove ``run_dir`` if this process created it and no prompt was committed there (then also the parent
    dirs it created, while empty); returns whether it was removed. Anything else is left as it is."""
    key = os.path.abspath(run_dir)
    top = _CREATED.get(key)
    path = Path(key)
    if top is None or not path.is_dir() or read_samples(path):
        return False
    lock = _LOCKS.get(key)
    if lock is not None:
        lock.release()
    shutil.rmtree(path, ignore_errors=True)
    _CREATED.pop(key, None)
    while path != top and path.parent != path:  # empty parents this job created (a sibling job's stay)
        path = path.parent
        try:
            path.rmdir()
        except OSError:
            break
    return not Path(key).exists()


def refuse(e: ConfigError, to_log: bool = True) -> None:
    """The app's one-line config error (stderr, exit 2); ``to_log`` also writes it to the job log."""
    if to_log:
        log.error("config error: %s", e)
    print(f"adtbench: config error: {e}", file=sys.stderr)
    sys.exit(2)


class RunDirGuard(Callback):
    """Hydra callback (``conf/hydra/default.yaml``): lock the run dir before Hydra writes ``.hydra/`` into it and
    release it after the job; check that a sweep dir can be created; record the dirs this process creates.
    Failures are one line, exit 2."""

    def __init__(self) -> None:
        self.lock: RunDirLock | None = None
        self.sweep_dir: Path | None = None
        self.sweep_held: set[str] = set()  # entries of the sweep dir before the sweep started

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.lock = RunDirLock(str(config.hydra.run.dir))
        except ConfigError as e:
            refuse(e, to_log=False)  # logging is not configured yet: stderr only

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        d = Path(os.path.abspath(str(config.hydra.sweep.dir)))
        created = _first_missing(d)
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            what = "is a file" if d.is_file() else f"cannot be created ({e.strerror})"
            refuse(ConfigError("hydra.sweep.dir", f"{d} {what}; choose another sweep dir"), to_log=False)
        self.sweep_dir = d
        self.sweep_held = set() if created is not None else set(os.listdir(d))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A multirun job: Hydra has just created its dir; it is new unless the sweep dir held it already."""
        if self.sweep_dir is None:
            return
        job_dir = Path(os.path.abspath(str(config.hydra.runtime.output_dir)))
        if job_dir.parent == self.sweep_dir and job_dir.name not in self.sweep_held:
            _CREATED[str(job_dir)] = job_dir
