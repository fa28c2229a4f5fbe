"""Tree policies: given a drafting session, propose the draft tree of one cycle.

A policy sees only a ``DraftSession`` (root log-probs, ``expand``) and the depth budget of the cycle (the
image positions left), never the model. ``observe`` feeds back the verification outcome (ADT-Tree uses it);
``reset`` starts a new image.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from adtbench.algorithm.cost import CostModelSource
from adtbench.algorithm.drafters.session import DraftSession, Steps, drive
from adtbench.algorithm.records import Acceptance, GenerationResult
from adtbench.algorithm.tree import DraftTree
from adtbench.graph_modes import GraphModes
from adtbench.registry import Registry

if TYPE_CHECKING:
    from adtbench.algorithm.methods.gate import DraftGate


class TreePolicy(ABC):  # noqa: B024 (propose or propose_steps: either one)
    name: str = "policy"
    uses_drafter: bool = True
    gate: DraftGate | None = None  # draft gating (``algorithm.gate``, ``policy.gate_tokens``); None: draft every cycle
    graphs: GraphModes = (
        GraphModes()
    )  # ``engine.graphs`` (set by ``config.build_policy``): a tree policy reads ``levels``

    @property
    def drafts_with_eagle(self) -> bool:
        """Whether this policy's decode runs the EAGLE drafter (``drafter.*``): every tree policy that drafts
        (``uses_drafter``). The harness reads this declaration (``config.validate_drafter``: no silent random
        drafter on a real checkpoint), never the policy's name."""
        return self.uses_drafter

    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        """Build this cycle's tree; its depth must not exceed ``max_depth`` (≥ 1). Runs ``propose_steps`` against the
        session; a policy overrides one of the two."""
        return drive(self.propose_steps(session, max_depth), session)

    def propose_steps(self, session: DraftSession, max_depth: int) -> Steps:
        """``propose`` as a coroutine (``drafters.session.Steps``): yields each level to draft, so that batched
        decoding drafts the levels of all slots in one drafter forward. The default runs ``propose`` at once (its
        levels then run one slot at a time)."""
        if type(self).propose is TreePolicy.propose:
            raise NotImplementedError(f"{type(self).__name__} implements neither propose nor propose_steps")
        return self.propose(session, max_depth)
        yield  # a generator

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

    def bind(self, cost: CostModelSource | None) -> None:  # noqa: B027
        """Called once by the app after the models are built, before warm-up and outside the timed scope.

        Policies that size their trees to the machine (``budget: cost``) take their cost model from ``cost``
        (``(max_nodes, max_level) → CostModel``; the harness caches it on disk); others do nothing.
        """


class LoopPolicy(ABC):
    """A method with its own decode loop (ZipAR, MuLo-SD, the Jacobi loops) rather than a tree for
    ``engine.speculative_cycle``.

    ``engine.generate`` hands it the target, the method's own models (``aux``: built by the harness from the
    policy's keys, e.g. MuLo-SD's low-resolution drafter; None when it needs none) and the acceptance rule; it
    returns a ``GenerationResult`` whose cycles are its sequential target forwards (``algorithm.records``).
    """

    name: str = "loop"
    uses_drafter: bool = False  # never a tree for ``engine.speculative_cycle``
    drafts_with_eagle: bool = False  # True: the loop runs the EAGLE drafter (``drafter.*``; Jacobi ``init=drafter``)
    lossless: bool = False  # True only where the loop is distribution-identical to AR (tested)
    accepts_rule: bool = False  # True: the loop accepts with the app's rule (LANTERN may relax it); else its own
    batchable: bool = False  # True: ``generate_batch`` decodes B prompts per target forward (decode.batch_size)
    one_prompt: tuple[str, str] | None = None  # (key, why) where a key's value makes a batchable loop one-prompt
    graphs: GraphModes = GraphModes()  # ``engine.graphs`` (set by ``config.build_policy``): a loop reads ``step``

    def step_refusal(self) -> str | None:
        """Why ``engine.graphs.step=graph`` cannot run this loop's keys, whatever the target (None: it can, or the
        loop has no fixed-shape step and the key is not used); ``config.build_policy`` raises it as a
        ``ConfigError`` naming ``engine.graphs.step`` before any weights load."""
        return None

    def models_for(self, drafter: Any) -> Any:
        """``aux`` on a bare target and its EAGLE ``drafter`` (``adtbench check``'s tiny models); None: nothing
        besides the target. A ``ValueError`` says the tiny target alone cannot run this setting (a Jacobi
        ``window: cost`` needs the harness's calibration); a method that never can declares ``Method.tiny = False``."""
        return None

    def bind(self, cost: CostModelSource | None) -> None:  # noqa: B027
        """Loops size nothing to the machine (same signature as ``TreePolicy.bind``)."""

    def reset(self) -> None:  # noqa: B027
        """Start a new image."""

    def max_nodes(self) -> int:
        return 1

    @abstractmethod
    def generate(
        self,
        target: Any,
        aux: Any,
        inputs: Any,
        sp: Any,
        generator: torch.Generator | None,
        rule: Any,
        acceptance: str = "auto",
    ) -> GenerationResult:
        """Decode one image (timed inside, like ``engine.generate``); ``acceptance``: where a loop that verifies runs
        acceptance (``verify.verify_cycle``)."""


