"""MuLo-SD (``adtbench.algorithm.methods.mulo``, ``policy=mulo``): the degenerate ends (τ = 0: one forward per
block; τ > 1: exact AR), the lossless control arm (T = 0 identity, T = 1 χ²), island and sequential resampling, the
records, the config checks before any model loads, and end-to-end runs through the app (mini, tiny Tar)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import model_cfg, pooled_chisquare
from hydra import compose, initialize_config_dir

from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.lantern import nearest_codes
from adtbench.algorithm.methods.mulo import MuloModels, MuloParams, decode_mulo, mulo_params
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.records import GenerationResult
from adtbench.algorithm.sampling import process_logits
from adtbench.errors import ConfigError
from adtbench.harness.config import register_resolvers
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "adtbench" / "weights" / "mini"
QUICK = ["warmup=0", "progress=false", "maps.per_run=false", "save_images=false"]
register_resolvers()


class Nearest:
    """Code-level U_r / D_r (repeat r×r; top-left code): test-local, independent of ``models.resample``."""

    def __init__(self, r: int) -> None:
        self.r = r

    def up(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.repeat_interleave(self.r, 0).repeat_interleave(self.r, 1)

    def down(self, codes: torch.Tensor) -> torch.Tensor:
        return codes[:: self.r, :: self.r].contiguous()


_MODELS: dict[tuple, tuple] = {}


def pair(vocab: int = 64, block: int = 16, **over: str) -> tuple[Any, MuloModels]:
    """A float64 tiny LlamaGen target (grid √block) and its half-resolution drafter (same seed, same codebook)."""
    key = (vocab, block, tuple(sorted(over.items())))
    if key not in _MODELS:
        arch = {"arch.vocab_size": vocab, **over}
        t = build_target(model_cfg("tiny_llamagen", dtype="float64", **arch, **{"arch.block_size": block}))
        d = build_target(model_cfg("tiny_llamagen", dtype="float64", **arch, **{"arch.block_size": block // 4}))
        models = MuloModels(d, Nearest(2), None, 2, lambda i, d=d: d.encode_prompt(i.text, i.cfg))
        _MODELS[key] = (t, models)
    return _MODELS[key]


def run(
    params: MuloParams, sp: SamplingParams, prompt: str = "a red circle", g: torch.Generator | None = None
) -> tuple[GenerationResult, GenerationResult | None]:
    """MuLo-SD on the tiny pair, and the AR baseline when unseeded (T = 0 comparisons)."""
    t, m = pair()
    inputs = t.encode_prompt(prompt, cfg=sp.use_cfg)
    return decode_mulo(t, m, inputs, sp, g, params), decode_ar(t, inputs, sp, None) if g is None else None


def check_records(res: GenerationResult, n_tokens: int) -> None:
    """τ bookkeeping: one record per sequential target forward after the prefill, Σ(a + 1) = tokens − 1."""
    assert len(res.tokens) == n_tokens and min(res.tokens) >= 0
    assert res.committed == n_tokens - 1
    assert len(res.cycles) == res.target_forwards - 1 == res.stats["target_forwards"]
    assert all(c.accepted >= -1 and c.extra["phase"] in ("verify", "resample") for c in res.cycles)
    assert sum(c.extra["phase"] == "verify" for c in res.cycles) <= res.stats["cycles"]
    assert res.stats["R_T"] <= res.stats["R_X"] and 0.0 <= res.stats["accept_rate"] <= 1.0
    assert res.stats["kv_refresh"] == "fused" and res.stats["r"] == 2
    assert res.latency_s >= res.draft_s + res.verify_s + res.prefill_s - 1e-6


# --- degenerate ends ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_rows", [None, 1])
def test_tau_zero_accepts_every_draft_in_one_forward_per_block(block_rows):
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    res, _ = run(MuloParams(tau=0.0, k=0, block_rows=block_rows), sp, g=torch.Generator().manual_seed(0))
    blocks = 2 if block_rows == 1 else 1
    assert res.stats["cycles"] == blocks and len(res.cycles) == blocks == res.target_forwards - 1
    assert res.stats["R_T"] == res.stats["R_X"] == 0 and res.stats["accept_rate"] == 1.0
    grid = torch.tensor(res.tokens).view(4, 4)
    assert torch.equal(grid, Nearest(2).up(grid[::2, ::2]))  # the up-sampled drafts, untouched
    assert [c.extra["phase"] for c in res.cycles] == ["verify"] * blocks
    assert res.encode_s > 0  # the drafter's own prompt encoding: timed, outside latency_s
    check_records(res, 16)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize(
    "params",
    [
        MuloParams(tau=1.5, k=0),
        MuloParams(tau=1.5, k=3, l=0, block_rows=1),
        MuloParams(tau=2.0, resample="islands"),
        MuloParams(rule="exact"),
        MuloParams(rule="exact", block_rows=1),
    ],
    ids=["tau>1", "tau>1-blocks", "tau>1-islands", "exact", "exact-blocks"],
)
def test_greedy_equals_ar(cfg_scale, params):
    """T = 0, float64: τ > 1 (every draft rejected → exact AR resampling) and the exact arm equal ``decode_ar``."""
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    t, m = pair()
    m.neighbours = nearest_codes(t.codebook(), 3) if params.k else None
    for prompt in ["a red circle", "two blue squares on a striped floor"]:
        res, ar = run(params, sp, prompt)
        assert res.tokens == ar.tokens, prompt
        check_records(res, 16)
        if params.rule == "pooled":  # every draft rejected: R_X = every block from its start
            assert res.stats["R_T"] == res.stats["R_X"] == 16 and res.stats["accept_rate"] == 0.0
            # AR's forwards + the first verify (later verifies compute their block's first p: an AR step each)
            assert res.target_forwards == ar.target_forwards + 1 and res.cycles[0].accepted == -1
    m.neighbours = None


@pytest.mark.slow
def test_greedy_equals_ar_on_the_mini_pair():
    """The shipped 16×16 / 8×8 mini models (float64): τ > 1 and the exact arm are AR token for token."""
    t = build_target(model_cfg("mini", dtype="float64"))
    d = build_target(model_cfg("mini_lowres", dtype="float64"))
    m = MuloModels(d, Nearest(2), None, 2, lambda i: d.encode_prompt(i.text, i.cfg))
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = t.encode_prompt("a small red circle above a blue square", cfg=True)
    ar = decode_ar(t, inputs, sp, None)
    for params in (MuloParams(tau=1.5), MuloParams(rule="exact", block_rows=2)):
        res = decode_mulo(t, m, inputs, sp, None, params)
        assert res.tokens == ar.tokens, params
        check_records(res, 256)
    res = decode_mulo(t, m, inputs, sp, None, MuloParams(tau=0.3, k=0))
    assert res.stats["accept_rate"] > 0.3  # the trained low-res drafter's up-sampled drafts pass the threshold


# --- the lossless control arm: T = 1 distribution -------------------------------------------------------------


def ar_joint(target, inputs, sp) -> dict[tuple[int, ...], float]:
    """AR probability of every image (2×2 grid, 4 codes) by teacher-forced enumeration."""
    lay = target.layout
    one, zero = torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
    probs = {}
    for seq in product(list(lay.image_ids), repeat=lay.num_gen_tokens):
        res = target.start(inputs, 1)
        logp = process_logits(res.logits[:, None], zero, lay, sp)[0].log_softmax(-1)
        lp = 0.0
        for i, tok in enumerate(seq):
            lp += float(logp[tok])
            if i + 1 < len(seq):
                raw, _ = target.verify_forward(torch.tensor([tok]), one, zero)
                target.commit(zero)
                logp = process_logits(raw, torch.tensor([i + 1]), lay, sp)[0].log_softmax(-1)
        probs[seq] = float(np.exp(lp))
    return probs


@pytest.mark.slow
@pytest.mark.parametrize(
    "params,cfg_scale", [(MuloParams(rule="exact"), 3.0), (MuloParams(tau=1.5, k=0), 1.0)], ids=["exact", "tau>1"]
)
def test_sampling_law_equals_ar(params, cfg_scale):
    """T = 1 with top-k: the joint law of the whole 2×2 image equals AR's (χ², 4-code vocabulary, 1×1 drafter)."""
    t, m = pair(vocab=4, block=4, **{"vq.kind": "none"})
    sp = SamplingParams(temperature=1.0, top_k=3, cfg_scale=cfg_scale)
    inputs = t.encode_prompt("a red circle", cfg=sp.use_cfg)
    expected = ar_joint(t, inputs, sp)
    g, n = torch.Generator().manual_seed(0), 1000
    counts, accepted = Counter(), 0
    with t.reuse_prefill(inputs):  # the target's prefill run once (tests/test_prefill_reuse.py)
        for _ in range(n):
            res = decode_mulo(t, m, inputs, sp, g, params)
            counts[tuple(res.tokens)] += 1
            accepted += round(res.stats["accept_rate"] * 3)  # drafts accepted (3 judged: x̃_0..x̃_2 of the chain)
            check_records(res, 4)
    pvalue, cells = pooled_chisquare(counts, expected, n)
    assert abs(sum(expected.values()) - 1) < 1e-9 and cells >= 10
    if params.rule == "exact":
        assert accepted > n // 3  # drafts were accepted often enough to test both paths
    assert pvalue > 1e-3


