"""``window: cost`` — the machine's choice of L: ``calibrate_window`` decodes the calibration captions (``captions``)
at every L of the grid; the statistics here turn the measured τ(L) into a choice (``choose_window``) and compare two
calibrations (``calibrations_agree``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from adtbench.algorithm.methods.jacobi.captions import CALIBRATION_GRID
from adtbench.algorithm.methods.jacobi.loop import JacobiParams, decode_jacobi
from adtbench.algorithm.verify import EXACT, AcceptanceRule
from adtbench.models.base import PromptInputs, Target
from adtbench.sampling_params import SamplingParams

# --------------------------------------------------------------------------------------------------------
# window: cost — the machine's choice of L
# --------------------------------------------------------------------------------------------------------


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest ``values`` in least squares (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def window_rates(taus: dict[int, float], cost: Any, overhead_steps: float) -> dict[int, float]:
    """Committed tokens per AR-step time for each L: τ(L) · t_step / (t_verify(L) + o · t_step)."""
    step = float(cost.step_ms)
    return {L: tau * step / (float(cost.t_verify(L)) + overhead_steps * step) for L, tau in taus.items()}


def ratio_estimate(counts: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """τ̂ = Σcᵢ / Σfᵢ over images i (cᵢ committed tokens in fᵢ forwards) and its standard error by the delta method,

        se(τ̂) = √(n / (n − 1) · Σ (cᵢ − τ̂ fᵢ)²) / Σfᵢ,

    which counts both the images' spread and each image's one path of random draws (0 for n < 2: no spread seen)."""
    n, c, f = len(counts), sum(c for c, _ in counts), max(1, sum(f for _, f in counts))
    tau = c / f
    if n < 2:
        return tau, 0.0
    return tau, math.sqrt(n / (n - 1) * sum((ci - tau * fi) ** 2 for ci, fi in counts)) / f


SAME_RATE_Z = 2.0
"""``choose_window``'s ``near``: the L whose rate is within this many standard errors of the chosen L's."""


def choose_window(
    taus: dict[int, float], cost: Any, overhead_steps: float, errors: dict[int, float] | None = None
) -> dict[str, Any]:
    """``{"L", "taus", "fit", "rates", "tau_se", "near"}``: τ(L) made non-decreasing in L (``isotonic``: a longer
    window never verifies fewer drafts, and a few calibration images are noisy), the rate of each L on ``cost`` and
    the best L (ties → the smaller). ``errors``: τ(L)'s standard errors (``ratio_estimate``; None: unknown, taken as
    0); ``near``: every L whose rate r(L) is within ``SAME_RATE_Z`` standard errors of the chosen L's,
    r(L*) − r(L) ≤ z · √(se_r(L)² + se_r(L*)²), se_r(L) = se_τ(L) · r(L) / fit(L) — the L a calibration of other
    draws (another machine's rounding, other captions) could as well choose."""
    Ls = sorted(taus)
    fit = dict(zip(Ls, isotonic([taus[L] for L in Ls]), strict=True))
    rates = window_rates(fit, cost, overhead_steps)
    best = max(Ls, key=lambda L: (rates[L], -L))
    se = {L: float((errors or {}).get(L, 0.0)) for L in Ls}
    rate_se = {L: se[L] * rates[L] / fit[L] if fit[L] > 0 else 0.0 for L in Ls}
    near = [L for L in Ls if rates[best] - rates[L] <= SAME_RATE_Z * math.hypot(rate_se[L], rate_se[best])]
    return {"L": best, "taus": taus, "fit": fit, "rates": rates, "tau_se": se, "near": near}


Z_AGREE = 4.0
"""``calibrations_agree``: two estimates of one τ(L) from the same captions (other paths of draws) differ by at most
this many combined standard errors, but for a chance of ≈ 10⁻⁴ (normal) to 10⁻³ (Student's t on 11 degrees of
freedom, the errors' own uncertainty at 12 captions) per L."""
P_AGREE = 1e-3
"""``calibrations_agree``: the level of the paired sign-flip test per L."""


def paired_sign_flip_p(
    fresh: Sequence[tuple[int, int]], shipped: Sequence[tuple[int, int]], draws: int = 100_000
) -> float:
    """The two-sided p-value of "two calibrations of one τ(L) on the same captions, each image's decode one path of
    draws from the same law" — a paired sign-flip test on the per-image differences dᵢ = cᵢ/fᵢ − c'ᵢ/f'ᵢ (per image
    counts (committed, forwards)). Under that hypothesis each dᵢ is symmetric about 0 (the two paths are exchangeable:
    they share a prefix, then diverge where one CPU rounds a logit otherwise), so flipping signs at random gives the
    exact null law of |Σdᵢ|: p = P(|Σ sᵢdᵢ| ≥ |Σdᵢ|), over all 2^k signs of the k nonzero dᵢ (k ≤ 16) or ``draws``
    seeded random ones. The images' own spread cancels in the pairs, so a code change that moves every image's τ is
    seen where the unpaired standard error would hide it; equal counts (the machine that shipped them) give p = 1."""
    if len(fresh) != len(shipped):
        raise ValueError(f"{len(fresh)} fresh images against {len(shipped)} shipped")
    d = np.array([c / max(1, f) - c2 / max(1, f2) for (c, f), (c2, f2) in zip(fresh, shipped, strict=True)])
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    observed = abs(d.sum()) * (1 - 1e-12)  # ties count as at least as extreme
    if d.size <= 16:
        signs = 1 - 2 * ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1)
    else:
        signs = np.random.default_rng(0).choice([-1.0, 1.0], size=(draws, d.size))
    return float((np.abs(signs @ d) >= observed).mean())


