"""``adtbench results``: render the published speed tables from the committed result files, or check them.

    adtbench results [render]     write every table between its markers (README.md, docs/speed.md)
    adtbench results check        exit 1, naming each table, where a table differs from its files or a file is bad
    (also ``python -m adtbench.tools.render_results [render|check] [--root DIR]``)

The source is ``results/<device>/<suite>/<setting>.json`` (``adtbench.tools.results``: written by
``adtbench bench speed bench.results=results`` — ``benchmarks/speed.sh`` — and by ``benchmarks/gpu.sh``'s speed,
jacobi and trees stages under ``$OUT/results``). Tables (:data:`TABLES`):

- ``README.md``, ``results-table``: the landing page's settings (:data:`README_ROWS`), each with its command, whether
  it is lossless, τ and the speedup with its CI on each device measured, and one provenance line per device;
- ``docs/speed.md``, ``speed-table``: the CPU speed table (every ``speed`` row, the cost-model columns);
- ``docs/speed.md``, ``gpu-table``: every GPU device's rows, or the statement that none is committed.

Invariants: a figure printed in a table is a file's figure, formatted; every table names, for each of its figures,
the commit, device, prompt count and date of the file it came from (the provenance lines); a table with no files
says so rather than keeping old figures. Rendering is deterministic: rendering twice changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adtbench.tools.bench_speed import ROWS, table
from adtbench.tools.results import check_record, load_records

#: the settings of the README's results table, in its order (``bench speed`` row names)
README_ROWS = (
    "scd_cost",
    "scd",
    "static_sampled",
    "chain_sampled",
    "adt_fixed",
    "adt_cost",
    "adt_cost_sampled",
    "adt_cost_sampled_gated",
    "adt_cost_sampled_lantern",
    "mini_lantern",
    "mini_adt_lantern",
    "gsd",
    "zipar",
    "ar",
)
#: the README's names for its rows (the speed table's own labels are longer)
README_LABELS = {
    "scd_cost": "**the default**: SCD, window sized to the machine",
    "scd": "SCD: Jacobi decoding, no drafter, L = 16, upper-neighbour drafts",
    "static_sampled": "static tree, 3 sampled drafts (EAGLE drafter)",
    "chain_sampled": "one sampled draft",
    "adt_fixed": "ADT-Tree, fixed 58-node trees",
    "adt_cost": "ADT-Tree, cost-aware trees",
    "adt_cost_sampled": "… with sampled drafts",
    "adt_cost_sampled_gated": "… and draft gating",
    "adt_cost_sampled_lantern": "… with LANTERN, δ = 0.1",
    "mini_lantern": "chain of 3 sampled drafts, LANTERN δ = 0.3",
    "mini_adt_lantern": "ADT-Tree, K ≤ 2, LANTERN δ = 0.3",
    "gsd": "GSD, L = 16, the paper's group",
    "zipar": "ZipAR, window 4",
    "ar": "AR against its own baseline (the timer's sanity check)",
}
NO_GPU = (
    "No GPU job's raw results are committed (`results/` holds no GPU device): there is no current GPU figure. "
    "`benchmarks/gpu.sh speed jacobi trees` writes them under `$OUT/results/`; copy that folder to `results/` and "
    "run `adtbench results`. Earlier GPU figures, without raw data: [CHANGELOG.md](../CHANGELOG.md#gpu-figures-"
    "without-raw-data-history)."
)


def is_cpu(record: dict[str, Any]) -> bool:
    """Whether a result was measured on a CPU (a simulated CUDA device counts as a GPU run: its path is the GPU's)."""
    return record["device"] == "cpu"


def fmt_speedup(figures: dict[str, Any]) -> str:
    """``1.08× [0.98, 1.20]``: the speedup and its 95 % CI, as every table prints it."""
    ci = figures.get("speedup_ci")
    return f"{figures['speedup']:.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def row_order(record: dict[str, Any]) -> tuple[int, str]:
    """Speed rows in ``bench speed``'s order, anything else after them by name."""
    names = list(ROWS)
    setting = record["setting"]
    return (names.index(setting) if record["suite"] == "speed" and setting in ROWS else len(names), setting)


def provenance(records: list[dict[str, Any]]) -> str:
    """One sentence per group of records sharing device, commit, date, prompts and repeats: what names each figure."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        key = (r["device_name"], r["torch"], r["commit"][:7], r["dirty"], r["date"][:10], len(r["prompt_ids"]),
               r["repeats"], r["threads"])  # fmt: skip
        groups.setdefault(key, []).append(r)
    lines = []
    for (device, torch_v, commit, dirty, date, n, repeats, threads), rs in groups.items():
        loads = [x for r in rs for x in (r["load_before"], r["load_after"]) if x is not None]
        load = (
            f"load {min(loads):.1f}–{max(loads):.1f} (1-min average, before/after each job)"
            if loads
            else "load not recorded"
        )
        which = "every row" if len(groups) == 1 else ", ".join(r["setting"] for r in rs)
        warned = sum(bool(r.get("load_warning")) for r in rs)
        if warned:  # the app's own warning: the load exceeded the cores around the timed work
            load += f"; **the load exceeded the cores in {warned} of {len(rs)} jobs: timings unreliable**"
        dirty_mark = " (dirty)" if dirty else ""
        lines.append(
            f"{which}: **{device}**, torch {torch_v}, {threads} thread(s); commit {commit}{dirty_mark}, "
            f"measured {date}; {n} prompts × {repeats} timing(s) each; {load}."
        )
    return "\n".join(f"- {line}" for line in lines)


def speed_table(records: list[dict[str, Any]]) -> str:
    """One device's ``speed`` rows as ``bench speed`` prints them, under their provenance."""
    rows = sorted(records, key=row_order)
    head = (
        "One app job per row, the AR baseline timed in the same job; figures from `results/"
        f"{rows[0]['path'].rsplit('/', 1)[0]}/`:\n{provenance(rows)}"
    )
    return table([(r["label"], r["figures"]) for r in rows], head)


def versus_table(records: list[dict[str, Any]]) -> str:
    """One ``bench versus`` suite's rows (every setting and AR interleaved in one job), under their provenance."""
    rows = sorted(records, key=row_order)
    lines = [
        f"`{rows[0]['suite']}`: every setting and AR interleaved in one job; figures from `results/"
        f"{rows[0]['path'].rsplit('/', 1)[0]}/`:",
        provenance(rows),
        "",
        "| setting | overrides | τ | speedup [95 % CI] | median |",
        "|---|---|---:|---|---:|",
    ]
    for r in rows:
        f = r["figures"]
        lines.append(f"| {r['setting']} | `{' '.join(r['overrides'])}` | {f['tau']:.2f} | {fmt_speedup(f)} | "
                     f"{f['speedup_median']:.2f}× |")  # fmt: skip
    return "\n".join(lines)


def by_device_suite(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Records grouped by (device folder, suite), in path order."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        device, suite, _ = r["path"].split("/")
        out.setdefault((device, suite), []).append(r)
    return out


def render_cpu_speed(records: list[dict[str, Any]]) -> str:
    """docs/speed.md's speed table: every CPU device's ``speed`` rows."""
    groups = [rs for (_, suite), rs in by_device_suite(records).items() if suite == "speed" and is_cpu(rs[0])]
    if not groups:
        return "No CPU result files are committed under `results/`: run `benchmarks/speed.sh`."
    return "\n\n".join(speed_table(rs) for rs in groups)


def render_gpu(records: list[dict[str, Any]]) -> str:
    """docs/speed.md's GPU tables: each GPU device's suites, or the statement that none is committed."""
    groups = [(suite, rs) for (_, suite), rs in by_device_suite(records).items() if not is_cpu(rs[0])]
    if not groups:
        return NO_GPU
    return "\n\n".join(speed_table(rs) if suite == "speed" else versus_table(rs) for suite, rs in groups)


def render_readme(records: list[dict[str, Any]]) -> str:
    """The README's results table: :data:`README_ROWS` with a column per device that measured them."""
    speed = {k: rs for k, rs in by_device_suite(records).items() if k[1] == "speed"}
    devices = sorted(speed, key=lambda k: (not is_cpu(speed[k][0]), k[0]))
    cells = {k: {r["setting"]: r for r in speed[k]} for k in devices}
    shown = [s for s in README_ROWS if any(s in cells[k] for k in devices)]
    if not shown:
        return "No result files are committed under `results/`: run `benchmarks/speed.sh`, then `adtbench results`."
    names = [speed[k][0]["device_name"] for k in devices]
    lines = [
        "| setting | `python run.py …` | lossless | τ | " + " | ".join(f"{n}: speedup [95 % CI]" for n in names) + " |",
        "|---|---|---|---:|" + "---|" * len(devices),
    ]
    for s in shown:
        first = next(cells[k][s] for k in devices if s in cells[k])
        overrides = " ".join(ROWS[s][1])
        command = "*(none)* (`policy=scd_cost`)" if s == "scd_cost" else f"`{overrides}`"
        lossless = {True: "yes", False: "no"}.get(first["lossless"], "–")
        speeds = [fmt_speedup(cells[k][s]["figures"]) if s in cells[k] else "–" for k in devices]
        lines.append(f"| {README_LABELS[s]} | {command} | {lossless} | {first['figures']['tau']:.2f} | "
                     + " | ".join(speeds) + " |")  # fmt: skip
    used = [cells[k][s] for k in devices for s in shown if s in cells[k]]
    lines += ["", provenance(used)]
    if all(is_cpu(speed[k][0]) for k in devices):
        lines += ["", "GPU: no GPU job's raw results are committed, so no GPU figure is current "
                  "([docs/speed.md](docs/speed.md#gpu))."]  # fmt: skip
    return "\n".join(lines)


#: (file relative to the repository root, marker, renderer): every published table
TABLES: tuple[tuple[str, str, Callable[[list[dict[str, Any]]], str]], ...] = (
    ("README.md", "results-table", render_readme),
    ("docs/speed.md", "speed-table", render_cpu_speed),
    ("docs/speed.md", "gpu-table", render_gpu),
)


def between_markers(text: str, marker: str) -> str | None:
    """What lies between ``<!-- marker:start -->\\n`` and ``<!-- marker:end -->`` (None: no such pair)."""
    start, end = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        return None
    return text.split(start, 1)[1].split(end, 1)[0]


def problems(root: Path) -> list[str]:
    """Every bad result file and every table that differs from what its files render (empty: all agree)."""
    records = load_records(root / "results")
    bad = [f"results/{r['path']}: {p}" for r in records for p in check_record(r)]
    if bad:
        return bad
    out = []
    for name, marker, render in TABLES:
        current = between_markers((root / name).read_text(), marker)
        if current is None:
            out.append(f"{name}: no single <!-- {marker}:start/end --> pair")
        elif current.rstrip("\n") != render(records).rstrip("\n"):
            out.append(f"{name} ({marker}): differs from its result files — run `adtbench results`")
    return out


def render(root: Path) -> list[str]:
    """Write every table between its markers; returns the files written. A bad result file stops it (ValueError)."""
    from adtbench.reporting.tables import write_between_markers

    records = load_records(root / "results")
    bad = [f"results/{r['path']}: {p}" for r in records for p in check_record(r)]
    if bad:
        raise ValueError("\n".join(bad))
    for name, marker, fn in TABLES:
        write_between_markers(root / name, marker, fn(records))
    return sorted({name for name, _, _ in TABLES})


def main(args: list[str]) -> int:
    """``[render|check] [--root DIR]`` (module docstring); exit 1 on a disagreement or a bad file."""
    what = args[0] if args and not args[0].startswith("-") else "render"
    rest = args[1:] if args and not args[0].startswith("-") else args
    root = Path(rest[1]) if rest[:1] == ["--root"] and len(rest) == 2 else Path(__file__).resolve().parents[2]
    if what not in ("render", "check") or (rest and rest[:1] != ["--root"]):
        print("usage: adtbench results [render|check] [--root DIR]", file=sys.stderr)
        return 2
    if what == "check":
        found = problems(root)
        print("\n".join(found) or "adtbench results: every table matches its result files")
        return 1 if found else 0
    try:
        print("adtbench results: rendered " + ", ".join(render(root)))
    except ValueError as e:
        print(f"adtbench results: bad result files:\n{e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
