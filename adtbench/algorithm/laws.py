"""The law-test machinery: exact laws of small images, χ² against them, and the power each test has.

Every lossless path (the tree policies, Jacobi's ``sjd`` / ``scd``, SJD-PAC's exact variant, LANTERN at δ = 0) is
tested the same way (``tests/test_laws.py``; ``adtbench check``'s law test, ``harness.check``, for any registered
method). Needs scipy (the ``metrics`` extra), imported when a test runs:

1. **The exact law.** :func:`exact_law` enumerates every image of a tiny float64 target (a few tokens over 3 or 4 codes;
   any layout, forced end-of-line tokens included; any temperature / top-k / top-p) with positive probability under
   AR: level by level, one tree forward per first token and level, every node's processed row the exact conditional
   there.
2. **The cells.** :func:`cells` keeps each outcome expected ≥ ``min_expected`` times in N draws as a cell of its own
   and pools the rest into one (dropped when it is empty): the χ² approximation's usual condition, and a knob that
   trades resolution for degrees of freedom.
3. **The test.** Pearson's χ² of the N observed images over the cells against N · the exact law; the policy fails
   when p < ``ALPHA`` (10⁻³).
4. **The power** (:func:`detectable_tv`). Under an alternative law p′ the statistic is approximately noncentral χ²
   with k − 1 degrees of freedom (k cells) and noncentrality λ = N·w², Cohen's w² = Σ (p′ − p)² / p over the cells.
   By Cauchy–Schwarz (Σ |p′ − p|)² ≤ Σ (p′ − p)²/p · Σ p, so w ≥ 2·TV(p′, p) — with equality for the least visible
   alternative (mass moved proportionally between two halves of the law) — and every law at total-variation distance
   ≥ d from AR's *over the cells* is rejected with probability ≥ ``POWER`` (0.9) once
   P(χ²_{k−1}(N·4d²) > χ²_{k−1, 1−α}) ≥ 0.9. :func:`detectable_tv` solves that for d: the distance the test detects
   at 90 % power, which each test prints, records (``record_property("law", …)``, shown in pytest's summary by
   ``tests/conftest.py``) and asserts against its stated bound. TV over the cells ≤ TV over whole images (pooling
   only merges outcomes), so the pooled mass is printed too: a test sees nothing that moves mass only inside it.

The negative controls are the real failure modes, planted into the library's code paths (monkeypatched or as an
``AcceptanceRule``), and each must fail the same test at the same N (p < 10⁻³).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any

import torch

from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.verify import AcceptanceRule
from adtbench.sampling_params import SamplingParams

ALPHA = 1e-3
POWER = 0.9
Outcome = Hashable


@lru_cache(maxsize=256)
def detectable_tv(n: int, df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest total-variation distance d (over the test's cells) at which the χ² test of ``n`` draws with
    ``df`` degrees of freedom rejects at level ``alpha`` with probability ≥ ``power``: λ solves
    P(χ²_df(λ) > χ²_{df, 1−α}) = power, and d = √(λ / 4n) (module docstring: w ≥ 2·TV)."""
    return math.sqrt(_noncentrality(df, alpha, power) / (4 * n))


