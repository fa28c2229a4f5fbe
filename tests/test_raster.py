"""``RasterCache``: slot bookkeeping and raster-causal masks for out-of-order feeding, against hand-worked cases.

Notation in the comments: cache columns ``c0, c1, …`` (feeding order, the slot each holds in brackets), new
tokens ``n0, n1, …`` of one forward; a mask row is ``[old columns | new tokens]``.
"""

from __future__ import annotations

import pytest
import torch

from adtbench.algorithm.raster import RasterCache


def rows(*bits: str) -> torch.Tensor:
    """A bool mask from rows of '0'/'1' (spaces ignored)."""
    return torch.tensor([[ch == "1" for ch in r.replace(" ", "")] for r in bits], dtype=torch.bool)


def test_first_forward_real_tokens_see_earlier_real_ones_temporaries_are_invisible() -> None:
    rc = RasterCache(6)
    # n0 @0 real, n1 @1 real, n2 @3 temporary: n1 sees n0; n2 sees n0, n1 (real, earlier); nobody sees n2
    got = rc.allowed([0, 1, 3], [True, True, False])
    assert torch.equal(got, rows("100", "110", "111"))
    keep = rc.commit([0, 1, 3], [True, True, False])
    assert keep.tolist() == [0, 1] and rc.columns == 2
    assert rc.fed(0) and rc.fed(1) and not rc.fed(3)


def test_real_same_forward_later_slot_and_two_temporaries() -> None:
    rc = RasterCache(8)
    rc.commit([0, 1], [True, True])  # c0[0] c1[1]
    # n0 @4 real (sees c0, c1 and the real n1 @2 of the same forward; slot 3 is not fed → invisible), n1 @2 real
    # (sees c0, c1; not n0: 4 > 2), n2 @5 temporary (sees c0, c1, n0, n1), n3 @6 temporary (sees c0, c1, n0, n1 —
    # never the temporary n2)
    got = rc.allowed([4, 2, 5, 6], [True, True, False, False])
    assert torch.equal(got, rows("11 1100", "11 0100", "11 1110", "11 1101"))
    assert rc.commit([4, 2, 5, 6], [True, True, False, False]).tolist() == [0, 1]
    # columns now c0[0] c1[1] c2[4] c3[2]; n0 @3 sees c0, c1, c3 (slot 2) but not c2 (slot 4 > 3)
    assert torch.equal(rc.allowed([3], [True]), rows("1101 1"))
    assert rc.col_slot.tolist() == [0, 1, 4, 2] and rc.latest[[0, 1, 2, 4]].tolist() == [0, 1, 3, 2]


def test_superseding_a_slot_hides_its_older_column_from_this_forward_on() -> None:
    rc = RasterCache(5)
    rc.commit([0, 1, 2], [True, True, True])  # c0[0] c1[1] c2[2]
    # n0 @1 real (a refresh of slot 1): sees c0 only; the old c1 is superseded already in this forward.
    # n1 @2 temporary (a re-query of slot 2): sees c0 and the NEW slot-1 value n0, not c1 (superseded) and not
    # c2 (its own slot is not < 2); n2 @3 temporary: c0, c2 (slot 2's newest column), n0; not n1.
    got = rc.allowed([1, 2, 3], [True, False, False])
    assert torch.equal(got, rows("100 100", "100 110", "101 101"))
    rc.commit([1, 2, 3], [True, False, False])  # c3[1] supersedes c1 for good
    assert rc.latest[1] == 3 and rc.columns == 4
    # a later token @4 sees c0, c2, c3: one value per earlier slot, the newest
    assert torch.equal(rc.allowed([4], [True]), rows("1011 1"))


def test_plain_raster_order_is_the_causal_mask() -> None:
    """One real token per forward in raster order: every forward sees every column (AR's mask)."""
    rc = RasterCache(4)
    for s in range(4):
        assert torch.equal(rc.allowed([s], [True]), torch.ones(1, s + 1, dtype=torch.bool))
        rc.commit([s], [True])
    # several in one forward: the lower-triangular causal mask over the new tokens
    rc2 = RasterCache(4)
    assert torch.equal(rc2.allowed([0, 1, 2, 3], [True] * 4), torch.ones(4, 4, dtype=torch.bool).tril())


def test_bad_input() -> None:
    rc = RasterCache(4)
    with pytest.raises(ValueError, match="two real tokens"):
        rc.allowed([1, 1], [True, True])
    with pytest.raises(ValueError, match="differ in length"):
        rc.allowed([1, 2], [True])
    # a temporary beside a real token at the same slot is allowed (a query of the value being fed is the real one)
    assert rc.allowed([1, 1], [True, False]).shape == (2, 2)
