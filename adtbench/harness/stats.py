"""Statistics of a run's records: the summary of ``summary.json`` (:func:`summarize`, ``docs/algorithms.md`` §1.2)
and the one bootstrap (:func:`bootstrap_distribution`), through which :func:`bootstrap_ci`,
:func:`ratio_of_totals_ci`, ``adtbench.reporting.tables`` and ``analysis/`` resample.

Pure functions of plain records and arrays (no files: the run directory is :mod:`adtbench.harness.rundir`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "SPEEDUP_CI_LEVEL",
    "SPEEDUP_CI_METHOD",
    "SPEEDUP_CI_MIN_PROMPTS",
    "SPEEDUP_N_BOOT",
    "TIMING_SPREAD_MAX",
    "aa_summary",
    "aa_warning",
    "bootstrap_ci",
    "bootstrap_distribution",
    "jacobi_summary",
    "percentile_interval",
    "ratio_of_totals_ci",
    "reference_summary",
    "summarize",
    "throughput",
]


# ----------------------------------------------------------------------------------------------------
# the summary of a run's records
# ----------------------------------------------------------------------------------------------------

_REQUIRED = ("prompt_id", "cycles", "committed", "drafted_depth_sum", "tree_depth_sum", "latency_s")
_OPTIONAL_NUM = ("draft_s", "verify_s", "target_forwards", "encode_s", "baseline_encode_s")


def _stats(x: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """(mean, median, std with ddof=1) of ``x``; std is None for n < 2, all None for n = 0."""
    if len(x) == 0:
        return None, None, None
    a = np.asarray(x, dtype=np.float64)
    std = float(np.std(a, ddof=1)) if a.size >= 2 else None
    return float(a.mean()), float(np.median(a)), std


def _num(rec: dict[str, Any], key: str, *, allow_none: bool = False) -> float | None:
    if key not in rec:
        if allow_none:
            return None
        raise ValueError(f"record {rec.get('prompt_id')!r} lacks required key {key!r}")
    v = rec[key]
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be finite and >= 0, got {v!r}")
    return v


SPEEDUP_CI_LEVEL = 0.95
SPEEDUP_N_BOOT = 2000
SPEEDUP_CI_SEED = 0
SPEEDUP_CI_MIN_PROMPTS = 5  # fewer paired prompts: ``speedup_ci_caveat`` is set
TIMING_SPREAD_MAX = 0.05  # median relative range of a prompt's repeats above which ``timing_warning`` is set
SPEEDUP_CI_METHOD = (
    f"two-level percentile bootstrap of the ratio of totals ({SPEEDUP_N_BOOT} resamples, seed {SPEEDUP_CI_SEED}): "
    "prompts with replacement, then each drawn prompt's timing repeats with replacement, reduced to their median"
)


def _repeats(rec: dict[str, Any], key: str, value: float) -> list[float]:
    """The repeated timings ``rec[key]`` (each finite and > 0), or ``[value]`` for a record without repeats."""
    reps = rec.get(key)
    if reps is None:
        return [value]
    if not isinstance(reps, list) or not reps:
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be a non-empty list, got {reps!r}")
    out = [_num({"prompt_id": rec.get("prompt_id"), key: v}, key) for v in reps]
    if not all(out):
        raise ValueError(f"record {rec.get('prompt_id')!r}: {key} must be > 0")
    return out  # type: ignore[return-value]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate per-prompt records into the run summary (definitions of ``docs/algorithms.md`` §1.2).

    Let prompt j have C_j cycles, K_j committed tokens (= Σ over its cycles of (a+1), bonus/root included),
    drafted-depth sum S_j = Σ D, realised tree-depth sum T_j = Σ d, latency L_j and baseline latency B_j.

    * ``tau``                 = Σ_j K_j / Σ_j C_j  (mean over all cycles of a+1; ratio of totals)
    * ``tau_per_prompt_mean`` = mean_j K_j / C_j   (prompts with C_j > 0)
    * ``d_bar``               = Σ_j S_j / Σ_j C_j,   ``d_bar_tree`` = Σ_j T_j / Σ_j C_j
      (τ and the d̄'s are ``None`` when there are no cycles at all.)
    * ``latency_s`` / ``_median_s`` / ``_std_s``: mean, median, std (ddof=1; None if n < 2) of L_j over all
      records; the ``baseline_latency_*`` trio likewise over records with a baseline.
    * ``speedup`` = mean_{j∈P} B_j / mean_{j∈P} L_j, P = records with a baseline (``speedup_aggregation =
      "ratio_of_means"``, which equals the ratio of total latencies); ``speedup_per_prompt`` = mean, median,
      std (ddof=1), min, max, p10, p90 of B_j / L_j over P; ``speedup_n`` = |P|. All ``None`` when P is empty.
    * Timing repeats: a record may hold ``latency_repeats_s`` / ``baseline_latency_repeats_s`` (the app's
      ``timing.repeats``; L_j and B_j are then their medians). ``timing_repeats`` = the distinct repeat counts.
      ``timing_spread`` = the median, over paired prompts and both sides, of (max − min) / median of a prompt's
      repeats (``None`` with one repeat): the timer's own noise. On an idle machine it reads 0.01–0.03; above
      ``TIMING_SPREAD_MAX`` ``timing_warning`` says the timings are unreliable (a busy host shows here even when
      the load average does not).
    * ``speedup_median`` = median_{j∈P} B_j / L_j (the paired per-prompt median); ``speedup_ci`` = [lo, hi], the
      ``speedup_ci_level`` (95 %) two-level bootstrap interval of Σ B_j / Σ L_j (:func:`ratio_of_totals_ci`:
      prompts, then each prompt's repeats → median), described by ``speedup_ci_method``; ``speedup_ci_caveat``
      is a warning string when 0 < |P| < 5, else ``None``.
    * ``draft_s_total`` = Σ draft_s, ``verify_s_total`` = Σ verify_s, ``draft_frac`` = draft_s_total / Σ L_j,
      ``verify_frac`` likewise, ``target_forwards_mean`` = mean target forwards per prompt. These are ``None``
      if any record has the value missing/``None``.

    Raises:
        ValueError: on empty ``records``, missing required keys, or negative/non-finite values (latency must
            also be > 0).
    """
    if not records:
        raise ValueError("summarize() needs at least one record")

    cycles, committed, dsum, tsum, lat = [], [], [], [], []
    base_pairs: list[tuple[float, float]] = []  # (baseline, latency) for prompts with a baseline
    enc_pairs: list[tuple[float, float]] = []  # the same with each side's prompt encoding added
    base_reps: list[list[float]] = []  # per paired prompt: its baseline repeats ...
    lat_reps: list[list[float]] = []  # ... and its method repeats (one each without timing.repeats)
    opt: dict[str, list[float | None]] = {k: [] for k in _OPTIONAL_NUM}
    for rec in records:
        for k in _REQUIRED:
            if k not in rec:
                raise ValueError(f"record {rec.get('prompt_id')!r} lacks required key {k!r}")
        c = _num(rec, "cycles")
        cycles.append(c)
        committed.append(_num(rec, "committed"))
        dsum.append(_num(rec, "drafted_depth_sum"))
        tsum.append(_num(rec, "tree_depth_sum"))
        lt = _num(rec, "latency_s")
        if not lt:
            raise ValueError(f"record {rec['prompt_id']!r}: latency_s must be > 0")
        lat.append(lt)
        b = _num(rec, "baseline_latency_s", allow_none=True)
        if b is not None:
            if b == 0:
                raise ValueError(f"record {rec['prompt_id']!r}: baseline_latency_s must be > 0")
            base_pairs.append((b, lt))
            e, be = _num(rec, "encode_s", allow_none=True), _num(rec, "baseline_encode_s", allow_none=True)
            if e is not None and be is not None:
                enc_pairs.append((b + be, lt + e))
            base_reps.append(_repeats(rec, "baseline_latency_repeats_s", b))
            lat_reps.append(_repeats(rec, "latency_repeats_s", lt))
            if len(base_reps[-1]) != len(lat_reps[-1]):
                raise ValueError(f"record {rec['prompt_id']!r}: baseline and method have different repeat counts")
        for k in _OPTIONAL_NUM:
            opt[k].append(_num(rec, k, allow_none=True))

    n_cycles = sum(cycles)

    def per_cycle(total: float) -> float | None:
        return total / n_cycles if n_cycles > 0 else None

    per_prompt_tau = [k / c for k, c in zip(committed, cycles) if c > 0]
    lat_mean, lat_med, lat_std = _stats(lat)
    lat_total = float(sum(lat))

    out: dict[str, Any] = {
        "n_samples": len(records),
        "cycles_total": int(n_cycles),
        "committed_total": int(sum(committed)),
        "tau": per_cycle(sum(committed)),
        "tau_per_prompt_mean": float(np.mean(per_prompt_tau)) if per_prompt_tau else None,
        "d_bar": per_cycle(sum(dsum)),
        "d_bar_tree": per_cycle(sum(tsum)),
        "latency_s": lat_mean,
        "latency_median_s": lat_med,
        "latency_std_s": lat_std,
        "latency_total_s": lat_total,
    }

    base = [b for b, _ in base_pairs]
    b_mean, b_med, b_std = _stats(base)
    out.update(baseline_latency_s=b_mean, baseline_latency_median_s=b_med, baseline_latency_std_s=b_std)
    if base_pairs:
        paired_lat = [lt for _, lt in base_pairs]
        ratios = np.array([b / lt for b, lt in base_pairs], dtype=np.float64)
        out["speedup"] = float(np.mean(base) / np.mean(paired_lat))
        out["speedup_median"] = float(np.median(ratios))
        lo, hi = ratio_of_totals_ci(base_reps, lat_reps, SPEEDUP_N_BOOT, 1 - SPEEDUP_CI_LEVEL, SPEEDUP_CI_SEED)
        out["speedup_ci"] = [lo, hi]
        out["speedup_per_prompt"] = {
            "mean": float(ratios.mean()),
            "median": float(np.median(ratios)),
            "std": float(np.std(ratios, ddof=1)) if ratios.size >= 2 else None,
            "min": float(ratios.min()),
            "max": float(ratios.max()),
            "p10": float(np.percentile(ratios, 10)),
            "p90": float(np.percentile(ratios, 90)),
        }
    else:
        out["speedup"] = out["speedup_median"] = out["speedup_ci"] = None
        out["speedup_per_prompt"] = None
    out["speedup_aggregation"] = "ratio_of_means"
    out["speedup_n"] = len(base_pairs)
    out["speedup_ci_level"] = SPEEDUP_CI_LEVEL
    out["speedup_ci_method"] = SPEEDUP_CI_METHOD
    out["speedup_ci_caveat"] = (
        f"CI over {len(base_pairs)} prompt(s) < {SPEEDUP_CI_MIN_PROMPTS}: too few to resample; do not trust it"
        if 0 < len(base_pairs) < SPEEDUP_CI_MIN_PROMPTS
        else None
    )
    out["timing_repeats"] = sorted({len(r) for r in lat_reps}) or None  # repeats per prompt (distinct counts)
    spreads = [(max(r) - min(r)) / float(np.median(r)) for r in (*base_reps, *lat_reps) if len(r) > 1]
    out["timing_spread"] = float(np.median(spreads)) if spreads else None
    out["timing_warning"] = (
        f"repeats of one prompt differ by {100 * out['timing_spread']:.1f} % (median) > "
        f"{100 * TIMING_SPREAD_MAX:.0f} %: timings unreliable"
        if out["timing_spread"] is not None and out["timing_spread"] > TIMING_SPREAD_MAX
        else None
    )

    def total(k: str) -> float | None:
        vals = opt[k]
        return None if any(v is None for v in vals) else float(sum(vals))  # type: ignore[arg-type]

    draft_total, verify_total, fwd_total = total("draft_s"), total("verify_s"), total("target_forwards")
    out["draft_s_total"] = draft_total
    out["verify_s_total"] = verify_total
    out["draft_frac"] = draft_total / lat_total if draft_total is not None else None
    out["verify_frac"] = verify_total / lat_total if verify_total is not None else None
    out["target_forwards_mean"] = fwd_total / len(records) if fwd_total is not None else None
    enc_total = total("encode_s")
    out["encode_s"] = enc_total / len(records) if enc_total is not None else None
    out["speedup_with_encode"] = (  # the wider timed scope: prompt encoding (text encoder; Tar's LM) included
        float(sum(b for b, _ in enc_pairs) / sum(lt for _, lt in enc_pairs))
        if base_pairs and len(enc_pairs) == len(base_pairs)
        else None
    )
    out |= reference_summary(records)
    out |= aa_summary(records)
    out |= throughput(records)
    out["jacobi"] = jacobi_summary(records)
    return out


