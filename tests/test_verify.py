"""Recursive rejection is lossless: χ² tests against the target distribution (fixed seeds)."""

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from adtbench.algorithm.sampling import gumbel_top_k
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import AcceptanceRule, verify_greedy, verify_sampling

P_ROOT = torch.tensor([0.35, 0.05, 0.25, 0.1, 0.15, 0.1], dtype=torch.float64)


def chi2_pvalue(counts: Counter, probs: dict, n: int) -> float:
    keys = sorted(probs)
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([probs[k] * n for k in keys])
    assert sum(counts.values()) == n and set(counts) <= set(keys)
    return float(chisquare(obs, exp).pvalue)


def one_level(tokens: list[int]) -> DraftTree:
    return DraftTree(torch.tensor([9, *tokens]), [-1] + [0] * len(tokens), drafted_depth=1)


def first_token(tree: DraftTree, acc) -> int:
    return int(tree.tokens[acc.path[1]]) if acc.accepted else acc.bonus


def test_single_node_point_mass_with_duplicate_siblings():
    tree = one_level([2, 0, 2, 5])  # duplicate sibling must be skipped
    logits = P_ROOT.log()[None].expand(5, -1)
    g = torch.Generator().manual_seed(0)
    n = 8_000
    counts = Counter(first_token(tree, verify_sampling(tree, logits, g)) for _ in range(n))
    assert chi2_pvalue(counts, dict(enumerate(P_ROOT.tolist())), n) > 1e-3


def test_single_node_broken_rule_is_detected():
    """Negative control: accepting the first draft with probability 1 must fail the same test."""

    class AlwaysAccept(AcceptanceRule):
        def point_mass(self, p, x):
            return 1.0, p

    tree = one_level([2, 0])
    logits = P_ROOT.log()[None].expand(3, -1)
    g = torch.Generator().manual_seed(0)
    n = 3_000
    counts = Counter(first_token(tree, verify_sampling(tree, logits, g, AlwaysAccept())) for _ in range(n))
    assert chi2_pvalue(counts, dict(enumerate(P_ROOT.tolist())), n) < 1e-6


def test_two_level_joint_distribution():
    # root → children {0, 2}; node(0) → children {1, 3}; node(2) is a leaf
    tree = DraftTree(torch.tensor([9, 0, 2, 1, 3]), [-1, 0, 0, 1, 1], drafted_depth=2)
    p0 = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.1, 0.05], dtype=torch.float64)
    p2 = torch.tensor([0.2, 0.2, 0.2, 0.1, 0.2, 0.1], dtype=torch.float64)
    logits = torch.stack([P_ROOT, p0, p2, P_ROOT, P_ROOT]).log()
    expected = {}
    for x1 in range(6):
        if x1 == 0:
            expected |= {(0, x2): float(P_ROOT[0] * p0[x2]) for x2 in range(6)}
        elif x1 == 2:
            expected |= {(2, x2): float(P_ROOT[2] * p2[x2]) for x2 in range(6)}
        else:
            expected[(x1, -1)] = float(P_ROOT[x1])
    g = torch.Generator().manual_seed(1)
    n = 12_000
    counts: Counter = Counter()
    for _ in range(n):
        acc = verify_sampling(tree, logits, g)
        toks = [int(tree.tokens[j]) for j in acc.path[1:]] + [acc.bonus]
        counts[(toks[0], toks[1] if len(toks) > 1 else -1)] += 1
    assert chi2_pvalue(counts, expected, n) > 1e-3


def test_sampled_without_replacement_uses_true_q():
    q = torch.tensor([0.05, 0.4, 0.3, 0.1, 0.05, 0.1], dtype=torch.float64)
    logits = P_ROOT.log()[None].expand(4, -1)
    g = torch.Generator().manual_seed(2)
    n = 8_000
    counts: Counter = Counter()
    for _ in range(n):
        drawn, _ = gumbel_top_k(q.log()[None], 3, g)
        tree = DraftTree(torch.tensor([9, *drawn[0].tolist()]), [-1, 0, 0, 0], drafted_depth=1, proposal={0: q})
        counts[first_token(tree, verify_sampling(tree, logits, g))] += 1
    assert chi2_pvalue(counts, dict(enumerate(P_ROOT.tolist())), n) > 1e-3


