"""File caches the harness keeps for the algorithm layer, which never touches files itself.

- The **cost model** of ``budget: cost`` trees (``algorithm.cost.CostModel``): measured once per machine × model
  × threads × torch version (``cost_key``; never the weights' values) and kept as
  ``<paths.cache_dir>/cost/<sha256(key)[:16]>.json``; re-measured when the cached one covers too few nodes, or
  was measured under a load above the cores while the machine is idle now.
  ``cost_source`` hands a policy's ``bind`` the callable that loads or measures it.
- The **LANTERN neighbour table** (``algorithm.lantern.nearest_codes``): ``<lantern.cache_dir>/nn_<key>_k<k>.npy``,
  keyed by the codebook bytes, k and ``normalize``; written atomically, so concurrent jobs never read half a table.
- ``lantern_params`` / ``build_lantern_rule``: the ``lantern`` config node → a validated ``LanternRule``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from adtbench import accel
from adtbench.algorithm.cost import MEASURE_METHOD, VERIFY_ONLY_METHOD, CostModel, measure_cost, target_parameters
from adtbench.algorithm.methods.lantern import LanternRule, nearest_codes
from adtbench.errors import ConfigError, check_flag, check_number
from adtbench.harness.schema import AppConf
from adtbench.io import atomic_write_bytes, atomic_write_with
from adtbench.resources import cpus_available, load_average

log = logging.getLogger("adtbench")


# --- the cost model --------------------------------------------------------------------------------------
def cost_key(target: Any, drafter: Any, rows: int) -> dict[str, Any]:
    """What the costs depend on (never the weights' values); ``drafter`` None: a verify-only model (Jacobi loops)."""
    dev = target.device
    return {
        "target": type(target).__name__,
        "hidden": int(target.hidden_size),
        "heads": int(target.num_heads),
        "kv_heads": int(target.num_kv_heads),
        "intermediate": int(target.intermediate_size),
        "params": int(sum(p.numel() for p in target_parameters(target))),
        "drafter_layers": 0 if drafter is None else int(drafter.config.num_layers),
        "gen_tokens": int(target.layout.num_gen_tokens),
        "vocab": int(target.layout.vocab_size),
        "device": accel.device_name(dev) if accel.is_cuda(dev) else f"cpu:{_cpu_name()}",
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": None if accel.is_cuda(dev) else torch.get_num_threads(),
        "engine": target.engine_mode,  # eager | compiled | graphs: what the decode will run
        "rows": int(rows),
        "torch": torch.__version__,
        "method": MEASURE_METHOD if drafter is not None else VERIFY_ONLY_METHOD,
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_or_measure(
    target: Any, drafter: Any, sp: Any, max_nodes: int, max_level: int, cache_dir: Path | None
) -> CostModel:
    """The cached cost model for this machine and model, measured (and cached) when absent or too small."""
    rows = 2 if sp.use_cfg and target.supports_cfg else 1
    key = cost_key(target, drafter, rows)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = None if cache_dir is None else Path(cache_dir) / "cost" / f"{digest}.json"
    cores = cpus_available()
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            model = CostModel.from_json(data["model"])
            covers = max(model.verify_nodes) >= max_nodes and max(model.level_nodes) >= max_level
            if covers and not _measured_busy_now_idle(model, cores, path):
                log.info("cost model: cached %s", path)
                return model
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("cost model: ignoring unreadable cache %s (%s)", path, e)
    t0 = time.perf_counter()
    model = measure_cost(target, drafter, sp, max_nodes, max_level)
    model.meta["key"] = key
    load = model.meta.get("load")
    if load is not None and load > cores:
        log.warning("cost model measured under load %.1f > %d cores: its times may be inflated", load, cores)
    log.info(
        "cost model: measured in %.1f s (AR step %.2f ms)%s",
        time.perf_counter() - t0,
        model.step_ms,
        f" → {path}" if path else "",
    )
    if path is not None:
        atomic_write_bytes(path, json.dumps({"key": key, "model": model.to_json()}, indent=2).encode())
    return model


def _measured_busy_now_idle(model: CostModel, cores: int, path: Path) -> bool:
    """Should a cached cost model be measured again? Yes when it was measured under a load above the cores (its
    times, and so the tree sizes it picks, are contention's) and the machine is no longer that busy; a cache
    measured busy on a still-busy machine is kept, with a warning (measuring again would be no better)."""
    then = model.meta.get("load")
    if then is None or then <= cores:
        return False
    avg = load_average()
    now = None if avg is None else avg[0]
    if now is not None and now <= cores:
        log.info(
            "cost model: the cached %s was measured under load %.1f > %d cores; measuring again (load %.1f)",
            path,
            then,
            cores,
            now,
        )
        return True
    log.warning(
        "cost model: the cached %s was measured under load %.1f > %d cores and the machine is still busy; using it",
        path,
        then,
        cores,
    )
    return False


def cost_source(target: Any, drafter: Any, sp: Any, cache_dir: Path | None) -> Callable[[int, int], CostModel]:
    """What ``TreePolicy.bind`` receives: ``(max_nodes, max_level) → CostModel`` for these models, cached."""
    return lambda max_nodes, max_level: load_or_measure(target, drafter, sp, max_nodes, max_level, cache_dir)


SHIPPED_TAUS = "window_taus.json"
"""The file beside a model's weights (``<model.path>/window_taus.json``) holding τ(L) tables calibrated once and shipped
with the model (``ship_window_taus`` writes it): ``{"entries": [entry]}``, each entry ``{"key":
shipped_window_key(...), "taus": {L: τ}, "tau_se": {L: se}, "images": n, "counts": {L: [[committed, forwards] per
calibration image]}}``. τ(L) is an estimate over the calibration captions' sampled decodes: another machine's float
rounding draws other paths, so a fresh calibration agrees with it within ``tau_se``, not bit for bit."""


def _by_L(table: dict[str, Any] | None) -> dict[int, float]:
    """A JSON ``{"L": value}`` table with int keys (an absent table: {})."""
    return {int(k): float(v) for k, v in (table or {}).items()}


def _window_settings(cfg: Any, conf: AppConf) -> tuple[Any, dict[str, Any]]:
    """The Jacobi params of ``cfg.policy`` and what τ(L) depends on besides the model: the sampling, the policy's keys
    that change τ(L), LANTERN, the calibration prompts and grid, and the version of the calibration code (4: bump it
    when ``decode_jacobi`` or ``calibrate_window`` changes what they commit or record)."""
    from adtbench.algorithm.methods.jacobi.captions import CALIBRATION_GRID, CALIBRATION_PROMPTS
    from adtbench.algorithm.methods.jacobi.loop import JacobiParams
    from adtbench.algorithm.policies import POLICIES

    sp, lantern_on = conf.sampling, conf.lantern is not None and conf.lantern.enabled
    assert sp is not None, "a checked config has a sampling node"
    params = POLICIES.build(str(cfg.policy.name), {str(k): v for k, v in cfg.policy.items() if k != "name"}).params
    base = {f.name for f in dataclasses.fields(JacobiParams)}
    method = {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.name not in base}  # sjd_pac's
    keys = (
        "init",
        "redraw",
        "rule",
        "proposal",
        "window_min",
        "window_max",
        "calibration_tokens",
        "calibration_images",
    )
    settings = {
        "sampling": [sp.temperature, sp.top_k, sp.top_p, sp.cfg_scale],
        "policy": {k: getattr(params, k) for k in (*keys, "group_size", "group_gap", "group_dist")} | method,
        "lantern": lantern_on,
        "prompts": list(CALIBRATION_PROMPTS[: params.calibration_images]),
        "grid": list(CALIBRATION_GRID),
        "version": 4,
    }
    return params, settings


def model_digest(path: str | os.PathLike[str]) -> str:
    """sha256 over a model directory's ``config.json`` and ``*.safetensors`` files (names and bytes, sorted by name):
    the identity of the weights a shipped τ(L) table was measured with (the text encoder's included)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file() and (f.name == "config.json" or f.suffix == ".safetensors"):
            h.update(f.name.encode() + b"\0")
            h.update(f.read_bytes())
    return h.hexdigest()


def shipped_window_key(cfg: Any, target: Any, drafter: Any, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The key of a shipped τ(L) table: ``settings`` (``_window_settings``) plus the model's weights
    (``model_digest`` of ``model.path``; with ``sampling`` it fixes the CFG rows), the dtype and the device kind
    (CUDA's generator draws other numbers than the CPU's) — not the machine: τ(L) counts tokens, it reads no clock.
    None when no table can apply: no ``model.path`` directory, or a drafter (``init=drafter``; its weights are not
    in the key)."""
    model = cfg.get("model")
    path = None if model is None else model.get("path")
    if drafter is not None or path is None or not Path(str(path)).is_dir():
        return None
    return settings | {
        "model": model_digest(str(path)),
        "dtype": str(target.dtype).replace("torch.", ""),
        "device": "cuda" if accel.is_cuda(target.device) else "cpu",
    }


class ShippedTaus(NamedTuple):
    """A shipped τ(L) entry (``SHIPPED_TAUS``): its file, τ(L), their standard errors and each caption's counts."""

    path: Path
    taus: dict[int, float]
    tau_se: dict[int, float]
    counts: dict[int, list[tuple[int, int]]]


def shipped_taus(cfg: Any, target: Any, drafter: Any, settings: dict[str, Any]) -> ShippedTaus | None:
    """The entry of ``<model.path>/window_taus.json`` whose key equals ``shipped_window_key`` exactly, else None."""
    key = shipped_window_key(cfg, target, drafter, settings)
    if key is None:
        return None
    path = Path(str(cfg.model.path)) / SHIPPED_TAUS
    if not path.is_file():
        return None
    want = json.dumps(key, sort_keys=True, default=str)
    try:
        for entry in json.loads(path.read_text())["entries"]:
            if json.dumps(entry["key"], sort_keys=True, default=str) == want:
                counts = {int(L): [(int(c), int(f)) for c, f in rows] for L, rows in entry.get("counts", {}).items()}
                return ShippedTaus(path, _by_L(entry["taus"]), _by_L(entry.get("tau_se")), counts)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("window=cost: ignoring unreadable shipped τ(L) %s (%s)", path, e)
    return None


def calibrate_taus(cfg: Any, conf: AppConf, target: Any, drafter: Any, params: Any, cost: Any) -> dict[str, Any]:
    """``calibrate_window`` on the calibration prompts with this config's sampling, rule and drafter (the decodes)."""
    from adtbench.algorithm.methods.jacobi.calibration import calibrate_window
    from adtbench.algorithm.methods.jacobi.captions import CALIBRATION_PROMPTS
    from adtbench.algorithm.verify import EXACT

    sp = conf.sampling
    assert sp is not None, "a checked config has a sampling node"
    gen = torch.Generator(device=target.device if accel.is_cuda(target.device) else "cpu")
    prompts = CALIBRATION_PROMPTS[: params.calibration_images]
    inputs = [target.encode_prompt(text, cfg=sp.use_cfg and target.supports_cfg) for text in prompts]
    rule: Any = build_lantern_rule(cfg.lantern, target) if conf.lantern is not None and conf.lantern.enabled else EXACT
    if params.rule == "gsd":
        from adtbench.algorithm.methods.gsd import grouped_rule

        rule = grouped_rule(target, params)
    return calibrate_window(target, inputs, sp, params, cost, gen, rule, drafter)


def load_or_calibrate_window(cfg: Any, conf: AppConf, target: Any, drafter: Any) -> dict[str, Any]:
    """``policy.window=cost`` of a Jacobi loop: ``calibration.calibrate_window`` on this machine's verify cost
    model (``load_or_measure`` without a drafter, or with the ``init=drafter`` one). τ(L) comes, in this order, from
    the machine's cache ``<paths.cache_dir>/jacobi/<sha256(key)[:16]>.json`` (keyed by the cost model's key, the
    sampling, the policy's keys that change τ(L) and the calibration prompts; re-calibrated when the cost model is
    re-measured), from the table shipped with the model (``shipped_taus``: same settings, same weights), or from the
    calibration decodes (then cached). Only the choice of L reads the machine's cost model. ``cfg``: the app's config
    (``policy``, ``lantern``, ``model.path``); ``conf``: the typed sampling, ``lantern.enabled`` and
    ``paths.cache_dir``."""
    from adtbench.algorithm.methods.jacobi.calibration import choose_window

    params, settings = _window_settings(cfg, conf)
    sp, cache_dir = conf.sampling, conf.cache_dir
    levels = 1 if drafter is None else 16  # a verify-only model covers "levels" of 1 (no drafter)
    cost = load_or_measure(target, drafter, sp, max(64, params.window_max), levels, cache_dir)
    key = {"cost": cost.meta.get("key"), "cost_measured_at": cost.meta.get("measured_at"), **settings}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = None if cache_dir is None else Path(cache_dir) / "jacobi" / f"{digest}.json"
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            out = choose_window(_by_L(data["taus"]), cost, params.overhead_steps, _by_L(data.get("tau_se")))
            log.info("window=cost: cached τ(L) %s → L = %d", path, out["L"])  # overhead_steps is not in the key
            return out
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("window=cost: ignoring unreadable cache %s (%s)", path, e)
    shipped = shipped_taus(cfg, target, drafter, settings)
    if shipped is not None:
        out = choose_window(shipped.taus, cost, params.overhead_steps, shipped.tau_se)
        log.info("window=cost: τ(L) shipped with the model %s → L = %d", shipped.path, out["L"])
        return out
    t0 = time.perf_counter()
    out = calibrate_taus(cfg, conf, target, drafter, params, cost)
    log.info(
        "window=cost: τ(L) %s ± %s (non-decreasing fit %s), rate %s → L = %d (calibrated in %.1f s)",
        {L: round(t, 2) for L, t in out["taus"].items()},
        {L: round(e, 2) for L, e in out["tau_se"].items()},
        {L: round(t, 2) for L, t in out["fit"].items()},
        {L: round(r, 2) for L, r in out["rates"].items()},
        out["L"],
        time.perf_counter() - t0,
    )
    if path is not None:
        table = {"key": key, "taus": out["taus"], "tau_se": out["tau_se"]}
        atomic_write_bytes(path, json.dumps(table, indent=2).encode())
    return out


def ship_window_taus(cfg: Any, conf: AppConf, target: Any) -> Path:
    """Calibrate τ(L) afresh for ``cfg`` (no cache read) and write it into ``<model.path>/window_taus.json``, replacing
    the entry with the same key (``shipped_window_key``); returns the file. Run by
    ``python -m adtbench.tools.ship_window [overrides]`` when the weights or the calibration code change."""
    params, settings = _window_settings(cfg, conf)
    key = shipped_window_key(cfg, target, None, settings)
    if key is None:
        raise ConfigError("model.path", f"no model directory to ship τ(L) with (got {cfg.model.get('path')!r})")
    cost = load_or_measure(target, None, conf.sampling, max(64, params.window_max), 1, None)
    out = calibrate_taus(cfg, conf, target, None, params, cost)
    path = Path(str(cfg.model.path)) / SHIPPED_TAUS
    entries = json.loads(path.read_text())["entries"] if path.is_file() else []
    want = json.dumps(key, sort_keys=True, default=str)
    entries = [e for e in entries if json.dumps(e["key"], sort_keys=True, default=str) != want]
    entries.append(
        {
            "key": key,
            "taus": {str(L): t for L, t in out["taus"].items()},
            "tau_se": {str(L): e for L, e in out["tau_se"].items()},
            "images": len(settings["prompts"]),
            "counts": {str(L): [list(c) for c in counts] for L, counts in out["counts"].items()},
        }
    )
    atomic_write_bytes(path, (json.dumps({"entries": entries}, indent=2, default=str) + "\n").encode())
    return path


# --- LANTERN neighbour tables ----------------------------------------------------------------------------
def table_key(codebook: torch.Tensor, k: int, normalize: bool) -> str:
    """Cache key: sha256 of the codebook's shape, dtype and bytes, plus k and ``normalize``."""
    cb = codebook.detach().cpu().contiguous()
    h = hashlib.sha256(f"{tuple(cb.shape)}|{cb.dtype}|k={k}|norm={bool(normalize)}|".encode())
    h.update(cb.view(torch.uint8).numpy().tobytes() if cb.dtype == torch.bfloat16 else cb.numpy().tobytes())
    return h.hexdigest()[:24]


def load_or_build_table(
    codebook: torch.Tensor, k: int, normalize: bool, cache_dir: str | os.PathLike[str] | None
) -> tuple[torch.Tensor, Path | None, bool]:
    """The neighbour table (``nearest_codes``), read from / written to ``cache_dir``; returns (table, file, hit)."""
    if cache_dir is None:
        return nearest_codes(codebook, k, normalize), None, False
    path = Path(cache_dir) / f"nn_{table_key(codebook, k, normalize)}_k{k}.npy"
    if path.exists():
        table = torch.from_numpy(np.load(path).astype(np.int64, copy=False))
        if table.shape == (codebook.shape[0], k):
            return table, path, True
        log.warning("ignoring LANTERN cache %s of shape %s", path, tuple(table.shape))
    table = nearest_codes(codebook, k, normalize)
    try:  # atomic: concurrent jobs never read half a table
        atomic_write_with(path, lambda tmp: np.save(tmp, table.numpy()), suffix=".npy")
    except OSError as e:  # validated with the config (config.check_writable_dir); this covers a full disk etc.
        raise ConfigError("lantern.cache_dir", f"cannot write the neighbour table {path}: {e}") from e
    return table, path, False


# --- the rule --------------------------------------------------------------------------------------------


# --- the lantern config node ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LanternParams:
    k: int
    delta: float | None
    lam: float | None
    normalize: bool
    reference_residual: bool
    cache_dir: str | None


def lantern_params(node: Any) -> LanternParams:
    """Validate the ``lantern`` config node (no model needed); ConfigError names the key."""

    def get(key: str, default: Any = None) -> Any:
        return node.get(key, default) if hasattr(node, "get") else default

    k = check_number(get("k", 1000), "lantern.k", int, lo=1)
    delta, lam = get("delta", 0.1), get("lam")
    if delta is None and lam is None:
        raise ConfigError("lantern.delta", "LANTERN needs a bound: set lantern.delta (δ) and/or lantern.lam (λ)")
    # δ in [0, 1] (a total-variation bound); λ ≥ 1 (p̃(x) ≤ λ·p(x)); either may be null
    delta = None if delta is None else check_number(delta, "lantern.delta", float, lo=0.0, hi=1.0)
    lam = None if lam is None else check_number(lam, "lantern.lam", float, lo=1.0)
    cache = get("cache_dir")
    return LanternParams(
        k=k,
        delta=delta,
        lam=lam,
        normalize=check_flag(get("normalize", False), "lantern.normalize"),
        reference_residual=check_flag(get("reference_residual", False), "lantern.reference_residual"),
        cache_dir=None if cache is None else str(cache),
    )


def build_lantern_rule(node: Any, target: Any) -> LanternRule:
    """``LanternRule`` for ``target`` (its ``codebook()`` and ``layout``) from the ``lantern`` config node.

    k is clamped to num_codes − 1 (k larger than that means "all other codes"); the reference residual needs
    one more column. The table lives on the target's device.
    """
    params = lantern_params(node)
    try:
        codebook = target.codebook()
    except RuntimeError as e:
        raise ConfigError("lantern.enabled", str(e)) from e
    layout = target.layout
    if codebook.ndim != 2 or codebook.shape[0] != layout.num_codes:
        raise ConfigError(
            "lantern.enabled", f"codebook of shape {tuple(codebook.shape)} does not match {layout.num_codes} codes"
        )
    k = min(params.k, layout.num_codes - 1)
    if k < params.k:
        log.warning("lantern.k=%d > %d other codes: using k=%d", params.k, layout.num_codes - 1, k)
    cols = min(k + 1, layout.num_codes - 1) if params.reference_residual else k
    table, path, hit = load_or_build_table(codebook, cols, params.normalize, params.cache_dir)
    log.info("LANTERN neighbours %s (%s)", path, "cache hit" if hit else "computed")
    rule = LanternRule(
        table.to(target.device),
        layout.image_token_offset,
        delta=params.delta,
        lam=params.lam,
        k=k,
        reference_residual=params.reference_residual,
    )
    return rule


def lantern_used(cfg: Any, rule: Any) -> dict[str, Any] | None:
    """The LANTERN values a job decodes with (the summary's ``lantern_params``) — ``k`` as used (clipped to the
    model's codebook size − 1, :func:`build_lantern_rule`), not as configured; None when the rule is exact."""
    if getattr(rule, "name", "exact") != "lantern":
        return None
    p = lantern_params(cfg.lantern)
    return {
        "k": int(rule.k),
        "delta": p.delta,
        "lam": p.lam,
        "normalize": p.normalize,
        "reference_residual": p.reference_residual,
    }