# --- resampling modes, records ----------------------------------------------------------------------------------


@pytest.mark.parametrize("resample", ["sequential", "islands"])
@pytest.mark.parametrize("block_rows", [None, 1])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_local_resampling_gives_valid_images_and_consistent_records(resample, block_rows, temperature):
    t, m = pair()
    sp = SamplingParams(temperature=temperature, cfg_scale=3.0, top_k=20 if temperature else 0)
    g = torch.Generator().manual_seed(1) if temperature else None
    seen_islands = 0
    for tau, l, window in [(0.05, 0, None), (0.05, 1, None), (0.2, 1, 1), (0.5, 2, None)]:
        params = MuloParams(tau=tau, k=0, l=l, block_rows=block_rows, resample=resample, island_window=window)
        res = decode_mulo(t, m, t.encode_prompt("a green triangle", cfg=True), sp, g, params)
        check_records(res, 16)
        assert t.decode_image(t.layout.tokens_to_codes(res.tokens)).shape == (8, 8, 3)
        resampled = [c for c in res.cycles if c.extra["phase"] == "resample"]
        if resample == "sequential":  # one forward per resampled position but the first of each block (the verify's)
            assert len(resampled) <= res.stats["R_X"] and all(c.accepted == 0 for c in resampled)
        elif window is None:  # one forward per parallel step; a step finalises at most one token per island
            assert all(c.accepted + 1 <= res.stats["islands"] for c in resampled)
            assert len(resampled) <= res.stats["largest_island"] * res.stats["cycles"]
        seen_islands += res.stats["islands"]
    assert seen_islands > 0


