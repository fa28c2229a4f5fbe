"""The real model families on tiny random checkpoints written in their exact on-disk layouts.

Per family (Anole, Lumina-mGPT, LlamaGen t2i/c2i, Tar LM and AR-DTok stages): the checkpoint loads through the
real loader (Lumina's (1, head_dim) q/k-norm trap; LlamaGen's ``["model"]`` wrapper, bare dict and LANTERN HF
layout; Tar's LLaVA-style config), tree verification equals sequential decoding, T = 0 EAGLE-2 equals AR with
CFG on, and the VQ decode gives the right image size. Plus: path errors name the key and the expected file,
public drafter conversion, ``make-tiny``/``bench cost`` entry points and the command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_in_process
from omegaconf import OmegaConf

from adtbench.algorithm.ar import ar_tokens
from adtbench.algorithm.drafters.eagle import EagleConfig
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import ConfigError
from adtbench.harness.config import register_resolvers
from adtbench.harness.drafters import build_drafter
from adtbench.models.registry import build_target, resolve_dtype
from adtbench.sampling_params import SamplingParams
from adtbench.tools.make_tiny import FAMILIES, write_tiny

ROOT = Path(__file__).resolve().parents[1]
ONE = torch.ones(1, 1, dtype=torch.bool)
ZERO = torch.zeros(1, dtype=torch.long)
TEXT = "3 a red cat on a mat"  # c2i reads the leading class id; the others read the caption
register_resolvers()
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Every family's tiny checkpoint (and LlamaGen's bare and LANTERN layouts), with in-memory references."""
    root = tmp_path_factory.mktemp("tiny")
    refs = {fam: write_tiny(fam, root / fam, seed=0) for fam in FAMILIES}
    for layout in ("bare", "lantern"):
        refs[f"llamagen_t2i_{layout}"] = write_tiny("llamagen_t2i", root / f"llamagen_t2i_{layout}", 0, layout)
    return root, refs


def model_cfg(fam: str, path: Path | str, dtype: str = "float64", **over):
    cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{fam}.yaml")
    cfg.path, cfg.device, cfg.dtype = str(path), "cpu", dtype
    for k, v in over.items():
        OmegaConf.update(cfg, k, v, merge=True)
    return cfg


_CACHE: dict[tuple, object] = {}


def load(fam: str, path: Path, **over):
    key = (fam, str(path), tuple(sorted(over.items())))
    if key not in _CACHE:
        _CACHE[key] = build_target(model_cfg(fam, path, **over), plain_decode=ar_tokens)
    return _CACHE[key]


def drafter_for(t):
    d = OmegaConf.create({"kind": "eagle", "path": None, "seed": 1, "num_layers": 1, "input_norm": False})
    return build_drafter(d, t)


# ---------------------------------------------------------------------------------------------------------
# Generic checks every family runs
# ---------------------------------------------------------------------------------------------------------


def check_tree_matches_sequential(t, text: str = TEXT) -> None:
    """Prefill + one tree verification == a fresh prefill + one single-token step per path token."""
    cfg = t.supports_cfg
    lay = t.layout
    toks = lay.image_token_offset + torch.tensor([5, 17, 30, 41, 2]) % lay.num_codes
    tree = DraftTree(tokens=toks, parents=[-1, 0, 0, 1, 2], drafted_depth=2)
    t.start(t.encode_prompt(text, cfg=cfg), tree.size)
    tree_logits, tree_feats = t.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    assert tree_logits.shape == (t.rows, 5, lay.vocab_size) and tree_feats.shape[-1] == t.hidden_size
    for node in range(tree.size):
        t.start(t.encode_prompt(text, cfg=cfg), tree.size)
        for tok in tree.tokens[tree.path_to(node)].tolist():
            logits, _ = t.verify_forward(torch.tensor([tok]), ONE, ZERO)
            t.commit(ZERO)
        torch.testing.assert_close(tree_logits[:, node], logits[:, 0], atol=1e-8, rtol=0)
    # negative control: siblings that see each other give different logits
    t.start(t.encode_prompt(text, cfg=cfg), tree.size)
    wrong, _ = t.verify_forward(tree.tokens, torch.ones(5, 5, dtype=torch.bool).tril(), tree.depth)
    assert (wrong - tree_logits).abs().max() > 1e-3


def check_greedy_eagle2_equals_ar(t, cfg_scale: float, text: str = TEXT) -> list[int]:
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    inputs = t.encode_prompt(text, cfg=sp.use_cfg and t.supports_cfg)
    ar = decode_ar(t, inputs, sp, None)
    spec = generate(t, drafter_for(t), Eagle2Policy(depth=3, top_k=4, total_tokens=12), inputs, sp, None)
    assert spec.tokens == ar.tokens
    assert len(ar.tokens) == t.layout.num_gen_tokens
    assert spec.target_forwards <= ar.target_forwards
    codes = t.layout.tokens_to_codes(ar.tokens)  # raises if a non-image token sits at an image position
    assert codes.shape == (t.layout.grid_h, t.layout.grid_w)
    return ar.tokens


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, skip: tuple[str, ...] = ()) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    keys = [k for k in sb if not k.startswith(skip)]
    assert keys and set(keys) <= set(sa)
    for k in keys:
        torch.testing.assert_close(sa[k].double(), sb[k].double(), atol=0, rtol=0, msg=k)


# ---------------------------------------------------------------------------------------------------------
# Anole
# ---------------------------------------------------------------------------------------------------------


