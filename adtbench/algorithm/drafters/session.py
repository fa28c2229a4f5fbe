"""One cycle's drafting interface: what a ``TreePolicy`` sees of the drafter (and nothing of the model).

Nodes are numbered in creation order, node 0 being the root (the token the target chose last cycle).
``root_logprobs()`` is the drafter's distribution over the root's children; ``expand(parents, tokens, level)``
adds children to existing nodes — all of them at depth ``level``, their parents at ``level − 1`` (policies grow
trees level by level) — runs the drafter on them in one forward and returns the distribution over *their*
children. Distributions are log-probabilities after the target's own processing (CFG mix → constraint →
temperature → top-k → top-p; greedy: CFG mix → constraint), so drafter ranks and sampled proposals ``q`` are on the
same footing as the verifier's ``p``.

Everything stays on the drafter's device: node ids, parents and tokens are device tensors, the scratch-slot
ancestry is a device mask, and the only host state is the node count and the levels run (both known without
reading the device).

Position bookkeeping: the root sits at target position ``root_pos`` (per CFG row) and generation index
``root_gen``. A node at depth d ≥ 1 occupies drafter slot position ``root_pos + d − 1`` (the position of the
feature it is paired with) and its children are tokens at generation index ``root_gen + d + 1``.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from adtbench.algorithm.sampling import process_logits
from adtbench.models.base import Target
from adtbench.sampling_params import SamplingParams

if TYPE_CHECKING:
    from adtbench.algorithm.drafters.base import Drafter
    from adtbench.algorithm.tree import DraftTree


class DraftSession:
    """Per-cycle drafting state on the device.

    ``outputs [R, nodes, H]`` (the drafter output at each node; the root's came from ``extend``) and ``slot_bias
    [nodes, slots]``: the additive mask (0 / −inf) of which scratch slots node i's own slot attends (its ancestors'
    slots and its own; the root has no slot). Node i ≥ 1 occupies scratch slot i − 1.
    """

    def __init__(
        self,
        drafter: Drafter,
        target: Target,
        sp: SamplingParams,
        root_token: torch.Tensor,
        root_gen: int,
        root_pos: torch.Tensor,
        root_out: torch.Tensor,
        generator: torch.Generator | None,
        on_host: bool = False,
    ) -> None:
        self.drafter, self.target, self.sp = drafter, target, sp
        # the cycle's decisions run on the host (``engine.acceptance``: auto on the CPU): EAGLE-2 and sampled trees are
        # built on host copies of each level (numpy), the device path elsewhere — the same trees either way
        self.on_host = on_host
        self.layout = target.layout
        self.root_token = root_token.view(1)  # [1] long, on the device
        self.root_gen, self.root_pos = root_gen, root_pos
        self.generator = generator
        self.device = root_out.device
        self.outputs = root_out[:, None]
        self.slot_bias = _no_slots(root_out.dtype, self.device)  # [1, 0]: the root has no slot
        self.num_nodes = 1
        self.levels: list[int] = []  # nodes expanded per drafter forward (level 1 first)
        self.forwards = 0  # drafter forward passes this cycle (the root's came from ``extend``)

    @property
    def greedy(self) -> bool:
        return self.sp.greedy

    def logprobs(self, outputs: torch.Tensor, level: int) -> torch.Tensor:
        """Processed drafter log-probs ``[m, V]`` of outputs ``[R, m, H]`` at nodes of depth ``level`` (their children
        are tokens at generation index ``root_gen + level + 1``)."""
        raw = self.target.lm_head(outputs)  # [R, m, V]
        return process_logits(raw, self.root_gen + level + 1, self.layout, self.sp).log_softmax(-1)

    @torch.no_grad()
    def root_logprobs(self) -> torch.Tensor:
        """Drafter log-probs ``[V]`` over the root's children."""
        return self.logprobs(self.outputs[:, :1], 0)[0]

    @torch.no_grad()
    def expand(self, parents: torch.Tensor, tokens: torch.Tensor, level: int) -> tuple[range, torch.Tensor]:
        """Add node ``n0 + i`` = child ``tokens[i]`` of node ``parents[i]`` (device tensors ``[m]``; every parent at
        depth ``level − 1``); return the new node ids ``range(n0, n0 + m)`` and their children's log-probs
        ``[m, V]``. (``prepare``, the drafter's forward, ``receive``.)"""
        level_in = self.prepare(Expand(parents, tokens, level))
        return self.receive(level_in, self.drafter.expand(*level_in.inputs))

    def prepare(self, request: Expand) -> LevelInputs:
        """The drafter's inputs for ``request`` (``Drafter.expand``'s arguments), the session's ancestry updated: the
        first half of ``expand``, so that a batch runs one drafter forward for the levels of many sessions."""
        parents, tokens, level = request.parents, request.tokens, request.level
        m, base = parents.numel(), self.slot_bias.shape[1]
        if tokens.numel() != m or m == 0:
            raise ValueError("expand needs one token per parent and at least one node")
        if base != self.drafter.scratch:
            raise RuntimeError(f"drafter scratch ({self.drafter.scratch}) out of step with the session ({base})")
        # a new node's slot sees its parent's slots and itself: rows [m, base + m]
        own = _diagonal_bias(m, self.slot_bias.dtype, self.device)
        rows = torch.cat([self.slot_bias.index_select(0, parents), own], 1)
        self.slot_bias = torch.cat([torch.nn.functional.pad(self.slot_bias, (0, m), value=float("-inf")), rows], 0)
        feats = self.outputs.index_select(1, parents)  # [R, m, H]
        embeds = self.drafter.embed(self.target, tokens)[None].expand(feats.shape[0], -1, -1).to(feats.dtype)
        pos = self.root_pos[:, None].expand(-1, m) + (level - 1)
        return LevelInputs((feats, embeds, pos, rows), level)

    def receive(self, level_in: LevelInputs, out: torch.Tensor) -> tuple[range, torch.Tensor]:
        """The second half of ``expand``: the drafter's outputs ``[R, m, H]`` for the prepared level → the new node
        ids and their children's log-probs ``[m, V]``."""
        m, n0 = out.shape[1], self.num_nodes
        self.forwards += 1
        self.levels.append(m)
        self.num_nodes = n0 + m
        self.outputs = torch.cat([self.outputs, out], 1)
        return range(n0, n0 + m), self.logprobs(out, level_in.level)


