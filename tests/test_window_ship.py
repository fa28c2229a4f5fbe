"""The mini model's ``window: cost`` τ(L) shipped with its weights (``<model.path>/window_taus.json``,
``harness.caches.shipped_taus``): the default run reads it instead of decoding the calibration prompts, it equals a
fresh calibration through the app's own path within its stated standard error, and it applies only where the
weights and the settings match."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, synthetic_cost_model
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import adtbench.algorithm.methods.jacobi.calibration as calibration
import adtbench.algorithm.methods.jacobi.captions as captions
import adtbench.algorithm.methods.jacobi.loop as jacobi
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


def shipped_table() -> dict:
    """The shipped entry of the default run's settings (init=up, window_max=32)."""
    entries = json.loads(SHIPPED.read_text())["entries"]
    [entry] = [e for e in entries if e["key"]["policy"]["init"] == "up" and e["key"]["policy"]["window_max"] == 32]
    return entry


def shipped_entry() -> dict[int, float]:
    return {int(k): float(v) for k, v in shipped_table()["taus"].items()}


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
    assert table["taus"] == shipped_entry() and models.window == table["L"] in table["near"]
    assert table["tau_se"] == {int(k): v for k, v in shipped_table()["tau_se"].items()}
    assert table["L"] in shipped_entry() and list((tmp_path / "cache" / "cost").glob("*.json"))
    assert not (tmp_path / "cache" / "jacobi").exists()


def test_the_shipped_counts_are_the_shipped_estimates():
    """The shipped entry keeps its raw data: per L, each calibration caption's (committed, forwards); τ(L) and its
    standard error are ``calibration.ratio_estimate`` of them, over all ``images`` captions (the calibration set of the
    key), and the error is stated: under 10 % of τ(L) at every L (4–8 % on the mini model at 24 images)."""
    entry = shipped_table()
    n = entry["key"]["policy"]["calibration_images"]
    assert entry["images"] == n == len(entry["key"]["prompts"]) and entry["key"]["prompts"] == list(
        captions.CALIBRATION_PROMPTS[:n]
    )
    for L, tau in shipped_entry().items():
        counts = [tuple(c) for c in entry["counts"][str(L)]]
        assert len(counts) == entry["images"]
        assert calibration.ratio_estimate(counts) == pytest.approx((tau, entry["tau_se"][str(L)]), rel=1e-12)
        assert 0 < entry["tau_se"][str(L)] < 0.10 * tau, L


SPOT_CHECK = (8, 32)
"""The L whose τ(L) CI recomputes (two of the shipped eight)."""
SPOT_IMAGES = 12
"""The calibration captions CI decodes for each L of ``SPOT_CHECK``, the first of the shipped 24 (1/8 of a calibration's
decodes; the paired test can still reject at ``calibration.P_AGREE``: 2 / 2¹² < 10⁻³). The whole table on every
caption: ``python benchmarks/window_table.py``."""


@pytest.mark.slow
def test_shipped_table_agrees_with_a_fresh_calibration(tmp_path, monkeypatch):
    """The shipped τ(L) is what the calibration decodes measure today for the same settings, for the L of ``SPOT_CHECK``
    on the first ``SPOT_IMAGES`` captions (the app's own path — ``build_models`` → ``load_or_calibrate_window`` →
    ``calibrate_taus`` — with the shipped table hidden, the grid cut to those L and ``policy.calibration_images`` to
    ``SPOT_IMAGES``; compared with the shipped counts of the same captions). τ(L) is a statistic of sampled decodes:
    on the machine that shipped the table the fresh counts equal the shipped ones exactly, while a CPU that rounds a
    float32 logit otherwise draws other paths (an AMD EPYC and an Intel Xeon do), so the check is statistical: the
    fresh τ(L) lies within the stated error, |τ_fresh − τ_shipped| ≤ ``calibration.Z_AGREE`` · √(se_fresh² +
    se_shipped²), and the per-caption pairs pass the paired sign-flip test (``calibration.calibrations_agree``: p ≥
    ``P_AGREE``: the captions' own spread cancels, so a change that moves every image's τ fails here where the
    standard error alone would hide it). A change to ``decode_jacobi`` or ``calibrate_window`` that moves τ(L) fails
    until ``python -m adtbench.tools.ship_window`` is run again (and the key's version bumped). The cost model only
    picks L from τ(L), so a fixed one stands in for this machine's measurement."""
    entry = shipped_table()
    assert set(SPOT_CHECK) < set(shipped_entry()), "the recomputed L are entries of the shipped table"
    monkeypatch.setattr(caches, "shipped_taus", lambda *args: None)
    monkeypatch.setattr(caches, "load_or_measure", lambda *args: synthetic_cost_model())
    monkeypatch.setattr(calibration, "CALIBRATION_GRID", SPOT_CHECK)
    cfg, checked = default_cfg(tmp_path, f"policy.calibration_images={SPOT_IMAGES}")
    _, models = build_models(cfg, checked.conf, checked.policy)
    assert list((tmp_path / "cache" / "jacobi").glob("*.json")), "a fresh calibration ran (and was cached)"
    fresh = models.calibration
    for L in SPOT_CHECK:
        shipped = [tuple(c) for c in entry["counts"][str(L)][:SPOT_IMAGES]]
        agree, z, p = calibration.calibrations_agree(fresh["counts"][L], shipped)
        assert abs(z) <= calibration.Z_AGREE, (L, z, fresh["counts"][L], shipped)
        assert p >= calibration.P_AGREE, (L, p, fresh["counts"][L], shipped)
        assert agree


