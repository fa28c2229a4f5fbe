"""The full check of a shipped ``window: cost`` τ(L) table: every L recalibrated and compared exactly, one process.

``.venv/bin/python benchmarks/window_table.py [overrides]`` composes the app's config with the overrides (none: the
default run's, ``model=mini policy=scd_cost``), finds the entry of ``<model.path>/window_taus.json`` whose key
matches (``harness.caches.shipped_taus``), recalibrates τ(L) for every L of the grid in [``window_min``,
``window_max``] as ``python -m adtbench.tools.ship_window`` does (``caches.calibrate_taus``: the calibration decodes
of the 6 calibration prompts per L, no cache read) and prints one line per L: shipped, fresh, equal. Exit 0 when
every τ(L) equals the shipped one exactly (τ(L) is a ratio of token counts, read from no clock), 1 otherwise (run
``ship_window`` again, bumping the key's version if the calibration code changed), 2 when no entry matches.

CI (``tests/test_window_ship.py``) recomputes a stated subset of the table (``SPOT_CHECK``: two of its eight L)
through the app's own path; this script is the whole table (≈ 35 s of CPU on one thread; 2–3 min wall on the
loaded 2-core machine). Run it after changing the mini weights, ``decode_jacobi`` or ``calibrate_window``
(docs/development.md)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    """Compose, find the shipped entry, recalibrate every L and compare; the exit status as documented above."""
    import torch
    from hydra import compose, initialize_config_dir

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
    path, shipped = found
    t0 = time.perf_counter()
    cost = caches.load_or_measure(target, None, conf.sampling, max(64, params.window_max), 1, None)
    fresh = caches.calibrate_taus(cfg, conf, target, None, params, cost)["taus"]
    print(f"{path}: {len(fresh)} L recalibrated in {time.perf_counter() - t0:.1f} s")
    bad = 0
    for L in sorted(set(shipped) | set(fresh)):
        same = shipped.get(L) == fresh.get(L)
        bad += not same
        print(f"L={L:3d}  shipped {shipped.get(L)!s:>20}  fresh {fresh.get(L)!s:>20}  {'equal' if same else 'DIFFERS'}")
    print("the shipped table equals a fresh calibration" if not bad else f"{bad} τ(L) differ: run ship_window again")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
