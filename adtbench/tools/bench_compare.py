"""``benchmarks/compare.sh BASE [ROWS...]``: every speed-table row, BASE's code against the working tree's.

    benchmarks/compare.sh BASE [ROWS...] [--rounds 2] [--prompts 12] [--offset 4] [--noise 0.03] [--out DIR]
                          [-- app overrides applied to every job]
    benchmarks/compare.sh - --table DIR/compare.json   (a saved comparison's table again)
    python -m adtbench.tools.bench_compare ...   (the same)

The no-regression rule (docs/development.md): before a change to the engine lands, every row of the speed table
(``bench_speed.ROWS``, or the ``ROWS`` named) is compared against the previous commit in alternating jobs. BASE is
a commit (checked out into a temporary ``git worktree``, removed at the end) or the path of a checkout. For each
row the app (``run.py`` of each checkout, a fresh process per job, the same Python) decodes the held-out prompts
with BASE's code and with the working tree's in turn, ABBA across rounds (round r runs BASE first when r is even):
the two sides of a row run back to back, so drift and load bursts hit both alike. Each job times its own AR
baseline (``speedup`` = the job's AR time / method time), so a row's verdict never compares times across jobs.

Prompts: ``--prompts`` held-out mini prompts after the first ``--offset`` (default 12 after the 4 the default run
uses: ``dataset=mini`` read from a copy of its file whose first prompts are commented out, so prompt ids and seeds
are those of ``dataset=mini``). Both sides share one fresh ``paths.cache_dir`` (a cost model is measured once per
measuring method). One cost model serves both sides: before the rows, each side runs one untimed-in-effect job
(``policy=adt``, one prompt, no baseline) that loads or measures its model into that cache, and the working tree's
model is then written into BASE's cache file too (``share_cost_models``), so ``budget: cost`` rows differ by code,
not by two measurements (a cost model measured during a load burst sizes trees differently for the whole
comparison); ``--own-cost-models`` lets each side measure its own, ``--cost-from DIR`` starts from the cost models
of a cache dir (one measured on a quiet machine: a model measured under load sizes every ``budget: cost`` tree of
the comparison to contention's costs).

The table (printed, and ``compare.md`` / ``compare.json`` in ``--out``): per row τ old/new and speedup old/new
(medians over rounds), ``new/old`` (the ratio of the median speedups) with the range of the per-round paired ratios,
the ratio at equal τ (new/old × τ old / τ new: the speedup per committed token, i.e. the cycle's cost alone), each
side's median method and AR latency new/old (which side of the speedup moved: a faster AR baseline lowers an
unchanged method's speedup), the 1-min load averages around the row's jobs, and a verdict: ``SLOWER`` when new/old <
1 − noise, ``faster`` when > 1 + noise, else ``≈``; noise = max(``--noise``, half the spread of the paired ratios).
Where τ differs by more than 0.5 % the verdict reads the ratio at equal τ and says so with τ's shift: at T > 0 two
engines that draw their random numbers differently decode other tokens, and τ on 12 prompts moves with the random
stream (EAGLE-2's fixed tree: 2.68 against 2.40 from the root's draw alone); on a greedy row a τ shift is a change
of the trees themselves. ``compare.json`` is rewritten after every job (a killed comparison keeps what it measured).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from adtbench.io import atomic_write_json, atomic_write_text
from adtbench.tools.bench_speed import ROWS

ROOT = Path(__file__).resolve().parents[2]  # the working tree's checkout
PROMPTS_FILE = Path("adtbench/harness/data/mini_prompts.txt")
SIDES = ("old", "new")
NOISE = 0.03  # the verdict's floor: job-to-job drift of one row at 12 prompts on an idle 2-core machine is ±2-3 %
TAU_EQUAL = 0.005  # τ within ±0.5 %: the same trees and tokens (greedy rows, or the same draws); else compare per τ


def parse(args: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/compare.sh",
        description="Every speed-table row, BASE's code against the working tree's, in alternating jobs.",
    )
    p.add_argument("base", help="a commit (checked out into a temporary git worktree) or the path of a checkout")
    p.add_argument("rows", nargs="*", help=f"speed-table rows (default: all): {', '.join(ROWS)}")
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds per row (the rule: at least 2)")
    p.add_argument("--prompts", type=int, default=12, help="held-out mini prompts per job")
    p.add_argument("--offset", type=int, default=4, help="mini prompts skipped first (the default run's 4)")
    p.add_argument("--noise", type=float, default=NOISE, help="the verdict's floor (relative)")
    p.add_argument("--out", type=Path, default=None, help="output dir (default outputs/compare/<time>)")
    p.add_argument("--own-cost-models", action="store_true", help="each side measures its own cost model")
    p.add_argument("--table", type=Path, default=None, help="only print the table of a saved compare.json again")
    p.add_argument(
        "--cost-from",
        type=Path,
        default=None,
        help="a cache dir (paths.cache_dir, e.g. .cache) whose cost models to start from instead of measuring now",
    )
    argv = list(args)
    overrides: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, overrides = argv[:at], argv[at + 1 :]
    ns = p.parse_args(argv)
    ns.overrides = overrides
    unknown = [r for r in ns.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    if ns.rounds < 1 or ns.prompts < 1 or ns.offset < 0:
        p.error("--rounds and --prompts must be ≥ 1, --offset ≥ 0")
    ns.rows = ns.rows or list(ROWS)
    return ns


def held_out_prompts(source: Path, dest: Path, offset: int, n: int) -> int:
    """Write ``source`` (a text prompt file: one prompt a line, ``#`` comments) to ``dest`` with its first ``offset``
    prompts commented out and nothing after the next ``n``: line numbers — the prompt ids — are kept. Returns the
    prompts written."""
    out, seen = [], 0
    for line in source.read_text().splitlines():
        prompt = bool(line.strip()) and not line.lstrip().startswith("#")
        if prompt:
            seen += 1
            if seen > offset + n:
                break
            if seen <= offset:
                line = f"# (skipped) {line}"
        out.append(line)
    dest.write_text("\n".join(out) + "\n")
    return max(0, min(n, seen - offset))


def job_order(rounds: int) -> list[tuple[int, str]]:
    """(round, side) for one row: ABBA across rounds (old first in even rounds, new first in odd ones)."""
    return [(r, side) for r in range(rounds) for side in (SIDES if r % 2 == 0 else SIDES[::-1])]


@contextlib.contextmanager
def checkout(base: str, scratch: Path, repo: Path = ROOT) -> Iterator[tuple[Path, str]]:
    """(path, description) of BASE's code: a directory as it is, or a commit of ``repo`` checked out (detached) into a
    temporary worktree under ``scratch``, removed on exit."""
    if Path(base).is_dir():
        yield Path(base).resolve(), f"checkout {Path(base).resolve()}"
        return
    sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").strip()
    path = scratch / "base"
    _git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
    try:
        yield path, f"{base} ({sha[:10]})"
    finally:
        _git(repo, "worktree", "remove", "--force", str(path))


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], text=True, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"compare: git {' '.join(args)} failed: {proc.stderr.strip() or 'not a commit'}")
    return proc.stdout


def run_job(code: Path, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """One app job of ``code``'s checkout in a fresh process; returns the figures of its ``summary.json``."""
    env = {k: v for k, v in os.environ.items() if k != "ADTBENCH_ROOT"}  # each side resolves its own checkout
    env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])
    cmd = [sys.executable, str(code / "run.py"), *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=code, env=env, text=True, capture_output=True)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"}
    from adtbench.harness.rundir import read_summary

    s = read_summary(run_dir)
    keys = ("tau", "speedup", "latency_s", "baseline_latency_s", "load_before", "load_after", "n_samples")
    return {k: s.get(k) for k in keys}


