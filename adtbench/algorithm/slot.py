"""One prompt in flight: the bookkeeping every decode loop drives, whether it decodes one prompt or a batch.

    Timing       a decode's clock marks and forwards → the timed fields of its ``GenerationResult``
    DecodeState  one prompt's speculative tree decode: ``engine.generate`` drives one, ``batch.generate_batch`` one
                 per slot, with the same calls in the same order
    SlotStream   continuous batching's admissions (``batch.generate_batch``, ``jacobi.batch.generate_jacobi_batch``):
                 ``B`` slots fed from a stream of prompts; a finished slot hands its result on and takes the next
                 prompt at once

A cycle's bookkeeping (algorithms.md §1): the root is the last chosen token, on the device and not yet in the
target's KV cache; its value is read with the cycle that verifies it (the first root's too: ``tokens[0]`` is a
placeholder until then). The cycle commits the root and the accepted drafts and picks the bonus token, the next
root. The drafter consumes the committed slots (f_t, x_{t+1}) lazily: ``pending`` holds those of every cycle since
its last forward, all fed in one ``extend`` at the start of the next drafted cycle. A draft gate decides per cycle
from the entropy bin of the root (``bin``: read with the cycle that chose it) whether the cycle drafts at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from adtbench import accel
from adtbench.algorithm.drafters.base import Drafter
from adtbench.algorithm.drafters.catch_up import CommittedSlots
from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.methods.gate import DraftGate
from adtbench.algorithm.records import Acceptance, Clock, CycleRecord, GenerationResult
from adtbench.algorithm.sampling import next_token_tensor
from adtbench.algorithm.tree import DraftTree, arange_on
from adtbench.algorithm.verify import (
    AcceptanceRule,
    CycleRead,
    Verdict,
    accept,
    read_verdicts,
    verify_cycle,
)
from adtbench.models.base import PromptInputs, Target
from adtbench.sampling_params import SamplingParams

if TYPE_CHECKING:  # the policies package imports the loops (policies.jacobi → jacobi → slot): no cycle at runtime
    from adtbench.algorithm.policies.base import TreePolicy

Item = tuple[Any, PromptInputs, torch.Generator | None]  # (the caller's key, the encoded prompt, its generator)
Mark = Any  # a ``Clock.mark()``

Pending = tuple[torch.Tensor, torch.Tensor, torch.Tensor] | CommittedSlots
"""A committed cycle the drafter has not consumed: (features ``[R, k, H]``, positions ``[R, k]``, next tokens ``[k]``),
or a graphed verify's slots left on the device (``drafters.catch_up``)."""


@dataclass
class Timing:
    """A decode's clock: ``t0`` (``Clock.now()`` before the prefill), the prefill's marks, the spans spent drafting
    and verifying (pairs of marks, read once the decode is done) and the target forwards it took part in."""

    t0: float
    prefill: tuple[Mark, Mark]
    drafts: list[tuple[Mark, Mark]] = field(default_factory=list)
    verifies: list[tuple[Mark, Mark]] = field(default_factory=list)
    forwards: int = 1  # the prefill's
    latency: float = 0.0  # seconds from ``t0`` to the last token (``stop``)

    def cycle(self, start: Mark, drafted: Mark, verified: Mark, done: Mark) -> None:
        """A single-prompt cycle: drafting from ``start`` to ``drafted`` and from ``verified`` to ``done`` (the
        bookkeeping after the verify), the verify forward and acceptance between."""
        self.drafts += [(start, drafted), (verified, done)]
        self.verifies.append((drafted, verified))

    def stop(self, clock: Clock) -> None:
        """The decode's last token is chosen: its latency ends now (``clock.now()``)."""
        self.latency = clock.now() - self.t0

    def result(
        self,
        clock: Clock,
        tokens: list[int],
        cycles: list[CycleRecord],
        drafter_forwards: int,
        stats: dict[str, Any],
        target_forwards: int | None = None,
    ) -> GenerationResult:
        """The ``GenerationResult`` of a decode that was ``stop``-ped; ``target_forwards`` None: ``forwards``."""
        draft_s = sum(clock.seconds(a, b) for a, b in self.drafts)
        verify_s = sum(clock.seconds(a, b) for a, b in self.verifies)
        return GenerationResult(
            tokens,
            cycles,
            self.latency,
            clock.seconds(*self.prefill),
            draft_s,
            verify_s,
            self.forwards if target_forwards is None else target_forwards,
            drafter_forwards,
            stats,
        )


def decides_on_host(acceptance: str, device: torch.device) -> bool:
    """Whether a loop's cycle decisions (acceptance, EAGLE-2 and sampled trees) run on the host: ``acceptance``
    (``engine.acceptance``) ``host``, or ``auto`` off CUDA (``verify.verify_cycle``)."""
    return acceptance == "host" or (acceptance == "auto" and not accel.is_cuda(device))


