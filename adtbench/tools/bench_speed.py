"""``adtbench bench speed``: the speed table — one app job per setting, each with its own AR baseline.

    adtbench bench speed [bench.rows=[adt_cost,adt_fixed,...]] [bench.prompts=20] [bench.out=DIR]
                         [bench.readme=FILE] [bench.results=DIR] [bench.reuse=true] [any app override, every row]

Every row runs ``adtbench run`` (the app, a fresh process) on the same ``bench.prompts`` held-out prompts of
``dataset=mini`` (or the dataset given), timing the AR baseline in the same job as the method, so each speedup is a
within-job ratio; each prompt is timed ``timing.repeats=2`` times (ABBA) unless the overrides say otherwise —
with one repeat, ``policy=ar`` read 0.97–1.01 across four jobs on our idle 2-core machine — and with the A/A control
``timing.aa=true`` unless the overrides say otherwise: every row's AR baseline is timed against itself in the same
interleaving, and its ``aa_ratio`` with its CI stands beside the speedup (``–`` where not timed, ``!`` where the
interval excludes 1). Rows run one after another; the table names the machine, the threads and the load averages
before and after each job.

Per row, from the job's ``summary.json`` and ``trace.jsonl``: τ, d̄, mean verified nodes per cycle, the speedup
(ratio of total times) with its CI and the median of the per-prompt ratios, and a cost-model account of one
cycle in AR steps: ``verify`` (the target forward over the cycle's nodes, t_verify(n̄)/t_step), ``draft`` (fixed
per-cycle work + drafter levels, from the cost model), ``overhead`` (the measured cycle time minus both). The
``bound`` is τ · t_step / (verify + draft): the speedup this τ would give with zero engine overhead. ``limit``
names the largest of verify − 1 step, draft, overhead (what to cut next); where τ itself is below the cycle's
model cost even at zero overhead, the bound says so.

``bench.reuse=true`` re-renders the table from the jobs already in ``bench.out`` (no decoding). The table goes to
``<out>/speed.md`` and ``<out>/speed.json`` and, with ``bench.readme``, between the
``<!-- speed-table:start -->`` / ``<!-- speed-table:end -->`` markers of that file. ``bench.results=DIR`` also
writes one raw result file per row, ``DIR/<device>/speed/<row>.json`` (``adtbench.tools.results``: per-prompt
latencies, the load, commit, device, torch, prompt ids, date), the files the published tables render from
(``python -m adtbench.tools.render_results``; ``benchmarks/speed.sh`` writes them to ``results/``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from adtbench.errors import ConfigError
from adtbench.io import atomic_write_json, atomic_write_text

ROWS: dict[str, tuple[str, list[str]]] = {
    "ar": ("policy=ar (sanity: must read 1.00)", ["policy=ar"]),
    "static_sampled": (
        "static tree [[0],[1],[0,0]], sampled drafts, T = 1, exact",
        ["policy=static_sampled"],
    ),
    "static_sampled_gated": (
        "static tree [[0],[1],[0,0]], sampled drafts, gated (gate_tokens 2.2), T = 1, exact",
        ["policy=static_sampled", "policy.gate_tokens=2.2"],
    ),
    "chain_sampled": (
        "chain, one sampled draft, T = 1, exact",
        ["policy=chain", "policy.depth=1", "policy.draft_sampling=sample"],
    ),
    "eagle2_fixed": ("eagle2, fixed 59-node tree, T = 1, exact", ["policy=eagle2"]),
    "adt_fixed": ("adt, fixed 58-node tree, T = 1, exact", ["policy=adt", "policy.budget=fixed"]),
    "adt_cost": ("adt + budget: cost, T = 1, exact", ["policy=adt", "policy.budget=cost"]),
    "eagle2_cost": ("eagle2 + budget: cost, T = 1, exact", ["policy=eagle2", "policy.budget=cost"]),
    "adt_cost_sampled": (
        "adt + budget: cost + sampled drafts, T = 1, exact",
        ["policy=adt", "policy.budget=cost", "policy.draft_sampling=sample"],
    ),
    "adt_cost_sampled_gated": (
        "adt + budget: cost + sampled drafts, gated (gate_tokens 3.0), T = 1, exact",
        ["policy=adt", "policy.budget=cost", "policy.draft_sampling=sample", "policy.gate_tokens=3.0"],
    ),
    "adt_cost_lantern": ("adt + budget: cost, T = 1, lantern=on", ["policy=adt", "policy.budget=cost", "lantern=on"]),
    "adt_cost_sampled_lantern": (
        "adt + budget: cost + sampled drafts, T = 1, lantern=on",
        ["policy=adt", "policy.budget=cost", "policy.draft_sampling=sample", "lantern=on"],
    ),
    "adt_cost_sampled_lantern_gated": (
        "adt + budget: cost + sampled drafts, gated (gate_tokens 3.8), T = 1, lantern=on",
        ["policy=adt", "policy.budget=cost", "policy.draft_sampling=sample", "lantern=on", "policy.gate_tokens=3.8"],
    ),
    "chain3_sampled_lantern": (
        "chain of 3 sampled drafts, T = 1, lantern=on",
        ["policy=static_sampled", "policy.tree=[[0],[0,0],[0,0,0]]", "lantern=on"],
    ),
    "mini_lantern": (
        "chain of 3 sampled drafts, T = 1, lantern=on, δ = 0.3 (experiment=mini_lantern)",
        ["experiment=mini_lantern"],
    ),
    "mini_adt_lantern": (
        "adt + budget: cost + sampled drafts, K ≤ 2, T = 1, lantern=on, δ = 0.3 (experiment=mini_adt_lantern)",
        ["experiment=mini_adt_lantern"],
    ),
    "sjd": ("SJD, window 16, random init, T = 1, exact (no drafter)", ["policy=sjd"]),
    "scd_random": ("SCD (coupled redraws), window 16, random init, T = 1, exact", ["policy=scd", "policy.init=random"]),
    "scd": ("SCD, window 16, upper-neighbour init (its default), T = 1, exact (no drafter)", ["policy=scd"]),
    "scd_cost": (
        "SCD, window = cost (calibrated on this machine), T = 1, exact (the default run)",
        ["policy=scd", "policy.window=cost"],
    ),
    "scd_adaptive": (
        "SCD, adaptive window (the runs committed one row up), T = 1, exact",
        ["policy=scd", "policy.window=adaptive"],
    ),
    "gsd": ("GSD (grouped acceptance, the reference's group), window 16, random init, T = 1 (lossy)", ["policy=gsd"]),
    "zipar": ("ZipAR, window 4, T = 1 (lossy, no drafter)", ["policy=zipar"]),
    "mulo": ("MuLo-SD at its defaults, T = 1 (lossy; low-res drafter + learned up-sampler)", ["policy=mulo"]),
    "adt_fixed_greedy": ("adt, fixed 58-node tree, greedy", ["policy=adt", "policy.budget=fixed", "sampling=greedy"]),
    "adt_cost_greedy": ("adt + budget: cost, greedy", ["policy=adt", "policy.budget=cost", "sampling=greedy"]),
    "static_sampled_gated_greedy": (
        "static tree [[0],[1],[0,0]], gated (gate_tokens 2.2), greedy (top-k drafts)",
        ["policy=static_sampled", "policy.gate_tokens=2.2", "sampling=greedy"],
    ),
}
DEFAULT_ROWS = list(ROWS)
DEFAULT_REPEATS = 2  # timing.repeats of every row (ABBA pairs per prompt), unless given
DEFAULT_AA = True  # timing.aa of every row (the A/A control beside each speedup), unless given
START, END = "<!-- speed-table:start -->", "<!-- speed-table:end -->"


def parse(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Split ``bench.*`` options from the app overrides applied to every row."""
    opts: dict[str, Any] = {
        "rows": DEFAULT_ROWS, "prompts": 20, "out": None, "readme": None, "reuse": False, "results": None,
    }  # fmt: skip
    rest = []
    for a in args:
        key, sep, value = a.partition("=")
        if key.startswith("bench.") and sep:
            name = key[len("bench.") :]
            if name not in opts:
                raise ValueError(f"bench.{name}: unknown option; known: {sorted(opts)}")
            if name == "rows":
                rows = [r.strip() for r in value.strip("[]").split(",") if r.strip()]
                unknown = [r for r in rows if r not in ROWS]
                if unknown or not rows:
                    raise ValueError(f"bench.rows: unknown rows {unknown}; choose from {list(ROWS)}")
                opts["rows"] = rows
            elif name == "prompts":
                opts["prompts"] = int(value)
            elif name == "reuse":
                opts["reuse"] = value.lower() in ("1", "true", "yes")
            else:
                opts[name] = value
        else:
            rest.append(a)
    return opts, rest


