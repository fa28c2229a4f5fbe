"""Tree policies: given a drafting session, propose the draft tree of one cycle.

A policy sees only a ``DraftSession`` (root log-probs, ``expand``) and the depth budget of the cycle (the
image positions left), never the model. ``observe`` feeds back the verification outcome (ADT-Tree uses it);
``reset`` starts a new image.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from adtbench.drafters.session import DraftSession
from adtbench.registry import Registry
from adtbench.tree import DraftTree
from adtbench.verify import Acceptance


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

    def bind(self, target: Any, drafter: Any, sp: Any, cache_dir: Path | None) -> None:  # noqa: B027
        """Called once by the app after the models are built, before warm-up and outside the timed scope.

        Policies that size their trees to the machine (``budget: cost``) load or measure their cost model
        here (cached under ``cache_dir``); others do nothing.
        """


POLICIES: Registry[TreePolicy] = Registry("policy")
"""``policy.name`` → builder(policy node) → TreePolicy; each policy module registers its own builder(s), and
``import adtbench.policies`` imports them all. Builders get a node already checked against its schema
(``adtbench.schema``); constructors check ranges and choices, naming ``policy.<key>``."""


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
