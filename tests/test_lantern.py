"""LANTERN: neighbour tables, the relaxed probability p̃ (bounds, prefix, toy numbers), the three verification
hooks, δ = 0 ≡ exact through the engine (T = 0 tokens, T = 1 law), config and Hydra composition."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import pooled_chisquare, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from scipy.stats import chisquare

import adtbench.harness.caches as caches_mod
from adtbench.algorithm.engine import generate
from adtbench.algorithm.methods.lantern import LanternRule, nearest_codes
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, verify_sampling
from adtbench.errors import ConfigError
from adtbench.harness.caches import build_lantern_rule, lantern_params, load_or_build_table
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def brute_force_neighbours(codebook: np.ndarray, normalize: bool = False) -> np.ndarray:
    x = codebook / np.linalg.norm(codebook, axis=1, keepdims=True) if normalize else codebook
    d = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(d, np.inf)
    return np.argsort(d, axis=1, kind="stable")[:, :-1]  # self (inf) last


def toy_rule(**kw) -> tuple[LanternRule, torch.Tensor]:
    """algorithms.md §3.2 toy: p(x) = 0.05 at token 0, neighbours 1..4 with masses 0.04, 0.03, 0.06, 0.01."""
    p = torch.tensor([0.05, 0.04, 0.03, 0.06, 0.01, 0.81], dtype=torch.float64)
    table = torch.tensor([[1, 2, 3, 4, 5]] + [[0] + [j for j in range(1, 6) if j != c] for c in range(1, 6)])
    return LanternRule(table, 0, k=4, **kw), p


# --- neighbour tables ------------------------------------------------------------------------------------
@pytest.mark.parametrize("normalize", [False, True])
def test_neighbours_match_brute_force_only_k_columns(normalize):
    g = torch.Generator().manual_seed(0)
    cb = torch.randn(50, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    table = nearest_codes(cb, 7, normalize=normalize, chunk=8)  # several chunks, one ragged
    assert table.dtype == torch.int64 and table.shape == (50, 7)
    expect = brute_force_neighbours(cb.numpy(), normalize)[:, :7]
    assert np.array_equal(table.numpy(), expect)
    assert not (table == torch.arange(50)[:, None]).any()  # self excluded
    assert torch.equal(nearest_codes(cb, 7, normalize=normalize), table)  # chunking does not matter


def test_neighbours_never_sort_the_full_matrix(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("full sort called")

    monkeypatch.setattr(torch, "sort", boom)
    monkeypatch.setattr(torch, "argsort", boom)
    cb = torch.randn(40, 4, generator=torch.Generator().manual_seed(1))
    assert nearest_codes(cb, 5).shape == (40, 5)
    with pytest.raises(ValueError):
        nearest_codes(cb, 40)  # only num_codes − 1 other codes


def test_cache_hit_and_key(tmp_path, monkeypatch):
    cb = torch.randn(30, 4, generator=torch.Generator().manual_seed(2))
    t1, path, hit = load_or_build_table(cb, 5, False, tmp_path)
    assert not hit and path.exists() and path.parent == tmp_path
    monkeypatch.setattr(caches_mod, "nearest_codes", lambda *a, **k: pytest.fail("recomputed on a cache hit"))
    t2, path2, hit2 = load_or_build_table(cb.clone(), 5, False, tmp_path)
    assert hit2 and path2 == path and torch.equal(t1, t2) and t2.dtype == torch.int64
    keys = {
        caches_mod.table_key(cb, 5, False),
        caches_mod.table_key(cb, 5, True),
        caches_mod.table_key(cb, 6, False),
    }
    cb2 = cb.clone()
    cb2[3, 1] += 1e-6
    keys.add(caches_mod.table_key(cb2, 5, False))
    assert len(keys) == 4


# --- p̃: toy numbers, bounds, prefix ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,p_tilde,mstar",
    [({"delta": 0.1}, 0.12, 2), ({"delta": None, "lam": 2.0}, 0.09, 1), ({"delta": None, "lam": 3.0}, 0.12, 2),
     ({"delta": 0.02}, 0.05, 0), ({"delta": 0.1, "lam": 2.0}, 0.09, 1)],
)  # fmt: skip
def test_toy_numbers(kw, p_tilde, mstar):
    rule, p = toy_rule(**kw)
    assert rule.relaxed_prob(p, 0) == pytest.approx(p_tilde, abs=1e-12)
    assert rule.aggregated(p, 0) == [1, 2, 3, 4][:mstar]


@st.composite
def relax_case(draw):
    V = draw(st.integers(3, 12))
    weights = draw(st.lists(st.floats(0.0, 1.0), min_size=V, max_size=V).filter(lambda w: sum(w) > 1e-3))
    p = torch.tensor(weights, dtype=torch.float64)
    p = p / p.sum()
    cb = torch.tensor(draw(st.lists(st.floats(-3, 3), min_size=2 * V, max_size=2 * V)), dtype=torch.float64)
    k = draw(st.integers(1, V - 1))
    delta = draw(st.one_of(st.none(), st.floats(0.0, 1.0)))
    lam = draw(st.one_of(st.none(), st.floats(1.0, 6.0))) if delta is not None else draw(st.floats(1.0, 6.0))
    return p, cb.view(V, 2), k, delta, lam


@settings(max_examples=150, deadline=None)
@given(relax_case())
def test_relaxation_respects_bounds_and_is_a_maximal_prefix(case):
    p, cb, k, delta, lam = case
    table = torch.from_numpy(brute_force_neighbours(cb.numpy()))  # full order (ties: stable)
    rule = LanternRule(table, 0, delta=delta, lam=lam, k=k)
    for x in range(p.numel()):
        A = rule.aggregated(p, x)
        m = len(A)
        assert table[x, :m].tolist() == A  # A(x) is a proximity-ordered prefix
        moved = float(p[A].sum())
        pt = p.clone()
        pt[x] += moved
        pt[A] = 0.0
        tv = 0.5 * float((pt - p).abs().sum())
        assert rule.relaxed_prob(p, x) == pytest.approx(float(pt[x]), abs=1e-12)
        assert tv == pytest.approx(moved, abs=1e-12)
        if delta is not None:
            assert tv <= delta + 1e-12
        if lam is not None:
            assert float(pt[x]) <= lam * float(p[x]) + 1e-12
        tau = min(delta if delta is not None else np.inf, (lam - 1) * float(p[x]) if lam is not None else np.inf)
        if m < k:  # maximal: one more neighbour would break the bound
            assert float(p[table[x, : m + 1]].sum()) > tau


def test_non_image_tokens_are_not_relaxed():
    table = torch.tensor([[1, 2], [0, 2], [1, 0]])
    rule = LanternRule(table, 4, delta=1.0)  # image tokens 4, 5, 6
    p = torch.full((8,), 1 / 8, dtype=torch.float64)
    r = rule.relax(p[None].expand(4, -1), torch.tensor([0, 4, 6, 7]))
    assert r.extra.tolist() == [0.0, 0.25, 0.25, 0.0] and r.valid.tolist() == [False, True, True, False]
    assert r.neighbours[1].tolist() == [5, 6] and r.neighbours[2].tolist() == [5, 4]  # codes + offset


# --- hooks -----------------------------------------------------------------------------------------------
def test_greedy_rule_vectorised_matches_definition():
    g = torch.Generator().manual_seed(3)
    V, m = 10, 200
    table = torch.from_numpy(brute_force_neighbours(torch.randn(V, 2, generator=g).numpy()))
    rule = LanternRule(table, 0, delta=0.15, k=4)
    logits = torch.randn(m, V, generator=g, dtype=torch.float64) * 1.5
    logits[::7, 3] = float("-inf")
    tokens = torch.randint(0, V, (m,), generator=g)
    got = rule.greedy_accept(logits, tokens)
    p = logits.softmax(-1)
    for i in range(m):
        x = int(tokens[i])
        pt = rule.relaxed_prob(p[i], x)
        others = torch.cat([p[i, :x], p[i, x + 1 :]])
        lower = p[i, :x].max().item() if x > 0 else -1.0
        want = pt >= float(others.max()) and pt > lower  # ties go to the lower index
        assert bool(got[i]) == want, i
    assert got.sum() > (logits.argmax(-1) == tokens).sum()  # the relaxation accepts more


def test_greedy_ties_go_to_the_lower_index():
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 0, 3], [2, 1, 0]])
    rule = LanternRule(table, 0, delta=0.25, k=1)
    log2 = float(torch.tensor(2.0, dtype=torch.float64).log())
    logits = torch.tensor([[log2, 0.0, 0.0, -torch.inf], [0.0, 0.0, log2, -torch.inf]], dtype=torch.float64)
    p = logits.softmax(-1)
    assert p[0, 1] + p[0, 2] == p[0, 0] and p[1, 0] + p[1, 1] == p[1, 2]  # exact ties by construction
    # row 0: p̃(2) = p(0) with 0 < 2 → rejected; row 1: p̃(0) = p(2) with 2 > 0 → accepted
    assert rule.greedy_accept(logits, torch.tensor([2, 0])).tolist() == [False, True]


def _random_case(seed: int, V: int = 9):
    g = torch.Generator().manual_seed(seed)
    table = torch.from_numpy(brute_force_neighbours(torch.randn(V, 3, generator=g).numpy()))
    logits = torch.randn(V, generator=g, dtype=torch.float64) * 2
    logits[torch.randperm(V, generator=g)[:3]] = float("-inf")  # zero-mass neighbours (top-k filtered)
    return table, logits.softmax(-1)


@pytest.mark.parametrize("zero", [{"delta": 0.0}, {"delta": None, "lam": 1.0}, {"delta": 0.0, "lam": 2.0}])
def test_zero_bound_hooks_are_bit_identical_to_exact(zero):
    for seed in range(20):
        table, p = _random_case(seed)
        rule = LanternRule(table, 0, **zero)
        assert rule.lossless
        q = torch.rand(p.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        q = q / q.sum()
        for x in range(p.numel()):
            a1, r1 = rule.point_mass(p, x)
            a0, r0 = EXACT.point_mass(p, x)
            assert a1 == a0 and torch.equal(r1, r0)
            b1, s1 = rule.with_proposal(p, x, q)
            b0, s0 = EXACT.with_proposal(p, x, q)
            assert b1 == b0 and torch.equal(s1, s0)
        logits = p.log()[None].expand(p.numel(), -1)
        toks = torch.arange(p.numel())
        assert torch.equal(rule.greedy_accept(logits, toks), EXACT.greedy_accept(logits, toks))


def test_reference_residual_zeroes_k_plus_one_and_is_lossy_at_delta_zero():
    table = torch.tensor([[1, 2, 3, 4], [0, 2, 3, 4], [1, 0, 3, 4], [2, 1, 0, 4], [3, 2, 1, 0]])
    p = torch.tensor([0.3, 0.0, 0.2, 0.25, 0.25], dtype=torch.float64)  # n_1(0) has zero mass: m* = 1 at δ = 0
    ref = LanternRule(table, 0, delta=0.0, k=2, reference_residual=True)
    assert not ref.lossless
    acc, res = ref.point_mass(p, 0)
    assert acc == pytest.approx(0.3) and res.tolist() == [0.0, 0.0, 0.0, 0.0, 0.25]  # x + k+1 = 3 neighbours
    _, principled = LanternRule(table, 0, delta=0.0, k=2).point_mass(p, 0)
    assert principled.tolist() == [0.0, 0.0, 0.2, 0.25, 0.25]


def _emitted_law_point_mass(rule, p, x) -> torch.Tensor:
    acc, res = rule.point_mass(p, x)
    out = (1 - acc) * res / res.sum()
    out[x] += acc
    return out


def test_point_mass_step_emits_exactly_p_tilde_x():
    for seed in range(10):
        table, p = _random_case(seed)
        rule = LanternRule(table, 0, delta=0.2, k=5)
        for x in range(p.numel()):
            if rule.relaxed_prob(p, x) >= 1.0:
                continue
            A = rule.aggregated(p, x)
            pt = p.clone()
            pt[x] += p[A].sum()
            pt[A] = 0.0
            assert torch.allclose(_emitted_law_point_mass(rule, p, x), pt, atol=1e-12)


def test_sampling_verifier_with_lantern_follows_p_tilde_and_differs_from_p():
    """χ² through ``verify_sampling`` (one draft): the law is p̃_x (δ = 0.3), and p is rejected (negative control)."""
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 1, 0]])
    p = torch.tensor([0.3, 0.1, 0.15, 0.45], dtype=torch.float64)
    rule = LanternRule(table, 0, delta=0.3)
    tree = DraftTree(torch.tensor([9, 0]), [-1, 0], drafted_depth=1)
    logits = p.log()[None].expand(2, -1)
    g = torch.Generator().manual_seed(0)
    n = 6000
    counts = Counter()
    for _ in range(n):
        acc = verify_sampling(tree, logits, g, rule)
        counts[int(tree.tokens[acc.path[1]]) if acc.accepted else acc.bonus] += 1
    obs = [counts.get(i, 0) for i in range(4)]
    p_tilde = [0.55, 0.0, 0.0, 0.45]  # A(0) = {1, 2}: 0.1 + 0.15 ≤ 0.3 < 0.7
    assert obs[1] == obs[2] == 0
    assert chisquare([obs[0], obs[3]], [p_tilde[0] * n, p_tilde[3] * n]).pvalue > 1e-3
    assert chisquare(obs, [float(v) * n for v in p]).pvalue < 1e-6


def test_true_q_step_is_tv_minimal_given_relaxed_acceptance():
    """One sampled-draft step: emitted law o = Σ_x q(x)[a_x δ_x + (1 − a_x) r_x]; TV(o, p) is the forced overshoot."""
    for seed in range(10):
        table, p = _random_case(seed)
        rule = LanternRule(table, 0, delta=0.15, k=4)
        q = torch.rand(p.numel(), generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64) ** 3
        q = q / q.sum()
        o = torch.zeros_like(p)
        forced = torch.zeros_like(p)  # min(q(y), p̃_y(y)): what acceptance alone emits
        for x in range(p.numel()):
            a, res = rule.with_proposal(p, x, q)
            o[x] += q[x] * a
            if a < 1:
                o += q[x] * (1 - a) * res / res.sum()
            forced[x] = min(float(q[x]), rule.relaxed_prob(p, x))
        assert float(o.sum()) == pytest.approx(1.0)
        assert torch.all(o >= forced - 1e-12)
        deficit = (p - q).clamp_min(0)  # the residual fills exactly this, proportionally
        assert torch.allclose(o, forced + (1 - forced.sum()) * deficit / deficit.sum(), atol=1e-12)
        tv = 0.5 * float((o - p).abs().sum())
        overshoot = float((forced - torch.minimum(q, p)).sum())
        assert tv == pytest.approx(overshoot, abs=1e-12)
        C = torch.tensor([rule.relaxed_prob(p, x) - float(p[x]) for x in range(p.numel())], dtype=torch.float64)
        assert tv <= float(torch.minimum((q - p).clamp_min(0), C).sum()) + 1e-12


@pytest.mark.parametrize(
    "bounds", [{"delta": 0.2}, {"delta": None, "lam": 2.5}, {"delta": 0.3, "lam": 1.5}, {"delta": 0.15, "k": 3}]
)
def test_host_extra_equals_relax(bounds):
    """The verifier's host fast path reads the same moved mass C_{m*}(x) as ``relax`` (offset tokens included)."""
    for seed in range(20):
        table, p = _random_case(seed)
        rule = LanternRule(table, 2, **bounds)
        pv = torch.cat([torch.zeros(2, dtype=torch.float64), p])  # two non-image tokens before the codes
        for x in range(pv.numel()):
            want = float(rule.relax(pv[None], torch.tensor([x])).extra[0])
            assert rule.host_extra(pv.numpy(), x) == pytest.approx(want, abs=1e-15), (seed, x)