def reference_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The speedup against the reference implementation's AR (``timing.reference_baseline``), computed as the
    ``speedup`` block is: over P_R = the records with a ``reference_latency_s`` R_j (medians of their repeats),

    * ``reference_latency_s`` / ``_median_s`` / ``_std_s``: mean, median, std (ddof=1) of R_j;
    * ``speedup_ref`` = Σ_{P_R} R_j / Σ_{P_R} L_j (ratio of totals), ``speedup_ref_median`` = median R_j / L_j,
      ``speedup_ref_ci`` = the same two-level bootstrap as ``speedup_ci`` (:func:`ratio_of_totals_ci` over the
      repeats ``reference_latency_repeats_s`` paired with ``latency_repeats_s``), ``speedup_ref_n`` = |P_R|;
    * ``reference_over_baseline`` = Σ R_j / Σ B_j over the records with both: how many times slower the reference's
      AR step is than the project's (so ``speedup_ref`` = ``speedup`` × this, over the same prompts);
    * ``reference_tokens_match_baseline``: whether both AR implementations decoded every prompt's same tokens.

    Every value is None without such records (``timing.reference_baseline`` off)."""
    pairs, ref_reps, lat_reps, both = [], [], [], []
    for rec in records:
        r = _num(rec, "reference_latency_s", allow_none=True)
        if r is None:
            continue
        if r == 0:
            raise ValueError(f"record {rec.get('prompt_id')!r}: reference_latency_s must be > 0")
        lt = float(rec["latency_s"])
        pairs.append((r, lt))
        ref_reps.append(_repeats(rec, "reference_latency_repeats_s", r))
        lat_reps.append(_repeats(rec, "latency_repeats_s", lt))
        if len(ref_reps[-1]) != len(lat_reps[-1]):
            raise ValueError(f"record {rec.get('prompt_id')!r}: reference and method have different repeat counts")
        b = _num(rec, "baseline_latency_s", allow_none=True)
        if b:
            both.append((r, b))
    r_mean, r_med, r_std = _stats([r for r, _ in pairs])
    out: dict[str, Any] = {
        "reference_latency_s": r_mean,
        "reference_latency_median_s": r_med,
        "reference_latency_std_s": r_std,
        "speedup_ref": None,
        "speedup_ref_median": None,
        "speedup_ref_ci": None,
        "speedup_ref_n": len(pairs),
        "reference_over_baseline": None,
        "reference_tokens_match_baseline": None,
    }
    if not pairs:
        return out
    ratios = np.array([r / lt for r, lt in pairs], dtype=np.float64)
    lo, hi = ratio_of_totals_ci(ref_reps, lat_reps, SPEEDUP_N_BOOT, 1 - SPEEDUP_CI_LEVEL, SPEEDUP_CI_SEED)
    out["speedup_ref"] = float(sum(r for r, _ in pairs) / sum(lt for _, lt in pairs))
    out["speedup_ref_median"] = float(np.median(ratios))
    out["speedup_ref_ci"] = [lo, hi]
    if both:
        out["reference_over_baseline"] = float(sum(r for r, _ in both) / sum(b for _, b in both))
    matches = [m for m in (rec.get("reference_tokens_match_baseline") for rec in records) if m is not None]
    out["reference_tokens_match_baseline"] = all(matches) if matches else None
    return out


def aa_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The A/A control (``timing.aa``): the AR baseline timed against itself in the speedup's interleaving, summarised
    as the speedup is. Over P_A = the records with an ``aa_latency_s`` A_j and a ``baseline_latency_s`` B_j (medians of
    their repeats):

    * ``aa_latency_s``: mean A_j; ``aa_ratio`` = Σ_{P_A} B_j / Σ_{P_A} A_j (ratio of totals), ``aa_ratio_median`` =
      median B_j / A_j, ``aa_ratio_ci`` = the same two-level bootstrap as ``speedup_ci`` (:func:`ratio_of_totals_ci`
      over ``baseline_latency_repeats_s`` paired with ``aa_latency_repeats_s``), ``aa_ratio_n`` = |P_A|;
    * ``aa_warning``: a string when ``aa_ratio_ci`` excludes 1 — both sides ran the same computation, so an interval
      that excludes 1 says the timing itself favours one side at this level (the speedup's interval carries the
      same bias) —, else None.

    Both sides decode the same tokens, so ``aa_ratio`` is 1 up to timing noise: its interval is the noise floor of
    the run's speedup. Every value is None (``aa_ratio_n`` 0) without such records (``timing.aa`` off)."""
    base_reps, aa_reps, pairs = [], [], []
    for rec in records:
        a = _num(rec, "aa_latency_s", allow_none=True)
        b = _num(rec, "baseline_latency_s", allow_none=True)
        if a is None or b is None:
            continue
        if a == 0 or b == 0:
            raise ValueError(f"record {rec.get('prompt_id')!r}: aa_latency_s and baseline_latency_s must be > 0")
        pairs.append((b, a))
        base_reps.append(_repeats(rec, "baseline_latency_repeats_s", b))
        aa_reps.append(_repeats(rec, "aa_latency_repeats_s", a))
        if len(base_reps[-1]) != len(aa_reps[-1]):
            raise ValueError(f"record {rec.get('prompt_id')!r}: baseline and A/A side have different repeat counts")
    out: dict[str, Any] = {
        "aa_latency_s": None,
        "aa_ratio": None,
        "aa_ratio_median": None,
        "aa_ratio_ci": None,
        "aa_ratio_n": len(pairs),
        "aa_warning": None,
    }
    if not pairs:
        return out
    lo, hi = ratio_of_totals_ci(base_reps, aa_reps, SPEEDUP_N_BOOT, 1 - SPEEDUP_CI_LEVEL, SPEEDUP_CI_SEED)
    ratio = float(sum(b for b, _ in pairs) / sum(a for _, a in pairs))
    out |= {
        "aa_latency_s": float(np.mean([a for _, a in pairs])),
        "aa_ratio": ratio,
        "aa_ratio_median": float(np.median([b / a for b, a in pairs])),
        "aa_ratio_ci": [lo, hi],
        "aa_warning": aa_warning(ratio, lo, hi, len(pairs)),
    }
    return out


