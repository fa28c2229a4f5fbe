"""Tests for the Chameleon/Anole adapter's transformers path (``model.impl=hf``) on the tiny random model (CPU,
float64 where exactness is checked); the lean default equals it (tests/test_chameleon_lean.py).

Covers: vocabulary-derived image-id range, Anole prompt rows, that transformers passes our 4-D mask through
unchanged, tree verification == sequential decoding (with a causal-mask negative control), KV compaction
== a sequential forward over the committed tokens, greedy speculative generation == AR decoding, and
image decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.policies.base import TreePolicy
from adtbench.algorithm.tree import DraftTree
from adtbench.errors import ConfigError
from adtbench.models.chameleon.target import (
    ChameleonTarget,
    build_target,
    image_code_of,
    image_token_name,
    image_token_range,
    tiny_vocabulary_map,
)
from adtbench.models.hf_causal import additive_mask, cache_get, cache_num_layers

CONF = Path(__file__).resolve().parents[1] / "conf" / "model" / "tiny_chameleon.yaml"
PROMPTS = ["a red cat sitting on a mat", "blue sky"]
ONE = torch.ones(1, 1, dtype=torch.bool)
ZERO = torch.zeros(1, dtype=torch.long)
# Exactness tolerance per attention implementation, in float64. sdpa is float64 end to end. HF's eager attention
# takes its softmax in float32 (``softmax(w, dtype=torch.float32).to(query.dtype)`` in modeling_chameleon), so the
# eager path is float64 except for the attention probabilities: two orderings of the same computation agree only to
# float32 resolution there (≈1e-7 relative; 9.5e-7 absolute was seen on one CPU). Tolerances must not depend on the
# CPU's summation order: 1e-9 is float64's regime, 1e-5 is float32's with margin (a wrong mask moves logits by > 0.1).
ATOL = {"sdpa": 1e-9, "eager": 1e-5}


def _target(dtype: str = "float64", attn: str = "sdpa") -> ChameleonTarget:
    """The transformers path (``model.impl=hf``; the lean default is tests/test_chameleon_lean.py's)."""
    cfg = OmegaConf.load(CONF)
    cfg.dtype, cfg.attn_implementation, cfg.impl = dtype, attn, "hf"
    return build_target(cfg)


@pytest.fixture(scope="module")
def target() -> ChameleonTarget:
    """float64 + sdpa: float64 end to end, so exactness is checked at 1e-9."""
    return _target()


@pytest.fixture(scope="module")
def eager_target() -> ChameleonTarget:
    return _target(attn="eager")


def _drafter(t: ChameleonTarget) -> EagleDrafter:
    """A random (untrained) EAGLE drafter sized from the target, in the target's dtype."""
    ec = EagleConfig(
        hidden_size=t.hidden_size,
        num_heads=t.num_heads,
        num_kv_heads=t.num_kv_heads,
        head_dim=t.head_dim,
        intermediate_size=t.intermediate_size,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return EagleDrafter(ec, rope=t.drafter_rope(t.head_dim)).to(t.dtype).eval()


def _tree() -> DraftTree:
    """5 nodes, two branches: 0 → 1 → 3 and 0 → 2 → 4 (image-token ids)."""
    return DraftTree(tokens=torch.tensor([10, 20, 30, 40, 50]), parents=[-1, 0, 0, 1, 2], drafted_depth=2)


def _sequential(target: ChameleonTarget, text: str, tokens: list[int]) -> torch.Tensor:
    """Fresh prefill, then one single-token forward + commit per token; returns the last step's logits [R, V]."""
    target.start(target.encode_prompt(text, cfg=True), 8)
    logits = None
    for t in tokens:
        logits, _ = target.verify_forward(torch.tensor([t]), ONE, ZERO)
        target.commit(ZERO)
    assert logits is not None
    return logits[:, 0]


# ---------------------------------------------------------------------------------------------------------
# 1. Vocabulary and prompt layout
# ---------------------------------------------------------------------------------------------------------


def test_image_range_derived_from_vocabulary_map(target: ChameleonTarget) -> None:
    vm = target.lm.config.vocabulary_map
    assert image_token_range(vm) == (4, 64)
    lay = target.layout
    assert (lay.image_token_offset, lay.num_codes, lay.vocab_size) == (4, 64, 128)
    assert (lay.grid_h, lay.grid_w, lay.eol_token, lay.eoi_token, lay.num_gen_tokens) == (4, 4, None, None, 16)
    assert lay.special["bos"] == 0 and lay.special["pad"] == 1
    assert (lay.special["eoi"], lay.special["boi"], lay.special["eot"]) == (68, 69, 71)
    for code in (0, 7, 10, 63):  # names spell the code's digits with letters A–J
        assert image_code_of(image_token_name(code)) == code
        assert vm[image_token_name(code)] == code + 4
    assert image_token_name(12) == "IMGIMGBCZ"


def test_random_init_anole_with_its_full_vocabulary_builds_and_decodes() -> None:
    """``model=anole model.random_init=true`` (issue 10 §5's cost model of the 7B shape) keeps Anole's 65 536 ids and
    8 192 codes: the stand-in text ids must be the fillers above the specials, whatever the vocabulary size (filler
    names past ``<reserved99999>`` once lost the prefix and left an empty text range). Width shrunk for the CPU."""
    from omegaconf import OmegaConf

    from adtbench.algorithm.engine import decode_ar
    from adtbench.models.chameleon.target import FILLER_PREFIX
    from adtbench.resources import conf_dir
    from adtbench.sampling_params import SamplingParams

    node = OmegaConf.load(conf_dir() / "model" / "anole.yaml")
    node.random_init, node.device, node.dtype, node.grid = True, "cpu", "float32", [2, 2]
    node.arch.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2)  # fmt: skip
    vm = tiny_vocabulary_map(65536, 8192)
    assert len(vm) == 65536 and all(n.startswith(FILLER_PREFIX) for n, i in vm.items() if i >= 8192 + 8)
    t = build_target(node)
    lay = t.layout
    assert (lay.image_token_offset, lay.num_codes, lay.vocab_size) == (4, 8192, 65536)
    ids = t.tokenizer("a red circle")
    assert ids and all(8192 + 8 <= i < 65536 for i in ids)
    res = decode_ar(t, t.encode_prompt("a red circle", cfg=True), SamplingParams(), torch.Generator().manual_seed(0))
    assert len(res.tokens) == 4 and all(4 <= x < 4 + 8192 for x in res.tokens)


def test_bad_vocabulary_maps_raise() -> None:
    vm = tiny_vocabulary_map(128, 64)
    shuffled = dict(vm)
    a, b = image_token_name(3), image_token_name(40)
    shuffled[a], shuffled[b] = vm[b], vm[a]  # same id set, but id ≠ code + offset
    with pytest.raises(ValueError, match="not contiguous"):
        image_token_range(shuffled)
    gap = {k: v for k, v in vm.items() if k != image_token_name(5)}
    with pytest.raises(ValueError, match="not 0"):
        image_token_range(gap)
    with pytest.raises(ValueError, match="malformed"):
        image_token_range({**vm, "IMGIMGXZ": 127})
    with pytest.raises(ValueError, match="no IMGIMG"):
        image_token_range({"<s>": 0})


def test_prompt_rows(target: ChameleonTarget) -> None:
    inp = target.encode_prompt(PROMPTS[0], cfg=True)
    ids, valid, pos = inp.data["ids"], inp.data["valid"], inp.data["positions"]
    P = target.prompt_length(inp)
    assert ids.shape == (2, P)
    assert len(PROMPTS[0].split()) + 3 == P  # [bos] + one id per word + [eot, boi]
    assert ids[0, 0] == 0 and ids[0, -2:].tolist() == [71, 69]
    assert ((ids[0, 1:-2] >= 72) & (ids[0, 1:-2] < 128)).all()  # stand-in text ids: filler range
    assert ids[1].tolist() == [1] * (P - 2) + [0, 69] and valid[1].tolist() == [False] * (P - 2) + [True, True]
    assert pos[0].tolist() == list(range(P)) and pos[1, -2:].tolist() == [0, 1]
    no_cfg = target.encode_prompt(PROMPTS[0], cfg=False)
    assert no_cfg.data["ids"].shape == (1, P)
    target.start(inp, 8)
    assert target.next_pos.tolist() == [P, 2] and target.length == P


def test_hf_tokenizer_path(tmp_path: Path) -> None:
    """``tokenizer: <path>`` loads a real transformers tokenizer (a local word-level stand-in here)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({"<unk>": 3, "blue": 100, "sky": 101}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(tmp_path)
    cfg = OmegaConf.load(CONF)
    cfg.tokenizer = str(tmp_path)
    t = build_target(cfg)
    assert t.encode_prompt("blue sky", cfg=False).data["ids"].tolist() == [[0, 100, 101, 71, 69]]


def test_flash_attention_refused() -> None:
    cfg = OmegaConf.load(CONF)
    cfg.attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="attn_implementation"):
        build_target(cfg)


# ---------------------------------------------------------------------------------------------------------
# 2. Masks and tree verification
# ---------------------------------------------------------------------------------------------------------


def test_transformers_passes_4d_mask_unchanged(eager_target: ChameleonTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """The float mask every attention layer receives is exactly the one we built (no causal re-masking)."""
    target = eager_target
    import transformers.models.chameleon.modeling_chameleon as mc
    from transformers.masking_utils import create_causal_mask

    seen: list[torch.Tensor] = []
    original = mc.eager_attention_forward

    def spy(module: Any, query: Any, key: Any, value: Any, attention_mask: torch.Tensor, *args: Any, **kw: Any) -> Any:
        seen.append(attention_mask)
        return original(module, query, key, value, attention_mask, *args, **kw)

    monkeypatch.setattr(mc, "eager_attention_forward", spy)
    tree = _tree()
    target.start(target.encode_prompt(PROMPTS[0], cfg=True), tree.size)
    L, R = target.length, target.rows
    bool_mask = torch.cat(
        [target.valid[:, None, None, :L].expand(R, 1, 5, L), tree.ancestor_mask[None, None].expand(R, 1, 5, 5)], -1
    )
    expected = additive_mask(bool_mask, target.dtype)
    seen.clear()
    target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    assert len(seen) == target.lm.config.num_hidden_layers
    for m in seen:
        assert m.shape == (R, 1, 5, L + 5) and torch.equal(m, expected)
    emb = torch.zeros(R, 5, target.hidden_size, dtype=target.dtype)
    out = create_causal_mask(
        config=target.lm.config,
        input_embeds=emb,
        attention_mask=expected,
        cache_position=torch.arange(L, L + 5),
        past_key_values=None,
        position_ids=None,
    )
    assert out is expected


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tree_verify_matches_sequential(attn: str) -> None:
    target = _target("float64", attn)
    tree = _tree()
    text = PROMPTS[0]
    target.start(target.encode_prompt(text, cfg=True), tree.size)
    assert target.rows == 2 and not target.valid[1, 0]  # uncond row is left-padded
    tree_logits, tree_feats = target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    assert tree_logits.shape == (2, 5, 128) and tree_feats.shape == (2, 5, 64)
    for node in range(tree.size):
        ref = _sequential(target, text, tree.tokens[tree.path_to(node)].tolist())
        torch.testing.assert_close(tree_logits[:, node], ref, atol=ATOL[attn], rtol=0)
    # negative control: a plain causal mask over the tree block lets siblings see each other
    target.start(target.encode_prompt(text, cfg=True), tree.size)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    wrong, _ = target.verify_forward(tree.tokens, causal, tree.depth)
    assert (wrong - tree_logits).abs().max() > 0.1
    assert (wrong[:, :2] - tree_logits[:, :2]).abs().max() < ATOL[attn]  # nodes 0, 1: causal == ancestors


# ---------------------------------------------------------------------------------------------------------
# 3. KV compaction
# ---------------------------------------------------------------------------------------------------------


def test_commit_leaves_sequential_cache(target: ChameleonTarget) -> None:
    tree, keep = _tree(), torch.tensor([0, 2, 4])
    text = PROMPTS[1]
    target.start(target.encode_prompt(text, cfg=True), tree.size)
    target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    target.commit(keep)
    got = [tuple(t.clone() for t in cache_get(target.cache, i)) for i in range(cache_num_layers(target.cache))]
    length, next_pos, valid = target.length, target.next_pos.clone(), target.valid.clone()
    committed = tree.tokens[keep].tolist()
    after_tree, _ = target.verify_forward(torch.tensor([7]), ONE, ZERO)  # one more step on the compacted cache

    _sequential(target, text, committed)
    assert target.length == length and torch.equal(target.next_pos, next_pos)
    assert torch.equal(target.valid[:, :length], valid[:, :length])
    for i, (k, v) in enumerate(got):
        k_ref, v_ref = cache_get(target.cache, i)
        assert k.shape == k_ref.shape == (2, 4, length, 16)
        torch.testing.assert_close(k, k_ref, atol=1e-9, rtol=0)
        torch.testing.assert_close(v, v_ref, atol=1e-9, rtol=0)
    after_seq, _ = target.verify_forward(torch.tensor([7]), ONE, ZERO)
    torch.testing.assert_close(after_tree, after_seq, atol=1e-9, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# 4. Greedy speculative generation == AR
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg_scale", [3.0, 1.0])
def test_greedy_eagle2_matches_ar(target: ChameleonTarget, cfg_scale: float) -> None:
    from adtbench.algorithm.engine import decode_ar, generate
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.sampling_params import SamplingParams

    t = target
    drafter = _drafter(t)
    policy = Eagle2Policy(depth=3, top_k=4, total_tokens=16)
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    for text in PROMPTS:
        inputs = t.encode_prompt(text, cfg=sp.use_cfg)
        ar = decode_ar(t, inputs, sp, None)
        spec = generate(t, drafter, policy, inputs, sp, None)
        assert spec.tokens == ar.tokens
        assert len(ar.tokens) == t.layout.num_gen_tokens
        assert all(tok in t.layout.image_ids for tok in ar.tokens)
        assert spec.target_forwards <= ar.target_forwards


class OraclePolicy(TreePolicy):
    """Test-only policy that knows the AR answer ``ref``: every cycle proposes a wrong branch first, then
    the correct chain (up to 3 deep) with a wrong child hanging off it, so the accepted path is a non-trivial
    gather such as nodes [0, 2, 4, 5] — exercising multi-token commits inside ``generate``."""

    def __init__(self, ref: list[int], offset: int, num_codes: int) -> None:
        self.ref, self.offset, self.k = ref, offset, num_codes

    def _wrong(self, tok: int) -> int:
        return (tok - self.offset + 1) % self.k + self.offset

    def max_nodes(self) -> int:
        return 6

    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        g, ref = session.root_gen, self.ref
        tokens, parents = [ref[g]], [-1]
        good = 0  # node holding the last correct token
        for d in range(1, min(3, max_depth) + 1):
            nxt = ref[g + d]
            if d < 3:  # a wrong sibling before the correct child
                tokens.append(self._wrong(nxt))
                parents.append(good)
            tokens.append(nxt)
            parents.append(good)
            good = len(tokens) - 1
        return DraftTree(torch.tensor(tokens), parents, drafted_depth=min(3, max_depth))


@pytest.mark.parametrize("cfg_scale", [3.0, 1.0])
def test_long_accepted_paths_match_ar(target: ChameleonTarget, cfg_scale: float) -> None:
    """Greedy generation with multi-token commits (oracle trees) reproduces AR exactly, in fewer forwards."""
    from adtbench.algorithm.engine import decode_ar, generate
    from adtbench.sampling_params import SamplingParams

    t = target
    sp = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    inputs = t.encode_prompt(PROMPTS[1], cfg=sp.use_cfg)
    ar = decode_ar(t, inputs, sp, None)
    policy = OraclePolicy(ar.tokens, t.layout.image_token_offset, t.layout.num_codes)
    spec = generate(t, _drafter(t), policy, inputs, sp, None)
    assert spec.tokens == ar.tokens
    assert max(c.accepted for c in spec.cycles) == 3 and len(spec.cycles) <= 5
    assert spec.target_forwards < ar.target_forwards


# ---------------------------------------------------------------------------------------------------------
# 5. Image decoding
# ---------------------------------------------------------------------------------------------------------


def test_decode_image(target: ChameleonTarget) -> None:
    codes = torch.arange(16).view(4, 4) * 3
    img = target.decode_image(codes)
    assert isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.shape == (16, 16, 3)
    assert img.std() > 0
