"""Jacobi decoding (``policy=sjd|scd|gsd``, ``methods.jacobi.loop``): exactness, the law at T = 1, batching, the app.

- T = 0: token-identical to AR greedy for every redraw × init × window (fixed, adaptive, a calibrated cost window),
  acceptance on the device and as the host walk, CFG rows, an end-of-line layout (Lumina) with forced tokens;
- T = 1: the law tests (``sjd`` / ``scd`` with every init, redraw and proposal, longer images, T ≠ 1 / top-k / top-p,
  the end-of-line layout; the SCD authors' stored proposal and the other planted failure modes rejected) are
  ``tests/test_laws.py``'s, at stated power;
- batched: B = 3 slots with ragged windows equal B = 1 token for token (greedy and seeded T = 1, both acceptance
  paths);
- GSD's grouped rule: vectorised = a per-row reference loop; an empty group is the exact rule;
- window sizing: the adaptive rule, the calibrated cost window;
- the app: records (τ, window, accepted-length histogram, init), the summary's ``jacobi`` block, config errors
  naming their key.
"""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import pytest
import torch
from conftest import TINY_OVERRIDES, batched_against_single, synthetic_cost_model, tiny

import adtbench.algorithm.methods.jacobi.calibration as JC
import adtbench.algorithm.methods.jacobi.draws as JD
import adtbench.algorithm.methods.jacobi.loop as J
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.gsd import GroupedRule
from adtbench.algorithm.methods.jacobi.calibration import calibrate_window
from adtbench.algorithm.methods.jacobi.loop import INITS, jacobi_params
from adtbench.algorithm.methods.jacobi.windows import AdaptiveWindow
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.policies.jacobi import JacobiModels
from adtbench.algorithm.sampling import exponentials
from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.batch import BatchTarget
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
PROMPTS = ["a red circle", "two blue squares on a striped floor", "a cat"]


def policy(name: str, **node):
    return POLICIES.build(name, node)


# ---------------------------------------------------------------------------------------------------------
# T = 0: AR greedy, token for token
# ---------------------------------------------------------------------------------------------------------


def test_greedy_equals_ar_every_variant() -> None:
    target, drafter = tiny("tiny_llamagen")
    aux = JacobiModels(drafter, window=5)
    for prompt in PROMPTS[:2]:
        inputs = target.encode_prompt(prompt, cfg=True)
        ar = decode_ar(target, inputs, GREEDY, None)
        cases = product(("sjd", "scd", "gsd"), ("random", "left", "up", "drafter"), (1, 3, 16, "adaptive", "cost"))
        for (name, init, window), where in product(cases, ("host", "device")):
            if init == "drafter" and window == "adaptive":
                continue
            res = generate(target, aux, policy(name, window=window, init=init, window_min=2, window_max=9), inputs,
                           GREEDY, torch.Generator().manual_seed(1), acceptance=where)  # fmt: skip
            assert res.tokens == ar.tokens, (prompt, name, init, window, where)
            assert res.committed == len(ar.tokens) - 1 and len(res.cycles) == res.stats["target_forwards"]
            assert sum(res.stats["accept_hist"]) == len(res.cycles)
            assert all(c.nodes <= 16 and c.accepted < c.nodes for c in res.cycles)
        for redraw, proposal in (("gumbel", "uniform"), ("gumbel", "point"), ("coupled", "point")):
            pol = policy("scd", window=4, init="random", redraw=redraw, proposal=proposal)
            res = generate(target, None, pol, inputs, GREEDY, torch.Generator().manual_seed(1))
            assert res.tokens == ar.tokens, (prompt, redraw, proposal)


def test_eol_layout_greedy_and_forced_tokens() -> None:
    """An end-of-line / end-of-image layout (Lumina's, on the tiny LlamaGen: 3 rows of 4 codes + EOL, then EOI =
    its 16 positions): greedy equals AR; sampled windows keep every forced token in place."""
    import dataclasses

    target, _ = tiny("tiny_llamagen")
    target.layout = dataclasses.replace(target.layout, num_codes=60, grid_h=3, grid_w=4, eol_token=61, eoi_token=62)
    lay = target.layout
    assert lay.num_gen_tokens == 16
    inputs = target.encode_prompt("a red cat on a mat", cfg=True)
    ar = decode_ar(target, inputs, GREEDY, None)
    forced = {g: f for g in range(16) if (f := lay.forced_token(g)) >= 0}
    assert forced == {4: 61, 9: 61, 14: 61, 15: 62} and all(ar.tokens[g] == f for g, f in forced.items())
    for init, window in product(("random", "left", "up"), (4, 9)):
        pol = policy("scd", window=window, init=init)
        assert generate(target, None, pol, inputs, GREEDY, torch.Generator().manual_seed(0)).tokens == ar.tokens
        res = generate(target, None, pol, inputs, SamplingParams(1.0, 20, 1.0, 3.0), torch.Generator().manual_seed(0))
        assert all(res.tokens[g] == f for g, f in forced.items()) and res.committed == 15


