"""Shared training machinery: config composition, seeding, schedules, checkpoints, export, scene data.

Reproducibility contract (every stage):
- the model is initialised from ``seed``;
- step ``i`` (0-based) first calls :func:`seed_step` ``(seed, i)``, which reseeds the global torch / numpy
  RNGs, and draws its batch from :func:`step_rng` ``(seed, i)``; nothing else is random;
- the checkpoint (``out_dir/checkpoint.pt``, written atomically every ``ckpt_every`` steps and at the end)
  holds the model, the optimiser, the step and the stage's extra state, plus a fingerprint of the config;

hence a run interrupted after any checkpoint and resumed (``resume: true``, the default) ends with the
same weights as an uninterrupted run, and a resume with a different config is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from adtbench.io import append_line_fsync, atomic_torch_save, atomic_write_with
from adtbench.resources import conf_dir

CONF_DIR = conf_dir()

#: config keys that may change between a run and its resume (they do not change the result)
RESUME_IGNORED = (
    "resume",
    "progress",
    "export",
    "threads",
    "device",
    "log_every",
    "ckpt_every",
    "out_dir",
    "stop_after",
)


def compose_stage(stage: str, overrides: list[str]) -> DictConfig:
    """``conf/train/<stage>.yaml`` composed with command-line ``overrides`` (Hydra syntax)."""
    from adtbench.harness.config import compose_config

    cfg = compose_config(f"train/{stage}", overrides, str(CONF_DIR))
    if "train" in cfg and len(cfg) == 1:  # composed under the group's package: lift it
        cfg = cfg.train
    return cfg


def stage_dir(cfg: DictConfig) -> Path:
    """Start of every stage's ``run``: create ``cfg.out_dir`` and apply ``cfg.threads`` (when set)."""
    out = Path(str(cfg.out_dir))
    out.mkdir(parents=True, exist_ok=True)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    return out


def _mix(*parts: int) -> int:
    h = hashlib.sha256(":".join(str(int(p)) for p in parts).encode()).hexdigest()
    return int(h[:15], 16)


def step_rng(seed: int, step: int, salt: int = 0) -> np.random.Generator:
    """The batch generator of step ``step`` (a pure function of its arguments)."""
    return np.random.default_rng(_mix(seed, step, salt))


def seed_step(seed: int, step: int) -> None:
    """Reseed the global torch and numpy RNGs for step ``step`` (dropout, noise, restarts)."""
    s = _mix(seed, step, 7919)
    torch.manual_seed(s)
    np.random.seed(s % 2**32)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB of images in ``[−1, 1]`` (``a`` clamped; peak-to-peak 2): ``10 log10(4 / mse)``."""
    mse = (a.clamp(-1, 1) - b).pow(2).mean().item()
    return 10 * float(np.log10(4.0 / max(mse, 1e-12)))


def lr_at(step: int, base: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio · base`` at ``total``."""
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def fingerprint(cfg: DictConfig) -> str:
    """Hash of the resolved config minus ``RESUME_IGNORED`` keys."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    for k in RESUME_IGNORED:
        data.pop(k, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save(obj, path)`` atomically (:func:`adtbench.io.atomic_torch_save`)."""
    atomic_torch_save(obj, path)


class Checkpointer:
    """``out_dir/checkpoint.pt`` = {model, optim, step, elapsed_s, extra, fingerprint}.

    Invariant: the file holds only tensors, dicts, lists, tuples, numbers, strings and None (the optimiser's
    ``state_dict`` and the stages' ``extra`` are such), so it is read back with ``weights_only=True``.
    """

    def __init__(self, out_dir: Path, cfg: DictConfig) -> None:
        self.path = out_dir / "checkpoint.pt"
        self.fp = fingerprint(cfg)
        self.resume = bool(cfg.get("resume", True))

    def load(self, model: torch.nn.Module, optim: torch.optim.Optimizer | None) -> tuple[int, float, dict]:
        """Restore into ``model``/``optim``; returns (next step, elapsed seconds, extra). (0, 0, {}) if fresh."""
        if not (self.resume and self.path.exists()):
            return 0, 0.0, {}
        from adtbench.io import load_weights

        ck = load_weights("out_dir", self.path)  # weights_only=True; a corrupt file names out_dir and the file
        if ck["fingerprint"] != self.fp:
            raise RuntimeError(
                f"{self.path} was written by a different config (fingerprint {ck['fingerprint']} ≠ {self.fp}); "
                "use another out_dir or resume=false"
            )
        model.load_state_dict(ck["model"])
        if optim is not None and ck.get("optim") is not None:
            optim.load_state_dict(ck["optim"])
        return int(ck["step"]), float(ck["elapsed_s"]), ck.get("extra", {})

    def save(
        self, model: torch.nn.Module, optim: torch.optim.Optimizer | None, step: int, elapsed: float, extra: dict
    ) -> None:
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        ck = {
            "model": state,
            "optim": None if optim is None else optim.state_dict(),
            "step": step,
            "elapsed_s": elapsed,
            "extra": extra,
            "fingerprint": self.fp,
        }
        atomic_save(ck, self.path)


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    clean = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}

    def write(tmp: Path) -> None:
        save_file(clean, str(tmp))
        os.chmod(tmp, 0o644)

    atomic_write_with(path, write)


def init_from(model: torch.nn.Module, cfg: DictConfig, file: str = "model.safetensors") -> None:
    """Warm start: load ``cfg.init_from/<file>`` (an earlier run's ``final/``) strictly, when set."""
    src = cfg.get("init_from")
    if not src:
        return
    from adtbench.io import load_weights

    model.load_state_dict(load_weights("init_from", Path(str(src)) / file))