Policy = TreePolicy | LoopPolicy

GRAPH_PATHS = ("verify", "levels", "step")
"""The graph paths a method may declare (``Method.graphs``; each a ``graph_runner.GraphRunner`` user): ``verify`` —
its target forwards run through the target's captured verify buckets (``engine.compile``); ``levels`` — its drafting
levels as graph replays (``engine.graphs.levels``); ``step`` — a fixed-shape device step holding the verify and
acceptance: a Jacobi loop's whole iteration (``engine.graphs.step``), a tree policy's tree verify
(``engine.graphs.verify``)."""


@dataclass(frozen=True)
class Method:
    """Everything the harness, the checks and the docs know of one ``policy.name``, declared by the policy's module:

    - ``build(node) → Policy`` (a plain dict node, ``name`` included; every bad value a ``ConfigError`` naming
      ``policy.<key>``) and ``schema`` (the dataclass of its keys — ``params.key`` fields parse and validate — or a
      ``"pkg.module:Class"`` path), merged with the composed ``policy`` node by ``harness.schema``;
    - what it needs built besides the target: ``models(cfg, conf, target) → aux`` and ``check(cfg, policy)`` (cross-key
      rules against other groups, before any weights load), each a callable or a lazy ``"pkg.module:attr"`` path
      (the harness's, which ``algorithm`` may not import); the built policy declares the rest
      (``drafts_with_eagle``, ``uses_drafter``, ``batchable``, a Jacobi window's ``calibrated_window``);
    - ``lossless``: the acceptance rules under which its output law is AR's (``("exact",)``; empty: a lossy method);
      a key can still make one setting lossy (the built policy's ``lossless`` attribute, e.g. ``rule=gsd``);
    - ``graphs``: the graph paths it supports (``GRAPH_PATHS``);
    - ``smoke``: the overrides that size it to the tiny models (the simulated app test, ``adtbench check``), and
      ``law_keys``: the keys of its law test on a 2 × 2 image (``adtbench check``; e.g. a short window).

    Registered by ``register_method``; ``POLICIES.get(name)`` returns it (calling it builds the policy).
    """

    name: str
    build: Callable[[dict[str, Any]], Policy]
    schema: type | str
    lossless: tuple[str, ...] = ()
    graphs: tuple[str, ...] = ()
    models: Callable[..., Any] | str | None = None
    check: Callable[..., None] | str | None = None
    smoke: tuple[str, ...] = ()
    tiny: bool = True  # runs on the tiny models alone (MuLo-SD: False, it needs a low-resolution model of its family)
    law_keys: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.graphs) - set(GRAPH_PATHS)
        if unknown:
            raise ValueError(f"policy {self.name}: unknown graph paths {sorted(unknown)}; known: {GRAPH_PATHS}")

    def __call__(self, node: dict[str, Any]) -> Policy:
        return self.build(node)

    @property
    def schema_type(self) -> type:
        """``schema`` imported where it is a path."""
        schema = resolve(self.schema)
        assert isinstance(schema, type), schema
        return schema

    def claims_lossless(self, policy: Policy) -> bool:
        """Whether ``policy`` (built by this method, exact acceptance) declares AR's law."""
        return "exact" in self.lossless and bool(getattr(policy, "lossless", True))


def resolve(obj: Any) -> Any:
    """``obj``, or the attribute a ``"pkg.module:attr"`` path names (imported)."""
    if isinstance(obj, str):
        module, _, attr = obj.partition(":")
        return getattr(importlib.import_module(module), attr)
    return obj


POLICIES: Registry[Policy] = Registry("policy")
"""``policy.name`` → its ``Method`` (callable: node → Policy); each policy module registers its own
(``register_method``), ``import adtbench.algorithm.policies`` imports them all and the plugins' (``plugins``)."""