def test_init_sources_left_and_up() -> None:
    lay = TokenLayout(vocab_size=20, image_token_offset=0, num_codes=16, grid_h=4, grid_w=3, eol_token=17,
                      eoi_token=18)  # fmt: skip
    tables = JD.layout_tables(lay, torch.device("cpu"), torch.float32, 8)
    assert tables.forced[:8].tolist() == [-1, -1, -1, 17, -1, -1, -1, 17]
    # s = 4 (row 1, col 0): left skips the end-of-line column 3; up reads column c one row up, then the row above it
    assert JD.init_sources(lay, tables, 4, 6, "left").tolist() == [2] * 6
    assert JD.init_sources(lay, tables, 4, 6, "up").tolist() == [0, 1, 2, 3, 0, 1]
    assert JD.init_sources(lay, tables, 1, 3, "up").tolist() == [0, 0, 0]  # the first row: the left neighbour


# T = 1: the joint law of whole images, every init / redraw / proposal / window, the planted failure modes and
# their power: tests/test_laws.py (the harness: adtbench/algorithm/laws.py)


# ---------------------------------------------------------------------------------------------------------
# batched: a ragged window per slot
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sp", [GREEDY, SamplingParams(temperature=1.0, top_k=20, cfg_scale=3.0)], ids=["T0", "T1"])
def test_batched_equals_single(sp: SamplingParams) -> None:
    target, _ = tiny("tiny_llamagen")
    prompts = [*PROMPTS, "green", "a large yellow star on a mat"]
    inputs = [target.encode_prompt(p, cfg=True) for p in prompts]
    nodes = (
        ({"window": 6, "init": "up"}, "host"),
        ({"window": "adaptive", "window_min": 2}, "device"),
        ({"window": 5, "init": "random", "redraw": "gumbel", "proposal": "point"}, "device"),
    )
    for node, where in nodes:
        pol = policy("scd", **node)
        single, got = batched_against_single(target, pol, inputs, sp, where)
        assert [got[i].tokens for i in range(len(prompts))] == single, (node, where)
        assert len({len(got[i].cycles) for i in got}) > 1 or sp.greedy  # ragged: slots advance by their own a


def test_device_discipline(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tests/test_device_discipline.py``'s watcher over the Jacobi loops (B = 1 and batched, every init, greedy and
    T = 1, acceptance on the device): every tensor of the loop born with ``device=``, every draw on its generator's."""
    import test_device_discipline as D

    files = ("loop", "draws", "drafter", "batch")
    monkeypatch.setattr(D, "LOOP", [*D.LOOP, *(D.PKG / "algorithm" / "methods" / "jacobi" / f"{m}.py" for m in files)])
    target, drafter = tiny("tiny_llamagen", dtype="float32")
    inputs = target.encode_prompt("a red circle", cfg=True)
    with D.Watcher() as w:
        for temperature, (name, init) in product((0.0, 1.0), product(("sjd", "scd", "gsd"), INITS)):
            sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
            pol = policy(name, window="adaptive" if init == "up" else 5, init=init, window_min=2, window_max=6)
            generate(target, JacobiModels(drafter), pol, inputs, sp, torch.Generator().manual_seed(0), None, "device")
            if init != "drafter":
                bt = BatchTarget(target, 2, True, 64 + target.layout.num_gen_tokens)
                items = [(i, inputs, torch.Generator().manual_seed(i)) for i in range(3)]
                pol.generate_batch(bt, None, items, sp, lambda k, r: None, None, "device")
        gumbel = policy("scd", window=5, init="random", redraw="gumbel", proposal="point")
        generate(target, None, gumbel, inputs, sp, torch.Generator().manual_seed(0), None, "device")
    assert w.violations == [], "\n".join(sorted(set(w.violations)))


