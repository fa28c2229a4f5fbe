"""ADT-Tree policy: bisectional rules and bounds, adjacency initialisation (incl. end-of-line layouts), per-position
state, EAGLE-2 equivalence with adaptation off, AR identity at T = 0, config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import FakeSession, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.lantern import LanternRule
from adtbench.algorithm.policies.adt import ADTPolicy, PositionState, TreeShape, build_adt_policy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.records import Acceptance
from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
V = 16
PLAIN = TokenLayout(vocab_size=V, image_token_offset=0, num_codes=V, grid_h=3, grid_w=4)
EOL = TokenLayout(vocab_size=V + 2, image_token_offset=0, num_codes=V, grid_h=3, grid_w=4, eol_token=V, eoi_token=V + 1)


def session(layout: TokenLayout, root_gen: int) -> FakeSession:
    s = FakeSession({}, layout.vocab_size)
    s.root_gen, s.layout = root_gen, layout
    return s


def cycle(policy: ADTPolicy, layout: TokenLayout, g: int, a: int, max_depth: int = 10):
    """propose at root g, then observe a chain of a accepted drafts (the first child at each level)."""
    tree = policy.propose(session(layout, g), max_depth)
    path = [0]
    for _ in range(a):
        path.append(tree.children[path[-1]][0])
    policy.observe(tree, Acceptance(path=path, bonus=0, tree_depth=tree.max_depth), g)
    return tree


# --- bisectional update -----------------------------------------------------------------------------------
def test_positive_deeper_narrower_negative_shallower_wider():
    pol = ADTPolicy(budget="fixed", beta=0.5, l_d=1, l_k=2)
    s = TreeShape(5, 10, 1, 2)
    up, down = pol.update(s, 0.5), pol.update(s, 0.49)
    assert (up.D, up.K, up.direction) == (6, 8, 1)
    assert (down.D, down.K, down.direction) == (4, 12, -1)


def test_status_through_observe_and_trace_fields():
    pol = ADTPolicy(budget="fixed", beta=0.5, alpha="realised")
    t = cycle(pol, PLAIN, 0, 2)  # uniform drafter: the rerank keeps depth d = 2 of D = 5; a = 2 → α = 1 ≥ β
    assert (t.max_depth, t.drafted_depth) == (2, 5)
    assert t.info["alpha"] == 1.0 and t.info["alpha_D"] == pytest.approx(2 / 5)
    assert (t.info["D_next"], t.info["K_next"], t.info["N"], t.info["init"]) == (6, 8, 58, "default")
    t2 = cycle(pol, PLAIN, 3, 0)  # reads its left neighbour 2 (committed by cycle 1); a = 0 → α = 0 < β
    assert (t2.info["D_policy"], t2.drafted_depth, t2.width, t2.info["init"]) == (6, 6, 8, "left")
    assert (t2.info["D_next"], t2.info["K_next"]) == (5, 10)


def test_alpha_definition_switch():
    # a = 1 at realised depth d = 2, drafted depth 5: a/d = 0.5 ≥ β = 0.4 > a/D = 0.2
    for alpha, want in (("realised", 6), ("drafted", 4)):
        pol = ADTPolicy(budget="fixed", beta=0.4, alpha=alpha)
        cycle(pol, PLAIN, 0, 1)
        assert want == pol.state[0].after.D and pol.state[0].alpha == (0.5 if alpha == "realised" else 0.2)


@settings(max_examples=100, deadline=None)
@given(
    alphas=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
    l_d=st.integers(0, 3),
    l_k=st.integers(0, 5),
    halve=st.booleans(),
)
def test_bounds_hold_and_moves_follow_status(alphas, l_d, l_k, halve):
    pol = ADTPolicy(
        budget="fixed", beta=0.5, l_d=l_d, l_k=l_k, halve_on_flip=halve, D0=4, K0=6, D_min=2, D_max=7, K_min=3, K_max=9
    )
    s = pol.default_shape()
    for a in alphas:
        n = pol.update(s, a)
        assert 2 <= n.D <= 7 and 3 <= n.K <= 9
        if a >= 0.5:
            assert n.D >= s.D and n.K <= s.K and n.direction == 1
        else:
            assert n.D <= s.D and n.K >= s.K and n.direction == -1
        assert n.step_d <= s.step_d and n.step_k <= s.step_k  # steps never grow
        assert (n.step_d > 0) == (l_d > 0) and (n.step_k > 0) == (l_k > 0)  # halving stops at 1
        if not halve:
            assert (n.step_d, n.step_k) == (l_d, l_k)
        s = n


def test_halve_on_flip():
    pol = ADTPolicy(budget="fixed", l_d=4, l_k=4, halve_on_flip=True, D0=5, D_min=1, D_max=20, K_min=1, K_max=40)
    s = pol.default_shape()
    steps = []
    for a in (1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0):
        s = pol.update(s, a)
        steps.append((s.D, s.step_d))
    assert steps == [(9, 4), (13, 4), (11, 2), (9, 2), (10, 1), (9, 1), (10, 1)]


# --- adjacency initialisation -----------------------------------------------------------------------------
def _fill_unique_state(pol: ADTPolicy, layout: TokenLayout) -> dict[int, tuple[int, int]]:
    """Give every image position a distinct (D, K) after-state; returns gen → (D, K)."""
    shapes = {}
    image = [g for g in range(layout.num_gen_tokens) if layout.grid_position(g) is not None]
    for i, g in enumerate(image):
        D, K = 2 + i % 7, 4 + i // 7
        sh = TreeShape(D, K, 1, 2)
        pol.state[g] = PositionState(TreeShape(5, 10, 1, 2), sh, 0.0)
        shapes[g] = (D, K)
    return shapes


def _expected(layout: TokenLayout, g: int, init: str) -> tuple[int | None, str]:
    """Independent reference in grid terms: which generation index a cycle rooted at g reads."""
    gen_of = {layout.grid_position(j): j for j in range(layout.num_gen_tokens) if layout.grid_position(j)}
    cell = layout.grid_position(g) or layout.grid_position(g + 1)
    if cell is None:
        return None, "default"
    r, c = cell
    if init == "vertical" and r > 0:
        return gen_of[(r - 1, c)], "up"
    if c > 0:
        return gen_of[(r, c - 1)], "left"
    if r > 0:
        return gen_of[(r - 1, layout.grid_w - 1)], "prev_row"
    return None, "default"


@pytest.mark.parametrize("layout", [PLAIN, EOL], ids=["plain", "eol"])
@pytest.mark.parametrize("init", ["horizontal", "vertical"])
def test_init_reads_the_right_neighbour(layout, init):
    pol = ADTPolicy(budget="fixed", init=init, D_min=2, D_max=8, K_min=4, K_max=16)
    shapes = _fill_unique_state(pol, layout)
    seen = set()
    for g in range(layout.num_gen_tokens - 1):
        shape, source = pol.initial_shape(layout, g)
        gen, want = _expected(layout, g, init)
        assert source == want, g
        assert (shapes[gen] if gen is not None else (5, 10)) == (shape.D, shape.K), g
        seen.add(source)
    assert seen == ({"up", "left", "default"} if init == "vertical" else {"left", "prev_row", "default"})
    if layout is EOL:  # a root on the EOL slot of row 0 starts row 1: vertical reads (0, 0), horizontal (0, 3)
        assert pol.initial_shape(layout, 4)[1] == ("up" if init == "vertical" else "prev_row")


def test_vertical_row_stride_counts_the_eol_token():
    pol = ADTPolicy(budget="fixed", init="vertical")
    shapes = _fill_unique_state(pol, EOL)
    shape, source = pol.initial_shape(EOL, 7)  # (1, 2) → (0, 2) = gen 2 (not 7 − grid_w = 3)
    assert source == "up" and shapes[2] == (shape.D, shape.K)


def test_read_final_vs_updated():
    upd, fin = ADTPolicy(budget="fixed", read="updated"), ADTPolicy(budget="fixed", read="final")
    for pol in (upd, fin):
        pol.state[0] = PositionState(TreeShape(3, 12, 1, 2), TreeShape(4, 10, 1, 2, 1), 0.9)
    assert (upd.initial_shape(PLAIN, 1)[0].D, fin.initial_shape(PLAIN, 1)[0].D) == (4, 3)


def test_init_none_is_always_default():
    pol = ADTPolicy(budget="fixed", init="none")
    _fill_unique_state(pol, PLAIN)
    assert all(pol.initial_shape(PLAIN, g) == (pol.default_shape(), "default") for g in range(12))


def test_state_is_per_committed_position_and_skips_eol():
    pol = ADTPolicy(budget="fixed", beta=0.5, alpha="realised")
    cycle(pol, EOL, 0, 2)  # commits 0, 1, 2; α = 1 → (6, 8)
    cycle(pol, EOL, 3, 2)  # reads 2; commits 3, 4 (EOL), 5; α = 1 → (7, 6)
    assert sorted(pol.state) == [0, 1, 2, 3, 5]
    assert pol.state[0] is pol.state[2] and pol.state[3] is pol.state[5] and pol.state[0] is not pol.state[3]
    assert (pol.state[2].after.D, pol.state[2].after.K) == (6, 8)
    assert (pol.state[5].before.D, pol.state[5].before.K, pol.state[5].after.D, pol.state[5].after.K) == (6, 8, 7, 6)
    assert pol.initial_shape(EOL, 6)[0].D == 7  # the next cycle (root 6 = (1, 1)) reads 5 = (1, 0)
    pol.reset()
    assert pol.state == {} and pol.initial_shape(EOL, 7)[1] == "default"


# --- budget, EAGLE-2 equivalence, engine ------------------------------------------------------------------
def test_budget_rules():
    fixed, mn = ADTPolicy(budget="fixed", N_max=58), ADTPolicy(budget="min", N_max=58)
    assert fixed.nodes_budget(2, 4) == 58 and mn.nodes_budget(2, 4) == 4 + 16 and mn.nodes_budget(5, 10) == 58
    assert ADTPolicy(budget="fixed", N_max=200).max_nodes() == 201 and fixed.max_nodes() == 59
    assert fixed.max_draft_slots() == 16 * 7  # drafter scratch: K_max frontier nodes × (D_max − 1) rounds


def test_widest_deepest_tree_fits_the_caches():
    """D = D_max, K = K_max every cycle: the drafter expands K·(D − 1) slots, more than N_max + 1."""
    target, drafter = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    pol = ADTPolicy(budget="fixed", D0=8, K0=16, adapt=False)
    assert generate(target, drafter, pol, inputs, sp, None).tokens == decode_ar(target, inputs, sp, None).tokens


def test_yaml_defaults_with_adaptation_off_are_eagle2():
    node = OmegaConf.load(ROOT / "conf" / "policy" / "adt.yaml")
    assert node.budget == "cost"  # the default run's budget; the paper's fixed-N trees are budget=fixed
    node = OmegaConf.merge(node, {"budget": "fixed"})
    pol = build_adt_policy(node)
    assert (pol.D0, pol.K0, pol.N_max) == (5, 10, 58)
    target, drafter = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    ref = generate(target, drafter, Eagle2Policy(), inputs, sp, torch.Generator().manual_seed(0))
    for over in ({"adapt": False}, {"init": "none"}, {"read": "final"}):
        pol = build_adt_policy(OmegaConf.merge(node, over))
        res = generate(target, drafter, pol, inputs, sp, torch.Generator().manual_seed(0))
        assert res.tokens == ref.tokens
        assert [(c.nodes, c.drafted_depth, c.tree_depth, c.width, c.accepted) for c in res.cycles] == [
            (c.nodes, c.drafted_depth, c.tree_depth, c.width, c.accepted) for c in ref.cycles
        ]
    adaptive = generate(target, drafter, build_adt_policy(node), inputs, sp, torch.Generator().manual_seed(0))
    assert len({c.drafted_depth for c in adaptive.cycles[:-2]}) > 1  # the default policy does adapt


@pytest.mark.parametrize("model", ["tiny_llamagen", "tiny_chameleon"])
@pytest.mark.parametrize("init", ["horizontal", "vertical"])
def test_greedy_adt_equals_ar_with_cfg(model, init):
    target, drafter = tiny(model)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    for prompt in ["a red circle", "two blue squares on a striped floor"]:
        inputs = target.encode_prompt(prompt, cfg=True)
        ar = decode_ar(target, inputs, sp, None)
        pol = ADTPolicy(budget="fixed", init=init, beta=0.3, D0=3, K0=4, D_min=1, D_max=6, K_min=2, K_max=8, N_max=20)
        res = generate(target, drafter, pol, inputs, sp, None)
        assert res.tokens == ar.tokens
        shapes = {(c.extra["D_policy"], c.width) for c in res.cycles if c.extra}
        assert len(shapes) > 1  # the trees did adapt
        assert all(1 <= D <= 6 and 2 <= K <= 8 for D, K in shapes)


def test_adt_with_lantern_sampling_and_cfg_runs():
    target, drafter = tiny("tiny_chameleon", dtype="float32")
    lay = target.layout
    table = torch.stack([torch.roll(torch.arange(lay.num_codes), -s) for s in range(1, 6)], 1)
    rule = LanternRule(table, lay.image_token_offset, delta=0.2)
    sp = SamplingParams(temperature=1.0, top_k=20, cfg_scale=3.0)
    res = generate(target, drafter, ADTPolicy(budget="fixed"), target.encode_prompt("a cat", cfg=True), sp,
                   torch.Generator().manual_seed(1), rule)  # fmt: skip
    assert len(res.tokens) == lay.num_gen_tokens and res.committed == lay.num_gen_tokens - 1
    assert all({"alpha", "alpha_D", "N", "init"} <= set(c.extra) for c in res.cycles if c.nodes > 1)


@pytest.mark.parametrize(
    "over,key",
    [({"beta": 1.5}, "policy.beta"), ({"D0": 9}, "policy.D0"), ({"K0": 2}, "policy.K0"),
     ({"init": "diag"}, "policy.init"), ({"read": "old"}, "policy.read"), ({"alpha": "a/x"}, "policy.alpha"),
     ({"budget": "all"}, "policy.budget"), ({"l_d": -1}, "policy.l_d"), ({"D_max": 1}, "policy.D_max"),
     ({"N_max": 0}, "policy.N_max"),
     ({"halve_on_flip": "yes"}, "policy.halve_on_flip"), ({"depth": 3}, "policy.depth")],
)  # fmt: skip
def test_bad_values_raise_config_error_naming_the_key(over, key):
    node = OmegaConf.merge(OmegaConf.load(ROOT / "conf" / "policy" / "adt.yaml"), over)
    with pytest.raises(ConfigError) as e:
        build_adt_policy(node)
    assert e.value.key == key


def test_build_policy_dispatches_adt_before_any_model_loads():
    from hydra import compose, initialize_config_dir

    from adtbench.harness.config import build_policy

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["policy=adt", "policy.init=vertical", "policy.alpha=drafted"])
        bad = compose("config", overrides=["policy=adt", "policy.beta=2"])
    pol = build_policy(cfg)
    assert isinstance(pol, ADTPolicy) and pol.init == "vertical" and pol.alpha_def == "drafted"
    with pytest.raises(ConfigError, match=r"policy\.beta"):
        build_policy(bad)
