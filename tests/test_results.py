"""Tests for adtbench.harness.rundir: crash-safe ResultStore, resume/repair, summary statistics, bootstrap CI."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import adtbench.harness.rundir as rundir
import adtbench.harness.rundir_write as rundir_write
from adtbench.harness.rundir_write import ResultStore
from adtbench.harness.stats import bootstrap_ci, summarize

REPO = Path(__file__).parents[1]


def _rec(pid: str, **kw: object) -> dict:
    base = {
        "prompt_id": pid,
        "cycles": 10,
        "committed": 20,
        "drafted_depth_sum": 50,
        "tree_depth_sum": 40,
        "latency_s": 1.0,
        "baseline_latency_s": 2.0,
        "draft_s": 0.2,
        "verify_s": 0.5,
        "target_forwards": 11,
    }
    base.update(kw)
    return base


def _img(seed: int, h: int = 8, w: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _lines(p: Path) -> list[dict]:
    data = p.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [json.loads(x) for x in data.decode().splitlines()]


# ---------------------------------------------------------------------------------------------------------
# ResultStore basics
# ---------------------------------------------------------------------------------------------------------


def test_commit_and_read_back(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "job")
    assert (tmp_path / "job" / "images").is_dir()
    assert store.done_ids() == set() and store.records() == []

    rec = _rec("parti-0000")
    img = _img(0)
    store.commit(rec, {"a": [1, 0, 2]}, img)
    assert "image" not in rec  # caller's dict untouched
    store.commit(_rec("parti-0001", latency_s=np.float32(1.5)), None, None)

    assert store.done_ids() == {"parti-0000", "parti-0001"}
    recs = store.records()
    assert [r["prompt_id"] for r in recs] == ["parti-0000", "parti-0001"]
    assert recs[0]["image"] == "images/parti-0000.png"
    assert recs[1]["image"] is None and recs[1]["latency_s"] == 1.5
    assert store.traces() == [{"prompt_id": "parti-0000", "a": [1, 0, 2]}]
    np.testing.assert_array_equal(np.asarray(Image.open(store.run_dir / recs[0]["image"])), img)

    # Reopen: same state.
    again = ResultStore(tmp_path / "job")
    assert again.done_ids() == store.done_ids()
    assert again.records() == recs


def test_commit_rejects_duplicates_and_bad_input(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.commit(_rec("x"), {"a": []}, _img(1))
    before = (store.samples_path.read_bytes(), store.trace_path.read_bytes())
    with pytest.raises(ValueError, match="already committed"):
        store.commit(_rec("x"), {"a": []}, _img(2))
    with pytest.raises(ValueError, match="already committed"):
        ResultStore(tmp_path).commit(_rec("x"), None, None)  # also after reopen
    with pytest.raises(ValueError, match="prompt_id"):
        store.commit({"latency_s": 1.0}, None, None)
    with pytest.raises(ValueError, match="trace prompt_id"):
        store.commit(_rec("y"), {"prompt_id": "z"}, None)
    with pytest.raises(ValueError, match="uint8"):
        store.commit(_rec("y"), None, np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        store.commit(_rec("y"), None, np.zeros((4, 4, 2), dtype=np.uint8))
    with pytest.raises(TypeError):
        store.commit(_rec("y", extra=object()), None, None)
    # Nothing was written by any failed commit.
    assert (store.samples_path.read_bytes(), store.trace_path.read_bytes()) == before
    assert not store.image_path("y").exists()
    assert store.done_ids() == {"x"}


def test_non_finite_and_numpy_values_are_strict_json(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.commit(_rec("a", extra=float("nan"), arr=np.arange(3), inf=np.float64("inf")), None, None)
    line = store.samples_path.read_text()
    assert "NaN" not in line and "Infinity" not in line
    (r,) = store.records()
    assert r["extra"] is None and r["inf"] is None and r["arr"] == [0, 1, 2]


def test_image_path_sanitising(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    assert store.image_path("coco-139") == tmp_path / "images" / "coco-139.png"
    assert store.image_path("parti-0001").name == "parti-0001.png"
    a, b = store.image_path("a/b c"), store.image_path("a_b_c")
    assert a != b and b.name == "a_b_c.png"
    assert a.parent == tmp_path / "images" and a.name.startswith("a_b_c-")
    for pid in ["..", ".", "../../etc/passwd", "x" * 400, "ünï cødé"]:
        p = store.image_path(pid)
        assert p.parent == tmp_path / "images"
        assert set(p.stem) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        assert p.stem.strip(".")


def test_write_summary_atomic(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    summary = {"z": 1, "a": [1.0, float("nan")], "m": {"k": np.int64(3)}}
    p = store.write_summary(summary)
    assert p == tmp_path / "summary.json"
    text = p.read_text()
    assert list(json.loads(text)) == ["z", "a", "m"]  # key order kept
    assert json.loads(text) == {"z": 1, "a": [1.0, None], "m": {"k": 3}}
    assert text.startswith('{\n  "z": 1')  # indent=2
    assert not list(tmp_path.glob("*.tmp"))
    store.write_summary({"b": 2})
    assert json.loads(p.read_text()) == {"b": 2}


# ---------------------------------------------------------------------------------------------------------
# crash simulation and repair
# ---------------------------------------------------------------------------------------------------------


def test_torn_samples_line_is_truncated(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.commit(_rec("p0"), {"a": [1]}, None)
    store.commit(_rec("p1"), {"a": [2]}, None)
    good = store.samples_path.read_bytes()
    full = json.dumps(_rec("p2")).encode() + b"\n"
    with open(store.samples_path, "ab") as f:
        f.write(full[: len(full) // 2])  # torn write: half a line, no newline

    store2 = ResultStore(tmp_path)
    assert store2.samples_path.read_bytes() == good
    assert store2.done_ids() == {"p0", "p1"}
    store2.commit(_rec("p2"), None, None)
    assert [r["prompt_id"] for r in _lines(store2.samples_path)] == ["p0", "p1", "p2"]


def test_invalid_json_last_line_with_newline_is_dropped(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.commit(_rec("p0"), None, None)
    good = store.samples_path.read_bytes()
    with open(store.samples_path, "ab") as f:
        f.write(b'{"prompt_id": "p1", "cyc\n')
    assert ResultStore(tmp_path).samples_path.read_bytes() == good


def test_trace_orphans_and_torn_trace_dropped(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.commit(_rec("p0"), {"a": [0]}, None)
    good_trace = store.trace_path.read_bytes()
    # Crash after the trace line of p1 and before its samples line, then a torn trace line.
    with open(store.trace_path, "ab") as f:
        f.write(b'{"prompt_id": "p1", "a": [3]}\n{"prompt_id": "p2", "a"')
    store2 = ResultStore(tmp_path)
    assert store2.trace_path.read_bytes() == good_trace
    assert store2.done_ids() == {"p0"}
    store2.commit(_rec("p1"), {"a": [4]}, None)
    assert store2.traces() == [{"prompt_id": "p0", "a": [0]}, {"prompt_id": "p1", "a": [4]}]


def test_corrupt_middle_line_and_duplicates_rewritten(tmp_path: Path) -> None:
    lines = [
        json.dumps(_rec("p0")),
        "garbage",
        json.dumps(_rec("p1")),
        json.dumps(_rec("p0", latency_s=9.0)),  # duplicate id: first one wins
    ]
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    store = ResultStore(tmp_path)
    assert [r["prompt_id"] for r in _lines(store.samples_path)] == ["p0", "p1"]
    assert store.records()[0]["latency_s"] == 1.0
    assert not list(tmp_path.glob("*.tmp"))


def test_crash_between_image_and_samples_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResultStore(tmp_path)
    store.commit(_rec("p0"), {"a": [1]}, _img(0))

    real_append = rundir_write.append_line_fsync

    def crash_on_samples(path: Path, data: bytes) -> None:
        if path.name == "samples.jsonl":
            raise KeyboardInterrupt("killed before the commit marker")
        real_append(path, data)

    monkeypatch.setattr(rundir_write, "append_line_fsync", crash_on_samples)
    with pytest.raises(KeyboardInterrupt):
        store.commit(_rec("p1"), {"a": [2]}, _img(1))
    monkeypatch.setattr(rundir_write, "append_line_fsync", real_append)
    assert store.image_path("p1").exists()  # image and trace line were written ...
    assert len(_lines(store.trace_path)) == 2
    # ... plus a stray temp file from another interrupted image write.
    (store.images_dir / "p9.png.123.tmp").write_bytes(b"partial")

    store2 = ResultStore(tmp_path)  # "rerun"
    assert store2.done_ids() == {"p0"}  # p1 not done
    assert [t["prompt_id"] for t in store2.traces()] == ["p0"]  # orphan trace line dropped
    assert not list(store2.images_dir.glob("*.tmp"))
    new = _img(42)
    store2.commit(_rec("p1"), {"a": [5]}, new)  # overwrites the orphan image
    np.testing.assert_array_equal(np.asarray(Image.open(store2.image_path("p1"))), new)
    assert [r["prompt_id"] for r in store2.records()] == ["p0", "p1"]
    assert [t["a"] for t in store2.traces()] == [[1], [5]]


_KILL_SCRIPT = r"""
import sys, numpy as np
from adtbench.harness.rundir_write import ResultStore
store = ResultStore(sys.argv[1])
i = len(store.done_ids())
print("ready", flush=True)
img = np.zeros((16, 16, 3), dtype=np.uint8)
while True:
    store.commit({"prompt_id": f"p{i:06d}", "pad": "x" * 3000}, {"a": list(range(200))}, img)
    i += 1
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigkill_leaves_consistent_files(tmp_path: Path) -> None:
    """Kill a writer mid-stream (twice: the second resumes the first's files); reopening must give valid,
    duplicate-free files. Each kill waits for a real condition — the writer has committed at least one more
    samples line than the file held when it started (polled, 60 s timeout: any load) — then lands after a short
    jitter (0 and 5 ms), i.e. while the writer is somewhere inside its next commits."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for jitter in (0.0, 0.005):
        before = rundir.count_sample_lines(tmp_path)
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILL_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60.0
        while rundir.count_sample_lines(tmp_path) <= before:
            assert proc.poll() is None, f"the writer died before committing a line (exit {proc.returncode})"
            assert time.monotonic() < deadline, "the writer committed no samples line within 60 s"
            time.sleep(0.002)
        time.sleep(jitter)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL  # killed mid-stream, not ended on its own
        store = ResultStore(tmp_path)
        samples = _lines(store.samples_path)
        ids = [r["prompt_id"] for r in samples]
        assert len(ids) > before and len(ids) == len(set(ids))
        assert ids == sorted(ids)
        traces = _lines(store.trace_path)
        assert [t["prompt_id"] for t in traces] == ids
        assert all(store.image_path(pid).exists() for pid in ids)


# ---------------------------------------------------------------------------------------------------------
# summarize
# ---------------------------------------------------------------------------------------------------------

A = _rec("A", cycles=10, committed=30, drafted_depth_sum=50, tree_depth_sum=40, latency_s=2.0,
         baseline_latency_s=6.0, draft_s=0.5, verify_s=1.0, target_forwards=11)  # fmt: skip
B = _rec("B", cycles=30, committed=60, drafted_depth_sum=150, tree_depth_sum=90, latency_s=4.0,
         baseline_latency_s=8.0, draft_s=1.0, verify_s=2.5, target_forwards=31)  # fmt: skip


def test_summarize_two_prompts_exact() -> None:
    s = summarize([A, B])
    assert s["n_samples"] == 2
    assert s["tau"] == pytest.approx(90 / 40)  # ratio of totals = 2.25
    assert s["tau_per_prompt_mean"] == pytest.approx((3.0 + 2.0) / 2)  # 2.5 != tau
    assert s["d_bar"] == pytest.approx(200 / 40)
    assert s["d_bar_tree"] == pytest.approx(130 / 40)
    assert s["latency_s"] == pytest.approx(3.0)
    assert s["latency_median_s"] == pytest.approx(3.0)
    assert s["latency_std_s"] == pytest.approx(math.sqrt(2))
    assert s["baseline_latency_s"] == pytest.approx(7.0)
    assert s["baseline_latency_median_s"] == pytest.approx(7.0)
    assert s["baseline_latency_std_s"] == pytest.approx(math.sqrt(2))
    assert s["speedup"] == pytest.approx(7.0 / 3.0)  # ratio of means, not mean of ratios (2.5)
    assert s["speedup_aggregation"] == "ratio_of_means"
    assert s["speedup_n"] == 2
    spp = s["speedup_per_prompt"]
    assert spp["mean"] == pytest.approx(2.5)
    assert spp["median"] == pytest.approx(2.5)
    assert spp["std"] == pytest.approx(math.sqrt(0.5))
    assert (spp["min"], spp["max"]) == (pytest.approx(2.0), pytest.approx(3.0))
    assert spp["p10"] == pytest.approx(2.1) and spp["p90"] == pytest.approx(2.9)
    assert s["draft_s_total"] == pytest.approx(1.5)
    assert s["verify_s_total"] == pytest.approx(3.5)
    assert s["draft_frac"] == pytest.approx(1.5 / 6.0)
    assert s["verify_frac"] == pytest.approx(3.5 / 6.0)
    assert s["target_forwards_mean"] == pytest.approx(21.0)
    json.dumps(s, allow_nan=False)  # strict-JSON serialisable


def test_speedup_with_encode_adds_each_sides_prompt_encoding() -> None:
    """The wider timed scope (text encoder / Tar's LM + decode): Σ (B + B_enc) / Σ (L + L_enc)."""
    s = summarize([dict(A, encode_s=1.0, baseline_encode_s=1.5), dict(B, encode_s=2.0, baseline_encode_s=0.5)])
    assert s["encode_s"] == pytest.approx(1.5)
    assert s["speedup_with_encode"] == pytest.approx((6.0 + 1.5 + 8.0 + 0.5) / (2.0 + 1.0 + 4.0 + 2.0))
    assert s["speedup"] == pytest.approx(7.0 / 3.0)  # the decode-only scope is unchanged
    s = summarize([A, B])  # records from before encode timing
    assert s["encode_s"] is None and s["speedup_with_encode"] is None


def test_summarize_partial_and_missing_baseline() -> None:
    C = _rec("C", cycles=20, committed=20, drafted_depth_sum=0, tree_depth_sum=0, latency_s=10.0,
             baseline_latency_s=None)  # fmt: skip
    s = summarize([A, B, C])
    assert s["tau"] == pytest.approx(110 / 60)
    assert s["latency_s"] == pytest.approx(16 / 3)  # all prompts
    assert s["speedup"] == pytest.approx(7.0 / 3.0)  # only the prompts that have a baseline
    assert s["speedup_n"] == 2
    assert s["baseline_latency_s"] == pytest.approx(7.0)

    no_base = [dict(A, baseline_latency_s=None), {k: v for k, v in B.items() if k != "baseline_latency_s"}]
    s = summarize(no_base)
    assert s["speedup"] is None and s["speedup_per_prompt"] is None and s["speedup_n"] == 0
    assert s["baseline_latency_s"] is None and s["baseline_latency_std_s"] is None
    assert s["speedup_aggregation"] == "ratio_of_means"


def test_summarize_single_and_edge_cases() -> None:
    s = summarize([A])
    assert s["latency_std_s"] is None and s["baseline_latency_std_s"] is None
    assert s["speedup_per_prompt"]["std"] is None
    assert s["speedup"] == pytest.approx(3.0)
    s = summarize([dict(A, draft_s=None)])
    assert s["draft_s_total"] is None and s["draft_frac"] is None and s["verify_s_total"] == 1.0
    s = summarize([dict(A, cycles=0, committed=0, drafted_depth_sum=0, tree_depth_sum=0)])
    assert s["tau"] is None and s["d_bar"] is None and s["tau_per_prompt_mean"] is None
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError, match="cycles"):
        summarize([{k: v for k, v in A.items() if k != "cycles"}])
    with pytest.raises(ValueError, match="latency_s"):
        summarize([dict(A, latency_s=0.0)])
    with pytest.raises(ValueError, match="latency_s"):
        summarize([dict(A, latency_s=float("nan"))])
    with pytest.raises(ValueError):
        summarize([dict(A, committed=-1)])