def test_chain_walk_equals_the_node_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """``verify._chain_proposal`` (a chain's exact proposal walk, all nodes at once) takes the node-by-node walk's
    decisions seed for seed (the same uniforms, the same bonus draw)."""
    import adtbench.algorithm.verify as V
    from adtbench.algorithm.tree import DraftTree

    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n, Vn = 1 + trial % 7, 6
        p = torch.randn(n, Vn, generator=g, dtype=torch.float64) * 2
        q = torch.softmax(torch.randn(n, Vn, generator=g, dtype=torch.float64) * 2, -1)
        if trial % 3 == 0:  # point masses (the left / up inits)
            q = torch.nn.functional.one_hot(torch.randint(0, Vn, (n,), generator=g), Vn).to(torch.float64)
        tokens = torch.cat([torch.tensor([0]), torch.multinomial(q[: n - 1], 1, generator=g)[:, 0]])
        tree = DraftTree(tokens, list(range(-1, n - 1)), n - 1, 1, q)
        fast = V.verify_tree(tree, p, False, torch.Generator().manual_seed(trial))
        with monkeypatch.context() as mp:
            mp.setattr(V, "_chain_proposal", None)  # the node walk: the fast path's condition now fails on the call
            mp.setattr(tree, "_max_children", 2)
            slow = V.verify_tree(tree, p, False, torch.Generator().manual_seed(trial))
        assert fast == slow, trial


# ---------------------------------------------------------------------------------------------------------
# GSD's grouped rule, window sizing
# ---------------------------------------------------------------------------------------------------------


def grouped_reference(rule: GroupedRule, p: torch.Tensor, x: int, q: torch.Tensor) -> float:
    """GSD's acceptance on one row, the reference's way: sort, x's rank, the ±half window, the two filters."""
    order = sorted(range(p.numel()), key=lambda i: (-float(p[i]), i))
    r = order.index(x)
    group = []
    for y in order[max(0, r - rule.above) : r + rule.below + 1]:
        close = abs(float(p[y] - p[x])) < rule.gap
        near = float(((rule.emb[y - rule.offset] - rule.emb[x - rule.offset]) ** 2).sum()) < rule.dist
        if y == x or (close and near and 0 <= y - rule.offset < rule.codes):
            group.append(y)
    return min(1.0, sum(float(p[y]) for y in group) / sum(float(q[y]) for y in group))


def test_grouped_rule_vectorised_equals_reference() -> None:
    g = torch.Generator().manual_seed(0)
    V, m = 40, 12
    emb = torch.randn(V, 3, generator=g, dtype=torch.float64) * 0.4
    p = torch.softmax(torch.randn(m, V, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(m, V, generator=g, dtype=torch.float64), -1)
    x = torch.randint(0, V, (m,), generator=g)
    px, qx = p.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0]
    for size, gap, dist in ((14, 0.15, 0.5), (15, 0.15, 0.5), (6, 1.0, 10.0), (7, 1.0, 10.0), (1, 0.15, 0.5)):
        rule = GroupedRule(emb, 0, size, gap, dist)
        assert rule.below + rule.above + 1 == size
        acc, residual = rule.proposal_rows(p, x, q, px, qx)
        assert torch.allclose(residual, (p - q).clamp_min(0))
        ref = torch.tensor([grouped_reference(rule, p[i], int(x[i]), q[i]) for i in range(m)], dtype=torch.float64)
        assert torch.allclose(acc, ref), (size, gap, dist)
    exact = (px / qx).clamp_max(1.0)
    for size in (0, 1):
        assert torch.allclose(GroupedRule(emb, 0, size, 0.15, 0.5).proposal_rows(p, x, q, px, qx)[0], exact)
    assert not GroupedRule(emb, 0, 14, 0.15, 0.5).lossless


def test_grouped_rule_window_is_the_references_slice() -> None:
    """At size 14 the window is the GSD reference's slice of an ascending sort, ``[r − 7, r + 7)``: the 7 tokens of
    next-lower probability, x and the 6 of next-higher (14 ranks, not 15)."""
    V = 30
    p = torch.softmax(torch.linspace(-3.0, 3.0, V, dtype=torch.float64), -1)[None]  # p increasing in the id
    x = torch.tensor([15])
    q = torch.full((1, V), 1.0 / V, dtype=torch.float64)
    emb = torch.zeros(V, 2, dtype=torch.float64)  # every token near every other
    rule = GroupedRule(emb, 0, 14, 1.0, 1.0)  # no probability gap filter either: the group is the rank window
    acc, _ = rule.proposal_rows(p, x, q, p[:, 15], q[:, 15])
    ascending = p[0].argsort()
    r = int((ascending == 15).nonzero())
    window = ascending[r - 7 : r + 7]
    assert sorted(window.tolist()) == list(range(8, 22))
    assert torch.allclose(acc, (p[0, window].sum() / q[0, window].sum()).clamp_max(1.0).view(1))


