"""Tests for adtbench.algorithm.regions: MuLo-SD eq. 5-7, rejection islands, ZipAR schedules."""

from __future__ import annotations

import itertools

import pytest
import torch

from adtbench.algorithm.regions import (
    expand_rejections,
    island_schedule,
    islands,
    pooled_accept,
    window_schedule,
)


def grid(rows: list[str]) -> torch.Tensor:
    """A bool [H*W] raster mask from rows of '0'/'1' (spaces ignored)."""
    return torch.tensor([ch == "1" for row in rows for ch in row.replace(" ", "")], dtype=torch.bool)


# --- pooled_accept (eq. 5) ----------------------------------------------------------------------------------

# code c's other codes, nearest first (LANTERN format, never c itself)
NEIGHBOURS = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 4, 1], [3, 5, 2], [4, 3, 2]], dtype=torch.long)
# dyadic masses so every sum is exact
PROBS = torch.tensor(
    [
        [0.25, 0.125, 0.125, 0.25, 0.125, 0.125],  # draft 0: p = .25, B_2 = {0,1,2} → .5
        [0.0625, 0.0625, 0.5, 0.125, 0.125, 0.125],  # draft 3: p = .125, B_2 = {3,2,4} → .75
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],  # draft 5: p = 1, B_2 = {5,4,3} → 1
        [0.0, 0.0, 0.0, 0.0, 0.5, 0.5],  # draft 0: p = 0, B_2 = {0,1,2} → 0
    ]
)
DRAFTS = torch.tensor([0, 3, 5, 0])


def test_pooled_accept_k0_is_exact_draft_probability():
    got = pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=0, tau=0.25)
    assert got.tolist() == [True, False, True, False]  # p = .25 ≥ .25 accepted (≥, not >)
    assert pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=0, tau=0.126).tolist() == [True, False, True, False]
    assert pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=0, tau=0.125).tolist() == [True, True, True, False]
    # neighbours None = draft alone, whatever k
    assert pooled_accept(PROBS, DRAFTS, None, k=2, tau=0.25).tolist() == [True, False, True, False]


def test_pooled_accept_k2_pools_nearest_codes():
    assert pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=2, tau=0.5).tolist() == [True, True, True, False]
    assert pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=2, tau=0.75).tolist() == [False, True, True, False]
    # k=1: draft 0 → {0,1} = .375; draft 3 → {3,2} = .625
    assert pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=1, tau=0.375).tolist() == [True, True, True, False]
    assert pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=1, tau=0.625).tolist() == [False, True, True, False]


def test_pooled_accept_tau_endpoints():
    for k in (0, 2, 3):
        assert pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=k, tau=0.0).all()  # even the zero-mass draft
        assert not pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=k, tau=1.01).any()  # even the one-hot draft


def test_pooled_accept_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    n, V, K = 32, 20, 6
    probs = torch.rand(n, V, generator=g).softmax(-1)
    drafts = torch.randint(0, V, (n,), generator=g)
    # a valid table: for each code, a random permutation of the other codes
    table = torch.stack(
        [torch.tensor([x for x in torch.randperm(V, generator=g).tolist() if x != c][:K]) for c in range(V)]
    )
    for k, tau in itertools.product((0, 1, 4, 6), (0.05, 0.2, 0.5)):
        want = [
            sum(probs[i, x].item() for x in [int(drafts[i]), *table[drafts[i], :k].tolist()]) >= tau for i in range(n)
        ]
        assert pooled_accept(probs, drafts, table, k=k, tau=tau).tolist() == want
    # int32 table and half probs are accepted (half accumulated in float32)
    got = pooled_accept(probs.half(), drafts, table.int(), k=4, tau=0.5)
    assert got.dtype == torch.bool and got.shape == (n,)


