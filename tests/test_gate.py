"""Draft gating (``algorithm.gate``): decisions, configuration, lossless decoding with AR steps between cycles."""

from collections import Counter

import pytest
import torch
from conftest import pooled_chisquare, tiny
from omegaconf import OmegaConf
from test_engine import _exact_joint

from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.gate import PRIOR_WEIGHT, DraftGate
from adtbench.algorithm.policies.base import POLICIES
from adtbench.algorithm.policies.static import StaticTreePolicy
from adtbench.errors import ConfigError
from adtbench.sampling_params import SamplingParams


def test_gate_drafts_until_a_bin_shows_it_does_not_pay_and_still_explores():
    gate = DraftGate(2.0, explore=3)
    assert gate.draft(None) and gate.draft(0)  # unknown bin, optimistic prior (3 tokens at weight 2)
    for _ in range(4):
        gate.observe(0, 1)  # four drafted cycles that committed the bonus alone
    assert gate.committed[0] / gate.cycles[0] == pytest.approx((3 * PRIOR_WEIGHT + 4) / (PRIOR_WEIGHT + 4))
    decisions = [gate.draft(0) for _ in range(6)]
    assert decisions == [False, False, True, False, False, True]  # every 3rd gated cycle explores
    assert gate.skips == 4
    assert gate.draft(1)  # other bins keep their own estimate
    gate.observe(None, 1)  # a cycle without a bin teaches nothing
    gate.reset()
    assert gate.draft(0) and gate.skips == 0


def test_gate_bins_by_the_entropy_of_the_roots_distribution():
    point = torch.full((8,), float("-inf"))
    point[3] = 0.0
    assert DraftGate.bin_of(point) == 0  # H = 0
    assert DraftGate.bin_of(torch.zeros(512)) == 5  # H = log 512 = 6.2 nats > 4


@pytest.mark.parametrize(
    "over,key",
    [({"gate_tokens": 1.0}, "policy.gate_tokens"), ({"gate_tokens": 2.0, "gate_explore": 0}, "policy.gate_explore")],
)
@pytest.mark.parametrize("name", ["static", "chain", "eagle2", "adt"])
def test_gate_config_errors_name_the_key(name, over, key):
    node = OmegaConf.create({**_node(name), **over})
    with pytest.raises(ConfigError, match=key):
        POLICIES.build(name, node)


@pytest.mark.parametrize("name", ["static", "chain", "eagle2", "adt"])
def test_every_tree_policy_builds_its_gate(name):
    assert POLICIES.build(name, OmegaConf.create(_node(name))).gate is None
    policy = POLICIES.build(name, OmegaConf.create({**_node(name), "gate_tokens": 2.5, "gate_explore": 4}))
    assert policy.gate is not None and (policy.gate.min_tokens, policy.gate.explore) == (2.5, 4)


def _node(name):
    from adtbench.harness.schema import POLICY_SCHEMAS

    return OmegaConf.to_container(OmegaConf.structured(POLICY_SCHEMAS[name]))


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_gated_greedy_equals_ar(cfg_scale):
    """Gated cycles are AR steps and the drafter catches up in one extend: tokens stay AR's."""
    target, drafter = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    for prompt in ["a red circle", "two blue squares on a striped floor"]:
        inputs = target.encode_prompt(prompt, cfg=sp.use_cfg)
        ar = decode_ar(target, inputs, sp, None)
        policy = StaticTreePolicy([[0], [1], [0, 0]])
        policy.gate = DraftGate(2.5, explore=2)
        res = generate(target, drafter, policy, inputs, sp, None)
        assert res.tokens == ar.tokens
        assert res.stats["gated_steps"] > 0  # the random drafter rarely pays: the gate did skip
        assert sum(c.nodes == 1 for c in res.cycles) >= res.stats["gated_steps"]


class AlternatingGate(DraftGate):
    """Drafts every other cycle (a rule of the past only), so AR steps and lazy extends occur in every image."""

    def reset(self) -> None:
        super().reset()
        self.calls = 0

    def draft(self, b):
        self.calls += 1
        return self.calls % 2 == 1


@pytest.mark.slow
def test_gated_sampling_joint_distribution_matches_ar():
    """T = 1, sampled drafts, CFG: with AR steps between drafted cycles the first 3 tokens keep AR's law (χ²)."""
    arch = {"arch.vocab_size": 4, "arch.block_size": 4, "vq.kind": "none"}
    target, drafter = tiny("tiny_llamagen", **arch)
    sp = SamplingParams(temperature=1.0, top_k=3, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=sp.use_cfg)
    expected = _exact_joint(target, inputs, sp, 3)
    g = torch.Generator().manual_seed(0)
    n = 800
    counts, skipped = Counter(), 0
    with target.reuse_prefill(inputs):  # the prompt's prefill run once (tests/test_prefill_reuse.py)
        for _ in range(n):
            policy = StaticTreePolicy([[0], [0, 0]], "sample")
            policy.gate = AlternatingGate(2.0)
            res = generate(target, drafter, policy, inputs, sp, g)
            counts[tuple(res.tokens[:3])] += 1
            skipped += sum(c.nodes == 1 for c in res.cycles[:-1])
    assert skipped > n // 4  # AR steps happened inside the first tokens
    assert pooled_chisquare(counts, expected, n)[0] > 1e-3


def test_lazy_extend_equals_step_by_step():
    """The drafter fed several committed slots in one ``extend`` gives the outputs of feeding them one by one."""
    _, drafter = tiny("tiny_llamagen")
    R, H = 2, drafter.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(R, 5, H, generator=gen, dtype=torch.float64)
    embeds = torch.randn(R, 5, H, generator=gen, dtype=torch.float64)
    pos = torch.arange(5)[None].expand(R, 5)
    drafter.reset(R, 16)
    one_by_one = [drafter.extend(feats[:, i : i + 1], embeds[:, i : i + 1], pos[:, i : i + 1]) for i in range(5)]
    drafter.reset(R, 16)
    drafter.extend(feats[:, :2], embeds[:, :2], pos[:, :2])
    batched = drafter.extend(feats[:, 2:], embeds[:, 2:], pos[:, 2:])
    torch.testing.assert_close(batched, one_by_one[-1], rtol=0, atol=1e-12)