def _generic_proposal_children(rule, p, q, kids, tokens, draws):
    """``verify_sampling``'s generic per-child loop (``rule.with_proposal``), the law the host path must keep."""
    for c in kids:
        x = tokens[c]
        acc, residual = rule.with_proposal(p, x, q)
        if next(draws) < acc:
            return c, p
        p = residual / residual.sum() if residual.sum() > 0 else p
        q = q.clone()
        q[x] = 0.0
        q = q / q.sum() if q.sum() > 0 else q
    return None, p


def test_lantern_proposal_children_on_the_host_match_the_generic_loop():
    """Same uniforms → same accepted child and the same residual, for LANTERN's proposal step on the host
    (``verify._proposal_children`` with ``host_extra``) and through ``LanternRule.with_proposal`` one child at a
    time: the fast path changes the arithmetic, not the law."""
    from adtbench.algorithm.verify import EXACT, _proposal_children

    for seed in range(40):
        table, p = _random_case(seed)
        rule = LanternRule(table, 0, delta=0.25)
        host = rule.host_proposal()
        assert host is not None and host.extra == rule.host_extra and EXACT.host_proposal().extra is None
        assert LanternRule(table, 0, delta=0.25, reference_residual=True).host_proposal() is None
        g = torch.Generator().manual_seed(500 + seed)
        q = torch.rand(p.numel(), generator=g, dtype=torch.float64) ** 2
        q = q / q.sum()
        tokens = torch.randperm(p.numel(), generator=g)[:4].tolist()
        kids = [0, 1, 2, 3]
        u = torch.rand(4, generator=g, dtype=torch.float64).tolist()
        c_host, p_host = _proposal_children(p, q, kids, tokens, iter(u), rule.host_extra)
        c_gen, p_gen = _generic_proposal_children(rule, p, q, kids, tokens, iter(u))
        assert c_host == c_gen, seed
        np.testing.assert_allclose(p_host, p_gen.numpy(), atol=1e-12)