@dataclass
class DecodeState:
    """One prompt's speculative tree decode (module docstring): what the loop carries from cycle to cycle."""

    policy: TreePolicy  # this prompt's (its own state: a batch copies the policy per slot)
    generator: torch.Generator | None
    n_gen: int  # image tokens
    root: torch.Tensor  # [1] the next cycle's root, on the device
    out: torch.Tensor  # the drafter's output at the root [R, H] (valid once ``pending`` is empty)
    on_host: bool  # the cycle's decisions run on the host (``decides_on_host``)
    tokens: list[int] = field(default_factory=lambda: [-1])  # committed; [0] is read with the first cycle
    cycles: list[CycleRecord] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    """Committed slots the drafter has not seen, per cycle: (features [R, k, H], positions [R, k], next tokens
    [k])."""
    drafter_forwards: int = 1  # the prefill's
    bin: int | None = None  # the gate's entropy bin of the root (None: unknown)

    @classmethod
    def start(
        cls,
        policy: TreePolicy,
        generator: torch.Generator | None,
        n_gen: int,
        root: torch.Tensor,
        out: torch.Tensor,
        on_host: bool,
    ) -> DecodeState:
        """A prompt whose first token ``root`` was just chosen by the prefill (``out``: the drafter's output at it);
        the policy and its gate start a new image."""
        policy.reset()
        if policy.gate is not None:
            policy.gate.reset()
        return cls(policy, generator, n_gen, root.view(1), out, on_host)

    @property
    def gate(self) -> DraftGate | None:
        return self.policy.gate

    @property
    def g(self) -> int:
        """The root's generation index."""
        return len(self.tokens) - 1

    @property
    def room(self) -> int:
        """Most drafts this cycle: they stop one short of the image end (the last token is always a bonus)."""
        return self.n_gen - len(self.tokens) - 1

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.n_gen

    def drafts(self) -> bool:
        """Whether this cycle drafts: room for a draft, and the gate lets it (a gate's ``draft`` is called once per
        cycle that has room)."""
        gate = self.policy.gate
        return self.room >= 1 and (gate is None or gate.draft(self.bin))

    def caught_up(self, out: torch.Tensor) -> None:
        """The drafter consumed ``pending`` in one forward; ``out``: its output at the root."""
        self.out, self.pending = out, []
        self.drafter_forwards += 1

    def session(self, drafter: Drafter, target: Target, sp: SamplingParams, root_pos: torch.Tensor) -> DraftSession:
        """This cycle's drafting session (``root_pos [R]``: the root's positions)."""
        return DraftSession(drafter, target, sp, self.root, self.g, root_pos, self.out, self.generator, self.on_host)

    def advance(
        self,
        read: CycleRead,
        feats: torch.Tensor,
        next_pos: torch.Tensor,
        tree: DraftTree | None = None,
        session: DraftSession | None = None,
    ) -> None:
        """After the verify (``read``): commit the root and ``read.tokens``, record the cycle, tell the policy and the
        gate how the tree fared, move the root to the bonus and queue the committed slots for the drafter.
        ``feats [R, n, H]``: the target's features of the verified nodes; ``next_pos [R]``: the root's positions
        (read before the commit); ``tree`` / ``session`` None: the root was verified alone."""
        acc, g, gate = read.acceptance, self.g, self.policy.gate
        a = acc.accepted
        if tree is None:
            record = CycleRecord(root_gen=g, nodes=1, drafted_depth=0, tree_depth=0, width=0, accepted=0)
        else:
            if tree.size > 1:
                self.policy.observe(tree, acc, g)
            record = CycleRecord(
                root_gen=g,
                nodes=acc.nodes,
                drafted_depth=tree.drafted_depth,
                tree_depth=acc.tree_depth,
                width=tree.width,
                accepted=a,
                extra=dict(tree.info),
            )
            if gate is not None:
                gate.observe(self.bin, a + 1)
        if session is not None:
            self.drafter_forwards += session.forwards
        if self.tokens[0] < 0:
            self.tokens[0] = read.root
        self.tokens += read.tokens
        self.cycles.append(record)
        self.root = read.next_tokens[-1:]
        if gate is not None:
            self.bin = gate.bin_of_entropy(read.extra[0]) if read.extra else None
        if not self.done:
            k = a + 1
            if isinstance(read.slots, CommittedSlots):  # a graphed verify's, left on the device (``drafters.catch_up``)
                self.pending.append(read.slots)
                return
            if tree is not None:
                feats = feats.index_select(1, read.keep)
            positions = next_pos[:, None] if k == 1 else next_pos[:, None] + arange_on(k, next_pos.device)[None]
            self.pending.append((feats, positions, read.next_tokens))

    def result(self, clock: Clock, timing: Timing, target_forwards: int | None = None) -> GenerationResult:
        """The decode's ``GenerationResult``, ending now (``Timing.stop``)."""
        timing.stop(clock)
        if self.tokens[0] < 0:  # a one-token image: no cycle read the root
            self.tokens[0] = int(self.root)
        stats = {} if self.policy.gate is None else {"gated_steps": self.policy.gate.skips}
        return timing.result(
            clock, self.tokens[: self.n_gen], self.cycles, self.drafter_forwards, stats, target_forwards
        )


