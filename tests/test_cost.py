"""Cost-aware trees: the budget's choices, calibration, the cached cost model, and config errors."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import FakeSession, synthetic_cost_model, tiny
from omegaconf import OmegaConf

from adtbench.algorithm.cost import PRIOR, CostModel, TreeBudget
from adtbench.algorithm.drafters.session import DraftSession, drive
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy, eagle2_steps
from adtbench.errors import ConfigError
from adtbench.harness import caches as cost_mod
from adtbench.harness.caches import cost_source, load_or_measure
from adtbench.sampling_params import SamplingParams


def build_eagle2_tree(session, *args, **kwargs):
    """EAGLE-2's tree for one session (``eagle2_steps`` driven by ``drive``)."""
    return drive(eagle2_steps(session, *args, **kwargs), session)


def linear_model(per_node: float, level: float = 0.0, fixed: float = 0.0) -> CostModel:
    sizes = [1, 2, 4, 8, 16, 32, 64]
    return CostModel(sizes, [1.0 + per_node * (n - 1) for n in sizes], [1, 64], [level, level], fixed)


def test_best_maximises_expected_tokens_per_ms_by_brute_force():
    b = TreeBudget(linear_model(0.1, fixed=0.5), calibrate=False)
    pi = np.array([0.9, 0.5, 0.3, 0.05, 0.01])
    n, rate = b.best(pi, spent_ms=0.5)
    rates = [(1 + pi[:k].sum()) / (0.5 + 1.0 + 0.1 * k) for k in range(6)]
    assert n == int(np.argmax(rates)) == 3 and rate == pytest.approx(max(rates))


def test_best_is_the_vectorised_rule_bit_for_bit():
    """``TreeBudget._best``'s scalar loop returns what ``argmax((1 + c·cumsum(π)) / (spent + t_verify))`` over the
    prefixes returns, to the bit — N (the first maximum), the rate, Σπ of the prefix — on random sorted path
    probabilities, with ties (zero π under a flat verify cost) and under a calibration c ≠ 1."""
    rng = np.random.default_rng(1)
    for trial in range(300):
        b = TreeBudget(linear_model(0.0, fixed=0.3) if trial % 3 == 0 else synthetic_cost_model())
        b.observe(float(rng.uniform(0, 3)), trial % 4)
        m = int(rng.integers(0, 40))
        raw = rng.choice([0.5, 0.25, 0.0], m) if trial % 2 else rng.uniform(0, 1, m)
        pi = np.sort(raw)[::-1]
        spent = float(rng.uniform(0, 2))
        cum = np.concatenate([[0.0], np.cumsum(pi)])
        rate = (1.0 + b.c * cum) / (spent + b._t_verify_upto(cum.size))
        n = int(np.argmax(rate))
        assert b._best(pi, spent) == (n, float(rate[n]), float(cum[n])), trial


def test_free_nodes_are_all_verified_and_costly_ones_none():
    pi = np.array([0.5, 0.2, 0.1])
    assert TreeBudget(linear_model(0.0), calibrate=False).best(pi, 0.0)[0] == 3
    assert TreeBudget(linear_model(10.0), calibrate=False).best(pi, 0.0)[0] == 0


def test_round_plan_is_the_level_rule_in_hindsight():
    """``choose`` sets the next cycle's rounds to where the one-level look-ahead stops: never past the root when a
    level costs 100 ms, every round and one more when levels are free."""
    for level_ms, want in ((100.0, 0), (0.0, 3)):
        b = TreeBudget(linear_model(0.01, level=level_ms), calibrate=False, rounds="planned")
        assert b.plan_rounds(2) == 2  # an image's first cycle drafts the policy's depth
        build_eagle2_tree(session(), depth=2, top_k=3, total_tokens=13, max_depth=5, budget=b)
        assert b.next_rounds == want and b.plan_rounds(2) == min(2, want)
        b.reset()
        assert b.next_rounds is None