def aa_warning(ratio: float, lo: float, hi: float, n: int) -> str | None:
    """The A/A flag: a warning when the interval [lo, hi] of the AR baseline against itself, over ``n`` prompts,
    excludes 1 (else None); over fewer than ``SPEEDUP_CI_MIN_PROMPTS`` prompts it says the interval is too few to
    trust (one prompt with one repeat gives a zero-width interval)."""
    if lo <= 1.0 <= hi:
        return None
    few = ""
    if n < SPEEDUP_CI_MIN_PROMPTS:
        few = f" (CI over {n} < {SPEEDUP_CI_MIN_PROMPTS} prompts: too few to resample)"
    return (
        f"A/A control: the AR baseline against itself read {ratio:.3f} [{lo:.3f}, {hi:.3f}], an interval that "
        f"excludes 1{few}: the timing favours one side at this level; the speedup's interval carries the same bias"
    )


def jacobi_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Jacobi loops' counters pooled over a run (``policy=sjd|scd|gsd|sjd_pac``; None for other policies): the
    configured ``window``, ``init``, ``redraw``, ``rule`` (and sjd_pac's ``branch``, ``tree_depth``, ``variant``; the
    first record's), the mean verified window
    ``window_mean`` (chain nodes per forward, weighted by forwards), ``accept_hist`` (forwards that accepted a = 0, 1, …
    drafts, summed) and ``kept_frac`` (coupled redraws that kept their draft, pooled).

    The step that ran each image (a record's ``stats.step``: ``eager`` — the host loop —, ``fixed-shape`` or
    ``graph`` — the device-resident step of ``algorithm.methods.jacobi.step``): ``step_counts`` = {step: records},
    summed;
    ``step`` = the one step when every record that names one agrees, ``mixed`` when they differ (a run resumed on
    another machine under ``engine.graphs.step=auto``), None when none names one (records from before the key).
    ``idle_forwards`` = Σ the device-resident step's forwards launched past an image's end (at most one per image;
    they are not in ``target_forwards``), None when no record counts them (the eager loop launches none)."""
    rows = [r["stats"] for r in records if isinstance(r.get("stats"), dict) and "accept_hist" in r["stats"]]
    if not rows:
        return None
    hist: list[int] = []
    for st in rows:
        for a, n in enumerate(st["accept_hist"]):
            hist += [0] * (a + 1 - len(hist))
            hist[a] += int(n)
    forwards = sum(int(st.get("target_forwards") or 0) for st in rows)
    window = sum(float(st["window_mean"]) * int(st.get("target_forwards") or 0) for st in rows)
    coupled = sum(int(st.get("coupled") or 0) for st in rows)
    kept = sum(int(st.get("kept") or 0) for st in rows)
    steps: dict[str, int] = {}
    for st in rows:
        if st.get("step") is not None:
            steps[str(st["step"])] = steps.get(str(st["step"]), 0) + 1
    idle = [int(st["idle_forwards"]) for st in rows if st.get("idle_forwards") is not None]
    first = rows[0]
    return {
        **{k: first.get(k) for k in ("window", "init", "redraw", "rule")},
        **{k: first[k] for k in ("branch", "tree_depth", "variant") if k in first},  # policy=sjd_pac
        "window_mean": window / forwards if forwards else None,
        "accept_hist": hist,
        "kept_frac": kept / coupled if coupled else None,
        "step": (next(iter(steps)) if len(steps) == 1 else "mixed") if steps else None,
        "step_counts": dict(sorted(steps.items())),
        "idle_forwards": sum(idle) if idle else None,
    }


def throughput(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Images and tokens per second of decoding, for the method and (when every record has one) the baseline.

    Seconds are the timed scope's: a batched record (``batch`` set, ``decode.batch_size > 1``) counts its window's
    wall time once per window (``batch.window`` ids; ``window_s`` / ``baseline_window_s``), a record decoded alone
    its latency. Tokens per image = ``committed + 1`` (the prefill's token). ``throughput_speedup`` = method /
    baseline images per second over the same prompts (at B = 1 it equals the ratio-of-means ``speedup``)."""
    images = len(records)
    tokens = sum(int(r["committed"]) + 1 for r in records)
    secs, base_secs, seen = 0.0, 0.0, set()
    has_base = images > 0
    for r in records:
        b = r.get("batch")
        if b:
            if b["window"] in seen:
                continue
            seen.add(b["window"])
            secs += float(b["window_s"])
            base = b.get("baseline_window_s")
        else:
            secs += float(r["latency_s"])
            base = r.get("baseline_latency_s")
        has_base = has_base and base is not None
        base_secs += float(base) if base is not None else 0.0
    ips = images / secs if secs > 0 else None
    bips = images / base_secs if has_base and base_secs > 0 else None
    return {
        "throughput_images_per_s": ips,
        "throughput_tokens_per_s": tokens / secs if secs > 0 else None,
        "baseline_throughput_images_per_s": bips,
        "baseline_throughput_tokens_per_s": tokens / base_secs if bips is not None else None,
        "throughput_speedup": ips / bips if ips is not None and bips is not None else None,
    }


# ----------------------------------------------------------------------------------------------------
# bootstrap: the one implementation (summaries, ``adtbench.reporting.tables`` and ``analysis/`` resample through it)
# ----------------------------------------------------------------------------------------------------

BOOT_CHUNK_ELEMENTS = 4_000_000  # bound on the elements of one chunk of resampled data (32 MB; results unchanged)


def _clusters(data: np.ndarray | Sequence[Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """``(rows [P, ...], None)`` for one observation per cluster, else ``(padded [P, R_max, ...], counts [P])``
    with the missing repeats of shorter clusters NaN-padded."""
    if isinstance(data, np.ndarray):
        rows = np.asarray(data, dtype=np.float64)
        if rows.ndim == 0 or rows.shape[0] == 0:
            raise ValueError("the bootstrap needs at least one cluster")
        return rows, None
    reps = [np.asarray(x, dtype=np.float64) for x in data]
    if not reps:
        raise ValueError("the bootstrap needs at least one cluster")
    if any(r.ndim == 0 or r.shape[0] == 0 for r in reps) or len({r.shape[1:] for r in reps}) > 1:
        raise ValueError("every cluster needs ≥ 1 repeat, all repeats of the same shape")
    counts = np.array([r.shape[0] for r in reps])
    if counts.max() == 1:
        return np.stack([r[0] for r in reps]), None
    padded = np.full((len(reps), int(counts.max()), *reps[0].shape[1:]), np.nan)
    for j, r in enumerate(reps):
        padded[j, : r.shape[0]] = r
    return padded, counts


def bootstrap_distribution(
    data: np.ndarray | Sequence[Any],
    stat: Callable[[np.ndarray], Any],
    n_boot: int = 1000,
    seed: int = 0,
    *,
    vectorized: bool = False,
) -> np.ndarray:
    """Bootstrap statistics of a one- or two-level (hierarchical) bootstrap over clusters (prompts).

    ``data``: an array whose axis 0 indexes P clusters with one observation each (a scalar or a row), or a
    sequence of P arrays ``[R_j, ...]`` holding the R_j repeated observations of cluster j.

    * Level 1 (clusters): ``rng.integers(0, P, size=(n_boot, P))`` with ``rng = default_rng(seed)``, drawn in
      one call before anything else, so every caller with the same P, ``n_boot`` and seed resamples the
      same prompts.
    * Level 2 (repeats), only when some R_j > 1: each drawn cluster draws R_j of its own repeats with
      replacement (whole rows, so the columns of one repeat stay paired) and is replaced by their element-wise
      median. With every R_j = 1 nothing is drawn and the result equals the one-level bootstrap of the rows.

    ``stat`` maps one resample ``[P, ...]`` to a scalar or a vector; with ``vectorized`` it maps a chunk of
    resamples ``[b, P, ...]`` to ``[b]`` or ``[b, m]``. Returns the ``[n_boot]`` (or ``[n_boot, m]``)
    statistics, in resample order. Deterministic for a given ``seed``.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    values, counts = _clusters(data)
    p = values.shape[0]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, p, size=(n_boot, p))
    step = max(1, BOOT_CHUNK_ELEMENTS // max(1, values.size))
    ragged = counts is not None and bool((counts != counts.max()).any())
    out = []
    for start in range(0, n_boot, step):
        ix = idx[start : start + step]  # [b, P]
        if counts is None:
            x = values[ix]  # [b, P, ...]
        else:
            r_max = values.shape[1]
            n = counts[ix][..., None]  # [b, P, 1] repeats of each drawn cluster
            j = (rng.random((*ix.shape, r_max)) * n).astype(np.int64)  # uniform in [0, R_j)
            x = values[ix[..., None], j]  # [b, P, R_max, ...]
            if ragged:  # draws beyond a cluster's own R_j do not count
                keep = (np.arange(r_max) < n).reshape(*j.shape, *(1,) * (x.ndim - 3))
                x = np.nanmedian(np.where(keep, x, np.nan), axis=2)
            else:
                x = np.median(x, axis=2)
        if vectorized:
            out.append(np.asarray(stat(x), dtype=np.float64))
        else:
            out.append(np.array([np.asarray(stat(xi), dtype=np.float64) for xi in x]))
    return np.concatenate(out, axis=0)


def percentile_interval(boots: np.ndarray, alpha: float = 0.05) -> np.ndarray:
    """The (α/2, 1 − α/2) percentiles of the finite bootstrap statistics: ``[2]`` for ``[n_boot]`` input,
    ``[m, 2]`` for ``[n_boot, m]`` (one interval per column); NaN where no statistic is finite."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    b = np.asarray(boots, dtype=np.float64)
    cols = b.reshape(b.shape[0], -1)
    out = np.full((cols.shape[1], 2), np.nan)
    for c in range(cols.shape[1]):
        fin = cols[:, c][np.isfinite(cols[:, c])]
        if fin.size:
            out[c] = np.percentile(fin, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return out[0] if b.ndim == 1 else out


def bootstrap_ci(
    values: Iterable[Any] | np.ndarray,
    stat: Callable[[np.ndarray], Any] = np.mean,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``stat`` over prompts (:func:`bootstrap_distribution`, one level).

    Draws ``n_boot`` resamples of the n rows of ``values`` (axis 0) with replacement, evaluates ``stat`` on
    each, and returns the (α/2, 1-α/2) percentiles of those statistics. Rows may be vectors, e.g. pass
    ``np.c_[baseline, latency]`` with ``stat=lambda a: a[:, 0].mean() / a[:, 1].mean()`` for a CI of the
    ratio-of-means speedup (prompts resampled as pairs). Deterministic for a given ``seed``.
    """
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    if arr.ndim == 0 or arr.shape[0] == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo, hi = percentile_interval(bootstrap_distribution(arr, stat, n_boot, seed), alpha)
    return float(lo), float(hi)


def _ratio_of_sums(x: np.ndarray) -> np.ndarray:
    """``[b, P, 2]`` resamples → ``[b]`` ratios Σ column 0 / Σ column 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return x[..., 0].sum(axis=-1) / x[..., 1].sum(axis=-1)


def ratio_of_totals_ci(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Two-level bootstrap CI of Σ_j med(numerator_j) / Σ_j med(denominator_j) (e.g. the speedup: baseline
    over method latency). ``numerator[j]`` and ``denominator[j]`` are prompt j's repeated timings, paired by
    repeat (repeat r of both was timed back to back, so they are resampled together). With one repeat per
    prompt this is the prompt bootstrap of the ratio of totals; repeats that disagree widen the interval."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} numerator vs {len(denominator)} denominator prompts")
    clusters = []
    for j, (a, b) in enumerate(zip(numerator, denominator)):
        if len(a) != len(b):
            raise ValueError(f"prompt {j}: {len(a)} numerator vs {len(b)} denominator repeats")
        clusters.append(np.c_[np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)])
    lo, hi = percentile_interval(bootstrap_distribution(clusters, _ratio_of_sums, n_boot, seed, vectorized=True), alpha)
    return float(lo), float(hi)
