"""Every option on a GPU (``@pytest.mark.gpu``; skipped without CUDA): the lean forward, every policy × exact /
LANTERN × greedy / T = 1, the loop policies, the engine's clock, CUDA graphs (every bucket up to 128 replayed, no
silent fallback, a bf16 case), the synchronisations per cycle and the default run through the CLI, on the device.

Exactness on the GPU is checked within the device: greedy output token for token against AR greedy on the same
device, and at T = 1 the joint law of the first tokens against AR's exact law (χ², as the CPU suite). The forward is
compared with the CPU at float32 tolerance (cuBLAS / SDPA kernels round differently).

Without a GPU: ``ADTBENCH_SIMULATE_DEVICE=cuda pytest -m gpu tests/test_gpu.py`` runs the module on the simulated
CUDA device (``accel.simulate()``: CUDA's placement rules, counted synchronisations, the CUDA-graph stand-in;
``tests/conftest.py``), and the tests also marked ``gpu_sim`` run there in every CI run (a cheap subset);
``ADTBENCH_GPU_TEST_DEVICE=cpu pytest -m gpu tests/test_gpu.py`` runs it on the plain CPU (a check of the tests
themselves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import ROOT, pooled_chisquare, static_runs, synthetic_cost_model, tiny
from omegaconf import OmegaConf

from adtbench.algorithm.cost import TreeBudget, random_tree
from adtbench.algorithm.drafters.catch_up import catch_up_replays
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.lantern import LanternRule, nearest_codes
from adtbench.algorithm.policies import POLICIES as POLICY_BUILDERS
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.ar import ArPolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.policies.static import ChainPolicy, StaticTreePolicy
from adtbench.algorithm.policies.zipar import ZipARPolicy
from adtbench.algorithm.records import Clock
from adtbench.algorithm.verify import EXACT
from adtbench.graph_modes import GraphModes
from adtbench.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("ADTBENCH_GPU_TEST_DEVICE", "cuda")


def _cost(policy):
    policy.cost.tree = TreeBudget(synthetic_cost_model(), calibrate=True)
    return policy


# every tree policy in both budgets and draft modes (the yaml's shapes, shrunk to the tiny models)
POLICIES = {
    "ar": lambda: ArPolicy(),
    "chain": lambda: ChainPolicy(3),
    "static": lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1]]),
    "static_sampled": lambda: StaticTreePolicy([[0], [1], [0, 0]], "sample"),
    "eagle2": lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9),
    "eagle2_cost": lambda: _cost(Eagle2Policy(depth=2, top_k=3, total_tokens=9, budget="cost")),
    "eagle2_sampled": lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9, draft_sampling="sample"),
    "adt_fixed": lambda: ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8, budget="fixed"),
    "adt_cost": lambda: _cost(ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8, budget="cost")),
    "adt_cost_sampled": lambda: _cost(
        ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8, budget="cost", draft_sampling="sample")
    ),
    "zipar": lambda: ZipARPolicy(window=64),  # a window past the row length: ZipAR's lossless setting
    "sjd": lambda: POLICY_BUILDERS.build("sjd", {"window": 6, "init": "left"}),  # Jacobi: no drafter, lossless
    "scd": lambda: POLICY_BUILDERS.build("scd", {"window": 6}),
    "sjd_pac": lambda: POLICY_BUILDERS.build("sjd_pac", {"window": 8, "branch": 2, "tree_depth": 2}),
}
LOSSY = {"zipar_w2": lambda: ZipARPolicy(window=2)}


def _rule(target, relax: str, delta: float = 0.2):
    if relax == "exact":
        return EXACT
    return LanternRule(nearest_codes(target.codebook(), 3), target.layout.image_token_offset, delta=delta)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def test_verify_forward_on_the_device_matches_cpu() -> None:
    cpu_t, _ = tiny(dtype="float32")
    dev_t, _ = tiny(dtype="float32", device=DEVICE)
    outs = []
    for t in (cpu_t, dev_t):
        t.start(t.encode_prompt("a red circle", cfg=True), 16)
        mask, depth = random_tree(9, torch.Generator().manual_seed(1))
        toks = torch.randint(0, 16, (9,), generator=torch.Generator().manual_seed(2))
        logits, feats = t.verify_forward(toks.to(t.device), mask.to(t.device), depth.to(t.device))
        outs.append((logits.float().cpu(), feats.float().cpu()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-4, rtol=1e-4)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("relax", ["exact", "lantern_zero"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_greedy_every_policy_equals_ar_on_the_device(name: str, relax: str) -> None:
    """Greedy speculation is AR greedy token for token on the device (LANTERN at δ = 0 is the exact rule)."""
    target, drafter = tiny(dtype="float32", device=DEVICE)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    rule = _rule(target, "lantern", delta=0.0) if relax == "lantern_zero" else EXACT
    for prompt in ("two blue squares", "a red circle"):
        inputs = target.encode_prompt(prompt, cfg=True)
        ar = decode_ar(target, inputs, sp, None)
        spec = generate(target, drafter, POLICIES[name](), inputs, sp, None, rule)
        assert spec.tokens == ar.tokens and spec.tau >= 1.0, (name, prompt)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", [*POLICIES, *LOSSY])
def test_lantern_runs_on_the_device(name: str, temperature: float) -> None:
    """A relaxed rule (δ = 0.2) decodes complete images of image tokens with every policy (ZipAR at a lossy window
    too), greedy and T = 1."""
    target, drafter = tiny(dtype="float32", device=DEVICE)
    sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
    res = generate(target, drafter, (POLICIES | LOSSY)[name](), target.encode_prompt("a red circle", cfg=True), sp,
                   _generator(0), _rule(target, "lantern"))  # fmt: skip
    assert len(res.tokens) == target.layout.num_gen_tokens and set(res.tokens) <= set(target.layout.image_ids)


LAW_POLICIES = ["static_sampled", "eagle2", "eagle2_cost", "eagle2_sampled", "adt_cost", "adt_cost_sampled", "zipar",
                "scd", "sjd_pac", "static_sampled_graphed", "eagle2_graphed", "adt_fixed_graphed"]  # fmt: skip


@pytest.mark.parametrize("name", LAW_POLICIES)
def test_sampling_law_matches_ar_on_the_device(name: str) -> None:
    """T = 1 with top-k 3, CFG 3: the joint law of the first 3 image tokens equals AR's (χ², tiny vocabulary), with
    the generator on the device; ``*_graphed``: under ``engine.compile``'s graphs, the drafting levels graph
    replays (``drafters.graphed``)."""
    from test_engine import _exact_joint

    arch = {"arch.vocab_size": 4, "arch.block_size": 4, "vq.kind": "none"}
    target, drafter = tiny("tiny_llamagen", dtype="float64", device=DEVICE, **arch)  # exact law: float64
    graphed = name.endswith("_graphed")
    name = name.removesuffix("_graphed")
    if graphed:
        drafter.request_static(graphs=True)
    sp = SamplingParams(temperature=1.0, top_k=3, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    expected = _exact_joint(target, inputs, sp, 3)
    g, n = _generator(0), 600
    counts: Counter = Counter()
    for _ in range(n):
        counts[tuple(generate(target, drafter, POLICIES[name](), inputs, sp, g).tokens[:3])] += 1
    assert pooled_chisquare(counts, expected, n)[0] > 1e-3
    if graphed:
        lg = drafter.level_graphs  # one draft-phase replay per drafted cycle (``drafters.draft_phase``)
        assert lg is not None and lg.replays >= n


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mulo_on_the_device(temperature: float) -> None:
    """MuLo-SD's loop on the device: greedy equals AR greedy; T = 1 decodes a complete image."""
    from conftest import model_cfg
    from test_mulo import Nearest

    from adtbench.algorithm.methods.mulo import MuloModels, MuloParams, decode_mulo
    from adtbench.models.registry import build_target

    cfg = {"arch.vocab_size": 64}
    t = build_target(model_cfg("tiny_llamagen", dtype="float32", device=DEVICE, **cfg, **{"arch.block_size": 16}))
    d = build_target(model_cfg("tiny_llamagen", dtype="float32", device=DEVICE, **cfg, **{"arch.block_size": 4}))
    models = MuloModels(d, Nearest(2), None, 2, lambda i: d.encode_prompt(i.text, i.cfg))
    sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
    inputs = t.encode_prompt("a red circle", cfg=True)
    res = decode_mulo(t, models, inputs, sp, None if temperature == 0 else _generator(0), MuloParams())
    if temperature == 0:
        assert res.tokens == decode_ar(t, inputs, sp, None).tokens
    assert len(res.tokens) == t.layout.num_gen_tokens


