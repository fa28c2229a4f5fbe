"""Training-free speculative decoding by Jacobi iteration: SJD, SCD (MC-SJD), GSD, and cost-aware windows.

The model drafts for itself. State of one image: the committed tokens (the KV cache), the *root* (the last chosen
token, not yet in the cache) at generation index g, and a *window* of m drafts d_1 … d_m at g + 1 … g + m, each
stored with the full proposal distribution q_i it was drawn from. One iteration = one target forward:

1. **Verify.** The chain root → d_1 → … → d_m is an ordinary ``DraftTree`` (parents i − 1) carrying ``proposal``
   rows, verified through ``Target.verify_forward`` (so static buckets, CUDA graphs, CFG rows, every model family
   and the lean targets apply unchanged). Its processed logits give p_0 … p_m, p_i the target's distribution for
   generation index g + 1 + i given root, d_1 … d_i. ``verify.verify_cycle`` accepts d_i with probability
   min(1, p_{i−1}(d_i) / q_i(d_i)) left to right (the rule's ``proposal_rows`` on the device, the float64 host walk
   on the CPU); at the first rejection the bonus is drawn from norm(max(p_{i−1} − q_i, 0)), after a full accept
   from p_m. Greedy: accept iff d_i = argmax p_{i−1}; the bonus is the argmax. The cache keeps root + the a accepted
   drafts (a chain path is always in place).
2. **Redraw.** The positions past the bonus, g + a + 2 … g + m + 1, get new drafts from this forward's rows
   p_{a+1} … p_m (stale: their context holds rejected drafts; still a distribution known before the draft is drawn,
   which is all speculative sampling needs of a proposal):
   - ``independent`` (SJD, arXiv 2410.01699): y_j ~ p_j, q := p_j;
   - ``coupled`` (SCD / MC-SJD, arXiv 2510.24211): the old draft x there (proposal q_old) is kept with probability
     min(1, p_j(x) / q_old(x)), else a draw from norm(max(p_j − q_old, 0)) replaces it (maximal coupling); q := p_j.
     The last row p_m has no old draft: a fresh draw.
   - ``gumbel`` (SCD's Gumbel coupling, ``…_GS.py``): each position draws one Exp(1) row E (a Gumbel noise table)
     when it enters the window and keeps it until it is committed; every redraw there is the race
     y = argmax_v p_j(v) / E_v, q := p_j. An unchanged p repeats the old draft; a small change rarely moves it.
   Greedy: the argmax in every case.
3. **Top up.** The chain is sized (``FixedWindow``; ``window: cost`` — a fixed L chosen by ``calibrate_window`` on
   the machine's cost model; ``AdaptiveWindow``: m = L − 1 drafts, capped one short of the image end so the last
   token is always a bonus; drafts held past a shrunken chain wait unverified) and new positions are initialised
   (``INITS``): ``random`` — uniform over the image tokens, stored q uniform (the SJD code stores a one-hot; both are
   exact, uniform accepts Σ_y min(p(y), 1/n) instead of 1/n on average); ``left`` / ``up`` — repeat the raster-left
   (forced end-of-line tokens skipped) or upper neighbour, a point-mass q; ``drafter`` — the EAGLE drafter's chain
   (``jacobi.drafter.DrafterInit``). Forced positions (end-of-line / end-of-image) always get their forced token,
   q a point mass.
   ``proposal: point`` stores a point mass for ``random`` drafts too (the SJD, SCD and GSD codes' one-hot): exact,
   since the draft is a function of q then, and a random draft x is accepted with probability p(x).

**Lossless** (``redraw`` either way, every ``init``, the exact rule). Invariant at every verify: each draft d_i,
given everything that decided anything left of it (committed tokens, drafts and logits at earlier positions, every
uniform used there), is distributed as its stored q_i and was never tested. Speculative sampling then emits p_{i−1}
exactly at each tested position, whatever side information the proposals carry. Init draws depend on known tokens
only (point-mass q for ``left`` / ``up`` is exact: the draft is a function of the context); independent redraws are
fresh draws from q := p_j. For the coupled redraw: the old draft x at position j was drawn from q_old given
everything left of j, and since then x was neither tested (it lies past the first rejection) nor used to decide
anything left of j (only logits *right* of j saw it). So given the left information x ~ q_old, and the maximal
coupling maps it to a token distributed exactly as p_j: P(y) = q_old(y)·min(1, p_j(y)/q_old(y)) +
(1 − Σ min(p_j, q_old)) · (p_j − q_old)⁺(y) / Σ (p_j − q_old)⁺ = min(q_old, p_j)(y) + (p_j − q_old)⁺(y) = p_j(y).
Hence q := p_j is the new draft's law given the left information — the invariant again. The Gumbel redraw: the
position's noise row E was drawn when the position entered the window and has since decided only its own drafts,
which were never tested and fed only logits right of j; so given the left information E is still i.i.d. Exp(1), and
the race argmax p_j / E is a draw from p_j (``sampling.sample_rows``) — q := p_j again. Keeping q_old as a redrawn
draft's proposal breaks it, and so does keeping q_old for the *kept* drafts only (the SCD reference code's rule):
``tests/test_laws.py`` (the latter) and ``tests/test_sjd_pac.py`` (the former) plant them and the law tests reject
both (p < 10⁻¹¹).
The window size may depend on past acceptance only (never on a draft being tested), so sizing keeps the law.

**GSD** (arXiv 2508.07747, lossy): ``GroupedRule`` accepts with min(1, Σ_G p / Σ_G q) over x's group G (tokens
ranked within ± ``half`` of x under p, |p(y) − p(x)| < ``gap``, squared input-embedding distance < ``dist``); the
residual is the plain max(p − q, 0). Greedy stays exact. LANTERN (``lantern.LanternRule``) composes with ``sjd`` /
``scd`` as the acceptance rule only (the coupling stays exact: a relaxed coupling would make q := p_j a wrong law).

**Records.** One ``CycleRecord`` per target forward (τ = committed / forwards, bonus included): nodes = m + 1,
D = drafter levels (``init=drafter``; else 0), d = m, a = accepted drafts; ``extra``: ``L`` (chain nodes).
``GenerationResult.stats``: ``window``, ``init``, ``redraw``, ``rule``,
``window_mean``, ``accept_hist`` (count of a = 0, 1, …), ``kept`` / ``coupled`` / ``kept_frac`` (coupled redraws that
kept their draft), ``target_forwards``.

Device discipline: every tensor of the loop is born on the target's device, draws use the generator handed in,
and the host learns one verdict per iteration (``verify.verify_cycle``); the kept count is read once per image. At a
fixed window on graphed verifies the same iteration runs as one fixed-shape device step, one graph replay per forward
with the verdict read one step late (``jacobi.step``, ``engine.graphs.step``).

Here: the params, the state of one image, the loop and ``window: cost``'s calibration decodes, and GSD's rule. Beside
it: ``jacobi.draws`` (the tables, redraws and inits), ``jacobi.drafter`` (``init: drafter``), ``jacobi.batch`` (the
batched loop), ``jacobi.calibration`` (the calibration captions, grid and the choice of L).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from adtbench.algorithm.ar import prefill_token
from adtbench.algorithm.methods.jacobi.captions import CALIBRATION_PROMPTS
from adtbench.algorithm.methods.jacobi.drafter import DrafterInit
from adtbench.algorithm.methods.jacobi.draws import (
    LayoutTables,
    chain_structure,
    init_drafts,
    layout_tables,
    redraw,
    zero_row,
)
from adtbench.algorithm.methods.jacobi.windows import FixedWindow, make_sizer, window_rule
from adtbench.algorithm.params import key, parse
from adtbench.algorithm.records import Clock, CycleRecord, GenerationResult
from adtbench.algorithm.sampling import exponentials, process_logits
from adtbench.algorithm.slot import Timing, verify_slots
from adtbench.algorithm.tree import DraftTree, arange_on
from adtbench.algorithm.verify import EXACT, AcceptanceRule, CycleRead, verify_cycle
from adtbench.errors import ConfigError, check_number
from adtbench.layout import TokenLayout
from adtbench.models.base import PromptInputs, Target
from adtbench.sampling_params import SamplingParams

INITS = ("random", "left", "up", "drafter")
REDRAWS = ("independent", "coupled", "gumbel")
PROPOSALS = ("uniform", "point")
RULES = ("exact", "gsd")


# --------------------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------------------


def window_value(value: Any, full: str) -> int | str:
    """``policy.window``: an integer L ≥ 1 or a registered window rule's name (``windows.WINDOWS``)."""
    if isinstance(value, str):
        window_rule(value)
        return value
    return int(check_number(value, full, int, lo=1))