def test_islands_resample_concurrently():
    """Islands take fewer sequential forwards than raster-order resampling of the same rejections."""
    t, m = pair()
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = t.encode_prompt("a green triangle", cfg=True)
    seq = decode_mulo(t, m, inputs, sp, None, MuloParams(tau=0.2, k=0, l=0))
    isl = decode_mulo(t, m, inputs, sp, None, MuloParams(tau=0.2, k=0, l=0, resample="islands"))
    assert seq.stats["R_X"] == isl.stats["R_X"] and isl.stats["islands"] >= 2
    assert len(isl.cycles) < len(seq.cycles)
    assert len(isl.cycles) <= 1 + isl.stats["largest_island"]


def test_pooled_neighbours_widen_acceptance():
    """k codebook neighbours pool mass: the accept rate never drops as k grows (same drafts, same p)."""
    t, m = pair()
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = t.encode_prompt("a green triangle", cfg=True)
    rates = []
    for k in (0, 4, 32):
        m.neighbours = nearest_codes(t.codebook(), 32)
        res = decode_mulo(t, m, inputs, sp, torch.Generator().manual_seed(3), MuloParams(tau=0.1, k=k, l=0))
        rates.append(res.stats["accept_rate"])
    m.neighbours = None
    assert rates == sorted(rates) and rates[-1] > rates[0]


