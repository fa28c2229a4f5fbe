"""Emu3-Gen (``model=emu3``, ``adtbench/models/emu3/``) on the tiny real-layout checkpoint (``make-tiny model=emu3``).

- The folder is the ``BAAI/Emu3-Gen-hf`` layout: sharded safetensors + index in the hub's key spelling, the
  ``Emu3ForConditionalGeneration`` config with its vocabulary map and VQ config, the byte-level BPE tokenizer files
  (which tokenize a prompt row as ``Emu3Processor``'s string does).
- The lean target's logits and features equal transformers' in float32 within 1e-5 (float64 1e-10): the prefill of
  both CFG rows (each against ``Emu3ForConditionalGeneration`` run on that row alone, unpadded), AR steps and tree
  verifies after commits that are not a prefix of the tree (the static cache compacted).
- Images decode through the checkpoint's ``Emu3VQVAE`` to 8× the grid, the same pixels as transformers'
  ``decode_image_tokens`` on the token sequence (end-of-line column included).
- Greedy ``sjd`` / ``scd`` (every init, several windows) equal AR token for token, end-of-line / end-of-frame layout
  included, and AR's first 16 tokens equal transformers' ``generate(guidance_scale=3, negative_prompt_ids=…)``.
- At T = 1 SCD's law of a 2 × 2 image (3 codes; with end-of-line and end-of-frame: 7 generation indices) is AR's.
- ``random_init`` gives the two implementations the same weights; bad keys are ``ConfigError``s naming them; the app
  decodes and writes images with ``policy=sjd``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter
from itertools import product
from pathlib import Path

import pytest
import torch
from conftest import run_in_process
from omegaconf import OmegaConf

from adtbench.algorithm import laws as L
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import ConfigError
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
TEXT = "a red cube on a table"
ATOL = {"float32": 1e-5, "float64": 1e-10}
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
REF: dict[str, torch.nn.Module] = {}  # the in-memory Emu3ForConditionalGeneration the tiny folder was written from


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from adtbench.tools.make_tiny import write_tiny

    out = tmp_path_factory.mktemp("tiny_emu3") / "emu3"
    REF["model"] = write_tiny("emu3", out, seed=0)["model"]
    return out


_CACHE: dict[tuple, object] = {}


def load(root: Path, impl: str = "lean", dtype: str = "float32", **over):
    key = (impl, dtype, tuple(sorted(over.items())))
    if key not in _CACHE:
        cfg = OmegaConf.load(ROOT / "conf" / "model" / "emu3.yaml")
        cfg.path, cfg.tokenizer, cfg.device, cfg.dtype, cfg.impl = str(root), str(root), "cpu", dtype, impl
        cfg.negative_prompt = "blurry, low quality"  # a shorter row than the prompt's: the cond row is padded too
        for k, v in over.items():
            OmegaConf.update(cfg, k, v, merge=True)
        from adtbench.models.registry import apply_sidecar

        apply_sidecar(cfg)
        _CACHE[key] = build_target(cfg)
    return _CACHE[key]


def ids_of(t, codes: list[int]) -> torch.Tensor:
    return t.layout.image_token_offset + torch.tensor(codes) % t.layout.num_codes


def reachable_rows(lean) -> torch.Tensor:
    lo, hi, extra = lean.head_rows()
    return torch.tensor([*range(lo, hi), *extra])


# --- the checkpoint folder ----------------------------------------------------------------------------------------
def test_tiny_folder_is_the_hub_layout(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1  # sharded
    assert {k.split(".")[0] for k in index} == {"text_model", "vqmodel"} and "text_model.lm_head.weight" in index
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["Emu3ForConditionalGeneration"] and config["model_type"] == "emu3"
    assert config["text_config"]["num_key_value_heads"] < config["text_config"]["num_attention_heads"]  # GQA
    assert config["vq_config"]["codebook_size"] == 64 and len(config["vocabulary_map"]) == 531
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
              "preprocessor_config.json"):  # fmt: skip
        assert (tiny_dir / f).is_file(), f
    t = load(tiny_dir)
    lay = t.layout
    assert (lay.grid_h, lay.grid_w, lay.num_codes, lay.num_gen_tokens) == (4, 4, 64, 4 * 5 + 1)
    assert lay.eol_token == config["vocabulary_map"]["<|extra_200|>"]
    assert lay.eoi_token == config["vocabulary_map"]["<|extra_201|>"]
    assert lay.image_token_offset == config["vocabulary_map"]["<|visual token 000000|>"]
    # the prompt rows are what the tokenizer makes of Emu3Processor's generation string
    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    row = tok(f"<|extra_203|>{TEXT}{t.prompt_suffix}<|image start|>4*4<|image token|>")["input_ids"]
    inputs = t.encode_prompt(TEXT, cfg=True)
    ids, valid = inputs.data["ids"], inputs.data["valid"]
    assert ids[0][valid[0]].tolist() == row
    neg = tok(f"<|extra_203|>{t.negative_prompt}<|image start|>4*4<|image token|>")["input_ids"]
    assert ids[1][valid[1]].tolist() == neg and not valid[1, 0]  # the shorter negative row is left-padded


def test_the_full_shape_vocabulary_and_layout() -> None:
    """``random_init``'s full-shape map (Qwen's 151,643 text ids, then Emu3's specials and 32,768 visual tokens) has
    the real ids — BOS / EOS / pad as ``Emu3TextConfig``'s defaults, image tokens from 151,854 — and the 720² layout
    is 90 rows of 90 codes + end-of-line (8,190 tokens), then end-of-frame."""
    from transformers import Emu3TextConfig

    from adtbench.layout import TokenLayout
    from adtbench.models.emu3.target import emu3_vocabulary_map, image_token_range, special_token_ids

    vm = emu3_vocabulary_map(151643, 32768)
    sp, (offset, k), ref = special_token_ids(vm), image_token_range(vm), Emu3TextConfig()
    assert len(vm) == ref.vocab_size == 184622 and (offset, k) == (151854, 32768)
    assert (sp["bos"], sp["eos"], sp["pad"]) == (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id)
    lay = TokenLayout(len(vm), offset, k, 90, 90, eol_token=sp["eol"], eoi_token=sp["eof"])
    assert lay.grid_h * lay.row_len == 8190 and lay.num_gen_tokens == 8191
    assert [lay.forced_token(g) for g in (89, 90, 8189, 8190)] == [-1, sp["eol"], sp["eol"], sp["eof"]]


# --- the lean target = transformers ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lean_equals_transformers(tiny_dir: Path, dtype: str) -> None:
    """Prefill (both CFG rows; each also against ``Emu3ForConditionalGeneration`` on the row alone), an AR step, two
    trees committed along non-prefix paths, AR steps on the compacted cache: logits and features agree."""
    hf, lean = load(tiny_dir, "hf", dtype), load(tiny_dir, "lean", dtype)
    assert type(lean).__name__ == "LeanEmu3Target" and hf.cfg_mode == "sequential"
    tol, rows = ATOL[dtype], reachable_rows(lean)

    def same(a: torch.Tensor, b: torch.Tensor) -> None:
        assert a.shape == b.shape and a.dtype == b.dtype == getattr(torch, dtype)
        torch.testing.assert_close(a, b, atol=tol, rtol=0)

    inputs = lean.encode_prompt(TEXT, cfg=True)
    a, b = hf.start(inputs, 8), lean.start(inputs, 8)
    same(b.logits[:, rows], a.logits[:, rows])
    same(a.features[a.valid], b.features[b.valid])
    ref = REF["model"].to(getattr(torch, dtype))
    for r in range(2):  # each CFG row = transformers' own forward of that row, unpadded (its separate uncond pass)
        row = inputs.data["ids"][r][inputs.data["valid"][r]][None]
        with torch.no_grad():
            same(b.logits[r, rows], ref(input_ids=row).logits[0, -1, rows])
    t5 = DraftTree(ids_of(hf, [3, 9, 17, 30, 41]), [-1, 0, 0, 1, 2], drafted_depth=2)
    t6 = DraftTree(ids_of(hf, [5, 11, 23, 2, 40, 7]), [-1, 0, 0, 1, 2, 4], drafted_depth=3)
    single = DraftTree(ids_of(hf, [12]), [-1], drafted_depth=0)
    for tree, keep in [(single, [0]), (t5, [0, 2, 4]), (t6, [0, 2, 4, 5]), (single, [0]), (single, [0])]:
        (la, fa), (lb, fb) = (t.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth) for t in (hf, lean))
        same(lb[..., rows], la[..., rows])
        same(fa, fb)
        for t in (hf, lean):
            t.commit(torch.tensor(keep))
        assert hf.length == lean.length and torch.equal(hf.next_pos, lean.next_pos)
    REF["model"].float()


def test_random_init_gives_both_paths_the_same_weights() -> None:
    cfg = OmegaConf.load(ROOT / "conf" / "model" / "emu3.yaml")
    cfg.random_init, cfg.device, cfg.dtype, cfg.grid = True, "cpu", "float64", [2, 2]
    cfg.arch = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_codes": 16}  # fmt: skip
    cfg.vq.kind = "tiny"
    lean, hf = build_target(cfg), build_target(OmegaConf.merge(cfg, {"impl": "hf"}))
    inputs = lean.encode_prompt(TEXT, cfg=True)
    a, b = hf.start(inputs, 4), lean.start(inputs, 4)
    rows = reachable_rows(lean)
    torch.testing.assert_close(b.logits[:, rows], a.logits[:, rows], atol=1e-10, rtol=0)
    assert lean.layout.num_codes == 16 and lean.vq.codebook_size == 16
    assert lean.decode_image(torch.zeros(2, 2, dtype=torch.long)).shape == (16, 16, 3)


# --- images ---------------------------------------------------------------------------------------------------
def test_image_decodes_as_transformers(tiny_dir: Path) -> None:
    t = load(tiny_dir)
    lay = t.layout
    codes = torch.randint(0, lay.num_codes, (4, 4), generator=torch.Generator().manual_seed(3))
    tokens = torch.cat([codes + lay.image_token_offset, torch.full((4, 1), lay.eol_token)], 1).flatten().tolist()
    tokens.append(lay.eoi_token)
    assert torch.equal(lay.tokens_to_codes(tokens), codes)
    img = t.decode_image(lay.tokens_to_codes(tokens))
    assert img.shape == (32, 32, 3) and img.dtype.name == "uint8" and img.std() > 0
    sp = t.special
    seq = torch.tensor([[*tokens, sp["eoi"], sp["eos"]]])  # transformers drops the last three (EOF, image end, EOS)
    with torch.no_grad():
        pixels = REF["model"].decode_image_tokens(image_tokens=seq, height=4, width=4)
    from adtbench.models.vq_common import to_uint8_images

    assert (abs(to_uint8_images(pixels).astype(int)[0] - img.astype(int)) <= 1).all()


# --- greedy decoding ------------------------------------------------------------------------------------------
def test_greedy_jacobi_equals_ar_with_the_eol_layout(tiny_dir: Path) -> None:
    t = load(tiny_dir)
    lay = t.layout
    forced = {g: f for g in range(lay.num_gen_tokens) if (f := lay.forced_token(g)) >= 0}
    assert forced == {4: lay.eol_token, 9: lay.eol_token, 14: lay.eol_token, 19: lay.eol_token, 20: lay.eoi_token}
    for prompt in (TEXT, "two birds"):
        inputs = t.encode_prompt(prompt, cfg=True)
        ar = decode_ar(t, inputs, GREEDY, None)
        assert all(ar.tokens[g] == f for g, f in forced.items())
        for name, init, window, where in product(("sjd", "scd"), ("random", "left", "up"), (4, 16), ("host", "device")):
            pol = POLICIES.build(name, {"window": window, "init": init})
            res = generate(t, None, pol, inputs, GREEDY, torch.Generator().manual_seed(1), acceptance=where)
            assert res.tokens == ar.tokens, (prompt, name, init, window, where)


def test_cfg_greedy_equals_transformers_generate(tiny_dir: Path) -> None:
    """The first 16 tokens of our greedy AR decode (negative-prompt CFG, scale 3) equal transformers'
    ``generate(guidance_scale=3, negative_prompt_ids=…)`` with Emu3's layout as the allowed-tokens function."""
    t = load(tiny_dir)
    lay = t.layout
    inputs = t.encode_prompt(TEXT, cfg=True)
    ours = decode_ar(t, inputs, GREEDY, None).tokens
    ids, valid = inputs.data["ids"], inputs.data["valid"]
    cond, neg = ids[0][valid[0]][None], ids[1][valid[1]][None]
    P = cond.shape[1]
    image = list(lay.image_ids)

    def allowed(batch_id: int, seq: torch.Tensor) -> list[int]:
        forced = lay.forced_token(seq.shape[0] - P)
        return [forced] if forced >= 0 else image

    with torch.no_grad():
        out = REF["model"].generate(
            cond, max_new_tokens=16, do_sample=False, guidance_scale=3.0, negative_prompt_ids=neg,
            prefix_allowed_tokens_fn=allowed, pad_token_id=t.special["pad"],
        )  # fmt: skip
    theirs = out[0, P:].tolist()
    assert len(theirs) == 16 and theirs == ours[:16]
    assert len({x for x in theirs if x in lay.image_ids}) > 3  # not a constant image