def test_calibration_is_observed_over_predicted_with_a_prior_and_clamped():
    b = TreeBudget(linear_model(0.1))
    assert b.c == 1.0
    b.observe(predicted=10.0, accepted=20)
    assert b.c == pytest.approx((20 + PRIOR) / (10 + PRIOR))
    b.observe(predicted=1000.0, accepted=0)
    assert b.c == 0.25
    assert TreeBudget(linear_model(0.1), calibrate=False).c == 1.0


def session() -> FakeSession:
    V = 6
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.04, 0.01], dtype=torch.float64)
    return FakeSession({(): probs, (0,): probs.roll(1), (1,): probs.roll(2)}, V)


@pytest.mark.parametrize("per_node", [0.0, 0.02, 0.1, 0.3, 3.0])
def test_budgeted_eagle2_tree_is_the_best_prefix_of_the_rerank(per_node):
    """The kept nodes are the N highest-scoring candidates (ancestor-closed) with N the brute-force argmax."""
    b = TreeBudget(linear_model(per_node, level=0.0), calibrate=False)
    tree = build_eagle2_tree(session(), depth=2, top_k=3, total_tokens=13, max_depth=5, budget=b)
    if per_node == 0.0:  # free levels and free nodes: every round runs
        assert tree.drafted_depth == 3
    # the fixed tree over the same rounds holds every candidate the budgeted one chose from
    full = build_eagle2_tree(session(), depth=tree.drafted_depth - 1, top_k=3, total_tokens=13, max_depth=5)
    pi = sorted((math.exp(s) for s in path_scores(full)), reverse=True)
    rates = [(1 + sum(pi[:k])) / (1.0 + per_node * k) for k in range(len(pi) + 1)]
    assert tree.size - 1 == tree.info["N_cost"] == int(np.argmax(rates))
    assert tree.info["E_pred"] == pytest.approx(sum(pi[: tree.size - 1]))
    kept = {path(tree, j) for j in range(1, tree.size)}
    assert all(p[:-1] in kept or len(p) == 1 for p in kept)  # ancestor-closed
    assert kept <= {path(full, j) for j in range(1, full.size)}


def test_expensive_levels_stop_drafting_after_the_root():
    """Planned rounds: the image's first cycle drafts every round; from the second on, expensive levels are not
    drafted."""
    b = TreeBudget(linear_model(0.01, level=100.0), calibrate=False, rounds="planned")
    build_eagle2_tree(session(), depth=3, top_k=3, total_tokens=20, max_depth=5, budget=b)
    s = session()
    tree = build_eagle2_tree(s, depth=3, top_k=3, total_tokens=20, max_depth=5, budget=b)
    assert s.expansions == [] and tree.drafted_depth == 1 and tree.max_depth <= 1


def path(tree, j):
    return tuple(tree.tokens[tree.path_to(j)[1:]].tolist())


def path_scores(tree):
    """Cumulative log-probs of the fixed tree's nodes under ``session()``'s scripted distributions."""
    s = session()
    out = []
    for j in range(1, tree.size):
        toks = path(tree, j)
        lp = sum(float(s._lp(toks[:i])[toks[i]]) for i in range(len(toks)))
        out.append(lp)
    return out


def test_policies_validate_budget_and_calibrate():
    with pytest.raises(ConfigError, match=r"policy\.budget"):
        Eagle2Policy(budget="cheap")
    with pytest.raises(ConfigError, match=r"policy\.calibrate"):
        Eagle2Policy(budget="cost", calibrate="yes")
    with pytest.raises(ConfigError, match=r"policy\.budget"):
        ADTPolicy(budget="cheap")
    with pytest.raises(RuntimeError, match="bind"):
        Eagle2Policy(budget="cost").propose(session(), 3)


