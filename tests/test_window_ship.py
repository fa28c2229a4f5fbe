"""The mini model's ``window: cost`` τ(L) shipped with its weights (``<model.path>/window_taus.json``,
``harness.caches.shipped_taus``): the default run reads it instead of decoding the calibration prompts, it equals a
fresh calibration through the app's own path, and it applies only where the weights and the settings match."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, synthetic_cost_model
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import adtbench.algorithm.jacobi as jacobi
import adtbench.harness.caches as caches
from adtbench.harness.config import register_resolvers, resolve_paths, validate
from adtbench.harness.job import build_models

SHIPPED = ROOT / "adtbench" / "weights" / "mini" / "ar16" / caches.SHIPPED_TAUS


def default_cfg(tmp_path: Path, *overrides: str):
    """The default run's config (model=mini, policy=scd_cost) with its caches in ``tmp_path``; (cfg, checked)."""
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=[f"paths.cache_dir={tmp_path / 'cache'}", *overrides])
    resolve_paths(cfg)
    return cfg, validate(cfg)


def shipped_entry() -> dict[int, float]:
    entries = json.loads(SHIPPED.read_text())["entries"]
    [entry] = [e for e in entries if e["key"]["policy"]["init"] == "up" and e["key"]["policy"]["window_max"] == 32]
    return {int(k): float(v) for k, v in entry["taus"].items()}


def test_default_run_reads_the_shipped_table(tmp_path, monkeypatch):
    """The default run's window comes from the shipped τ(L) with no calibration decode; only the cost model (this
    machine's) is measured, and L is its choice on the shipped τ(L). Nothing is written to the jacobi cache."""

    def no_decodes(*args, **kwargs):
        raise AssertionError("calibration decodes ran although τ(L) ships with the model")

    monkeypatch.setattr(caches, "calibrate_taus", no_decodes)
    cfg, checked = default_cfg(tmp_path)
    assert (str(cfg.policy.name), str(cfg.policy.window)) == ("scd", "cost")
    _, models = build_models(cfg, checked.conf, checked.policy)
    table = models.calibration
    assert table["taus"] == shipped_entry() and models.window == table["L"]
    assert table["L"] in shipped_entry() and list((tmp_path / "cache" / "cost").glob("*.json"))
    assert not (tmp_path / "cache" / "jacobi").exists()


SPOT_CHECK = (8, 32)
"""The L whose τ(L) CI recomputes (two of the shipped eight: ≈ 1/4 of a full calibration's decodes). τ(L) of one L
is independent of the others (``calibrate_window`` reseeds the generator to 0 before every decode and sums over the
same 6 prompts per L), so each recomputed entry must equal the shipped one exactly. The whole table:
``python benchmarks/window_table.py`` (docs/development.md)."""


@pytest.mark.slow
def test_shipped_table_equals_a_fresh_calibration(tmp_path, monkeypatch):
    """The shipped τ(L) is what the calibration decodes measure today for the same settings, for the L of
    ``SPOT_CHECK`` (the app's own path — ``build_models`` → ``load_or_calibrate_window`` → ``calibrate_taus`` — with
    the shipped table hidden and the calibration grid cut to those L): a change to the weights, ``decode_jacobi`` or
    ``calibrate_window`` that moves τ(L) fails here until ``python -m adtbench.tools.ship_window`` is run again (and
    the key's version bumped). The cost model only picks L from τ(L), so a fixed one stands in for this machine's
    measurement; the L not recomputed here are checked by ``benchmarks/window_table.py``."""
    shipped = shipped_entry()
    assert set(SPOT_CHECK) < set(shipped), "the recomputed L are entries of the shipped table"
    monkeypatch.setattr(caches, "shipped_taus", lambda *args: None)
    monkeypatch.setattr(caches, "load_or_measure", lambda *args: synthetic_cost_model())
    monkeypatch.setattr(jacobi, "CALIBRATION_GRID", SPOT_CHECK)
    cfg, checked = default_cfg(tmp_path)
    _, models = build_models(cfg, checked.conf, checked.policy)
    assert list((tmp_path / "cache" / "jacobi").glob("*.json")), "a fresh calibration ran (and was cached)"
    assert models.calibration["taus"] == {L: shipped[L] for L in SPOT_CHECK}


def test_shipped_table_applies_only_to_its_weights_and_settings(tmp_path):
    """The key holds the weights' digest and every calibration setting: the same files elsewhere match; a changed
    weight byte, sampling, policy key, dtype or a drafter-initialised window do not (they calibrate)."""
    from adtbench.models.registry import build_target

    cfg, checked = default_cfg(tmp_path)
    target = build_target(cfg.model)
    _, settings = caches._window_settings(cfg, checked.conf)
    found = caches.shipped_taus(cfg, target, None, settings)
    assert found is not None and found[0] == SHIPPED and found[1] == shipped_entry()
    copy = tmp_path / "ar16"
    shutil.copytree(cfg.model.path, copy)
    cfg.model.path = str(copy)
    assert caches.shipped_taus(cfg, target, None, settings) == (copy / caches.SHIPPED_TAUS, shipped_entry())
    assert caches.shipped_taus(cfg, target, object(), settings) is None  # init=drafter: its weights are not keyed
    for over in ("sampling.temperature=0.9", "policy.calibration_tokens=256", "policy.redraw=independent",
                 "policy.window_max=24", "sampling.cfg_scale=2.0"):  # fmt: skip
        cfg2, checked2 = default_cfg(tmp_path, over)
        assert caches.shipped_taus(cfg2, target, None, caches._window_settings(cfg2, checked2.conf)[1]) is None, over
    data = bytearray((copy / "gpt.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "gpt.safetensors").write_bytes(bytes(data))
    assert caches.shipped_taus(cfg, target, None, settings) is None
    cfg.model.path = str(SHIPPED.parent)
    target64 = build_target(OmegaConf.merge(cfg.model, {"dtype": "float64"}))
    assert caches.shipped_taus(cfg, target64, None, settings) is None
