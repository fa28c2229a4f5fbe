"""Tree policies: given a drafting session, propose the draft tree of one cycle.

A policy sees only a ``DraftSession`` (root log-probs, ``expand``) and the depth budget of the cycle (the
image positions left), never the model. ``observe`` feeds back the verification outcome (ADT-Tree uses it);
``reset`` starts a new image.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from adtbench.algorithm.cost import CostModelSource
from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.records import GenerationResult
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import Acceptance
from adtbench.registry import Registry


class TreePolicy(ABC):
    name: str = "policy"
    uses_drafter: bool = True

    @abstractmethod
    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        """Build this cycle's tree; its depth must not exceed ``max_depth`` (≥ 1)."""

    def max_nodes(self) -> int:
        """Upper bound on tree size (root included), used to size KV caches."""
        return 1

    def max_draft_slots(self) -> int:
        """Upper bound on drafter scratch slots (expanded nodes) per cycle, used to size the drafter's KV cache."""
        return self.max_nodes()

    def observe(self, tree: DraftTree, acceptance: Acceptance, root_gen: int) -> None:  # noqa: B027
        """Verification feedback for adaptive policies (no-op by default)."""

    def reset(self) -> None:  # noqa: B027
        """Start a new image."""

    def bind(self, cost: CostModelSource | None) -> None:  # noqa: B027
        """Called once by the app after the models are built, before warm-up and outside the timed scope.

        Policies that size their trees to the machine (``budget: cost``) take their cost model from ``cost``
        (``(max_nodes, max_level) → CostModel``; the harness caches it on disk); others do nothing.
        """


class LoopPolicy(ABC):
    """A method with its own decode loop (ZipAR, MuLo-SD) rather than a tree for ``engine.speculative_cycle``.

    ``engine.generate`` hands it the target, the method's own models (``aux``: built by the harness from the
    policy's keys, e.g. MuLo-SD's low-resolution drafter; None when it needs none) and the acceptance rule; it
    returns a ``GenerationResult`` whose cycles are its sequential target forwards (``algorithm.records``).
    """

    name: str = "loop"
    uses_drafter: bool = False  # never an EAGLE drafter
    lossless: bool = False  # True only where the loop is distribution-identical to AR (tested)

    def bind(self, cost: CostModelSource | None) -> None:  # noqa: B027
        """Loops size nothing to the machine (same signature as ``TreePolicy.bind``)."""

    def reset(self) -> None:  # noqa: B027
        """Start a new image."""

    def max_nodes(self) -> int:
        return 1

    @abstractmethod
    def generate(
        self,
        target: Any,
        aux: Any,
        inputs: Any,
        sp: Any,
        generator: torch.Generator | None,
        rule: Any,
    ) -> GenerationResult:
        """Decode one image (timed inside, like ``engine.generate``)."""


Policy = TreePolicy | LoopPolicy

POLICIES: Registry[Policy] = Registry("policy")
"""``policy.name`` → builder(policy node) → TreePolicy; each policy module registers its own builder(s), and
``import adtbench.algorithm.policies`` imports them all. Builders get a node already checked against its schema
(``adtbench.harness.schema``); constructors check ranges and choices, naming ``policy.<key>``."""


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, ties broken toward the lower index (deterministic)."""
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:k]


def sample_without_replacement(
    logprobs: torch.Tensor, k: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``k`` distinct tokens in order from ``softmax(logprobs)``; returns (tokens, probs ``[V]``).

    Draws stop early when the support is exhausted, so fewer than k tokens may come back.
    """
    probs = logprobs.exp()
    remaining = probs.clone()
    out: list[int] = []
    for _ in range(k):
        total = remaining.sum()
        if total <= 0:
            break
        x = int(torch.multinomial(remaining / total, 1, generator=generator))
        out.append(x)
        remaining[x] = 0.0
    return torch.tensor(out, dtype=torch.long), probs