@dataclass(frozen=True)
class JacobiParams:
    """One Jacobi method (module docstring), and its keys' schema (``params.key``: the harness merges the composed
    ``policy`` node into this class, ``jacobi_params`` parses it). ``window``: L, the chain's nodes (root + L − 1
    drafts), or a registered window rule (``windows.WINDOWS``: ``cost``, ``adaptive``; then L ∈ [``window_min``,
    ``window_max``]); ``rule``: ``exact`` or ``gsd`` (``group_*``:
    its group); ``proposal``: the stored q of an ``init: random`` draft, ``uniform`` or ``point`` (a point mass on
    the draft, the SJD / SCD / GSD codes' choice); ``calibration_tokens``: ``window: cost`` decodes the first that
    many tokens of each calibration image, of the first ``calibration_images`` captions of
    ``captions.CALIBRATION_PROMPTS`` (τ(L)'s standard error falls as 1/√n). A method with keys of its own
    subclasses this (``sjd_pac.SJDPACParams``).
    """

    window: int | str = key(16, check=window_value)
    init: str = key("random", choices=INITS)
    redraw: str = key("coupled", choices=REDRAWS)
    rule: str = key("exact", choices=RULES)
    proposal: str = key("uniform", choices=PROPOSALS)
    window_min: int = key(4, lo=1)
    window_max: int = key(32, lo=1)
    adapt_margin: int = key(8, lo=0)
    overhead_steps: float = key(0.3, lo=0)
    calibration_tokens: int = key(512, lo=1)
    calibration_images: int = key(24, lo=2, hi=len(CALIBRATION_PROMPTS))
    group_size: int = key(14, lo=0)
    group_gap: float = key(0.15, lo=0.0)
    group_dist: float = key(0.5, lo=0.0)

    def __post_init__(self) -> None:
        """The rule between keys: ``window_max ≥ window_min`` (a ``ConfigError`` naming the key, raised when the
        policy is built, before any weights load)."""
        if self.window_max < self.window_min:
            raise ConfigError(
                "policy.window_max", f"must be ≥ policy.window_min ({self.window_min}), got {self.window_max}"
            )

    def step_refusal(self) -> str | None:
        """Why the fixed-shape device step (``jacobi.step``, ``engine.graphs.step``) cannot run these keys, whatever
        the target (None: it can; ``engine.graphs.step=graph`` with a reason is a ``ConfigError`` when the policy is
        built, ``config.build_policy``); ``jacobi.step.refusal`` adds the target's reasons."""
        if self.state_type is not JacobiState:
            return f"JacobiState's iteration; this policy runs its own ({self.state_type.__name__})"
        if not window_rule(self.window).device_step:
            return f"a window the step can run; window={self.window} sizes each forward on the host"
        if self.init == "drafter":
            return "init≠drafter; init=drafter drafts with the EAGLE drafter between forwards"
        if self.redraw == "gumbel":
            return "redraw≠gumbel; redraw=gumbel keeps a noise row per window position"
        return None

    @property
    def calibrated_window(self) -> bool:
        """Whether the window rule needs the machine's calibrated L (``window: cost``; built by ``harness.loops``)."""
        return window_rule(self.window).calibrated

    @property
    def max_nodes(self) -> int:
        """The largest chain (root included): the KV headroom one verify needs."""
        return self.window if isinstance(self.window, int) else self.window_max

    @property
    def state_type(self) -> type[JacobiState]:
        """The state class the loops run (``decode_jacobi``, ``jacobi.batch.generate_jacobi_batch``): ``JacobiState``
        here; a method that verifies a tree instead of the chain (``sjd_pac.SJDPACParams``) names its own."""
        return JacobiState