def test_the_paired_test_sees_a_shift_the_standard_error_hides():
    """``paired_sign_flip_p`` on made-up counts of 24 images whose τᵢ spread from 1.5 to 4.5 (as the mini's do): equal
    counts give 1; a few images on other paths (differences of both signs) pass; every image's τ moved by −6 % (a
    code change; the unpaired z is < 1 there) fails at ``calibration.P_AGREE``; the permutation is exact for ≤ 16
    differing images."""
    rng = np.random.default_rng(1)
    forwards = rng.integers(60, 130, 24)
    taus = rng.uniform(1.5, 4.5, 24)
    shipped = [(int(t * f), int(f)) for t, f in zip(taus, forwards)]
    assert calibration.paired_sign_flip_p(shipped, shipped) == 1.0
    other = list(shipped)
    for i, delta in ((0, 0.4), (5, -0.3), (9, 0.2), (17, -0.5)):
        other[i] = (int((taus[i] + delta) * forwards[i]), int(forwards[i]))
    assert calibration.paired_sign_flip_p(other, shipped) > 0.3
    moved = [(int(0.94 * t * f + rng.normal(0, 3)), int(f)) for t, f in zip(taus, forwards)]
    t_s, se_s = calibration.ratio_estimate(shipped)
    t_m, se_m = calibration.ratio_estimate(moved)
    assert abs(t_m - t_s) / math.hypot(se_s, se_m) < 1.0
    assert calibration.paired_sign_flip_p(moved, shipped) < calibration.P_AGREE
    assert calibration.paired_sign_flip_p(moved[:12], shipped[:12]) == pytest.approx(2 / 2**12)


def test_shipped_table_applies_only_to_its_weights_and_settings(tmp_path):
    """The key holds the weights' digest and every calibration setting: the same files elsewhere match; a changed
    weight byte, sampling, policy key, dtype or a drafter-initialised window do not (they calibrate)."""
    from adtbench.models.registry import build_target

    cfg, checked = default_cfg(tmp_path)
    target = build_target(cfg.model)
    _, settings = caches._window_settings(cfg, checked.conf)
    found = caches.shipped_taus(cfg, target, None, settings)
    assert found is not None and found[0] == SHIPPED and found[1] == shipped_entry()
    assert found.tau_se == {int(k): v for k, v in shipped_table()["tau_se"].items()}
    assert found.counts == {int(L): [tuple(c) for c in rows] for L, rows in shipped_table()["counts"].items()}
    copy = tmp_path / "ar16"
    shutil.copytree(cfg.model.path, copy)
    cfg.model.path = str(copy)
    assert caches.shipped_taus(cfg, target, None, settings)[:2] == (copy / caches.SHIPPED_TAUS, shipped_entry())
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


def test_calibration_images_reach_every_caption_and_no_further():
    """``policy.calibration_images`` takes 2 … len(``CALIBRATION_PROMPTS``) captions; beyond, a ``ConfigError``
    naming the key (before any weights load)."""
    from adtbench.errors import ConfigError

    n = len(captions.CALIBRATION_PROMPTS)
    assert jacobi.jacobi_params({"calibration_images": n}).calibration_images == n == 48
    for bad in (1, n + 1):
        with pytest.raises(ConfigError, match=r"policy\.calibration_images"):
            jacobi.jacobi_params({"calibration_images": bad})