def test_greedy_deepest_path_and_bonus():
    tree = DraftTree(torch.tensor([9, 1, 2, 3, 4]), [-1, 0, 0, 2, 3], drafted_depth=3)
    logits = torch.full((5, 6), -5.0)
    logits[0, 2] = 1  # root argmax 2 → node 2
    logits[2, 3] = 1  # node 2 argmax 3 → node 3
    logits[3, 0] = 1  # node 3 argmax 0 ≠ 4 → stop; bonus 0
    acc = verify_greedy(tree, logits)
    assert acc.path == [0, 2, 3] and acc.bonus == 0 and acc.accepted == 2


class _GenericExact(AcceptanceRule):
    """The exact rule through the generic tensor loop (overriding ``point_mass`` turns the host fast path off)."""

    def point_mass(self, p: torch.Tensor, x: int) -> tuple[float, torch.Tensor]:
        return super().point_mass(p, x)


def test_exact_fast_path_decides_like_the_generic_loop():
    """Same uniforms, same decisions: the float64 host path of exact point-mass rejection and the tensor loop
    give the same accepted path and bonus on a tree with duplicate siblings and three levels (float64 logits)."""
    gen = torch.Generator().manual_seed(0)
    tree = DraftTree(torch.tensor([9, 0, 2, 0, 1, 3, 1, 2]), [-1, 0, 0, 0, 1, 1, 4, 4], drafted_depth=3)
    logits = (torch.randn(8, 6, generator=gen, dtype=torch.float64) * 1.5).log_softmax(-1)
    assert_same_decisions(tree, logits, _GenericExact())


def assert_same_decisions(tree: DraftTree, logits: torch.Tensor, generic: AcceptanceRule) -> None:
    """The exact host path and ``generic`` (the same law through the tensor loop) take the same accepted path and
    bonus from the same uniforms, over 300 seeds that see both acceptance and rejection."""
    same = 0
    for seed in range(300):
        fast = verify_sampling(tree, logits, torch.Generator().manual_seed(seed))
        slow = verify_sampling(tree, logits, torch.Generator().manual_seed(seed), generic)
        assert (fast.path, fast.bonus) == (slow.path, slow.bonus), seed
        same += len(fast.path) > 1
    assert 0 < same < 300


class _GenericProposal(AcceptanceRule):
    """The exact rule through the generic tensor loop for drafts with a proposal q."""

    def with_proposal(self, p: torch.Tensor, x: int, q: torch.Tensor) -> tuple[float, torch.Tensor]:
        return super().with_proposal(p, x, q)


def test_exact_proposal_fast_path_decides_like_the_generic_loop():
    """Sampled trees (drafts drawn from q without replacement): the float64 host path and the tensor loop take the
    same decisions from the same uniforms on a three-level tree with a proposal at every inner node."""
    gen = torch.Generator().manual_seed(1)
    tree_tokens = torch.tensor([9, 0, 2, 4, 1, 3, 1, 2])
    parents = [-1, 0, 0, 0, 1, 1, 4, 4]
    q = {u: torch.randn(6, generator=gen, dtype=torch.float64).softmax(-1) for u in (0, 1, 4)}
    tree = DraftTree(tree_tokens, parents, drafted_depth=3, proposal=q)
    logits = (torch.randn(8, 6, generator=gen, dtype=torch.float64) * 1.5).log_softmax(-1)
    # overriding ``with_proposal`` without declaring ``host_proposal`` keeps a rule off the host path
    assert _GenericProposal().host_proposal() is None and AcceptanceRule().host_proposal() is not None
    assert_same_decisions(tree, logits, _GenericProposal())


