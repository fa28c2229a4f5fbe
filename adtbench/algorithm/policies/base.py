"""Tree policies: given a drafting session, propose the draft tree of one cycle.

A policy sees only a ``DraftSession`` (root log-probs, ``expand``) and the depth budget of the cycle (the
image positions left), never the model. ``observe`` feeds back the verification outcome (ADT-Tree uses it);
``reset`` starts a new image.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from adtbench.algorithm.cost import CostModelSource
from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.records import GenerationResult
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import Acceptance
from adtbench.registry import Registry

if TYPE_CHECKING:
    from adtbench.algorithm.gate import DraftGate


class TreePolicy(ABC):
    name: str = "policy"
    uses_drafter: bool = True
    gate: DraftGate | None = None  # draft gating (``algorithm.gate``, ``policy.gate_tokens``); None: draft every cycle

    @abstractmethod
    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        """Build this cycle's tree; its depth must not exceed ``max_depth`` (≥ 1)."""

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
    """A method with its own decode loop (ZipAR, MuLo-SD) rather than a tree for ``engine.speculative_cycle``.

    ``engine.generate`` hands it the target, the method's own models (``aux``: built by the harness from the
    policy's keys, e.g. MuLo-SD's low-resolution drafter; None when it needs none) and the acceptance rule; it
    returns a ``GenerationResult`` whose cycles are its sequential target forwards (``algorithm.records``).
    """

    name: str = "loop"
    uses_drafter: bool = False  # never an EAGLE drafter
    lossless: bool = False  # True only where the loop is distribution-identical to AR (tested)

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
    ) -> GenerationResult:
        """Decode one image (timed inside, like ``engine.generate``)."""


Policy = TreePolicy | LoopPolicy

POLICIES: Registry[Policy] = Registry("policy")
"""``policy.name`` → builder(policy node) → TreePolicy; each policy module registers its own builder(s), and
``import adtbench.algorithm.policies`` imports them all. Builders get a node already checked against its schema
(``adtbench.harness.schema``); constructors check ranges and choices, naming ``policy.<key>``."""


GATE_KEYS = ("gate_tokens", "gate_explore")
P = TypeVar("P", bound=TreePolicy)


def with_gate(policy: P, node: Any) -> P:
    """Attach the draft gate of ``policy.gate_tokens`` (null: none) and ``policy.gate_explore`` to ``policy``."""
    from adtbench.algorithm.gate import DraftGate

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


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, ties broken toward the lower index (deterministic): ``top_k_stable`` on a
    host copy (widened to float32 at least, which keeps every order and tie), returned on ``scores``' device."""
    host = scores.detach().to("cpu", torch.promote_types(scores.dtype, torch.float32)).numpy()
    return torch.from_numpy(top_k_stable(host, k)).to(scores.device)


def _gumbel_keys(lp: np.ndarray, generator: torch.Generator | None) -> np.ndarray:
    """``lp + Gumbel`` with one uniform per entry (u = 0 gives −inf: never drawn)."""
    u = torch.rand(lp.shape, generator=generator, dtype=torch.float64).numpy()
    with np.errstate(divide="ignore"):
        return np.asarray(lp - np.log(-np.log(u)))


def _largest_in_order(keys: np.ndarray, c: int) -> np.ndarray:
    """Indices of the ``c`` largest of ``keys [V]``, largest first (one partition and a sort of c; argmax for 1)."""
    if c == 1:
        return np.array([int(np.argmax(keys))])
    idx = np.argpartition(-keys, c - 1)[:c] if c < keys.size else np.arange(keys.size)
    return np.asarray(idx[np.argsort(-keys[idx], kind="stable")])


def gumbel_draws(lp: np.ndarray, n: int | np.ndarray, generator: torch.Generator | None) -> list[np.ndarray]:
    """Draws without replacement from each row of ``softmax(lp)`` ``[m, V]``, in draw order: ``n[i]`` from row i
    (an int: the same for every row).

    Gumbel-top-n (Kool et al. 2019): the n largest keys ``lp + Gumbel`` have the law of n sequential draws without
    replacement, in that order (keys tie with probability 0). One uniform per entry of the rows drawn from; a row
    with ``n[i] = 0`` consumes none. Rows need at least ``n[i]`` finite entries (lp = −inf is never drawn)."""
    counts = np.asarray(n)
    if counts.ndim == 0:
        counts = np.full(lp.shape[0], int(counts))
    rows = counts.nonzero()[0]
    out: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * lp.shape[0]
    if rows.size == 0:
        return out
    keys = _gumbel_keys(lp[rows], generator)
    for r, i in enumerate(rows.tolist()):
        out[i] = _largest_in_order(keys[r], int(counts[i]))
    return out


def sample_without_replacement(
    logprobs: torch.Tensor, k: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``k`` distinct tokens in order from ``softmax(logprobs)`` ``[V]`` (Gumbel-top-k, as ``gumbel_draws`` on
    one row); returns (tokens, probs ``[V]`` in float64). Fewer than k tokens come back when the support is smaller."""
    lp = logprobs.detach().to("cpu", torch.float64).numpy()
    k = min(k, int(np.isfinite(lp).sum()))
    probs = torch.from_numpy(np.exp(lp))
    if k == 0:
        return torch.zeros(0, dtype=torch.long), probs
    return torch.from_numpy(_largest_in_order(_gumbel_keys(lp, generator), k)), probs