PREPARE = ["policy=adt", "dataset.limit=1", "warmup=0", "baseline=false"]  # the largest tree of the default rows


SHAPE_KEYS = (
    "target",
    "hidden",
    "heads",
    "kv_heads",
    "intermediate",
    "params",
    "drafter_layers",
    "gen_tokens",
    "vocab",
    "device",
    "dtype",
    "threads",
    "rows",
)  # a cost key's model and machine (not its method)


def share_cost_models(cache: Path, new_files: set[Path]) -> str:
    """Write the working tree's cost models (``new_files``: what its prepare job loaded or measured) into BASE's cost
    model files of ``cache`` — each into the file of the same model and machine (``SHAPE_KEYS`` of the cache key;
    keys differ by measuring method or engine mode) — and return a line for the table header."""
    files = sorted((cache / "cost").glob("*.json"))
    data = {f: json.loads(f.read_text()) for f in files}

    def shape(d: dict[str, Any]) -> tuple[Any, ...]:
        key = d.get("key") or d["model"].get("meta", {}).get("key") or {}
        return tuple(key.get(k) for k in SHAPE_KEYS)

    mine = [f for f in files if f in new_files]
    used: list[Path] = []
    for f in files:
        if f in new_files:
            continue
        same = [g for g in mine if shape(data[g]) == shape(data[f])]
        if same:
            src = max(same, key=lambda g: max(data[g]["model"]["verify_nodes"]))
            model = data[src]["model"]
            data[f]["model"] = {**model, "meta": {**model.get("meta", {}), "shared_from": src.name}}
            atomic_write_json(f, data[f])
            used.append(src)
    if not used:
        if not files or any(f not in new_files for f in files):
            return "each side its own cost model (none to share)"
        used = files  # BASE's prepare job loaded the working tree's files (the same cache keys): one model already
    metas = [data[g]["model"].get("meta", {}) for g in dict.fromkeys(used)]
    return (
        "one cost model for both sides ("
        + "; ".join(f"measured {m.get('measured_at')} at load {m.get('load')}" for m in metas)
        + ")"
    )