def test_trained_drafter_speculates_on_the_device() -> None:
    """The mini model on the device: greedy EAGLE-2 equals AR greedy and its trained drafter is accepted (τ > 1)."""
    from conftest import model_cfg

    from adtbench.harness.drafters import build_drafter
    from adtbench.models.registry import build_target

    target = build_target(model_cfg("mini", device=DEVICE))
    drafter = build_drafter(OmegaConf.load(ROOT / "conf" / "drafter" / "mini.yaml"), target)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a large red circle on a plain blue background", cfg=True)
    spec = generate(target, drafter, Eagle2Policy(depth=3, top_k=4, total_tokens=20), inputs, sp, None)
    assert spec.tokens == decode_ar(target, inputs, sp, None).tokens and spec.tau > 1.5


def test_clock_synchronises_only_on_cuda() -> None:
    assert Clock(torch.device(DEVICE)).sync == (DEVICE == "cuda")


@pytest.mark.parametrize(
    "extra",
    [[], ["experiment=mini_lantern"], ["policy=adt"], ["policy=zipar", "drafter=none"], ["engine.compile=true"]],
)
def test_the_default_run_through_the_cli_on_the_device(tmp_path: Path, extra: list[str]) -> None:
    """``python run.py model.device=<device>`` end to end (2 prompts, AR baseline in the same job)."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "run.py", f"model.device={DEVICE}", "dataset.limit=2", f"hydra.run.dir={run_dir}", *extra]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["n_samples"] == 2 and summary["complete"] and summary["tau"] >= 1.0 and summary["speedup"] > 0


@pytest.mark.parametrize("model", ["tiny_llamagen", "tiny_chameleon"])
def test_cuda_graphs_replay_the_eager_verifies(model: str) -> None:
    """``engine.compile`` on the device: every verify (AR steps and trees, buckets 1 … 128) through captured CUDA
    graphs over the pinned cache gives the eager path's greedy tokens, image after image; the capture is timed."""
    eager, drafter = tiny(model, dtype="float32", device=DEVICE)
    graphed, _ = tiny(model, dtype="float32", device=DEVICE)
    graphed.request_static(graphs=DEVICE == "cuda")
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    for prompt in ("a red circle", "two blue squares on a striped floor"):
        ins_e, ins_g = eager.encode_prompt(prompt, cfg=True), graphed.encode_prompt(prompt, cfg=True)
        assert decode_ar(graphed, ins_g, sp, None).tokens == decode_ar(eager, ins_e, sp, None).tokens
        policy = Eagle2Policy(depth=3, top_k=4, total_tokens=20)
        spec = generate(graphed, drafter, policy, ins_g, sp, None)
        assert spec.tokens == decode_ar(eager, ins_e, sp, None).tokens
        assert graphed.cache is graphed.pinned
    if DEVICE == "cuda":
        assert graphed.static.capture_s > 0 and all(s.graph is not None for s in graphed.static.steps.values())


