"""The lean Chameleon target (``model.impl: lean``, ``models/chameleon/lean.py``) against the transformers path.

On the tiny real-layout Anole and Lumina-mGPT checkpoints (``make-tiny``: sharded safetensors, Lumina's (1, d)
q/k-norms): the lean logits and features equal the HF path's within 1e-5 in float32 and 1e-10 in float64 — the
prefill over both CFG rows (the uncond row left-padded), AR steps and tree verifications after commits of accepted
paths that are not a prefix of the tree (so the static cache is compacted). Greedy speculative decoding on the lean
path is token-identical to AR (and to the HF path's AR); at T = 1 its joint law of the first image tokens is AR's
(χ², the law computed on the HF path). The weights are one copy (fused, norm-folded), ``random_init`` gives the HF
path's weights, and ``model.impl`` selects the path (a bad value is a ``ConfigError`` naming it).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import model_cfg, pooled_chisquare
from omegaconf import OmegaConf

from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.sampling import process_logits
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import ConfigError
from adtbench.harness.drafters import build_drafter
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
TEXT = "a red cat on a mat"
ATOL = {"float32": 1e-5, "float64": 1e-10}
ONE = torch.ones(1, 1, dtype=torch.bool)
ZERO = torch.zeros(1, dtype=torch.long)
HF_MODES = {"anole": "batched", "lumina_mgpt": "sequential"}  # the HF path's default CFG layout per family


REFS: dict[str, torch.nn.Module] = {}  # the in-memory HF modules the tiny checkpoints were written from


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from adtbench.tools.make_tiny import write_tiny

    root = tmp_path_factory.mktemp("tiny_chameleon")
    for fam in HF_MODES:
        REFS[fam] = write_tiny(fam, root / fam, seed=0)["lm"]
    return root


_CACHE: dict[tuple, object] = {}


def load(root: Path, fam: str, impl: str, dtype: str, **over):
    key = (fam, impl, dtype, tuple(sorted(over.items())))
    if key not in _CACHE:
        cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{fam}.yaml")
        cfg.path, cfg.device, cfg.dtype, cfg.impl = str(root / fam), "cpu", dtype, impl
        cfg.attn_implementation = "sdpa"  # the HF reference float64 end to end (eager softmaxes in float32)
        for k, v in over.items():
            OmegaConf.update(cfg, k, v, merge=True)
        _CACHE[key] = build_target(cfg)
    return _CACHE[key]


def drafter_for(t):
    return build_drafter(OmegaConf.create({"kind": "eagle", "path": None, "seed": 1, "num_layers": 1}), t)


def _ids(t, codes: list[int]) -> torch.Tensor:
    return t.layout.image_token_offset + torch.tensor(codes) % t.layout.num_codes


def reachable(lean, logits: torch.Tensor) -> torch.Tensor:
    """The lean raw logits at the rows the layout can emit (``StaticGPTTarget.head_rows``: the image tokens and the
    forced ones), after checking every row outside the span its head computes (``head_span``) holds the dtype's
    lowest finite value."""
    lo, hi = lean.head_span()
    rest = torch.ones(logits.shape[-1], dtype=torch.bool)
    rest[lo:hi] = False
    assert rest.any() and bool((logits[..., rest] == torch.finfo(logits.dtype).min).all())
    return logits[..., reachable_rows(lean)]


def reachable_rows(lean) -> torch.Tensor:
    lo, hi, extra = lean.head_rows()
    return torch.tensor([*range(lo, hi), *extra])


# --- 1. the same function as the HF path ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fam", ["anole", "lumina_mgpt"])
def test_lean_equals_hf(tiny_dir: Path, fam: str, dtype: str) -> None:
    """Prefill (2 CFG rows), AR steps, and tree verifies after non-prefix commits: logits (at every row the layout can
    emit: the lean head computes those only) and features agree."""
    hf = load(tiny_dir, fam, "hf", dtype, cfg_mode=HF_MODES[fam])
    lean = load(tiny_dir, fam, "lean", dtype)
    assert type(lean).__name__.startswith("Lean") and hf.cfg_mode == HF_MODES[fam]
    tol, worst = ATOL[dtype], 0.0

    def same(a: torch.Tensor, b: torch.Tensor) -> None:
        nonlocal worst
        assert a.shape == b.shape and a.dtype == b.dtype == getattr(torch, dtype)
        worst = max(worst, float((a - b).abs().max()))
        torch.testing.assert_close(a, b, atol=tol, rtol=0)

    inputs = hf.encode_prompt(TEXT, cfg=True)
    assert torch.equal(inputs.data["ids"], lean.encode_prompt(TEXT, cfg=True).data["ids"])  # one prompt-row code
    a, b = hf.start(inputs, 8), lean.start(inputs, 8)
    assert a.valid.shape[0] == 2 and not a.valid[1, 0]  # the uncond row is left-padded
    same(reachable(lean, b.logits), a.logits[..., reachable_rows(lean)])
    same(a.features[a.valid], b.features[b.valid])  # pad positions' features are unused (HF sequential: zeros)
    same(a.input_embeds, b.input_embeds)
    # an AR step, a 5-node tree whose accepted path 0 → 2 → 4 is not a prefix, a 6-node tree keeping 0 → 2 → 4 → 5,
    # then AR steps on the twice-compacted cache
    t5 = DraftTree(_ids(hf, [3, 9, 17, 30, 41]), [-1, 0, 0, 1, 2], drafted_depth=2)
    t6 = DraftTree(_ids(hf, [5, 11, 23, 2, 40, 7]), [-1, 0, 0, 1, 2, 4], drafted_depth=3)
    single = DraftTree(_ids(hf, [12]), [-1], drafted_depth=0)
    steps = [(single, [0]), (t5, [0, 2, 4]), (t6, [0, 2, 4, 5]), (single, [0]), (single, [0])]
    for tree, keep in steps:
        (la, fa), (lb, fb) = (t.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth) for t in (hf, lean))
        same(reachable(lean, lb), la[..., reachable_rows(lean)])
        same(fa, fb)
        for t in (hf, lean):
            t.commit(torch.tensor(keep))
        assert hf.length == lean.length and torch.equal(hf.next_pos, lean.next_pos)
    assert lean.forwards == hf.forwards == 1 + len(steps)
    print(f"{fam} {dtype}: max |lean − hf| = {worst:.3g}")


def test_lean_weights_are_one_fused_copy(tiny_dir: Path) -> None:
    """The lean network holds the checkpoint once: q|k|v and gate|up fused with their RMSNorm weights folded in, the
    q and k rows (and the q/k norms' affine) of each head in interleaved rotary pairs (dims i, i + d/2 adjacent),
    Lumina's (1, d) q/k-norms expanded to every head; nothing of the HF layout is kept."""
    half = torch.stack([torch.arange(8), torch.arange(8, 16)], 1).flatten()  # head_dim 16: 0, 8, 1, 9, …
    for fam, ref in REFS.items():
        net = load(tiny_dir, fam, "lean", "float64").net
        sd = {k: v.double() for k, v in ref.state_dict().items()}
        L0 = "model.layers.0."
        qkv = torch.cat([sd[L0 + f"self_attn.{n}_proj.weight"] for n in "qkv"]) * sd[L0 + "input_layernorm.weight"]
        qk = qkv[: 8 * 16].view(8, 16, -1)[:, half].reshape(8 * 16, -1)  # 4 q heads, 4 k heads
        torch.testing.assert_close(net.layers[0].wqkv, torch.cat([qk, qkv[8 * 16 :]]), atol=1e-12, rtol=0)
        up = torch.cat([sd[L0 + "mlp.gate_proj.weight"], sd[L0 + "mlp.up_proj.weight"]])
        up = up * sd[L0 + "post_attention_layernorm.weight"]
        torch.testing.assert_close(net.layers[0].w13, up, atol=1e-12, rtol=0)
        q_norm = sd[L0 + "self_attn.q_norm.weight"]
        assert torch.equal(net.layers[0].q_norm.weight, q_norm[:, half]) and q_norm.shape == (4, 16)
        assert torch.equal(net.output.weight, sd["lm_head.weight"])
        n_hf = sum(v.numel() for k, v in sd.items() if not k.startswith("model.vqmodel."))
        n_norms = 2 * 2 * 64  # the two folded RMSNorm weights of each of the 2 layers
        assert sum(p.numel() for p in net.parameters()) == n_hf - n_norms


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_random_init_is_the_hf_model(kv_heads: int) -> None:
    """``random_init`` (``model=tiny_chameleon``, the cost model's 7B shape): the lean path converts the HF path's
    seeded model, so both decode the same weights (also with grouped K/V heads); the conversion empties the HF
    layers as it goes."""
    from adtbench.models.chameleon.lean import lean_from_hf
    from adtbench.models.chameleon.target import random_chameleon

    over = {"dtype": "float64", "arch.num_key_value_heads": kv_heads}
    hf = build_target(model_cfg("tiny_chameleon", impl="hf", attn_implementation="sdpa", **over))
    lean = build_target(model_cfg("tiny_chameleon", **over))
    assert type(lean).__name__ == "LeanChameleonTarget" and type(hf).__name__ == "ChameleonTarget"
    assert lean.net.layers[0].k_norm.weight.shape == (kv_heads, 16)
    inputs = hf.encode_prompt(TEXT, cfg=True)
    rows = reachable_rows(lean)
    a, b = hf.start(inputs, 5).logits, lean.start(inputs, 5).logits
    torch.testing.assert_close(reachable(lean, b), a[..., rows], atol=1e-10, rtol=0)
    tree = DraftTree(_ids(hf, [3, 9, 17, 30, 41]), [-1, 0, 0, 1, 2], drafted_depth=2)
    (a, _), (b, _) = (t.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth) for t in (hf, lean))
    torch.testing.assert_close(reachable(lean, b), a[..., rows], atol=1e-10, rtol=0)
    lm = random_chameleon(model_cfg("tiny_chameleon"), 64)
    net = lean_from_hf(lm)
    assert not any(True for _ in lm.model.layers.parameters()) and net.arch.num_layers == 2


