"""Tests for adtbench.harness.rundir (file names, the walker, the readers, the plumbing keys) and the write helpers of
adtbench.io that every writer of the package uses (atomic writes, fsync'd line appends)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adtbench.harness.rundir import (
    PLUMBING_KEYS,
    POOLED_KEYS,
    SUMMARY_FILE,
    find_runs,
    is_plumbing,
    lantern_choice,
    merged_sources,
    natural_key,
    read_jsonl,
    read_override_list,
    read_overrides,
    read_run_config,
    read_run_maps,
    read_summary,
    safe_stem,
)
from adtbench.harness.rundir_write import ResultStore
from adtbench.io import append_line_fsync, atomic_write_bytes, atomic_write_json, atomic_write_text, atomic_write_with

# ----------------------------------------------------------------------------------------------------
# adtbench.io: atomic writes and appends
# ----------------------------------------------------------------------------------------------------


def test_atomic_writes_replace_whole_files_and_leave_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "x.json"
    atomic_write_json(p, {"b": 1, "a": [1.5, None]})  # creates the folder
    assert p.read_text() == json.dumps({"b": 1, "a": [1.5, None]}, indent=2) + "\n"
    atomic_write_json(p, {"b": 1, "a": 2}, indent=1, sort_keys=True, newline=False)
    assert p.read_text() == json.dumps({"a": 2, "b": 1}, indent=1)
    atomic_write_text(p, "é\n")
    assert p.read_bytes() == "é\n".encode()
    atomic_write_bytes(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert sorted(x.name for x in p.parent.iterdir()) == ["x.json"]


def test_failed_atomic_write_keeps_the_old_file_and_removes_its_temp(tmp_path: Path) -> None:
    p = tmp_path / "t.npy"
    atomic_write_bytes(p, b"old")

    def half_then_fail(tmp: Path) -> None:
        assert tmp.name == f"t.npy.{os.getpid()}.tmp.npy"  # suffix for writers that want an extension
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write_with(p, half_then_fail, suffix=".npy")
    assert p.read_bytes() == b"old"
    assert [x.name for x in tmp_path.iterdir()] == ["t.npy"]


def test_append_line_fsync_appends_whole_lines_only(tmp_path: Path) -> None:
    p = tmp_path / "log.jsonl"
    append_line_fsync(p, b'{"a": 1}\n')
    append_line_fsync(p, '{"b": "é"}\n')
    assert p.read_text(encoding="utf-8") == '{"a": 1}\n{"b": "é"}\n'
    with pytest.raises(ValueError, match="full line"):
        append_line_fsync(p, b'{"c": 3}')
    assert p.read_text(encoding="utf-8").count("\n") == 2


# ----------------------------------------------------------------------------------------------------
# rundir: names, keys, walker, readers
# ----------------------------------------------------------------------------------------------------


def test_plumbing_keys_reconcile_the_resume_and_table_lists() -> None:
    from adtbench.harness.config import RESUME_IGNORED
    from adtbench.reporting.tables import IGNORED_OVERRIDES

    # resume ignores exactly the plumbing ("hydra" is dropped from the fingerprint separately) ...
    assert set(RESUME_IGNORED) | {"hydra"} == set(PLUMBING_KEYS)
    # ... tables also pool shards and seeds, and never ignore a key a resume would refuse
    assert set(IGNORED_OVERRIDES) == set(PLUMBING_KEYS) | set(POOLED_KEYS)
    assert not set(POOLED_KEYS) & set(RESUME_IGNORED)
    assert is_plumbing("paths.out") and is_plumbing("lantern.cache_dir") and not is_plumbing("lantern.delta")
    assert not is_plumbing("seed") and is_plumbing("seed", pooled=True) and is_plumbing("dataset.shard", pooled=True)
    assert not is_plumbing("policy") and not is_plumbing("threadsx")


def test_safe_stem_is_the_store_image_name(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    for pid in ("parti-0001", "coco-139", "a/b c", "..", "x" * 200):
        assert store.image_path(pid) == tmp_path / "images" / f"{safe_stem(pid)}.png"
    assert safe_stem("parti-0001") == "parti-0001"
    assert safe_stem("a/b") != safe_stem("a_b")  # distinct ids, distinct files


def _run(d: Path, summary: dict, overrides: list[str] | None = None) -> Path:
    d.mkdir(parents=True)
    (d / SUMMARY_FILE).write_text(json.dumps(summary))
    if overrides is not None:
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return d


def test_find_runs_walks_in_natural_order(tmp_path: Path) -> None:
    assert find_runs(tmp_path) == []
    for name in ("10_policy=adt", "9_policy=ar", "2_policy=eagle2"):
        _run(tmp_path / "sweep" / name, {"policy": name})
    _run(tmp_path / "array" / "shard_1", {})
    (tmp_path / "sweep" / "multirun.yaml").write_text("x: 1\n")
    (tmp_path / "array" / "notes").mkdir()
    got = [p.relative_to(tmp_path).as_posix() for p in find_runs(tmp_path)]
    assert got == ["array/shard_1", "sweep/2_policy=eagle2", "sweep/9_policy=ar", "sweep/10_policy=adt"]
    assert find_runs(tmp_path / "array" / "shard_1") == [tmp_path / "array" / "shard_1"]  # a run dir itself
    assert natural_key("a/10_x") > natural_key("a/9_x")


def test_readers(tmp_path: Path) -> None:
    d = _run(tmp_path / "r", {"policy": "adt", "choices": {"lantern": "on"}}, ["policy=adt", "+paths.out=/x"])
    assert read_summary(d)["policy"] == "adt" and lantern_choice(read_summary(d)) == "on"
    assert lantern_choice({"lantern": False}) == "off" and lantern_choice({"lantern": True}) == "on"
    assert read_override_list(d) == ["policy=adt", "+paths.out=/x"]
    assert read_overrides(d) == {"policy": "adt", "paths.out": "/x"}
    assert read_override_list(tmp_path) == [] and read_run_config(d) is None and read_run_maps(d) is None
    (d / "run_config.json").write_text(json.dumps({"dataset": {"shard": "0/2"}}))
    assert read_run_config(d) == {"dataset": {"shard": "0/2"}}
    assert merged_sources(d) == []
    (d / "merge.json").write_text(json.dumps({"sources": [{"dir": "/a/s0"}, {"dir": "/a/s1"}]}))
    assert merged_sources(d) == [Path("/a/s0"), Path("/a/s1")]
    (d / "maps").mkdir()
    (d / "maps" / "run_maps.json").write_text(json.dumps({"n_prompts": 2, "accept": [[1.0, None]]}))
    assert read_run_maps(d) == {"n_prompts": 2, "accept": [[1.0, None]]}


def test_read_jsonl_counts_complete_lines_only_and_never_writes(tmp_path: Path) -> None:
    p = tmp_path / "samples.jsonl"
    assert read_jsonl(p) == []
    raw = b'{"prompt_id": "a"}\n[1]\n{"x": 1}\n{"prompt_id": "b"}\n{"prompt_id": "c"}'
    p.write_bytes(raw)
    assert [r["prompt_id"] for r in read_jsonl(p)] == ["a", "b"]  # "c" has no newline: not committed
    assert p.read_bytes() == raw  # read-only (ResultStore repairs on open; readers never do)


# ----------------------------------------------------------------------------------------------------
# the run-dir lock on a filesystem without flock
# ----------------------------------------------------------------------------------------------------


def _no_flock(err: int):
    def flock(fd, op):
        raise OSError(err, os.strerror(err))

    return flock


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("err", ["ENOLCK", "EOPNOTSUPP", "ENOSYS"])
def test_run_dir_lock_falls_back_to_a_lock_file_without_flock(tmp_path, monkeypatch, err):
    """flock failing as on NFS/Lustre mounts without lock support: the lock becomes an O_EXCL lock file holding
    ``<pid> <host>``; a second writer is refused in one line naming pid, host and the file; release removes it.
    The old code let the OSError escape (a traceback)."""
    import errno
    import fcntl
    import socket

    from adtbench.errors import ConfigError
    from adtbench.harness.lock import OWNER_FILE, RunDirLock

    monkeypatch.delenv("ADTBENCH_RUN_LOCK", raising=False)
    monkeypatch.setattr(fcntl, "flock", _no_flock(getattr(errno, err)))
    run_dir = tmp_path / "run"
    first = RunDirLock(run_dir)
    owner = run_dir / OWNER_FILE
    assert first.kind == "file" and owner.read_text().split() == [str(os.getpid()), socket.gethostname()]
    with pytest.raises(ConfigError) as ei:
        RunDirLock(run_dir)
    msg = str(ei.value)
    assert (
        "\n" not in msg and msg.startswith("hydra.run.dir:") and f"pid {os.getpid()} on {socket.gethostname()}" in msg
    )
    assert str(owner) in msg
    first.release()
    assert not owner.exists()
    RunDirLock(run_dir).release()  # free again


def test_lock_file_stale_detection(tmp_path, monkeypatch):
    """A lock file of a dead process on this host is stale and taken over; one from another host cannot be
    checked: the one-line error says to delete it if that job is gone."""
    import socket

    from adtbench.errors import ConfigError
    from adtbench.harness.lock import OWNER_FILE, RunDirLock

    monkeypatch.setenv("ADTBENCH_RUN_LOCK", "file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    owner = run_dir / OWNER_FILE
    owner.write_text(f"{_dead_pid()} {socket.gethostname()}\n")
    lock = RunDirLock(run_dir)
    assert lock.kind == "file" and owner.read_text().split()[0] == str(os.getpid())
    lock.release()
    owner.write_text("4242 node-17\n")
    with pytest.raises(ConfigError) as ei:
        RunDirLock(run_dir)
    assert "pid 4242 on node-17" in str(ei.value) and f"delete {owner}" in str(ei.value)
    assert owner.read_text() == "4242 node-17\n"  # never removed from here


def test_lock_mode_flock_none_and_bad_values(tmp_path, monkeypatch):
    import errno
    import fcntl

    from adtbench.errors import ConfigError
    from adtbench.harness.lock import OWNER_FILE, RunDirLock

    monkeypatch.setattr(fcntl, "flock", _no_flock(errno.EOPNOTSUPP))
    monkeypatch.setenv("ADTBENCH_RUN_LOCK", "flock")  # flock or nothing: a one-line error naming the way out
    with pytest.raises(ConfigError) as ei:
        RunDirLock(tmp_path / "a")
    assert ei.value.key == "ADTBENCH_RUN_LOCK" and "ADTBENCH_RUN_LOCK=file" in str(ei.value)
    monkeypatch.setenv("ADTBENCH_RUN_LOCK", "none")
    lock = RunDirLock(tmp_path / "b")
    assert lock.kind == "none" and not (tmp_path / "b" / OWNER_FILE).exists()
    lock.release()
    monkeypatch.setenv("ADTBENCH_RUN_LOCK", "nfs")
    with pytest.raises(ConfigError) as ei:
        RunDirLock(tmp_path / "c")
    assert ei.value.key == "ADTBENCH_RUN_LOCK" and "auto, flock, file, none" in str(ei.value)


def test_app_on_a_filesystem_without_flock(tmp_path, monkeypatch):
    """``run.py`` whose flock fails with ENOLCK (``fcntl.flock`` patched, as a mount without lock support would;
    run in this process by ``conftest.run_in_process``, the same entry function): the run completes under the
    lock-file fallback; a run dir held from another host is refused with exit 2 and one line on stderr, before any
    model is loaded."""
    import errno
    import fcntl

    from conftest import TINY_OVERRIDES, run_in_process

    from adtbench.harness.lock import OWNER_FILE

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.delenv("ADTBENCH_RUN_LOCK", raising=False)
    out = tmp_path / "run"
    args = [*TINY_OVERRIDES, "dataset.limit=1", "warmup=0", "progress=false", "maps.per_run=false",
            f"hydra.run.dir={out}"]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    ok = run_in_process(*args, env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (out / "summary.json").exists() and not (out / OWNER_FILE).exists()  # released at the end
    (out / OWNER_FILE).write_text("4242 node-17\n")
    busy = run_in_process(*args, env=env)
    err = busy.stderr.strip().splitlines()
    assert busy.returncode == 2 and len(err) == 1, busy.stderr
    assert "hydra.run.dir" in err[0] and "node-17" in err[0] and "Traceback" not in busy.stderr