def jacobi_params(node: dict[str, Any]) -> JacobiParams:
    """``JacobiParams`` from a plain policy node (``params.parse``); every bad value a ``ConfigError`` naming
    ``policy.<key>``."""
    return parse(JacobiParams, node)


# --------------------------------------------------------------------------------------------------------
# the state of one image
# --------------------------------------------------------------------------------------------------------


@dataclass
class JacobiState:
    """One image in flight: ``seq`` (device, generation-indexed: committed tokens, the root at ``g``, the window's m
    drafts after it), ``q [m + 1, V]`` (row i: the proposal of the draft at g + 1 + i; the last row 0 — the chain's
    leaf has no child; None when greedy), host ``tokens`` (committed, then read per iteration), the sizer and the
    counters of the records."""

    layout: TokenLayout
    tables: LayoutTables
    params: JacobiParams
    sizer: FixedWindow
    seq: torch.Tensor
    q: torch.Tensor | None
    greedy: bool
    generator: torch.Generator | None
    g: int = 0
    m: int = 0  # drafts verified by the current forward (plan)
    held: int = 0  # drafts held after the root (≥ m; those past m wait unverified)
    tokens: list[int] = field(default_factory=lambda: [-1])
    cycles: list[CycleRecord] = field(default_factory=list)
    hist: list[int] = field(default_factory=list)
    kept: list[torch.Tensor] = field(default_factory=list)
    coupled: int = 0
    levels: int = 0  # drafter levels of this iteration's top-up (init=drafter)
    noise: torch.Tensor | None = None  # redraw=gumbel: Exp(1) rows, row i the position g + 1 + i's (``redraw``)
    limit: int | None = None  # stop once this many tokens are committed (``calibrate_window``); None: the image

    @classmethod
    def start(
        cls,
        root: torch.Tensor,
        layout: TokenLayout,
        params: JacobiParams,
        sizer: FixedWindow,
        sp: SamplingParams,
        dtype: torch.dtype,
        generator: torch.Generator | None,
    ) -> JacobiState:
        """An image whose first token ``root`` (``[]`` / ``[1]`` on the device) was just chosen by the prefill."""
        dev, pad = root.device, params.max_nodes + 1
        tables = layout_tables(layout, dev, torch.promote_types(dtype, torch.float32), pad)
        seq = torch.zeros(layout.num_gen_tokens + pad, dtype=torch.long, device=dev)
        seq[:1] = root.view(1)
        q = None if sp.greedy else zero_row(layout.vocab_size, dev, tables.uniform.dtype)
        sizer.reset()
        st = cls(layout, tables, params, sizer, seq, q, sp.greedy, generator)
        st._noise_rows(1)
        return st

    def _noise_rows(self, n: int, shift: int = 0) -> None:
        """``redraw: gumbel``: drop the first ``shift`` noise rows (positions now committed or the bonus), then add
        fresh Exp(1) rows until ``n`` rows cover positions g + 1 … g + n. A no-op otherwise."""
        if self.params.redraw != "gumbel" or self.greedy:
            return
        V, dev = self.layout.vocab_size, self.seq.device
        have = None if self.noise is None else self.noise[shift:]
        k = n - (0 if have is None else have.shape[0])
        if k > 0:
            fresh = exponentials((k, V), self.generator, dev)
            have = fresh if have is None else torch.cat([have, fresh])
        self.noise = have

    @property
    def done(self) -> bool:
        n = self.layout.num_gen_tokens
        return len(self.tokens) >= (n if self.limit is None else min(n, self.limit))

    @property
    def room(self) -> int:
        """Drafts the window may hold: one short of the image end (the last token is always a bonus)."""
        return max(0, self.layout.num_gen_tokens - self.g - 2)

    def plan(self, drafter: DrafterInit | None = None) -> int:
        """Size this forward's chain: m = min(L − 1, room) drafts; the held window is topped up to m with new drafts
        (``params.init``) if shorter. Drafts held past m (a window that shrank) stay, unverified, for later."""
        m = min(self.sizer.size(self.g) - 1, self.room)
        self.levels = 0
        if m > self.held:
            s, t = self.g + 1 + self.held, m - self.held
            if drafter is not None:
                tok, q = drafter.draft(self, s, t)
                self.levels = drafter.levels
            else:
                tok, q = init_drafts(
                    self.params.init,
                    self.seq,
                    s,
                    t,
                    self.layout,
                    self.tables,
                    self.generator,
                    self.greedy,
                    self.params.proposal,
                )
            self.seq[s : s + t] = tok
            if self.q is not None and q is not None:
                self.q = torch.cat([self.q[: self.held], q, self.q[self.held :]])
            self.held = m
        self._noise_rows(m + 1)
        self.m = m
        return m

    def tree(self) -> DraftTree:
        """What this forward verifies (the loops' hook): the chain here (``sjd_pac`` verifies a tree)."""
        return self.chain()

    def in_place(self, read: CycleRead) -> bool:
        """Is the accepted path the nodes 0 … a (``Target.commit``'s ``in_place``)? Always, for a chain."""
        return True

    def verify(
        self, tree: DraftTree, processed: torch.Tensor, sp: SamplingParams, rule: AcceptanceRule, where: str
    ) -> CycleRead:
        """Accept ``tree`` (``tree()``'s) against its processed rows: ``verify.verify_cycle`` (the loops' hook)."""
        return verify_cycle(tree, processed, sp.greedy, self.generator, rule, None, where)

    @staticmethod
    def verify_batch(
        states: Sequence[JacobiState | None],
        cases: Sequence[tuple[DraftTree, torch.Generator | None] | None],
        processed: torch.Tensor,
        sp: SamplingParams,
        rule: AcceptanceRule,
        acceptance: str,
        on_host: bool,
    ) -> list[Any]:
        """Every slot's acceptance of a batched forward (``states[s]``: slot s's state, None when idle):
        ``slot.verify_slots`` (the batched loop's hook)."""
        return verify_slots(cases, processed, sp, rule, acceptance, on_host)

    def chain(self) -> DraftTree:
        """The chain root → d_1 → … → d_m with its proposal rows (None when greedy)."""
        n = self.m + 1
        parents, depth, mask, ranks = chain_structure(n, self.seq.device)
        q = None if self.q is None else self.q[:n]
        return DraftTree(
            self.seq[self.g : self.g + n].clone(),
            parents,
            self.m,
            1 if self.m else 0,
            q,
            depth=depth,
            ancestor_mask=mask,
            max_children=1 if self.m else 0,
            child_ranks=ranks,
        )

    def advance(self, read: CycleRead, processed: torch.Tensor) -> CycleRecord:
        """After the verify of ``chain()`` (``read``: its verdict; ``processed [m + 1, V]``: its rows): write the bonus,
        redraw the verified drafts past it, keep the held ones past the chain, move the root, record the forward."""
        a, m, M, g = read.acceptance.accepted, self.m, self.held, self.g
        if self.tokens[0] < 0:
            self.tokens[0] = read.root
        self.tokens += read.tokens
        b = g + a + 1  # the bonus: the next root
        self.seq[b : b + 1] = read.next_tokens[-1:]
        room = max(0, self.layout.num_gen_tokens - b - 2)
        r = min(m - a, room)  # redrawn: b + 1 … b + r (rows a + 1 … a + r)
        tail = min(max(M - m - 1, 0), room - r)  # held past the chain: g + m + 2 …, unchanged
        old = M - a - 1  # redraw rows i < old replace a held draft (the others are fresh)
        if r > 0:
            rows = processed[a + 1 : a + 1 + r]
            if self.greedy:
                self.seq[b + 1 : b + 1 + r] = rows.argmax(-1)
            else:
                assert self.q is not None
                has_old = arange_on(r, rows.device) < old
                tok, q, kept = self.redraw_rows(
                    rows.softmax(-1),
                    self.seq[b + 1 : b + 1 + r],
                    self.q[a + 1 : a + 1 + r],
                    has_old,
                    None if self.noise is None else self.noise[a + 1 : a + 1 + r],
                )
                self.seq[b + 1 : b + 1 + r] = tok
                self.q = torch.cat([q, self.q[m + 1 : m + 1 + tail], zero_row(q.shape[1], q.device, q.dtype)])
                if self.params.redraw != "independent":
                    self.kept.append(kept.sum())
                    self.coupled += min(r, old)
        elif self.q is not None:
            self.q = torch.cat([self.q[m + 1 : m + 1 + tail], zero_row(self.q.shape[1], self.q.device, self.q.dtype)])
        self.sizer.observe(g, m, a, processed)
        while len(self.hist) <= a:
            self.hist.append(0)
        self.hist[a] += 1
        rec = CycleRecord(
            root_gen=g,
            nodes=m + 1,
            drafted_depth=self.levels,
            tree_depth=m,
            width=1 if m else 0,
            accepted=a,
            extra={"L": m + 1},
        )
        self.cycles.append(rec)
        self.g, self.m, self.held = b, 0, r + tail
        self._noise_rows(r + tail + 1, shift=a + 1)
        return rec

    def redraw_rows(
        self, probs: torch.Tensor, old: torch.Tensor, q_old: torch.Tensor, has_old: torch.Tensor, noise: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The redraw of ``advance`` (step 2 of the module docstring): ``redraw(params.redraw, …)`` → (tokens, their
        stored proposals, kept). A state subclass may change it; the invariant it must keep is the module
        docstring's (each stored q is its draft's law given everything left of it)."""
        return redraw(self.params.redraw, probs, old, q_old, has_old, self.generator, noise)

    def stats(self) -> dict[str, Any]:
        """The image's counters (``GenerationResult.stats``); reads the kept count once."""
        kept = int(torch.stack(self.kept).sum()) if self.kept else 0
        n = max(1, len(self.cycles))
        return {
            "window": self.params.window,
            "init": self.params.init,
            "redraw": self.params.redraw,
            "rule": self.params.rule,
            "window_mean": sum(c.nodes for c in self.cycles) / n,
            "accept_hist": list(self.hist),
            "kept": kept,
            "coupled": self.coupled,
            "kept_frac": kept / self.coupled if self.coupled else None,
            "target_forwards": len(self.cycles),
            "step": "eager",
        }