@pytest.mark.parametrize("model", ["tiny_llamagen", "tiny_chameleon"])
def test_cuda_graphs_of_the_drafter_replay_its_eager_forwards(model: str) -> None:
    """``engine.compile`` on the device for the drafter too: with the target's verifies and the drafter's ``extend`` /
    ``expand`` captured as CUDA graphs over their pinned caches (off CUDA: their eager static shapes), every drafter
    output equals the eager variable-shape drafter's (float32 tolerance) through sampled and greedy decodes, and
    greedy speculation is AR greedy, image after image; the drafter's capture is timed."""
    from test_graphs import WIDE, DrafterTwin

    target, graphed = tiny(model, dtype="float32", device=DEVICE)
    _, eager = tiny(model, dtype="float32", device=DEVICE)  # the same seed: the same drafter weights
    target.request_static(graphs=DEVICE == "cuda")
    graphed.request_static(graphs=DEVICE == "cuda")
    twin = DrafterTwin(graphed, eager)
    sampled, greedy = SamplingParams(temperature=1.0, cfg_scale=3.0), SamplingParams(temperature=0.0, cfg_scale=3.0)
    for prompt in ("a red circle", "two blue squares on a striped floor"):
        inputs = target.encode_prompt(prompt, cfg=True)
        res = generate(target, twin, StaticTreePolicy(WIDE, "sample"), inputs, sampled, _generator(0))
        assert len(res.tokens) == target.layout.num_gen_tokens
        ar = decode_ar(target, inputs, greedy, None).tokens
        for policy in (StaticTreePolicy(WIDE), Eagle2Policy(depth=3, top_k=4, total_tokens=20)):
            assert generate(target, twin, policy, inputs, greedy, None).tokens == ar, (policy.name, prompt)
        assert graphed.pinned is not None and graphed.cache is graphed.pinned[0]
    assert twin.diff <= 1e-4 and {m for name, m, _ in twin.calls if name == "expand"} >= {17, 9, 5, 3, 2, 1}
    if DEVICE == "cuda":
        st = graphed.static
        assert st is not None and st.capture_s > 0 and all(s.graph is not None for s in st.steps.values())


