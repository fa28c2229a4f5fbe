"""Cost-aware trees: a measured cost model of the machine, and the node budget it implies.

EAGLE-2 and ADT-Tree verify a fixed number of nodes whatever the hardware. Here each cycle verifies the N
drafted nodes that maximise the expected throughput

    rate(N) = E[committed](N) / (t_spent + t_verify(N + 1)),    E[committed](N) = 1 + c · Σ_{i ≤ N} π_i

where π_1 ≥ π_2 ≥ … are the drafter's path probabilities of the candidates in EAGLE-2's rerank order
(π = exp(cumulative log-prob); a parent's π is never below its child's, so every prefix of that order is a
tree closed under ancestors), ``t_spent`` is what the cycle already cost (fixed per-cycle work plus the drafter
levels run) and ``t_verify(n)`` the target's forward over n tree nodes. Why the sum: under point-mass
recursive rejection, child x of an accepted node is accepted with probability exactly p(x) (the rejected
siblings' renormalisations cancel), so the expected number of accepted drafts is the sum over nodes of their
target path probabilities; the drafter's π estimates it. ``c`` calibrates the estimate online: the ratio of
observed accepted drafts to predicted ones over the image's cycles so far (with a prior of ``PRIOR`` predicted
tokens at c = 1), clamped to [1/4, 4]; it restarts with every image, so a prompt's trees (and, for a given seed,
its tokens) do not depend on the prompts decoded before it.

Levels. Before an expansion round over frontier F the most a round can add is c · Σ_{f ∈ F} π_f (children's π sum
to at most their parent's), for one drafter level t_level(|F|) plus at least |F| more nodes to verify; the round
pays only if that optimistic rate beats the best rate without it (deeper rounds add at most as much for the same
cost, so a one-level look-ahead decides them too). When the rule runs is the policy's ``rounds`` knob
(``TreeBudget.live``), never where acceptance or tree building run: ``live`` (``auto`` where the drafter runs on the
CPU, where a read costs nothing) applies it before each round on this cycle's candidates (``worth_expanding``;
sampled trees always do, ``best_frontier``); ``planned`` (``auto`` on other devices) lets the top-k trees plan their
rounds instead: ``choose`` applies the rule in hindsight to the rounds a cycle drafted, and the image's next cycle
drafts as many rounds as it would have run (``plan_rounds``; an image's first cycle drafts the policy's depth), so
drafting reads nothing. On the CPU, live rounds commit more per cycle (τ) than planned ones at the same cost.

Both choices only decide *which drafted nodes are verified*: acceptance is untouched, so the method stays
lossless under an exact rule.

The cost model (``CostModel``) is measured for the loaded target and drafter on the current device — the
target's verify forward at a KV length mid-image for tree sizes 1…``max_nodes``, one drafter level for 1…K
nodes, and the fixed work of a cycle (the drafter's ``extend`` over two committed tokens plus scoring the root)
— as medians of repeated, CUDA-synchronised runs, and cached as JSON keyed by the model's shape, device,
dtype, CPU threads, CFG rows, torch version and measuring method (``cost_key``). Sizes are timed in short blocks,
round-robin, so the caches are warm as in a decode loop and a load burst hits all of them alike, and each curve
is made non-decreasing (a bigger tree does a superset of a smaller one's work).
Everything is in milliseconds.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from adtbench import accel
from adtbench.resources import load_average

if TYPE_CHECKING:
    from adtbench.algorithm.drafters.base import Drafter

log = logging.getLogger("adtbench")

PRIOR = 8.0  # pseudo-count (predicted tokens at c = 1) of the online calibration
C_RANGE = (0.25, 4.0)
VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
LEVEL_SIZES = (1, 2, 4, 8, 16, 32)
ROUNDS = ("auto", "live", "planned")  # ``policy.rounds``: when the level rule decides a round (``TreeBudget.live``)


@dataclass
class CostModel:
    """Measured costs (ms): ``t_verify(n)`` and ``t_level(m)`` interpolated linearly between measured sizes."""

    verify_nodes: list[int]
    verify_ms: list[float]
    level_nodes: list[int]
    level_ms: list[float]
    fixed_ms: float  # per-cycle work outside the verify forward and the drafter levels
    meta: dict[str, Any] = field(default_factory=dict)

    def t_verify(self, n: int | np.ndarray) -> Any:
        return np.interp(n, self.verify_nodes, self.verify_ms)

    def t_level(self, m: int) -> float:
        return float(np.interp(m, self.level_nodes, self.level_ms))

    @property
    def step_ms(self) -> float:
        """One AR step: the verify forward of the root alone."""
        return float(self.t_verify(1))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostModel:
        return cls(**data)

    def table(self) -> str:
        """Markdown: verify cost and drafter level cost as ms and as multiples of one AR step."""
        s = self.step_ms
        lines = ["| tree nodes | verify (ms) | × AR step |", "|---:|---:|---:|"]
        lines += [f"| {n} | {t:.2f} | {t / s:.2f} |" for n, t in zip(self.verify_nodes, self.verify_ms)]
        lines += ["", "| drafter level, nodes | ms | × AR step |", "|---:|---:|---:|"]
        lines += [f"| {m} | {t:.2f} | {t / s:.2f} |" for m, t in zip(self.level_nodes, self.level_ms)]
        lines += [
            "",
            f"fixed per-cycle work (drafter extend + root scoring): {self.fixed_ms:.2f} ms "
            f"({self.fixed_ms / s:.2f} steps)",
        ]
        return "\n".join(lines)


class TreeBudget:
    """Chooses how many drafted nodes to verify and whether to draft another level (module docstring)."""

    def __init__(self, model: CostModel, calibrate: bool = True, rounds: str = "auto") -> None:
        self.model = model
        self.calibrate = calibrate
        self.rounds = rounds  # the level rule's timing (``live``): auto | live | planned
        self.predicted = 0.0
        self.accepted = 0.0
        self._tv = np.zeros(0)  # t_verify(1 … len) tabulated (grown on demand: one np.interp per size, not per call)
        self._tl = np.zeros(0)  # t_level(1 … len), likewise
        self.next_rounds: int | None = None  # ``plan_rounds``: set by ``choose``, None at an image's start

    def _t_verify_upto(self, n: int) -> np.ndarray:
        """``t_verify(1 … n)`` as an array."""
        if self._tv.size < n:
            self._tv = np.asarray(self.model.t_verify(np.arange(1, max(n, 2 * self._tv.size) + 1)), dtype=np.float64)
        return self._tv[:n]

    @property
    def c(self) -> float:
        if not self.calibrate:
            return 1.0
        c = (self.accepted + PRIOR) / (self.predicted + PRIOR)
        return float(min(max(c, C_RANGE[0]), C_RANGE[1]))

    def spent_ms(self, level_sizes: list[int]) -> float:
        """What a cycle has cost before its verify: the fixed work and one drafter level per size in the list."""
        return self.model.fixed_ms + sum(self.t_level(m) for m in level_sizes)

    def best(self, pi_sorted: np.ndarray, spent_ms: float) -> tuple[int, float]:
        """(N, rate) maximising ``rate(N)`` over N = 0 … len(pi_sorted) (ties → the smaller N)."""
        n, rate, _ = self._best(pi_sorted, spent_ms)
        return n, rate

    def _best(self, pi_sorted: np.ndarray, spent_ms: float) -> tuple[int, float, float]:
        """``best`` and ``Σ_{i<N} π_i`` at that N (the predicted drafts of the prefix kept). A scalar loop over the few
        to few dozen entries, the arithmetic of ``rate = (1 + c·cumsum) / (spent + t_verify)`` in float64: sequential
        sums (``np.cumsum``'s), the same products and divisions, ``np.argmax``'s first maximum — bit for bit."""
        tv = self._t_verify_upto(pi_sorted.size + 1).tolist()
        c = self.c
        n, best, cum, cum_n = 0, (1.0 + c * 0.0) / (spent_ms + tv[0]), 0.0, 0.0
        for i, p in enumerate(pi_sorted.tolist(), start=1):
            cum += p
            r = (1.0 + c * cum) / (spent_ms + tv[i])
            if r > best:
                n, best, cum_n = i, r, cum
        return n, best, cum_n

    def _t_level_upto(self, m: int) -> np.ndarray:
        """``t_level(1 … m)`` as an array (tabulated once, grown on demand)."""
        if self._tl.size < m:
            self._tl = np.interp(
                np.arange(1, max(m, 2 * self._tl.size) + 1), self.model.level_nodes, self.model.level_ms
            )
        return self._tl[:m]

    def t_level(self, m: int) -> float:
        """Measured ms of one drafter level over ``m`` nodes."""
        return float(self._t_level_upto(m)[m - 1])

    def best_extension(self, gain0: float, n0: int, values: np.ndarray, spent_ms: float) -> tuple[int, float]:
        """(k, rate) maximising ``(gain0 + Σ_{i<k} values_i) / (spent_ms + t_verify(n0 + k))`` over k = 0 … len(values):
        how many of ``values`` (sorted descending) to add to a tree of ``n0`` nodes and expected gain ``gain0``
        (sampled trees: the values are calibrated reach estimates, so no ``c`` here; ties → the smaller k)."""
        # scalar loop (these arrays hold a few to a few dozen entries): the same sequential sums and divisions as
        # ``gain0 + cumsum`` over ``spent + t_verify``, and the first maximum, as ``argmax`` takes
        tv = self._t_verify_upto(n0 + values.size)[n0 - 1 :].tolist()
        k, best, c = 0, gain0 / (spent_ms + tv[0]), 0.0
        for i, v in enumerate(values.tolist(), start=1):
            c += v
            r = (gain0 + c) / (spent_ms + tv[i])
            if r > best:
                k, best = i, r
        return k, best

    def best_frontier(self, gain0: float, n0: int, reach: np.ndarray, spent_ms: float) -> int:
        """How many of the nodes with reach ``reach`` (descending) to expand in one more drafter level: the count with
        the best optimistic rate ``(gain0 + Σ reach) / (spent + t_level(m) + t_verify(n0 + m))`` (children's reach
        sums to at most their parent's), or 0 if none beats the tree as it stands."""
        tv = self._t_verify_upto(n0 + reach.size)[n0 - 1 :].tolist()
        tl = self._t_level_upto(reach.size).tolist()
        k, best, c = 0, float("-inf"), 0.0  # scalar loop, the same arithmetic as the vectorised form
        for i, x in enumerate(reach.tolist(), start=1):
            c += x
            r = (gain0 + c) / (spent_ms + tl[i - 1] + tv[i])
            if r > best:
                k, best = i, r
        return k if k and best > gain0 / (spent_ms + tv[0]) else 0

    def worth_expanding(self, pi_sorted: np.ndarray, frontier_pi: float, frontier: int, spent_ms: float) -> bool:
        """Does one more drafter level over ``frontier`` nodes (total path prob ``frontier_pi``) possibly pay, given
        the candidates so far (``pi_sorted``, descending)? The level rule of the module docstring, decided on the
        host before a round."""
        n, rate = self.best(pi_sorted, spent_ms)
        gain = 1.0 + self.c * float(pi_sorted[:n].sum())
        t_more = spent_ms + self.t_level(frontier) + float(self._t_verify_upto(n + 1 + frontier)[-1])
        return (gain + self.c * frontier_pi) / t_more > rate

    def live(self, device: torch.device) -> bool:
        """Is the level rule applied before each round from this cycle's candidates (``live``: one small read per
        round), rather than planned from the image's previous cycle (``planned``: no read while drafting)? ``auto``:
        planned on a CUDA device (``accel.is_cuda``: a real one or the simulated one), live elsewhere — the CPU, where
        a read costs nothing (the rule as designed). Where acceptance or tree building run (``engine.acceptance``)
        does not enter: they never change a tree's shape."""
        return self.rounds == "live" or (self.rounds == "auto" and not accel.is_cuda(device))

    def plan_rounds(self, rounds: int) -> int:
        """Expansion rounds to draft this cycle, at most ``rounds`` (the policy's depth): what the level rule decided
        in hindsight on the image's previous cycle (``choose``); all of them in an image's first cycle. Decided on
        the host from what the last cycle's read brought back, so drafting reads nothing."""
        return rounds if self.next_rounds is None else min(rounds, self.next_rounds)

    def choose(
        self,
        pi: np.ndarray,
        level: np.ndarray,
        max_n: int,
        level_sizes: list[int],
        frontier: int,
        plan: bool = True,
    ) -> tuple[int, float]:
        """The node budget of a drafted top-k tree; with ``plan`` (the planned level rule) also the next cycle's round
        plan. Decided on the host (a policy's decision: a GPU's cycle reads the candidates' scores once, and numpy's
        per-call cost is a fraction of a launch's).

        ``pi [M]``: every candidate's path probability (float64, the exp of its cumulative drafter log-prob) in rerank
        order (descending); ``level [M]``: the round that made it (0: the root's children); ``level_sizes``: the
        nodes expanded by each round drafted; ``frontier``: the frontier width (K). Returns ``(N, E_pred)``: N ≤
        ``max_n`` maximising ``rate(N)`` with every drafted round paid for (``best``'s rule; ties → the smaller N:
        ``np.argmax``'s first maximum) and the predicted accepted drafts ``Σ_{i<N} π_i``. The plan: for each l = 0 …
        L rounds, the candidates of rounds ≤ l give the best rate at the cost of l rounds, and one more round over
        the K best round-l candidates (mass Σπ_F) could at most add c·Σπ_F for ``t_level(K)`` and K more nodes
        (module docstring); the level rule stops at the first l where that does not beat the rate without it, and
        the next cycle drafts that many rounds."""
        if not plan:
            n, _, cum_n = self._best(pi[:max_n], self.spent_ms(level_sizes))
            return n, cum_n
        L = len(level_sizes)
        rounds = np.arange(L + 1)[:, None]
        upto = -np.sort(-np.where(level[None] <= rounds, pi[None], 0.0), axis=-1)
        cums = np.concatenate([np.zeros((L + 1, 1)), np.cumsum(upto[:, :max_n], axis=-1)], axis=-1)
        spent = np.array([self.spent_ms(level_sizes[:r]) for r in range(L + 1)])
        tv = self._t_verify_upto(max_n + 1 + frontier)
        rate = (1.0 + self.c * cums) / (spent[:, None] + tv[None, : max_n + 1])
        n = rate.argmax(-1)
        best = rate[np.arange(L + 1), n]
        f_pi = -np.sort(-np.where(level[None] == rounds, pi[None], 0.0), axis=-1)[:, :frontier].sum(-1)
        gain = 1.0 + self.c * cums[np.arange(L + 1), n]
        t_more = spent + self.t_level(frontier) + tv[n + frontier]
        stop = np.append((gain + self.c * f_pi) / t_more <= best, True)
        self.next_rounds = int(stop.argmax())
        return int(n[L]), float(cums[L, n[L]])

    def tables(self, level_sizes: list[int], max_n: int, frontier: int) -> tuple[np.ndarray, np.ndarray, float]:
        """What ``choose`` (``plan``) reads besides the candidates and ``c``: the cost spent after each number of rounds
        ``[L + 1]``, ``t_verify(1 … max_n + 1 + frontier)`` and ``t_level(frontier)`` — constants of the cost model and
        the levels drafted, for the rule's device copy (``policies.eagle2._cost_tree``: inside the draft phase's
        graph)."""
        spent = np.array([self.spent_ms(level_sizes[:r]) for r in range(len(level_sizes) + 1)])
        return spent, self._t_verify_upto(max_n + 1 + frontier).copy(), self.t_level(frontier)

    def observe(self, predicted: float, accepted: int) -> None:
        """Online calibration: predicted Σπ of a verified tree vs the drafts it accepted."""
        self.predicted += predicted
        self.accepted += accepted

    def reset(self) -> None:
        """A new image: calibration and the round plan restart (an image's trees never depend on the images before
        it)."""
        self.predicted = self.accepted = 0.0
        self.next_rounds = None


CostModelSource = Callable[[int, int], CostModel]
"""``(max_nodes, max_level) → CostModel`` covering verify trees of ``max_nodes`` and drafter levels of
``max_level``; the harness supplies it (``harness.caches.cost_source``: a file cache, else a measurement)."""


class PolicyBudget:
    """A policy's ``budget`` option and, under ``budget: cost``, its ``TreeBudget`` (bound by ``bind``)."""

    def __init__(self, budget: str, options: tuple[str, ...], calibrate: bool, rounds: str = "auto") -> None:
        from adtbench.errors import check_choice, check_flag

        self.budget = check_choice(budget, "policy.budget", options)
        self.calibrate = check_flag(calibrate, "policy.calibrate")
        self.rounds = check_choice(rounds, "policy.rounds", ROUNDS)
        self.tree: TreeBudget | None = None

    @property
    def enabled(self) -> bool:
        return self.budget == "cost"

    def bind(self, source: CostModelSource | None, max_nodes: int, max_level: int) -> None:
        """Under ``budget: cost``, take the cost model covering trees of ``max_nodes`` and levels of ``max_level``
        from ``source`` (the harness loads or measures it; None: no drafter, nothing to size)."""
        if self.enabled and source is not None:
            self.tree = TreeBudget(source(max_nodes, max_level), self.calibrate, self.rounds)

    def tree_budget(self, policy: str) -> TreeBudget | None:
        if not self.enabled:
            return None
        if self.tree is None:
            raise RuntimeError(f"policy={policy} with budget: cost needs bind() (the app calls it after loading)")
        return self.tree

    def observe(self, tree: Any, acceptance: Any) -> None:
        if self.tree is not None and "E_pred" in tree.info:
            self.tree.observe(float(tree.info["E_pred"]), acceptance.accepted)

    def reset(self) -> None:
        if self.tree is not None:
            self.tree.reset()


# --------------------------------------------------------------------------------------------------------
# measuring the cost model
# --------------------------------------------------------------------------------------------------------


def target_parameters(target: Any) -> list[torch.Tensor]:
    """The target's network parameters, as it declares them (``Target.weights``)."""
    return list(target.weights())


MEASURE_METHOD = "blocked-5-device"  # part of the cache key: a cost model measured another way is re-measured
VERIFY_ONLY_METHOD = MEASURE_METHOD + "-min"  # the verify-only model (no drafter: the Jacobi loops' window=cost)
BLOCK = 5  # consecutive timed calls of one size per pass


def _interleaved_ms(fns: list[Any], repeats: int, sync: bool, stat: Any = np.median) -> list[float]:
    """Median (``stat``) ms of each of ``fns`` over ``repeats`` timed calls, made non-decreasing along the list.

    The calls come in blocks of ``BLOCK`` consecutive calls of one size (after one untimed call), and the blocks
    go round-robin over the sizes in ⌈repeats / BLOCK⌉ passes: within a block the caches are as warm as in a decode
    loop, where one verify shape follows the last (one-call round-robin made every size pay a cold start: it read
    the AR step 34 % slow and a tree node 40 % cheap, so the budget grew trees past their worth), and the passes
    spread load bursts over all sizes. A larger tree or level does a superset of a smaller one's work, so a dip is
    noise."""
    times: list[list[float]] = [[] for _ in fns]
    passes = max(1, -(-repeats // BLOCK))
    for _ in range(passes):
        for i, fn in enumerate(fns):
            timed_ms(fn, sync)
            times[i] += [timed_ms(fn, sync) for _ in range(BLOCK)]
    return [float(m) for m in np.maximum.accumulate([float(stat(t)) for t in times])]


# --- measurement helpers (also used by `adtbench bench` and `train.report`) ---------------------------------


def random_tree(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random ``n``-node tree (node 0 = root; each node's parent is an earlier node, biased to recent ones).

    Returns ``(ancestor_mask [n, n] bool incl. self, depth [n])``.
    """
    parents = [-1]
    for i in range(1, n):
        parents.append(int(torch.randint(max(0, i - 8), i, (1,), generator=gen, device=gen.device)))
    mask = torch.eye(n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
        depth[i] = depth[parents[i]] + 1
    return mask, depth


def timed_ms(fn: Any, sync: bool) -> float:
    """Wall time (ms, ``time.perf_counter``) of one call of ``fn``, CUDA-synchronised before and after when ``sync``."""
    if sync:
        accel.synchronize()
    t = time.perf_counter()
    fn()
    if sync:
        accel.synchronize()
    return 1e3 * (time.perf_counter() - t)


def median_ms(fn: Any, repeats: int, sync: bool) -> float:
    """Median wall time (ms) of ``repeats`` calls of ``fn`` (:func:`timed_ms`)."""
    return statistics.median(timed_ms(fn, sync) for _ in range(repeats))


def fill_cache(target: Any, kv_len: int, max_nodes: int, gen: torch.Generator) -> int:
    """Prefill a prompt, then commit chains of random image tokens until ~``kv_len`` cache entries; returns it."""
    inputs = target.encode_prompt("a photograph of a red fox in the snow", cfg=target.supports_cfg)
    target.start(inputs, max_nodes)
    lay = target.layout
    budget = target.prompt_length(inputs) + lay.num_gen_tokens - 1  # stay inside the image (static caches)
    goal = min(kv_len, budget)
    while target.length < goal:
        n = min(128, goal - target.length)
        _commit_random_chain(target, n, gen)
    return int(target.length)


def fill_cache_to(target: Any, fraction: float, max_nodes: int, gen: torch.Generator, cfg: bool) -> int:
    """Prefill a prompt (CFG rows when ``cfg``), then commit random image tokens up to ``fraction`` of the image;
    returns the KV length (prompt + committed tokens)."""
    inputs = target.encode_prompt("a large red circle on a striped blue background", cfg=cfg)
    target.start(inputs, max_nodes)
    lay = target.layout
    goal = target.length + max(0, min(int(fraction * lay.num_gen_tokens), lay.num_gen_tokens - 1))
    while target.length < goal:
        n = min(128, goal - target.length)
        _commit_random_chain(target, n, gen)
    return int(target.length)


def _commit_random_chain(target: Any, n: int, gen: torch.Generator) -> None:
    """Verify a chain of n random image tokens and commit it (the chain, its depths and the kept nodes are built on
    the target's device, as the engine's are; the tokens are drawn from ``gen`` where it lives)."""
    lay, dev = target.layout, target.device
    toks = lay.image_token_offset + torch.randint(0, lay.num_codes, (n,), generator=gen, device=gen.device)
    steps = torch.arange(n, device=dev)
    target.verify_forward(toks.to(dev), torch.ones(n, n, dtype=torch.bool, device=dev).tril(), steps)
    target.commit(steps, in_place=True)


@torch.no_grad()
def measure_cost(
    target: Any,
    drafter: Drafter | None,
    sp: Any,
    max_nodes: int,
    max_level: int,
    repeats: int = 15,
    kv_fraction: float = 0.5,
    sizes: list[int] | None = None,
) -> CostModel:
    """Measure the cost model (module docstring). Leaves target and drafter in a reset-able state (the next
    ``target.start`` / ``drafter.reset`` starts afresh). ``drafter`` None: the verify forward only (drafter levels
    and fixed work 0: the Jacobi loops' ``window: cost``), each size's *fastest* call kept rather than the median
    (``VERIFY_ONLY_METHOD``): under a load above the cores the median caught preemption bursts and read a 16-node
    verify as 6.5 AR steps (1.8 on the idle machine), which no window choice survives; the minimum keeps the
    uncontended shape of the curve, which is what a choice between sizes needs."""
    from adtbench.algorithm.drafters.session import DraftSession

    sync = accel.is_cuda(target.device)
    gen = torch.Generator().manual_seed(0)
    lay = target.layout
    v_sizes = sorted({n for n in (sizes or VERIFY_SIZES) if n <= max_nodes} | {1, max_nodes})
    l_sizes = sorted({m for m in LEVEL_SIZES if m <= max_level} | {1, max_level})
    length = fill_cache_to(target, kv_fraction, max(v_sizes), gen, cfg=sp.use_cfg and target.supports_cfg)
    rows, dev = target.rows, target.device

    def toks(n: int) -> torch.Tensor:
        return int(lay.image_token_offset) + torch.randint(0, lay.num_codes, (n,), generator=gen, device=gen.device)

    cases = []
    for n in v_sizes:
        mask, depth = random_tree(n, gen)
        cases.append((toks(n).to(dev), mask.to(dev), depth.to(dev)))  # born on the device, as a policy's trees
    if drafter is None:  # the fastest of each size's calls: a call the machine's other work did not preempt
        verify_ms = _interleaved_ms([lambda c=c: target.verify_forward(*c) for c in cases], repeats, sync, np.min)
        return CostModel(v_sizes, verify_ms, [1], [0.0], 0.0, _meta(length, repeats, VERIFY_ONLY_METHOD))
    verify_ms = _interleaved_ms([lambda c=c: target.verify_forward(*c) for c in cases], repeats, sync)
    # drafter: committed prefix, then one extend of two tokens (fixed work) and expansion levels of m nodes. Reset at
    # the room a real image asks (``engine.prefill_drafter``: prompt + image + scratch slots + 1), so that a drafter
    # with static shapes (``request_static``), pinned at its first reset, is pinned for the images that follow;
    # the measurement itself needs ``length + max(l_sizes)`` ≤ that.
    drafter.reset(rows, target.prompt_cols + lay.num_gen_tokens + max(max_nodes, max(l_sizes)) + 1)
    H = target.hidden_size
    feats = torch.randn(rows, length, H, generator=gen, device=gen.device).to(dev, target.dtype)
    pos = torch.arange(length, device=dev)[None].expand(rows, length)
    embeds = drafter.embed(target, toks(length).to(dev))[None].expand(rows, -1, -1)
    valid = torch.ones(rows, length, dtype=torch.bool, device=dev)
    drafter.extend(feats[:, :-2], embeds[:, :-2], pos[:, :-2], valid[:, :-2])
    base_len = drafter.length
    root = toks(1).to(dev)

    def fixed() -> torch.Tensor:
        drafter.length = base_len  # re-extend the same two slots each time, as the decode loop does (all valid:
        out = drafter.extend(feats[:, -2:], embeds[:, -2:], pos[:, -2:])  # its static buckets when it has them)
        s = DraftSession(drafter, target, sp, root, length // 2, target.next_pos, out, None)
        logprobs: torch.Tensor = s.root_logprobs()
        return logprobs

    for _ in range(2):
        fixed()
    fixed_ms = median_ms(fixed, repeats, sync)
    drafter.length = base_len
    out = drafter.extend(feats[:, -2:], embeds[:, -2:], pos[:, -2:])

    def level(kids: torch.Tensor) -> None:
        s = DraftSession(drafter, target, sp, root, length // 2, target.next_pos, out, None)
        s.expand(torch.zeros_like(kids), kids, 1)
        drafter.rollback()

    kids = [toks(m).to(dev) for m in l_sizes]
    level_ms = _interleaved_ms([lambda k=k: level(k) for k in kids], repeats, sync)
    return CostModel(v_sizes, verify_ms, l_sizes, level_ms, fixed_ms, _meta(length, repeats))


def _meta(kv_len: int, repeats: int, method: str = MEASURE_METHOD) -> dict[str, Any]:
    """A measurement's ``CostModel.meta``: KV length, repeats, method, time and the load average then."""
    avg = load_average()
    return {
        "kv_len": kv_len,
        "repeats": repeats,
        "method": method,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load": None if avg is None else avg[0],
    }
