"""The drafter's catch-up as one graph replay (SGLang's ``EAGLEDraftExtendCudaGraphRunner``).

After a verify the drafter consumes the a + 1 committed slots (f_t, x_{t+1}) — the target's features at the accepted
path's nodes, paired with the next committed tokens — in one ``extend`` at the start of the next drafted cycle
(``engine.catch_up``). Op by op that is the path's gather, the positions, the embedding, the static bucket's input
copies and mask (``StaticDraft.load``), its replay, a copy of the output and the committed columns' marks: some 25
launches around one replay. Where the verify ran as a ``tree_step.TreeStep`` its outputs stay in the step's static
buffers — the features in path-first order (``path_feats``), the committed tokens (``following``), the root's
positions (``pos0``) and the verdict (``packed``: a + 1 first) — so the whole catch-up is one fixed-shape program of
those buffers and the drafter's pinned cache, captured per (step, slot bucket m, attention width K) by ``CatchUp``
(a ``graph_runner.GraphRunner``, one per drafter: ``runner_for``):

- m = the smallest drafter bucket ≥ a + 1; slot i < m takes ``path_feats[:, i]`` and the embedding of
  ``following[i]`` at position ``pos0 + i``, written at column L + i (L the drafter's committed length, a device
  scalar), seeing the committed columns (the drafter's ``bias`` before L) and columns L … L + i (causal, whatever
  the bias holds there: the program is idempotent, as a capture's warm-ups need — they mark L … L + a before the
  replay runs);
- the output at the root is row a (the device's a + 1 − 1) into ``out``; the drafter's ``valid`` / ``bias`` mark
  columns L … L + a inside the replay.

Slots i > a are padding, inert as the static bucket's: they write past the new committed length, where the next
drafting level overwrites them before any mask admits them, and their outputs are never read. The real slots compute
exactly what ``EagleDrafter.extend`` computes at the same bucket and width (same rows, same mask entries: greedy =
AR, ``tests/test_draft_phase.py``). The host keeps the counters (the drafter's length += a + 1); L is the device
length the draft phase loaded (``LevelGraphs.length``), or one write where that is stale. Several pending cycles
(a gated AR step between two verifies), a drafter without a pinned cache or graphs, or no bucket: the eager
``extend`` over ``CommittedSlots.tensors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adtbench.algorithm.tree import arange_on
from adtbench.graph_runner import GraphRunner, runner_for, runners_of


@dataclass
class CommittedSlots:
    """The a + 1 slots a graphed verify (``step``: a ``tree_step.TreeStep``) committed, left in its buffers until the
    drafter's catch-up (``k`` = a + 1; valid until that step's next verify, which follows the catch-up)."""

    step: Any
    k: int

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features ``[R, k, H]``, positions ``[R, k]``, next tokens ``[k]``): a pending cycle's eager form."""
        s, k = self.step, self.k
        return s.path_feats[:, :k], s.pos0[:, None] + arange_on(k, s.device)[None], s.following[:k]


