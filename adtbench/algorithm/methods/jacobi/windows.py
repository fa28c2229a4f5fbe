"""Jacobi window rules: how many chain nodes L the next forward verifies (``policy.window``).

    WINDOWS.register("adaptive", AdaptiveWindow)        # a class: declarations + ``from_params``
    make_sizer(params, layout, calibrated)              # an integer window → ``FixedWindow``, a name → its rule

A rule is a ``FixedWindow`` subclass registered under the name ``policy.window`` takes. The loop calls ``size(g)``
before each forward and ``observe(g, m, a, rows)`` after it, with the forward's processed rows ``[m + 1, V]`` (row i:
the target's logits for generation index g + 1 + i given the root and d_1 … d_i; row ``a`` is the bonus position's,
whose context is all committed). Each rule declares:

- ``device_step``: whether the fixed-shape device step (``jacobi.step``, ``engine.graphs.step``) can run it — it can
  only run a window fixed for the whole image; ``engine.graphs.step=graph`` with a rule that says False is a
  ``ConfigError`` naming ``engine.graphs.step`` when the policy is built (before any weights load);
- ``calibrated``: whether it needs the machine's calibrated L (``calibration.calibrate_window``, built by the harness
  outside the timed scope and handed in as ``calibrated``).

**Lossless** whatever the rule, as long as L depends on the past only: committed tokens, acceptance counts and the
rows a forward computed — never on a draft still to be tested (module docstring of ``methods.jacobi.loop``). A rule that
reads rows reads row ``a`` or rows left of it (docs/adding_a_method.md: an entropy-gated window reading row ``a``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.registry import Registry

__all__ = ["WINDOWS", "AdaptiveWindow", "CostWindow", "FixedWindow", "make_sizer", "window_rule"]


class FixedWindow:
    """L − 1 drafts every iteration (the papers' setting; ``policy.window=<L>``)."""

    device_step: ClassVar[bool] = True  # one L for the image: the fixed-shape step runs it
    calibrated: ClassVar[bool] = False

    def __init__(self, L: int) -> None:
        self.L = L

    @classmethod
    def from_params(cls, params: Any, layout: TokenLayout, calibrated: int | None) -> FixedWindow:
        """The rule for ``params`` (a ``JacobiParams``: its ``window_*`` keys and any keys of the method's own
        params class) on ``layout``; ``calibrated``: the L the harness measured for a ``calibrated`` rule."""
        return cls(int(params.window))

    def reset(self) -> None:
        """A new image."""

    def size(self, g: int) -> int:
        """Chain nodes L for the iteration rooted at generation index ``g``."""
        return self.L

    def observe(self, g: int, m: int, a: int, rows: torch.Tensor | None = None) -> None:
        """The iteration rooted at ``g`` verified ``m`` drafts and accepted ``a``; ``rows [m + 1, V]``: its processed
        logits (module docstring)."""


WINDOWS: Registry[FixedWindow] = Registry("policy.window")
"""``policy.window`` name → window rule class (``FixedWindow`` subclass); an integer window is ``FixedWindow``."""


@WINDOWS.register("cost")
class CostWindow(FixedWindow):
    """``window: cost`` — a fixed L chosen once per machine by ``calibrate_window`` (committed tokens per unit
    of time on the measured cost model)."""

    calibrated = True

    @classmethod
    def from_params(cls, params: Any, layout: TokenLayout, calibrated: int | None) -> FixedWindow:
        if calibrated is None:
            raise RuntimeError(
                "policy.window=cost needs its calibrated L (calibration.calibrate_window; harness.loops)"
            )
        return cls(calibrated)


@WINDOWS.register("adaptive")
class AdaptiveWindow(FixedWindow):
    """``window: adaptive`` — ADT-Tree's adjacency idea for one chain: grow the window where the windows above were
    accepted far, shrink it where not.

    State per committed image position j: run[j] = a + 1, the tokens the forward that committed j committed. The
    forward rooted at g drafts g + 1, …; their upper neighbours (one row up, end-of-line column counted) were
    committed by forwards whose runs say how far drafts were accepted there. L = clamp(max run[g + 1 − row_len ± 2] +
    ``adapt_margin``, ``window_min``, ``window_max``): a long run above (a flat region) predicts long accepts here, and
    the margin keeps drafts ahead being refined; without a row above (the first row) the root's own run stands in
    (its raster predecessor). Drafts held past a shrunken window wait unverified (``JacobiState.held``), so shrinking
    loses no refinement. Reads no clock and no draft; restarts with every image. (Also tried: ADT's bisectional
    rule on α = a / m — doubling at α ≥ ½, halving below — and grow-on-full / shrink-on-zero: both commit fewer
    tokens per forward than this at equal mean window on the mini model, since a = 0 follows most rejections.)"""

    device_step = False  # sizes each forward on the host
    SPAN = 2  # upper neighbours either side of the first draft's

    def __init__(self, lo: int, hi: int, margin: int, row_len: int, n_gen: int) -> None:
        super().__init__(min(hi, max(lo, margin + 1)))
        self.lo, self.hi, self.margin, self.row_len, self.n_gen = lo, hi, margin, row_len, n_gen
        self.reset()

    @classmethod
    def from_params(cls, params: Any, layout: TokenLayout, calibrated: int | None) -> FixedWindow:
        return cls(params.window_min, params.window_max, params.adapt_margin, layout.row_len, layout.num_gen_tokens)

    def reset(self) -> None:
        self.run = np.zeros(self.n_gen + 1, dtype=np.int64)  # 0: nothing committed there yet

    def size(self, g: int) -> int:
        up = g + 1 - self.row_len
        if up >= 0:
            ref = int(self.run[max(0, up - self.SPAN) : up + self.SPAN + 1].max())
        else:
            ref = int(self.run[g]) if g > 0 else 1
        return int(np.clip(ref + self.margin, self.lo, self.hi))

    def observe(self, g: int, m: int, a: int, rows: torch.Tensor | None = None) -> None:
        self.run[g : g + a + 1] = a + 1


def window_rule(window: int | str) -> type[FixedWindow]:
    """The rule class of a ``policy.window`` value (an integer: ``FixedWindow``); an unknown name is a
    ``ConfigError`` naming ``policy.window`` and the registered rules."""
    if isinstance(window, int) and not isinstance(window, bool):
        return FixedWindow
    if not isinstance(window, str) or window not in WINDOWS:
        raise ConfigError("policy.window", f"must be an integer ≥ 1 or one of {WINDOWS.names()}, got {window!r}")
    rule = WINDOWS.get(window)
    assert isinstance(rule, type) and issubclass(rule, FixedWindow), rule
    return rule


def make_sizer(params: Any, layout: TokenLayout, calibrated: int | None = None) -> FixedWindow:
    """The window sizer of ``params.window`` (``window_rule``); ``calibrated``: the L the harness measured for a rule
    that declares ``calibrated`` (``window: cost``)."""
    return window_rule(params.window).from_params(params, layout, calibrated)