def test_sampled_draft_through_verify_sampling_follows_the_relaxed_law():
    """χ² through ``verify_sampling`` (host path): a draft x ~ q verified with the true q under LANTERN emits
    o = Σ_x q(x)[a_x δ_x + (1 − a_x) r_x], the law ``with_proposal`` defines (computed exactly here)."""
    table, p = _random_case(3, V=6)
    rule = LanternRule(table, 0, delta=0.2)
    q = torch.tensor([0.05, 0.3, 0.1, 0.25, 0.2, 0.1], dtype=torch.float64)
    o = torch.zeros_like(p)
    for x in range(p.numel()):
        a, res = rule.with_proposal(p, x, q)
        o[x] += q[x] * a
        if a < 1:
            o += q[x] * (1 - a) * res / res.sum()
    g = torch.Generator().manual_seed(7)
    logits = p.log()[None].expand(2, -1)
    n, counts = 8000, Counter()
    for _ in range(n):
        x = int(torch.multinomial(q, 1, generator=g))
        tree = DraftTree(torch.tensor([0, x]), [-1, 0], drafted_depth=1, proposal={0: q})
        acc = verify_sampling(tree, logits, g, rule)
        counts[x if acc.accepted else acc.bonus] += 1
    assert pooled_chisquare(counts, {i: float(v) for i, v in enumerate(o)}, n)[0] > 1e-3
    # and not p's: the relaxation is lossy (a negative control on the same draws; p has zeros, so compare by TV)
    emp = torch.tensor([counts.get(i, 0) / n for i in range(p.numel())], dtype=torch.float64)
    assert 0.5 * float((emp - p).abs().sum()) > 3 * 0.5 * float((emp - o).abs().sum())