def test_zipar_drafter():
    """``draft=zipar``: the drafter decodes ZipAR-parallel (fewer drafter forwards than its 4 tokens + prefill);
    τ = 0 keeps the up-sampled ZipAR drafts, τ > 1 is still AR."""
    from adtbench.algorithm.methods.zipar import decode_zipar

    t, m = pair(block=64)  # 8×8 target, 4×4 drafter: ZipAR w = 1 runs 4 + 3 = 7 steps instead of 16
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = t.encode_prompt("a red circle", cfg=True)
    res = decode_mulo(t, m, inputs, sp, None, MuloParams(tau=0.0, draft="zipar", draft_window=1))
    low = decode_zipar(m.drafter, m.encode(inputs), sp, None, 1).tokens
    assert res.tokens == Nearest(2).up(torch.tensor(low).view(4, 4)).view(-1).tolist()
    assert res.stats["drafter_forwards"] == 7 and res.stats["draft"] == "zipar"
    res = decode_mulo(t, m, inputs, sp, None, MuloParams(tau=1.5, draft="zipar", draft_window=1))
    assert res.tokens == decode_ar(t, inputs, sp, None).tokens


def test_policy_runs_through_the_engine():
    t, m = pair()
    policy = POLICIES.build("mulo", {"name": "mulo", "rule": "exact", "block_rows": 1, "upsampler": "nearest"})
    assert policy.lossless and not POLICIES.build("mulo", {"name": "mulo"}).lossless
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = t.encode_prompt("a red circle", cfg=True)
    assert generate(t, m, policy, inputs, sp, None).tokens == decode_ar(t, inputs, sp, None).tokens
    with pytest.raises(TypeError):
        generate(t, None, policy, inputs, sp, None)


@pytest.mark.parametrize(
    "node,key",
    [
        ({"tau": -0.1}, "policy.tau"),
        ({"tau": "high"}, "policy.tau"),
        ({"l": -1}, "policy.l"),
        ({"l": 1.5}, "policy.l"),
        ({"k": -2}, "policy.k"),
        ({"block_rows": 0}, "policy.block_rows"),
        ({"block_rows": "half"}, "policy.block_rows"),
        ({"rule": "lantern"}, "policy.rule"),
        ({"resample": "parallel"}, "policy.resample"),
        ({"draft": "eagle"}, "policy.draft"),
        ({"draft": "zipar", "block_rows": 2}, "policy.draft"),
        ({"island_window": 0}, "policy.island_window"),
        ({"draft_window": 0}, "policy.draft_window"),
    ],
)
def test_bad_policy_values(node, key):
    with pytest.raises(ConfigError) as e:
        mulo_params(node)
    assert e.value.key == key


# --- the app: config errors before any model loads, end to end ---------------------------------------------------


def app_config(*overrides: str, cache: Path | None = None):
    base = ["policy=mulo", "dataset=smoke", "dataset.limit=1", *QUICK]
    if cache is not None:  # the kNN table cache: never the checkout's .cache from a test
        base.append(f"paths.cache_dir={cache}")
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=[*base, *overrides])


def fake_checkpoint(tmp_path: Path, sub: str, src: Path, edit: dict) -> Path:
    """A copy of a shipped ``config.json`` with ``edit`` applied to its top level or ``gpt`` section."""
    out = tmp_path / sub
    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    for k, v in edit.items():
        (cfg["gpt"] if "gpt" in cfg and k in cfg["gpt"] else cfg)[k] = v
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize(
    "case",
    ["r", "codebook", "l", "tau", "family", "lantern", "weights", "unknown", "tar_stage", "resampler", "overrides"],
)
def test_config_errors_before_any_model_loads(tmp_path, caplog, case):
    from adtbench.harness.app import run as app_run

    bad_r = lambda: fake_checkpoint(tmp_path, "ar6", WEIGHTS / "ar8", {"block_size": 36})  # noqa: E731
    bad_vq = lambda: fake_checkpoint(tmp_path, "vq", WEIGHTS / "vq", {"codebook_size": 256})  # noqa: E731
    nearest = ["policy.upsampler=nearest", "policy.downsampler=nearest"]
    overrides, key = {
        "r": ([*nearest, f"+policy.drafter_overrides.path={bad_r() if case == 'r' else ''}"], "policy.drafter_model"),
        "codebook": (
            [*nearest, f"+policy.drafter_overrides.vq_path={bad_vq() if case == 'codebook' else ''}"],
            "policy.drafter_model",
        ),
        "l": (["policy.l=-1", *nearest], "policy.l"),
        "tau": (["policy.tau=-0.5", *nearest], "policy.tau"),
        "family": (["policy.drafter_model=tiny_llamagen", *nearest], "policy.drafter_model"),
        "lantern": (["lantern=on", *nearest], "lantern.enabled"),
        "weights": ([f"policy.upsampler_path={tmp_path / 'none'}"], "policy.upsampler_path"),
        "unknown": (["policy.drafter_model=mini_1024", *nearest], "policy.drafter_model"),
        "tar_stage": (["model=tar", "policy.drafter_model=tar", *nearest], "model.stage"),
        "resampler": (["policy.upsampler=lanczos"], "policy.upsampler"),
        "overrides": (["policy.drafter_overrides=3", *nearest], "policy.drafter_overrides"),
    }[case]
    caplog.set_level("INFO", logger="adtbench")
    with pytest.raises(ConfigError) as e:
        app_run(app_config(*overrides), tmp_path / "run", {})
    assert e.value.key == key, str(e.value)
    assert not any("loading model" in r.getMessage() for r in caplog.records)
    if case in ("r", "codebook", "weights"):
        assert str(tmp_path) in e.value.message  # names the path


