"""ZipAR (``policy=zipar``, ``algorithm.zipar``): the plan, exactness against AR, lossy windows, every family, the app.

- the plan: steps = ``window_schedule`` (+ the EOI step), stand-ins only at row starts (EOL or the row above's
  latest token), re-queries of cached slots, the KV room it reserves;
- ``Target.forward_at`` + ``RasterCache`` + ``Target.commit`` over several out-of-order forwards equal one
  ``verify_forward`` with the equivalent explicit mask, on every family (StaticGPT and transformers adapters);
- window ≥ row length: token-identical to ``decode_ar`` at T = 0 and with a seeded generator at T = 1, with the
  same number of target forwards (tiny LlamaGen, the mini model, Lumina's end-of-line layout);
- window < row length: forwards after the prefill = schedule length − 1, a valid image, forced tokens in place;
- the app: ``policy=zipar`` writes samples with ``stats`` and a summary; bad config names its key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_OVERRIDES, model_cfg, tiny
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from adtbench.algorithm.ar import ar_tokens
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.methods.zipar import (
    EOL_INPUT,
    GridShape,
    decode_plan,
    decode_zipar,
    plan_forwards,
    zipar_plan,
    zipar_steps,
)
from adtbench.algorithm.policies import POLICIES, LoopPolicy
from adtbench.algorithm.policies.zipar import ZipARPolicy
from adtbench.algorithm.raster import RasterCache
from adtbench.algorithm.regions import window_schedule
from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams
from adtbench.tools.make_tiny import write_tiny

ROOT = Path(__file__).resolve().parents[1]
TEXT = "3 a red cat on a mat"  # c2i reads the leading class id; the others read the caption
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
SAMPLED = SamplingParams(temperature=1.0, top_k=20, cfg_scale=3.0)


def plain(h: int, w: int) -> TokenLayout:
    return TokenLayout(vocab_size=16, image_token_offset=0, num_codes=16, grid_h=h, grid_w=w)


def lumina_like(h: int, w: int) -> TokenLayout:
    return TokenLayout(vocab_size=20, image_token_offset=0, num_codes=16, grid_h=h, grid_w=w, eol_token=17,
                       eoi_token=18)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# The plan (pure)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("h,w,window", [(4, 4, 1), (4, 4, 2), (3, 5, 3), (4, 4, 4), (2, 3, 9)])
def test_steps_are_the_window_schedule_and_the_plan_reads_each_predecessor(h: int, w: int, window: int) -> None:
    for layout in (plain(h, w), lumina_like(h, w)):
        shape = GridShape.of(layout)
        steps = zipar_steps(shape, window)
        grid_steps = window_schedule(None, h, layout.row_len, window)
        assert steps[: len(grid_steps)] == grid_steps
        assert steps[len(grid_steps) :] == ([[h * layout.row_len]] if layout.eoi_token is not None else [])
        plan = zipar_plan(layout, window)
        assert len(plan.forwards) == len(steps) - 1 and plan.max_parallel == max(map(len, steps))
        rc = RasterCache(layout.num_gen_tokens)  # the plan's stored masks are RasterCache's, forward by forward
        for k, fw in enumerate(plan.forwards, start=1):
            slots = fw.slots.tolist()
            assert torch.equal(fw.allowed, rc.allowed(slots, fw.real))
            assert torch.equal(fw.keep, rc.commit(slots, fw.real))
            assert fw.reads_all == (fw.queries.tolist() == list(range(len(slots))))
            assert slots == sorted(set(slots))
            assert [s for s, r in zip(slots, fw.real, strict=True) if r] == sorted(steps[k - 1])  # last step's tokens
            assert fw.predicts.tolist() == sorted(steps[k])
            assert [slots[q] for q in fw.queries.tolist()] == [g - 1 for g in fw.predicts.tolist()]
            assert fw.requeries == 0  # never on a full grid
            for s, r, src in zip(slots, fw.real, fw.src, strict=True):
                if r:
                    assert src == s
                else:  # a stand-in: the last slot of a row whose successor (a row start) is generated now
                    assert (s + 1) % layout.row_len == 0 and s + 1 in steps[k]
                    row = s // layout.row_len
                    if layout.eol_token is not None:
                        assert src == EOL_INPUT
                    else:  # the row's latest token generated before this forward
                        done = [u for st in steps[:k] for u in st if u // layout.row_len == row]
                        assert src == max(done)
            assert plan.max_fed >= len(slots)
        if window >= layout.row_len:
            assert all(len(s) == 1 for s in steps) and all(f.temporary == 0 for f in plan.forwards)


def test_plan_hand_worked_2x3_window_1() -> None:
    """Grid 2 × 3, w = 1: steps [0] [1, 3] [2, 4] [5] (row 1 starts once row 0 has one token)."""
    plan = zipar_plan(plain(2, 3), 1)
    assert plan.steps == ((0,), (1, 3), (2, 4), (5,))
    f1, f2, f3 = plan.forwards
    # F1: x0 real @0 (predicts x1); a stand-in @2 fed x0 (row 0's latest token) predicts the row start x3
    assert (f1.slot_list, f1.real, f1.src, f1.queries.tolist(), f1.stand_ins) == ((0, 2), (True, False), (0, 0),
                                                                                   [0, 1], 1)  # fmt: skip
    assert f1.allowed.int().tolist() == [[1, 0], [1, 1]] and f1.keep.tolist() == [0]
    # F2: x1 @1 and x3 @3 real (column c0 holds slot 0); x3 sees x0, x1, not slot 2 (not fed yet)
    assert (f2.slot_list, f2.real, f2.reads_all) == ((1, 3), (True, True), True)
    assert f2.allowed.int().tolist() == [[1, 1, 0], [1, 1, 1]] and f2.keep.tolist() == [0, 1]
    # F3: x2 @2 and x4 @4 (columns: slots 0, 1, 3); x2 does not see x3 (slot 3 > 2); x4 sees all and x2
    assert f3.allowed.int().tolist() == [[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]]
    assert (f3.queries.tolist(), f3.predict_list) == ([1], (5,))
    assert plan.max_fed == 2 and plan.max_parallel == 2


def test_plan_requery_and_bad_steps() -> None:
    shape = GridShape(grid_h=2, row_len=3, eol=False, eoi=False)
    # x3 (row start) before x2: a stand-in at slot 2 fed x1; then x2 and x4 re-query the cached slots 1 and 3
    plan = plan_forwards([[0], [1], [3], [2], [4], [5]], shape)
    f2, f3, f4, f5 = plan.forwards[1:]
    assert (f2.slots.tolist(), f2.real, f2.src, f2.stand_ins) == ([1, 2], (True, False), (1, 1), 1)
    assert (f3.slots.tolist(), f3.real, f3.src, f3.requeries) == ([1, 3], (False, True), (1, 3), 1)
    assert (f4.slots.tolist(), f4.real, f4.src, f4.requeries) == ([2, 3], (True, False), (2, 3), 1)
    assert (f5.slots.tolist(), f5.real, f5.temporary) == ([4], (True,), 0)
    with pytest.raises(ValueError, match="partition"):
        plan_forwards([[0], [1], [2]], shape)
    with pytest.raises(ValueError, match="partition"):
        plan_forwards([[1], [0], [2, 3, 4, 5]], shape)
    with pytest.raises(ValueError, match="only a row start"):  # x2 before x1: a pending in-row predecessor
        plan_forwards([[0], [2], [1], [3], [4], [5]], shape)


# ---------------------------------------------------------------------------------------------------------
# Out-of-order feeding on every family: several forward_at calls == one verify_forward with the same mask
# ---------------------------------------------------------------------------------------------------------

# forwards of (slots, real): F1 feeds slots 0, 1, 4; F2 feeds 2, 3 and a temporary at 5; F3 feeds 5
FORWARDS = [([0, 1, 4], [True, True, True]), ([2, 3, 5], [True, True, False]), ([5], [True])]
# the same seven tokens as one tree (order a b c d e f g = slots 0 1 4 2 3 5t 5): each row lists what the token
# attends to under RasterCache's rule across those forwards (the temporary f is seen by nobody)
REFERENCE_MASK = [
    "1000000",  # a @0
    "1100000",  # b @1
    "1110000",  # c @4: slots 2, 3 not fed yet
    "1101000",  # d @2
    "1101100",  # e @3
    "1111110",  # f @5 (temporary)
    "1111101",  # g @5 (real, a later forward)
]


def check_out_of_order(t, text: str = TEXT) -> None:
    lay = t.layout
    vals = (lay.image_token_offset + torch.tensor([5, 17, 30, 41, 2, 9]) % lay.num_codes).tolist()
    inputs = t.encode_prompt(text, cfg=t.supports_cfg)
    t.start(inputs, 8)
    rc, got = RasterCache(lay.num_gen_tokens), []
    for slots, real in FORWARDS:
        raw, _ = t.forward_at(torch.tensor([vals[s] for s in slots]), torch.tensor(slots), rc.allowed(slots, real))
        t.commit(rc.commit(slots, real))
        got.append(raw)
    got_all = torch.cat(got, dim=1)
    t.start(inputs, 8)
    order = [0, 1, 4, 2, 3, 5, 5]
    mask = torch.tensor([[c == "1" for c in r] for r in REFERENCE_MASK])
    ref, _ = t.verify_forward(torch.tensor([vals[s] for s in order]), mask, torch.tensor(order))
    torch.testing.assert_close(got_all, ref, atol=1e-8, rtol=0)
    # negative control: c @4 seeing d, e (slots 2, 3) gives other logits — the test can tell masks apart
    t.start(inputs, 8)
    wrong = mask.clone()
    wrong[2, 3:5] = True
    other, _ = t.verify_forward(torch.tensor([vals[s] for s in order]), wrong, torch.tensor(order))
    assert (other[:, 2] - ref[:, 2]).abs().max() > 1e-4


def check_zipar(t, cfg_scale: float, text: str = TEXT) -> list[int]:
    """T = 0: window = row length equals AR (tokens and forwards); window 2 runs the schedule to a valid image."""
    lay = t.layout
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    inputs = t.encode_prompt(text, cfg=sp.use_cfg and t.supports_cfg)
    ar = decode_ar(t, inputs, sp, None)
    z = decode_zipar(t, inputs, sp, None, lay.row_len)
    assert z.tokens == ar.tokens and z.target_forwards == ar.target_forwards == lay.num_gen_tokens
    z2 = decode_zipar(t, inputs, sp, None, 2)
    assert len(z2.cycles) == z2.stats["target_forwards"] == len(zipar_steps(GridShape.of(lay), 2)) - 1
    assert z2.target_forwards == len(z2.cycles) + 1  # + the prefill
    codes = lay.tokens_to_codes(z2.tokens)  # raises if a non-image token sits at an image position
    assert codes.shape == (lay.grid_h, lay.grid_w)
    assert_forced_in_place(lay, z2.tokens)
    return z2.tokens


def assert_forced_in_place(lay: TokenLayout, tokens: list[int]) -> None:
    forced = lay.forced_tokens(torch.arange(lay.num_gen_tokens))
    assert all(tokens[g] == f for g, f in enumerate(forced.tolist()) if f >= 0)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    for fam in ("anole", "lumina_mgpt", "llamagen_t2i", "llamagen_c2i", "tar"):
        write_tiny(fam, root / fam, seed=0)
    return root


def load(fam: str, path: Path, **over):
    cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{fam}.yaml")
    cfg.path, cfg.device, cfg.dtype = str(path), "cpu", "float64"
    for k, v in over.items():
        OmegaConf.update(cfg, k, v, merge=True)
    return build_target(cfg, plain_decode=ar_tokens)


FAMILY_CASES = [
    ("anole", {}, 3.0),
    ("lumina_mgpt", {"cfg_mode": "batched"}, 3.0),
    ("lumina_mgpt", {"cfg_mode": "sequential"}, 3.0),
    ("llamagen_t2i", {}, 4.0),
    ("llamagen_c2i", {}, 4.0),
    ("tar", {}, 1.0),  # the LM stage (no CFG)
    ("tar", {"stage": "detok", "detok.file": "ar_dtok_lp_256px.pth"}, 4.0),  # AR-DTok (a StaticGPT)
]


@pytest.mark.parametrize("fam,over,scale", FAMILY_CASES, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_every_family_out_of_order_and_zipar(families: Path, fam: str, over: dict, scale: float) -> None:
    t = load(fam, families / fam, **over)
    check_out_of_order(t)
    tokens = check_zipar(t, scale)
    if fam == "lumina_mgpt":
        lay = t.layout
        assert tokens[-1] == lay.eoi_token and all(tokens[r * 5 + 4] == lay.eol_token for r in range(4))


def test_tiny_llamagen_and_mini_out_of_order() -> None:
    check_out_of_order(tiny("tiny_llamagen")[0])
    check_out_of_order(build_target(model_cfg("mini", dtype="float64")))


# ---------------------------------------------------------------------------------------------------------
# Exactness against AR (window ≥ row length) and lossy windows
# ---------------------------------------------------------------------------------------------------------


def check_equals_ar(t, window: int, sp: SamplingParams, seed: int = 3) -> None:
    inputs = t.encode_prompt(TEXT, cfg=sp.use_cfg and t.supports_cfg)
    g = torch.Generator().manual_seed(seed)
    ar = decode_ar(t, inputs, sp, g)
    ar_draw = float(torch.rand(1, generator=g))  # the generator's state after the image: the same draws follow
    g = torch.Generator().manual_seed(seed)
    z = decode_zipar(t, inputs, sp, g, window)
    assert z.tokens == ar.tokens
    assert float(torch.rand(1, generator=g)) == ar_draw
    assert z.target_forwards == ar.target_forwards and len(z.cycles) == len(ar.cycles)
    assert all(c.accepted == 0 and c.nodes == 1 for c in z.cycles) and z.tau == 1.0
    assert z.stats == {"window": window, "target_forwards": len(ar.cycles), "max_parallel": 1, "stand_ins": 0,
                       "requeries": 0}  # fmt: skip
    assert [c.root_gen for c in z.cycles] == list(range(1, t.layout.num_gen_tokens))


@pytest.mark.parametrize("sp", [GREEDY, SAMPLED], ids=["T0", "T1"])
def test_window_at_least_row_len_equals_ar_tiny_llamagen(sp: SamplingParams) -> None:
    t, _ = tiny("tiny_llamagen")
    for w in (4, 7):  # row length 4
        check_equals_ar(t, w, sp)


@pytest.mark.parametrize("sp", [GREEDY, SAMPLED], ids=["T0", "T1"])
def test_window_at_least_row_len_equals_ar_lumina(families: Path, sp: SamplingParams) -> None:
    t = load("lumina_mgpt", families / "lumina_mgpt")
    assert t.layout.row_len == 5 and t.layout.eoi_token is not None
    for w in (5, 6):
        check_equals_ar(t, w, sp)


@pytest.mark.slow
def test_window_at_least_row_len_equals_ar_mini() -> None:
    t = build_target(model_cfg("mini"))  # float32: the forwards are AR's own, so equality is exact
    check_equals_ar(t, 16, GREEDY)
    check_equals_ar(t, 16, SAMPLED)


def test_mini_small_window_is_parallel_and_lossy() -> None:
    t = build_target(model_cfg("mini"))
    inputs = t.encode_prompt("a red circle above a blue square", cfg=True)
    ar = decode_ar(t, inputs, GREEDY, None)
    z = decode_zipar(t, inputs, GREEDY, None, 2)
    steps = window_schedule(None, 16, 16, 2)
    assert len(z.cycles) == len(steps) - 1 == 16 + 15 * 2 - 1
    assert z.tau == pytest.approx(255 / len(z.cycles)) and z.committed == 255
    assert [c.root_gen for c in z.cycles] == [s[0] for s in steps[1:]] and [c.accepted + 1 for c in z.cycles] == [
        len(s) for s in steps[1:]
    ]
    assert z.stats["stand_ins"] == 15 and z.stats["max_parallel"] == 8  # one stand-in per row start
    assert t.layout.tokens_to_codes(z.tokens).shape == (16, 16)
    assert z.tokens != ar.tokens  # lossy: rows start before the row above is done


@pytest.mark.parametrize("window", [1, 2, 3])
def test_lumina_small_windows_sampled(families: Path, window: int) -> None:
    t = load("lumina_mgpt", families / "lumina_mgpt")
    lay = t.layout
    z = decode_zipar(t, t.encode_prompt(TEXT, True), SAMPLED, torch.Generator().manual_seed(0), window)
    steps = zipar_steps(GridShape.of(lay), window)
    assert len(z.cycles) == len(steps) - 1 and z.committed == lay.num_gen_tokens - 1
    assert sum(c.nodes for c in z.cycles) == lay.num_gen_tokens - 1 + z.stats["stand_ins"]  # each real fed once
    assert z.stats["stand_ins"] == (lay.grid_h - 1 if window < lay.row_len else 0)
    assert lay.tokens_to_codes(z.tokens).shape == (4, 4)
    assert_forced_in_place(lay, z.tokens)


def test_requery_plan_decodes_like_ar_where_its_context_is_exact() -> None:
    """A plan with re-queries (x3 before x2): x0, x1, x2 see exactly AR's context, so at T = 0 they are AR's."""
    t, _ = tiny("tiny_llamagen")
    inputs = t.encode_prompt(TEXT, cfg=True)
    ar = decode_ar(t, inputs, GREEDY, None)
    n = t.layout.num_gen_tokens
    steps = [[0], [1], [4], [2], [3, 5], *[[u] for u in range(6, n)]]
    plan = plan_forwards(steps, GridShape.of(t.layout))
    assert sum(f.requeries for f in plan.forwards) >= 1 and sum(f.stand_ins for f in plan.forwards) == 1
    z = decode_plan(t, inputs, GREEDY, None, plan)
    assert z.tokens[:4] == ar.tokens[:4] and len(z.cycles) == len(steps) - 1
    assert t.layout.tokens_to_codes(z.tokens).shape == (4, 4)


# ---------------------------------------------------------------------------------------------------------
# Policy, config and the app
# ---------------------------------------------------------------------------------------------------------


def test_policy_builder_and_dispatch() -> None:
    p = POLICIES.build("zipar", {"name": "zipar", "window": 3})
    assert isinstance(p, ZipARPolicy) and isinstance(p, LoopPolicy)
    assert p.window == 3 and p.lossless is False and not p.uses_drafter and p.name == "zipar"
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ConfigError) as e:
            POLICIES.build("zipar", {"name": "zipar", "window": bad})
        assert e.value.key == "policy.window"
    with pytest.raises(ValueError, match="window"):
        decode_zipar(None, None, GREEDY, None, 0)  # type: ignore[arg-type]
    t, _ = tiny("tiny_llamagen")
    inputs = t.encode_prompt(TEXT, cfg=True)
    via_engine = generate(t, None, p, inputs, GREEDY, None)
    assert via_engine.tokens == decode_zipar(t, inputs, GREEDY, None, 3).tokens and via_engine.stats["window"] == 3


def compose_run(*overrides: str):
    from adtbench.harness.config import register_resolvers

    register_resolvers()
    fast = ["warmup=0", "progress=false", "maps.per_run=false"]
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=[*TINY_OVERRIDES, *fast, *overrides])


def test_app_zipar_end_to_end(tmp_path: Path) -> None:
    from adtbench.harness.app import run

    cfg = compose_run("policy=zipar", "policy.window=2", "dataset=smoke", "dataset.limit=2")
    out = tmp_path / "run"
    summary = run(cfg, out, {"model": "tiny_llamagen", "policy": "zipar"})
    recs = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    steps = len(window_schedule(None, 4, 4, 2))
    for r in recs:
        assert r["stats"] == {"window": 2, "target_forwards": steps - 1, "max_parallel": 2, "stand_ins": 3,
                              "requeries": 0}  # fmt: skip
        assert r["cycles"] == steps - 1 and r["committed"] == 15 and r["tau"] == pytest.approx(15 / (steps - 1))
        assert r["target_forwards"] == steps and r["baseline_target_forwards"] == 16
        assert r["speedup"] is not None and len(r["tokens"]) == 16
    s = json.loads((out / "summary.json").read_text())
    assert s["policy"] == "zipar" and s["n_samples"] == 2 and summary["tau"] == pytest.approx(15 / (steps - 1))
    assert s["policy_params"] == {"name": "zipar", "window": 2}
    trace = [json.loads(x) for x in (out / "trace.jsonl").read_text().splitlines()]
    assert trace[0]["a"] == [c - 1 for c in map(len, window_schedule(None, 4, 4, 2)[1:])]
    assert sum(trace[0]["temporary"]) == 3


@pytest.mark.parametrize(
    "overrides,key",
    [(("policy=zipar", "lantern=on"), "lantern.enabled"), (("policy=zipar", "policy.window=0"), "policy.window")],
)
def test_app_bad_config_names_the_key(tmp_path: Path, overrides: tuple[str, ...], key: str) -> None:
    from adtbench.harness.app import run

    with pytest.raises(ConfigError) as e:
        run(compose_run(*overrides), tmp_path / "x", {})
    assert e.value.key == key


def test_a_forwards_draws_are_the_row_by_row_draws_of_the_ar_baseline() -> None:
    """``draw`` samples every row of a forward in one exponential race; on a CPU generator these are the draws of
    ``next_token_tensor`` row by row (the AR baseline's), token for token and to the generator's state after."""
    from adtbench.algorithm.methods.zipar import draw
    from adtbench.algorithm.sampling import next_token_tensor

    sp = SamplingParams(temperature=1.0)
    for m in (1, 3, 8):
        x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m)) * 3
        g, h = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        assert draw(x, sp, g) == [int(next_token_tensor(row, sp, h)) for row in x]
        assert torch.equal(g.get_state(), h.get_state())
