"""SJD-PAC (``policy=sjd_pac``, ``algorithm.sjd_pac``): the tree, exactness, the law at T = 1, the authors' variant,
batching, the simulated device, the app.

- the tree: the full K-ary tree of D levels, its main path extended by a chain to L nodes; shared tokens per
  (depth, branch); the extended path the continuation reads;
- T = 0: token-identical to AR greedy for both variants over K, D, L (L below the tree's size, beyond the image,
  the image end), both acceptance paths, random / up init and an adaptive window, an end-of-line layout; K = 1 is
  SCD seed for seed (one algorithm: the tree only adds nodes);
- T = 1: the exact variant's law tests are ``tests/test_laws.py``'s (``sjd_pac-*``: TV ≤ 0.05 detected for the
  headline ``sjd_pac-K2D2-pac``, whose alternatives, continuation, main chain and final-residual bonus are asserted
  to run there, and whose test the planted "q not reduced" rule fails); here, that the K = D = 3 variant's test
  rejects two planted bugs (alternatives drawn with replacement; a redrawn draft left with its old proposal) and
  the authors' variant;
- batched B = 3 equals B = 1 token for token (greedy and seeded T = 1, both variants);
- the simulated CUDA device: one host read per forward (the verdict) and one per image (the kept count), graphs;
- the app: ``run.py policy=sjd_pac`` on the mini model records a summary; config errors name their key; window=cost.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from itertools import product
from pathlib import Path

import pytest
import test_laws as T
import torch
from conftest import batched_against_single, run_in_process, synthetic_cost_model, tiny
from test_jacobi import PROMPTS, compose_run

import adtbench.algorithm.methods.jacobi.calibration as JC
import adtbench.algorithm.methods.jacobi.loop as J
import adtbench.algorithm.methods.sjd_pac as S
from adtbench import accel
from adtbench.algorithm import laws
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.sampling import sample_rows
from adtbench.errors import ConfigError
from adtbench.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
T1 = SamplingParams(temperature=1.0, cfg_scale=3.0)


def policy(**node):
    return POLICIES.build("sjd_pac", node)


# ---------------------------------------------------------------------------------------------------------
# the tree
# ---------------------------------------------------------------------------------------------------------


def test_geometry_is_the_authors_tree() -> None:
    assert S.full_tree_nodes(3, 3) == 13 and S.full_tree_nodes(2, 4) == 15 and S.full_tree_nodes(1, 5) == 5
    assert S.geometry(64, 3, 3) == (54, 2)  # 13 tree nodes + a chain of 51: the main path holds 53 drafts
    assert S.geometry(13, 3, 3) == (3, 2) and S.geometry(12, 3, 3) == (10, 1)  # too small: the tree of 2 levels
    assert S.geometry(3, 3, 3) == (3, 0) and S.geometry(1, 3, 3) == (1, 0)  # below K + 1 nodes: SCD's chain
    assert S.geometry(16, 1, 3) == (16, 0)


def test_tree_shape_shares_tokens_by_depth_and_branch() -> None:
    m, t, K = 5, 2, 3
    sh = S.tree_shape(m, t, K, torch.device("cpu"))
    assert sh.size == 13 + (m - t)
    par, depth, src = sh.parents.tolist(), sh.depth.tolist(), sh.src.tolist()
    assert par[: m + 1] == list(range(-1, m)) and all(par[j] < j for j in range(1, sh.size))
    # every node at depth d with branch b reads the same source slot (branch 0: the main path's token)
    by_slot = Counter((depth[j], src[j]) for j in range(1, sh.size))
    assert all(d <= t or n == 1 for (d, _), n in by_slot.items())
    assert sorted(n for (d, _), n in by_slot.items() if d == 2) == [3, 3, 3]  # 9 nodes, 3 tokens
    assert {s for j, s in enumerate(src) if depth[j] == 1} == {1, m + 1, m + 2}
    # children in branch order; the main path's child is its branch 0
    ranks = sh.ranks.tolist()
    assert ranks[0] == [1, m + 1, m + 2] and ranks[t][0] == t + 1 and ranks[m] == [-1] * K
    # the extended path: u's path, branch 0 down, then the main chain
    ext = sh.ext.tolist()
    assert ext[0] == list(range(m + 1)) and ext[m + 1][:2] == [0, m + 1]
    leaf = max(j for j in range(sh.size) if depth[j] == t and j > m)
    assert ext[leaf][t] == leaf and ext[leaf][t + 1 :] == list(range(t + 1, m + 1))


def test_device_shapes_equal_the_host_builder() -> None:
    """``tree_shape`` (derived on the device from the bare tree) equals ``host_tree_shape`` (node by node)."""
    for K, t, m in ((2, 1, 1), (2, 1, 4), (3, 2, 2), (3, 2, 7), (4, 3, 9), (2, 4, 4), (2, 4, 12)):
        sh, ref = S.tree_shape(m, t, K, torch.device("cpu")), S.host_tree_shape(m, t, K)
        for name, want in ref.items():
            assert getattr(sh, name).tolist() == want.tolist(), (K, t, m, name)


# ---------------------------------------------------------------------------------------------------------
# T = 0: AR greedy, token for token
# ---------------------------------------------------------------------------------------------------------

GREEDY_CASES = [(3, 3, 16), (3, 3, 13), (3, 3, 12), (2, 3, 5), (2, 4, 20), (4, 2, 64), (3, 3, 1), (3, 3, 3)]


def test_greedy_equals_ar() -> None:
    """Both variants, (K, D, L) with L = the tree's size, below it (a shallower tree, or SCD's chain), beyond the
    16-token image (the image end caps the main path and the tree), acceptance on the host and on the device; the
    up init and an adaptive window."""
    target, _ = tiny("tiny_llamagen")
    for prompt in PROMPTS[:2]:
        inputs = target.encode_prompt(prompt, cfg=True)
        ar = decode_ar(target, inputs, GREEDY, None)
        for (K, D, L), variant, where in product(GREEDY_CASES, S.VARIANTS, ("host", "device")):
            pol = policy(window=L, branch=K, tree_depth=D, variant=variant)
            res = generate(target, None, pol, inputs, GREEDY, torch.Generator().manual_seed(1), acceptance=where)
            assert res.tokens == ar.tokens, (prompt, K, D, L, variant, where)
            assert sum(res.stats["accept_hist"]) == len(res.cycles) == res.stats["target_forwards"]
            assert all(c.nodes <= L and c.accepted < c.nodes for c in res.cycles)
        for node in ({"init": "up"}, {"window": "adaptive", "window_min": 4, "window_max": 20}):
            res = generate(target, None, policy(**node), inputs, GREEDY, None, acceptance="device")
            assert res.tokens == ar.tokens, node


def test_eol_layout_greedy_and_forced_tokens() -> None:
    """Lumina's end-of-line / end-of-image layout on the tiny LlamaGen (3 rows of 4 codes + EOL, then EOI): greedy
    equals AR; at T = 1 every forced token stays in place, the authors' uniform fill included."""
    target, _ = tiny("tiny_llamagen")
    target.layout = dataclasses.replace(target.layout, num_codes=60, grid_h=3, grid_w=4, eol_token=61, eoi_token=62)
    inputs = target.encode_prompt("a red cat on a mat", cfg=True)
    ar = decode_ar(target, inputs, GREEDY, None)
    forced = {g: f for g in range(16) if (f := target.layout.forced_token(g)) >= 0}
    for (K, D, L), variant in product(((3, 3, 13), (2, 3, 6), (3, 2, 9)), S.VARIANTS):
        pol = policy(window=L, branch=K, tree_depth=D, variant=variant)
        assert generate(target, None, pol, inputs, GREEDY, None).tokens == ar.tokens
        for seed in range(3):
            res = generate(target, None, pol, inputs, SamplingParams(1.0, 20, 1.0, 3.0),
                           torch.Generator().manual_seed(seed))  # fmt: skip
            assert all(res.tokens[g] == f for g, f in forced.items()) and res.committed == 15