@dataclass
class Expand:
    """A policy's request for one level of nodes: ``DraftSession.expand``'s arguments."""

    parents: torch.Tensor
    tokens: torch.Tensor
    level: int


@dataclass
class LevelInputs:
    """A prepared level: ``Drafter.expand``'s arguments (feats, embeds, positions, slot mask) and the level."""

    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    level: int


class QueuedPhase:
    """A batched slot's whole draft phase, queued for its batch to replay with the other slots' (the base of
    ``drafters.draft_phase.DraftPhase``; answered with the phase's tree tensors)."""


Request = Expand | QueuedPhase
"""What a policy's ``Steps`` yields: a level to draft eagerly, or its queued draft phase (a slot of a batch with
graphed levels)."""

Steps = Generator[Request, Any, "DraftTree"]
"""A policy's tree building as a coroutine: it yields each level it wants drafted (``Expand``), receives what
``DraftSession.expand`` returns for it, and returns the tree. ``drive`` runs one alone; ``algorithm.batch`` runs
those of many slots in lockstep, one drafter forward per round for all of them (a batched slot's graphed phase: one
replay for all of them, ``drafters.batch_phase``)."""


T = TypeVar("T")


def drive(steps: Generator[Request, Any, T], session: DraftSession) -> T:
    """Run a policy's ``Steps`` against one session (each request through ``session.expand``; a session alone
    replays its draft phase at once, never yielding it); returns the tree."""
    try:
        request = next(steps)
        while True:
            assert isinstance(request, Expand)
            request = steps.send(session.expand(request.parents, request.tokens, request.level))
    except StopIteration as done:
        result: T = done.value
        return result


Q = TypeVar("Q")


class Lockstep(Generic[Q, T]):
    """Many coroutines advanced together (``drive`` of one, for many): ``pending[s]`` is what coroutine s asks for
    now, ``done[s]`` what it returned. Started at construction (each one sent None, in the mapping's order); ``send(s,
    reply)`` answers s's request, after which s has a new request or is done. A driver answers every pending request
    of a round (one drafter forward for all of them) until none is left: ``algorithm.batch``'s slots' ``Steps``,
    ``drafters.batch_phase``'s slots' phase programs."""

    def __init__(self, works: dict[int, Generator[Q, Any, T]]) -> None:
        self.works = works
        self.pending: dict[int, Q] = {}
        self.done: dict[int, T] = {}
        for s in works:
            self.send(s, None)

    def send(self, s: int, reply: Any) -> None:
        try:
            self.pending[s] = self.works[s].send(reply)
        except StopIteration as finished:
            self.done[s] = finished.value
            self.pending.pop(s, None)


@lru_cache(maxsize=64)
def _no_slots(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The root's empty ``[1, 0]`` slot mask (cached, never written: ``prepare`` builds new tensors from it)."""
    return torch.zeros(1, 0, dtype=dtype, device=device)


@lru_cache(maxsize=256)
def _diagonal_bias(m: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[m, m]``: 0 on the diagonal, −inf elsewhere (cached, never written)."""
    return torch.full((m, m), float("-inf"), dtype=dtype, device=device).fill_diagonal_(0.0)