@pytest.mark.parametrize("name", ["sjd", "scd"])
def test_batched_jacobi_equals_single(tiny_dir: Path, name: str) -> None:
    """Three prompts through 3 slots of a ``BatchTarget`` over the lean Emu3 (one static cache, both CFG rows per
    slot) equal the one-at-a-time decodes with the same seeds, at T = 1 with top-k (SJD's sampling)."""
    from adtbench.models.batch import BatchTarget

    t = load(tiny_dir, dtype="float64")
    sp = SamplingParams(temperature=1.0, top_k=20, cfg_scale=3.0)
    inputs = [t.encode_prompt(p, cfg=True) for p in (TEXT, "two birds", "a tall green tree by a lake")]
    pol = POLICIES.build(name, {"window": 16, "init": "random"})
    single = [generate(t, None, pol, x, sp, torch.Generator().manual_seed(i)).tokens for i, x in enumerate(inputs)]
    got: dict = {}
    cap = max(t.prompt_length(x) for x in inputs) + t.layout.num_gen_tokens + 32
    bt = BatchTarget(t, 3, True, cap)
    pol.generate_batch(bt, None, [(i, x, torch.Generator().manual_seed(i)) for i, x in enumerate(inputs)], sp,
                       got.__setitem__, None, "host")  # fmt: skip
    assert [got[i].tokens for i in range(3)] == single
    assert len({tuple(s) for s in single}) == 3


