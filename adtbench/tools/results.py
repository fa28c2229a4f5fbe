"""Raw benchmark results, committed under ``results/``: the one source of every published speed figure.

    python -m adtbench.tools.results versus FILE --suite NAME --out DIR   (a ``bench versus`` JSON → result files)

One file per measured setting, ``<root>/<device>/<suite>/<setting>.json`` (``device``: the machine's slug, e.g.
``cpu-amd-epyc-2-cores`` or ``nvidia-h200``; ``suite``: the benchmark that measured it, ``speed`` for
``adtbench bench speed``, a ``gpu.sh`` stage's name for its ``bench versus`` jobs). A rerun of a setting replaces its
file, so a folder holds each setting's latest measurement; what it replaced goes to CHANGELOG.md by hand.

Every file holds (:data:`REQUIRED`): the setting and its overrides, the command that measured it, the commit (and
whether the tree was dirty), the date, the device and its name, torch, the threads, the load averages around the
timed work, the prompt ids, each prompt's latency for the method and for the AR baseline (each the median of
``repeats`` timings), τ and the figures the tables print (``figures``). Invariant: ``figures.speedup`` is the ratio
of total times, ``sum(baseline_latency_s) / sum(latency_s)``, of the file's own per-prompt latencies
(:func:`check_record` enforces it); ``adtbench.tools.render_results`` renders the docs' tables from these files and
fails when a table and its files disagree.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from adtbench.io import atomic_write_json

FORMAT = 1
#: keys every result file holds (a figure names its commit, device, prompt count and date)
REQUIRED = (
    "format",
    "suite",
    "setting",
    "label",
    "overrides",
    "command",
    "commit",
    "dirty",
    "date",
    "device",
    "device_name",
    "torch",
    "threads",
    "load_before",
    "load_after",
    "lossless",
    "prompt_ids",
    "repeats",
    "latency_s",
    "baseline_latency_s",
    "figures",
)
#: the commit to record where the code has no git metadata (a copied tree): stated by whoever ran the job
COMMIT_ENV = "ADTBENCH_RESULTS_COMMIT"
#: the speedup a file states may differ from its latencies' ratio by this much (float rounding only)
RATIO_TOLERANCE = 1e-6


def device_slug(device_name: str) -> str:
    """A folder name for a device: lower case, runs of anything but letters and digits → ``-``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    if not slug:
        raise ValueError(f"device name {device_name!r} gives an empty folder name")
    return slug


def machine_name(device: str, device_name: str | None) -> str:
    """The machine as the tables name it: a CPU by its model and the cores this process may use, a GPU by its name."""
    if device == "cpu":
        from adtbench.harness.caches import _cpu_name
        from adtbench.resources import cpus_available

        return f"CPU: {_cpu_name()}, {cpus_available()} cores"
    return device_name or device


def git_commit(root: Path) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout at ``root``; (None, None) outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head.stdout.strip(), bool(dirty.stdout.strip())


def stated_commit(commit: str | None, dirty: bool | None) -> tuple[str | None, bool | None, str]:
    """(commit, dirty, where the commit came from): the code's own git commit, else — a copy of the tree without git
    metadata, e.g. on a lent GPU machine — the one the caller states in ``$ADTBENCH_RESULTS_COMMIT`` (``gpu.sh``'s
    ``COMMIT``), whose cleanliness is unknown (None)."""
    if commit:
        return commit, dirty, "git"
    stated = os.environ.get(COMMIT_ENV, "").strip()
    return (stated or None), None, f"${COMMIT_ENV} (no git metadata)" if stated else "none"


def iso_date(epoch_s: float) -> str:
    """``epoch_s`` as an ISO 8601 UTC time to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def record_from_run(
    run_dir: Path, *, suite: str, setting: str, label: str, overrides: list[str], command: str,
    figures: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The result file of one finished app job (``run_dir``): its provenance (``run_config.json``), its summary's
    environment and load, and each prompt's latencies (``samples.jsonl``, in prompt order); ``figures`` are the
    table's figures for it (``bench_speed.row_figures``)."""
    from adtbench.harness.rundir import read_provenance, read_samples, read_summary, summary_time

    s = read_summary(run_dir)
    prov = read_provenance(run_dir) or {}
    env = s.get("env") or {}
    samples = read_samples(run_dir)
    written = summary_time(run_dir)
    device = str(prov.get("device") or env.get("device") or "cpu")
    commit, dirty, source = stated_commit(prov.get("commit") or env.get("commit"), prov.get("dirty", env.get("dirty")))
    return {
        "format": FORMAT,
        "suite": suite,
        "setting": setting,
        "label": label,
        "overrides": list(overrides),
        "command": command,
        "commit": commit,
        "dirty": dirty,
        "commit_source": source,
        "date": iso_date(written if written is not None else time.time()),
        "device": device,
        "device_name": machine_name(device, figures.get("gpu") or prov.get("device_name")),
        "torch": prov.get("torch") or env.get("torch"),
        "threads": s.get("threads", env.get("threads")),
        "load_before": s.get("load_before"),
        "load_after": s.get("load_after"),
        "load_warning": s.get("load_warning"),
        "lossless": s.get("lossless"),
        "prompt_ids": [r["prompt_id"] for r in samples],
        "repeats": max(s.get("timing_repeats") or [1]),
        "latency_s": [r["latency_s"] for r in samples],
        "baseline_latency_s": [r["baseline_latency_s"] for r in samples],
        "latency_repeats_s": [r.get("latency_repeats_s") for r in samples],
        "baseline_latency_repeats_s": [r.get("baseline_latency_repeats_s") for r in samples],
        "tau_per_prompt": [r.get("tau") for r in samples],
        "figures": figures,
    }