@pytest.mark.parametrize("fam", ["anole", "lumina_mgpt"])
def test_the_image_token_head_keeps_the_processed_logits_and_the_tokens(tiny_dir: Path, fam: str) -> None:
    """The lean LM head computes the image-token rows (and Lumina-mGPT's end-of-line / end-of-image rows, forced at
    fixed grid positions) only, the rest at float32's lowest value: in float32 the processed logits of the prefill and
    of a chain through every generation index (end-of-lines and the end-of-image included) equal the full head's bit
    for bit under greedy, top-k and top-p processing with CFG; greedy AR and seeded T = 1 speculative decoding (the
    drafter's head too) give the same tokens, so the law is unchanged."""
    img, full = load(tiny_dir, fam, "lean", "float32"), load(tiny_dir, fam, "lean", "float32", cfg_mode="batched")
    full.image_head = False
    lay = img.layout
    lo, hi, extra = img.head_rows()
    assert (lo, hi) == (lay.image_token_offset, lay.image_token_offset + lay.num_codes) and hi - lo < lay.vocab_size
    assert extra == (tuple(sorted((lay.eol_token, lay.eoi_token))) if fam == "lumina_mgpt" else ())
    assert img.head_span() == (lo, max((hi, *(t + 1 for t in extra)))) and full.head_rows() is None
    inputs = img.encode_prompt(TEXT, cfg=True)
    n = lay.num_gen_tokens - 1
    chain = DraftTree(_ids(img, [5 * i + 3 for i in range(n)]), [-1, *range(n - 1)], drafted_depth=n - 1)
    raws = []
    for t in (img, full):
        first = t.start(inputs, n).logits
        raw, _ = t.verify_forward(chain.tokens, chain.ancestor_mask, chain.depth)
        raws.append((first[:, None], raw))
    reachable(img, raws[0][1])
    gen = torch.cat([torch.zeros(1, dtype=torch.long), 1 + chain.depth])  # 0 … num_gen − 1: every forced position
    for sp in (
        SamplingParams(temperature=0.0, cfg_scale=3.0),
        SamplingParams(temperature=1.0, top_k=5, cfg_scale=3.0),
        SamplingParams(temperature=0.7, top_p=0.9, cfg_scale=4.0),
        SamplingParams(temperature=1.0),
    ):
        a, b = (
            torch.cat(
                [
                    process_logits(f[: 1 + sp.use_cfg], gen[:1], lay, sp),
                    process_logits(r[: 1 + sp.use_cfg], gen[1:], lay, sp),
                ]
            )
            for f, r in raws
        )
        assert torch.equal(a, b) and a.isfinite().sum() > 0 and not a.isnan().any(), sp
    greedy, sampled = SamplingParams(temperature=0.0, cfg_scale=3.0), SamplingParams(temperature=1.0, cfg_scale=3.0)
    ar = [decode_ar(t, inputs, greedy, None).tokens for t in (img, full)]
    policy = Eagle2Policy(depth=3, top_k=4, total_tokens=12)
    spec = [
        generate(t, drafter_for(t), policy, inputs, sampled, torch.Generator().manual_seed(7)).tokens
        for t in (img, full)
    ]
    assert ar[0] == ar[1] and spec[0] == spec[1]