# --- config ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "over,key",
    [({"delta": 1.5}, "lantern.delta"), ({"lam": 0.5}, "lantern.lam"), ({"delta": None, "lam": None}, "lantern.delta"),
     ({"k": 0}, "lantern.k"), ({"normalize": "yes"}, "lantern.normalize"), ({"delta": "x"}, "lantern.delta")],
)  # fmt: skip
def test_bad_lantern_config_names_the_key(over, key):
    node = OmegaConf.load(ROOT / "conf" / "lantern" / "on.yaml")
    node.cache_dir = None
    for k, v in over.items():
        node[k] = v
    with pytest.raises(ConfigError) as e:
        lantern_params(node)
    assert e.value.key == key


def test_both_options_compose_from_the_command_line():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        on = compose("config", overrides=["lantern=on", "paths.root_dir=/tmp/x"])
        off = compose("config", overrides=["lantern=off"])
    assert on.lantern.enabled is True and off.lantern.enabled is False
    assert on.lantern.cache_dir == "/tmp/x/outputs/cache/lantern"
    p = lantern_params(on.lantern)
    assert p.delta == 0.1 and p.lam is None and p.k == 1000 and not p.reference_residual


@pytest.mark.parametrize("model", ["tiny_llamagen", "tiny_chameleon"])
def test_build_rule_from_target_codebook(model, tmp_path):
    target, _ = tiny(model)
    node = OmegaConf.create({"enabled": True, "k": 1000, "delta": 0.1, "lam": None, "normalize": True,
                             "reference_residual": False, "cache_dir": str(tmp_path)})  # fmt: skip
    rule = build_lantern_rule(node, target)
    lay = target.layout
    assert rule.k == lay.num_codes - 1 and rule.offset == lay.image_token_offset and not rule.lossless
    expect = brute_force_neighbours(target.codebook().detach().double().numpy(), normalize=True)
    assert np.array_equal(rule.table.numpy(), expect)
    assert len(list(tmp_path.glob("*.npy"))) == 1