def row_result(name: str, jobs: list[dict[str, Any]], noise: float) -> dict[str, Any]:
    """A row's figures from its jobs (each: round, side and the job's figures)."""
    ok = [j for j in jobs if "error" not in j]
    res: dict[str, Any] = {"row": name, "jobs": jobs}
    for side in SIDES:
        mine = [j for j in ok if j["side"] == side]
        res[f"tau_{side}"] = statistics.median(j["tau"] for j in mine) if mine else None
        res[f"speedup_{side}"] = statistics.median(j["speedup"] for j in mine) if mine else None
    loads = [j[k] for j in ok for k in ("load_before", "load_after") if j.get(k) is not None]
    res["load"] = [min(loads), max(loads)] if loads else None
    rounds = sorted({j["round"] for j in ok})
    paired = []
    for r in rounds:
        by = {j["side"]: j["speedup"] for j in ok if j["round"] == r}
        if len(by) == 2 and by["old"]:
            paired.append(by["new"] / by["old"])
    for key, part in (("latency_s", "method_time"), ("baseline_latency_s", "ar_time")):  # each side's own times
        times = {side: [j[key] for j in ok if j["side"] == side and j.get(key)] for side in SIDES}
        both = all(times.values())
        res[part] = statistics.median(times["new"]) / statistics.median(times["old"]) if both else None
    old, new = res["speedup_old"], res["speedup_new"]
    res["ratio"] = new / old if old and new is not None else None
    res["paired"] = [min(paired), max(paired)] if paired else None
    res["noise"] = max(noise, (max(paired) - min(paired)) / 2) if paired else noise
    t_old, t_new = res["tau_old"], res["tau_new"]
    tau_shift = t_new / t_old - 1 if t_old and t_new else 0.0
    res["tau_shift"] = tau_shift
    # at equal τ: the speedup per committed token of a cycle, speedup / τ (new over old) — the engine's cost alone
    res["ratio_equal_tau"] = res["ratio"] * t_old / t_new if res["ratio"] is not None and t_new else None
    decide = res["ratio"] if abs(tau_shift) <= TAU_EQUAL else res["ratio_equal_tau"]
    errors = [j for j in jobs if "error" in j]
    if errors:
        res["verdict"] = "FAILED (" + ", ".join(sorted({j["side"] for j in errors})) + ")"
    elif decide is None:
        res["verdict"] = "–"
    else:
        res["verdict"] = "SLOWER" if decide < 1 - res["noise"] else "faster" if decide > 1 + res["noise"] else "≈"
        if abs(tau_shift) > TAU_EQUAL:
            res["verdict"] += f" at equal τ (τ {100 * tau_shift:+.1f} %)"
    return res