# --- 2. decoding ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fam", ["anole", "lumina_mgpt"])
def test_lean_greedy_speculative_equals_ar(tiny_dir: Path, fam: str) -> None:
    lean, hf = load(tiny_dir, fam, "lean", "float64"), load(tiny_dir, fam, "hf", "float64")
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    inputs = lean.encode_prompt(TEXT, cfg=True)
    ar = decode_ar(lean, inputs, sp, None)
    spec = generate(lean, drafter_for(lean), Eagle2Policy(depth=3, top_k=4, total_tokens=12), inputs, sp, None)
    assert spec.tokens == ar.tokens == decode_ar(hf, inputs, sp, None).tokens
    assert len(ar.tokens) == lean.layout.num_gen_tokens and spec.target_forwards < ar.target_forwards
    assert lean.layout.tokens_to_codes(ar.tokens).shape == (4, 4)  # Lumina: EOL / EOI in place
    assert lean.decode_image(lean.layout.tokens_to_codes(ar.tokens)).shape == (16, 16, 3)


def _hf_joint3(t, inputs, sp) -> dict[tuple[int, ...], float]:
    """AR law of the first three image tokens on ``t``: per first token one prefill and one tree verify (root = the
    token, one child per image id) give p(x1 | x0) at the root and p(x2 | x0, x1) at the children."""
    lay, ids = t.layout, list(t.layout.image_ids)
    out = {}
    first = process_logits(t.start(inputs, 1).logits[:, None], torch.tensor([0]), lay, sp)[0].softmax(-1)
    for x0 in ids:
        t.start(inputs, 1 + len(ids))
        tree = DraftTree(torch.tensor([x0, *ids]), [-1] + [0] * len(ids), drafted_depth=1)
        raw, _ = t.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
        p = process_logits(raw, 1 + tree.depth, lay, sp).softmax(-1)  # [n, V]
        for j, x1 in enumerate(ids):
            for x2 in ids:
                out[(x0, x1, x2)] = float(first[x0] * p[0, x1] * p[1 + j, x2])
    return out