def test_anole_loads_real_layout(tiny) -> None:
    root, refs = tiny
    d = root / "anole"
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) == 3  # sharded, as the HF release
    assert any(k.startswith("model.vqmodel.") for k in idx["weight_map"])
    t = load("anole", d, impl="hf")  # the lean default's weights: tests/test_chameleon_lean.py
    assert_same_weights(t.lm, refs["anole"]["lm"])
    lay = t.layout
    assert (lay.image_token_offset, lay.num_codes, lay.grid_h, lay.num_gen_tokens) == (4, 64, 4, 16)
    # the real tokenizer path: characters → the filler ids (tokenizer.json in the model folder)
    ids = t.tokenizer("ab")
    assert len(ids) == 2 and all(i >= 72 for i in ids) and ids[0] != ids[1]
    assert t.encode_prompt("ab", cfg=True).data["ids"][0].tolist() == [0, *ids, 71, 69]


def test_anole_tree_greedy_and_decode(tiny) -> None:
    root, _ = tiny
    t = load("anole", root / "anole")
    check_tree_matches_sequential(t)
    tokens = check_greedy_eagle2_equals_ar(t, 3.0)
    img = t.decode_image(t.layout.tokens_to_codes(tokens))
    assert img.shape == (16, 16, 3) and img.dtype.name == "uint8"  # 4×4 codes × factor 4


# ---------------------------------------------------------------------------------------------------------
# Lumina-mGPT
# ---------------------------------------------------------------------------------------------------------


def test_lumina_qk_norm_trap(tiny) -> None:
    from transformers import ChameleonForConditionalGeneration

    from adtbench.models.hf_checkpoint import checkpoint_shapes, expand_qk_norm, safetensors_files

    root, refs = tiny
    d = root / "lumina_mgpt"
    shapes = checkpoint_shapes(safetensors_files(d))
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (1, 16)
    assert not any(k.startswith("model.vqmodel.") for k in shapes)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["ChameleonXLLMXForConditionalGeneration"] and "z_loss_weight" in cfg
    with pytest.raises(RuntimeError, match=r"size mismatch|shape"):  # the trap: plain loading fails
        ChameleonForConditionalGeneration.from_pretrained(str(d))
    t = load("lumina_mgpt", d, impl="hf")
    assert_same_weights(t.lm, refs["lumina_mgpt"]["lm"], skip=("model.vqmodel.",))
    assert t.lm.model.layers[1].self_attn.k_norm.weight.shape == (4, 16)
    v = torch.arange(6.0).view(1, 6)
    assert expand_qk_norm(v, 3).tolist() == [list(range(6))] * 3
    with pytest.raises(ValueError, match="cannot be expanded"):
        expand_qk_norm(torch.zeros(3, 6), 4)


def test_lumina_layout_and_prompt(tiny) -> None:
    from adtbench.models.chameleon.lumina import EOL_NAME, size_token_name

    root, _ = tiny
    t = load("lumina_mgpt", root / "lumina_mgpt")
    vm, lay = t.net.config.vocabulary_map, t.layout
    assert size_token_name(24) == "<reserved08824>"
    assert lay.eol_token == vm[EOL_NAME] and lay.eoi_token == vm["<eoss>"]
    assert lay.num_gen_tokens == 4 * (4 + 1) + 1
    inp = t.encode_prompt("ab", cfg=True)
    ids, valid, pos = inp.data["ids"], inp.data["valid"], inp.data["positions"]
    header = [vm["<racm3:break>"], vm[size_token_name(2)], vm[size_token_name(2)]]
    assert ids[0, -4:].tolist() == [vm["<reserved08706>"], *header] and ids[0, 0] == vm["<s>"]
    assert ids[1, -3:].tolist() == header and valid[1].sum() == 3 and pos[1, -3:].tolist() == [0, 1, 2]
    words = "Generate an image of 64x64 according to the following prompt:\nab"
    assert ids.shape[1] == len(t.tokenizer(words)) + 5


@pytest.mark.parametrize("mode", ["sequential", "batched"])
def test_lumina_tree_greedy_and_decode(tiny, mode: str) -> None:
    root, _ = tiny
    t = load("lumina_mgpt", root / "lumina_mgpt", cfg_mode=mode)
    assert t.cfg_mode == mode
    check_tree_matches_sequential(t)
    tokens = check_greedy_eagle2_equals_ar(t, 3.0)
    lay = t.layout
    assert tokens[-1] == lay.eoi_token and all(tokens[r * 5 + 4] == lay.eol_token for r in range(4))
    assert t.decode_image(lay.tokens_to_codes(tokens)).shape == (16, 16, 3)


def test_lumina_sequential_equals_batched_cfg(tiny) -> None:
    """The official unbatched CFG (second cache) and the batched 2-row forward give the same logits."""
    root, _ = tiny
    out = {}
    for mode in ("sequential", "batched"):
        t = load("lumina_mgpt", root / "lumina_mgpt", cfg_mode=mode, impl="hf")
        res = t.start(t.encode_prompt(TEXT, cfg=True), 4)
        step, _ = t.verify_forward(torch.tensor([7, 9]), torch.ones(2, 2, dtype=torch.bool).tril(), torch.arange(2))
        out[mode] = (res.logits, step, t.caches)
    torch.testing.assert_close(out["sequential"][0], out["batched"][0], atol=1e-9, rtol=0)
    torch.testing.assert_close(out["sequential"][1], out["batched"][1], atol=1e-9, rtol=0)
    seq_caches = out["sequential"][2]
    assert len(seq_caches) == 2  # one per CFG row
    from adtbench.models.hf_causal import cache_get

    assert cache_get(seq_caches[1], 0)[0].shape[2] == 3 + 2  # uncond: only [boi, h, w] + the two steps


