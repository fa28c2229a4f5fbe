"""A tree's ``readout`` (float64 scalars a policy decided on the device, ``DraftTree.readout``: ``budget: cost``'s
node count) reaches its ``on_read`` in the verdict's one read on every verify path: the B = 1 graphed step
(``tree_step``, a tree copied in), the eager device acceptance (``verify.verify_cycle`` → ``read_verdicts``), the
batched step (``batch_step``) and the eager batched verify (``slot.verify_slots``) — with the values the device
held, once per verified tree, and the decode unchanged (greedy = AR)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from conftest import tiny

import adtbench.algorithm.batch_step as BS
import adtbench.algorithm.tree_step as TS
from adtbench import accel
from adtbench.algorithm.batch import generate_batch
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.graph_modes import GraphModes
from adtbench.models.batch import BatchTarget
from adtbench.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
PROMPTS = ("a red circle", "two blue squares on a striped floor", "a green cat")


class _Told(Eagle2Policy):
    """EAGLE-2 whose every drafted tree carries a readout computed on the device from the tree — (Σ tokens, node
    count, a serial number) — and records, per tree, what the device held and what ``on_read`` was handed (in the
    class: a batch's per-slot copies share it)."""

    told: ClassVar[list[list[Any]]] = []

    def __init__(self) -> None:
        super().__init__(depth=2, top_k=3, total_tokens=9)
        type(self).told = []

    def propose_steps(self, session: Any, room: int) -> Any:
        tree = yield from super().propose_steps(session, room)
        serial = float(len(self.told))
        size = torch.full((1,), float(tree.size), dtype=torch.float64, device=tree.tokens.device)
        tree.readout = torch.cat([tree.tokens.sum().view(1).to(torch.float64), size, size * 0 + serial])
        record: list[Any] = [tree.readout.tolist(), None]  # a test's read: the values the device holds
        self.told.append(record)

        def on_read(values: list[float]) -> None:
            assert record[1] is None, "a readout handed on twice"
            record[1] = values

        tree.on_read = on_read
        return tree


def _check(policy: _Told) -> None:
    assert len(policy.told) > 3
    assert all(told == held for held, told in policy.told), policy.told


@pytest.mark.parametrize("verify", ["auto", "eager"])
def test_one_prompt(verify: str) -> None:
    """B = 1: the graphed step with the tree copied in (``engine.graphs.levels=eager``), and the eager device
    acceptance."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        inputs = target.encode_prompt(PROMPTS[1], cfg=True)
        policy = _Told()
        policy.graphs = GraphModes(levels="eager", verify=verify)
        res = generate(target, drafter, policy, inputs, GREEDY, None)
        assert res.tokens == decode_ar(target, inputs, GREEDY, None).tokens
        stepped = sum(s.launches for s in TS.steps_of(target))
        assert stepped == (len(policy.told) if verify == "auto" else 0)
    _check(policy)


@pytest.mark.parametrize("verify", ["auto", "eager"])
def test_a_batch(verify: str) -> None:
    """B = 2: the batched step (one replay, one read for both slots) and the eager batched verify."""
    with accel.simulate():
        target, drafter = tiny("tiny_llamagen", device="cuda")
        inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
        need = max(target.prompt_length(x) for x in inputs) + target.layout.num_gen_tokens + 33
        bt = BatchTarget(target, 2, True, need)
        bt.request_static(graphs=True)
        policy = _Told()
        policy.graphs = GraphModes(verify=verify)
        got: dict[int, list[int]] = {}
        items = [(i, x, accel.generator(bt.device, i)) for i, x in enumerate(inputs)]
        generate_batch(bt, drafter, policy, items, GREEDY, lambda k, r: got.__setitem__(k, r.tokens))
        assert [got[i] for i in range(3)] == [decode_ar(target, x, GREEDY, None).tokens for x in inputs]
        stepped = sum(s.launches for s in BS.batch_steps_of(bt))
        assert stepped == (bt.forwards if verify == "auto" else 0)
    _check(policy)