# --- the law at T = 1 -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_scd_law_at_t1_on_tiny_emu3(tiny_dir: Path, record_property) -> None:
    """SCD (coupled redraws, random init, window 4) on tiny Emu3 restricted to a 2 × 2 grid over 3 codes, with its
    end-of-line and end-of-frame tokens (7 generation indices, 3 forced; 81 images): the law of N = 2000 images is
    AR's exact law (float64), p > 10⁻³, and the test detects TV 0.095 at 90 % power."""
    t = copy.copy(load(tiny_dir, dtype="float64"))  # the shared target keeps its own layout
    t.layout = dataclasses.replace(t.layout, grid_h=2, grid_w=2, num_codes=3)
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    inputs = t.encode_prompt("a cat", cfg=True)
    law = L.exact_law(t, inputs, sp)
    assert len(law) == 81 and abs(sum(law.values()) - 1) < 1e-9
    n, g = 2000, torch.Generator().manual_seed(11)
    counts: Counter = Counter()
    accepted = 0
    pol = POLICIES.build("scd", {"window": 4, "init": "random"})
    with t.reuse_prefill(inputs):  # the prompt's prefill run once (tests/test_prefill_reuse.py)
        for _ in range(n):
            res = generate(t, None, pol, inputs, sp, g)
            counts[tuple(res.tokens)] += 1
            accepted += sum(c.accepted for c in res.cycles)
    r = L.report(L.chi2_law("scd-emu3-t1", counts, law, n), record_property)
    assert accepted / n > 0.3  # acceptance, rejection and redraws all ran
    assert r.tv90 <= 0.095, r.line()
    assert r.pvalue > L.ALPHA, r.line()