def test_branch_one_is_scd_seed_for_seed() -> None:
    """K = 1 (or D = 1): no alternatives, the tree is the chain — SCD with random init, the same draws."""
    target, _ = tiny("tiny_llamagen")
    inputs = target.encode_prompt(PROMPTS[1], cfg=True)
    scd = POLICIES.build("scd", {"window": 7, "init": "random"})
    for node, where in product(({"branch": 1}, {"tree_depth": 1}), ("host", "device")):
        for seed in range(3):
            a = generate(target, None, scd, inputs, T1, torch.Generator().manual_seed(seed), acceptance=where)
            b = generate(target, None, policy(window=7, **node), inputs, T1, torch.Generator().manual_seed(seed),
                         acceptance=where)  # fmt: skip
            assert a.tokens == b.tokens and a.stats["kept"] == b.stats["kept"], (node, where, seed)


# ---------------------------------------------------------------------------------------------------------
# T = 1: the joint law of a whole image
# ---------------------------------------------------------------------------------------------------------

PLANTED_N = 1000  # the planted bugs and the authors' variant fail at p < 1e-40 at 2000 (measured): half is plenty
PAC = "sjd_pac-K3D3-t1"
PAC_LEFT = "sjd_pac-left-device-t1"
NODES = {
    PAC: {"window": 16, "branch": 3, "tree_depth": 3},
    PAC_LEFT: {"window": 16, "branch": 3, "tree_depth": 3, "init": "left"},
}  # test_laws.py's cases


