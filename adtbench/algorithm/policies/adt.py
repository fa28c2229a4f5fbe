"""``policy=adt``: ADT-Tree adaptive draft trees (arXiv 2512.21857), adtbench's design of algorithms.md §4.4.

The public ADT-Tree code has no adaptive algorithm (§4.1): everything below the two mechanisms the paper
names (adjacency initialisation, bisectional adaptation) is *our* design and every unknown is a parameter.

State. For every committed image position j (its generation index; end-of-line/-image slots have no state)
we keep the record of the cycle that committed it::

    S[j] = (before, after, α)     before = (D, K, step_d, step_k, dir) the cycle drafted with,
                                  after  = the same after that cycle's bisectional update.

Each cycle (root at generation index g; its first image position s = g, or the next image slot if g is an
end-of-line slot):

1. Initialise (D, K, steps, dir) from a neighbour of s in the image grid (``init``), reading its ``after``
   (``read: updated``) or ``before`` (``read: final``) state:
   - ``horizontal``: the left neighbour (r, c−1) → "left"; at c = 0 the raster predecessor (r−1, W−1), i.e.
     the previous cycle as in §4.4's ``S[s−1]`` → "prev_row"; at (0, 0) the defaults (D0, K0) → "default";
   - ``vertical``: the token one grid row above (r−1, c) → "up" (generation index s − row_len, EOL counted);
     in the first row the horizontal rule;
   - ``none``: always (D0, K0) → "default" (the fixed EAGLE-2 tree).
2. Draft with EAGLE-2 (``eagle2_steps``): depth parameter D − 1 (max draft depth D), top_k K,
   N drafted nodes: ``budget: fixed`` → N = N_max; ``budget: min`` → N = min(N_max, K + (D−1)·K²). EAGLE-2's
   rerank never keeps more than the candidates, so both rules draft the same tree; they differ in the logged N.
   ``budget: cost`` (``algorithm.cost``): D and K as above, but the drafter levels run only while another can pay
   for itself and N ≤ N_max maximises expected committed tokens per unit of measured time (lossless: it only
   chooses which drafted nodes are verified; ``calibrate`` scales the drafter's estimate online; ``rounds`` says
   when the level rule decides a round: before it, or planned from the previous cycle, ``TreeBudget.live``).
3. After verification with a accepted drafts, realised depth d and drafted depth D_dr (D capped by the image
   positions left): α = a/D_dr (``alpha: drafted``, default: the issue's "accepted drafts / depth drafted";
   it makes a deeper tree need more acceptance to keep growing, so D settles near a/β) or a/d (``alpha: realised``);
   both are logged (0 when the denominator is 0). Bisectional update (``adapt: true``)::

       dir' = +1 if α ≥ β else −1
       if halve_on_flip and dir ≠ 0 and dir' ≠ dir: step ← max(1, step // 2)   (a zero step stays 0)
       positive: D' = min(D + step_d, D_max), K' = max(K − step_k, K_min)      deeper, narrower
       negative: D' = max(D − step_d, D_min), K' = min(K + step_k, K_max)      shallower, wider

   and S[j] is written for every image position j ∈ [g, g + a] the cycle committed.

Invariants: the policy D ∈ [D_min, D_max] and K ∈ [K_min, K_max] in every cycle; the state resets per image;
the policy sees only the ``DraftSession`` and its ``TokenLayout``. With ``adapt: false`` (or init ``none``,
or ``read: final``, which never propagates an update) every tree is EAGLE-2's at (D0, K0, N_max); the
defaults D0 = 5, K0 = 10, N_max = 58 are EAGLE-2's ``depth=4, top_k=10, total_tokens=59``.

Trace (``tree.info``, copied into trace.jsonl per cycle): ``N``, ``D_policy`` (D before the image-end cap;
the record's ``D`` is the drafted depth), ``init``, ``alpha`` (a/d), ``alpha_D`` (a/D_dr), ``D_next``,
``K_next``, ``step_d``, ``step_k``; ``K`` and ``a`` are in the cycle record already.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adtbench.algorithm.cost import CostModelSource, PolicyBudget
from adtbench.algorithm.drafters.session import DraftSession, Steps
from adtbench.algorithm.policies.base import GATE_KEYS, Method, TreePolicy, register_method, with_gate
from adtbench.algorithm.policies.eagle2 import eagle2_candidates, eagle2_steps
from adtbench.algorithm.policies.sampled import SampledDrafts
from adtbench.algorithm.records import Acceptance
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import ConfigError, check_choice, check_flag, check_number
from adtbench.layout import TokenLayout

INITS = ("horizontal", "vertical", "none")
READS = ("updated", "final")
ALPHAS = ("realised", "drafted")
BUDGETS = ("fixed", "min", "cost")


@dataclass(frozen=True)
class TreeShape:
    """The adaptive part of the state: depth D, width K, current step sizes and last move direction."""

    D: int
    K: int
    step_d: int
    step_k: int
    direction: int = 0  # +1 last move deeper/narrower, −1 shallower/wider, 0 none yet


@dataclass(frozen=True)
class PositionState:
    """S[j]: the shape the committing cycle drafted with, the shape after its update, and its α."""

    before: TreeShape
    after: TreeShape
    alpha: float


class ADTPolicy(TreePolicy):
    """Adaptive-depth/width EAGLE-2 trees with adjacency initialisation (see module docstring)."""

    name = "adt"

    def __init__(
        self,
        *,
        init: str = "horizontal",
        read: str = "updated",
        adapt: bool = True,
        alpha: str = "drafted",
        beta: float = 0.5,
        l_d: int = 1,
        l_k: int = 2,
        halve_on_flip: bool = False,
        D0: int = 5,
        K0: int = 10,
        D_min: int = 2,
        D_max: int = 8,
        K_min: int = 4,
        K_max: int = 16,
        N_max: int = 58,
        budget: str = "cost",
        calibrate: bool = True,
        draft_sampling: str = "topk",
        rounds: str = "auto",
    ) -> None:
        def choice(key: str, value: str, options: tuple[str, ...]) -> str:
            return check_choice(value, f"policy.{key}", options)

        def integer(key: str, value: Any, lo: int) -> int:
            return int(check_number(value, f"policy.{key}", int, lo=lo))

        self.init = choice("init", init, INITS)
        self.read = choice("read", read, READS)
        self.alpha_def = choice("alpha", alpha, ALPHAS)
        self.budget = choice("budget", budget, BUDGETS)
        self.cost = PolicyBudget(budget, BUDGETS, calibrate, rounds)
        self.sampled = SampledDrafts(draft_sampling)
        self.adapt = check_flag(adapt, "policy.adapt")
        self.halve_on_flip = check_flag(halve_on_flip, "policy.halve_on_flip")
        self.beta = float(check_number(beta, "policy.beta", float, lo=0.0, hi=1.0))  # α ∈ [0, 1]
        self.l_d, self.l_k = integer("l_d", l_d, 0), integer("l_k", l_k, 0)
        self.D_min, self.K_min = integer("D_min", D_min, 1), integer("K_min", K_min, 1)
        self.D_max, self.K_max = integer("D_max", D_max, self.D_min), integer("K_max", K_max, self.K_min)
        self.D0, self.K0 = integer("D0", D0, 1), integer("K0", K0, 1)
        if not self.D_min <= self.D0 <= self.D_max:
            raise ConfigError("policy.D0", f"must lie in [D_min, D_max] = [{self.D_min}, {self.D_max}], got {D0}")
        if not self.K_min <= self.K0 <= self.K_max:
            raise ConfigError("policy.K0", f"must lie in [K_min, K_max] = [{self.K_min}, {self.K_max}], got {K0}")
        self.N_max = integer("N_max", N_max, 1)
        self.state: dict[int, PositionState] = {}
        self._pending: tuple[TreeShape, TokenLayout] | None = None

    # --- TreePolicy -------------------------------------------------------------------------------------
    def max_nodes(self) -> int:
        """Tree size ≤ N_max + 1 (the drafter's scratch is sized by ``max_draft_slots``)."""
        return self.N_max + 1

    def max_draft_slots(self) -> int:
        """Most drafter slots one cycle expands: K frontier nodes per round, D − 1 rounds."""
        return self.K_max * (self.D_max - 1)

    def bind(self, cost: CostModelSource | None) -> None:
        self.cost.bind(cost, self.N_max + 1, self.K_max)

    def reset(self) -> None:
        self.cost.reset()
        self.sampled.reset()
        self.state.clear()
        self._pending = None

    def default_shape(self) -> TreeShape:
        return TreeShape(self.D0, self.K0, self.l_d, self.l_k, 0)

    def nodes_budget(self, D: int, K: int) -> int:
        """N drafted nodes for a (D, K) tree under the ``budget`` rule."""
        if self.budget in ("fixed", "cost"):
            return self.N_max
        return min(self.N_max, eagle2_candidates(D - 1, K))

    def initial_shape(self, layout: TokenLayout, root_gen: int) -> tuple[TreeShape, str]:
        """(shape, source) for a cycle rooted at ``root_gen`` (see module docstring, step 1)."""
        if self.init == "none":
            return self.default_shape(), "default"
        s = first_image_position(layout, root_gen)
        if s is None:
            return self.default_shape(), "default"
        for gen, source in neighbours(layout, s, self.init):
            rec = self.state.get(gen)
            if rec is not None:
                return (rec.after if self.read == "updated" else rec.before), source
        return self.default_shape(), "default"

    def propose_steps(self, session: DraftSession, max_depth: int) -> Steps:
        shape, source = self.initial_shape(session.layout, session.root_gen)
        N = self.nodes_budget(shape.D, shape.K)
        budget = self.cost.tree_budget(self.name)
        if self.sampled.applies(session):
            tree = yield from self.sampled.steps(session, shape.D - 1, shape.K, N + 1, max_depth, budget)
        else:
            tree = yield from eagle2_steps(
                session, shape.D - 1, shape.K, N + 1, max_depth, budget, self.graphs.levels != "eager"
            )
        tree.info.update(N=tree.size - 1 if budget is not None else N, D_policy=shape.D, init=source)
        if tree.on_read is not None:  # ``budget: cost`` chose N on the device: it arrives with the verdict
            tree.on_read = _with_n(tree.on_read, tree.info)
        self._pending = (shape, session.layout)
        return tree

    def observe(self, tree: DraftTree, acceptance: Acceptance, root_gen: int) -> None:
        if self._pending is None:
            raise RuntimeError("ADTPolicy.observe called without a preceding propose")
        shape, layout = self._pending
        self._pending = None
        self.cost.observe(tree, acceptance)
        self.sampled.observe(tree, acceptance)
        a, d, D_dr = acceptance.accepted, acceptance.tree_depth, tree.drafted_depth
        alpha_d = a / d if d > 0 else 0.0
        alpha_D = a / D_dr if D_dr > 0 else 0.0
        alpha = alpha_d if self.alpha_def == "realised" else alpha_D
        after = self.update(shape, alpha) if self.adapt else shape
        rec = PositionState(shape, after, alpha)
        for j in range(root_gen, root_gen + a + 1):  # the committed positions; EOL/EOI slots get no state
            if layout.grid_position(j) is not None:
                self.state[j] = rec
        tree.info.update(
            alpha=alpha_d, alpha_D=alpha_D, D_next=after.D, K_next=after.K, step_d=after.step_d, step_k=after.step_k
        )

    # --- helpers ----------------------------------------------------------------------------------------
    def update(self, shape: TreeShape, alpha: float) -> TreeShape:
        """Bisectional update of ``shape`` given this cycle's α (module docstring, step 3)."""
        direction = 1 if alpha >= self.beta else -1
        sd, sk = shape.step_d, shape.step_k
        if self.halve_on_flip and shape.direction != 0 and direction != shape.direction:
            sd, sk = (max(1, sd // 2) if sd > 0 else 0), (max(1, sk // 2) if sk > 0 else 0)
        if direction > 0:
            D, K = min(shape.D + sd, self.D_max), max(shape.K - sk, self.K_min)
        else:
            D, K = max(shape.D - sd, self.D_min), min(shape.K + sk, self.K_max)
        return TreeShape(D, K, sd, sk, direction)


def _with_n(on_read: Callable[[list[float]], None], info: dict[str, Any]) -> Callable[[list[float]], None]:
    """``on_read`` then the trace's ``N`` from the budget's node count."""

    def read(values: list[float]) -> None:
        on_read(values)
        info["N"] = info["N_cost"]

    return read


def first_image_position(layout: TokenLayout, gen: int) -> int | None:
    """``gen`` if it is an image slot, else the next image slot (the root may be an EOL token); None at EOI."""
    for j in (gen, gen + 1):
        if layout.grid_position(j) is not None:
            return j
    return None


def neighbours(layout: TokenLayout, s: int, init: str) -> list[tuple[int, str]]:
    """Generation indices to read, in fallback order, for image position ``s`` (module docstring, step 1)."""
    pos = layout.grid_position(s)
    if pos is None:
        return []
    r, c = pos
    W = layout.row_len  # generation-index stride of one grid row (EOL included)
    order: list[tuple[int, str]] = []
    if init == "vertical" and r > 0:
        order.append((s - W, "up"))
    if c > 0:
        order.append((s - 1, "left"))
    elif r > 0:
        order.append(((r - 1) * W + layout.grid_w - 1, "prev_row"))
    return order


def build_adt_policy(node: Any) -> ADTPolicy:
    """``ADTPolicy`` from the ``policy`` config node (unknown keys are a ConfigError naming them)."""
    data = dict(node)
    data.pop("name", None)
    for key in GATE_KEYS:
        data.pop(key, None)
    known = set(ADTPolicy.__init__.__kwdefaults__ or {})
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"policy.{unknown[0]}", f"unknown ADT parameter; known: {sorted(known)}")
    return with_gate(ADTPolicy(**data), node)


register_method(
    Method(
        "adt",
        build_adt_policy,
        "adtbench.harness.schema:AdtConf",
        lossless=("exact",),
        graphs=("verify", "levels", "step"),
        smoke=("policy.N_max=10", "policy.K0=3", "policy.K_min=2", "policy.K_max=4", "policy.D0=3"),
    )
)