def test_pooled_accept_errors():
    with pytest.raises(ValueError, match="exceeds"):
        pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=4, tau=0.5)  # K = 3
    with pytest.raises(ValueError, match="k must be"):
        pooled_accept(PROBS, DRAFTS, NEIGHBOURS, k=-1, tau=0.5)
    with pytest.raises(ValueError, match="drafts"):
        pooled_accept(PROBS, DRAFTS[:3], NEIGHBOURS, k=1, tau=0.5)
    with pytest.raises(ValueError, match="probs"):
        pooled_accept(PROBS[0], DRAFTS[:1], NEIGHBOURS, k=1, tau=0.5)
    with pytest.raises(ValueError, match="neighbours"):
        pooled_accept(PROBS, DRAFTS, NEIGHBOURS[0], k=1, tau=0.5)


# --- expand_rejections (eq. 6-7) ----------------------------------------------------------------------------


def expand_reference(rejected: torch.Tensor, H: int, W: int, l: int) -> list[bool]:
    """eq. 6-7 written literally."""
    rej = [t for t in range(H * W) if rejected[t]]
    if not rej:
        return [False] * (H * W)
    t0 = rej[0]
    return [u >= t0 and any(abs(u // W - t // W) <= l and abs(u % W - t % W) <= l for t in rej) for u in range(H * W)]


def test_expand_two_rejections_l1():
    rejected = grid(["00000", "00100", "00000", "00001", "00000"])  # (1,2) and (3,4); t0 = 7
    want = grid(["00000", "00110", "01111", "00011", "00011"])  # (1,1) is cut by u ≥ t0, rows 0 entirely
    assert torch.equal(expand_rejections(rejected, 5, 5, 1), want)


def test_expand_cuts_upper_left_before_t0():
    rejected = grid(["00000", "00000", "00100", "00000", "00000"])  # t0 = 12
    want = grid(["00000", "00000", "00110", "01110", "00000"])
    assert torch.equal(expand_rejections(rejected, 5, 5, 1), want)
    # l = 2: row 2 from col 2 on, rows 3-4 cols 0-4
    want2 = grid(["00000", "00000", "00111", "11111", "11111"])
    assert torch.equal(expand_rejections(rejected, 5, 5, 2), want2)


def test_expand_l0_none_and_errors():
    rejected = grid(["0100", "0000", "1001"])
    assert torch.equal(expand_rejections(rejected, 3, 4, 0), rejected)
    none = torch.zeros(12, dtype=torch.bool)
    assert not expand_rejections(none, 3, 4, 2).any()
    # huge l: everything from t0 on
    want = torch.arange(12) >= 1
    assert torch.equal(expand_rejections(rejected, 3, 4, 100), want)
    with pytest.raises(ValueError, match="l must be"):
        expand_rejections(rejected, 3, 4, -1)
    with pytest.raises(ValueError, match="rejected"):
        expand_rejections(rejected, 4, 4, 1)
    with pytest.raises(ValueError, match="rejected"):
        expand_rejections(rejected.long(), 3, 4, 1)


def test_expand_matches_reference_random():
    g = torch.Generator().manual_seed(1)
    for H, W, density in [(5, 5, 0.1), (4, 7, 0.2), (1, 9, 0.2), (8, 1, 0.3), (9, 6, 0.05)]:
        for _ in range(10):
            rejected = torch.rand(H * W, generator=g) < density
            for l in (0, 1, 2, 3):
                got = expand_rejections(rejected, H, W, l)
                assert got.tolist() == expand_reference(rejected, H, W, l)
                assert (got | ~rejected).all()  # R_T ⊆ R_X


# --- islands ------------------------------------------------------------------------------------------------


def test_islands_diagonal_join_gap_split_ordering():
    region = grid(["10011", "01000", "00010", "10001"])
    # 0–6 diagonal; 3–4 adjacent; 13 (2,3) not touching row 0 (gap row); 13–19 diagonal; 15 alone
    assert islands(region, 4, 5) == [[0, 6], [3, 4], [13, 19], [15]]


def test_islands_sorted_within_component_and_edge_cases():
    region = grid(["101", "010", "000"])  # V shape: BFS reaches 4 before 2
    assert islands(region, 3, 3) == [[0, 2, 4]]
    assert islands(torch.zeros(6, dtype=torch.bool), 2, 3) == []
    assert islands(torch.ones(6, dtype=torch.bool), 2, 3) == [list(range(6))]
    # no wrap-around between the end of one row and the start of the next
    assert islands(grid(["001", "100"]), 2, 3) == [[2], [3]]


def test_islands_properties_random():
    g = torch.Generator().manual_seed(2)
    for H, W in [(6, 6), (5, 9), (1, 12), (12, 1)]:
        for _ in range(10):
            region = torch.rand(H * W, generator=g) < 0.35
            comps = islands(region, H, W)
            flat = [u for c in comps for u in c]
            assert sorted(flat) == torch.nonzero(region).view(-1).tolist()  # a partition of the True cells
            assert all(c == sorted(c) for c in comps)
            assert [c[0] for c in comps] == sorted(c[0] for c in comps)

            def touch(a: int, b: int) -> bool:
                return abs(a // W - b // W) <= 1 and abs(a % W - b % W) <= 1  # noqa: B023

            for i, j in itertools.combinations(range(len(comps)), 2):
                assert not any(touch(a, b) for a in comps[i] for b in comps[j])
            for c in comps:  # each component is connected
                seen, stack = {c[0]}, [c[0]]
                while stack:
                    a = stack.pop()
                    for b in c:
                        if b not in seen and touch(a, b):
                            seen.add(b)
                            stack.append(b)
                assert seen == set(c)


# --- window_schedule (ZipAR) --------------------------------------------------------------------------------


def schedule_reference(todo: list[bool], H: int, W: int, window: int) -> list[list[int]]:
    """The greedy rule evaluated literally, from scratch at every step."""
    done: dict[int, int] = {}  # position → step
    steps: list[list[int]] = []
    while len(done) < sum(todo):
        s = len(steps)
        step = []
        for r in range(H):
            pending = [r * W + c for c in range(W) if todo[r * W + c] and r * W + c not in done]
            if not pending:
                continue
            u = pending[0]
            c = u % W
            lim = min(c + window, W) - 1
            deps = [(r - 1) * W + cc for cc in range(lim + 1)] if r >= 1 else []
            if all(not todo[v] or done.get(v, s) < s for v in deps):
                step.append(u)
        for u in step:
            done[u] = s
        steps.append(step)
    return steps


def check_zipar(steps: list[list[int]], todo: list[bool], H: int, W: int, window: int) -> None:
    """Invariants: each todo cell once, rows left to right one per step, dependency rule."""
    at = {u: s for s, step in enumerate(steps) for u in step}
    assert sum(len(s) for s in steps) == len(at) == sum(todo)
    assert set(at) == {u for u in range(H * W) if todo[u]}
    assert all(step == sorted(step) and step for step in steps)
    for u, s in at.items():
        r, c = divmod(u, W)
        row_earlier = [at[r * W + cc] for cc in range(c) if todo[r * W + cc]]
        assert all(t < s for t in row_earlier)
        if r >= 1:
            for cc in range(min(c + window, W)):
                v = (r - 1) * W + cc
                if todo[v]:
                    assert at[v] < s, (u, v)
    assert all(len({u // W for u in step}) == len(step) for step in steps)  # one cell per row per step


def test_window_schedule_small_hand_worked():
    assert window_schedule(None, 2, 3, 1) == [[0], [1, 3], [2, 4], [5]]
    assert window_schedule(None, 3, 3, 2) == [[0], [1], [2, 3], [4], [5, 6], [7], [8]]
    # todo with gaps: row 0 = {0, 2}, row 1 = {4, 5}, row 2 = {6}; w = 1
    # (1,1)=4 needs row-0 todo cols ≤ 1 = {0}; (1,2)=5 needs {0, 2}; (2,0)=6 needs row-1 todo col ≤ 0 = none
    todo = grid(["101", "011", "100"])
    assert window_schedule(todo, 3, 3, 1) == [[0, 6], [2, 4], [5]]


@pytest.mark.parametrize(
    ("H", "W", "w"), [(1, 1, 1), (1, 5, 2), (5, 1, 1), (3, 4, 1), (4, 4, 2), (4, 6, 3), (6, 5, 5), (8, 8, 3)]
)
def test_window_schedule_full_grid(H, W, w):
    steps = window_schedule(None, H, W, w)
    assert len(steps) == W + (H - 1) * w
    check_zipar(steps, [True] * (H * W), H, W, w)
    assert steps == schedule_reference([True] * (H * W), H, W, w)
    assert steps == window_schedule(torch.ones(H * W, dtype=torch.bool), H, W, w)


@pytest.mark.parametrize(("H", "W"), [(1, 4), (3, 4), (5, 2), (4, 7)])
def test_window_at_least_W_is_raster_order(H, W):
    for w in (W, W + 1, 100):
        assert window_schedule(None, H, W, w) == [[u] for u in range(H * W)]


def test_window_schedule_random_todo_matches_reference():
    g = torch.Generator().manual_seed(3)
    for H, W, w in [(4, 4, 1), (5, 6, 2), (6, 5, 3), (3, 8, 8), (7, 7, 2), (1, 6, 2), (6, 1, 1)]:
        for density in (0.2, 0.5, 0.9):
            todo = torch.rand(H * W, generator=g) < density
            steps = window_schedule(todo, H, W, w)
            check_zipar(steps, todo.tolist(), H, W, w)
            assert steps == schedule_reference(todo.tolist(), H, W, w)
    assert window_schedule(torch.zeros(6, dtype=torch.bool), 2, 3, 1) == []


def test_window_schedule_errors():
    with pytest.raises(ValueError, match="window"):
        window_schedule(None, 2, 2, 0)
    with pytest.raises(ValueError, match="todo"):
        window_schedule(torch.ones(5, dtype=torch.bool), 2, 3, 1)


# --- island_schedule ----------------------------------------------------------------------------------------


def test_island_schedule_raster_within_island():
    isl = [[0, 6], [3, 4], [13, 19], [15]]
    assert island_schedule(isl, 4, 5, None) == [[0, 3, 13, 15], [4, 6, 19]]
    assert island_schedule([], 4, 5, None) == []
    # unsorted island input is taken in raster order
    assert island_schedule([[7, 2, 5]], 3, 3, None) == [[2], [5], [7]]


def test_island_schedule_window_islands_independent():
    # two 2x2 islands in the same rows of a 2x5 grid: A = {0,1,5,6}, B = {3,4,8,9}; w = 1
    steps = island_schedule([[0, 1, 5, 6], [3, 4, 8, 9]], 2, 5, 1)
    assert steps == [[0, 3], [1, 4, 5, 8], [6, 9]]
    # the same cells as one todo mask would serialise row 1 across both islands
    assert len(window_schedule(grid(["11011", "11011"]), 2, 5, 1)) > len(steps)


def test_island_schedule_random_properties():
    g = torch.Generator().manual_seed(4)
    for H, W in [(6, 6), (5, 8), (8, 4)]:
        for _ in range(5):
            region = expand_rejections(torch.rand(H * W, generator=g) < 0.08, H, W, 1)
            comps = islands(region, H, W)
            plain = island_schedule(comps, H, W, None)
            assert len(plain) == max((len(c) for c in comps), default=0)
            assert sorted(u for s in plain for u in s) == torch.nonzero(region).view(-1).tolist()
            for w in (1, 2, 3, W):
                steps = island_schedule(comps, H, W, w)
                assert sorted(u for s in steps for u in s) == sorted(u for c in comps for u in c)
                assert all(s == sorted(s) and s for s in steps)
                for c in comps:  # restricted to one island, the ZipAR rule and greedy schedule hold
                    mask = [u in set(c) for u in range(H * W)]
                    own = [[u for u in s if mask[u]] for s in steps]
                    own = own[: max(i + 1 for i, s in enumerate(own) if s)]
                    assert own == schedule_reference(mask, H, W, w)
                    check_zipar(own, mask, H, W, w)
                assert len(steps) <= len(plain)
            assert island_schedule(comps, H, W, W) == plain  # window ≥ W = raster order in every island


def test_island_schedule_errors():
    with pytest.raises(ValueError, match="disjoint"):
        island_schedule([[0, 1], [1, 2]], 2, 2, None)
    with pytest.raises(ValueError, match="lie in"):
        island_schedule([[0, 4]], 2, 2, None)
    with pytest.raises(ValueError, match="window"):
        island_schedule([[0]], 2, 2, 0)
