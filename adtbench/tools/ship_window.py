"""``python -m adtbench.tools.ship_window [overrides]``: calibrate the ``window: cost`` τ(L) of a Jacobi policy afresh
and ship it with the model, as ``<model.path>/window_taus.json`` (``harness.caches.ship_window_taus``).

τ(L) — committed tokens per forward of a fixed window L over the calibration prompts — counts tokens and reads no
clock: the weights, the sampling and the policy set it, and the machine only through its float rounding (a CPU that
rounds a logit otherwise draws another path of samples, so τ(L) moves within its standard error, which the entry
records with each caption's counts). A run whose settings match a shipped entry's key exactly
(``caches.shipped_window_key``: the weights' digest, dtype, device kind, sampling, policy keys, LANTERN, prompts,
grid, calibration version) skips the calibration decodes and only measures this machine's cost model, which picks L.
Run it again after retraining the weights or changing the calibration code (``tests/test_window_ship.py`` fails when
a fresh calibration leaves the shipped table's error; ``benchmarks/window_table.py`` checks every L).
With no overrides it ships the default run's table (model=mini, policy=scd_cost).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Compose the app's config with ``argv``'s overrides, build the target and write its τ(L) entry."""
    import torch
    from hydra import compose, initialize_config_dir

    from adtbench.harness.caches import ship_window_taus
    from adtbench.harness.config import register_resolvers, resolve_paths, validate
    from adtbench.models.registry import build_target
    from adtbench.resources import conf_dir

    overrides = list(sys.argv[1:] if argv is None else argv)
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        cfg = compose("config", overrides=overrides)
    resolve_paths(cfg)
    conf = validate(cfg).conf
    if conf.threads is not None:
        torch.set_num_threads(conf.threads)
    path = ship_window_taus(cfg, conf, build_target(cfg.model))
    print(f"shipped τ(L) → {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
