"""Draft gating: spend a draft–verify cycle only where it pays, else take one plain AR step.

A drafted cycle costs C AR steps (drafter extend and levels, a tree verify, the engine's own work) and commits c
tokens; an AR step costs one step and commits one token. Drafting pays where E[c] > C. What a cycle commits varies
across the image far more than what it costs: flat regions commit near the tree's maximum, edges and mid-entropy
textures little more than the bonus token (docs/mini_model.md). The gate predicts E[c] from what the target already
said about the position: the entropy H of the target's processed distribution that the cycle's root was drawn from
(adjacent tokens are alike, so the root's uncertainty foretells its successors'), binned at
``sampling.ENTROPY_EDGES``. Per bin it keeps the mean committed tokens of this image's drafted cycles, starting from
an optimistic prior (``min_tokens + 1`` at weight ``PRIOR_WEIGHT``: a bin is drafted until its own evidence says
otherwise), and drafts iff that mean is at least ``min_tokens`` = C. A gated-off bin is still drafted every
``explore``-th time it comes up, so its estimate keeps learning.

Lossless: the decision reads only tokens and target distributions of positions already committed, never the
drafts; a skipped cycle is a plain AR step (the root alone verified: its bonus token is drawn from the target's
distribution). Deterministic: no clock is read, so a seed gives the same tokens on every machine. State restarts
with every image, like the acceptance model's.

The drafter is fed lazily (``engine.generate``): committed slots of AR steps wait until the next drafted cycle and
enter the drafter in one ``extend`` with it, so an AR step costs the target forward alone.
"""

from __future__ import annotations

import numpy as np
import torch

from adtbench.algorithm.sampling import ENTROPY_EDGES
from adtbench.errors import ConfigError

PRIOR_WEIGHT = 2.0  # pseudo-cycles of the optimistic prior per bin


class DraftGate:
    """Per-cycle draft / AR-step decision (module docstring). ``min_tokens`` > 1: the drafted cycle's cost in AR
    steps; ``explore`` ≥ 1: a gated-off bin drafts every ``explore``-th time (1: always draft)."""

    def __init__(self, min_tokens: float, explore: int = 8) -> None:
        if not min_tokens > 1.0:
            msg = f"must be > 1 (a drafted cycle's cost in AR steps), got {min_tokens}"
            raise ConfigError("policy.gate_tokens", msg)
        if explore < 1:
            raise ConfigError("policy.gate_explore", f"must be ≥ 1, got {explore}")
        self.min_tokens, self.explore = float(min_tokens), int(explore)
        self.reset()

    def reset(self) -> None:
        n = ENTROPY_EDGES.size + 1
        self.committed = np.full(n, (self.min_tokens + 1.0) * PRIOR_WEIGHT)
        self.cycles = np.full(n, PRIOR_WEIGHT)
        self.gated = np.zeros(n, dtype=np.int64)
        self.skips = 0

    @staticmethod
    def entropy(logits: torch.Tensor) -> torch.Tensor:
        """H(softmax(logits)) in nats, ``[]`` on the logits' device (processed logits ``[V]``, −inf outside the
        support): the engine reads it with the cycle's outcome."""
        h: torch.Tensor = torch.special.entr(logits.softmax(-1)).sum()
        return h

    @staticmethod
    def bin_of_entropy(h: float) -> int:
        """Entropy bin of an entropy ``h`` (nats): ``sampling.ENTROPY_EDGES``."""
        return int(np.searchsorted(ENTROPY_EDGES, h, side="right"))

    @classmethod
    def bin_of(cls, logits: torch.Tensor) -> int:
        """Entropy bin of ``softmax(logits)`` (reads the device)."""
        return cls.bin_of_entropy(float(cls.entropy(logits)))

    def draft(self, b: int | None) -> bool:
        """Draft this cycle? ``b``: the root's bin (None: unknown, e.g. right after the prefill → draft)."""
        if b is None or self.committed[b] >= self.min_tokens * self.cycles[b]:
            return True
        self.gated[b] += 1
        if self.gated[b] % self.explore == 0:
            return True
        self.skips += 1
        return False

    def observe(self, b: int | None, committed: int) -> None:
        """A drafted cycle whose root was in bin ``b`` committed ``committed`` tokens (bonus included)."""
        if b is not None:
            self.committed[b] += committed
            self.cycles[b] += 1