def test_adaptive_window_grows_where_runs_above_were_long() -> None:
    w = AdaptiveWindow(lo=4, hi=32, margin=8, row_len=16, n_gen=256)
    assert w.size(0) == 9  # nothing above, no run of its own: 1 + margin
    w.observe(0, 15, 15)  # one forward committed 0 … 15: a flat row
    assert w.size(16) == 24  # the run of 16 above + 8
    for g in range(16, 21):  # runs of one token
        w.observe(g, 15, 0)
    assert w.size(36) == 9  # above 37 ± 2: runs of 1
    assert w.size(20) == 24  # its first draft 21 sits below 5, committed in the run of 16
    w.reset()
    assert w.size(16) == 8  # nothing recorded above: margin alone (≥ window_min)


def test_calibrated_cost_window() -> None:
    """``window: cost``: τ(L) measured per L, rate = τ / (t_verify(L) + o); deterministic (no clock in τ)."""
    target, _ = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS[:2]]
    params = jacobi_params({"window": "cost", "window_min": 2, "window_max": 12, "redraw": "coupled"})
    cost = synthetic_cost_model()
    out = calibrate_window(target, inputs, sp, params, cost, torch.Generator().manual_seed(3))
    assert set(out["taus"]) == {4, 6, 8, 12} and out["L"] in out["taus"]
    assert out["rates"][out["L"]] == max(out["rates"].values())
    fit = [out["fit"][L] for L in sorted(out["fit"])]
    assert fit == sorted(fit) and sum(fit) == pytest.approx(sum(out["taus"].values()))  # isotonic: means of blocks
    for L, tau in out["fit"].items():
        assert out["rates"][L] == pytest.approx(tau * cost.step_ms / (float(cost.t_verify(L)) + 0.3 * cost.step_ms))
    assert calibrate_window(target, inputs, sp, params, cost, torch.Generator())["taus"] == out["taus"]
    assert JC.isotonic([3.0, 1.0, 2.0, 5.0, 4.0]) == [2.0, 2.0, 2.0, 4.5, 4.5]
    # ``calibration_tokens``: each calibration decode stops once that many tokens are committed
    short = jacobi_params({"window": 4, "calibration_tokens": 5})
    n = target.layout.num_gen_tokens
    assert n > 5 + 4
    res = J.decode_jacobi(target, inputs[0], sp, torch.Generator().manual_seed(0), short, limit=5)
    assert 5 <= len(res.tokens) < 5 + 4 and len(res.tokens) == res.committed + 1  # + the prefill's first token
    full = J.decode_jacobi(target, inputs[0], sp, torch.Generator().manual_seed(0), short)
    assert len(full.tokens) == n and full.tokens[: len(res.tokens)] == res.tokens  # the same decode, cut short


def test_params_name_their_key() -> None:
    for node, key in (({"window": 0}, "policy.window"), ({"window": "fast"}, "policy.window"),
                      ({"init": "diagonal"}, "policy.init"), ({"redraw": "maybe"}, "policy.redraw"),
                      ({"window_min": 9, "window_max": 4}, "policy.window_max"), ({"rule": "lantern"}, "policy.rule"),
                      ({"group_dist": -1.0}, "policy.group_dist"),
                      ({"proposal": "onehot"}, "policy.proposal")):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            policy("scd", **node)
        assert e.value.key == key, node
    assert policy("sjd").params.redraw == "independent" and policy("scd").params.redraw == "coupled"
    gsd = policy("gsd")
    assert gsd.params.rule == "gsd" and not gsd.lossless and not gsd.accepts_rule and policy("scd").lossless


# ---------------------------------------------------------------------------------------------------------
# the app
# ---------------------------------------------------------------------------------------------------------


def compose_run(*overrides: str):
    from hydra import compose, initialize_config_dir

    from adtbench.harness.config import register_resolvers

    register_resolvers()
    fast = ["warmup=0", "progress=false", "maps.per_run=false", "save_images=false"]
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=[*TINY_OVERRIDES, *fast, *overrides])


