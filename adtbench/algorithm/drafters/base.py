"""What the decode loop calls on a drafter (the proposer's model half; the tree policy is the other half).

The engine, the cost model and ``DraftSession`` see a drafter only through this protocol, so a new drafter kind
(a Medusa head, a smaller AR model) is a class with these members. ``EagleDrafter`` is the one shipped.

State: a KV cache over the *committed* slots (``length`` of them) plus ``scratch`` speculative slots appended by
``expand`` during one cycle and dropped by ``rollback``; slot t pairs the target's feature ``f_t`` with the
embedding of the next token ``x_{t+1}``, and its output predicts ``x_{t+2}`` through the target's LM head. That
embedding is the drafter's to give (``embed`` / ``embed_prompt``): the target's table, or a copy its checkpoint
stores (LANTERN's drafters).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from adtbench.models.base import PrefillResult, Target


class Drafter(Protocol):
    length: int  # committed slots
    scratch: int  # speculative slots of the current cycle

    def embed(self, target: Target, ids: torch.Tensor) -> torch.Tensor:
        """The drafter's input embedding of token ids ``[...]`` → ``[..., H]`` (what ``extend``/``expand`` take)."""
        ...

    def embed_prompt(self, target: Target, res: PrefillResult) -> torch.Tensor:
        """Its input embeddings at the prompt positions of a prefill ``[R, P, H]``."""
        ...

    def reset(self, rows: int, capacity: int) -> None:
        """Start an image: ``rows`` CFG rows, room for ``capacity`` slots (committed + scratch)."""

    def extend(
        self, feats: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append committed slots (``feats``, ``embeds`` ``[R, m, H]`` at positions ``[R, m]``; ``valid [R, m]`` marks
        real tokens, None: all) after dropping any scratch; returns the last slot's output ``[R, H]``."""
        ...

    def expand(
        self, feats: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor, slot_mask: torch.Tensor
    ) -> torch.Tensor:
        """Append ``m`` scratch slots; ``slot_mask [m, scratch + m]`` (bool, or additive 0 / −inf): which scratch slots
        each new one attends (the committed ones always are). Returns their outputs ``[R, m, H]``."""
        ...

    def rollback(self) -> None:
        """Drop this cycle's scratch slots."""
