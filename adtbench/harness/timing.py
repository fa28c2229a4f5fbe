"""The speedup protocol's timing: interleaved repeats of one prompt (:func:`timed_prompt`, in the order of
:func:`side_order`), the load average around the timed work (:class:`LoadWatch`) and what the timings ran on
(:func:`machine`, :func:`environment`).

The baseline is ``decode_ar`` of the same target, same prompts, seeds, sampling, CFG rows, dtype and device;
``warmup`` untimed generations of every side after model load (and after ``engine.compile``); each prompt is timed
``timing.repeats`` times, every repeat one decode of each side in the order :func:`side_order` gives: prompt i opens
with the i-th order of a cycle in which every side runs first (right after the prompt's untimed set-up: the previous
prompt's image, records and writes) equally often, and each repeat reverses the previous one (ABBA). With two sides
(baseline, method) prompt i opens with the baseline when i is even, whatever the repeat count. The recorded latencies
are the medians of the repeats, and every repeat must give the same tokens (the seeded generator makes a decode
deterministic). With ``timing.reference_baseline`` the AR baseline is timed a second time through the reference
implementation (transformers, eager: the papers' baseline), in the same repeats. With ``timing.aa`` (the A/A control)
it is timed a second time on the same target, in the method's role: ``aa_ratio`` = Σ baseline / Σ A/A side is the
speedup of a method identical to AR, measured in the same interleaving as the speedup — its noise floor. Timed scope:
prefill + decode loop (text encoding and VQ decode excluded). The speedup is reported as the ratio of total times, the
median of the paired per-prompt ratios and a two-level bootstrap CI (:func:`adtbench.harness.stats.summarize`;
``speedup_ref`` and ``aa_ratio`` likewise); the load average before and after the timed work is recorded next to the
thread and core counts, and a load above the available cores is flagged in the log and the printed line.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

import torch

from adtbench import accel
from adtbench.algorithm.records import GenerationResult
from adtbench.resources import cpus_available, load_average

__all__ = [
    "LoadWatch",
    "Side",
    "Timed",
    "TimedPrompt",
    "environment",
    "load_peak",
    "load_warning",
    "machine",
    "side_order",
    "sides",
    "timed_prompt",
    "timed_results",
]

log = logging.getLogger("adtbench")


Side = Literal["method", "baseline", "reference", "aa"]


class Timed(NamedTuple):
    """One prompt's timed decodes: the method's repeats, the AR baseline's, the reference baseline's
    (``timing.reference_baseline``) and the A/A side's (``timing.aa``: the AR baseline again, in the method's role),
    each in the order they ran; a side that was not timed has an empty list."""

    runs: list[GenerationResult]
    bases: list[GenerationResult]
    refs: list[GenerationResult]
    aas: list[GenerationResult]


def sides(baseline: bool, reference: bool = False, aa: bool = False) -> list[Side]:
    """The sides timed per repeat, in their base order (the cycle :func:`side_order` turns): without the A/A control
    ``[reference?, baseline?, method]``; with it ``[reference?, method, baseline, aa]`` — the baseline between the
    method and the A/A side, so that the orders :func:`side_order` draws from are the same set with the method and the
    A/A side swapped (each meets the baseline in the same positions: the A/A pair is interleaved as the speedup pair
    is)."""
    if aa:
        return [*(["reference"] if reference else []), "method", "baseline", "aa"]  # type: ignore[list-item]
    return [*(["reference"] if reference else []), *(["baseline"] if baseline else []), "method"]  # type: ignore[list-item]


def side_order(base: list[Side], prompt: int, repeat: int) -> list[Side]:
    """The order the sides of ``base`` (k of them) decode repeat ``repeat`` of prompt ``prompt`` (its index in the
    run) in.

    The opening orders cycle through the k rotations of ``base`` and, for k > 2, their reverses (2k orders: the
    dihedral design of a k-cycle); prompt i opens with the (i mod that count)-th, and every odd repeat reverses the
    prompt's opening order. Invariants, over every full cycle of prompts: each side runs in each position (first right
    after the prompt's untimed set-up included) equally often, and each side runs before each other one as often as
    after it; within a prompt, every two repeats run each pair of sides both ways. For k = 2 (baseline, method): the
    baseline opens even prompts, the method odd ones, and the repeats alternate ABBA from there."""
    k = len(base)
    opening = [base[j:] + base[:j] for j in range(k)]
    if k > 2:
        opening += [order[::-1] for order in opening]
    order = opening[prompt % len(opening)]
    return order[::-1] if repeat % 2 else order


def timed_prompt(
    decode: Callable[[Any, int, Side], GenerationResult],
    p: Any,
    seed: int,
    repeats: int,
    baseline: bool,
    index: int,
    reference: bool = False,
    aa: bool = False,
) -> Timed:
    """Time one prompt ``repeats`` times, each repeat one decode of every side of :func:`sides` (the method; the
    baseline when ``baseline``; the reference with ``reference``; the A/A side with ``aa``) in the order of
    :func:`side_order` for the prompt's ``index`` in the run. Every repeat of a side must decode the same tokens (same
    seed), and the A/A side the baseline's (the same computation)."""
    out = Timed([], [], [], [])
    lists: dict[Side, list[GenerationResult]] = {
        "method": out.runs,
        "baseline": out.bases,
        "reference": out.refs,
        "aa": out.aas,
    }
    base = sides(baseline, reference, aa)
    for r in range(repeats):
        for side in side_order(base, index, r):
            lists[side].append(decode(p, seed, side))
    for side, results in lists.items():
        for r, res in enumerate(results[1:], 1):
            if res.tokens != results[0].tokens:
                raise RuntimeError(
                    f"prompt {p.prompt_id}: timing repeat {r} of the {side} decoded other tokens than repeat 0 with "
                    f"the same seed {seed}; timing.repeats needs a deterministic decode"
                )
    if out.aas and out.bases and out.aas[0].tokens != out.bases[0].tokens:
        raise RuntimeError(f"prompt {p.prompt_id}: the A/A side decoded other tokens than the baseline (seed {seed})")
    return out


