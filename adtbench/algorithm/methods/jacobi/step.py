"""The device-resident Jacobi step: one SCD / SJD / GSD forward as one CUDA graph replay, the verdict read one step
late (``engine.graphs.step``; ``algorithm.jacobi`` holds the method, this module only its fixed-shape execution).

The eager loop (``jacobi.iteration``) sizes the window on the host, builds the chain, runs the verify (a bucketed
graph replay, ``models.graphs``), accepts on the device, reads the verdict (one blocking read), commits and redraws —
≈ 80–120 host launches around the replay. Here the whole iteration is one fixed-shape function of static device
buffers, so it can be captured:

- **State** (``JacobiStep``, a ``graph_runner.GraphRunner``: one per target bucket, window and sampling setting,
  reused by every image — ``runner_for`` — its static buffers): ``seq``
  (generation-indexed tokens: committed, the root at g, the drafts after it), ``q [L, V]`` (row i: the proposal of
  the draft at g + 1 + i; the last row 0), ``g [1]`` (the root), the image's prompt columns, committed length and
  position base, ``kept [1]`` (coupled redraws that kept their draft), the verdict ``[3]`` and the draws.
- **Fixed window.** The chain always has L nodes (L = ``policy.window``, or the calibrated L of ``window: cost``); the
  image end is static: m = clamp(n − g − 2, 0, L − 1) drafts are testable (the room clamp: drafts past it are never
  accepted, ``verify.chain_verdict``'s ``live``), and ``live`` = g + 1 < end makes a step past the image's last
  token a no-op (no state written). Every size that depended on the accepted count a is a mask or a gather: the
  bonus goes to g + a + 1 by ``index_copy_``; the next window's row i (position g + a + 2 + i) is the redraw of
  processed row a + 1 + i where i < r = min(m − a, room after the bonus) (``jacobi.draws.redraw``: coupled to the old
  draft where i < m − a − 1), else a new draft (``jacobi.draws.init_drafts`` at the device position s = g + a + 2 + r);
  q is gathered the same way.
- **The verify** writes the static bucket's inputs (``graphs.StaticVerify``'s tokens, positions, written columns and
  the mask of the chosen attention width, built from the device length: the prompt's bias below the prompt columns,
  0 up to the committed length, the chain's causal block after it) and runs its static forward; the K/V of nodes
  0 … a are already in place (a chain's path), so the commit is the move of g (length = length₀ + g).
- **Draws** are filled outside the graph from the prompt's own generator into one static buffer (``[4(L−1) + 1]``
  uniforms: acceptance, the bonus by inverse CDF, the coupling's keep test, the residual draws, ``init: random``),
  so the graph holds no random op (``accel_graphs.capture`` refuses one from an unregistered generator).

**Host per forward** (``run_image``): fill the draws (one launch; none when greedy), launch the step (one graph
replay per attention width, captured the first time that width is needed — the warm-up image's — with the step
switched off, ``capture_scope``), copy the verdict
(live, g, a) to pinned memory without waiting (``accel.copy_to_host``) and record a fence; then wait on the fence of
the *previous* forward, which the device has finished or is finishing while this one is queued, and read its
verdict from the pinned buffer (a numpy view: no torch call) for the records. The width of a launch is chosen from
what the host knows one step late: g ≤ g_read + L·(unread steps), attention over length₀ + that + bucket columns.
The image ends at the first read showing the last token committed; the forward launched meanwhile is an idle one
(``live`` false; at most one per image, ``stats["idle_forwards"]``). The tokens and the kept count are read once,
at the end. On the simulated device: 1 draws op + 1 replay + 1 copy per forward, no device read inside the loop.

**The law** is the eager loop's: the same acceptance (``chain_verdict``), redraw and init functions on the same rows;
only where the uniforms come from (a buffer filled from the same generator) and the bonus draw's mechanism (inverse
CDF of one uniform instead of the exponential race: the same categorical law) differ, so a seed gives other tokens
than the eager loop at T > 0 and the same tokens (AR's) when greedy. ``tests/test_jacobi_step.py`` checks greedy =
AR and the T = 1 law on the graph stand-in, float64.

**Where it runs** (``engine.graphs.step``): ``auto`` — when the target's verifies are captured as graphs
(``engine.compile=true`` on CUDA or the simulated device) and the loop's acceptance is on the device; ``graph`` —
always (a ``ConfigError`` naming ``engine.graphs.step`` where the setting cannot: a window rule that declares
``device_step = False`` (``windows``: ``adaptive``), ``init: drafter``, ``redraw: gumbel`` (these three when the
policy is built, ``config.build_policy``), a rule
other than exact / GSD, L < 2, a target without static buckets; on a target whose buckets are not captured it
runs the same fixed-shape step eagerly); ``eager`` — the host-driven loop, which stays
the CPU path and the fallback (an image whose prompt outgrows the pinned cache runs it too).
"""