def run_row(name: str, overrides: list[str], common: list[str], out: Path) -> Path:
    """One app job in a fresh process; returns its run dir."""
    run_dir = out / name
    cmd = [sys.executable, "-m", "adtbench.cli", "run", *overrides, *common, f"hydra.run.dir={run_dir}"]
    print(f"bench speed: {name}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, text=True, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"row {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return run_dir


def row_figures(run_dir: Path, model: Any) -> dict[str, Any]:
    """Figures of one job (module docstring); ``model`` is the machine's ``CostModel``."""
    from adtbench.harness.rundir import read_samples, read_summary, read_traces

    s = read_summary(run_dir)
    traces = read_traces(run_dir)
    records = read_samples(run_dir)
    nodes = np.concatenate([np.asarray(t["nodes"], dtype=float) for t in traces]) if traces else np.zeros(0)
    D = np.concatenate([np.asarray(t["D"], dtype=float) for t in traces]) if traces else np.zeros(0)
    K = np.concatenate([np.asarray(t["K"], dtype=float) for t in traces]) if traces else np.zeros(0)
    gen_tokens = len(records[0]["tokens"]) if records else 1
    step_ms = 1e3 * float(s["baseline_latency_s"]) / gen_tokens  # one AR step, measured in this job
    cycles = max(1, int(s["cycles_total"]))
    cycle_ms = 1e3 * (float(s["latency_total_s"]) - sum(float(r.get("prefill_s") or 0.0) for r in records)) / cycles
    f: dict[str, Any] = {
        "tau": s["tau"],
        "d_bar": s["d_bar"],
        "nodes": float(nodes.mean()) if nodes.size else None,
        "speedup": s["speedup"],
        "speedup_ci": s.get("speedup_ci"),
        "speedup_median": s.get("speedup_median", (s.get("speedup_per_prompt") or {}).get("median")),
        "aa_ratio": s.get("aa_ratio"),  # timing.aa: the row's AR baseline against itself (None: not timed)
        "aa_ratio_ci": s.get("aa_ratio_ci"),
        "aa_warning": s.get("aa_warning"),
        "n": s["n_samples"],
        "step_ms": step_ms,
        "cycle_ms": cycle_ms,
        "greedy_matches_baseline": s.get("greedy_matches_baseline"),
        "load": s.get("load") or {k: s.get(k) for k in ("load_before", "load_after") if k in s},
        "threads": (s.get("env") or {}).get("threads"),
        "gpu": (s.get("env") or {}).get("gpu"),  # the job's CUDA device (a simulated one: "simulated cuda (cpu)")
    }
    if model is not None and nodes.size:
        # model costs in ms, rescaled to this job's measured step (the model's absolute times may drift)
        scale = step_ms / model.step_ms
        verify = scale * float(np.mean(model.t_verify(nodes)))
        levels = np.maximum(D - 1, 0) * np.array([model.t_level(int(k) if k > 0 else 1) for k in K])
        drafts = bool(D.max() > 0)  # policy=ar and the Jacobi loops draft nothing: no fixed drafter work either
        draft = scale * (model.fixed_ms + float(levels.mean())) if drafts else 0.0
        f |= {
            "verify_steps": verify / step_ms,
            "draft_steps": draft / step_ms,
            "overhead_steps": max(0.0, cycle_ms - verify - draft) / step_ms,
            "bound": float(s["tau"]) * step_ms / (verify + draft),
        }
        terms = {"verify": f["verify_steps"] - 1.0, "draft": f["draft_steps"], "overhead": f["overhead_steps"]}
        speculates = drafts or bool(nodes.max() > 1)  # a tree, or a Jacobi chain (no drafter: D = 0)
        f["limit"] = max(terms, key=terms.__getitem__) if speculates else "–"  # AR: nothing to cut
    return f


def aa_cell(f: dict[str, Any]) -> str:
    """A row's A/A cell: ``ratio× [lo, hi]``, `` !`` after it when the interval excludes 1 (``aa_warning``); ``–``
    when the row's job did not time it (``timing.aa=false``, or a job from before the key)."""
    if f.get("aa_ratio") is None:
        return "–"
    ci = f.get("aa_ratio_ci")
    cell = f"{f['aa_ratio']:.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    return cell + (" !" if f.get("aa_warning") else "")


def table(rows: list[tuple[str, dict[str, Any]]], header: str) -> str:
    def num(v: Any, fmt: str) -> str:
        return "–" if v is None else f"{v:{fmt}}"

    lines = [
        header,
        "",
        "| setting | τ | d̄ | nodes | speedup [95 % CI] | A/A [95 % CI] | median | verify | draft | overhead | bound "
        "| limit | load |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for label, f in rows:
        ci = f.get("speedup_ci")
        sp = num(f["speedup"], ".2f") + "×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
        load = f.get("load") or {}
        lo = "/".join(num(load.get(k), ".1f") for k in ("load_before", "load_after") if k in load) or "–"
        lines.append(
            f"| {label} | {num(f['tau'], '.2f')} | {num(f['d_bar'], '.2f')} | {num(f['nodes'], '.1f')} | {sp} | "
            f"{aa_cell(f)} | {num(f['speedup_median'], '.2f')}× | {num(f.get('verify_steps'), '.2f')} | "
            f"{num(f.get('draft_steps'), '.2f')} | {num(f.get('overhead_steps'), '.2f')} | "
            f"{num(f.get('bound'), '.2f')}× | {f.get('limit', '–')} | {lo} |"
        )
    lines += [
        "",
        "verify / draft / overhead: one cycle's cost in AR steps (cost model; overhead = measured cycle − model). "
        "bound: τ · step / (verify + draft), the speedup at zero engine overhead. load: 1-min load average "
        "before/after the timed work. A/A: the row's AR baseline timed against itself in the same interleaving "
        "(timing.aa=true), the speedup's noise floor; – = not timed; ! = its interval excludes 1.",
    ]
    return "\n".join(lines)


def machine_header(
    prompts: int, common: list[str], measured: str | None = None, repeats: int = 1, gpu: str | None = None
) -> str:
    """The table's first line: the machine (``gpu``: the jobs' CUDA device, else this CPU), the protocol, the date."""
    from adtbench.harness.caches import _cpu_name
    from adtbench.resources import cpus_available

    cores = cpus_available()
    import torch

    dev = gpu or f"CPU: {_cpu_name()}, {cores} cores"
    extra = f", overrides: `{' '.join(common)}`" if common else ""
    return (
        f"**{dev}**, torch {torch.__version__}; {prompts} held-out prompts per row, each timed {repeats}× (ABBA); "
        f"one job per row with the AR baseline timed in the same job{extra}; "
        f"measured {measured or time.strftime('%Y-%m-%d')}."
    )


def write_readme(readme: Path, text: str) -> None:
    from adtbench.reporting.tables import write_between_markers

    try:
        write_between_markers(readme, "speed-table", text)
    except ValueError as e:
        raise ConfigError("bench.readme", f"{readme}: {e}") from None


def main(args: list[str]) -> int:
    try:
        opts, rest = parse(args)
    except ValueError as e:
        print(f"adtbench: config error: {e}", file=sys.stderr)
        return 2
    try:
        return _main(opts, rest)
    except ConfigError as e:  # a bad override (composed for the cost model and for every row) names its key
        print(f"adtbench: config error: {e}", file=sys.stderr)
        return 2


def _main(opts: dict[str, Any], rest: list[str]) -> int:
    from adtbench.harness.rundir import summary_time

    common = [f"dataset.limit={opts['prompts']}", "save_images=false", "progress=false", *rest]
    if not any(a.startswith("timing.repeats=") for a in rest):  # job-to-job drift is ±3 % at 1 repeat
        common.insert(0, f"timing.repeats={DEFAULT_REPEATS}")
    if not any(a.startswith("timing.aa=") for a in rest):  # the noise floor beside every speedup
        common.insert(0, f"timing.aa={str(DEFAULT_AA).lower()}")
    if not any(a.startswith("dataset=") for a in rest):
        common.insert(0, "dataset=mini")
    out = Path(opts["out"] or f"outputs/bench_speed/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    out.mkdir(parents=True, exist_ok=True)
    results: list[tuple[str, dict[str, Any]]] = []
    model = machine_cost_model(common)
    measured = None
    for name in opts["rows"]:
        label, overrides = ROWS[name]
        if opts["reuse"]:  # re-render the table from the jobs already in ``out`` (no decoding)
            run_dir = out / name
            written = summary_time(run_dir)
            if written is None:
                print(f"adtbench: config error: bench.reuse: {run_dir} holds no finished job", file=sys.stderr)
                return 2
            measured = time.strftime("%Y-%m-%d", time.localtime(written))
        else:
            run_dir = run_row(name, overrides, common, out)
        results.append((label, {"row": name, **row_figures(run_dir, model)}))
    repeats = int(next(a for a in common if a.startswith("timing.repeats=")).split("=", 1)[1])
    gpu = next((f["gpu"] for _, f in results if f.get("gpu")), None)
    text = table(results, machine_header(opts["prompts"], rest, measured, repeats, gpu))
    atomic_write_text(out / "speed.md", text + "\n")
    atomic_write_json(out / "speed.json", [f for _, f in results], newline=False)
    print(text)
    if opts["readme"]:
        write_readme(Path(opts["readme"]), text)
    if opts["results"]:  # the raw result files the docs' tables render from (tools/results.py)
        write_results(
            Path(opts["results"]),
            out,
            results,
            command=" ".join(["adtbench bench speed", f"bench.prompts={opts['prompts']}", *rest]),
        )
    return 0


def write_results(root: Path, out: Path, results: list[tuple[str, dict[str, Any]]], command: str) -> None:
    """One result file per row under ``root`` (``<device>/speed/<row>.json``), from the row's job in ``out``."""
    from adtbench.tools.results import record_from_run, write_record

    for label, figures in results:
        name = figures["row"]
        row_command = f"{command} bench.rows=[{name}]"
        record = record_from_run(out / name, suite="speed", setting=name, label=label, overrides=ROWS[name][1],
                                 command=row_command, figures=figures)  # fmt: skip
        print(f"bench speed: {write_record(root, record)}", file=sys.stderr)


def machine_cost_model(common: list[str]) -> Any:
    """This machine's cost model for the rows' model (measured once, or read from ``paths.cache_dir``, the cache
    the ``budget: cost`` rows then use), under the rows' thread count."""

    from adtbench.harness.app import CONF_DIR
    from adtbench.harness.caches import load_or_measure
    from adtbench.harness.config import compose_config, resolve_paths, validate
    from adtbench.harness.job import build_models

    cfg = compose_config("config", [*common, "policy=adt"], CONF_DIR)
    resolve_paths(cfg)
    checked = validate(cfg)
    # the app's models in the state the rows run (compiled before bind)
    target, drafter = build_models(cfg, checked.conf, checked.policy)
    paths = checked.conf.paths
    cache = None if paths is None or paths.cache_dir is None else Path(paths.cache_dir)
    return load_or_measure(target, drafter, checked.sp, 64, 16, cache)
