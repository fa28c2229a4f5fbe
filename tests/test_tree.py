"""EAGLE-2 tree builder: the worked example of algorithms.md §2.4 exactly, ties, and invariants."""

import itertools

import numpy as np
import pytest
import torch
from conftest import FakeSession
from hypothesis import given, settings
from hypothesis import strategies as st

from adtbench.algorithm.drafters.session import drive
from adtbench.algorithm.policies.eagle2 import Eagle2Policy, eagle2_steps
from adtbench.algorithm.policies.static import MC_SIM_7B_63, ChainPolicy, StaticTreePolicy, validate_paths
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import ConfigError


def build_eagle2_tree(session, *args, **kwargs):
    """EAGLE-2's tree for one session (``eagle2_steps`` driven by ``drive``)."""
    return drive(eagle2_steps(session, *args, **kwargs), session)


def dist(vocab: int, known: dict[int, float]) -> torch.Tensor:
    rest = [t for t in range(vocab) if t not in known]
    p = torch.full((vocab,), (1.0 - sum(known.values())) / len(rest), dtype=torch.float64)
    for t, v in known.items():
        p[t] = v
    return p


def worked_example_session() -> FakeSession:
    V = 5
    return FakeSession(
        {
            (): dist(V, {0: 0.6, 1: 0.3}),
            (0,): dist(V, {1: 0.7, 2: 0.15}),
            (1,): dist(V, {0: 0.5, 1: 0.25}),
            (0, 1): dist(V, {0: 0.9, 1: 0.05}),
            (1, 0): dist(V, {1: 0.6, 0: 0.2}),
        },
        V,
    )


def test_eagle2_worked_example_exactly():
    s = worked_example_session()
    tree = build_eagle2_tree(s, depth=2, top_k=2, total_tokens=5, max_depth=10)
    assert tree.tokens.tolist() == [99, 0, 1, 1, 0]
    assert tree.parent_list[1:] == [0, 0, 1, 3]  # mask_index
    assert tree.depth.tolist() == [0, 1, 1, 2, 3]
    assert tree.drafted_depth == 3
    rows = ["".join(str(int(b)) for b in r) for r in tree.ancestor_mask]
    assert rows == ["10000", "11000", "10100", "11010", "11011"]
    assert tree.retrieve_indices().tolist() == [[0, 2, -1, -1], [0, 1, 3, 4]]
    assert tree.retrieve_indices(sampling_order=True).tolist() == [[0, 1, 3, 4], [0, 2, -1, -1]]
    # the drafter ran two expansion rounds over the K=2 frontiers: (0),(1) then (0,1),(1,0)
    assert [[s.paths[i] for i in ids] for ids in s.expansions] == [[(0,), (1,)], [(0, 1), (1, 0)]]


def test_eagle2_depth_cap_limits_rounds():
    tree = build_eagle2_tree(worked_example_session(), depth=2, top_k=2, total_tokens=5, max_depth=1)
    assert tree.max_depth == 1 and tree.drafted_depth == 1 and tree.size == 3


def test_eagle2_ties_keep_parents():
    # every child has probability 1 → children tie with their parents (log-prob 0); stable order keeps parents
    V = 4
    one = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    s = FakeSession({(): torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)}, V)
    s.dists.update({p: one for p in [(0,), (1,), (0, 1), (1, 1), (0, 1, 1), (1, 1, 1)]})
    for n in range(2, 8):
        tree = build_eagle2_tree(s, depth=3, top_k=2, total_tokens=n, max_depth=10)
        for j in range(1, tree.size):
            assert tree.parent_list[j] < j
        # zero-probability drafts are never kept
        assert 2 not in tree.tokens[1:].tolist()


def test_eagle2_config_errors():
    with pytest.raises(ConfigError, match=r"policy\.total_tokens"):
        Eagle2Policy(depth=1, top_k=2, total_tokens=8)  # 7 > 2 + 1·4 = 6
    with pytest.raises(ConfigError, match=r"policy\.depth"):
        Eagle2Policy(depth=0)
    with pytest.raises(ConfigError, match=r"policy\.top_k"):
        Eagle2Policy(top_k=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 4), st.integers(2, 40))