def test_sample_is_the_categorical_law_and_skips_zeros():
    """``sampling.sample`` (inverse CDF): χ² against p, never a zero-probability token, unnormalised input allowed."""
    from adtbench.algorithm.sampling import sample

    p = torch.tensor([0.0, 0.3, 0.0, 0.5, 0.2, 0.0], dtype=torch.float64) * 8.0
    g = torch.Generator().manual_seed(3)
    n = 6_000
    counts = Counter(sample(p, g) for _ in range(n))
    assert set(counts) <= {1, 3, 4}
    assert chi2_pvalue(counts, {k: float(v) / 8.0 for k, v in enumerate(p.tolist()) if v > 0}, n) > 1e-3
    assert sample(torch.tensor([0.0, 0.0, 1.0]), g) == 2


def _outcomes(tree: DraftTree, logits: torch.Tensor, where: str, rule: AcceptanceRule, n: int, greedy: bool = False):
    from adtbench.algorithm.verify import verify_cycle

    g = torch.Generator().manual_seed(7 if where == "device" else 11)
    return Counter(
        (tuple(r.acceptance.path), r.acceptance.bonus)
        for r in (verify_cycle(tree, logits, greedy, g, rule, where=where) for _ in range(n))
    )


def _lantern_rule(V: int):
    from adtbench.algorithm.methods.lantern import LanternRule

    table = torch.stack([torch.roll(torch.arange(V), -i)[1:4] for i in range(V)])  # neighbours: the next codes
    return LanternRule(table, 0, delta=0.3)


@pytest.mark.parametrize("kind", ["point_mass", "proposal", "lantern_point_mass", "lantern_proposal"])
def test_device_acceptance_has_the_host_walks_law(kind: str) -> None:
    """The device path (closed form for exact point mass, the rank loop otherwise) and the float64 host walk give
    the same joint law of (accepted path, bonus): a two-sample χ² over 4 000 verifications each, on a three-level tree
    with a duplicate sibling, a dead node and (``proposal``) q at every inner node."""
    from scipy.stats import chi2_contingency

    gen = torch.Generator().manual_seed(3)
    V = 6
    tokens = torch.tensor([9, 0, 2, 0, 1, 3, 4, 2])
    parents = [-1, 0, 0, 0, 1, 1, 4, 4]
    proposal = None
    if "proposal" in kind:
        tokens = torch.tensor([9, 0, 2, 4, 1, 3, 1, 2])
        proposal = {u: torch.randn(V, generator=gen, dtype=torch.float64).softmax(-1) for u in (0, 1, 4)}
    alive = torch.tensor([True] * 7 + [False])
    tree = DraftTree(tokens, parents, drafted_depth=3, proposal=proposal, alive=alive)
    logits = (torch.randn(8, V, generator=gen, dtype=torch.float64) * 1.5).log_softmax(-1)
    if proposal is not None:  # first drafts likely under q, less so under p: every child rank is tried often
        f64 = torch.float64
        q_of = {
            0: [0.45, 0.05, 0.2, 0.05, 0.2, 0.05],
            1: [0.1, 0.5, 0.1, 0.2, 0.05, 0.05],
            4: [0.1, 0.6, 0.2, 0.05, 0.03, 0.02],
        }
        p_of = {
            0: [0.1, 0.15, 0.3, 0.1, 0.25, 0.1],
            1: [0.3, 0.2, 0.1, 0.25, 0.1, 0.05],
            4: [0.25, 0.2, 0.3, 0.1, 0.1, 0.05],
        }
        proposal = {u: torch.tensor(q, dtype=f64) for u, q in q_of.items()}
        tree = DraftTree(tokens, parents, drafted_depth=3, proposal=proposal, alive=alive)
        for u, p in p_of.items():
            logits[u] = torch.tensor(p, dtype=f64).log()
    rule = _lantern_rule(V) if kind.startswith("lantern") else AcceptanceRule()
    n = 4000
    dev, host = _outcomes(tree, logits, "device", rule, n), _outcomes(tree, logits, "host", rule, n)
    keys = sorted(set(dev) | set(host))
    table = np.array([[dev.get(k, 0) for k in keys], [host.get(k, 0) for k in keys]])
    table = table[:, table.sum(0) >= 10]  # cells too rare for χ² are dropped (both rows alike)
    assert all(tree.tokens[p[-1]] != tokens[7] or p[-1] != 7 for p, _ in dev)  # the dead node is never accepted
    assert chi2_contingency(table)[1] > 1e-3 and table.shape[1] >= 6


