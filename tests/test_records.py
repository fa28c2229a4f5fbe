"""The run directory's records and its one writer: ``SampleRecord`` / ``Summary`` round-trip through their JSON, the
printed line is the summary's rendering, no module but ``harness/rundir.py`` and ``harness/rundir_write.py`` names a
run-dir file, and a run dir written in an older format (run config without newer nodes, samples without newer fields)
still resumes."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_OVERRIDES
from hydra import compose, initialize_config_dir

import adtbench.harness.app as app
from adtbench.algorithm.records import GenerationResult
from adtbench.harness import rundir, rundir_write
from adtbench.harness.provenance import code_version
from adtbench.harness.records import (
    CONTEXT_FIELDS,
    RESUME_NEW_KEYS,
    SampleRecord,
    Summary,
    migrate_run_config,
    summary_line,
    trace_record,
)

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "adtbench"
QUICK = ["dataset.limit=2", "warmup=0", "progress=false", "maps.per_run=false", "save_images=false"]


def config(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=[*TINY_OVERRIDES, *QUICK, *overrides])


def result(latency: float, tokens: list[int], stats: dict | None = None) -> GenerationResult:
    cycles = [SimpleNamespace(accepted=a, drafted_depth=3, tree_depth=a + 1, root_gen=i, nodes=5, width=2, extra={})
              for i, a in enumerate((2, 0, 1))]  # fmt: skip
    return GenerationResult(tokens, cycles, latency, 0.01, 0.02, 0.03, 4, 9, dict(stats or {}), encode_s=0.005)  # type: ignore[arg-type]


PROMPT = SimpleNamespace(prompt_id="p-1", text="a red cube", meta={"ann_id": 7})


def record(batch: dict | None = None) -> SampleRecord:
    runs = [result(0.5, [1, 2, 3]), result(0.4, [1, 2, 3]), result(0.6, [1, 2, 3])]
    bases = [result(1.0, [1, 2, 3]), result(1.2, [1, 2, 3]), result(0.9, [1, 2, 4])]
    return SampleRecord.build(PROMPT, 11, runs, bases, batch)


def test_sample_record_round_trips_through_json() -> None:
    rec = record({"size": 2, "window": 0, "images": 2, "window_s": 1.0, "baseline_window_s": 2.0})
    doc = json.loads(json.dumps(rec.to_json()))
    assert SampleRecord.from_json(doc) == rec and SampleRecord.from_json(doc).to_json() == doc
    assert rec.latency_s == 0.5 and rec.baseline_latency_s == 1.0 and rec.speedup == 2.0  # medians of the repeats
    assert rec.latency_repeats_s == [0.5, 0.4, 0.6] and rec.committed == 6 and rec.cycles == 3
    assert rec.tokens_match_baseline is True and rec.drafted_depth_sum == 9 and rec.tree_depth_sum == 6
    assert list(doc)[-3:] == ["meta", "batch", "image"] and doc["image"] is None
    assert "tokens" not in rec.slim() and "prompt" not in rec.slim() and rec.slim()["prompt_id"] == "p-1"
    old = {k: v for k, v in doc.items() if k not in ("latency_repeats_s", "encode_s", "batch", "image")}
    assert SampleRecord.from_json({**old, "unknown": 1}).encode_s is None  # an older line: absent fields default


def test_commit_writes_the_record_and_returns_it_with_its_image(tmp_path: Path) -> None:
    store = rundir_write.ResultStore(tmp_path)
    rec = record()
    written = store.commit(rec, trace_record(rec.prompt_id, result(0.5, [1, 2, 3])), None)
    assert isinstance(written, SampleRecord) and written.image is None and written == rec
    (line,) = rundir.read_samples(tmp_path)
    assert SampleRecord.from_json(line) == rec and list(line) == list(rec.to_json())
    (trace,) = rundir.read_traces(tmp_path)
    assert trace["prompt_id"] == "p-1" and trace["a"] == [2, 0, 1] and trace["D"] == [3, 3, 3]


def test_summary_round_trips_through_json_and_renders_the_line() -> None:
    cfg = config()
    recs = [record().slim(), {**record().slim(), "prompt_id": "p-2"}]
    run = {"threads": 1, "cpu_count": 2, "cpus_available": 2, "engine_compile": False, "warmup_s": 0.1,
           "load_before": 9.0, "load_after": 1.0, "load_peak": 9.0, "load_warning": "load 9.00 exceeded"}  # fmt: skip
    s = Summary.build(recs, cfg, {"model": "tiny_llamagen", "policy": "eagle2"}, {"device": "cpu"}, 3, "exact", run)
    doc = json.loads(json.dumps(s.to_json()))
    assert Summary.from_json(doc) == s and list(Summary.from_json(doc).to_json()) == list(doc)
    assert next(iter(doc)) == "n_samples" and doc["n_samples"] == 2 and doc["complete"] is False
    keys = list(doc)
    assert keys.index("timing_scope") < keys.index("threads") < keys.index("load_warning") < keys.index("env")
    assert set(CONTEXT_FIELDS) <= set(doc) and s.stats["speedup"] == 2.0 and s.run["load_peak"] == 9.0
    line = s.line()
    assert line.startswith("adtbench: model=tiny_llamagen policy=eagle2 lantern=off n=2 tau=2.000")
    assert "speedup=2.000x" in line and "LOAD 9.00 > 2 CORES" in line and summary_line(doc) == line
    s.eval = {"kind": "mini", "values": {"mini_agreement": 0.5}}
    doc = json.loads(json.dumps(s.to_json()))
    assert list(doc)[-1] == "eval" and Summary.from_json(doc) == s and " eval=mini mini_agreement=0.5" in s.line()
    empty = Summary.build([], cfg, {}, None, 3)
    assert empty.to_json()["n_samples"] == 0 and Summary.from_json(empty.to_json()) == empty


def test_merged_summary_round_trips_through_json() -> None:
    cfg = config()
    shard = Summary.build([record().slim()], cfg, {"model": "tiny_llamagen"}, {"device": "cpu"}, 1).to_json()
    sources = [{"dir": "a", "shard": "0/2", "n_samples": 1}, {"dir": "b", "shard": "1/2", "n_samples": 1}]
    other = {**shard, "env": {"device": "cuda"}}
    shards = [Summary.from_json(shard), Summary.from_json(other), None]  # None: a shard without a summary
    m = Summary.merged([record().slim(), {**record().slim(), "prompt_id": "p-2"}], shards, sources, False, 2,
                       complete=True)  # fmt: skip
    doc = json.loads(json.dumps(m.to_json()))
    assert Summary.from_json(doc) == m and list(doc)[-3:] == ["envs", "env_consistent", "merged_from"]
    assert doc["env"] is None and doc["env_consistent"] is False and doc["model"] == "tiny_llamagen"
    assert doc["n_prompts"] == 2 and doc["complete"] is True and doc["merged_from"] == sources


def test_old_run_configs_migrate_to_todays_fingerprint() -> None:
    saved = {"model": {"name": "m"}, "engine": {"compile": True}}
    graphs = {"step": "auto", "verify": "auto", "levels": "auto"}
    engine = {"compile": True, "acceptance": "auto", "graphs": graphs}
    assert migrate_run_config(saved) == {**RESUME_NEW_KEYS, "model": {"name": "m"}, "engine": engine}
    # issue 50: engine.verify_step, a Jacobi policy.step and policy.graph_levels moved into engine.graphs
    old = migrate_run_config(
        {"engine": {"compile": True, "verify_step": "eager"}, "policy": {"name": "scd", "step": "graph"}}
    )
    assert old["engine"]["graphs"] == {"step": "graph", "verify": "eager", "levels": "auto"}
    assert old["policy"] == {"name": "scd"} and "verify_step" not in old["engine"]
    old = migrate_run_config({"policy": {"name": "eagle2", "graph_levels": False}})
    assert old["engine"]["graphs"] == {**graphs, "levels": "eager"} and old["policy"] == {"name": "eagle2"}
    # keys of issue 39: timing.reference_baseline (off before), drafter.random (an EAGLE drafter's key; off before)
    old = migrate_run_config({"timing": {"repeats": 2}, "drafter": {"kind": "eagle", "path": None}})
    assert old["timing"] == {"repeats": 2, "reference_baseline": False, "aa": False}  # timing.aa: issue 52, off before
    assert old["drafter"] == {"kind": "eagle", "path": None, "random": False}
    assert migrate_run_config({"drafter": {"kind": "none"}})["drafter"] == {"kind": "none"}


def test_reference_baseline_fields_of_a_record_and_the_summary() -> None:
    """``timing.reference_baseline``: each record holds the reference's median latency, its repeats, ``speedup_ref``
    and whether both AR implementations decoded the same tokens; the summary and the printed line carry
    ``speedup_ref`` with its CI; without a reference every such field is null and the line is unchanged."""
    runs = [result(0.5, [1, 2, 3]), result(0.4, [1, 2, 3]), result(0.6, [1, 2, 3])]
    bases = [result(1.0, [1, 2, 3]), result(1.2, [1, 2, 3]), result(0.9, [1, 2, 3])]
    refs = [result(4.0, [1, 2, 3]), result(5.0, [1, 2, 3]), result(3.0, [1, 2, 3])]
    rec = SampleRecord.build(PROMPT, 11, runs, bases, None, refs)
    assert rec.reference_latency_s == 4.0 and rec.reference_latency_repeats_s == [4.0, 5.0, 3.0]
    assert rec.speedup_ref == 8.0 and rec.speedup == 2.0 and rec.reference_tokens_match_baseline is True
    assert SampleRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    other = SampleRecord.build(PROMPT, 11, runs, bases, None, [result(4.0, [1, 2, 4])] * 3)
    assert other.reference_tokens_match_baseline is False
    plain = record()
    assert plain.reference_latency_s is None and plain.speedup_ref is None
    assert plain.reference_tokens_match_baseline is None and plain.reference_latency_repeats_s is None
    cfg = config()
    run = {"reference_baseline": "model.impl=hf (transformers, eager, attention sdpa)"}
    s = Summary.build([rec.slim(), {**rec.slim(), "prompt_id": "p-2"}], cfg, {}, None, 2, "exact", run)
    doc = json.loads(json.dumps(s.to_json()))
    assert Summary.from_json(doc) == s and doc["reference_baseline"].startswith("model.impl=hf")
    assert doc["speedup_ref"] == 8.0 and doc["speedup_ref_n"] == 2 and doc["reference_over_baseline"] == 4.0
    assert doc["reference_latency_s"] == 4.0 and doc["reference_tokens_match_baseline"] is True
    line = s.line()
    assert "speedup=2.000x" in line and " reference=4.0000s speedup_ref=8.000x [" in line
    without = Summary.build([plain.slim()], cfg, {}, None, 1).to_json()
    assert without["speedup_ref"] is None and "speedup_ref" not in Summary.from_json(without).line()


# ---------------------------------------------------------------------------------------------------------
# the one writer
# ---------------------------------------------------------------------------------------------------------

RUN_DIR_FILES = ("SAMPLES_FILE", "TRACE_FILE", "SUMMARY_FILE", "RUN_CONFIG_FILE", "MERGE_FILE", "EVAL_FILE",
                 "EVAL_SAMPLES_FILE", "TRACKING_FILE", "RUN_MAPS_FILE")  # fmt: skip


def test_only_rundir_names_the_run_dir_files() -> None:
    """Every module but ``harness/rundir.py`` and ``harness/rundir_write.py`` reaches a run dir's files through their
    writers and readers: none uses a file name as a value (``d / "summary.json"``, ``open("samples.jsonl")``, …) or
    rundir's name constants (an import list aside), so none can open one of them for writing. Messages may still name a
    file."""
    names = {getattr(rundir, n) for n in RUN_DIR_FILES}
    offenders = []
    for p in sorted([*PKG.rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]):
        if p in (PKG / "harness" / "rundir.py", PKG / "harness" / "rundir_write.py"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in RUN_DIR_FILES or (isinstance(node, ast.Constant) and node.value in names):
                offenders.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


# ---------------------------------------------------------------------------------------------------------
# resume from a run dir of an older format
# ---------------------------------------------------------------------------------------------------------


def test_resume_of_a_run_dir_written_in_the_old_format(tmp_path: Path) -> None:
    out = tmp_path / "old"
    first = app.run(config("dataset.limit=1"), out, {"model": "tiny_llamagen", "policy": "eagle2"})
    assert first["n_samples"] == 1
    rc = rundir.read_run_config(out)
    (out / "run_config.json").write_text(json.dumps({k: v for k, v in rc.items() if k not in RESUME_NEW_KEYS}))
    new_fields = ("latency_repeats_s", "baseline_latency_repeats_s", "encode_s", "baseline_encode_s", "batch")
    (old,) = rundir.read_samples(out)
    (out / "samples.jsonl").write_text(json.dumps({k: v for k, v in old.items() if k not in new_fields}) + "\n")
    assert rundir.read_provenance(out) is None  # the old format: no provenance either
    s = app.run(config("dataset.limit=2"), out, {"model": "tiny_llamagen", "policy": "eagle2"})
    prov = rundir.read_provenance(out)  # the resume starts the commits list with the unknown writer of sample 1
    assert prov is not None and [c["commit"] for c in prov["commits"]] == [None, code_version()["commit"]]
    assert s["n_samples"] == 2 and s["complete"] and s["n_prompts"] == 2
    recs = rundir.read_samples(out)
    assert [r["prompt_id"] for r in recs] == [old["prompt_id"], recs[1]["prompt_id"]] and "batch" not in recs[0]
    assert list(recs[1]) == list(SampleRecord.from_json(recs[1]).to_json())  # the new line in today's format
    assert s["speedup"] is not None and rundir.read_summary(out) == s


def test_a_run_records_its_provenance_and_a_resume_by_other_code_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``run_config.json`` holds the config and, apart, the provenance (code, torch, device, lossless); the summary
    carries ``lossless``; a resume by another commit decodes on, lists both commits and warns in one line naming
    both shas; a run dir from before the key (no provenance, samples) resumes with an unknown first entry."""
    out = tmp_path / "run"
    first = app.run(config("dataset.limit=1"), out, {"model": "tiny_llamagen", "policy": "eagle2"})
    prov = rundir.read_provenance(out)
    assert prov is not None and "provenance" not in (rundir.read_run_config(out) or {})
    code = code_version()
    assert {k: prov[k] for k in code} == code and prov["torch"] == torch.__version__ and prov["device"] == "cpu"
    assert prov["lossless"] is True and prov["lossless_reason"].startswith("policy=eagle2, drafts verified by exact")
    assert prov["commits"] == [{k: code[k] for k in ("commit", "dirty", "version")}]
    assert first["lossless"] is True and first["lossless_reason"] == prov["lossless_reason"]
    assert first["env"]["commit"] == code["commit"] and "LOSSY" not in summary_line(first)

    doc = json.loads((out / "run_config.json").read_text())  # as if an older commit had written the first sample
    doc["provenance"]["commits"] = [{"commit": "f" * 40, "dirty": False, "version": "0.0.9"}]
    (out / "run_config.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="adtbench"):
        s = app.run(config("dataset.limit=2"), out, {"model": "tiny_llamagen", "policy": "eagle2"})
    assert s["n_samples"] == 2 and s["complete"]
    warned = [r.getMessage() for r in caplog.records if "f" * 40 in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0] and (code["commit"] is None or code["commit"] in warned[0])
    commits = rundir.read_provenance(out)["commits"]  # type: ignore[index]
    assert [c["commit"] for c in commits] == ["f" * 40, code["commit"]]


def test_a_run_saved_before_a_key_moved_groups_with_todays(tmp_path: Path) -> None:
    """``reporting.load``'s config id reads ``run_config.json`` through ``migrate_run_config``: the shard of a run
    saved with ``engine.verify_step`` and one saved with ``engine.graphs.verify`` are one config; another value is
    another."""
    from adtbench.reporting.load import _config_id

    graphs = {"step": "auto", "verify": "eager", "levels": "auto"}
    docs = {
        "old": {"engine": {"compile": True, "verify_step": "eager"}, "dataset": {"shard": "0/2"}},
        "new": {"engine": {"compile": True, "acceptance": "auto", "graphs": graphs}, "dataset": {"shard": "1/2"}},
        "other": {"engine": {"compile": True, "verify_step": "graph"}, "dataset": {"shard": "0/2"}},
    }
    ids = {}
    for name, doc in docs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / rundir.RUN_CONFIG_FILE).write_text(json.dumps({**RESUME_NEW_KEYS, **doc}))
        ids[name] = _config_id(tmp_path / name, SimpleNamespace())  # type: ignore[arg-type]
    assert ids["old"] == ids["new"] != ids["other"]