def test_lumina_temperature_sampling_runs(tiny) -> None:
    root, _ = tiny
    t = load("lumina_mgpt", root / "lumina_mgpt")
    sp = SamplingParams(temperature=0.8, top_k=20, cfg_scale=4.0)
    g = torch.Generator().manual_seed(0)
    res = generate(t, drafter_for(t), Eagle2Policy(3, 4, 12), t.encode_prompt(TEXT, True), sp, g)
    codes = t.layout.tokens_to_codes(res.tokens)  # forced EOL/EOI in place, image ids elsewhere
    assert codes.shape == (4, 4)


# ---------------------------------------------------------------------------------------------------------
# LlamaGen
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["official", "bare", "lantern"])
def test_llamagen_checkpoint_layouts(tiny, layout: str) -> None:
    from adtbench.models.llamagen.gpt import load_gpt_state_dict

    root, refs = tiny
    d = root / ("llamagen_t2i" if layout == "official" else f"llamagen_t2i_{layout}")
    if layout != "lantern":
        raw = torch.load(d / "t2i_XL_stage1_256.pt", weights_only=True)
        assert ("model" in raw) == (layout == "official")
    else:
        assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()
        sd, cfg = load_gpt_state_dict(d)
        assert cfg is not None and cfg.cls_token_num == 120 and "layers.0.attention.wqkv.weight" in sd
    t = load("llamagen_t2i", d)
    assert_same_weights(t.gpt, refs["llamagen_t2i"]["gpt"])  # every layout gives the same network
    assert t.drafter_cls_shift == 1 and t.drafter_rope(16).cls_len == 119
    assert t.gpt.cfg.cls_token_num == 120 and t.layout.num_gen_tokens == 16


def test_llamagen_t2i_t5_features(tiny) -> None:
    root, _ = tiny
    t = load("llamagen_t2i", root / "llamagen_t2i")
    inp = t.encode_prompt("ab", cfg=True)
    cap, valid = inp.data["caption"], inp.data["valid"]
    assert cap.shape == (120, 32) and valid.sum() == 3  # 'a', 'b', '</s>' right-aligned (left padding)
    assert valid[-3:].all() and not valid[:-3].any() and cap[:-3].abs().sum() == 0
    feats = t.text_encoder("ab")
    torch.testing.assert_close(cap[-3:], feats.to(cap.dtype))


@pytest.mark.parametrize("fam", ["llamagen_t2i", "llamagen_c2i"])
def test_llamagen_tree_greedy_and_decode(tiny, fam: str) -> None:
    root, _ = tiny
    t = load(fam, root / fam)
    check_tree_matches_sequential(t)
    tokens = check_greedy_eagle2_equals_ar(t, 4.0)
    assert t.decode_image(t.layout.tokens_to_codes(tokens)).shape == (8, 8, 3)  # 4×4 codes × factor 2


def test_llamagen_c2i_prompts(tiny) -> None:
    root, _ = tiny
    t = load("llamagen_c2i", root / "llamagen_c2i")
    assert t.encode_prompt("7 golden retriever", cfg=True).data["label"] == 7
    with pytest.raises(ValueError, match="class id"):
        t.encode_prompt("a dog", cfg=True)
    with pytest.raises(ValueError, match="outside"):
        t.encode_prompt("10", cfg=True)  # tiny: 10 classes (+ the null class 10)


# ---------------------------------------------------------------------------------------------------------
# Tar
# ---------------------------------------------------------------------------------------------------------


def test_tar_loads_llava_checkpoint(tiny) -> None:
    from adtbench.models.tar.target import TarLMTarget

    root, refs = tiny
    cfg = json.loads((root / "tar" / "config.json").read_text())
    assert cfg["model_type"] == "llava_qwen" and cfg["tie_word_embeddings"]
    t = load("tar", root / "tar")
    assert isinstance(t, TarLMTarget) and not t.supports_cfg
    assert_same_weights(t.lm, refs["tar"]["lm"])
    assert (t.ids.image_start_tag, t.ids.scale_start, t.ids.image_start) == (100, 102, 105)
    lay = t.layout
    assert (lay.image_token_offset, lay.num_codes, lay.grid_h, lay.num_gen_tokens) == (105, 64, 3, 9)
    ids = t.encode_prompt("ab", cfg=True).data["ids"][0].tolist()
    assert ids[-2:] == [100, 102] and ids[0] == 97  # <|im_start|> … <im_start> <S0>
    # the literal "<im_start><S0>" text tokenises to the same ids (added tokens of the tokenizer)
    assert t.tokenizer("<im_start><S0>", add_special_tokens=False)["input_ids"] == [100, 102]
    assert_same_weights(t.tatok, refs["tar"]["tatok"])
    torch.testing.assert_close(t.codebook(), refs["tar"]["tatok"].codebook().double())


def test_tar_lm_stage(tiny) -> None:
    root, _ = tiny
    t = load("tar", root / "tar")
    check_tree_matches_sequential(t)
    tokens = check_greedy_eagle2_equals_ar(t, 1.0)  # no CFG at the LM level
    img = t.decode_image(t.layout.tokens_to_codes(tokens))  # TA-Tok → AR-DTok (4×4) → VQ (×2)
    assert img.shape == (8, 8, 3)