# --------------------------------------------------------------------------------------------------------
# the loop (one image)
# --------------------------------------------------------------------------------------------------------


def iteration(
    target: Target,
    st: JacobiState,
    sp: SamplingParams,
    rule: AcceptanceRule,
    where: str,
    clock: Clock,
    drafter: DrafterInit | None = None,
) -> tuple[Any, Any, Any, Any]:
    """One Jacobi iteration of a B = 1 decode (module docstring): size + top up, verify the chain in one target
    forward, accept, commit, redraw. Returns its clock marks (start, drafted, verified, done)."""
    start = clock.mark()
    st.plan(drafter)
    tree = st.tree()
    drafted = clock.mark()
    raw, feats = target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    processed = process_logits(raw, st.g + 1 + tree.depth, target.layout, sp)
    read = st.verify(tree, processed, sp, rule, where)
    next_pos = target.next_pos
    target.commit(read.keep, in_place=st.in_place(read))
    verified = clock.mark()
    if drafter is not None:
        drafter.commit(read, feats, next_pos)
    st.advance(read, processed)
    return start, drafted, verified, clock.mark()


@torch.no_grad()
def decode_jacobi(
    target: Target,
    inputs: PromptInputs,
    sp: SamplingParams,
    generator: torch.Generator | None,
    params: JacobiParams,
    rule: AcceptanceRule = EXACT,
    acceptance: str = "auto",
    drafter: Any = None,
    window: int | None = None,
    limit: int | None = None,
    make_step: Callable[..., Any] | None = None,
) -> GenerationResult:
    """Decode one image by Jacobi iteration (module docstring), timed like ``engine.generate``. ``drafter``: the
    EAGLE drafter (``init: drafter``); ``window``: the calibrated L of ``window: cost`` (``calibrate_window``);
    ``limit``: stop once that many tokens are committed (a partial image: ``calibrate_window``'s); ``make_step``:
    ``jacobi.step.fixed_shape_step`` (the policy passes it) — called after the prefill, it returns the device-resident
    step this decode runs or None for the host-driven loop; None: always the loop."""
    clock, layout = Clock(target.device), target.layout
    sizer = make_sizer(params, layout, window)
    helper = DrafterInit(drafter, target, sp) if params.init == "drafter" else None
    if helper is not None and drafter is None:
        raise RuntimeError("policy.init=drafter needs the EAGLE drafter (harness.loops builds it)")
    t0 = clock.now()
    begin = clock.mark()
    root, res = prefill_token(target, inputs, sp, params.max_nodes, generator)
    if helper is not None:
        helper.start(res, root, params.max_nodes + 1)
    step = None if make_step is None else make_step(target, params, sp, rule, acceptance, window)
    if step is not None and step.fits():  # the device-resident step (``jacobi.step``; engine.graphs.step)
        timing = Timing(t0, (begin, clock.mark()))
        tokens, stats, rec = step.run_image(root, generator, limit, clock, timing)
        timing.stop(clock)
        return timing.result(clock, tokens[: layout.num_gen_tokens], rec.cycles, 0, stats, target.forwards)
    st = params.state_type.start(root, layout, params, sizer, sp, target.dtype, generator)
    st.limit = limit
    timing = Timing(t0, (begin, clock.mark()))
    while not st.done:
        timing.cycle(*iteration(target, st, sp, rule, acceptance, clock, helper))
    timing.stop(clock)
    if st.tokens[0] < 0:  # a one-token image
        st.tokens[0] = int(root)
    return timing.result(
        clock,
        st.tokens[: layout.num_gen_tokens],
        st.cycles,
        helper.forwards if helper else 0,
        st.stats(),
        target.forwards,
    )


__all__ = [
    "INITS",
    "REDRAWS",
    "JacobiParams",
    "JacobiState",
    "decode_jacobi",
    "jacobi_params",
]