def _jacobi_stats(step: str | None, forwards: int, idle: int | None = None) -> dict:
    """A Jacobi record's ``stats`` with the keys ``algorithm.jacobi`` / ``algorithm.methods.jacobi.step`` write."""
    st = {"window": 16, "init": "up", "redraw": "coupled", "rule": "exact", "window_mean": 4.0, "accept_hist": [1, 2],
          "kept": 1, "coupled": 2, "kept_frac": 0.5, "target_forwards": forwards}  # fmt: skip
    if step is not None:
        st["step"] = step
    if idle is not None:
        st["idle_forwards"] = idle
    return st


def test_jacobi_block_pools_the_step() -> None:
    """``jacobi.step`` / ``step_counts`` / ``idle_forwards``: the per-record step pooled (counts summed, one value
    or ``mixed``), idle forwards summed where counted; records from before the key leave them None / empty."""
    graph = [dict(_rec(f"g{i}"), stats=_jacobi_stats("graph", 3, idle=i % 2)) for i in range(3)]
    jac = summarize(graph)["jacobi"]
    assert (jac["step"], jac["step_counts"], jac["idle_forwards"]) == ("graph", {"graph": 3}, 1)
    assert jac["window_mean"] == 4.0 and jac["accept_hist"] == [3, 6]  # the other pooled counters unchanged
    eager = dict(_rec("e"), stats=_jacobi_stats("eager", 3))
    jac = summarize([*graph, eager])["jacobi"]
    assert (jac["step"], jac["step_counts"], jac["idle_forwards"]) == ("mixed", {"eager": 1, "graph": 3}, 1)
    jac = summarize([eager])["jacobi"]
    assert (jac["step"], jac["step_counts"], jac["idle_forwards"]) == ("eager", {"eager": 1}, None)
    old = dict(_rec("o"), stats=_jacobi_stats(None, 3))  # a record written before stats.step existed
    jac = summarize([old])["jacobi"]
    assert (jac["step"], jac["step_counts"], jac["idle_forwards"]) == (None, {}, None)
    assert summarize([old, eager])["jacobi"]["step"] == "eager"  # what the records that name one ran
    json.dumps(summarize([*graph, eager]), allow_nan=False)


