"""Engine correctness on the tiny models: greedy identity, sampling distribution, KV commit."""

from collections import Counter
from itertools import product

import numpy as np
import pytest
import torch
from conftest import pooled_chisquare, synthetic_cost_model, tiny

from adtbench.algorithm.cost import TreeBudget
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.ar import ArPolicy
from adtbench.algorithm.policies.base import TreePolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.policies.static import MC_SIM_7B_63, ChainPolicy, StaticTreePolicy
from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, AcceptanceRule
from adtbench.sampling_params import SamplingParams

MODELS = ["tiny_llamagen", "tiny_chameleon"]
POLICIES = {
    "ar": lambda: ArPolicy(),
    "chain": lambda: ChainPolicy(3),
    "static": lambda: StaticTreePolicy(MC_SIM_7B_63),
    "eagle2": lambda: Eagle2Policy(depth=3, top_k=4, total_tokens=20),
    "eagle2-cost": lambda: with_cost(Eagle2Policy(depth=3, top_k=4, total_tokens=20, budget="cost")),
    "adt-cost": lambda: with_cost(ADTPolicy(D0=3, K0=4, K_max=6, N_max=19, budget="cost")),
    "eagle2-sampled": lambda: Eagle2Policy(depth=3, top_k=4, total_tokens=20, draft_sampling="sample"),
    "adt-cost-sampled": lambda: with_cost(
        ADTPolicy(D0=3, K0=4, K_max=6, N_max=19, budget="cost", draft_sampling="sample")
    ),
}


def with_cost(policy):
    """Bind a synthetic cost model (steep verify cost, so trees of every size occur) instead of measuring one."""
    policy.cost.tree = TreeBudget(synthetic_cost_model(), calibrate=True)
    return policy


def _skip_missing(name):
    if name == "tiny_chameleon":
        pytest.importorskip("adtbench.models.chameleon.target")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_greedy_equals_ar_for_every_policy(model, cfg_scale):
    _skip_missing(model)
    target, drafter = tiny(model)
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    for prompt in ["a red circle", "two blue squares on a striped floor"]:
        inputs = target.encode_prompt(prompt, cfg=sp.use_cfg)
        ar = decode_ar(target, inputs, sp, None)
        assert ar.tau == 1.0 and len(ar.tokens) == target.layout.num_gen_tokens
        for (name, make), where in product(POLICIES.items(), ("device", "host")):
            res = generate(target, drafter, make(), inputs, sp, None, acceptance=where)
            assert res.tokens == ar.tokens, f"{model} {name} cfg={cfg_scale} {where}"
            assert res.committed == len(ar.tokens) - 1  # the last token needs no forward


@pytest.mark.parametrize("rounds", ["auto", "planned"])
def test_where_acceptance_and_trees_run_does_not_change_the_trees(rounds):
    """``engine.acceptance`` moves acceptance and tree building between the host and the device, never the trees:
    greedy decodes of every tree policy draft the same trees, cycle by cycle, on both (budget: cost included, live or
    planned rounds)."""
    target, drafter = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = target.encode_prompt("two blue squares on a striped floor", cfg=True)
    for name, make in POLICIES.items():
        runs = []
        for where in ("device", "host"):
            policy = make()
            if getattr(policy, "cost", None) is not None and policy.cost.tree is not None:
                policy.cost.tree.rounds = rounds
            res = generate(target, drafter, policy, inputs, sp, None, acceptance=where)
            runs.append([(c.root_gen, c.nodes, c.drafted_depth, c.tree_depth, c.accepted, c.extra) for c in res.cycles])
        assert runs[0] == runs[1], f"{name} rounds={rounds}"