def calibrations_agree(
    fresh: Sequence[tuple[int, int]], shipped: Sequence[tuple[int, int]]
) -> tuple[bool, float, float]:
    """(agree, z, p) of two calibrations of one τ(L) on the same captions (per image counts): z = (τ_fresh −
    τ_shipped) / √(se_fresh² + se_shipped²) (``ratio_estimate``), p = ``paired_sign_flip_p``; they agree when
    |z| ≤ ``Z_AGREE`` and p ≥ ``P_AGREE``. Equal counts give z = 0, p = 1."""
    (t_f, se_f), (t_s, se_s) = ratio_estimate(fresh), ratio_estimate(shipped)
    se = math.hypot(se_f, se_s)
    z = (t_f - t_s) / se if se > 0 else (0.0 if t_f == t_s else math.inf)
    p = paired_sign_flip_p(fresh, shipped)
    return abs(z) <= Z_AGREE and p >= P_AGREE, z, p


__all__ = [
    "P_AGREE",
    "SAME_RATE_Z",
    "Z_AGREE",
    "calibrations_agree",
    "choose_window",
    "isotonic",
    "paired_sign_flip_p",
    "ratio_estimate",
    "window_rates",
]


@torch.no_grad()
def calibrate_window(
    target: Target,
    inputs: Sequence[PromptInputs],
    sp: SamplingParams,
    params: JacobiParams,
    cost: Any,
    generator: torch.Generator,
    rule: AcceptanceRule = EXACT,
    drafter: Any = None,
) -> dict[str, Any]:
    """``window: cost``: the L maximising committed tokens per unit of time on this machine,

        L* = argmax_L τ(L) / (t_verify(L) + o),

    t_verify from the measured cost model (``cost.CostModel``), o = ``overhead_steps`` AR steps of engine work per
    forward, and τ(L) measured by decoding the calibration prompts ``inputs`` with a fixed window L for every L of
    ``CALIBRATION_GRID`` in [``window_min``, ``window_max``] over the first ``calibration_tokens`` tokens of each image
    (``generator`` reseeded to 0 before each, so τ(L) reads no clock), made non-decreasing (``choose_window``), with its
    standard error over the images (``ratio_estimate``). τ(L) is an estimate from one path of random draws per image: a
    machine whose kernels round a logit otherwise draws another path, so two machines agree within the error, not bit
    for bit. The cap bounds the calibration's cost on large images (a 7B model decoding 24 × 8 whole 2 352-token images
    would take many minutes); its price is τ measured on the images' top rows only. τ(L) is measured rather than
    predicted from a survival curve: a longer window also refines its far drafts for more forwards before they are
    tested, which a per-draft estimate taken at one L does not see. Returns ``choose_window``'s dict and ``counts``: {L:
    [(committed, forwards) per image]}, the raw data (the harness caches the measured τ(L); a shipped table keeps the
    counts)."""
    grid = [L for L in CALIBRATION_GRID if params.window_min <= L <= params.window_max]
    grid = grid or [params.window_min]
    taus: dict[int, float] = {}
    errors: dict[int, float] = {}
    counts_by_L: dict[int, list[tuple[int, int]]] = {}
    for L in grid:
        p = dataclasses.replace(params, window=L)  # the host loop (no make_step): τ(L) is the law's, no graphs per L
        counts = []
        for x in inputs:
            generator.manual_seed(0)
            res = decode_jacobi(target, x, sp, generator, p, rule, "auto", drafter, limit=params.calibration_tokens)
            counts.append((res.committed, len(res.cycles)))
        taus[L], errors[L] = ratio_estimate(counts)
        counts_by_L[L] = counts
    return choose_window(taus, cost, params.overhead_steps, errors) | {"counts": counts_by_L}
