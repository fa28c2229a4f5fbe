"""The draft phase as one graph replay: every drafting level of a cycle, the rerank and the tree in one program.

``drafters.graphed`` runs each level of a tree policy's drafting as one replay of its program (a function of the
attention width K reading and writing static buffers). SGLang's EAGLE runs the whole draft phase as one CUDA graph
per batch bucket (``EAGLEDraftCudaGraphRunner``); ``DraftPhase`` does the same by composition: a policy hands it its
level programs in drafting order (``add``, the signature of ``LevelGraphs.run``) and the tree's program (``run``),
and the phase captures them as ONE program per (phase key, K) — K the width holding the last level's columns
(``LevelGraphs.width`` of the largest ``end``) — and replays it once per cycle. The levels' math is theirs,
unchanged; the phase only chooses when they run. At B > 1 a slot's phase is not replayed alone: ``run`` yields it to
the batch, which replays every drafting slot's phase as one graph with one drafter forward per level for all slots
(``drafters.batch_phase``).

Exactness: a level run at a wider K than its own attends the same committed and scratch columns — the extra
columns are past every column it writes, −inf in the drafter's committed bias and never scattered into — so it
computes the same outputs (an extra −inf key adds an exact 0 to the softmax's sum; ``tests/test_draft_phase.py``
checks the trees against the per-level path in float64). The levels run in drafting order inside the program, so
each reads the buffers its predecessor wrote, as between two replays.

What stays on the host: the shape of the phase (the policy's decisions: rounds, widths, (D, K), the node count), the
counters each level's ``LevelGraphs.advance`` keeps, and — for sampled drafts — the draw of every level's noise into
its static buffer before the replay (in the per-level path's order, from the prompt's generator: a captured draw
would replay the capture's noise, and the stand-in refuses it).
"""

from __future__ import annotations

from collections.abc import Generator
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from adtbench.algorithm.drafters.session import QueuedPhase

if TYPE_CHECKING:
    from adtbench.algorithm.drafters.graphed import LevelGraphs, LevelRequest, Program


@lru_cache(maxsize=16)
def logprob_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a drafter's processed log-probs (at least float32), cached: ``torch.promote_types`` is a
    dispatched op, one per cycle otherwise."""
    return torch.promote_types(dtype, torch.float32)


class DraftPhase(QueuedPhase):
    """One cycle's level programs, replayed as one graph (module docstring). ``add`` has ``LevelGraphs.run``'s
    signature, so a policy's graphed levels are handed either to the graphs (one replay per level) or to a phase.
    ``run`` is a generator (``yield from phase.run(…)`` in a policy's ``Steps``): alone it replays at once and never
    yields; a slot of a batch (``LevelGraphs.batched``) yields the phase itself, and the batch replays every slot's
    phase together (``drafters.batch_phase``) and sends back this slot's tree tensors."""

    def __init__(self, graphs: LevelGraphs) -> None:
        self.graphs = graphs
        self.levels: list[tuple[Any, int | None, Program]] = []
        self.queued: list[tuple[Any, int | None, Program]] = []
        self.tree: Program | None = None
        self.key: Any = None

    def add(self, key: Any, end: int | None, program: Program, level: bool = True) -> None:
        """Queue a level (``LevelGraphs.run``'s arguments): it runs at the phase's width inside ``run``'s replay;
        ``end`` None — the program runs no drafter forward (it is handed K = None)."""
        self.levels.append((key, end, program))

    @property
    def ends(self) -> list[int]:
        """The queued drafting levels' ends (scratch slots after each: cumulative, so level j drafts
        ``ends[j] − ends[j − 1]`` nodes after ``ends[j − 1]`` scratch slots)."""
        return [end for _, end, _ in self.queued if end is not None]

    def run(self, key: Any, tree: Program | None = None) -> Generator[DraftPhase, Any, Any]:
        """Replay the queued levels then ``tree`` (called with None; it returns a tuple of tensors) as one graph keyed
        by ``key`` and every level's key, at the width holding the largest ``end``. Returns the tree's tensors as
        static buffers of the phase key, the same for every width (a graphed verify reads them in its replay:
        ``DraftTree.static``)."""
        self.queued, self.tree = list(self.levels), tree
        self.key = ("phase", key, tuple(k for k, _, _ in self.queued))
        self.levels.clear()
        if self.graphs.batched:  # the batch replays every slot's phase at once
            return (yield self)
        ends = self.ends
        run = lambda K: self.program(K)  # noqa: E731
        return self.graphs.run(self.key, max(ends) if ends else None, run, level=False)

    def program(self, K: int | None) -> Generator[LevelRequest, tuple[torch.Tensor, torch.Tensor], Any]:
        """The phase's work at width K: the queued levels in drafting order (each level's drafter forward yielded to
        the driver), then the tree's tensors copied into the phase key's static buffers."""
        for _, end, program in self.queued:
            work = program(None if end is None else K)
            if isinstance(work, Generator):
                yield from work
        if self.tree is None:
            return None
        name = f"phase.{hash(self.key)}"
        out = []
        for i, t in enumerate(self.tree(None)):
            buf = self.graphs.buffer(f"{name}.{i}", tuple(t.shape), t.dtype)
            buf.copy_(t)
            out.append(buf)
        return tuple(out)