def register_method(method: Method) -> Method:
    """Register ``method`` under its name (twice is an error)."""
    POLICIES.register(method.name, method)
    return method


def method_of(name: str) -> Method:
    """The ``Method`` of ``policy.name`` (unknown: ``ConfigError`` naming ``policy``)."""
    method = POLICIES.get(name)
    assert isinstance(method, Method), f"policy {name} is registered without a Method"
    return method


def methods() -> list[Method]:
    """Every registered method, by name."""
    return [method_of(name) for name in POLICIES.names()]


GATE_KEYS = ("gate_tokens", "gate_explore")  # ``with_gate``'s keys
P = TypeVar("P", bound=TreePolicy)


def with_gate(policy: P, node: Any) -> P:
    """Attach the draft gate of ``policy.gate_tokens`` (null: none) and ``policy.gate_explore`` to ``policy``."""
    from adtbench.algorithm.methods.gate import DraftGate

    tokens = node.get("gate_tokens")
    policy.gate = None if tokens is None else DraftGate(float(tokens), int(node.get("gate_explore", 8)))
    return policy


def desc_stable(x: np.ndarray) -> np.ndarray:
    """Indices sorting ``x`` descending along its last axis, ties toward the lower index
    (``torch.sort(descending=True, stable=True)``'s order)."""
    return np.argsort(-x, axis=-1, kind="stable")


PARTIAL_MIN = 2048  # entries below which ``top_k_stable`` sorts everything (one row of V = 512: 6 µs vs 13 µs)


def top_k_stable(x: np.ndarray, k: int) -> np.ndarray:
    """``desc_stable(x)[..., :k]`` for ``x [V]`` or ``[m, V]`` without sorting all V entries: the policies' one
    deterministic top-k (drafter log-probs are ranked on a host copy).

    Every entry at or above the row's k-th largest value is a candidate (found by one ``np.partition``); when each
    row has exactly k of them (no tie across the k-th place), their stable descending order is the answer, since
    ``np.nonzero`` lists them in ascending index order. Otherwise — a tie at the boundary, e.g. several −inf —
    the full stable sort decides.
    """
    V = x.shape[-1]
    if k >= V or x.size <= PARTIAL_MIN:  # a small sort is cheaper than the partition's fixed cost
        return desc_stable(x)[..., :k]
    rows = x.reshape(-1, V)
    kth = -np.partition(-rows, k - 1, axis=-1)[:, k - 1 : k]  # each row's k-th largest value
    cand = rows >= kth
    if int(cand.sum()) != k * rows.shape[0]:
        return desc_stable(x)[..., :k]
    idx = np.nonzero(cand)[1].reshape(-1, k)
    order = np.argsort(-np.take_along_axis(rows, idx, -1), axis=-1, kind="stable")
    return np.take_along_axis(idx, order, -1).reshape(*x.shape[:-1], k)


def stable_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the ``k`` largest entries along the last dim, ties toward the lower index — the order of
    :func:`desc_stable` — on ``scores``' device, in fixed shapes (no read: a CUDA graph captures it).

    Scores of 32 bits or fewer take one ``torch.topk`` over an int64 key per entry: the score's bits made monotone
    (a float's sign-magnitude bits, negatives' magnitude bits flipped; ``−0.0`` counted as ``+0.0``) in the high 32
    bits, ``2³² − 1 − index`` in the low ones, so the key orders by score, then by lower index, exactly — no
    full-row sort (``torch.topk`` alone breaks ties arbitrarily). float64 scores (the exactness tests) keep one
    stable descending sort."""
    n = scores.shape[-1]
    k = min(k, n)
    if scores.dtype == torch.float64 or not scores.is_floating_point() or n >= 2**32:
        vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
        return vals[..., :k], idx[..., :k]
    x = (scores.to(torch.float32) + 0.0).view(torch.int32)  # + 0.0: −0.0 → +0.0 (sort treats them as equal)
    bits = torch.where(x < 0, x ^ 0x7FFFFFFF, x).to(torch.int64)  # monotone in the float's order
    key = bits * 2**32 + (2**32 - 1 - _index_row(n, scores.device))
    idx = torch.topk(key, k, dim=-1).indices
    return scores.gather(-1, idx), idx


@lru_cache(maxsize=64)
def _index_row(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` int64 on ``device`` (cached, never written)."""
    return torch.arange(n, dtype=torch.int64, device=device)