def test_cost_model_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    target, drafter = tiny("tiny_llamagen", dtype="float32")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    model = load_or_measure(target, drafter, sp, max_nodes=8, max_level=4, cache_dir=tmp_path)
    files = list((tmp_path / "cost").glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["key"]["rows"] == 2 and data["key"]["dtype"] == "float32" and "threads" in data["key"]
    assert model.verify_nodes[0] == 1 and model.verify_nodes[-1] == 8 and model.level_nodes[-1] == 4
    assert all(t > 0 for t in model.verify_ms + model.level_ms) and model.fixed_ms > 0

    def no_measure(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(cost_mod, "measure_cost", no_measure)
    again = load_or_measure(target, drafter, sp, max_nodes=8, max_level=4, cache_dir=tmp_path)
    assert again.verify_ms == model.verify_ms
    with pytest.raises(AssertionError, match="measured again"):  # a bigger tree than cached → re-measure
        load_or_measure(target, drafter, sp, max_nodes=16, max_level=4, cache_dir=tmp_path)
    # the engine runs normally after measuring (the measurement left no state behind)
    from adtbench.algorithm.engine import decode_ar

    res = decode_ar(target, target.encode_prompt("a red circle", cfg=True), sp, torch.Generator().manual_seed(0))
    assert len(res.tokens) == target.layout.num_gen_tokens


def test_a_cost_model_measured_under_load_is_measured_again_once_the_machine_is_idle(tmp_path, monkeypatch):
    """A cache measured with the load above the cores holds contention's times: re-measured when the load is back
    under the cores, kept (with a warning) while the machine is still busy; one measured idle is always kept."""
    caches = cost_mod
    target, drafter = tiny("tiny_llamagen", dtype="float32")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    first = load_or_measure(target, drafter, sp, max_nodes=4, max_level=2, cache_dir=tmp_path)
    (file,) = (tmp_path / "cost").glob("*.json")
    data = json.loads(file.read_text())
    data["model"]["meta"]["load"] = 9.0
    file.write_text(json.dumps(data))
    fresh = CostModel([1, 4], [1.0, 2.0], [1, 2], [0.2, 0.3], 0.1, {"load": 0.5})
    calls = []
    monkeypatch.setattr(caches, "cpus_available", lambda: 2)
    monkeypatch.setattr(caches, "measure_cost", lambda *a, **k: calls.append(1) or fresh)
    monkeypatch.setattr(caches, "load_average", lambda: [5.0, 5.0, 5.0])  # still busy: keep the cache
    kept = load_or_measure(target, drafter, sp, max_nodes=4, max_level=2, cache_dir=tmp_path)
    assert not calls and kept.verify_ms == first.verify_ms
    monkeypatch.setattr(caches, "load_average", lambda: [0.3, 0.5, 0.5])  # idle now: measure again, re-cache
    again = load_or_measure(target, drafter, sp, max_nodes=4, max_level=2, cache_dir=tmp_path)
    assert calls == [1] and again.verify_ms == [1.0, 2.0]
    assert json.loads(file.read_text())["model"]["meta"]["load"] == 0.5
    load_or_measure(target, drafter, sp, max_nodes=4, max_level=2, cache_dir=tmp_path)  # measured idle: kept
    assert calls == [1]


def test_bind_through_the_policy_config(tmp_path):
    from adtbench.harness.config import build_policy

    target, drafter = tiny("tiny_llamagen", dtype="float32")
    cfg = OmegaConf.create({"policy": {"name": "eagle2", "depth": 2, "top_k": 3, "total_tokens": 8, "budget": "cost"}})
    policy = build_policy(cfg)
    policy.bind(cost_source(target, drafter, SamplingParams(), tmp_path))
    assert policy.cost.tree is not None and max(policy.cost.tree.model.verify_nodes) == 8
    assert synthetic_cost_model().step_ms == pytest.approx(1.02)


def test_calibration_restarts_with_every_image():
    policy = Eagle2Policy(budget="cost")
    policy.cost.tree = TreeBudget(linear_model(0.1))
    policy.cost.tree.observe(predicted=1.0, accepted=9)
    assert policy.cost.tree.c > 1.0
    policy.reset()
    assert policy.cost.tree.c == 1.0


@pytest.mark.parametrize("on_host", [False, True], ids=["device", "host"])
def test_live_rounds_are_decided_before_they_run(on_host):
    """Live rounds (``rounds: auto`` on the CPU) apply the level rule before every round of this cycle, wherever the
    tree is built: with expensive levels not even the image's first cycle expands, with free ones every round
    runs."""
    for level_ms, rounds in ((100.0, 0), (0.0, 3)):
        b = TreeBudget(linear_model(0.01, level=level_ms), calibrate=False)
        assert b.live(torch.device("cpu")) and not b.live(torch.device("cuda"))
        s = session()
        s.on_host = on_host
        tree = build_eagle2_tree(s, depth=3, top_k=3, total_tokens=20, max_depth=5, budget=b)
        assert len(s.expansions) == rounds and tree.drafted_depth == rounds + 1


def test_the_rounds_knob_picks_the_rule_and_is_checked():
    from adtbench import accel, accel_sim

    with accel.simulate():  # the simulated CUDA device plans its rounds, as a GPU does
        assert not TreeBudget(linear_model(0.1)).live(accel_sim.SIM_DEVICE)
    assert TreeBudget(linear_model(0.1), rounds="live").live(torch.device("cuda"))
    assert not TreeBudget(linear_model(0.1), rounds="planned").live(torch.device("cpu"))
    policy = ADTPolicy(rounds="planned")
    policy.bind(lambda n, k: linear_model(0.1))
    assert policy.cost.tree is not None and policy.cost.tree.rounds == "planned"
    for make in (lambda: ADTPolicy(rounds="later"), lambda: Eagle2Policy(budget="cost", rounds="never")):
        with pytest.raises(ConfigError, match=r"policy\.rounds"):
            make()


def _real_session(sp: SamplingParams, on_host: bool, target, drafter, out, root) -> DraftSession:
    return DraftSession(drafter, target, sp, root, 0, target.next_pos.clone(), out, None, on_host)


@pytest.mark.parametrize("rounds", [None, "live", "planned"], ids=["fixed", "live", "planned"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T1"])
def test_host_and_device_eagle2_trees_are_the_same(rounds, temperature):
    """``eagle2_host_steps`` (numpy on host copies: the CPU's default) builds the tree ``eagle2_device_steps`` builds
    (what a GPU runs) — tokens, parents, dead nodes, levels drafted, the budget's N, E_pred and round plan — cycle
    after cycle of a real drafter, with and without a budget, live or planned rounds; depth 0: the root's children
    alone (the host's star fast path), all of them kept or fewer."""
    from adtbench.algorithm.engine import prefill
    from adtbench.algorithm.policies.eagle2 import eagle2_device_steps, eagle2_host_steps

    target, drafter = tiny("tiny_llamagen", dtype="float32")
    sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
    root, _, out = prefill(target, drafter, target.encode_prompt("a red circle", cfg=True), sp, 64, 64, None)
    budgets = [None if rounds is None else TreeBudget(synthetic_cost_model(), rounds=rounds) for _ in range(2)]
    for cycle, (depth, k, total) in enumerate([(3, 4, 20), (3, 4, 30), (2, 6, 12), (4, 3, 40), (0, 5, 6), (0, 5, 4)]):
        trees = []
        for host, b in zip((False, True), budgets):
            s = _real_session(sp, host, target, drafter, out, root)
            steps = (eagle2_host_steps if host else eagle2_device_steps)(
                s, depth, k, total, 5, b, rounds == "live"
            )  # fmt: skip
            trees.append(drive(steps, s))
            drafter.rollback()
        dev, host = trees
        assert dev.tokens.tolist() == host.tokens.tolist() and dev.parent_list == host.parent_list, cycle
        alive = [True] * host.size if host.alive is None else host.alive.tolist()
        # the host builder's own copies (``tree.HostTree``) are what its tensors hold
        assert host.host is not None and host.parent_list == host.parents.tolist() and host.alive_list == alive
        assert host.max_depth == dev.max_depth == max(d for d, a in zip(host.depth.tolist(), alive) if a)
        assert dev.alive is not None and dev.alive.tolist() == alive
        assert dev.drafted_depth == host.drafted_depth and dev.depth.tolist() == host.depth.tolist()
        assert torch.equal(dev.ancestor_mask, host.ancestor_mask)
        assert dev.info.keys() == host.info.keys()
        if rounds is not None:
            assert dev.info["N_cost"] == host.info["N_cost"] and dev.info["E_pred"] == host.info["E_pred"]
            assert budgets[0].next_rounds == budgets[1].next_rounds
            for b, t in zip(budgets, trees):
                b.observe(float(t.info["E_pred"]), 1)
    if rounds == "planned":
        assert budgets[0].next_rounds is not None


def reference_choice(
    b: TreeBudget, pi: np.ndarray, level: np.ndarray, max_n: int, sizes: list[int], K: int, plan: bool
) -> tuple[tuple[int, float], int | None]:
    """``TreeBudget.choose``'s rule written out in plain Python loops from ``cost``'s module docstring: for each
    round count l, the best prefix N ≤ max_n of the candidates of rounds ≤ l (rate (1 + c·Σπ) / (spent(l) +
    t_verify), the first maximum), and the level rule's stop (one more round over the K best round-l candidates
    could add c·Σπ_F for t_level(K) and K nodes; the first l where it would not, else L + 1). Returns ((N, E_pred),
    the next round plan)."""
    tv = b._t_verify_upto(max_n + 1 + K)

    def best(cands: list[float], spent: float) -> tuple[int, float, float]:
        top, cum, out = sorted(cands, reverse=True), 0.0, (0, 0.0, -math.inf)
        for n in range(max_n + 1):
            cum += top[n - 1] if 0 < n <= len(top) else 0.0
            rate = (1.0 + b.c * cum) / (spent + tv[n])
            if rate > out[2]:
                out = (n, cum, rate)
        return out

    if not plan:
        n, cum, _ = best(list(pi[:max_n]), b.spent_ms(sizes))
        return (n, cum), None
    L, stop_at, chosen = len(sizes), None, (0, 0.0)
    for r in range(L + 1):
        spent = b.spent_ms(sizes[:r])
        n, cum, rate = best([p for p, lv in zip(pi, level) if lv <= r], spent)
        chosen = (n, cum)
        f_pi = sum(sorted((p for p, lv in zip(pi, level) if lv == r), reverse=True)[:K])
        more = (1.0 + b.c * cum + b.c * f_pi) / (spent + b.t_level(K) + tv[n + K])
        if stop_at is None and more <= rate:
            stop_at = r
    return chosen, L + 1 if stop_at is None else stop_at  # every round worth it: one more next cycle


def test_choose_follows_the_rule_written_out():
    """``TreeBudget.choose`` (numpy, vectorised over round counts) returns the node count, E_pred and round plan of
    the rule written out in plain loops (``reference_choice``), on random rerank orders of several rounds, with and
    without the plan, under a calibration c ≠ 1."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        L = int(rng.integers(0, 4))
        sizes = [int(rng.integers(1, 6)) for _ in range(L)]
        m = 3 + sum(sizes) * 3
        level = rng.integers(0, L + 1, m)
        pi = np.exp(np.sort(np.log(rng.uniform(1e-4, 1.0, m)))[::-1].copy())
        for plan in (False, True):
            b = TreeBudget(synthetic_cost_model())
            b.observe(float(rng.uniform(0, 3)), trial % 3)  # a calibration c ≠ 1 too
            max_n = int(rng.integers(1, m + 1))
            n, e_pred = b.choose(pi, level, max_n, sizes, 3, plan=plan)
            (n_ref, e_ref), rounds = reference_choice(b, pi, level, max_n, sizes, 3, plan)
            assert n == n_ref and e_pred == pytest.approx(e_ref, rel=1e-12, abs=1e-15), (trial, plan)
            if plan:
                assert b.next_rounds == rounds, (trial, plan)