from __future__ import annotations

from collections.abc import Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.methods.gsd import GroupedRule
from adtbench.algorithm.methods.jacobi.draws import init_drafts, layout_tables, redraw
from adtbench.algorithm.methods.jacobi.loop import JacobiParams
from adtbench.algorithm.records import Clock, CycleRecord
from adtbench.algorithm.sampling import draw_into, process_logits, sample_rows_cdf
from adtbench.algorithm.slot import Timing, decides_on_host
from adtbench.algorithm.tree import arange_on
from adtbench.algorithm.verify import AcceptanceRule, chain_verdict
from adtbench.errors import ConfigError
from adtbench.graph_runner import GraphRunner, runner_for, switched_off
from adtbench.models.base import Target
from adtbench.models.graphs import bucket_of
from adtbench.sampling_params import SamplingParams


def refusal(params: JacobiParams, rule: AcceptanceRule, target: Any, window: int | None) -> str | None:
    """Why the fixed-shape step cannot run this setting (None: it can): the reasons of the module docstring."""
    why = params.step_refusal()  # the keys' reasons (a ConfigError already when engine.graphs.step=graph)
    if why is not None:
        return why
    if type(rule) not in (AcceptanceRule, GroupedRule):
        return f"the rule {type(rule).__name__} (exact and GSD's grouped rule only)"
    L = _window(params, window)
    if L is None or L < 2:
        return "a window of at least 2 nodes"
    static = getattr(target, "static", None)
    if static is None:
        return "a target with static-shape verifies (engine.compile=true on CUDA, or request_static)"
    if bucket_of(L, static.buckets) is None:
        return f"a node bucket of {L} nodes"
    if target.layout.num_gen_tokens < 2:
        return "an image of at least 2 tokens"
    return None


def _window(params: JacobiParams, window: int | None) -> int | None:
    return params.window if isinstance(params.window, int) else window


def chooses_graph(
    mode: str, params: JacobiParams, rule: AcceptanceRule, target: Any, window: int | None, on_host: bool
) -> bool:
    """Does ``mode`` (``engine.graphs.step``) select the fixed-shape step for this decode (module docstring, "Where it
    runs")? ``on_host``: the loop decides on the host (``slot.decides_on_host``). Raises a ``ConfigError`` naming
    ``engine.graphs.step`` where ``graph`` cannot run."""
    if mode == "eager":
        return False
    why = refusal(params, rule, target, window)
    if mode == "graph":
        if why is not None:
            raise ConfigError("engine.graphs.step", f"graph needs {why}")
        return True
    return why is None and not on_host and bool(target.static.captures)


# --------------------------------------------------------------------------------------------------------
# the state and the step
# --------------------------------------------------------------------------------------------------------


def step_for(target: Any, params: JacobiParams, sp: SamplingParams, rule: AcceptanceRule, L: int) -> JacobiStep:
    """The ``JacobiStep`` of this target's static buckets, window and setting (``runner_for``: made once, reused by
    every image — its buffers are the graphs' addresses)."""
    key = (L, params.init, params.redraw, params.proposal, sp, id(rule))
    return runner_for(target.static, JacobiStep, key, lambda: JacobiStep(target, params, sp, rule, L))


@dataclass
class ImageRecords:
    """What the host builds from the verdicts of one image: the cycles, the accepted-length histogram, the coupled
    redraws, the forwards launched."""

    cycles: list[CycleRecord] = field(default_factory=list)
    hist: list[int] = field(default_factory=list)
    coupled: int = 0
    launched: int = 0