class CatchUp(GraphRunner):
    """The catch-up graphs of one drafter over its pinned cache (module docstring): a ``GraphRunner`` keyed by (step,
    m, K, the output's storage, the length's), graphed as the drafter's levels are (``LevelGraphs.graphed``)."""

    def __init__(self, drafter: Any) -> None:
        p = drafter.fc.weight
        super().__init__(p.device, graphed=drafter.level_graphs.graphed)
        self.drafter, self.dtype = drafter, p.dtype
        self.length = self.buffer("length", (), torch.long)  # L, where the level graphs' is stale
        self.own = self.buffer("own", (drafter.static.rows, drafter.config.hidden_size), p.dtype)  # no level outputs

    def bucket(self, k: int) -> tuple[int, int] | None:
        """(slot bucket m, attention width K) for k slots after the committed ones, or None: no room at a bucket."""
        d = self.drafter
        st, L = d.static, d.length
        if d.pinned is None or d.cache is not d.pinned[0] or not st.fits(k, L):
            return None
        m = next(b for b in st.buckets if b >= k)
        return m, next(w for w in st.widths if w >= L + m)

    def run(self, target: Any, slots: CommittedSlots, m: int, K: int) -> torch.Tensor:
        """Replay (capturing it at its first use) the catch-up of ``slots`` at bucket ``m``, width ``K``; the host's
        counters follow. Returns the drafter's output at the new root ``[R, H]``: a static buffer — the level graphs'
        root row where they have one (``LevelGraphs.outputs[:, 0]``, which the draft phase reads without a copy)."""
        d, step = self.drafter, slots.step
        d.rollback()
        lg = d.level_graphs
        length = lg.length  # L on the device since the last draft phase loaded it (``LevelGraphs.begin``) …
        if d.length != lg.L:  # … unless that was not the last drafting
            length = self.length
            length.fill_(d.length)
        out = lg.outputs[:, 0] if lg.outputs.shape[1] > 0 else self.own
        out = self.launch(target, step, m, K, out, length)
        d.length += slots.k
        return out

    def launch(self, target: Any, step: Any, m: int, K: int, out: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """The replay of (``step``, m, K) from the drafter's length ``length`` (a device scalar) writing the root's
        output into ``out`` (``GraphRunner.replay_or_run``: captured at its first use)."""
        key = (id(step), m, K, id(target), out.data_ptr(), id(length))
        result: torch.Tensor = self.replay_or_run(key, lambda: self._program(target, step, m, K, out, length))
        return result

    def _program(self, target: Any, step: Any, m: int, K: int, root_out: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
        """The fixed-shape catch-up (module docstring): reads the step's buffers and the drafter's, writes ``root_out``
        (returned), the drafter's cache columns L … L + m − 1 and its ``valid`` / ``bias`` at L … L + a."""
        d, dev = self.drafter, self.device
        R = step.path_feats.shape[0]
        feats = step.path_feats[:, :m].to(self.dtype)
        embeds = d.embed(target, step.following[:m])[None].expand(R, -1, -1).to(self.dtype)
        rows = arange_on(m, dev)
        pos = step.pos0[:, None] + rows[None]
        rel = arange_on(K, dev) - L  # column − L
        causal = (rel[None] >= 0) & (rel[None] <= rows[:, None])  # [m, K]: columns L … L + i
        mask = catch_up_mask(rel, causal, d.bias[:, None, None, :K])
        out = d.static_forward(feats, embeds, pos, L + rows, mask)
        k = step.packed[:1].long()  # a + 1
        root_out.copy_(out.index_select(1, k - 1)[:, 0])
        cols = arange_on(d.bias.shape[1], dev) - L
        committed = ((cols >= 0) & (cols < k))[None]
        d.valid.masked_fill_(committed, True)
        d.bias.masked_fill_(committed, 0.0)
        return root_out


def catch_up_mask(rel: torch.Tensor, causal: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A catch-up's additive mask (B = 1 and batched, broadcast shapes): ``rel`` = column − L, ``causal`` True where
    new slot i may see the column (L … L + i), ``bias`` the committed columns' additive bias. Columns ≥ L come from
    the causal rule alone, never from ``bias``: a capture's warm-ups mark L … L + a before the replay runs, so the
    program stays idempotent (new slot i never sees a later one)."""
    return torch.where(rel >= 0, torch.where(causal, 0.0, float("-inf")), bias)


def catch_up_graphed(target: Any, drafter: Any, pending: list[Any]) -> torch.Tensor | None:
    """The drafter's catch-up of ``pending`` as one replay (module docstring) — its output at the new root — or None:
    the eager ``extend`` runs (not one graphed verify's slots, no graphed levels, no room at a bucket)."""
    if len(pending) != 1 or not isinstance(pending[0], CommittedSlots):
        return None
    if getattr(drafter, "level_graphs", None) is None:  # graphs requested on a device that has them
        return None
    runner = runner_for(drafter, CatchUp, None, lambda: CatchUp(drafter))
    shape = runner.bucket(pending[0].k)
    return None if shape is None else runner.run(target, pending[0], *shape)


def catch_up_of(drafter: Any) -> CatchUp | None:
    """``drafter``'s catch-up runner (``graphs``: (step id, m, K, …) → graph), None before the first catch-up."""
    runners = runners_of(drafter, CatchUp)
    return runners[0] if runners else None


def catch_up_replays(drafter: Any) -> int:
    """How many catch-ups of ``drafter`` ran as a graph replay."""
    runner = catch_up_of(drafter)
    return 0 if runner is None else runner.replays


def materialised(pending: list[Any]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``pending`` in its eager form: each ``CommittedSlots`` as its tensors."""
    return [p.tensors() if isinstance(p, CommittedSlots) else p for p in pending]


__all__ = [
    "CatchUp",
    "CommittedSlots",
    "catch_up_graphed",
    "catch_up_mask",
    "catch_up_of",
    "catch_up_replays",
    "materialised",
]
