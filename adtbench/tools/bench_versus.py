"""``adtbench bench versus``: several settings and the AR baseline timed in ONE job, interleaved per prompt.

    adtbench bench versus [common overrides] --variant NAME [overrides] --variant NAME [overrides] ...
                          [bench.prompts=20] [bench.repeats=2] [bench.out=FILE]

``bench speed`` runs one job per row, so two rows compare across jobs (machine drift between jobs moves a row by a
few percent). To decide between settings — a gate or none, one tree or another — this runs them side by side: the
models are built once; for every prompt each setting and the AR baseline decode it with the same seed, in an order
rotated from prompt to prompt and reversed on odd repeats (so no setting always runs first, after the same one, or
on a cooler cache); each timing is the engine's timed scope (``latency_s``: prefill + decode loop), the median of
``bench.repeats`` per prompt.

Variants may differ only in ``policy.*``, ``lantern.*`` and ``engine.graphs.*`` (a ``ConfigError`` names any other
key that differs: a different model, drafter, sampling or dataset would not be a head-to-head). Reported per variant:
τ, the share of gated cycles, the speedup over AR (ratio of total times) with its 95 % bootstrap CI over prompts, the
median of the per-prompt ratios, and the time ratio to the first variant (``vs first``: > 1 = faster than it) with its
CI — the number to decide by. The load average before and after the timed work is printed with the table.

With ``timing.aa=true`` (a common override) the AR baseline is timed a second time as one more side of the rotation,
in a variant's role: ``aa_ratio`` = Σ AR / Σ A/A side with its CI (the speedup's noise floor: 1 up to timing noise)
is printed above the table, flagged when its interval excludes 1 (``aa_warning``); without it the line says the A/A
control was not timed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from adtbench import accel
from adtbench.errors import ConfigError
from adtbench.graph_modes import GRAPH_PARTS
from adtbench.io import atomic_write_json

USAGE = (
    "usage: adtbench bench versus [common overrides] --variant NAME [overrides] --variant NAME [overrides] ... "
    "[bench.prompts=20] [bench.repeats=2] [bench.out=FILE]"
)
FREE_GROUPS = ("policy", "lantern")  # what variants may set differently
FREE_KEYS = tuple(f"engine.graphs.{part}" for part in GRAPH_PARTS)  # the decode's own path: the same models


def parse(args: list[str]) -> tuple[dict[str, Any], list[str], dict[str, list[str]]]:
    """(bench options, common overrides, {variant name: its overrides})."""
    opts: dict[str, Any] = {"prompts": 20, "repeats": 2, "out": None}
    common: list[str] = []
    variants: dict[str, list[str]] = {}
    current: list[str] = common
    it = iter(args)
    for a in it:
        if a == "--variant":
            name = next(it, None)
            if name is None or name.startswith("-") or "=" in name:
                raise ConfigError("--variant", f"needs a name, got {name!r}")
            if name in variants or name in ("ar", "aa"):
                raise ConfigError("--variant", f"duplicate or reserved name {name!r}")
            current = variants[name] = []
            continue
        key, sep, value = a.partition("=")
        if key.startswith("bench.") and sep:
            opt = key[len("bench.") :]
            if opt not in opts:
                raise ConfigError(key, f"unknown option; known: {sorted(f'bench.{k}' for k in opts)}")
            if opt in ("prompts", "repeats"):
                if not value.isdigit() or int(value) < 1:
                    raise ConfigError(key, f"must be a positive integer, got {value!r}")
                opts[opt] = int(value)
            else:
                opts[opt] = value
            continue
        current.append(a)
    if not variants:
        raise ConfigError("--variant", "give at least one: --variant NAME [overrides]")
    return opts, common, variants


def compose_variants(common: list[str], variants: dict[str, list[str]]) -> dict[str, Any]:
    """Each variant's composed, path-resolved config; only ``FREE_GROUPS`` may differ from the first."""
    from adtbench.harness.config import compose_config, config_diff, refuse_reference_in_bench, resolve_paths

    cfgs = {}
    for name, over in variants.items():
        try:
            cfg = compose_config("config", [*common, *over])
        except ConfigError as e:
            raise ConfigError(e.key, f"variant {name!r}: {e.message}") from None
        refuse_reference_in_bench(cfg, "versus")
        resolve_paths(cfg)
        cfgs[name] = cfg
    first_name, first = next(iter(cfgs.items()))
    ref = OmegaConf.to_container(first, resolve=True)
    for name, cfg in cfgs.items():
        bad = [
            k
            for k in config_diff(ref, OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
            if k.split(".")[0] not in FREE_GROUPS and k not in FREE_KEYS
        ]
        if bad:
            raise ConfigError(
                bad[0],
                f"variant {name!r} differs from {first_name!r} here; variants may differ only in "
                f"{', '.join([*(g + '.*' for g in FREE_GROUPS), *FREE_KEYS])}",
            )
    return cfgs


def _ratio(x: np.ndarray) -> float:
    return float(x[:, 0].sum() / x[:, 1].sum())


def run(args: list[str]) -> dict[str, Any]:
    """Compose, build once, time every variant and AR interleaved (module docstring); returns the result dict."""
    from adtbench.harness.config import validate
    from adtbench.harness.data.prompts import load_dataset
    from adtbench.harness.job import Job
    from adtbench.harness.stats import bootstrap_ci
    from adtbench.resources import load_average

    opts, common, variants = parse(args)
    cfgs = compose_variants(common, variants)
    first = next(iter(cfgs.values()))
    built = {name: validate(cfg) for name, cfg in cfgs.items()}  # typed, with its policy: before any model loads
    prompts = load_dataset(first)[: opts["prompts"]]
    head, *rest = variants
    jobs = {head: Job.build(first, built[head])}  # the models once; every variant is a Job over them
    for name in rest:
        jobs[name] = jobs[head].variant(cfgs[name], built[name])
    target = jobs[head].target

    def decode(name: str, i: int) -> Any:
        """The same call ``python run.py`` makes (``Job.decode``): acceptance placement, clamped top-k, compile; the
        A/A side (``aa``) makes the AR baseline's."""
        ar = name in ("ar", "aa")
        return jobs[head if ar else name].decode(prompts[i], not ar)

    aa = bool(first.timing.get("aa", False))
    names = ["ar", *variants, *(["aa"] if aa else [])]
    for name in names:  # warm-up, outside the timed work
        decode(name, 0)
    lat = {n: np.zeros((len(prompts), opts["repeats"])) for n in names}
    committed = {n: 0 for n in names}
    cycles = {n: 0 for n in names}
    gated = {n: 0 for n in names}
    load_before = load_average()
    t0 = time.perf_counter()
    for rep in range(opts["repeats"]):
        for i in range(len(prompts)):
            k = (i + rep) % len(names)
            order = names[k:] + names[:k]
            for name in order[::-1] if rep % 2 else order:
                res = decode(name, i)
                lat[name][i, rep] = res.latency_s
                if rep == 0:
                    committed[name] += res.committed
                    cycles[name] += len(res.cycles)
                    gated[name] += int(res.stats.get("gated_steps", 0))
    wall = time.perf_counter() - t0
    load_after = load_average()
    med = {n: np.median(lat[n], axis=1) for n in names}
    rows = []
    for name in variants:
        pair_ar = np.c_[med["ar"], med[name]]
        pair_first = np.c_[med[names[1]], med[name]]
        rows.append(
            {
                "variant": name,
                "overrides": variants[name],
                "tau": committed[name] / max(1, cycles[name]),
                "gated_share": gated[name] / max(1, cycles[name]),
                "speedup": _ratio(pair_ar),
                "speedup_ci": list(bootstrap_ci(pair_ar, _ratio)),
                "median": float(np.median(med["ar"] / med[name])),
                "vs_first": _ratio(pair_first),
                "vs_first_ci": list(bootstrap_ci(pair_first, _ratio)),
                "mean_latency_s": float(med[name].mean()),
            }
        )
    return {
        **(aa_figures(med["ar"], med["aa"]) if aa else {"aa_ratio": None, "aa_ratio_ci": None, "aa_warning": None}),
        "common": common,
        "prompts": len(prompts),
        "repeats": opts["repeats"],
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "device": accel.device_name(target.device) if accel.is_cuda(target.device) else str(target.device),
        "load_before": load_before,
        "load_after": load_after,
        "wall_s": wall,
        "ar_mean_latency_s": float(med["ar"].mean()),
        # the raw timings (AR and each variant: per prompt, per repeat), for result files (tools/results.py)
        "prompt_ids": [p.prompt_id for p in prompts],
        "latencies_s": {n: lat[n].tolist() for n in names},
        "rows": rows,
        "out": opts["out"],
    }


def aa_figures(ar: np.ndarray, aa: np.ndarray) -> dict[str, Any]:
    """The A/A control of a versus job: ``aa_ratio`` = Σ_j AR_j / Σ_j AA_j over the prompts' median latencies, its 95 %
    bootstrap CI over prompts (as ``speedup_ci``) and ``aa_warning`` (``stats.aa_warning``: set when the interval
    excludes 1)."""
    from adtbench.harness.stats import aa_warning, bootstrap_ci

    pair = np.c_[ar, aa]
    ratio = _ratio(pair)
    lo, hi = bootstrap_ci(pair, _ratio)
    return {"aa_ratio": ratio, "aa_ratio_ci": [lo, hi], "aa_warning": aa_warning(ratio, lo, hi, len(ar))}


def aa_line(r: dict[str, Any]) -> str:
    """The A/A line above the table: the ratio with its CI (and the flag), or that it was not timed."""
    if r.get("aa_ratio") is None:
        return "A/A (AR against itself): not timed (timing.aa=false)"
    lo, hi = r["aa_ratio_ci"]
    few = f" (CI over {r['prompts']} < 5 prompts)" if r["prompts"] < 5 else ""
    flag = " — EXCLUDES 1: the timing favours one side at this level" if r.get("aa_warning") else ""
    return (
        f"A/A (AR against itself, one more side of the rotation): {r['aa_ratio']:.3f}× [{lo:.3f}, {hi:.3f}]{few}{flag}"
    )


def table(r: dict[str, Any]) -> str:
    """Markdown table of a ``run`` result, under the job's line and its A/A line (:func:`aa_line`)."""
    first = r["rows"][0]["variant"]
    lines = [
        f"{r['prompts']} prompts × {r['repeats']} repeats, AR and every variant interleaved in one job; "
        f"{r['threads']} thread(s) on {r['device']} ({r['cpu_count']} CPUs), load {r['load_before']} → "
        f"{r['load_after']}; AR {1e3 * r['ar_mean_latency_s']:.0f} ms per image",
        aa_line(r),
        "",
        f"| variant | overrides | τ | gated | speedup vs AR [95 % CI] | median | vs {first} [95 % CI] |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for x in r["rows"]:
        lo, hi = x["speedup_ci"]
        flo, fhi = x["vs_first_ci"]
        over = " ".join(x["overrides"]) or "–"
        lines.append(
            f"| {x['variant']} | {over} | {x['tau']:.2f} | {100 * x['gated_share']:.0f} % | "
            f"{x['speedup']:.3f}× [{lo:.3f}, {hi:.3f}] | {x['median']:.3f}× | "
            f"{x['vs_first']:.3f}× [{flo:.3f}, {fhi:.3f}] |"
        )
    return "\n".join(lines)


def main(args: list[str]) -> int:
    try:
        r = run(args)
    except ConfigError as e:
        print(f"adtbench: config error: {e}\n{USAGE}", file=sys.stderr)
        return 2
    print(table(r))
    if r["out"]:
        atomic_write_json(Path(str(r["out"])), r)
    return 0
