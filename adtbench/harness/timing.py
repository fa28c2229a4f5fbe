"""The speedup protocol's timing: ABBA-ordered repeats of one prompt (:func:`timed_prompt`), the load average
around the timed work (:class:`LoadWatch`) and what the timings ran on (:func:`machine`, :func:`environment`).

The baseline is ``decode_ar`` of the same target, same prompts, seeds, sampling, CFG rows, dtype and device;
``warmup`` untimed generations of both after model load (and after ``engine.compile``); each prompt is timed
``timing.repeats`` times, every repeat one (baseline, method) pair whose order alternates from pair to pair (ABBA:
baseline first on even pairs); the recorded latencies are the medians of the repeats, and every repeat must give
the same tokens (the seeded generator makes a decode deterministic). Timed scope: prefill + decode loop (text
encoding and VQ decode excluded). The speedup is reported as the ratio of total times, the median of the paired
per-prompt ratios and a two-level bootstrap CI (:func:`adtbench.harness.stats.summarize`); the load average before
and after the timed work is recorded next to the thread and core counts, and a load above the available cores is
flagged in the log and the printed line.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable, Iterator
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.records import GenerationResult
from adtbench.resources import cpus_available, load_average

__all__ = ["LoadWatch", "environment", "load_peak", "load_warning", "machine", "timed_prompt", "timed_results"]

log = logging.getLogger("adtbench")


def timed_prompt(
    decode: Callable[[Any, int, bool], GenerationResult],
    p: Any,
    seed: int,
    repeats: int,
    baseline: bool,
    first_pair: int,
) -> tuple[list[GenerationResult], list[GenerationResult]]:
    """Time one prompt ``repeats`` times: each repeat is a (baseline, method) pair, the baseline first when the
    pair's global index (``first_pair`` + repeat) is even, so the order alternates ABBA. Every repeat of a side
    must decode the same tokens (same seed); returns (method runs, baseline runs)."""
    runs: list[GenerationResult] = []
    bases: list[GenerationResult] = []
    for r in range(repeats):
        base_first = (first_pair + r) % 2 == 0
        if baseline and base_first:
            bases.append(decode(p, seed, False))
        runs.append(decode(p, seed, True))
        if baseline and not base_first:
            bases.append(decode(p, seed, False))
    for side, results in (("method", runs), ("baseline", bases)):
        for r, res in enumerate(results[1:], 1):
            if res.tokens != results[0].tokens:
                raise RuntimeError(
                    f"prompt {p.prompt_id}: timing repeat {r} of the {side} decoded other tokens than repeat 0 with "
                    f"the same seed {seed}; timing.repeats needs a deterministic decode"
                )
    return runs, bases


def timed_results(
    job: Any, todo: list[Any], repeats: int, baseline: bool
) -> Iterator[tuple[Any, int, list[GenerationResult], list[GenerationResult], dict[str, Any] | None]]:
    """Per prompt of ``todo``, in order, decoded by ``job`` (a ``harness.job.Job``): (prompt, seed, method runs,
    baseline runs, the record's ``batch`` field). One prompt at a time (:func:`timed_prompt`), or a window of
    ``decode.batch_size × decode.window`` prompts at a time (``harness.batched``): a window's prompts come out once
    both of its sides are done."""
    if job.batched is None:

        def decode(p: Any, seed: int, method: bool) -> GenerationResult:
            return job.decode(p, method, seed)  # type: ignore[no-any-return]

        for i, p in enumerate(todo):
            seed = job.seed_of(p)
            runs, bases = timed_prompt(decode, p, seed, repeats, baseline, i * repeats)
            yield p, seed, runs, bases, None
        return
    size = job.batch_size * job.window
    for w, i in enumerate(range(0, len(todo), size)):
        for p, seed, run, base, batch in job.decode_window(todo[i : i + size], w):
            yield p, seed, [run], [] if base is None else [base], batch


def load_peak(before: float | None, after: float | None) -> float | None:
    """The larger of two 1-minute load averages (``None`` without any)."""
    return max((x for x in (before, after) if x is not None), default=None)


def load_warning(before: float | None, after: float | None, cpus: int) -> str | None:
    """A warning when the 1-minute load average before or after the timed work exceeds the available cores."""
    peak = load_peak(before, after)
    if peak is None or peak <= cpus:
        return None
    return f"load average {peak:.2f} exceeded the {cpus} available core(s) around the timed work: timings unreliable"


class LoadWatch:
    """The 1-minute load average just before (:meth:`start`) and just after (:meth:`stop`) the timed work, as the
    summary's ``load_before`` / ``load_after`` / ``load_peak`` / ``load_warning`` (logged as it is read)."""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.before: float | None = None
        self.after: float | None = None

    def start(self, what: str) -> dict[str, Any]:
        avg = load_average()
        self.before = None if avg is None else avg[0]
        log.info("timed work: %s, load average (1/5/15 min) %s", what, avg)
        return self._info()

    def stop(self) -> dict[str, Any]:
        avg = load_average()
        self.after = None if avg is None else avg[0]
        log.info("load average (1/5/15 min) after the timed work: %s", avg)
        return self._info()

    def _info(self) -> dict[str, Any]:
        info = {
            "load_before": self.before,
            "load_after": self.after,
            "load_peak": load_peak(self.before, self.after),
            "load_warning": load_warning(self.before, self.after, self.cpus),
        }
        if info["load_warning"]:
            log.warning("%s", info["load_warning"])
        return info


def machine() -> dict[str, Any]:
    """The summary's machine state: torch threads, the machine's cores and those this process may use."""
    return {"threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "cpus_available": cpus_available()}


def environment(target: Any) -> dict[str, Any]:
    """The summary's ``env``: python, torch, transformers, the target's device and dtype, CPU, threads, GPU/CUDA."""
    import transformers

    dev = target.device
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(dev),
        "dtype": str(target.dtype).replace("torch.", ""),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if accel.is_cuda(dev):
        info |= {"gpu": accel.device_name(dev), "cuda": torch.version.cuda}
    return info