def test_summarize_store_records(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.commit(A, None, None)
    store.commit(B, None, None)
    assert summarize(store.records()) == summarize([A, B])


# ---------------------------------------------------------------------------------------------------------
# bootstrap_ci
# ---------------------------------------------------------------------------------------------------------


def test_bootstrap_ci() -> None:
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert bootstrap_ci([5.0]) == (5.0, 5.0)
    x = np.random.default_rng(1).normal(10.0, 1.0, size=200)
    lo, hi = bootstrap_ci(x, n_boot=500)
    assert lo < x.mean() < hi and hi - lo < 1.0
    assert bootstrap_ci(x, n_boot=500) == (lo, hi)  # deterministic for a seed
    assert bootstrap_ci(x, n_boot=500, seed=1) != (lo, hi)
    lo90, hi90 = bootstrap_ci(x, n_boot=500, alpha=0.1)
    assert lo <= lo90 and hi90 <= hi
    lo_m, hi_m = bootstrap_ci(list(x), stat=np.median, n_boot=200)
    assert lo_m < np.median(x) < hi_m
    # Paired rows: CI of the ratio-of-means speedup.
    pairs = np.c_[np.full(50, 6.0), np.full(50, 2.0)]
    assert bootstrap_ci(pairs, stat=lambda a: a[:, 0].mean() / a[:, 1].mean(), n_boot=50) == (3.0, 3.0)
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0], alpha=1.5)