def records_from_versus(result: dict[str, Any], *, suite: str, command: str, date: str) -> list[dict[str, Any]]:
    """One result file per variant of a ``bench versus`` result (its JSON), each with the job's AR latencies as its
    baseline. The job's provenance is this process's: call it where the job ran, on its checkout (``gpu.sh`` does)."""
    import torch

    if "latencies_s" not in result or "prompt_ids" not in result:
        raise ValueError("the bench versus result holds no per-prompt latencies (latencies_s, prompt_ids)")
    commit, dirty, source = stated_commit(*git_commit(Path(__file__).resolve().parents[2]))
    device = "cpu" if result["device"] == "cpu" else "cuda"
    base = [statistics.median(r) for r in result["latencies_s"]["ar"]]  # the job's own per-prompt median
    out = []
    for row in result["rows"]:
        lat = [statistics.median(r) for r in result["latencies_s"][row["variant"]]]
        out.append({
            "format": FORMAT, "suite": suite, "setting": row["variant"], "label": " ".join(row["overrides"]),
            "overrides": [*result["common"], *row["overrides"]], "command": command, "commit": commit,
            "dirty": dirty, "commit_source": source, "date": date, "device": device,
            "device_name": machine_name(device, result["device"]), "torch": torch.__version__,
            "threads": result["threads"], "load_before": result["load_before"], "load_after": result["load_after"],
            "lossless": row.get("lossless"), "prompt_ids": result["prompt_ids"], "repeats": result["repeats"],
            "latency_s": lat, "baseline_latency_s": base,
            "latency_repeats_s": result["latencies_s"][row["variant"]],
            "baseline_latency_repeats_s": result["latencies_s"]["ar"],
            "figures": {"tau": row["tau"], "speedup": sum(base) / sum(lat), "speedup_ci": row["speedup_ci"],
                        "speedup_median": row["median"], "n": len(lat)},
        })  # fmt: skip
    return out


def result_path(root: Path, record: dict[str, Any]) -> Path:
    """Where ``record`` lives under ``root``: ``<device>/<suite>/<setting>.json``."""
    return Path(root) / device_slug(record["device_name"]) / record["suite"] / f"{record['setting']}.json"


def write_record(root: Path, record: dict[str, Any]) -> Path:
    """Check ``record`` and write it (replacing that setting's earlier file); returns its path."""
    problems = check_record(record)
    if problems:
        raise ValueError(f"result {record.get('setting')!r}: " + "; ".join(problems))
    path = result_path(root, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record, indent=1, ensure_ascii=False)
    return path


def check_record(record: dict[str, Any]) -> list[str]:
    """What is wrong with a result file: a missing key, no commit / device / date / prompts, latencies that do not
    match the prompts, or a stated speedup other than its latencies' ratio of totals (empty: nothing)."""
    problems = [f"no {k}" for k in REQUIRED if k not in record]
    if problems:
        return problems
    for key in ("commit", "device_name", "date", "torch"):
        if not record[key]:
            problems.append(f"{key} is empty")
    n = len(record["prompt_ids"])
    if n == 0:
        problems.append("no prompts")
    if len(record["latency_s"]) != n or len(record["baseline_latency_s"]) != n:
        problems.append(f"{n} prompts but {len(record['latency_s'])} / {len(record['baseline_latency_s'])} latencies")
    elif n:
        ratio = sum(record["baseline_latency_s"]) / sum(record["latency_s"])
        stated = record["figures"].get("speedup")
        if stated is None or abs(stated - ratio) > RATIO_TOLERANCE * max(1.0, ratio):
            problems.append(f"speedup {stated} is not its latencies' ratio of totals {ratio:.6f}")
    return problems


def load_records(root: Path) -> list[dict[str, Any]]:
    """Every result file under ``root`` (sorted by path), each with ``path`` (relative to ``root``) added."""
    root = Path(root)
    out = []
    for path in sorted(root.glob("*/*/*.json")):
        record = json.loads(path.read_text())
        record["path"] = path.relative_to(root).as_posix()
        out.append(record)
    return out


def main(args: list[str]) -> int:
    """``versus FILE --suite NAME --out DIR [--command TEXT]``: a ``bench versus`` JSON to result files."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m adtbench.tools.results", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    v = sub.add_parser("versus", help="a bench versus JSON (bench.out=FILE) to one result file per variant")
    v.add_argument("file", type=Path)
    v.add_argument("--suite", required=True)
    v.add_argument("--out", type=Path, required=True)
    v.add_argument("--command", default=None, help="the command that measured it (default: the suite's name)")
    ns = ap.parse_args(args)
    result = json.loads(ns.file.read_text())
    date = iso_date(ns.file.stat().st_mtime)
    try:
        records = records_from_versus(result, suite=ns.suite, command=ns.command or ns.suite, date=date)
        for record in records:
            print(write_record(ns.out, record))
    except ValueError as e:
        print(f"adtbench results: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