class JacobiStep(GraphRunner):
    """The static buffers and the per-width step graphs of one (target, L, setting) (module docstring): a
    ``GraphRunner`` keyed by the attention width, graphed where the target's verifies are captured."""

    def __init__(self, target: Any, params: JacobiParams, sp: SamplingParams, rule: AcceptanceRule, L: int) -> None:
        static, dev = target.static, target.device
        super().__init__(dev, graphed=bool(static.captures))  # the target's verifies are captured: so is the step
        self.target, self.params, self.sp, self.rule, self.L = target, params, sp, rule, L
        self.layout, self.greedy = target.layout, sp.greedy
        self.n = self.layout.num_gen_tokens
        bucket = bucket_of(L, static.buckets)
        assert bucket is not None, "refusal() checked the bucket"
        self.b: int = bucket
        self.bucket = static.steps[bucket]
        self.rows, self.capacity = static.rows, static.capacity
        D, V, b, pad = L - 1, self.layout.vocab_size, self.b, L + 1
        self.tables = layout_tables(self.layout, dev, torch.promote_types(target.dtype, torch.float32), pad)
        long, buffer = torch.long, self.buffer
        self.seq = buffer("seq", (self.n + pad,), long)
        self.q = None if sp.greedy else buffer("q", (L, V), self.tables.uniform.dtype)
        self.g = buffer("g", (1,), long)
        self.end = buffer("end", (1,), long)  # live while g + 1 < end
        self.on = buffer("on", (1,), torch.bool)  # False: every step a no-op (captures)
        self.length0 = buffer("length0", (1,), long)
        self.pcols = buffer("pcols", (1,), long)
        self.pos0 = buffer("pos0", (self.rows,), long)
        self.prompt_bias = buffer("prompt_bias", (self.rows, self.capacity), target.dtype)
        self.kept = buffer("kept", (1,), long)
        self.verdict = buffer("verdict", (3,), long)  # (live, g, a) of the last step
        self.draws = buffer("draws", (4 * D + 1,), torch.float64)
        chain = torch.where(torch.ones(L, L, dtype=torch.bool, device=dev).tril(), 0.0, float("-inf"))
        block = torch.full((b, b), float("-inf"), dtype=target.dtype, device=dev).fill_diagonal_(0.0)
        block[:L, :L] = chain.to(target.dtype)
        self.block = block  # additive [b, b]: the chain's causal block, the padded nodes' identity
        self.host = [accel.pinned((3,), torch.long, dev) for _ in range(2)]  # two verdicts in flight
        self.host_np = [h.numpy() for h in self.host]  # read without a torch call
        self.fences = [accel.Fence(dev), accel.Fence(dev)]

    # --- the image's buffers, eager (once per image) ---

    def fits(self) -> bool:
        """Does this image run on the pinned cache with room for the step's last forward?"""
        t = self.target
        return t.cache is t.pinned and t.rows == self.rows and t.length + self.n + self.b <= self.capacity

    @torch.no_grad()
    def start_image(self, root: torch.Tensor, generator: torch.Generator | None, limit: int | None) -> None:
        """Load a prefilled image: the root at g = 0, the first window's drafts (``jacobi.draws.init_drafts``), the
        prompt's bias and the target's length and positions."""
        t, D = self.target, self.L - 1
        plen = t.prompt_cols
        self.prompt_bias[:, :plen].copy_(t.key_bias[:, :plen])
        self.pcols.fill_(plen)
        self.length0.fill_(t.length)
        self.pos0.copy_(t.next_pos)
        self.seq.zero_()
        self.seq[:1].copy_(root.view(1))
        self.g.zero_()
        self.kept.zero_()
        self.end.fill_(self.n if limit is None else min(self.n, limit))
        self.on.fill_(True)
        p = self.params
        tok, q = init_drafts(p.init, self.seq, 1, D, self.layout, self.tables, generator, self.greedy, p.proposal)
        self.seq[1 : 1 + D].copy_(tok)
        if self.q is not None:
            assert q is not None
            self.q[:D].copy_(q)
            self.q[D:].zero_()

    def finish_image(self, g: int, forwards: int) -> tuple[list[int], int]:
        """After the image's last read: put the target's host state where the eager loop leaves it (``commit``), and
        read the tokens and the kept count (the image's one read at its end)."""
        t = self.target
        t.next_pos = t.next_pos + g
        t._mark_valid(t.length, g)
        t.length += g
        t.forwards += forwards
        values = torch.cat([self.seq[: g + 1], self.kept]).tolist()
        return [int(x) for x in values[:-1]], int(values[-1])

    # --- the step ---

    def width_for(self, g_hi: int) -> int:
        """The attention width of a step whose root is at most ``g_hi``: the smallest capacity bucket holding the
        committed columns and the bucket's block."""
        width: int = self.bucket._width_for(int(self.target.length) + min(g_hi, self.n - 1) + self.b)
        return width

    def launch(self, K: int) -> None:
        """One step at attention width ``K``: its graph's replay (captured at the first use of ``K``, with the step
        switched off so that the warm-ups and the capture change no state: ``capture_scope``), or the step run eagerly
        where the target's verifies are not graphed (``GraphRunner.replay_or_run``)."""
        self.replay_or_run(K, lambda: self._step(K))

    def capture_scope(self, key: Hashable) -> AbstractContextManager[None]:
        """The step switched off (``on`` False) while captured: its warm-ups and capture change no state."""
        return switched_off(self.on)

    def _step(self, K: int) -> None:
        """The fixed-shape iteration (module docstring): everything from the static buffers, nothing read."""
        L, D, n, dev = self.L, self.L - 1, self.n, self.device
        p, sp, st = self.params, self.sp, self.bucket
        g = self.g
        live = self.on & (g + 1 < self.end)
        m = torch.where(live, (n - g - 2).clamp(0, D), 0)  # testable drafts: the room clamp
        nodes = arange_on(L, dev)
        chain = self.seq.index_select(0, g + nodes)  # root, d_1 … d_{L−1}
        # the verify: the bucket's inputs from the device length, then its static forward
        length = self.length0 + g
        st.tokens[:L].copy_(chain)
        st.pos[:, :L].copy_(self.pos0[:, None] + (g + nodes)[None])
        col = arange_on(K, dev)
        base = torch.where(col < self.pcols, self.prompt_bias[:, :K], 0.0)
        st.place(length, torch.where(col < length, base, float("-inf")), self.block, K)  # base [R, K]
        raw = st._forward_at(K)[0][:, :L]
        processed = process_logits(raw, g + 1 + nodes, self.layout, sp)
        # acceptance (the eager loop's law, verify.chain_verdict), the room clamp as its live count
        draws = self.draws
        u_acc, u_bonus = draws[:D], draws[D : D + 1]
        verdict = chain_verdict(
            chain[1:],
            processed,
            self.q,
            self.greedy,
            self.rule,
            None if self.greedy else u_acc,
            m,
            lambda row: sample_rows_cdf(row.view(1, -1), None, u_bonus)[0],
        )
        a = verdict.last.view(1)
        self.verdict.copy_(torch.cat([live.to(torch.long), g, a]))
        bonus_at = g + a + 1
        # the next window: row i at position g + a + 2 + i
        rows = arange_on(D, dev)
        pos = bonus_at + 1 + rows
        room = (n - bonus_at - 2).clamp(0, D)
        r = torch.minimum(m - a, room)  # redrawn rows
        redrawn = rows < r
        src = (a + 1 + rows).clamp_max(L - 1)  # the processed row (and old proposal row) of each position
        old = self.seq.index_select(0, pos)
        p_rows = processed.index_select(0, src)
        if self.greedy:
            tok = p_rows.argmax(-1)
            new_q = None
        else:
            assert self.q is not None
            probs = p_rows.softmax(-1)
            has_old = rows < m - a - 1
            q_old = torch.where(has_old[:, None], self.q.index_select(0, src), 0.0)  # no old draft: q_old = 0
            tok, new_q, kept = redraw(
                p.redraw,
                probs,
                old,
                q_old,
                has_old,
                None,
                draws=(draws[D + 1 : 2 * D + 1], draws[2 * D + 1 : 3 * D + 1]),
            )
            if p.redraw != "independent":
                self.kept.add_((kept & redrawn & live).sum().view(1))
        # the bonus and the redraws first (``up`` / ``left`` read them), then the new drafts after them
        self.seq.index_copy_(0, bonus_at, torch.where(live, verdict.bonus.view(1), self.seq.index_select(0, bonus_at)))
        self.seq.index_copy_(0, pos, torch.where(live & redrawn, tok, old))
        first_new = bonus_at + 1 + r
        init_tok, init_q = init_drafts(
            p.init,
            self.seq,
            first_new,
            D,
            self.layout,
            self.tables,
            None,
            self.greedy,
            p.proposal,
            u=draws[3 * D + 1 :],
        )
        at_new = (rows - r).clamp_min(0)
        fresh = init_tok.index_select(0, at_new)
        self.seq.index_copy_(0, pos, torch.where(live & ~redrawn, fresh, self.seq.index_select(0, pos)))
        if self.q is not None:
            assert new_q is not None and init_q is not None
            window = torch.where(redrawn[:, None], new_q.to(self.q.dtype), init_q.index_select(0, at_new))
            self.q[:D].copy_(torch.where(live, window, self.q[:D]))
        self.g.copy_(torch.where(live, bonus_at, g))

    # --- the host loop of one image ---

    def run_image(
        self,
        root: torch.Tensor,
        generator: torch.Generator | None,
        limit: int | None,
        clock: Clock,
        timing: Timing,
    ) -> tuple[list[int], dict[str, Any], ImageRecords]:
        """Decode the prefilled image (module docstring, "Host per forward"); returns its tokens, its statistics and
        its records."""
        self.start_image(root, generator, limit)
        n, L = self.n, self.L
        end = n if limit is None else min(n, limit)
        rec = ImageRecords()
        g_read, unread = 0, 0
        while True:
            start = clock.mark()
            if not self.greedy:
                draw_into(self.draws, "uniform_", generator)
            drafted = clock.mark()
            self.launch(self.width_for(g_read + L * unread))
            verified = clock.mark()
            slot = rec.launched % 2
            accel.copy_to_host(self.host[slot], self.verdict)
            self.fences[slot].record()
            timing.cycle(start, drafted, verified, clock.mark())
            rec.launched += 1
            unread += 1
            if unread < 2:
                continue
            prev = 1 - slot
            self.fences[prev].wait()
            unread -= 1
            live, g0, a = (int(x) for x in self.host_np[prev])
            assert live, "a step after the image's end was read"
            self._record(rec, g0, a)
            g_read = g0 + a + 1
            if g_read + 1 >= end:
                break
        tokens, kept = self.finish_image(g_read, rec.launched)
        p = self.params
        stats = {
            "window": p.window,
            "init": p.init,
            "redraw": p.redraw,
            "rule": p.rule,
            "window_mean": sum(c.nodes for c in rec.cycles) / max(1, len(rec.cycles)),
            "accept_hist": list(rec.hist),
            "kept": kept,
            "coupled": rec.coupled,
            "kept_frac": kept / rec.coupled if rec.coupled else None,
            "target_forwards": len(rec.cycles),
            "step": "graph" if self.graphed else "fixed-shape",
            "idle_forwards": rec.launched - len(rec.cycles),
        }
        return tokens, stats, rec

    def _record(self, rec: ImageRecords, g: int, a: int) -> None:
        """The records of one read verdict (``JacobiState.advance``'s, from the host's own arithmetic)."""
        n, D = self.n, self.L - 1
        m = min(D, max(0, n - g - 2))
        r = min(m - a, max(0, n - (g + a + 1) - 2))
        if r > 0 and self.params.redraw != "independent":
            rec.coupled += min(r, m - a - 1)
        while len(rec.hist) <= a:
            rec.hist.append(0)
        rec.hist[a] += 1
        rec.cycles.append(
            CycleRecord(
                root_gen=g, nodes=m + 1, drafted_depth=0, tree_depth=m, width=1 if m else 0, accepted=a,
                extra={"L": m + 1},
            )
        )  # fmt: skip


def fixed_shape_step(
    target: Target,
    params: JacobiParams,
    sp: SamplingParams,
    rule: AcceptanceRule,
    acceptance: str,
    window: int | None,
    mode: str = "auto",
) -> Any:
    """The ``JacobiStep`` ``jacobi.decode_jacobi`` runs (``mode``: ``engine.graphs.step``, ``chooses_graph``), or None
    for the host-driven loop. Decided after the prefill: the first prefill under ``engine.compile`` pins the cache and
    captures the verifies."""
    if mode == "eager":
        return None
    if not chooses_graph(mode, params, rule, target, window, decides_on_host(acceptance, target.device)):
        return None
    L = params.window if isinstance(params.window, int) else window
    assert L is not None
    return step_for(target, params, sp, rule, L)


__all__ = ["ImageRecords", "JacobiStep", "chooses_graph", "fixed_shape_step", "refusal", "step_for"]