@pytest.mark.slow
def test_app_records_and_cost_window(tmp_path: Path) -> None:
    from adtbench.harness.app import run

    cfg = compose_run("policy=scd", "policy.window=cost", "policy.window_min=2", "policy.window_max=8",
                      "policy.init=up", "dataset.limit=2", f"paths.cache_dir={tmp_path / 'cache'}",
                      "model.dtype=float64")  # fmt: skip
    out = tmp_path / "run"
    summary = run(cfg, out, {"model": "tiny_llamagen", "policy": "scd"})
    recs = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and list((tmp_path / "cache" / "jacobi").glob("*.json"))
    for r in recs:
        st = r["stats"]
        assert st["window"] == "cost" and st["init"] == "up" and st["redraw"] == "coupled"
        assert sum(st["accept_hist"]) == r["cycles"] == st["target_forwards"]
        assert r["committed"] == 15 and r["tau"] == pytest.approx(15 / r["cycles"])
        assert 2 <= st["window_mean"] <= 8
    jac = summary["jacobi"]
    assert jac["init"] == "up" and sum(jac["accept_hist"]) == summary["cycles_total"]
    trace = [json.loads(x) for x in (out / "trace.jsonl").read_text().splitlines()]
    assert trace[0]["L"] == trace[0]["nodes"]
    # batched, a ragged window per slot, equal to the B = 1 run above: sampled tokens compared across matmul shapes
    # (B = 2 against B = 1), so float64, where no CPU's rounding moves a draw
    out2 = tmp_path / "batched"
    cfg2 = compose_run("policy=scd", "policy.window=cost", "policy.window_min=2", "policy.window_max=8",
                       "policy.init=up", "dataset.limit=2", f"paths.cache_dir={tmp_path / 'cache'}",
                       "decode.batch_size=2", "model.dtype=float64")  # fmt: skip
    run(cfg2, out2, {"model": "tiny_llamagen", "policy": "scd"})
    recs2 = [json.loads(x) for x in (out2 / "samples.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in recs2] == [r["tokens"] for r in recs]


@pytest.mark.parametrize(
    "overrides,key",
    [
        (("policy=gsd", "lantern=on"), "lantern.enabled"),
        (("policy=scd", "policy.window=0"), "policy.window"),
        (("policy=scd", "policy.init=drafter", "drafter=none"), "policy.init"),
        (("policy=scd", "policy.init=drafter", "decode.batch_size=2"), "policy.init"),
        (("policy=sjd", "+policy.bogus=1"), "policy.bogus"),
    ],
)
def test_app_bad_config_names_the_key(tmp_path: Path, overrides: tuple[str, ...], key: str) -> None:
    from adtbench.harness.app import run

    with pytest.raises(ConfigError) as e:
        run(compose_run(*overrides), tmp_path / "x", {})
    assert e.value.key == key


def test_lantern_composes_with_scd() -> None:
    """LANTERN relaxes the acceptance of ``scd`` (its rule is the app's): the config passes and the rule is used."""
    from adtbench.harness.config import validate

    pol = validate(compose_run("policy=scd", "lantern=on")).policy
    assert pol.accepts_rule and pol.rule_for(None, "lantern-rule") == "lantern-rule" and pol.max_nodes() == 16


def test_gumbel_redraw_keeps_the_noise_of_its_position() -> None:
    """``redraw: gumbel``: a position's Exp(1) row is drawn once and follows the position as the root moves (rows
    shift by the committed count), so a redraw under an unchanged p repeats the old draft; the coupling keeps far
    more drafts than independent redraws do (``kept`` counts the old draft winning again)."""
    probs = torch.softmax(torch.randn(3, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    noise = exponentials((3, 12), torch.Generator().manual_seed(1), probs.device)
    first, _, _ = JD.redraw("gumbel", probs, torch.zeros(3, dtype=torch.long), probs, torch.zeros(3, dtype=torch.bool),
                           None, noise)  # fmt: skip
    again, q, kept = JD.redraw("gumbel", probs, first, probs, torch.ones(3, dtype=torch.bool), None, noise)
    assert torch.equal(again, first) and bool(kept.all()) and q is probs
    assert torch.equal(first, (probs / noise).argmax(-1))
    target, _ = tiny("tiny_llamagen")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = target.encode_prompt(PROMPTS[0], cfg=True)
    frac = {}
    for redraw in ("gumbel", "coupled"):
        res = generate(target, None, policy("scd", window=6, init="random", redraw=redraw, proposal="point"), inputs,
                       sp, torch.Generator().manual_seed(2))  # fmt: skip
        assert res.stats["redraw"] == redraw and res.stats["coupled"] > 0
        frac[redraw] = res.stats["kept_frac"]
    assert frac["gumbel"] > 0.2, frac