def pac_law(name: str, n: int, record, **node):
    """``tests/test_laws.py``'s law test of case ``name`` (its setup, path and N unless ``n``), the policy node
    updated by ``node``: (result, drafts accepted per image, commits off the main path per image)."""
    setup, _, aux, rule_of, where, slots = T.ALL[name][0]
    case = (setup, lambda: policy(**{**NODES[name], **node}), aux, rule_of, where, slots)
    counts, accepted, off = T.sample_images(case, n, stat="off_main")
    return laws.report(laws.chi2_law(name, counts, T.setup_of(setup).law, n), record), accepted, off


@pytest.mark.slow
def test_sampling_law_rejects_planted_bugs(monkeypatch: pytest.MonkeyPatch, record_property) -> None:
    """The harness's law test (``PLANTED_N`` images) fails (1) when the alternatives are drawn *with* replacement
    from q (branch 0 not removed: the verifier's without-replacement q_k is then the wrong proposal) and (2) when a
    coupled redraw leaves the redrawn draft with its old proposal instead of q := p (left init: a point mass)."""

    def with_replacement(self, dist, lo):
        draws = torch.stack([sample_rows(dist, self.generator) for _ in range(self.K - 1)], 1)
        return draws, torch.ones_like(draws, dtype=torch.bool)

    with monkeypatch.context() as mp:
        mp.setattr(S.SJDPACState, "alternatives", with_replacement)
        r, *_ = pac_law(PAC, PLANTED_N, record_property)
        assert r.pvalue < 1e-3, r.line()
    redraw = J.redraw

    def q_old_kept(kind, probs, old, q_old, has_old, generator, noise=None):
        tok, q, keep = redraw(kind, probs, old, q_old, has_old, generator, noise)
        return tok, torch.where(has_old[:, None], q_old, q), keep

    monkeypatch.setattr(J, "redraw", q_old_kept)
    r, *_ = pac_law(PAC_LEFT, PLANTED_N, record_property)
    assert r.pvalue < 1e-3, r.line()


@pytest.mark.slow
def test_the_authors_variant_is_not_ar(record_property) -> None:
    """The authors' variant (longest accepted row, residual-drawn alternatives, the uniform fill) on the same
    harness: its law is not AR's (χ² p < 1e-3 at ``PLANTED_N``). Measured over 20 000 images of the earlier 4-code
    setup, device acceptance (docs/methods.md, "SJD-PAC"): joint TV from AR's law 0.147 (the exact variant's, the
    sampling noise at that size: 0.039), the last token's marginal TV 0.055 (exact: 0.004) — the uniform fill after
    a full accept."""
    r, *_ = pac_law(PAC, PLANTED_N, record_property, variant="authors")
    assert r.pvalue < 1e-3, r.line()
    assert not policy(variant="authors").lossless and policy().lossless


# ---------------------------------------------------------------------------------------------------------
# batched: a ragged tree per slot
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sp", [GREEDY, SamplingParams(temperature=1.0, top_k=20, cfg_scale=3.0)], ids=["T0", "T1"])
def test_batched_equals_single(sp: SamplingParams) -> None:
    target, _ = tiny("tiny_llamagen")
    prompts = [*PROMPTS, "green", "a large yellow star on a mat"]
    inputs = [target.encode_prompt(p, cfg=True) for p in prompts]
    for node, where in (({"window": 13}, "host"), ({"window": 9, "branch": 2, "variant": "authors"}, "device"),
                        ({"window": 16, "init": "up"}, "device")):  # fmt: skip
        pol = policy(**node)
        single, got = batched_against_single(target, pol, inputs, sp, where)
        assert [got[i].tokens for i in range(len(prompts))] == single, (node, where)
        assert sum(got[i].stats["off_main"] for i in got) > 0 or sp.greedy  # slots committed off the main path


# ---------------------------------------------------------------------------------------------------------
# the simulated CUDA device
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", S.VARIANTS)
def test_a_forward_reads_the_device_once(tmp_path: Path, variant: str) -> None:
    """``bench overhead`` on the simulated device: one read per forward (the tree's verdict) and one per image (the
    kept count), as SCD (tests/test_bench_device.py)."""
    from test_bench_device import TINY

    from adtbench.tools.bench import main as bench_main

    with accel.simulate():
        out = tmp_path / "o.json"
        args = ["overhead", *TINY, "policy=sjd_pac", "policy.window=16", f"policy.variant={variant}"]
        assert bench_main([*args, "bench.prompts=2", f"bench.out={out}"]) == 0
    r = json.loads(out.read_text())
    assert r["syncs_per_cycle"] == pytest.approx(1.0 + r["prompts"] / r["cycles"])
    sites = {site.rsplit(" in ", 1)[1] for site in r["sync_sites_per_cycle"]}
    assert sites <= {"read_chain", "read_verdicts", "stats"} and "read_verdicts" in sites


