"""Graphed drafting levels: one level of a tree policy's drafting as one CUDA graph replay per attention width.

Eager drafting issues, per level, the drafter's ``expand`` bookkeeping (the slot-mask rows, gathers of the parents'
outputs, the embedding, positions, the static bucket's input copies and mask), its forward (already a captured
graph under ``engine.compile``), the LM head, the logits processing and the policy's selection (a top-k, Gumbel keys,
the next frontier): some 30–60 kernel launches and a few hundred µs of host time for ≈ 0.15 ms of device work on the
7B shape. Here a policy hands the whole level to ``LevelGraphs.run`` as a *program*: a function of the attention
width K that reads and writes only static buffers, captured once per (level key, K) — ``LevelGraphs`` is a
``graph_runner.GraphRunner``: a CUDA graph on a GPU, its stand-in elsewhere — and replayed by every later level with
the same key and width (``engine.graphs.levels``: ``eager`` drafts op by op instead). The host keeps the policy's
decisions (ADT's depth and width, ``budget: cost``'s node count, how many rounds), the per-cycle load
(``begin``: the root's drafter output, the drafter's committed length, the root's generation index and positions —
five small device writes) and one launch per level: the replay (plus, for sampled drafts, the draw of the level's
noise into a static buffer outside the graph: a graph replays its capture's draws, and each prompt draws from its
own generator).

The cycle's state on the device (``LevelGraphs``), sized to the largest tree asked for (``ensure``):

- ``outputs [R, nodes, H]``: the drafter output at session node i (node 0 the root, from ``extend``; node i ≥ 1 the
  output of scratch slot i − 1);
- ``anc [nodes, slots]``: additive (0 / −inf) slot ancestry: row i admits the scratch slots of node i's ancestors
  and its own (row 0, the root, admits none);
- ``length`` (the drafter's committed length L), ``root_gen`` (the root's generation index g), ``root_pos [R]``,
  ``root`` (the root's token ``[1]``).

``expand`` is the drafting session's ``expand`` on that state, for a program (a generator: it yields the level's
drafter inputs, ``LevelRequest``, and its driver runs the forward — ``drive`` here, one forward of the batch's drafter
for every slot in ``drafters.batch_phase``): m new nodes at session ids
``n0 … n0 + m − 1`` (scratch slots ``S = n0 − 1 …``), children of ``parents [m]`` (a static buffer the previous
level's program wrote), tokens ``tokens [m]``, at depth ``level``. Their slot rows are the parents' rows plus their
own slot; the drafter's mask ``[R, 1, m, K]`` is its committed key bias over the first K columns (0 on committed
columns, −inf past L) with the rows scattered at columns ``L + 0 … L + S + m − 1``; they are written at columns
``L + S + i`` of the pinned cache (``EagleDrafter.static_forward`` with a tensor of columns); their outputs go to
``outputs[:, n0 : n0 + m]`` and their children's log-probs are ``process_logits(lm_head(out), g + level + 1)``
(the generation index a device scalar: ``sampling.constrain``'s table path) → ``log_softmax``, the session's own
``logprobs``. Everything but L, g and the positions is known on the host when the program is built (m, n0, level,
K); those three are device scalars read by the graph, so one graph serves every cycle.

Exactness: a level computes what ``DraftSession.expand`` computes for the real slots — the same mask entries, the
same columns, the same processing (tested against the eager levels in float64 on the CPU, and greedy tokens equal AR
greedy's for every tree policy on the simulated device, ``tests/test_graphed_levels.py``). The forward runs at m
rows, not at the static bucket's padded size, so on a GPU the matrix products may round like another M
(float32 / bf16 ulps; trees may differ where the drafter's log-probs tie at that precision — the verify decides
acceptance, so the output law is unchanged).

Capture happens at a level's first use with its real inputs loaded: the warm-up runs compute the level (programs are
idempotent: they read their inputs and write other buffers), and the first replay right after capture gives the
graph's outputs. A captured graph reads the buffers of its capture: ``ensure`` reallocating them drops every graph.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.tree import arange_from
from adtbench.graph_runner import GraphRunner

if TYPE_CHECKING:
    from adtbench.algorithm.drafters.session import DraftSession
    from adtbench.layout import TokenLayout
    from adtbench.models.base import Target
    from adtbench.sampling_params import SamplingParams

MIN_SLOTS = 128
"""The scratch slots the state holds at least (the largest static bucket): ADT's trees change size from cycle to cycle,
and growing the state drops every graph."""

Program = Callable[[int | None], Any]
"""A level's work as a function of the attention width K (None: the level runs no drafter forward), reading and
writing static buffers only; what it returns is the graph's output (static tensors every replay rewrites). A program
that drafts is a generator (``yield from graphs.expand(…)``): its driver serves the forward (``LevelGraphs.drive``)."""


@dataclass
class LevelRequest:
    """One level's drafter inputs (``LevelGraphs.expand`` yields it): ``feats``, ``embeds [R, m, H]``, positions
    ``[R, m]``, the nodes' ancestry ``rows [m, slots]`` (additive, 0 on scratch slots ``< S + m`` they attend), the
    scratch slots before them ``S``, their count ``m``, the attention width ``K``, their depth ``level`` and the
    (target, layout, sampling params) of their log-probs (``head``). The driver answers (outputs ``[R, m, H]``,
    the children's log-probs ``[m, V]``)."""

    feats: torch.Tensor
    embeds: torch.Tensor
    pos: torch.Tensor
    rows: torch.Tensor
    S: int
    m: int
    K: int
    level: int
    head: tuple[Target, TokenLayout, SamplingParams]


class LevelGraphs(GraphRunner):
    """The graphed levels of one drafter over its pinned cache (module docstring): a ``GraphRunner`` keyed by (level
    key, K). ``replays`` counts the graphs replayed (``GraphRunner``), ``tree_replays`` those of them that finalised a
    tree (``level_replays``: the levels), ``captures`` the graphs captured; ``buffer(name, …)`` gives a program's own
    static buffers."""

    phases = True
    """The policies queue their levels into one replay per cycle (``drafters.draft_phase``); False: one per level."""
    batched = False
    """A slot of a batch (``drafters.batch_phase.SlotLevels``): its phase is replayed with the other slots'."""

    def __init__(self, drafter: Any, rows: int, capacity: int, widths: tuple[int, ...], weights: Any = None) -> None:
        """``drafter``: an ``EagleDrafter`` with its pinned cache (``static_forward``, ``bias``, ``embed``; not
        imported: it owns this object); ``weights``: the network whose dtype and width the state takes (the
        drafter's own by default; a batch slot's drafter has none)."""
        net = drafter if weights is None else weights
        p = net.fc.weight
        super().__init__(p.device)
        self.drafter, self.rows, self.capacity, self.widths = drafter, rows, capacity, widths
        self.dtype, self.hidden = p.dtype, net.config.hidden_size
        self.length = torch.zeros((), dtype=torch.long, device=self.device)
        self.root_gen = torch.zeros((), dtype=torch.long, device=self.device)
        self.root_pos = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.root = torch.zeros(1, dtype=torch.long, device=self.device)  # the root's token
        self.nodes = self.slots = 0
        self.outputs = torch.zeros(rows, 0, self.hidden, dtype=self.dtype, device=self.device)
        self.anc = torch.zeros(0, 0, dtype=self.dtype, device=self.device)
        self.tree_replays = 0
        self.L = 0  # the drafter's committed length this cycle (host)

    # --- the cycle's state ----------------------------------------------------------------------------------
    def ensure(self, nodes: int, slots: int) -> None:
        """Room for ``nodes`` session nodes and ``slots`` scratch slots; growing reallocates the state and drops every
        graph and program buffer (they read the old storages)."""
        if nodes <= self.nodes and slots <= self.slots:
            return
        slots = max(slots, self.slots, MIN_SLOTS)  # sized once for any policy's trees, in practice (no recapture)
        self.nodes, self.slots = max(nodes, self.nodes, slots + 1), slots
        self.outputs = torch.zeros(self.rows, self.nodes, self.hidden, dtype=self.dtype, device=self.device)
        self.anc = torch.full((self.nodes, self.slots), float("-inf"), dtype=self.dtype, device=self.device)
        self.drop()

    def fits(self, slots: int) -> bool:
        """Whether ``slots`` scratch slots after the committed ones fit the pinned cache (else the cycle drafts
        eagerly)."""
        d = self.drafter
        return d.pinned is not None and d.cache is d.pinned[0] and d.length + slots <= self.capacity

    def begin(self, session: DraftSession) -> None:
        """Load the cycle: the root's drafter output and token, L, g and the root's positions (five device writes, no
        read)."""
        self.L = self.drafter.length
        root, row = session.outputs[:, 0], self.outputs[:, 0]
        if root.data_ptr() != row.data_ptr() or root.stride() != row.stride():  # else the catch-up wrote it here
            row.copy_(root)
        self.root.copy_(session.root_token)
        self.length.fill_(self.L)
        self.root_gen.fill_(session.root_gen)
        self.root_pos.copy_(session.root_pos)

    # --- running a level ----------------------------------------------------------------------------------
    def width(self, end: int) -> int:
        """The attention width (capacity bucket) of a level writing columns below ``L + end``."""
        need = self.L + end
        return next(w for w in self.widths if w >= need)

    def run(self, key: Any, end: int | None, program: Program, level: bool = True) -> Any:
        """Replay ``key``'s graph at the width holding this cycle's columns ``< L + end`` (``end`` None: the program
        runs no drafter forward, one graph); capture it first at its first use. Returns the graph's outputs.
        ``level`` False: a tree's finalisation (counted in ``tree_replays`` too, not in ``level_replays``)."""
        K = None if end is None else self.width(end)
        out = self.replay_or_run((key, K), lambda: self.drive(program(K)))
        self.tree_replays += not level
        return out

    @property
    def level_replays(self) -> int:
        """The graph replays that ran a drafting level (not a tree's finalisation)."""
        return self.replays - self.tree_replays

    # --- the programs' building blocks (run inside a capture) -----------------------------------------------
    def root_logprobs(self, target: Target, layout: TokenLayout, sp: SamplingParams) -> torch.Tensor:
        """The drafter's log-probs over the root's children ``[V]`` (``DraftSession.root_logprobs`` on the state)."""
        return self.logprobs(target, layout, sp, self.outputs[:, :1], 0)[0]

    def logprobs(
        self, target: Target, layout: TokenLayout, sp: SamplingParams, out: torch.Tensor, level: int
    ) -> torch.Tensor:
        """``DraftSession.logprobs`` with the generation index on the device: ``[m, V]``."""
        raw = target.lm_head(out)
        return process_logits(raw, self.root_gen + (level + 1), layout, sp).log_softmax(-1)

    def expand(
        self,
        target: Target,
        layout: TokenLayout,
        sp: SamplingParams,
        parents: torch.Tensor,
        tokens: torch.Tensor,
        n0: int,
        level: int,
        K: int,
    ) -> Generator[LevelRequest, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """Nodes ``n0 …`` = ``tokens [m]`` under session nodes ``parents [m]`` at depth ``level`` (module docstring);
        returns their children's log-probs ``[m, V]``. A generator (``lp = yield from graphs.expand(…)``): it yields
        the level's drafter inputs (``LevelRequest``) and receives the forward's outputs ``[R, m, H]`` and log-probs —
        the driver (``drive``: this drafter's one forward; a batch's phase: one forward and one LM head for every
        slot) owns the forward and the head."""
        m, S = parents.numel(), n0 - 1
        rows = self.anc.index_select(0, parents)  # [m, slots]: −inf from the parents' slots on (S …)
        rows[:, S : S + m] = _diagonal(m, self.dtype, self.device)
        self.anc[n0 : n0 + m] = rows  # whole rows: no slot of an earlier cycle's tree stays admitted
        feats = self.outputs.index_select(1, parents)
        embeds = self.drafter.embed(target, tokens)[None].expand(self.rows, -1, -1).to(self.dtype)
        pos = (self.root_pos + (level - 1))[:, None].expand(self.rows, m).contiguous()
        out, lp = yield LevelRequest(feats, embeds, pos, rows, S, m, K, level, (target, layout, sp))
        self.outputs[:, n0 : n0 + m] = out
        return lp

    def forward(self, req: LevelRequest) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter forward of one level (``LevelRequest``) and its children's log-probs: written at columns
        ``L + S + i`` of the pinned cache, the mask its committed key bias over the first K columns with the ancestry
        rows scattered at columns ``L + 0 … L + S + m − 1``. Returns the outputs ``[R, m, H]`` and log-probs
        ``[m, V]``."""
        S, m, K, R, d = req.S, req.m, req.K, self.rows, self.drafter
        write = self.length + arange_from(S, S + m, self.device)
        cols = (self.length + arange_from(0, S + m, self.device))[None, None, None].expand(R, 1, m, S + m)
        mask = d.bias[:, None, None, :K].expand(R, 1, m, K).clone()
        mask.scatter_(-1, cols, req.rows[None, None, :, : S + m].expand(R, 1, m, S + m))
        out: torch.Tensor = d.static_forward(req.feats, req.embeds, req.pos, write, mask)
        return out, self.logprobs(*req.head, out, req.level)

    def drive(self, work: Any) -> Any:
        """A program's result run to its end: a generator's level requests each served by ``forward`` (its return
        value returned); anything else returned as it is."""
        if not isinstance(work, Generator):
            return work
        try:
            request = next(work)
            while True:
                request = work.send(self.forward(request))
        except StopIteration as done:
            return done.value

    def advance(self, session: DraftSession, m: int) -> range:
        """The host's bookkeeping of a graphed level of ``m`` nodes (``DraftSession.receive``'s counters and the
        drafter's scratch count); returns the new node ids."""
        n0 = session.num_nodes
        session.forwards += 1
        session.levels.append(m)
        session.num_nodes = n0 + m
        self.drafter.scratch += m
        return range(n0, n0 + m)


def levels_for(session: DraftSession, nodes: int, slots: int) -> LevelGraphs | None:
    """The session's graphed levels for a tree of at most ``nodes`` session nodes (root included) and ``slots``
    scratch slots, the cycle loaded (``begin``) — or None: drafting runs eagerly (no graphs requested, the cycle's
    decisions on the host, another drafter kind, or no room in the pinned cache)."""
    graphs: LevelGraphs | None = getattr(getattr(session, "drafter", None), "level_graphs", None)
    if graphs is None or getattr(session, "on_host", False) or session.num_nodes != 1 or not graphs.fits(slots):
        return None
    graphs.ensure(nodes, slots)
    graphs.begin(session)
    return graphs


@lru_cache(maxsize=256)
def _diagonal(m: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[m, m]``: 0 on the diagonal, −inf elsewhere (cached, never written)."""
    return torch.full((m, m), float("-inf"), dtype=dtype, device=device).fill_diagonal_(0.0)