def test_eagle2_tree_invariants(seed, depth, top_k, total):
    g = torch.Generator().manual_seed(seed)
    V = 6

    class RandomSession(FakeSession):
        def _lp(self, path):
            gg = torch.Generator().manual_seed(hash((seed, path)) % 2**31)
            return torch.randn(V, generator=gg, dtype=torch.float64).mul(2).log_softmax(-1)

    s = RandomSession({}, V)
    del g
    total = min(total, 1 + top_k + depth * top_k * top_k)
    tree = build_eagle2_tree(s, depth, top_k, total, max_depth=10)
    n = tree.size
    assert n == total
    m = tree.ancestor_mask
    assert torch.equal(tree.depth, m.sum(1) - 1)
    internal = {p for p in tree.parent_list[1:]}
    assert len(tree.retrieve_indices()) == n - len(internal)
    for row in tree.retrieve_indices().tolist():
        path = [v for v in row if v >= 0]
        assert path[0] == 0 and all(tree.parent_list[b] == a for a, b in itertools.pairwise(path))
    # siblings in decreasing drafter score
    assert tree.max_depth <= depth + 1


def test_static_paths_validation_and_shapes():
    assert len(validate_paths(MC_SIM_7B_63)) == 25
    with pytest.raises(ConfigError, match="prefix-closed"):
        validate_paths([[0], [1, 0]])
    with pytest.raises(ConfigError, match="duplicate"):
        validate_paths([[0], [0]])


def test_static_tree_topk_any_width():
    V = 8
    s = FakeSession({(): dist(V, {3: 0.4, 5: 0.3, 1: 0.2})}, V)
    tree = StaticTreePolicy([[0], [1], [2], [0, 0], [2, 0]]).propose(s, max_depth=5)
    assert tree.tokens[1:4].tolist() == [3, 5, 1]
    assert tree.parent_list == [-1, 0, 0, 0, 1, 3]
    assert tree.drafted_depth == 2 and tree.proposal is None
    chain = ChainPolicy(3).propose(FakeSession({}, V), max_depth=2)
    assert chain.size == 3 and chain.max_depth == 2


def test_tree_rejects_bad_parents():
    with pytest.raises(ValueError):
        DraftTree(tokens=torch.tensor([1, 2]), parents=[-1, 1], drafted_depth=1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([torch.float32, torch.float64]))
def test_host_ranking_is_torch_stable_sort(seed, dtype):
    """The tree builder ranks drafter log-probs with a stable numpy argsort on a host copy: the same order as a
    stable descending ``torch.sort`` (ties toward the lower token id, −inf last), whatever the ties."""
    from adtbench.algorithm.policies.base import desc_stable

    g = torch.Generator().manual_seed(seed)
    lp = torch.randint(-6, 1, (4, 64), generator=g).to(dtype) / 2  # many exact ties
    lp[torch.rand(4, 64, generator=g) < 0.2] = float("-inf")
    ref = torch.sort(lp, dim=-1, descending=True, stable=True).indices
    assert (torch.from_numpy(desc_stable(lp.numpy())) == ref).all()


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 70), st.booleans())
def test_partial_top_k_is_the_stable_sort_prefix(seed, k, rows):
    """``top_k_stable`` (partition + sort of the candidates) returns the first k of the stable descending sort,
    with exact ties across the k-th place (→ the full sort), −inf and k ≥ V included."""
    from adtbench.algorithm.policies.base import desc_stable, top_k_stable

    g = torch.Generator().manual_seed(seed)
    shape = (40, 64) if rows else (4096,)  # above PARTIAL_MIN: the partition path
    coarse = bool(seed % 2)  # many exact ties, or continuous values
    x = (torch.randint(-6, 1, shape, generator=g) / 2) if coarse else torch.randn(shape, generator=g)
    x[torch.rand(shape, generator=g) < 0.2] = float("-inf")
    x = x.numpy().astype(np.float32)
    assert (top_k_stable(x, k) == desc_stable(x)[..., :k]).all()