def test_lean_sampling_law_equals_ar() -> None:
    """T = 1, top-k 3, CFG 3: the joint law of the first 3 image tokens under lean speculative decoding (point-mass
    EAGLE-2 drafts) is the HF path's AR law (χ²; 4 image codes, so 64 outcomes)."""
    small = {"arch.vocab_size": 16, "arch.num_codes": 4, "grid": [2, 2], "vq.kind": "none", "dtype": "float64"}
    hf = build_target(model_cfg("tiny_chameleon", impl="hf", attn_implementation="sdpa", **small))
    lean = build_target(model_cfg("tiny_chameleon", **small))
    sp = SamplingParams(temperature=1.0, top_k=3, cfg_scale=3.0)
    inputs = lean.encode_prompt("a red circle", cfg=True)
    expected = _hf_joint3(hf, inputs, sp)
    assert abs(sum(expected.values()) - 1) < 1e-9
    drafter, g, n = drafter_for(lean), torch.Generator().manual_seed(0), 600
    counts: Counter[tuple[int, ...]] = Counter()
    accepted = 0
    with lean.reuse_prefill(inputs):  # the prompt's prefill run once (tests/test_prefill_reuse.py)
        for _ in range(n):
            res = generate(lean, drafter, Eagle2Policy(depth=2, top_k=3, total_tokens=9), inputs, sp, g)
            counts[tuple(res.tokens[:3])] += 1
            accepted += sum(c.accepted for c in res.cycles)
    assert accepted > n // 2  # the rejection path was exercised
    assert pooled_chisquare(counts, expected, n)[0] > 1e-3


# --- 3. configuration -----------------------------------------------------------------------------------------
def test_impl_selects_the_path_and_bad_values_name_the_key(tiny_dir: Path) -> None:
    from hydra import compose, initialize_config_dir

    from adtbench.harness import schema
    from adtbench.harness.config import register_resolvers
    from adtbench.models.chameleon.lumina import LeanLuminaTarget, LuminaTarget
    from adtbench.models.chameleon.target import ChameleonTarget

    assert isinstance(load(tiny_dir, "anole", "hf", "float64"), ChameleonTarget)
    assert isinstance(load(tiny_dir, "lumina_mgpt", "hf", "float64"), LuminaTarget)
    lean = load(tiny_dir, "lumina_mgpt", "lean", "float64")
    assert isinstance(lean, LeanLuminaTarget) and lean.cfg_mode == "sequential"  # computed batched: same function
    assert callable(getattr(lean, "compile_forward", None))  # engine.compile is allowed on the lean path
    assert not hasattr(load(tiny_dir, "anole", "hf", "float64"), "compile_forward")
    for bad in ("fast", "HF", 1):
        with pytest.raises(ConfigError) as e:
            build_target(model_cfg("tiny_chameleon", impl=bad))
        assert e.value.key == "model.impl" and "lean" in str(e.value)
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        schema.check(compose("config", overrides=["model=anole", "model.impl=hf"]))
        with pytest.raises(ConfigError) as e:
            schema.check(compose("config", overrides=["model=lumina_mgpt", "model.impl=transformers"]))
    assert e.value.key == "model.impl"
    with pytest.raises(ConfigError) as e:  # an architecture the lean path does not implement: use impl=hf
        build_target(model_cfg("tiny_chameleon", **{"arch.swin_norm": True}))
    assert e.value.key == "model.impl" and "swin_norm" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build_target(model_cfg("tiny_chameleon", cfg_mode="parallel"))
    assert e.value.key == "model.cfg_mode"