def _noncentrality(df: int, alpha: float, power: float) -> float:
    """λ with P(χ²_df(λ) > χ²_{df, 1−α}) = ``power``."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2

    crit = chi2.isf(alpha, df)
    return float(brentq(lambda x: ncx2.sf(crit, df, x) - power, 1e-9, 1e7))


SIM_RUNS = 2000
"""Simulated χ² tests per power evaluation (:func:`simulated_power`): a power near 0.9 to ± 0.007 (one s.e.)."""


def least_visible(probs: Any, tv: float, split: str = "heavy") -> Any:
    """A law at total variation ``tv`` from ``probs`` (the cells' probabilities, numpy) that the χ² test sees least:
    mass moved proportionally from one half of the cells to the other. ``split``: ``heavy`` — into the heaviest
    cells (heaviest first until they hold 1/2) from the rest: the variance of the statistic grows least there, and
    simulation finds it the least visible of these (power 0.872 at the noncentral approximation's 90 % TV on
    ``t1``); ``balanced`` — the halves as near mass 1/2 as the cells allow (each cell, heaviest first, into the
    lighter half), where w² = 4 tv² is smallest (module docstring)."""
    import numpy as np

    order, half = np.argsort(-probs, kind="stable"), np.zeros(len(probs), dtype=bool)
    if split == "heavy":
        half[order[: int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1]] = True
    else:
        mass = [0.0, 0.0]
        for i in order:
            side = int(mass[1] < mass[0])
            half[i] = bool(side)
            mass[side] += float(probs[i])
    pa = float(probs[half].sum())
    return np.where(half, probs * (1 + tv / pa), probs * (1 - tv / (1 - pa)))


SPLITS = ("heavy", "balanced")


def simulated_power(probs: Any, n: int, tv: float, runs: int = SIM_RUNS, seed: int = 0, alpha: float = ALPHA) -> float:
    """The fraction of ``runs`` simulated χ² tests (``n`` draws from a :func:`least_visible` law at ``tv``, against
    ``probs`` over the same cells, k − 1 df) that reject at ``alpha``, the smaller over its ``SPLITS``: the test's
    power there, seeded."""
    import numpy as np
    from scipy.stats import chi2

    p = np.asarray(probs, dtype=np.float64)
    p = p / p.sum()
    crit = chi2.isf(alpha, len(p) - 1)
    power = 1.0
    for split in SPLITS:
        obs = np.random.default_rng(seed).multinomial(n, least_visible(p, tv, split), size=runs)
        power = min(power, float((((obs - n * p) ** 2 / (n * p)).sum(1) > crit).mean()))
    return power


@lru_cache(maxsize=256)
def _simulated_tv(probs: tuple[float, ...], n: int, power: float) -> float:
    approx = detectable_tv(n, len(probs) - 1, power=power)
    if simulated_power(probs, n, approx) >= power:
        return approx
    lo, hi = approx, 1.05 * approx
    while simulated_power(probs, n, hi) < power:
        lo, hi = hi, 1.05 * hi
    for _ in range(5):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if simulated_power(probs, n, mid) >= power else (mid, hi)
    return hi


def simulated_tv(probs: Any, n: int, power: float = POWER) -> float:
    """The smallest TV at which the χ² test of ``n`` draws over cells of probabilities ``probs`` rejects the least
    visible alternative in a fraction ≥ ``power`` of :data:`SIM_RUNS` seeded simulations, or the noncentral
    approximation (:func:`detectable_tv`) where the simulation confirms it (bisection above it, to 0.2 %; cached)."""
    return _simulated_tv(tuple(round(float(x), 15) for x in probs), n, power)


def draws_for(tv: float, df: int, alpha: float = ALPHA, power: float = POWER) -> int:
    """The smallest N at which a χ² test with ``df`` degrees of freedom detects TV ``tv`` (:func:`detectable_tv`)."""
    return math.ceil(_noncentrality(df, alpha, power) / (4 * tv * tv))


def cells(law: dict[Outcome, float], n: int, min_expected: float = 5.0) -> tuple[list[Outcome], list[Outcome]]:
    """(outcomes kept as their own cells: expected ≥ ``min_expected`` in ``n`` draws, the pooled rest)."""
    keys = [k for k, p in law.items() if p * n >= min_expected]
    return keys, [k for k, p in law.items() if p * n < min_expected]


@dataclass(frozen=True)
class LawResult:
    """One law test: ``name``, draws ``n``, cells ``k`` (df = k − 1), the pooled cell's exact mass, the TV detected
    at 90 % power over the cells (``tv90``), the χ² p-value, and the TV of the empirical law from the exact one
    over the cells (sampling noise included: ≈ √(k / 2πn) for an exact policy)."""

    name: str
    n: int
    k: int
    pooled: float
    tv90: float
    pvalue: float
    tv_seen: float

    def line(self) -> str:
        return (
            f"law {self.name}: N = {self.n}, {self.k} cells (pooled mass {self.pooled:.3f}), TV detected at 90 % "
            f"power {self.tv90:.4f}, p = {self.pvalue:.3g}, TV seen {self.tv_seen:.4f}"
        )


def chi2_law(name: str, counts: Counter, law: dict[Outcome, float], n: int, min_expected: float = 5.0) -> LawResult:
    """Pooled χ² of ``counts`` (outcome → count over ``n`` draws) against ``n · law`` and its power (module
    docstring). An outcome outside ``law``'s support counts into the pooled cell (expected 0 there would make any
    such draw a certain rejection; the pooled cell is never empty then)."""
    from scipy.stats import chisquare

    keys, rest = cells(law, n, min_expected)
    seen = sum(counts.values())
    assert seen == n, (seen, n)
    kept = set(keys)
    obs = [counts.get(k, 0) for k in keys] + [n - sum(counts.get(k, 0) for k in keys)]
    exp = [law[k] * n for k in keys] + [sum(law[k] for k in rest) * n]
    if exp[-1] == 0 and obs[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    elif exp[-1] == 0:  # drew an impossible image: as certain a rejection as χ² can state
        exp[-1] = 1e-12 * n
    pooled = max(0.0, 1.0 - sum(law[k] for k in kept))
    pvalue = float(chisquare(obs, exp).pvalue)
    tv = 0.5 * sum(abs(o - e) for o, e in zip(obs, exp)) / n
    tv90 = max(detectable_tv(n, len(obs) - 1), simulated_tv([e / n for e in exp], n))
    return LawResult(name, n, len(obs), pooled, tv90, pvalue, tv)


def report(result: LawResult, record: Callable[[str, object], None] | None = None) -> LawResult:
    """Print ``result`` (``pytest -s``) and record it (``record_property``: ``tests/conftest.py`` lists every law
    test's line at the end of the run, xdist workers included)."""
    print(result.line())
    if record is not None:
        record("law", result.line())
    return result


# ---------------------------------------------------------------------------------------------------------
# exact laws by enumeration
# ---------------------------------------------------------------------------------------------------------


def _ancestors(parents: list[int]) -> torch.Tensor:
    """Ancestor-or-self mask ``[n, n]`` of a tree in BFS order (each parent before its children)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
    return mask


def exact_law(
    target: Any, inputs: Any, sp: SamplingParams, n_tokens: int | None = None
) -> dict[tuple[int, ...], float]:
    """AR's probability of every ``n_tokens``-token image prefix (default: the whole image) with positive
    probability under ``sp``: for each first token, the tree of all positive-probability continuations is grown
    one level per forward (a fresh prefill each: ``verify_forward`` reads the committed prefix only), and a node's
    processed row is AR's exact conditional at its generation index (``depth + 1``)."""
    lay = target.layout
    n_tokens = lay.num_gen_tokens if n_tokens is None else n_tokens
    res = target.start(inputs, 1)
    p0 = process_logits(res.logits[:, None], 0, lay, sp)[0].double().softmax(-1)
    law: dict[tuple[int, ...], float] = {}
    for x0 in torch.nonzero(p0 > 0)[:, 0].tolist():
        tokens, parents, prob = [x0], [-1], [float(p0[x0])]
        frontier = [0]
        for _ in range(1, n_tokens):
            mask = _ancestors(parents)
            depth = mask.sum(1) - 1
            target.start(inputs, len(tokens))
            raw, _ = target.verify_forward(torch.tensor(tokens), mask, depth)
            rows = process_logits(raw[:, frontier], depth[frontier] + 1, lay, sp).double().softmax(-1)
            nxt = []
            for u, row in zip(frontier, rows):
                for y in torch.nonzero(row > 0)[:, 0].tolist():
                    tokens.append(y)
                    parents.append(u)
                    prob.append(prob[u] * float(row[y]))
                    nxt.append(len(tokens) - 1)
            frontier = nxt
        for u in frontier:
            path, v = [], u
            while v >= 0:
                path.append(tokens[v])
                v = parents[v]
            law[tuple(reversed(path))] = prob[u]
    total = sum(law.values())
    assert abs(total - 1) < 1e-9, total
    return law


def marginal(law: dict[tuple[int, ...], float], positions: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    """The exact law of the tokens at ``positions`` (a function of the image: its TV ≤ the image's)."""
    out: dict[tuple[int, ...], float] = {}
    for img, p in law.items():
        key = tuple(img[i] for i in positions)
        out[key] = out.get(key, 0.0) + p
    return out


def categorical_law(p: torch.Tensor) -> dict[int, float]:
    """``{i: p_i}`` of a probability vector (positive entries)."""
    return {i: float(v) for i, v in enumerate(p.tolist()) if v > 0}


def pairs_law(joint: torch.Tensor) -> dict[tuple[int, int], float]:
    """``{(i, j): P_ij}`` of a joint probability matrix (positive entries)."""
    V, W = joint.shape
    return {(i, j): float(joint[i, j]) for i, j in product(range(V), range(W)) if joint[i, j] > 0}


# ---------------------------------------------------------------------------------------------------------
# planted failure modes (the negative controls)
# ---------------------------------------------------------------------------------------------------------


def warp(residual: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """A residual re-processed by the sampling warper, as SJD's, GSD's and SCD-janus's code does: log, temperature,
    top-k, top-p applied to norm(max(p − q, 0)) again (rows ``[m, V]``; unnormalised in, normalised out)."""
    logits = residual.clamp_min(0).log()
    if sp.temperature != 1.0:
        logits = logits / sp.temperature
    from adtbench.algorithm.sampling import top_k_filter, top_p_filter

    out = top_p_filter(top_k_filter(logits, sp.top_k), sp.top_p).softmax(-1)
    return torch.where(residual.sum(-1, keepdim=True) > 0, out, residual)


class WarpedResidual(AcceptanceRule):
    """The exact acceptance probabilities with the residual re-processed by the warper (:func:`warp`): lossy when
    the warper is not the identity (T ≠ 1, top-k below the residual's support, top-p < 1)."""

    name = "warped-residual"
    lossless = False

    def __init__(self, sp: SamplingParams) -> None:
        self.sp = sp

    def point_mass_rows(self, p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acc, residual = super().point_mass_rows(p, x)
        return acc, warp(residual, self.sp)

    def proposal_rows(
        self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor, px: torch.Tensor, qx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        acc, residual = super().proposal_rows(p, x, q, px, qx)
        return acc, warp(residual, self.sp)
