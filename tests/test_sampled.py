"""Sampled dynamic trees (``policies.sampled``): shape rules, the acceptance model, config errors.

Losslessness is tested on the engine (χ² of the joint law, ``test_engine.py``) and greedy identity there too."""

import numpy as np
import pytest
import torch
from conftest import synthetic_cost_model, tiny

from adtbench.algorithm.cost import TreeBudget
from adtbench.algorithm.drafters.session import DraftSession, drive
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.policies.sampled import AcceptanceModel, sampled_steps
from adtbench.algorithm.records import Acceptance
from adtbench.algorithm.sampling import gumbel_top_k
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import ConfigError
from adtbench.sampling_params import SamplingParams


def build_sampled_tree(session, *args, **kwargs):
    """The sampled tree for one session (``sampled_steps`` driven by ``drive``)."""
    return drive(sampled_steps(session, *args, **kwargs), session)


def _session(gen_seed: int = 0, prefill_seed: int | None = None):
    target, drafter = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    from adtbench.algorithm.engine import prefill

    first = None if prefill_seed is None else torch.Generator().manual_seed(prefill_seed)
    root, _, out = prefill(target, drafter, inputs, sp, 64, 64, first)
    g = torch.Generator().manual_seed(gen_seed)
    return DraftSession(drafter, target, sp, root, 0, target.next_pos.clone(), out, g)


@pytest.mark.parametrize("budget", [None, "cost"])
def test_tree_shape_invariants(budget):
    """≤ max_nodes nodes; siblings distinct; each parent's children carry the proposal they were drawn from; the
    drafted depth counts the drafter levels; reach estimates fall along every path."""
    b = TreeBudget(synthetic_cost_model()) if budget else None
    for seed in range(5):
        s = _session(seed)
        out = build_sampled_tree(s, depth=3, top_k=3, max_nodes=10, max_depth=8, budget=b, model=AcceptanceModel())
        t = out.tree
        assert 1 <= t.size <= 10 and t.proposal is not None
        for u, kids in enumerate(t.children):
            toks = [int(t.tokens[c]) for c in kids]
            assert len(set(toks)) == len(toks) <= 3
            if kids:
                assert u in out.entropy and float(t.proposal[u].sum()) == pytest.approx(1.0)
                assert all(float(t.proposal[u][x]) > 0 for x in toks)
        assert t.max_depth <= t.drafted_depth <= 4


@pytest.mark.parametrize("budget", [None, "cost"])
def test_host_and_device_sampled_trees_are_the_same(budget):
    """Built on host copies (``session.on_host``: the CPU's default) or on the drafter's device (what a GPU runs), a
    sampled tree draws the same tokens from the same generator calls: the same tree, proposal rows and entropies,
    level after level of a real drafter."""
    for seed in range(4):
        outs = []
        for on_host in (False, True):
            s = _session(seed, prefill_seed=seed)
            s.on_host = on_host
            b = TreeBudget(synthetic_cost_model()) if budget else None
            outs.append(build_sampled_tree(s, depth=3, top_k=3, max_nodes=12, max_depth=8, budget=b,
                                           model=AcceptanceModel()))  # fmt: skip
            outs[-1].gen_state = s.generator.get_state()
        dev, host = outs
        assert dev.tree.tokens.tolist() == host.tree.tokens.tolist() and dev.tree.parent_list == host.tree.parent_list
        assert dev.tree.drafted_depth == host.tree.drafted_depth and dev.tree.info == host.tree.info
        assert torch.equal(dev.tree.proposal, host.tree.proposal)
        assert dev.entropy.keys() == host.entropy.keys()
        assert all(dev.entropy[u] == pytest.approx(host.entropy[u], rel=1e-12) for u in dev.entropy)
        assert torch.equal(dev.gen_state, host.gen_state)  # the same draws consumed


@pytest.mark.parametrize("on_host", [False, True], ids=["device", "host"])
def test_a_budget_that_drafts_nothing_gives_the_root_alone(on_host):
    """When not even one draft pays for itself (verifying a second node costs 1000 steps) the tree is the root alone,
    without a proposal, and the engine verifies it as an AR step."""
    from adtbench.algorithm.cost import CostModel

    s = _session(0, prefill_seed=0)
    s.on_host = on_host
    b = TreeBudget(CostModel([1, 2, 64], [1.0, 1000.0, 1000.0], [1, 16], [0.01, 0.01], 0.0))
    out = build_sampled_tree(s, depth=3, top_k=3, max_nodes=12, max_depth=8, budget=b, model=AcceptanceModel())
    assert out.tree.size == 1 and out.tree.proposal is None and out.tree.drafted_depth == 0 and not out.entropy
    from adtbench.algorithm.engine import generate

    policy = ADTPolicy(budget="cost", draft_sampling="sample")
    policy.cost.tree = b
    target, drafter = s.target, s.drafter
    res = generate(target, drafter, policy, target.encode_prompt("a", cfg=True), s.sp, torch.Generator().manual_seed(0),
                   acceptance="host" if on_host else "device")  # fmt: skip
    assert res.tau == 1.0 and len(res.tokens) == target.layout.num_gen_tokens


def test_max_depth_caps_the_levels():
    out = build_sampled_tree(_session(), depth=5, top_k=2, max_nodes=40, max_depth=2, budget=None,
                             model=AcceptanceModel())  # fmt: skip
    assert out.tree.max_depth <= 2


def test_acceptance_model_counts_tries():
    """Path 0 → 2 (the second child of the root accepted: 2 tries, 1 success); node 2's two children both failed."""
    tree = DraftTree(torch.tensor([9, 1, 2, 3, 4]), [-1, 0, 0, 2, 2], drafted_depth=2)
    m = AcceptanceModel(prior=0.5, weight=2.0)
    m.observe(tree, Acceptance(path=[0, 2], bonus=5), {0: 0.1, 2: 3.5})
    low, high = m.bins(np.array([0.1, 3.5]))
    assert (m.tries[low], m.successes[low]) == (2, 1) and (m.tries[high], m.successes[high]) == (2, 0)
    assert m.alpha(np.array([0.1]))[0] == pytest.approx((1 + 1.0) / (2 + 2.0))
    m.reset()
    assert m.tries.sum() == 0


def test_gumbel_top_k_draws_are_sequential_draws_without_replacement():
    """First draw ~ q; second draw ~ q without the first (χ² on the pair law of a 4-token q)."""
    from collections import Counter

    from scipy.stats import chisquare

    q = np.array([0.1, 0.2, 0.3, 0.4])
    g = torch.Generator().manual_seed(0)
    n = 4000
    lq = torch.from_numpy(np.log(q))[None]
    pairs = Counter(tuple(gumbel_top_k(lq, 2, g)[0][0].tolist()) for _ in range(n))
    keys = [(a, b) for a in range(4) for b in range(4) if a != b]
    exp = [n * q[a] * q[b] / (1 - q[a]) for a, b in keys]
    assert chisquare([pairs.get(k, 0) for k in keys], exp).pvalue > 1e-3


@pytest.mark.parametrize("make", [lambda v: Eagle2Policy(draft_sampling=v), lambda v: ADTPolicy(draft_sampling=v)])
def test_bad_draft_sampling_names_the_key(make):
    with pytest.raises(ConfigError, match=r"policy\.draft_sampling"):
        make("gumbel")