@pytest.mark.slow
def test_app_end_to_end_on_the_mini_model(tmp_path):
    """``python run.py policy=mulo model=mini dataset=smoke dataset.limit=1``, in process: samples carry the stats,
    the summary the policy keys; the learned resamplers when their weights are shipped, else nearest."""
    from adtbench.harness.app import run as app_run

    learned = (WEIGHTS / "upsampler" / "model.safetensors").is_file()
    kinds = [] if learned else ["policy.upsampler=nearest", "policy.downsampler=nearest"]
    out = tmp_path / "run"
    cfg = app_config("model=mini", "policy.block_rows=4", "policy.resample=islands", "save_images=true", *kinds,
                     cache=tmp_path / "cache")  # fmt: skip
    s = app_run(cfg, out, {"model": "mini", "policy": "mulo"})
    rec = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rec) == 1 and len(rec[0]["tokens"]) == 256 and (out / rec[0]["image"]).is_file()
    st = rec[0]["stats"]
    assert st["cycles"] == 2 and st["target_forwards"] == rec[0]["cycles"] and st["drafter_forwards"] >= 64
    assert st["upsampler"] == ("learned" if learned else "nearest") and st["resample"] == "islands"
    assert rec[0]["committed"] == 255 and rec[0]["tau"] == pytest.approx(255 / rec[0]["cycles"])
    assert s["policy"] == "mulo" and s["policy_params"]["block_rows"] == 4 and s["speedup"] is not None
    assert rec[0]["encode_s"] > 0  # target + drafter prompt encodings, outside latency_s


def test_tiny_tar_end_to_end(tmp_path):
    """Tar's tiny real-layout checkpoint: AR-DTok-256 (4×4) drafts for AR-DTok-512 (8×8), r = 2, one LM run; τ > 1
    at T = 0 equals the AR baseline through the app."""
    from adtbench.harness.app import run as app_run
    from adtbench.tools.make_tiny import write_tiny

    logging.getLogger("transformers").setLevel(logging.ERROR)
    tar = tmp_path / "tar"
    write_tiny("tar", tar, seed=0)
    common = [
        "model=tar", f"model.path={tar}", "model.stage=detok", "model.detok.file=ar_dtok_lp_512px.pth",
        "model.dtype=float64", "model.device=cpu", "policy.drafter_model=tar", "policy.upsampler=nearest",
        "policy.downsampler=nearest", f"+policy.drafter_overrides.path={tar}", "sampling=greedy",
    ]  # fmt: skip
    with pytest.raises(ConfigError) as e:  # r from the de-tokenizer file names: 512 / 384 is not an integer
        bad = app_config(*common, "+policy.drafter_overrides.detok.file=ar_dtok_lp_384px.pth")
        app_run(bad, tmp_path / "x", {})
    assert e.value.key == "policy.drafter_model"
    common.append("+policy.drafter_overrides.detok.file=ar_dtok_lp_256px.pth")
    for tau, match in ((1.5, True), (0.3, None)):
        out = tmp_path / f"run{tau}"
        cfg = app_config(*common, f"policy.tau={tau}", "policy.k=4", cache=tmp_path / "cache")
        s = app_run(cfg, out, {"model": "tar", "policy": "mulo"})
        rec = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
        assert len(rec["tokens"]) == 64 and rec["stats"]["r"] == 2 and "AR-DTok only" in rec["stats"]["timing_scope"]
        if match:
            assert rec["tokens_match_baseline"] and s["greedy_matches_baseline"]