# --- config errors and the app --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "over,key",
    [({"impl": "fast"}, "model.impl"), ({"vq": {"kind": "taming"}}, "model.vq.kind"),
     ({"cfg_mode": "both"}, "model.cfg_mode"), ({"path": "/nonexistent/emu3"}, "model.path")],
)  # fmt: skip
def test_bad_keys_name_themselves(tiny_dir: Path, over: dict, key: str) -> None:
    cfg = OmegaConf.load(ROOT / "conf" / "model" / "emu3.yaml")
    cfg.path, cfg.device, cfg.dtype = str(tiny_dir), "cpu", "float32"
    with pytest.raises(ConfigError) as e:
        build_target(OmegaConf.merge(cfg, over))
    assert e.value.key == key


def test_app_decodes_and_writes_images_with_sjd(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = run_in_process("model=emu3", f"model.path={tiny_dir}", "policy=sjd", "dataset=smoke", "dataset.limit=2",
                       f"hydra.run.dir={out}")  # fmt: skip
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["committed"] == 20 for r in recs)
    assert len(list((out / "images").rglob("*.png"))) >= 2
    p = run_in_process("model=emu3", f"model.path={tiny_dir}", "policy=eagle2", "dataset=smoke", "dataset.limit=1",
                       f"hydra.run.dir={tmp_path / 'tree'}")  # fmt: skip
    assert p.returncode != 0 and "drafter.path" in p.stderr and "no public EAGLE drafter for model=emu3" in p.stderr