class OraclePolicy(TreePolicy):
    """Drafts the true AR continuation (depth 3) with a wrong sibling at every level: forces deep acceptance."""

    name = "oracle"

    def __init__(self, truth: list[int], wrong: int) -> None:
        self.truth, self.wrong = truth, wrong

    def max_nodes(self) -> int:
        return 7

    def propose(self, session, max_depth):
        g = session.root_gen
        tokens, parents, spine = [session.root_token], [-1], 0
        for d in range(1, min(3, max_depth) + 1):
            true_tok = self.truth[g + d]
            bad = self.wrong if self.wrong != true_tok else self.wrong + 1
            tokens += [bad, true_tok]
            parents += [spine, spine]
            spine = len(tokens) - 1
            session.expand(torch.tensor([0]), torch.tensor([true_tok]), 1)  # exercise the drafter's scratch slots
        return DraftTree(torch.tensor(tokens), parents, drafted_depth=min(3, max_depth))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_deep_acceptance_commits_match_ar(model, cfg_scale):
    _skip_missing(model)
    target, drafter = tiny(model)
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    inputs = target.encode_prompt("a small white boat", cfg=sp.use_cfg)
    ar = decode_ar(target, inputs, sp, None)
    res = generate(target, drafter, OraclePolicy(ar.tokens, target.layout.image_token_offset), inputs, sp, None)
    assert res.tokens == ar.tokens
    assert all(c.accepted == min(3, target.layout.num_gen_tokens - 2 - c.root_gen) for c in res.cycles)
    assert res.tau > 3.0


def _exact_joint(target, inputs, sp, k):
    """AR probability of every k-token prefix, by teacher-forced enumeration."""
    lay, dev = target.layout, target.device  # on the target's device (tests/test_gpu.py: CUDA, or the simulated one)
    codes = list(lay.image_ids)
    probs = {}
    for seq in product(codes, repeat=k):
        res = target.start(inputs, 1)
        lp = 0.0
        logits = process_logits(res.logits[:, None], torch.tensor([0], device=dev), lay, sp)[0].log_softmax(-1)
        for i, tok in enumerate(seq):
            lp += float(logits[tok])
            if i + 1 < k:
                first = torch.zeros(1, dtype=torch.long, device=dev)
                raw, _ = target.verify_forward(
                    torch.tensor([tok], device=dev), torch.ones(1, 1, dtype=torch.bool, device=dev), first
                )
                target.commit(first)
                logits = process_logits(raw, torch.tensor([i + 1], device=dev), lay, sp)[0].log_softmax(-1)
        probs[seq] = float(np.exp(lp))
    return probs


LAW_N = 400


def _law(policy, cfg_scale: float, where: str, rule: AcceptanceRule = EXACT, n: int = LAW_N) -> tuple[float, int]:
    """T = 1, top-k 3, a 4-code vocabulary: χ² p-value of the first 3 image tokens of ``n`` generations against AR's
    exact joint law, and the drafts accepted in all."""
    arch = {"arch.vocab_size": 4, "arch.block_size": 4, "vq.kind": "none"}
    target, drafter = tiny("tiny_llamagen", **arch)
    sp = SamplingParams(temperature=1.0, top_k=3, cfg_scale=cfg_scale)
    inputs = target.encode_prompt("a red circle", cfg=sp.use_cfg)
    g = torch.Generator().manual_seed(0)
    counts, accepted = Counter(), 0
    with target.reuse_prefill(inputs):  # the prompt's prefill run once (tests/test_prefill_reuse.py)
        expected = _exact_joint(target, inputs, sp, 3)
        for _ in range(n):
            res = generate(target, drafter, policy(), inputs, sp, g, rule, acceptance=where)
            counts[tuple(res.tokens[:3])] += 1
            accepted += sum(c.accepted for c in res.cycles)
    assert abs(sum(expected.values()) - 1) < 1e-9
    return pooled_chisquare(counts, expected, n)[0], accepted


@pytest.mark.parametrize(
    "policy,cfg_scale",
    [
        (lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9), 3.0),
        (lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1]], "sample"), 1.0),
        (lambda: with_cost(Eagle2Policy(depth=2, top_k=3, total_tokens=9, budget="cost")), 3.0),
        (lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9, draft_sampling="sample"), 3.0),
        (
            lambda: with_cost(ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8, budget="cost", draft_sampling="sample")),
            3.0,
        ),
    ],
    ids=["eagle2-pointmass-cfg", "static-trueq", "eagle2-cost-cfg", "eagle2-sampled-cfg", "adt-cost-sampled-cfg"],
)
@pytest.mark.parametrize("where", ["device", "host"])
def test_sampling_joint_distribution_matches_ar(policy, cfg_scale, where):
    """T = 1 with top-k: the joint law of the first 3 image tokens equals AR's (χ² over 27 outcomes, ``LAW_N``
    generations), with acceptance on the device (what a GPU runs) and as the host walk (the CPU default).

    Power (CI time: 400 generations, was 800): χ² at α = 1e-3 over ≈ 26 degrees of freedom detects a law at Cohen's
    w ≥ 0.34 from AR's with probability 0.9 (w ≥ 0.40: 0.99). The planted bug of the next test (w ≈ 0.38–0.77 here,
    from its χ²) is rejected at p ≤ 4e-8 by 400 generations of each of three policies on both paths (at 200: once
    only at p = 4e-3)."""
    pvalue, accepted = _law(policy, cfg_scale, where)
    assert accepted > LAW_N // 2  # drafts were accepted often enough to test the rejection path
    assert pvalue > 1e-3