@pytest.mark.parametrize("policy", ["static_sampled", "eagle2", "adt_cost"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_decoding_on_the_device_equals_one_prompt_at_a_time(policy: str, temperature: float) -> None:
    """``decode.batch_size`` on the device: five prompts through three slots (batched target and drafter, continuous
    batching) give every prompt the tokens of its own B = 1 decode with the same seed (float64 on the device), and
    batched AR greedy equals AR greedy."""
    from adtbench.algorithm.batch import decode_ar_batch, generate_batch
    from adtbench.models.batch import BatchTarget

    target, drafter = tiny("tiny_chameleon", dtype="float64", device=DEVICE)
    sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
    prompts = ["a red circle", "two blue squares", "a cat", "the sea at night", "a dog on a mat"]
    inputs = [target.encode_prompt(p, cfg=True) for p in prompts]
    make = POLICIES[policy]
    alone = [generate(target, drafter, make(), x, sp, _generator(i)).tokens for i, x in enumerate(inputs)]
    nodes = max(make().max_nodes(), make().max_draft_slots())
    bt = BatchTarget(
        target, 3, True, max(target.prompt_length(x) for x in inputs) + target.layout.num_gen_tokens + nodes + 1
    )
    got: dict[int, list[int]] = {}
    generate_batch(bt, drafter, make(), [(i, x, _generator(i)) for i, x in enumerate(inputs)], sp,
                   lambda k, r: got.__setitem__(k, r.tokens))  # fmt: skip
    assert [got[i] for i in range(len(prompts))] == alone
    if temperature == 0.0:
        ar = [decode_ar(target, x, sp, None).tokens for x in inputs]
        batched = decode_ar_batch(bt, [(i, x, None) for i, x in enumerate(inputs[:3])], sp)
        assert [r.tokens for r in batched] == ar[:3] and alone == ar


# trees whose verify needs bucket 64 (57 drafts + the root) and bucket 128 (104 + 1; its third level expands the 48
# grandchildren at once: drafter bucket 64): 8 children of the root, 6 grandchildren each, then one child each
WIDE_64 = [[i] for i in range(8)] + [[i, j] for i in range(8) for j in range(6)]
WIDE_128 = WIDE_64 + [[i, j, 0] for i in range(8) for j in range(6)]


def _graphed(model: str, dtype: str):
    target, drafter = tiny(model, dtype=dtype, device=DEVICE)
    target.request_static(graphs=True)  # CUDA graphs on a GPU, their stand-in elsewhere
    drafter.request_static(graphs=True)
    return target, drafter


@pytest.mark.gpu_sim
def test_graphs_replay_every_bucket_up_to_128_and_nothing_falls_back() -> None:
    """``engine.compile``'s graphs on the device: AR (bucket 1) and trees of 58 and 83 nodes (buckets 64 and 128,
    drafter levels of 48 and 72 slots: drafter buckets 64 and 128) decode AR greedy's tokens, and every verify after
    the prefill and every drafter ``extend`` / ``expand`` of the decode loop ran through a captured graph (a fallback
    to variable shapes — an unpinned cache, a bucket past the capacity — fails here instead of passing silently)."""
    target, drafter = _graphed("tiny_llamagen", "float32")
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    verifies = drafter_calls = 0
    caught_up = catch_up_replays(drafter)
    with static_runs() as runs:
        for prompt, tree in (("a red circle", WIDE_64), ("two blue squares on a striped floor", WIDE_128)):
            inputs = target.encode_prompt(prompt, cfg=True)
            ar = decode_ar(target, inputs, sp, None)
            policy = StaticTreePolicy(tree)
            policy.graphs = GraphModes(levels="eager")  # the drafter's own buckets (graphed levels: the test below)
            spec = generate(target, drafter, policy, inputs, sp, None)
            assert spec.tokens == ar.tokens, prompt
            verifies += ar.target_forwards - 1 + spec.target_forwards - 1  # every forward after the prefill
            drafter_calls += spec.drafter_forwards - 1  # every drafter forward after its prefix pass
            assert target.cache is target.pinned and drafter.cache is drafter.pinned[0]
    assert not any(graphed is False for _, _, graphed in runs), runs  # nothing ran eagerly at a static shape
    replayed = {(kind, b) for kind, b, _ in runs}
    # AR steps at bucket 1; the drafted trees through the graphed tree verify (``tree_step``) at buckets 64 and 128
    assert {("StaticVerify", 1), ("TreeStep", 64), ("TreeStep", 128), ("StaticDraft", 64)} <= replayed
    assert sum(n for (kind, _, _), n in runs.items() if kind in ("StaticVerify", "TreeStep")) == verifies
    # every drafter forward: a static bucket's replay, or a catch-up after a graphed verify (``drafters.catch_up``)
    static_draft = sum(n for (kind, _, _), n in runs.items() if kind == "StaticDraft")
    assert static_draft + catch_up_replays(drafter) - caught_up == drafter_calls
    # the drafter's bucket 128: the decode loop's extend of 65 … 128 committed slots (a long accepted run), against
    # the eager variable-shape extend of the same slots
    rows, H, dev = 2, target.hidden_size, target.device
    gen = torch.Generator().manual_seed(0)
    feats, embeds = (torch.randn(rows, 70, H, generator=gen).to(dev) for _ in range(2))
    pos = torch.arange(70, device=dev)[None].expand(rows, -1)
    _, eager = tiny("tiny_llamagen", dtype="float32", device=DEVICE)  # the same seed: the same drafter weights
    outs = []
    for d in (drafter, eager):
        d.reset(rows, 128)  # within the pinned capacity: the static bucket 128 holds the 70 slots
        with static_runs() as runs:
            outs.append(d.extend(feats, embeds, pos))
        assert dict(runs) == ({("StaticDraft", 128, True): 1} if d is drafter else {})
    assert torch.allclose(outs[0], outs[1], atol=1e-4, rtol=1e-4)


GRAPHED_LEVELS = ["static", "static_sampled", "chain", "eagle2", "eagle2_cost", "adt_fixed", "adt_cost"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphed_drafting_levels_replay_once_per_level(dtype: str) -> None:
    """``engine.compile``'s graphed drafting levels (``drafters.graphed``) on the device, every tree policy: greedy
    decoding gives AR greedy's tokens, every drafted cycle's levels (and a fixed-size EAGLE-2 / ADT tree's rerank)
    are exactly one graph replay, the draft phase (``drafters.draft_phase``), and T = 1 decodes run (tokens in
    the image range) — in float32 and in bf16 (the 7B shape's dtype). (CI's cheap subset has the same checks on the
    simulated device in ``tests/test_graphed_levels.py``.)"""
    target, drafter = _graphed("tiny_llamagen", dtype)
    prompts = ("a red circle", "two blue squares on a striped floor")
    for name in GRAPHED_LEVELS:
        for temperature in (0.0, 1.0):
            sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
            policy = POLICIES[name]()
            for i, prompt in enumerate(prompts):
                inputs = target.encode_prompt(prompt, cfg=True)
                lg = drafter.level_graphs
                before = (0, 0) if lg is None else (lg.level_replays, lg.tree_replays)
                res = generate(target, drafter, policy, inputs, sp, _generator(i))
                lg = drafter.level_graphs
                assert lg is not None, name
                levels = sum(c.drafted_depth for c in res.cycles)
                drafted = sum(c.drafted_depth > 0 for c in res.cycles)
                assert levels > 0 and lg.level_replays - before[0] == 0, (name, lg.level_replays - before[0], levels)
                assert lg.tree_replays - before[1] == drafted, name  # the draft phase: one replay per cycle
                if temperature == 0.0:
                    assert res.tokens == decode_ar(target, inputs, sp, None).tokens, (name, prompt)
                assert all(0 <= t - target.layout.image_token_offset < target.layout.num_codes for t in res.tokens)
    assert lg.captures == len(lg.graphs) < lg.replays / 4  # each captured once, then replayed


@pytest.mark.gpu_sim
@pytest.mark.parametrize("model", ["tiny_llamagen", "tiny_chameleon"])
def test_bf16_graphs_give_the_eager_logits_within_bf16_rounding(model: str) -> None:
    """bfloat16 (the dtype the 7B shape runs in): per bucket 1 … 128, the graphed verify of a random tree gives the
    eager variable-shape forward's logits within bf16 rounding at the same KV state, and a T = 1 decode through the
    graphs of trees up to bucket 128 completes with every verify replayed."""
    target, drafter = _graphed(model, "bfloat16")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    with static_runs() as runs:
        res = generate(target, drafter, StaticTreePolicy(WIDE_128, "sample"), inputs, sp, _generator(0))
    assert len(res.tokens) == target.layout.num_gen_tokens and set(res.tokens) <= set(target.layout.image_ids)
    assert (
        sum(n for (kind, _, graphed), n in runs.items() if kind in ("StaticVerify", "TreeStep") and graphed)
        == res.target_forwards - 1
    )
    target.start(inputs, 128)
    static, dev, gen = target.static, target.device, torch.Generator().manual_seed(3)
    for n in (1, 2, 5, 16, 33, 64, 100):
        mask, depth = random_tree(n, gen)
        toks = torch.randint(0, target.layout.num_codes, (n,), generator=gen) + target.layout.image_token_offset
        case = (toks.to(dev), mask.to(dev), depth.to(dev))
        graphed = target.verify_forward(*case)[0].double()
        target.static = None  # the eager variable-shape forward over the same cache
        eager = target.verify_forward(*case)[0].double()
        target.static = static
        assert (graphed - eager).norm() <= 2e-2 * eager.norm(), n  # bf16 operands: 1e-3 … 1e-2 relative


SYNC_POLICIES = {
    "static_sampled": (POLICIES["static_sampled"], 1),
    "eagle2": (POLICIES["eagle2"], 1),  # its root's slot written with a slice (eagle2.py): a fill, not a host copy
    "eagle2_cost": (POLICIES["eagle2_cost"], 2),  # + its node count, read before the verify (TreeBudget.choose)
}


@pytest.mark.gpu_sim
@pytest.mark.parametrize("case", list(SYNC_POLICIES.values()), ids=list(SYNC_POLICIES))
def test_a_graphed_cycle_synchronises_once_or_twice_with_budget_cost(case) -> None:
    """The synchronisations per cycle of a graphed T = 1 decode (``bench_cycle.CycleTimer``: on CUDA
    ``torch.cuda.set_sync_debug_mode`` warnings, on the simulated device its counts of host reads and blocking
    host→device copies), prefill excluded, the policy's per-depth plans built by the warm-up as in a run: at most one
    per cycle — the verdict (``verify.read_verdict``: accepted count, path, bonus token in one read), everything else
    enqueued — and one more under ``budget: cost`` (its node count, read before the verify: ``TreeBudget.choose``).
    Issue 33's goal is ≤ 2."""
    from adtbench.tools.bench_cycle import CycleTimer

    make, bound = case
    target, drafter = _graphed("tiny_llamagen", "float32")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    policy = make()
    generate(target, drafter, policy, inputs, sp, _generator(0))  # the first prefill captures the graphs
    with CycleTimer(target, drafter) as timer:
        res = generate(target, drafter, policy, inputs, sp, _generator(1))
        timer.settle()
    cycles = len(res.cycles)
    assert timer.source is not None and cycles > 3 and timer.replays >= res.target_forwards - 1
    assert timer.syncs <= bound * cycles, (timer.sites, cycles)
    assert timer.explicit == 2  # the image's start and end (records.Clock.now), outside the count


@pytest.mark.gpu_sim
@pytest.mark.parametrize("name", ["scd", "sjd", "gsd"])
def test_the_jacobi_step_is_one_graph_replay_and_no_read_per_forward(name: str) -> None:
    """The device-resident Jacobi step (``methods.jacobi.step``, ``engine.graphs.step=auto`` on graphed verifies):
    greedy = AR greedy token for token, and at T = 1 every forward is one graph replay with no synchronisation inside
    the loop — the host waits only on the previous forward's fence (one step late; ``CycleTimer`` counts the
    ``set_sync_debug_mode`` warnings on CUDA, the simulated device's reads and blocking copies elsewhere): the image's
    end reads the tokens once. Issue 40's goal: ≤ 3 host launches and 0 blocking reads per SCD forward."""
    from adtbench.algorithm.policies.jacobi import JacobiModels
    from adtbench.tools.bench_cycle import CycleTimer

    target, _ = _graphed("tiny_llamagen", "float32")
    node = {"window": 6, "init": "up"} if name != "sjd" else {"window": 6, "init": "random"}
    pol = POLICY_BUILDERS.build(name, node)
    inputs = target.encode_prompt("a red circle", cfg=True)
    greedy = SamplingParams(temperature=0.0, cfg_scale=3.0)
    ar = decode_ar(target, inputs, greedy, _generator(0))
    res = generate(target, JacobiModels(), pol, inputs, greedy, _generator(0))
    assert res.stats["step"] == "graph" and res.tokens == ar.tokens
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    generate(target, JacobiModels(), pol, inputs, sp, _generator(1))  # captures every width the image needs
    with CycleTimer(target, None) as timer:
        res = generate(target, JacobiModels(), pol, inputs, sp, _generator(2))
        timer.settle()
    forwards = len(res.cycles) + res.stats["idle_forwards"]
    assert res.stats["step"] == "graph" and len(res.cycles) > 3 and res.stats["idle_forwards"] <= 1
    assert len(res.tokens) == target.layout.num_gen_tokens
    assert timer.source is not None and timer.syncs <= 2, (timer.sites, forwards)  # the tokens' read at the end