@pytest.mark.slow
def test_the_app_runs_graphed_on_the_simulated_device(tmp_path: Path) -> None:
    """``engine.compile=true`` on the simulated device, single and batched: the trees run through the captured
    verify buckets."""
    from test_simulated import FAST, _compose

    from adtbench.harness.app import run

    for extra in ([], ["decode.batch_size=2", "decode.window=1", "dataset.limit=3"]):
        cfg = _compose(["model=tiny_llamagen", "dataset=smoke", *FAST, "engine.compile=true", "policy=sjd_pac",
                        "policy.window=16", *extra])  # fmt: skip
        with accel.simulate() as sim:
            summary = run(cfg, tmp_path / f"run{len(extra)}", {})
        assert summary["n_samples"] >= 1 and sim.counts["graph_replays"] > 0
        assert summary["jacobi"]["variant"] == "exact" and summary["jacobi"]["branch"] == 3


# ---------------------------------------------------------------------------------------------------------
# the app, the keys
# ---------------------------------------------------------------------------------------------------------


def test_the_command_line_records_a_summary_on_mini(tmp_path: Path) -> None:
    """``python run.py policy=sjd_pac`` (the mini model, its held-out prompts): records with the tree's counters."""
    out = tmp_path / "run"
    proc = run_in_process("policy=sjd_pac", "dataset.limit=1", "warmup=0", "save_images=false", "maps.per_run=false",
                          "progress=false", f"hydra.run.dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["policy"] == "sjd_pac" and s["n_samples"] == 1 and s["tau"] > 2
    jac = s["jacobi"]
    assert (jac["window"], jac["branch"], jac["tree_depth"], jac["variant"]) == (64, 3, 3, "exact")
    rec = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert sum(rec["stats"]["accept_hist"]) == rec["cycles"] and rec["stats"]["off_main"] >= 0
    trace = [json.loads(x) for x in (out / "trace.jsonl").read_text().splitlines()]
    assert trace[0]["nodes"][0] == 64 and trace[0]["K"][0] == 3  # one line per image, a value per forward


def test_cost_window_calibrates_the_tree() -> None:
    target, _ = tiny("tiny_llamagen")
    inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS[:2]]
    params = policy(window="cost", window_min=4, window_max=16).params
    out = JC.calibrate_window(target, inputs, T1, params, synthetic_cost_model(), torch.Generator().manual_seed(3))
    assert set(out["taus"]) == {4, 6, 8, 12, 16} and out["L"] in out["taus"]
    res = J.decode_jacobi(target, inputs[0], GREEDY, None, params, window=out["L"])
    assert res.tokens == decode_ar(target, inputs[0], GREEDY, None).tokens


def test_app_cost_window(tmp_path: Path) -> None:
    """``policy.window=cost`` through the app: calibrated on the cost model, cached under the tree's keys."""
    from adtbench.harness.app import run

    cfg = compose_run("policy=sjd_pac", "policy.window=cost", "policy.window_min=4", "policy.window_max=16",
                      "dataset.limit=1", f"paths.cache_dir={tmp_path / 'cache'}")  # fmt: skip
    summary = run(cfg, tmp_path / "run", {})
    assert summary["jacobi"]["window"] == "cost" and 4 <= summary["jacobi"]["window_mean"] <= 16
    (cached,) = (tmp_path / "cache" / "jacobi").glob("*.json")
    assert json.loads(cached.read_text())["key"]["policy"]["branch"] == 3


@pytest.mark.parametrize(
    "node,key",
    [
        ({"branch": 0}, "policy.branch"),
        ({"tree_depth": 1.5}, "policy.tree_depth"),
        ({"variant": "paper"}, "policy.variant"),
        ({"redraw": "independent"}, "policy.redraw"),
        ({"rule": "gsd"}, "policy.rule"),
        ({"init": "drafter"}, "policy.init"),
        ({"window": 0}, "policy.window"),
    ],
)
def test_bad_keys_name_the_key(node: dict, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        policy(**node)
    assert e.value.key == key


def test_app_refuses_lantern_and_unknown_keys(tmp_path: Path) -> None:
    from adtbench.harness.app import run

    for overrides, key in ((("policy=sjd_pac", "lantern=on"), "lantern.enabled"),
                           (("policy=sjd_pac", "+policy.bogus=1"), "policy.bogus"),
                           (("policy=sjd_pac", "policy.branch=-1"), "policy.branch")):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            run(compose_run(*overrides), tmp_path / "x", {})
        assert e.value.key == key
