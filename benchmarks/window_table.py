"""The full check of a shipped ``window: cost`` τ(L) table: every L recalibrated on this machine, one process.

``.venv/bin/python benchmarks/window_table.py [overrides]`` composes the app's config with the overrides (none: the
default run's, ``model=mini policy=scd_cost``), finds the entry of ``<model.path>/window_taus.json`` whose key
matches (``harness.caches.shipped_taus``), recalibrates τ(L) for every L of the grid in [``window_min``,
``window_max``] as ``python -m adtbench.tools.ship_window`` does (``caches.calibrate_taus``: the calibration decodes
of every calibration caption per L, no cache read) and prints one line per L: shipped τ ± se, fresh τ ± se, z =
(fresh − shipped) / √(se_f² + se_s²) and the paired test's p over the captions
(``jacobi.calibration.calibrations_agree``). Then the L this machine's cost model picks from each table, and whether
each is in the other's ``near`` set (``jacobi.calibration.choose_window``: the L whose rate is within 2 standard
errors of the best). On the machine that shipped the table the two agree bit for bit; elsewhere a CPU that rounds a
float32 logit otherwise draws other paths and τ(L) moves within its error (docs/development.md). Exit 0 when every L
agrees (|z| ≤ ``Z_AGREE``, p ≥ ``P_AGREE``) and each L is in the other's near set, 1 otherwise (run ``ship_window``
again, bumping the key's version if the calibration code changed), 2 when no entry matches. CI
(``tests/test_window_ship.py``) recomputes a stated subset through the app's own path; this is the whole table (≈ 80
s of CPU on one thread)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    """Compose, find the shipped entry, recalibrate every L and compare; the exit status as documented above."""
    import torch
    from hydra import compose, initialize_config_dir

    from adtbench.algorithm.methods.jacobi.calibration import calibrations_agree, choose_window
    from adtbench.harness import caches
    from adtbench.harness.config import register_resolvers, resolve_paths, validate
    from adtbench.models.registry import build_target
    from adtbench.resources import conf_dir

    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        cfg = compose("config", overrides=list(argv))
    resolve_paths(cfg)
    conf = validate(cfg).conf
    if conf.threads is not None:
        torch.set_num_threads(conf.threads)
    target = build_target(cfg.model)
    params, settings = caches._window_settings(cfg, conf)
    found = caches.shipped_taus(cfg, target, None, settings)
    if found is None:
        print(f"no shipped τ(L) entry matches these settings (model.path={cfg.model.get('path')})")
        return 2
    path, shipped, shipped_se, counts = found
    t0 = time.perf_counter()
    cost = caches.load_or_measure(target, None, conf.sampling, max(64, params.window_max), 1, None)
    fresh_out = caches.calibrate_taus(cfg, conf, target, None, params, cost)
    fresh, fresh_se = fresh_out["taus"], fresh_out["tau_se"]
    took = time.perf_counter() - t0
    print(f"{path}: {len(fresh)} L recalibrated on {len(settings['prompts'])} captions in {took:.1f} s")
    bad = 0
    for L in sorted(set(shipped) | set(fresh)):
        if L not in shipped or L not in fresh:
            bad += 1
            print(f"L={L:3d}  in one table only")
            continue
        ok, z, p = calibrations_agree(fresh_out["counts"][L], counts[L])
        bad += not ok
        print(
            f"L={L:3d}  shipped {shipped[L]:.4f} ± {shipped_se.get(L, 0.0):.4f}"
            f"  fresh {fresh[L]:.4f} ± {fresh_se[L]:.4f}  z = {z:+.2f}  paired p = {p:.3g}"
            f"  {'agree' if ok else 'DISAGREE'}"
        )
    mine = choose_window(shipped, cost, params.overhead_steps, shipped_se)
    for name, a, b in (("shipped", mine, fresh_out), ("fresh", fresh_out, mine)):
        inside = a["L"] in b["near"]
        bad += not inside
        print(f"L* from the {name} table: {a['L']} ({'in' if inside else 'NOT in'} the other's near set {b['near']})")
    print("the shipped table agrees with a fresh calibration" if not bad else f"{bad} checks fail: run ship_window")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