@pytest.mark.parametrize("stage", ["lm", "detok"])
def test_tar_runs_its_other_stage_through_the_loop_it_is_handed(tiny, stage: str) -> None:
    """The models import nothing of the algorithm layer: Tar's unspeculated stage runs through the ``plain_decode``
    its builder was handed (``algorithm.ar.ar_tokens``); built without one, it says so when that stage runs."""
    root, _ = tiny
    calls = []

    def decode(target, inputs, sp, generator):
        calls.append(type(target).__name__)
        return ar_tokens(target, inputs, sp, generator)

    over = {"stage": stage, "detok.file": "ar_dtok_lp_256px.pth"}
    t = build_target(model_cfg("tar", root / "tar", **over), plain_decode=decode)
    codes = torch.zeros(t.layout.grid_h, t.layout.grid_w, dtype=torch.long)
    t.decode_image(codes) if stage == "lm" else t.encode_prompt(TEXT, cfg=True)
    assert calls == ["ARDTokTarget" if stage == "lm" else "TarLMTarget"]
    bare = build_target(model_cfg("tar", root / "tar", **over))
    with pytest.raises(RuntimeError, match="plain_decode"):
        bare.decode_image(codes) if stage == "lm" else bare.encode_prompt(TEXT, cfg=True)


@pytest.mark.parametrize("res,px", [(256, 8), (512, 16)])
def test_tar_detok_stage(tiny, res: int, px: int) -> None:
    from adtbench.models.tar.ardtok import ARDTokTarget

    root, refs = tiny
    t = load("tar", root / "tar", stage="detok", **{"detok.file": f"ar_dtok_lp_{res}px.pth"})
    assert isinstance(t, ARDTokTarget)
    assert_same_weights(t.net, refs["tar"]["detok"][res])
    g = int(res // 64)
    assert t.layout.grid_h == g and t.net.cfg.cls_token_num == 9
    inp = t.encode_prompt(TEXT, cfg=True)
    assert inp.data["features"].shape == (9, 32)
    check_tree_matches_sequential(t)
    tokens = check_greedy_eagle2_equals_ar(t, 4.0)
    assert t.decode_image(t.layout.tokens_to_codes(tokens)).shape == (px, px, 3)


CAPABILITY_CASES = [  # every registered family (``models.registry.FAMILIES``), each implementation and Tar stage
    ("anole", {}),
    ("anole", {"impl": "hf"}),
    ("lumina_mgpt", {}),
    ("lumina_mgpt", {"impl": "hf"}),
    ("llamagen_t2i", {}),
    ("llamagen_c2i", {}),
    ("tar", {}),
    ("tar", {"stage": "detok"}),
    ("janus_pro", {}),
    ("janus_pro", {"impl": "hf"}),
    ("mini", None),  # shipped weights: conf/model/mini.yaml as it is
    ("emu3", {}),
    ("emu3", {"impl": "hf"}),
]


def test_the_capability_cases_cover_every_family() -> None:
    from adtbench.models.registry import FAMILIES

    fams = {str(OmegaConf.load(ROOT / "conf" / "model" / f"{f}.yaml").family) for f, _ in CAPABILITY_CASES}
    assert fams == set(FAMILIES.names()) - {"anole"}  # family anole is the chameleon adapter under another name


@pytest.mark.parametrize("fam,over", CAPABILITY_CASES, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_every_target_declares_its_capabilities_and_they_hold(tiny, fam: str, over: dict | None) -> None:
    """A target declares what it offers (``Capabilities``, on its class) and the harness reads the declaration
    instead of probing: a declared static cache pins and verifies through static buckets, a declared compile has
    ``compile_forward``, a declared batch target runs under ``BatchTarget`` (and an undeclared one is refused), and
    the config check's batched families declare batch."""
    from adtbench.harness.config import BATCHED_FAMILIES
    from adtbench.models.base import Capabilities, StaticGPTTarget
    from adtbench.models.batch import BatchTarget

    root, _ = tiny
    cfg = OmegaConf.load(ROOT / "conf" / "model" / "mini.yaml") if over is None else model_cfg(fam, root / fam, **over)
    t = build_target(cfg, plain_decode=ar_tokens)  # fresh: pinning must not leak into the shared cache
    caps = type(t).capabilities
    assert isinstance(caps, Capabilities) and t.capabilities is caps
    assert caps.static_cache == callable(getattr(t, "request_static", None)) == isinstance(t, StaticGPTTarget)
    assert caps.compile == callable(getattr(t, "compile_forward", None))
    assert not caps.graphs or caps.static_cache  # graphs are captures of the static buckets
    inputs = t.encode_prompt(TEXT, cfg=t.supports_cfg)
    if caps.static_cache:
        t.request_static(graphs=False)
        t.start(inputs, 4)
        assert t.static is not None and t.cache is t.pinned
    if caps.batch:
        bt = BatchTarget(t, 2, inputs.cfg, t.prompt_length(inputs) + t.layout.num_gen_tokens + 4)
        res = bt.admit(0, inputs)
        assert res.logits.shape[-1] == t.layout.vocab_size
    else:
        with pytest.raises(TypeError, match="declares batch"):
            BatchTarget(t, 2, inputs.cfg, 64)
    if str(cfg.family) in BATCHED_FAMILIES and str(cfg.get("impl", "lean")) == "lean":
        assert caps.batch
    # its weights, declared (``Target.weights``: the weight-read floor, the cost model's key): the network the
    # forward runs, every parameter of it
    net = t.net if isinstance(t, StaticGPTTarget) else t.lm
    ids = {id(w) for w in t.weights()}
    assert ids and ids == {id(w) for w in net.parameters()}


REUSE_FAMILIES = ("anole", "lumina_mgpt", "llamagen_t2i", "llamagen_c2i", "emu3", "janus_pro")
"""The families whose default target is a ``StaticGPTTarget`` with a text prompt (Tar's AR-DTok reads the LM's
features): those ``reuse_prefill`` serves."""


@pytest.mark.parametrize("fam", REUSE_FAMILIES)
def test_a_reused_prefill_draws_the_same_images(tiny, fam: str) -> None:
    """``StaticGPTTarget.reuse_prefill`` restores what the family's ``_prefill`` leaves (its K/V columns, its
    outputs; a left-padded uncond row where the family pads): T = 1 images of AR and EAGLE-2 from one generator per
    seed are the same with it as without, and a batch's admitted slot holds the same prompt K/V."""
    from adtbench.models.base import StaticGPTTarget
    from adtbench.models.batch import BatchTarget

    root, _ = tiny
    t = load(fam, root / fam)
    assert isinstance(t, StaticGPTTarget)
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0 if t.supports_cfg else 1.0)
    inputs, drafter = t.encode_prompt(TEXT, cfg=sp.use_cfg and t.supports_cfg), drafter_for(t)
    cap = t.prompt_length(inputs) + t.layout.num_gen_tokens + 12

    def draw(seed: int) -> tuple[list[list[int]], torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        images = [decode_ar(t, inputs, sp, g).tokens, decode_ar(t, inputs, sp, g).tokens]
        images += [generate(t, drafter, Eagle2Policy(depth=2, top_k=3, total_tokens=8), inputs, sp, g).tokens
                   for _ in range(2)]  # fmt: skip
        bt = BatchTarget(t, 2, inputs.cfg, cap)
        bt.admit(1, inputs)
        bt.admit(1, inputs)
        return images, bt.cache.buf[:, bt.slot_rows(1)].clone()

    plain = [draw(seed) for seed in (0, 1)]
    with t.reuse_prefill(inputs):
        reused = [draw(seed) for seed in (0, 1)]
    for (a, kv_a), (b, kv_b) in zip(plain, reused, strict=True):
        assert a == b and torch.equal(kv_a, kv_b), fam


# ---------------------------------------------------------------------------------------------------------
# LANTERN neighbourhoods: every family exposes its codebook (row c = code c)
# ---------------------------------------------------------------------------------------------------------


def test_codebooks_for_lantern(tiny) -> None:
    from adtbench.harness.caches import build_lantern_rule

    root, refs = tiny
    cases = [
        ("anole", {}, refs["anole"]["vq"].codebook()),
        ("lumina_mgpt", {}, refs["lumina_mgpt"]["vq"].codebook()),
        ("llamagen_t2i", {}, refs["llamagen_t2i"]["vq"].codebook()),
        ("tar", {}, refs["tar"]["tatok"].codebook()),
        ("tar", {"stage": "detok"}, refs["tar"]["vq"].codebook()),
        ("emu3", {}, refs["emu3"]["model"].model.vqmodel.quantize.embedding.weight),
    ]
    node = OmegaConf.create({"enabled": True, "k": 3, "delta": 0.1, "normalize": False, "cache_dir": None})
    for fam, over, ref in cases:
        t = load(fam, root / fam, **over)
        cb = t.codebook()
        assert cb.shape[0] == t.layout.num_codes, fam
        torch.testing.assert_close(cb.double(), ref.detach().double(), atol=1e-6, rtol=0, msg=fam)
        assert build_lantern_rule(node, t).name.startswith("lantern"), fam


# ---------------------------------------------------------------------------------------------------------
# Paths, validation, sidecar, dtype
# ---------------------------------------------------------------------------------------------------------


def test_missing_paths_name_key_and_file(tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import adtbench.models.chameleon.target as cham

    root, _ = tiny
    with pytest.raises(ConfigError, match=r"config.json") as e:
        build_target(model_cfg("anole", tmp_path / "nope"))
    assert e.value.key == "model.path"
    # the VQ files are checked before the LM weights are read
    for loader in ("load_chameleon_lm", "load_chameleon_net"):  # the hf and the lean path
        monkeypatch.setattr(cham, loader, lambda *a, **k: pytest.fail("LM loaded before path checks"))
    with pytest.raises(ConfigError, match=r"vqgan.ckpt") as e:
        build_target(model_cfg("anole", root / "anole", **{"vq.ckpt": "missing/vqgan.ckpt"}))
    assert e.value.key == "model.vq.ckpt"
    with pytest.raises(ConfigError, match=r"t2i_XL_stage1_256.pt") as e:
        build_target(model_cfg("llamagen_t2i", tmp_path))
    assert e.value.key == "model.path"
    with pytest.raises(ConfigError, match=r"vq_ds16_c2i.pt") as e:
        build_target(model_cfg("llamagen_c2i", root / "llamagen_c2i", **{"vq.path": str(tmp_path / "x.pt")}))
    assert e.value.key == "model.vq.path"
    with pytest.raises(ConfigError, match=r"config.json") as e:
        build_target(model_cfg("llamagen_t2i", root / "llamagen_t2i", **{"text_encoder.path": str(tmp_path)}))
    assert e.value.key == "model.text_encoder.path"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the default detok.path is a hub id: never reach out in tests
    with pytest.raises(ConfigError, match=r"ar_dtok_lp_1024px.pth") as e:
        build_target(model_cfg("tar", root / "tar", **{"detok.file": "ar_dtok_lp_1024px.pth"}))
    assert e.value.key == "model.detok.path"


def test_hub_ids_offline(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tiny
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"HF_HUB_OFFLINE.*config.json") as e:
        build_target(model_cfg("lumina_mgpt", "Alpha-VLLM/Lumina-mGPT-7B-768"))
    assert e.value.key == "model.path"
    # a repo id companion whose file already sits in the model folder is used without the hub
    t = load("llamagen_c2i", root / "llamagen_c2i", **{"vq.path": "FoundationVision/LlamaGen"})
    assert t.vq is not None
    with pytest.raises(ConfigError, match=r"HF_HUB_OFFLINE.*other.pt") as e:
        build_target(model_cfg("llamagen_c2i", root / "llamagen_c2i", **{"vq.path": "x/y", "vq.file": "other.pt"}))
    assert e.value.key == "model.vq.path"


def test_dtype_device_and_attention_options(tiny) -> None:
    root, _ = tiny
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ConfigError, match=r"model.dtype"):
        resolve_dtype("fp8", torch.device("cpu"))
    t = build_target(
        model_cfg("anole", root / "anole", dtype="auto", device="auto", attn_implementation="eager", impl="hf")
    )
    assert t.dtype == (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    assert t.lm.config._attn_implementation == "eager"
    with pytest.raises(ConfigError, match="attn_implementation"):
        build_target(model_cfg("anole", root / "anole", attn_implementation="flash_attention_2"))
    with pytest.raises(ConfigError, match="cfg_mode"):
        build_target(model_cfg("lumina_mgpt", root / "lumina_mgpt", cfg_mode="parallel"))


def test_sidecar_describes_tiny_checkpoints(tiny) -> None:
    root, _ = tiny
    side = json.loads((root / "llamagen_c2i" / "adtbench.json").read_text())
    assert side["family"] == "llamagen_c2i" and side["model"]["arch"]["num_classes"] == 10
    assert (root / "tar" / "README.txt").read_text().startswith("Tiny RANDOM tar")


def test_make_tiny_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from adtbench.tools.make_tiny import main

    assert main([]) == 2
    assert main(["model=nope", f"out={tmp_path / 'a'}"]) == 2
    assert main(["model=llamagen_c2i", f"out={tmp_path / 'c2i'}", "layout=bare"]) == 0
    printed = capsys.readouterr().out
    assert "run: python run.py model=llamagen_c2i" in printed
    # the printed command passes the app's checks: a tiny checkpoint has no trained drafter, so it asks for a random one
    from hydra import compose, initialize_config_dir

    from adtbench.harness.config import register_resolvers, resolve_paths, validate

    command = printed.split("run: python run.py ", 1)[1].split()
    assert "drafter.random=true" in command
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=command)
    resolve_paths(cfg)
    validate(cfg)
    assert main(["model=llamagen_c2i", f"out={tmp_path / 'c2i'}"]) == 2  # refuses a non-empty folder
    t = build_target(model_cfg("llamagen_c2i", tmp_path / "c2i"))
    assert t.gpt.cfg.model_type == "c2i"


# ---------------------------------------------------------------------------------------------------------
# Public drafter conversion
# ---------------------------------------------------------------------------------------------------------


def _lantern_drafter_sd(hidden: int, heads: int, inter: int, vocab: int, qk: bool, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, s: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64) * s

    hd = hidden // heads
    sd = {
        "embed_tokens.weight": r(vocab, hidden, s=1.0),
        "fc.weight": r(hidden, 2 * hidden),
        "fc.bias": r(hidden),
        "layers.0.post_attention_layernorm.weight": 1 + r(hidden),
        "layers.0.mlp.gate_proj.weight": r(inter, hidden),
        "layers.0.mlp.up_proj.weight": r(inter, hidden),
        "layers.0.mlp.down_proj.weight": r(hidden, inter),
    }
    for n in "qkvo":
        sd[f"layers.0.self_attn.{n}_proj.weight"] = r(hidden, hidden)
    if qk:  # LANTERN cnets_anole: input norm + Chameleon per-head LayerNorms
        sd["layers.0.input_layernorm.weight"] = 1 + r(hidden)
        for n in "qk":
            sd[f"layers.0.self_attn.{n}_norm.weight"] = 1 + r(heads, hd)
            sd[f"layers.0.self_attn.{n}_norm.bias"] = r(heads, hd)
    return sd


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _lantern_reference(sd, feats, embeds, cos, sin, style: str, heads: int, eps: float, qk: bool) -> torch.Tensor:
    """An independent LANTERN drafter forward (causal, one layer) from the documented semantics."""
    m, hidden = feats.shape
    hd = hidden // heads
    x = torch.cat([embeds, feats], -1) @ sd["fc.weight"].T + sd["fc.bias"]
    h = _rms(x, sd["layers.0.input_layernorm.weight"], eps) if qk else x
    q, k, v = (h @ sd[f"layers.0.self_attn.{n}_proj.weight"].T for n in "qkv")
    q, k, v = (z.view(m, heads, hd) for z in (q, k, v))
    if qk:
        for name in ("q", "k"):
            z = q if name == "q" else k
            z = F.layer_norm(z, (hd,), eps=1e-5) * sd[f"layers.0.self_attn.{name}_norm.weight"]
            z = z + sd[f"layers.0.self_attn.{name}_norm.bias"]
            q, k = (z, k) if name == "q" else (q, z)

    def rot(z: torch.Tensor) -> torch.Tensor:  # z [m, heads, hd]; cos/sin [m, hd/2]
        c, s = cos[:, None], sin[:, None]
        if style == "half":
            a, b = z[..., : hd // 2], z[..., hd // 2 :]
            return torch.cat([a * c - b * s, b * c + a * s], -1)
        a, b = z[..., 0::2], z[..., 1::2]
        return torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)

    q, k = rot(q), rot(k)
    att = torch.einsum("qhd,khd->hqk", q, k) / hd**0.5
    att = att.masked_fill(~torch.ones(m, m, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    o = torch.einsum("hqk,khd->qhd", att, v).reshape(m, hidden) @ sd["layers.0.self_attn.o_proj.weight"].T
    x = x + o
    y = _rms(x, sd["layers.0.post_attention_layernorm.weight"], eps)
    y = F.silu(y @ sd["layers.0.mlp.gate_proj.weight"].T) * (y @ sd["layers.0.mlp.up_proj.weight"].T)
    return x + y @ sd["layers.0.mlp.down_proj.weight"].T


def _write_drafter(src: Path, sd: dict, config: dict, bin_format: bool) -> None:
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(config))
    if bin_format:
        torch.save({k: v.float() for k, v in sd.items()}, src / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file({k: v.float().contiguous() for k, v in sd.items()}, str(src / "model.safetensors"))


def _grid_cos_sin(pos: torch.Tensor, hd: int, grid: int, zeros: int) -> tuple[torch.Tensor, torch.Tensor]:
    """LANTERN's ``precompute_freqs_cis_2d(grid, hd, 10000, cls_token_num=zeros)`` rows at ``pos``."""
    half = hd // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2, dtype=torch.float64)[: half // 2] / half))
    t = torch.arange(grid, dtype=torch.float64)
    f = torch.outer(t, freqs)
    cells = torch.cat([f[:, None].expand(-1, grid, -1), f[None].expand(grid, -1, -1)], -1).flatten(0, 1)
    table = torch.cat([torch.full((zeros, half), float("nan")), cells, torch.full((10, half), float("nan"))])
    ang = table[pos]
    live = ~ang.isnan()
    return torch.where(live, ang.cos(), 0.0), torch.where(live, ang.sin(), 0.0)


def test_convert_lantern_llamagen_drafter(tiny, tmp_path: Path) -> None:
    from adtbench.tools.convert_drafter import convert

    root, _ = tiny
    t = load("llamagen_t2i", root / "llamagen_t2i")  # drafter_rope: lantern (shift 1)
    sd = {k: v.float().double() for k, v in _lantern_drafter_sd(64, 4, 96, 64, qk=False, seed=3).items()}
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-6}
    _write_drafter(tmp_path / "src", sd, config | {"input_type": "t2i", "intermediate_size": 96}, bin_format=True)
    rec = convert(tmp_path / "src", tmp_path / "dst", t.gpt.tok_embeddings.weight.detach())
    assert rec["dropped"] == [] and rec["embedding_rows"] == 64 and "drafter_rope=lantern" in rec["notes"][0]
    assert rec["embedding_max_abs_diff"] > 0  # random source: differs from the target's embedding
    dcfg = OmegaConf.create({"kind": "eagle", "path": str(tmp_path / "dst"), "seed": 0})
    drafter = build_drafter(dcfg, t)
    assert drafter.config.input_norm is False and drafter.config.intermediate_size == 96
    ids = torch.arange(20)  # the drafter embeds with the copy it stores, not the target's table
    assert torch.equal(drafter.embed(t, ids), sd["embed_tokens.weight"].float()[ids])
    pos = torch.arange(110, 130)  # caption tail (zero rotation) and the first image rows
    feats, embeds = torch.randn(20, 64, dtype=torch.float64), sd["embed_tokens.weight"][torch.arange(20)]
    drafter.reset(1, 32)
    mask = torch.ones(20, 20, dtype=torch.bool).tril()[None, None]
    ours = drafter.forward(embeds[None], feats[None], pos[None], mask, 0)[0]
    cos, sin = _grid_cos_sin(pos, 16, 4, 119)
    ref = _lantern_reference(sd, feats, embeds, cos, sin, "interleaved", 4, 1e-6, qk=False)
    torch.testing.assert_close(ours, ref, atol=1e-9, rtol=0)
    # negative control: the un-shifted convention (slot at its own grid cell) differs
    cos0, sin0 = _grid_cos_sin(pos, 16, 4, 120)
    assert (_lantern_reference(sd, feats, embeds, cos0, sin0, "interleaved", 4, 1e-6, False) - ref).abs().max() > 1e-3


def test_convert_lantern_anole_drafter(tiny, tmp_path: Path) -> None:
    """LANTERN's Chameleon drafters carry q/k LayerNorms: converted exactly when EagleConfig can hold them,
    refused (never silently dropped) otherwise."""
    from adtbench.tools.convert_drafter import convert

    root, _ = tiny
    t = load("anole", root / "anole")
    sd = {k: v.float().double() for k, v in _lantern_drafter_sd(64, 4, 128, 128, qk=True, seed=4).items()}
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5}
    _write_drafter(tmp_path / "src", sd, config, bin_format=False)
    if "qk_norm" not in {f.name for f in fields(EagleConfig)}:
        with pytest.raises(ValueError, match="q/k LayerNorms"):
            convert(tmp_path / "src", tmp_path / "dst")
        return
    convert(tmp_path / "src", tmp_path / "dst")
    drafter = build_drafter(OmegaConf.create({"kind": "eagle", "path": str(tmp_path / "dst"), "seed": 0}), t)
    pos = torch.arange(3, 15)
    feats, embeds = torch.randn(12, 64, dtype=torch.float64), sd["embed_tokens.weight"][torch.arange(12)]
    drafter.reset(1, 16)
    mask = torch.ones(12, 12, dtype=torch.bool).tril()[None, None]
    ours = drafter.forward(embeds[None], feats[None], pos[None], mask, 0)[0]
    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    ang = pos[:, None].double() * inv
    ref = _lantern_reference(sd, feats, embeds, ang.cos(), ang.sin(), "half", 4, 1e-5, qk=True)
    torch.testing.assert_close(ours, ref, atol=1e-9, rtol=0)


def test_convert_refuses_unknown_layouts(tmp_path: Path) -> None:
    from adtbench.algorithm.drafters.checkpoint import convert_state_dict

    sd = _lantern_drafter_sd(64, 4, 96, 64, qk=False, seed=5)
    with pytest.raises(ValueError, match="unexpected drafter key"):
        convert_state_dict({**sd, "midlayer.hidden_norm.weight": torch.ones(64)}, {"num_attention_heads": 4})
    with pytest.raises(ValueError, match="num_attention_heads"):
        convert_state_dict(sd, {"num_attention_heads": 5})


# ---------------------------------------------------------------------------------------------------------
# GPU cost model (CPU-safe parts)
# ---------------------------------------------------------------------------------------------------------


def test_bench_cost_runs_on_cpu(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """``adtbench bench cost`` measures on whatever device the model is on (CPU here), prints the cost table and
    writes the JSON; a bad tree size is a key-named config error (exit 2) before anything is built."""
    from adtbench.algorithm.cost import random_tree
    from adtbench.tools.bench import main

    mask, depth = random_tree(20, torch.Generator().manual_seed(0))
    assert torch.equal(mask.sum(1) - 1, depth) and mask.diagonal().all() and not mask.triu(1).any()
    assert main(["cost", "model=tiny_chameleon", "bench.tree_sizes=[0,4]"]) == 2
    assert "bench.tree_sizes" in capsys.readouterr().out
    out = tmp_path / "cost.json"
    over = ["model=tiny_chameleon", "bench.tree_sizes=[1,4]", "bench.level_nodes=4", "bench.repeats=2"]
    over += ["bench.overhead_prompts=1", "dataset.limit=1", "sampling=greedy", f"bench.out={out}"]
    assert main(["cost", *over]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert [x["tree_nodes"] for x in r["verify"]] == [1, 4] and r["device"].startswith("cpu")
    assert all(x["target_forward_ms"] > 0 for x in r["verify"]) and r["overhead"]["cycle_ms"] > 0
    assert r["cost_model"]["verify_nodes"] == [1, 4] and "tiny_chameleon" in printed


# ---------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_py_every_family(tiny, tmp_path: Path) -> None:
    """``python run.py model=<family> model.path=<tiny dir> policy=eagle2`` for every family (one multirun; run in
    this process through the same entry function, ``conftest.run_in_process``: the literal command below is the
    real process)."""
    root, _ = tiny
    sweep = tmp_path / "sweep"
    argv = [
        "-m", f"model={','.join(FAMILIES)}",
        f"++model.path='{root}/${{model.name}}'", "policy=eagle2", "drafter.random=true", "warmup=0", "dataset=inline",
        f"dataset.text='{TEXT}'", "model.device=cpu", "model.dtype=float32", "progress=false", "maps.per_run=false",
        f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}",
    ]  # fmt: skip
    proc = run_in_process(*argv, env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = {json.loads(p.read_text())["model"]: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}
    assert set(summaries) == set(FAMILIES)
    for fam, s in summaries.items():
        assert s["n_samples"] == 1 and s["policy"] == "eagle2" and s["tau"] >= 1.0, fam
        assert s["drafter_random"] is True, fam  # no drafter was trained for a tiny checkpoint: the record says so
    assert all(any((p / "images").glob("*.png")) for p in sweep.iterdir() if p.is_dir())


@pytest.mark.slow
def test_run_py_literal_command(tiny, tmp_path: Path) -> None:
    """The exact documented form for one family (``model.dtype/device`` spelled out: see docs/models_guide.md)."""
    root, _ = tiny
    cmd = [
        sys.executable, str(ROOT / "run.py"), "model=anole", f"model.path={root / 'anole'}", "policy=eagle2",
        "drafter.random=true", "warmup=0", "dataset.limit=1", "model.device=cpu", "model.dtype=float32",
        "progress=false", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert len(rec["tokens"]) == 16 and rec["tokens_match_baseline"] is not None


def test_tar_stage_sampling_reads_its_node() -> None:
    """``model.lm_sampling`` / ``detok_sampling`` override the stage default field by field (through the one
    ``build_sampling``), and errors name the stage's key."""
    from adtbench.errors import ConfigError
    from adtbench.models.tar.target import _sampling
    from adtbench.sampling_params import SamplingParams

    got = _sampling({"temperature": 0.5, "top_k": 7}, SamplingParams(cfg_scale=2.0), "model.lm_sampling")
    assert got == SamplingParams(temperature=0.5, top_k=7, top_p=1.0, cfg_scale=2.0)
    with pytest.raises(ConfigError, match=r"^model\.detok_sampling\.top_p: must be in \(0, 1\]"):
        _sampling({"top_p": 0}, SamplingParams(), "model.detok_sampling")