def table(results: list[dict[str, Any]], header: str) -> str:
    def num(v: Any, fmt: str, unit: str = "") -> str:
        return "–" if v is None else f"{v:{fmt}}{unit}"

    lines = [
        header,
        "",
        "| row | τ old | τ new | speedup old | speedup new | new/old [per round] | at equal τ | noise | method time "
        "new/old | AR time new/old | load | verdict |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        paired = f" [{r['paired'][0]:.3f}, {r['paired'][1]:.3f}]" if r.get("paired") else ""
        load = f"{r['load'][0]:.1f}–{r['load'][1]:.1f}" if r.get("load") else "–"
        lines.append(
            f"| {r['row']} | {num(r['tau_old'], '.3f')} | {num(r['tau_new'], '.3f')} | "
            f"{num(r['speedup_old'], '.3f', '×')} | {num(r['speedup_new'], '.3f', '×')} | "
            f"{num(r['ratio'], '.3f')}{paired} | {num(r.get('ratio_equal_tau'), '.3f')} | ±{r['noise']:.3f} | "
            f"{num(r.get('method_time'), '.3f')} | {num(r.get('ar_time'), '.3f')} | {load} | {r['verdict']} |"
        )
    lines += [
        "",
        "τ and speedup: medians over rounds (each job times its own AR baseline); new/old: ratio of the median "
        "speedups, [the range of the per-round paired ratios]; at equal τ: new/old × τ old / τ new (speedup per "
        "committed token: the cycle's cost alone); noise: max(floor, half that range); load: 1-min load averages "
        "around the row's jobs. The verdict reads new/old, or the ratio at equal τ where τ differs by more than "
        f"{100 * TAU_EQUAL:.1f} % (at T > 0 two engines that draw differently decode other tokens: τ then moves "
        "with the random stream, by up to ±10 % on 12 prompts). Method time and AR time new/old: the ratio of each "
        "side's median latency (across jobs, so the load's drift is in them; they tell which side of the speedup "
        "moved — a faster AR baseline lowers the speedup of an unchanged method).",
    ]
    return "\n".join(lines)


def main(args: list[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if args is None else args)
    if ns.table is not None:  # the saved jobs through today's verdicts and columns
        saved = json.loads(ns.table.read_text())
        print(table([row_result(r["row"], r["jobs"], ns.noise) for r in saved], f"**compare** of {ns.table}"))
        return 0
    out = (ns.out or ROOT / "outputs" / "compare" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "prompts.txt"
    n = held_out_prompts(ROOT / PROMPTS_FILE, prompts, ns.offset, ns.prompts)
    common = [f"dataset.path={prompts}", "save_images=false", "progress=false", f"paths.cache_dir={out / 'cache'}"]
    if ns.cost_from is not None:
        (out / "cache" / "cost").mkdir(parents=True, exist_ok=True)
        for f in sorted((ns.cost_from / "cost").glob("*.json")):
            shutil.copyfile(f, out / "cache" / "cost" / f.name)
    if not any(o.startswith("dataset=") for o in ns.overrides):
        common.insert(0, "dataset=mini")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="adtbench-compare-") as scratch, checkout(ns.base, Path(scratch)) as base:
        code = {"old": base[0], "new": ROOT}
        costs, new_files = "each side its own cost model", set()
        if not ns.own_cost_models:
            for side in ("new", "old"):
                print(f"compare: {side}: the cost model (load {_load()})", file=sys.stderr, flush=True)
                got = run_job(code[side], [*common, *ns.overrides, *PREPARE], out / "prepare" / side)
                if "error" in got:
                    raise SystemExit(f"compare: the {side} side's prepare job failed: {got['error']}")
                if side == "new":
                    new_files = set((out / "cache" / "cost").glob("*.json"))
            costs = share_cost_models(out / "cache", new_files)
        header = (
            f"**compare** old = {base[1]}, new = the working tree ({ROOT}); {n} held-out mini prompts after the "
            f"first {ns.offset}, {ns.rounds} rounds ABBA, one job per side and round"
            + (f", overrides: `{' '.join(ns.overrides)}`" if ns.overrides else "")
            + f"; {costs}; {time.strftime('%Y-%m-%d %H:%M')}, load before {_load()}."
        )
        for name in ns.rows:
            jobs: list[dict[str, Any]] = []
            for r, side in job_order(ns.rounds):
                run_dir = out / name / f"{side}_{r}"
                print(f"compare: {name} round {r} {side} (load {_load()})", file=sys.stderr, flush=True)
                jobs.append(
                    {"round": r, "side": side, **run_job(code[side], [*ROWS[name][1], *common, *ns.overrides], run_dir)}
                )
                atomic_write_json(out / "compare.json", [*results, row_result(name, jobs, ns.noise)], newline=False)
                if not ns.own_cost_models:  # a side that measured again (the cached model was measured busy)
                    share_cost_models(out / "cache", new_files)
            results.append(row_result(name, jobs, ns.noise))
            print(table(results[-1:], "").strip(), file=sys.stderr, flush=True)
    text = table(results, header + f" Load after: {_load()}.")
    atomic_write_text(out / "compare.md", text + "\n")
    print(text)
    print(f"\n→ {out}/compare.md", file=sys.stderr)
    return 1 if any(r["verdict"].startswith("FAILED") for r in results) else 0


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "–"


if __name__ == "__main__":
    sys.exit(main())