# --- δ = 0 ≡ exact through the engine --------------------------------------------------------------------
@pytest.mark.parametrize("model", ["tiny_llamagen", "tiny_chameleon"])
def test_delta_zero_greedy_tokens_identical_to_exact(model, tmp_path):
    target, drafter = tiny(model)
    node = OmegaConf.create({"k": 8, "delta": 0.0, "cache_dir": str(tmp_path)})
    zero = build_lantern_rule(node, target)
    relaxed = build_lantern_rule(OmegaConf.create({"k": 8, "delta": 0.3, "cache_dir": str(tmp_path)}), target)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle on a striped floor", cfg=True)
    for make in (lambda: Eagle2Policy(depth=3, top_k=4, total_tokens=20), lambda: ADTPolicy(budget="fixed", beta=0.3)):
        exact = generate(target, drafter, make(), inputs, sp, None)
        same = generate(target, drafter, make(), inputs, sp, None, zero)
        assert same.tokens == exact.tokens and [c.accepted for c in same.cycles] == [c.accepted for c in exact.cycles]
    loose = generate(target, drafter, make(), inputs, sp, None, relaxed)
    assert sum(c.accepted for c in loose.cycles) >= sum(c.accepted for c in exact.cycles)


@pytest.mark.slow
def test_delta_zero_sampling_law_matches_ar():
    """T = 1, top-k 3 (zero-mass neighbours exist): δ = 0 replays EXACT's samples seed for seed and its joint law
    of the first 3 tokens passes a χ² test against AR."""
    from test_engine import _exact_joint

    arch = {"arch.vocab_size": 4, "arch.block_size": 4, "vq.kind": "none"}
    target, drafter = tiny("tiny_llamagen", **arch)
    rule = LanternRule(torch.tensor([[2, 1, 3], [0, 3, 2], [3, 0, 1], [1, 2, 0]]), 0, delta=0.0)
    sp = SamplingParams(temperature=1.0, top_k=3, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    expected = _exact_joint(target, inputs, sp, 3)

    def policy():
        return Eagle2Policy(depth=2, top_k=3, total_tokens=9)

    for seed in range(6):
        a = generate(target, drafter, policy(), inputs, sp, torch.Generator().manual_seed(seed), rule)
        b = generate(target, drafter, policy(), inputs, sp, torch.Generator().manual_seed(seed), EXACT)
        assert a.tokens == b.tokens
    g = torch.Generator().manual_seed(0)
    n = 400
    counts, accepted = Counter(), 0
    with target.reuse_prefill(inputs):  # the prompt's prefill run once (tests/test_prefill_reuse.py)
        for _ in range(n):
            res = generate(target, drafter, policy(), inputs, sp, g, rule)
            counts[tuple(res.tokens[:3])] += 1
            accepted += sum(c.accepted for c in res.cycles)
    assert accepted > n // 2
    assert pooled_chisquare(counts, expected, n)[0] > 1e-3