def export_dir(src: Path, dst: str | None) -> None:
    """Copy the final artefacts (every file of ``src``) into ``dst`` (when set)."""
    if not dst:
        return
    d = Path(dst)
    d.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, d / f.name)


class MetricLog:
    """Append-only ``out_dir/log.jsonl`` (one line per logged step) + running means for the progress bar."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / "log.jsonl"
        self.sums: dict[str, float] = {}
        self.count = 0
        self.last: dict[str, float] = {}

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        self.count += 1

    def flush(self, step: int, extra: dict | None = None) -> dict[str, float]:
        if self.count == 0:
            return self.last
        self.last = {k: v / self.count for k, v in self.sums.items()}
        append_line_fsync(self.path, json.dumps({"step": step, **self.last, **(extra or {})}) + "\n")
        self.sums, self.count = {}, 0
        return self.last


def train_loop(
    cfg: DictConfig,
    out_dir: Path,
    model: torch.nn.Module,
    optim: torch.optim.Optimizer,
    step_fn: Callable[[int], dict[str, float]],
    desc: str,
    extra_state: Callable[[], dict] | None = None,
    load_extra: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """Run ``step_fn(step)`` for steps ``[start, cfg.steps)`` with LR schedule, logging and checkpoints.

    ``step_fn`` computes the loss, calls ``backward`` and returns scalar metrics; this loop owns
    ``zero_grad``, gradient clipping (``cfg.clip``) and ``optim.step``. ``cfg.stop_after`` (optional) ends
    this invocation after that many steps with a checkpoint (time-sliced jobs; a later run resumes).
    Returns the final logged metrics, the wall time (including earlier runs of a resumed job), the number
    of steps and ``complete`` (False when stopped early).
    """
    from tqdm import tqdm

    ck = Checkpointer(out_dir, cfg)
    start, elapsed, extra = ck.load(model, optim)
    if extra and load_extra is not None:
        load_extra(extra)
    total = int(cfg.steps)
    log = MetricLog(out_dir)
    params = [p for g in optim.param_groups for p in g["params"]]
    t0 = time.perf_counter()
    bar = tqdm(total=total, initial=start, desc=desc, disable=not cfg.get("progress", True), dynamic_ncols=True)
    last: dict[str, float] = {}
    stop = cfg.get("stop_after")
    end = total if stop is None else min(total, start + int(stop))
    for step in range(start, end):
        seed_step(int(cfg.seed), step)
        lr = lr_at(step, float(cfg.lr), int(cfg.warmup), total, float(cfg.get("min_lr_ratio", 0.1)))
        for g in optim.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        optim.zero_grad(set_to_none=True)
        metrics = step_fn(step)
        if cfg.get("clip"):
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, float(cfg.clip)))
        optim.step()
        log.add(metrics)
        done = step + 1
        if done % int(cfg.log_every) == 0 or done == total:
            last = log.flush(done, {"lr": lr, "elapsed_s": elapsed + time.perf_counter() - t0})
            bar.set_postfix({k: f"{v:.4g}" for k, v in last.items() if k in ("loss", "rec", "ce", "acc", "vloss")})
        if done % int(cfg.ckpt_every) == 0 or done in (total, end):
            ck.save(model, optim, done, elapsed + time.perf_counter() - t0, extra_state() if extra_state else {})
        bar.update(1)
    bar.close()
    if not last:  # nothing ran (already complete): report the last logged line
        lines = (out_dir / "log.jsonl").read_text().splitlines() if (out_dir / "log.jsonl").exists() else []
        last = json.loads(lines[-1]) if lines else {}
    return {"final": last, "wall_s": elapsed + time.perf_counter() - t0, "steps": total, "complete": end == total}


# ----------------------------------------------------------------------------------------------------
# Scene data (cached renders)
# ----------------------------------------------------------------------------------------------------


def scene_pool(seed: int, split: str, count: int, size: int, cache_dir: Path | None) -> tuple[list[str], np.ndarray]:
    """Captions and uint8 renders ``[count, size, size, 3]`` of the first ``count`` scenes of ``split``.

    Cached as ``cache_dir/scenes_{seed}_{split}_{count}_{size}.npz`` (a pure function of the arguments).
    """
    from adtbench.scenes import iter_split, render

    path = None if cache_dir is None else Path(cache_dir) / f"scenes_{seed}_{split}_{count}_{size}.npz"
    if path is not None and path.exists():
        z = np.load(path, allow_pickle=False)
        return [str(c) for c in z["captions"]], z["images"]
    captions, images = [], np.zeros((count, size, size, 3), np.uint8)
    for j, (_, s) in enumerate(iter_split(seed, split, count)):
        captions.append(s.caption)
        images[j] = render(s, size)
    if path is not None:
        atomic_write_with(path, lambda tmp: np.savez(tmp, captions=np.array(captions), images=images), suffix=".npz")
    return captions, images


def batches(n: int, size: int) -> Iterator[slice]:
    for i in range(0, n, size):
        yield slice(i, min(n, i + size))


def attribute_targets(attrs: list[dict[str, str]]) -> dict[str, torch.Tensor]:
    """Class index per caption attribute (``scenes.ATTRIBUTES``), ``{attribute: [n] int64}``, from canonical
    attribute dicts (``scenes.attributes`` / ``scenes.parse_caption``); −100 where a dict lacks the attribute (one
    object: no ``axis`` / ``b_*``), which ``F.cross_entropy(ignore_index=-100)`` skips."""
    from adtbench.scenes import ATTRIBUTES

    out = {k: torch.full((len(attrs),), -100, dtype=torch.long) for k in ATTRIBUTES}
    for i, a in enumerate(attrs):
        for k, v in a.items():
            out[k][i] = ATTRIBUTES[k].index(v)
    return out