class ResidualIgnored(AcceptanceRule):
    """A planted bug: a rejected draft's residual is the target's p itself (the draft is not taken out of it, and
    ``max(p − q, 0)`` is not formed), so rejected drafts come back too often."""

    def point_mass_rows(self, p, x):
        return p.gather(1, x[:, None])[:, 0], p

    def proposal_rows(self, p, x, q, px, qx):
        return (px / qx).clamp_max(1.0).nan_to_num(1.0), p


@pytest.mark.parametrize(
    "policy,where",
    [
        (lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9), "device"),
        (lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9, draft_sampling="sample"), "host"),
    ],
    ids=["pointmass-device", "sampled-host"],
)
def test_the_law_test_rejects_a_planted_bug(policy, where):
    """Negative control of the law test above, at its ``LAW_N``: the same χ² rejects engine output whose rejection
    step ignores the residual (point-mass drafts on the device's rank loop, sampled drafts on the host walk)."""
    pvalue, accepted = _law(policy, 3.0, where, ResidualIgnored())
    assert accepted > LAW_N // 2 and pvalue < 1e-3, pvalue


def _sequential_cache(target, inputs, tokens):
    target.start(inputs, 1)
    for t in tokens:
        target.verify_forward(torch.tensor([t]), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long))
        target.commit(torch.zeros(1, dtype=torch.long))
    L = target.length
    return [k[:, :, :L].clone() for k in target.cache.k], [v[:, :, :L].clone() for v in target.cache.v]


def test_kv_commit_equals_sequential_and_causal_mask_fails():
    target, _ = tiny("tiny_llamagen")
    inputs = target.encode_prompt("a red circle", cfg=True)
    # root 5 with two branches: 5 → 7 → 9 and 5 → 8 → 10 → 11
    tree = DraftTree(torch.tensor([5, 7, 8, 9, 10, 11]), [-1, 0, 0, 1, 2, 4], drafted_depth=3)
    target.start(inputs, 8)
    raw_tree, _ = target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    target.commit(torch.tensor([0, 2, 4, 5]))
    k_seq, v_seq = _sequential_cache(tiny("tiny_llamagen")[0].__class__ and target, inputs, [5, 8, 10, 11])
    # recompute the committed cache with a fresh tree pass, then compare to sequential
    target.start(inputs, 8)
    target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    target.commit(torch.tensor([0, 2, 4, 5]))
    L = target.length
    for a, b in zip(target.cache.k + target.cache.v, k_seq + v_seq):
        assert torch.allclose(a[:, :, :L], b, atol=1e-10)
    # node logits equal the sequential logits along each node's path
    for node, path in [(3, [5, 7, 9]), (5, [5, 8, 10, 11])]:
        _sequential_cache(target, inputs, path[:-1])
        raw, _ = target.verify_forward(
            torch.tensor([path[-1]]), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
        )
        assert torch.allclose(raw_tree[:, node], raw[:, 0], atol=1e-10)
    # negative control: a plain causal mask over the tree block mixes branches
    target.start(inputs, 8)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    raw_causal, _ = target.verify_forward(tree.tokens, causal, tree.depth)
    assert (raw_causal[:, 5] - raw_tree[:, 5]).abs().max() > 1e-3


def test_wide_deep_eagle2_fits_drafter_cache():
    """K·depth expanded drafter slots can exceed total_tokens: the drafter cache must hold them."""
    target, drafter = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    res = generate(target, drafter, Eagle2Policy(depth=7, top_k=16, total_tokens=20), inputs, sp, None)
    assert res.tokens == decode_ar(target, inputs, sp, None).tokens