def root_alone(root: torch.Tensor, bonus: torch.Tensor, extra: list[torch.Tensor]) -> CycleRead:
    """The host's one read of a cycle without drafts (the root verified alone, ``bonus`` chosen after it): the
    root's and the bonus's values and ``extra`` (the gate's entropy), read at once."""
    values = torch.stack([x.to(torch.float64) for x in [root.view(()), bonus, *extra]]).tolist()
    b = int(values[1])
    keep = arange_on(1, bonus.device)
    return CycleRead(Acceptance([0], b), int(values[0]), [b], keep, bonus.view(1), values[2:])


S = TypeVar("S")


@dataclass
class Slot(Generic[S]):
    """A slot's prompt: the caller's key, its loop state, its clock."""

    key: Any
    state: S
    timing: Timing


class SlotStream(Generic[S]):
    """Continuous batching (module docstring): ``slots[s]`` holds the prompt in slot ``s`` (None: idle, the stream is
    dry). ``start(s, inputs, generator)`` prefills a prompt into slot ``s`` and returns its loop state;
    ``done(state)`` says whether it is complete; ``result(state, timing)`` its ``GenerationResult``, handed to
    ``on_done(key, result)`` in completion order."""

    def __init__(
        self,
        B: int,
        items: Iterable[Item],
        clock: Clock,
        start: Callable[[int, PromptInputs, torch.Generator | None], S],
        done: Callable[[S], bool],
        result: Callable[[S, Timing], GenerationResult],
        on_done: Callable[[Any, GenerationResult], None],
    ) -> None:
        self.stream, self.clock = iter(items), clock
        self.start, self.done, self.result, self.on_done = start, done, result, on_done
        self.slots: list[Slot[S] | None] = [None] * B
        for s in range(B):
            self.admit(s)

    def admit(self, s: int) -> None:
        """Slot ``s`` takes the next prompt (or goes idle)."""
        item = next(self.stream, None)
        self.slots[s] = None
        if item is None:
            return
        key, inputs, gen = item
        t0 = self.clock.now()
        begin = self.clock.mark()
        state = self.start(s, inputs, gen)
        self.slots[s] = Slot(key, state, Timing(t0, (begin, self.clock.mark())))
        if self.done(state):
            self.finish(s)

    def finish(self, s: int) -> None:
        """Slot ``s``'s prompt is complete: hand its result on, take the next prompt."""
        slot = self.slots[s]
        assert slot is not None
        self.on_done(slot.key, self.result(slot.state, slot.timing))
        self.admit(s)

    @property
    def busy(self) -> bool:
        return any(slot is not None for slot in self.slots)


def verify_slots(
    cases: Sequence[tuple[DraftTree | None, torch.Generator | None] | None],
    processed: torch.Tensor,
    sp: SamplingParams,
    rule: AcceptanceRule,
    acceptance: str,
    on_host: bool,
    entropy: bool = False,
) -> list[CycleRead | torch.Tensor | None]:
    """Every slot's acceptance from its rows of ``processed [B, N, V]`` (``cases[s]``: its tree — None for a root
    verified alone — and generator; None for an idle slot): a ``CycleRead`` for a tree, the chosen token (device
    ``[]``, ``engine.ar_cycle``'s draw) for a root alone, None for an idle slot. On the host (``on_host``) each tree
    runs the float64 walk (``verify.verify_cycle``); on the device every tree is accepted there and all the verdicts
    are read at once (``verify.read_verdicts``: one read per cycle for the whole batch). ``entropy``: read each
    bonus distribution's entropy with it (a draft gate). The batched loops' acceptance (trees and Jacobi chains)."""
    out: list[CycleRead | torch.Tensor | None] = [None] * len(cases)
    pending: list[tuple[int, tuple[DraftTree, Verdict, list[torch.Tensor]]]] = []
    for s, case in enumerate(cases):
        if case is None:
            continue
        tree, gen = case
        if tree is None:
            out[s] = next_token_tensor(processed[s, 0], sp, gen)
        elif on_host:
            extra = (lambda row: [DraftGate.entropy(row)]) if entropy else None
            out[s] = verify_cycle(tree, processed[s, : tree.size], sp.greedy, gen, rule, extra, acceptance)
        else:
            verdict = accept(tree, processed[s, : tree.size], sp.greedy, gen, rule)
            pending.append((s, (tree, verdict, [DraftGate.entropy(verdict.bonus_logits)] if entropy else [])))
    if pending:
        for (s, _), read in zip(pending, read_verdicts([p for _, p in pending]), strict=True):
            out[s] = read
    return out
