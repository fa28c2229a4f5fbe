"""Grid regions for MuLo-SD local resampling and ZipAR-style parallel schedules.

Positions are raster indices on an image grid of ``H`` rows × ``W`` columns: ``u = row·W + col``, N = H·W.
This module is pure (torch / numpy / stdlib only) and holds the position arithmetic of one MuLo-SD cycle
(docs ``mulo_sd.md`` A.2 steps 4-6) and of ZipAR (ICML 2025):

- ``pooled_accept``: the pooled threshold test, eq. 5 (step 4);
- ``expand_rejections``: the local expansion R_X of the rejected set, eq. 6-7 (step 5);
- ``islands``: the 8-connected components ("rejection islands") of R_X (step 6, v2);
- ``window_schedule`` / ``island_schedule``: which positions are generated together at each parallel
  step, under the ZipAR window rule, for a whole grid, a sub-mask, or a set of islands.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["expand_rejections", "island_schedule", "islands", "pooled_accept", "window_schedule"]


def _check_grid(mask: torch.Tensor, H: int, W: int, name: str) -> None:
    """Raise ValueError unless ``mask`` is a bool vector of length H·W with H, W ≥ 1."""
    if H < 1 or W < 1:
        raise ValueError(f"grid must have H, W >= 1, got H={H}, W={W}")
    if mask.dtype != torch.bool or mask.ndim != 1 or mask.numel() != H * W:
        raise ValueError(
            f"{name} must be a bool tensor of shape [H*W] = [{H * W}], got {mask.dtype} {list(mask.shape)}"
        )


# --- step 4: pooled threshold acceptance (eq. 5) ------------------------------------------------------------


def pooled_accept(
    probs: torch.Tensor,
    drafts: torch.Tensor,
    neighbours: torch.Tensor | None,
    k: int,
    tau: float,
) -> torch.Tensor:
    """MuLo-SD eq. 5: accept draft i iff Σ_{x ∈ B_k(x̃_i)} probs[i, x] ≥ τ, with B_k(x̃) = {x̃} ∪ kNN_k(x̃).

    ``probs``: float ``[n, V]``, the target's processed distribution at each drafted position (token ids equal
    code ids; the caller maps offsets). ``drafts``: long ``[n]``, the drafted codes x̃_i. ``neighbours``: the
    LANTERN table, long ``[num_codes, K]``, row c = the other codes nearest to c, nearest first, never c
    itself, so B_k has k + 1 distinct members and no mass is counted twice. ``k = 0`` or ``neighbours is None``
    uses x̃_i alone, i.e. the plain test p_i(x̃_i) ≥ τ.

    The test is deterministic (no uniform draw, no ratio to q). Since probs ≥ 0 and rows sum to 1, τ ≤ 0 accepts
    every draft and τ > 1 rejects every draft. Returns bool ``[n]`` (True = accepted) on ``probs.device``.
    Raises ValueError on bad shapes, k < 0, or k > K.
    """
    if probs.ndim != 2:
        raise ValueError(f"probs must be [n, V], got shape {list(probs.shape)}")
    if drafts.ndim != 1 or drafts.shape[0] != probs.shape[0]:
        raise ValueError(f"drafts must be [n] with n = {probs.shape[0]}, got shape {list(drafts.shape)}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    drafts = drafts.to(device=probs.device, dtype=torch.long)
    # accumulate in at least float32 so half-precision rounding does not flip a test at the threshold
    p = probs if probs.dtype in (torch.float32, torch.float64) else probs.float()
    if k == 0 or neighbours is None:
        mass = p.gather(1, drafts[:, None])[:, 0]
    else:
        if neighbours.ndim != 2:
            raise ValueError(f"neighbours must be a [num_codes, K] table, got shape {list(neighbours.shape)}")
        if k > neighbours.shape[1]:
            raise ValueError(f"k = {k} exceeds the neighbour table's K = {neighbours.shape[1]} columns")
        nn = neighbours.to(device=probs.device, dtype=torch.long)[drafts, :k]  # [n, k]
        ball = torch.cat([drafts[:, None], nn], dim=1)  # [n, k + 1] = B_k(x̃_i)
        mass = p.gather(1, ball).sum(dim=1)
    return mass >= tau


# --- step 5: local expansion (eq. 6-7) ----------------------------------------------------------------------


def expand_rejections(rejected: torch.Tensor, H: int, W: int, l: int) -> torch.Tensor:
    """MuLo-SD eq. 6-7: the resample set R_X = ∪_{t ∈ R_T} N(t, l) with t_0 = min R_T and

        N(t, l) = {u : |row_u − row_t| ≤ l, |col_u − col_t| ≤ l, u ≥ t_0}.

    ``rejected``: bool ``[H·W]`` over raster positions (R_T). Computed as a binary dilation of the 2-D grid by
    a (2l+1)×(2l+1) square (a max-pool), then masked to u ≥ t_0 so nothing raster-before the first rejection
    (the committed prefix) is ever touched. Invariants: R_T ⊆ R_X; no rejection → all False; l = 0 → R_X = R_T.
    Returns bool ``[H·W]`` on ``rejected.device``. Raises ValueError for l < 0 or a mask of the wrong shape.
    """
    _check_grid(rejected, H, W, "rejected")
    if l < 0:
        raise ValueError(f"expansion radius l must be >= 0, got {l}")
    if l == 0 or not bool(rejected.any()):
        return rejected.clone()
    l = min(l, max(H, W) - 1)  # a larger square covers no more of the grid
    grid = rejected.view(1, 1, H, W).float()
    dilated = F.max_pool2d(grid, kernel_size=2 * l + 1, stride=1, padding=l).view(-1) > 0
    t0 = int(torch.argmax(rejected.to(torch.uint8)))  # first True
    return dilated & (torch.arange(H * W, device=rejected.device) >= t0)


# --- step 6 (v2): rejection islands -------------------------------------------------------------------------


def islands(region: torch.Tensor, H: int, W: int) -> list[list[int]]:
    """The 8-connected components CC_8(region) of the True cells of a bool ``[H·W]`` grid mask.

    Two cells touch when |Δrow| ≤ 1 and |Δcol| ≤ 1 (diagonal contact joins). Each component is a list of raster
    indices sorted ascending; components are ordered by their first (smallest) position. Together they
    partition the True cells. BFS over the grid, O(H·W).
    """
    _check_grid(region, H, W, "region")
    cells = region.detach().cpu().numpy().reshape(H, W)
    seen = np.zeros((H, W), dtype=bool)
    out: list[list[int]] = []
    # scanning in raster order makes each component's seed its smallest position, so components come ordered
    for start in np.flatnonzero(cells).tolist():
        r0, c0 = divmod(start, W)
        if seen[r0, c0]:
            continue
        seen[r0, c0] = True
        comp = [start]
        queue = deque([(r0, c0)])
        while queue:
            r, c = queue.popleft()
            for rr in range(max(r - 1, 0), min(r + 2, H)):
                for cc in range(max(c - 1, 0), min(c + 2, W)):
                    if cells[rr, cc] and not seen[rr, cc]:
                        seen[rr, cc] = True
                        comp.append(rr * W + cc)
                        queue.append((rr, cc))
        out.append(sorted(comp))
    return out


# --- ZipAR schedules ----------------------------------------------------------------------------------------


def _zipar_steps(cells: Sequence[int], W: int, window: int) -> list[list[int]]:
    """Greedy ZipAR schedule of a set of raster positions (distinct, in [0, H·W)); see ``window_schedule``."""
    rows: dict[int, list[int]] = {}
    for u in sorted(cells):
        rows.setdefault(u // W, []).append(u % W)  # each row's todo columns, ascending
    nxt = dict.fromkeys(rows, 0)  # per row: index of the leftmost not-yet-generated todo cell
    steps: list[list[int]] = []
    remaining = len(cells)
    while remaining:
        step: list[int] = []
        for r, cols in rows.items():
            i = nxt[r]
            if i == len(cols):
                continue
            c = cols[i]
            above = rows.get(r - 1)
            if above is not None and nxt[r - 1] < len(above):
                # row r−1 is generated left to right, so "all its todo cells at columns ≤ lim are done" is
                # "its leftmost pending cell lies right of lim" (nxt = start-of-step state, see below)
                lim = min(c + window, W) - 1
                if above[nxt[r - 1]] <= lim:
                    continue
            step.append(r * W + c)
        # advance after the whole step, so a dependency is only ever met by an EARLIER step
        for u in step:
            nxt[u // W] += 1
        remaining -= len(step)
        steps.append(step)  # rows visited in ascending order → step already sorted
    return steps


def window_schedule(todo: torch.Tensor | None, H: int, W: int, window: int) -> list[list[int]]:
    """ZipAR (ICML 2025) parallel schedule of the ``todo`` positions (None = the whole grid).

    Rule: within each row the todo cells are generated left to right, one per step; a cell (r, c) with r ≥ 1
    may be generated at a step only if every todo cell of row r−1 at columns ≤ min(c + window, W) − 1 was
    generated at an earlier step (cells not in ``todo`` count as already available). Greedy: at every step
    each row takes its leftmost pending todo cell if that dependency holds. The topmost row with pending cells
    always advances, so every step is non-empty and the schedule terminates.

    Returns the steps, each a sorted list of raster indices; every todo cell appears exactly once. Full grid:
    #steps = W + (H − 1)·window for 1 ≤ window ≤ W, and window ≥ W gives one cell per step in raster order
    (plain AR). Raises ValueError for window < 1 or a mask of the wrong shape.
    """
    if window < 1:
        raise ValueError(f"ZipAR window must be >= 1, got {window}")
    if todo is None:
        if H < 1 or W < 1:
            raise ValueError(f"grid must have H, W >= 1, got H={H}, W={W}")
        cells = list(range(H * W))
    else:
        _check_grid(todo, H, W, "todo")
        cells = torch.nonzero(todo).view(-1).tolist()
    return _zipar_steps(cells, W, window)


def island_schedule(islands: list[list[int]], H: int, W: int, window: int | None) -> list[list[int]]:
    """Concurrent resampling of rejection islands: the positions generated at each parallel step.

    Islands are independent: step s holds the s-th scheduled position of every unfinished island.
    ``window is None``: each island goes in raster order, one position per step, so #steps = max island size.
    ``window = w``: each island follows ``window_schedule``'s rule restricted to its own cells (dependencies
    only on cells of the same island), so #steps = max over islands of that island's ZipAR step count.
    Each step is sorted ascending; every position appears exactly once. Islands must be disjoint sets of
    positions in [0, H·W) (ValueError otherwise, or for window < 1).
    """
    if H < 1 or W < 1:
        raise ValueError(f"grid must have H, W >= 1, got H={H}, W={W}")
    if window is not None and window < 1:
        raise ValueError(f"ZipAR window must be >= 1 or None, got {window}")
    flat = [u for isl in islands for u in isl]
    if len(set(flat)) != len(flat):
        raise ValueError("islands must be disjoint and free of duplicate positions")
    if any(not 0 <= u < H * W for u in flat):
        raise ValueError(f"island positions must lie in [0, {H * W})")
    per_island = [[[u] for u in sorted(isl)] if window is None else _zipar_steps(isl, W, window) for isl in islands]
    n_steps = max((len(s) for s in per_island), default=0)
    return [sorted(u for s in per_island if i < len(s) for u in s[i]) for i in range(n_steps)]