def test_device_greedy_acceptance_is_the_host_walks() -> None:
    gen = torch.Generator().manual_seed(5)
    tree = DraftTree(torch.tensor([9, 0, 2, 0, 1, 3, 4, 2]), [-1, 0, 0, 0, 1, 1, 4, 4], drafted_depth=3)
    for _ in range(20):
        logits = (torch.randn(8, 6, generator=gen, dtype=torch.float64) * 3).log_softmax(-1)
        for rule in (AcceptanceRule(), _lantern_rule(6)):
            assert _outcomes(tree, logits, "device", rule, 1, True) == _outcomes(tree, logits, "host", rule, 1, True)


def _chain_tree(n: int, V: int, g: torch.Generator, declared: bool) -> DraftTree:
    """A chain of n nodes whose drafts are drawn from their stored proposal rows (the last row 0: the leaf's)."""
    q = torch.rand(n, V, generator=g, dtype=torch.float64) ** 4
    q = q / q.sum(-1, keepdim=True)
    q[-1] = 0
    tokens = torch.cat([torch.randint(0, V, (1,), generator=g), torch.multinomial(q[:-1], 1, generator=g)[:, 0]])
    return DraftTree(
        tokens,
        torch.arange(n) - 1,
        n - 1,
        1,
        q,
        depth=torch.arange(n),
        ancestor_mask=torch.ones(n, n, dtype=torch.bool).tril(),
        max_children=1 if declared else None,
    )


@pytest.mark.parametrize("rule_name", ["exact", "lantern", "gsd"])
def test_chain_fast_path_decides_like_the_general_path(rule_name: str) -> None:
    """``accept_chain`` (a declared chain: Jacobi windows, chain policies) takes the decisions of the general device
    path (``_by_rank`` / the greedy ``_finish``) from the same draws, seed for seed, for every rule; and
    ``read_chain`` reads what ``read_verdict`` reads."""
    from adtbench.algorithm.methods.gsd import GroupedRule
    from adtbench.algorithm.methods.lantern import LanternRule
    from adtbench.algorithm.verify import accept, read_chain, read_verdict

    V = 9
    g = torch.Generator().manual_seed(7)
    rule = {
        "exact": AcceptanceRule(),
        "lantern": LanternRule(torch.randint(0, V, (V, 3), generator=g), 0, delta=0.3),
        "gsd": GroupedRule(torch.randn(V, 2, generator=g, dtype=torch.float64), 0, 7, 0.3, 2.0),
    }[rule_name]
    decided = Counter()
    for trial in range(200):
        n = int(torch.randint(2, 14, (1,), generator=g))
        fast = _chain_tree(n, V, g, True)
        general = DraftTree(
            fast.tokens, fast.parents, n - 1, 1, fast.proposal, depth=fast.depth, ancestor_mask=fast.ancestor_mask
        )
        assert fast.is_chain and not general.is_chain
        logits = torch.randn(n, V, generator=g, dtype=torch.float64) * 2
        logits[torch.arange(n - 1), fast.tokens[1:]] += 2.0 * (trial % 3)  # long accepted runs too
        for greedy in (False, True):
            seed = 1000 + trial
            a = accept(fast, logits, greedy, torch.Generator().manual_seed(seed), rule)
            b = accept(general, logits, greedy, torch.Generator().manual_seed(seed), rule)
            assert torch.equal(a.on_path, b.on_path) and int(a.last) == int(b.last), (trial, greedy)
            assert int(a.bonus) == int(b.bonus) and torch.equal(a.bonus_logits, b.bonus_logits), (trial, greedy)
            ra, rb = read_chain(fast, a), read_verdict(general, b)
            assert (ra.acceptance, ra.root, ra.tokens) == (rb.acceptance, rb.root, rb.tokens)
            assert torch.equal(ra.keep, rb.keep) and torch.equal(ra.next_tokens, rb.next_tokens)
            decided[int(a.last) == n - 1] += 1
    assert decided[True] > 20 and decided[False] > 20  # full accepts and rejections both exercised