class TimedPrompt(NamedTuple):
    """What :func:`timed_results` yields per prompt: the prompt, its seed, the method's, the baseline's, the
    reference baseline's and the A/A side's timed decodes, and the record's ``batch`` field (batched windows; None at
    B = 1)."""

    prompt: Any
    seed: int
    runs: list[GenerationResult]
    bases: list[GenerationResult]
    refs: list[GenerationResult]
    aas: list[GenerationResult]
    batch: dict[str, Any] | None


def timed_results(job: Any, todo: list[Any], repeats: int, baseline: bool, aa: bool = False) -> Iterator[TimedPrompt]:
    """Per prompt of ``todo``, in order, decoded by ``job`` (a ``harness.job.Job``; its ``reference`` target, when
    ``timing.reference_baseline`` built one, times the reference baseline beside the others; ``aa``: the AR baseline
    a second time, the A/A side). One prompt at a time (:func:`timed_prompt`, ``index`` = the prompt's position in
    ``todo``), or a window of ``decode.batch_size × decode.window`` prompts at a time
    (``harness.batched``): a window's prompts come out once both of its sides are done."""
    if job.batched is None:

        def decode(p: Any, seed: int, side: Side) -> GenerationResult:
            if side == "reference":
                return job.decode_reference(p, seed)  # type: ignore[no-any-return]
            return job.decode(p, side == "method", seed)  # type: ignore[no-any-return]  # aa: the baseline's call

        reference = job.reference is not None
        for i, p in enumerate(todo):
            seed = job.seed_of(p)
            runs, bases, refs, aas = timed_prompt(decode, p, seed, repeats, baseline, i, reference, aa)
            yield TimedPrompt(p, seed, runs, bases, refs, aas, None)
        return
    size = job.batch_size * job.window
    for w, i in enumerate(range(0, len(todo), size)):
        for p, seed, run, base, batch in job.decode_window(todo[i : i + size], w):
            yield TimedPrompt(p, seed, [run], [] if base is None else [base], [], [], batch)


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
    """The summary's ``env``: the code (``adtbench`` version, git ``commit`` and ``dirty``:
    ``provenance.code_version``), python, torch, transformers, the target's device and dtype, CPU, threads,
    GPU/CUDA."""
    import transformers

    from adtbench.harness.provenance import code_version

    dev = target.device
    code = code_version()
    info = {
        "adtbench": code["version"],
        "commit": code["commit"],
        "dirty": code["dirty"],
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
