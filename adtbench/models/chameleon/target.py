"""Chameleon-family adapter (Anole): vocabulary, prompt rows, the two targets and the builder from a ``model`` node.

``model.impl`` picks the LM's implementation; both expose raw logits exact on every token the layout can emit (the
image-token constraint is ``TokenLayout``'s; the lean target computes its head over those rows only,
``StaticGPTTarget.logits_head``, the hf one over the whole vocabulary) and share this module's vocabulary and prompt
rows (``ChameleonVocab``):

- ``lean`` (default): ``LeanChameleonTarget``, the LM of ``chameleon.lean`` on the project's lean stack with a
  static KV cache (``StaticGPTTarget``'s tree bookkeeping, device-side compaction, ``compile_forward``);
- ``hf``: ``ChameleonTarget``, the generic transformers target (``hf_causal.HFCausalTarget``) through
  ``lm.model`` + ``lm.lm_head``, never ``ChameleonForConditionalGeneration.forward``, which sets every
  image-token logit to ``finfo.min``: the reference the lean path is tested against.

Checkpoints and tokenizers are read by ``hf_checkpoint`` (the q/k-norm fix of models.md §1.4;
``load_chameleon_lm`` for hf, ``chameleon.lean.load_chameleon_net`` for lean).

Vocabulary: image tokens are the ``IMGIMG<letters>Z`` entries of ``config.vocabulary_map`` (letters A–J
spell the decimal VQ code); their id range is derived from the map and asserted contiguous,
``id = code + image_token_offset`` (Anole: offset 4, 8192 codes). Anole generates a plain raster grid
(32×32 real, 4×4 tiny): no end-of-line or end-of-image tokens inside the generated sequence.

Anole prompt rows (batched CFG, models.md §2): cond ``[<s>] + text + [<reserved08706> (eot), <racm3:break> (boi)]``
at positions ``0..P-1``; uncond ``[<s>, <racm3:break>]`` left-padded with ``<pad>`` to the cond length, its
two real tokens at positions 0 and 1 (pad columns get position 0 and are masked as keys; every position
still attends to itself so no mask row is empty) — LANTERN's ``uncond = cond − (P − 2)`` positions. Both rows
then continue at their own ``next_pos``.

Official sampling (GAIR-NLP/anole ``text2image.py``): image tokens only, CFG 3.0 (the 3-way in-batch CFG
reduces to 2-way for text-to-image), temperature 0.7, top-p 0.9, no top-k. LANTERN/ADT-Tree runs: CFG 3.0,
temperature 1.0, top-k 2000, top-p 1.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.base import PrefillResult, PromptInputs, StaticGPTTarget
from adtbench.models.chameleon.lean import lean_from_hf, load_chameleon_net
from adtbench.models.hf_causal import CFG_MODES, HFCausalTarget, common_options, prompt_mask, spread_init_
from adtbench.models.hf_checkpoint import HashTokenizer, HFTokenizer, load_chameleon_lm
from adtbench.models.kv import StaticKVCache
from adtbench.models.rope import Rope, Rope1D
from adtbench.models.rows import prompt_rows

IMAGE_PREFIX, IMAGE_SUFFIX = "IMGIMG", "Z"
_DIGIT = {chr(ord("A") + i): str(i) for i in range(10)}  # letter → decimal digit of the VQ code

# Special-token names of the Chameleon vocabulary (the same names in the tiny test vocabulary).
SPECIAL_NAMES: dict[str, str] = {
    "bos": "<s>",
    "pad": "<pad>",
    "eos": "</s>",
    "unk": "<unk>",
    "eoi": "<eoss>",  # end of image
    "boi": "<racm3:break>",  # begin of image
    "image": "<image>",  # placeholder for image *inputs* (unused for generation)
    "eot": "<reserved08706>",  # end of turn / separator
}
REQUIRED_SPECIALS = ("bos", "pad", "boi", "eot")
FILLER_PREFIX = "<reserved9"  # tiny-vocabulary filler names <reserved9NNNNNN> (stand-in text ids; 7 digits)


# ---------------------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------------------


def image_token_name(code: int) -> str:
    """VQ code → its vocabulary name, e.g. 12 → ``IMGIMGBCZ``."""
    return IMAGE_PREFIX + "".join(chr(ord("A") + int(d)) for d in str(code)) + IMAGE_SUFFIX


def image_code_of(name: str) -> int | None:
    """Vocabulary name → VQ code (``IMGIMGBCZ`` → 12); None if ``name`` is not an image token.

    Raises ValueError on a name that starts with ``IMGIMG`` but does not spell a code with letters A–J.
    """
    if not name.startswith(IMAGE_PREFIX):
        return None
    body = name[len(IMAGE_PREFIX) : -len(IMAGE_SUFFIX)] if name.endswith(IMAGE_SUFFIX) else ""
    if not body or any(c not in _DIGIT for c in body):
        raise ValueError(f"malformed image token name {name!r} (expected IMGIMG<letters A-J>Z)")
    return int("".join(_DIGIT[c] for c in body))


def image_token_range(vocab_map: Mapping[str, int]) -> tuple[int, int]:
    """``(image_token_offset, num_codes)`` derived from a Chameleon ``vocabulary_map``.

    Invariant asserted here: the codes are exactly ``0..K-1`` and ``id = code + offset`` for every one of
    them (one contiguous id block). Raises ValueError naming the offending entries otherwise.
    """
    ids: dict[int, int] = {}
    for name, idx in vocab_map.items():
        code = image_code_of(name)
        if code is None:
            continue
        if code in ids:
            raise ValueError(f"image code {code} appears twice in the vocabulary map")
        ids[code] = int(idx)
    if not ids:
        raise ValueError("vocabulary map has no IMGIMG…Z image tokens")
    k = len(ids)
    if sorted(ids) != list(range(k)):
        missing = sorted(set(range(k)) - set(ids))[:8]
        raise ValueError(f"image codes are not 0..{k - 1} (missing e.g. {missing})")
    offset = ids[0]
    bad = [(c, i) for c, i in sorted(ids.items()) if i != c + offset]
    if bad:
        raise ValueError(
            f"image token ids are not contiguous (id = code + {offset}); first offending (code, id) pairs: {bad[:5]}"
        )
    return offset, k


def special_token_ids(vocab_map: Mapping[str, int]) -> dict[str, int]:
    """Ids of the special tokens present in ``vocab_map`` (keys of ``SPECIAL_NAMES``); required ones must exist."""
    out = {key: int(vocab_map[name]) for key, name in SPECIAL_NAMES.items() if name in vocab_map}
    missing = [SPECIAL_NAMES[k] for k in REQUIRED_SPECIALS if k not in out]
    if missing:
        raise ValueError(f"vocabulary map lacks required special tokens {missing}")
    return out


def tiny_vocabulary_map(vocab_size: int, num_codes: int, extra: Sequence[str] = ()) -> dict[str, int]:
    """The tiny test vocabulary (models.md §6.3).

    ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3, image tokens at ``4 .. 4+K-1``, then ``<eoss>``,
    ``<racm3:break>``, ``<image>``, ``<reserved08706>``, then the ``extra`` names (e.g. Lumina's end-of-line
    ``<reserved08799>`` and size tokens ``<reserved088NN>``); the remaining ids i are filler ``<reserved9NNNNNN>``
    names, i in six digits (the stand-in text tokens): every one starts with ``FILLER_PREFIX`` whatever the
    vocabulary size (a full-size 65 536 one included), and none can collide with a real reserved name (five digits).
    """
    names = ["<s>", "<pad>", "</s>", "<unk>"]
    names += [image_token_name(c) for c in range(num_codes)]
    names += ["<eoss>", "<racm3:break>", "<image>", "<reserved08706>", *extra]
    if len(set(names)) != len(names):
        raise ValueError("duplicate names in the tiny vocabulary")
    if len(names) >= vocab_size:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for text tokens after {len(names)} specials")
    names += [f"{FILLER_PREFIX}{i:06d}>" for i in range(len(names), vocab_size)]
    return {name: i for i, name in enumerate(names)}


# ---------------------------------------------------------------------------------------------------------
# Anole
# ---------------------------------------------------------------------------------------------------------


class ChameleonVocab:
    """Vocabulary, token layout and prompt rows of a Chameleon-family target: the one copy the HF
    (``ChameleonTarget``) and the lean (``LeanChameleonTarget``) implementations share, as a mixin before their
    network base class. ``_init_vocab`` sets ``vq``, ``tokenizer``, ``special`` and ``layout`` from the
    checkpoint's ``ChameleonConfig``; Lumina-mGPT overrides ``_make_layout``, ``encode_prompt`` and the default CFG
    mode (a constructor's ``cfg_mode=None``)."""

    default_cfg_mode = "batched"
    layout: TokenLayout
    special: dict[str, int]
    tokenizer: Any
    vq: Any

    def _init_vocab(self, config: Any, vq: Any, tokenizer: Any, grid: tuple[int, int], device: Any) -> None:
        self.vq = vq.to(device=device).eval() if vq is not None else None
        self.tokenizer = tokenizer
        offset, k = image_token_range(config.vocabulary_map)
        self.special = special_token_ids(config.vocabulary_map)
        if self.vq is not None and self.vq.codebook_size != k:
            raise ConfigError("model.vq", f"VQ codebook {self.vq.codebook_size} ≠ {k} image tokens in the vocabulary")
        self.layout = self._make_layout(config, offset, k, grid)

    def _make_layout(self, c: Any, offset: int, k: int, grid: tuple[int, int]) -> TokenLayout:
        return TokenLayout(
            vocab_size=c.vocab_size,
            image_token_offset=offset,
            num_codes=k,
            grid_h=int(grid[0]),
            grid_w=int(grid[1]),
            special=dict(self.special),
        )

    # --- prompt ------------------------------------------------------------------------------------
    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        """Token rows ``ids [R, P]`` (cond, then uncond under CFG), ``valid [R, P]`` and ``positions [R, P]``."""
        sp = self.special
        cond = [sp["bos"], *self.tokenizer(text), sp["eot"], sp["boi"]]
        return prompt_rows(text, cfg, cond, [sp["bos"], sp["boi"]], sp["pad"])

    def prompt_length(self, inputs: PromptInputs) -> int:
        return int(inputs.data["ids"].shape[1])


class ChameleonTarget(ChameleonVocab, HFCausalTarget):
    """Anole-style Chameleon target on transformers (``model.impl: hf``; see module docstring).

    ``lm``: a ``ChameleonForConditionalGeneration`` (its ``.model`` and ``.lm_head`` are used);
    ``vq``: a taming VQGAN decoder (``decode_codes(codes [1, h*w], h, w)``) or None;
    ``tokenizer``: a callable ``text → list[int]`` of text-token ids (no specials).
    """

    def __init__(
        self,
        lm: nn.Module,
        vq: Any,
        tokenizer: Any,
        grid: tuple[int, int],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        cfg_mode: str | None = None,
    ) -> None:
        super().__init__(lm, device, dtype, cfg_mode or self.default_cfg_mode)
        self._init_vocab(lm.config, vq, tokenizer, grid, device)


class LeanChameleonTarget(ChameleonVocab, StaticGPTTarget):
    """Anole-style Chameleon target on the lean stack (``model.impl: lean``, the default; ``chameleon.lean``).

    Same constructor and prompt rows as ``ChameleonTarget``, with ``lm`` a ``chameleon.lean.ChameleonLM``. The CFG
    rows always run batched in one preallocated ``StaticKVCache`` (the uncond row left-padded, its pad columns
    never attended: ``valid``); ``cfg_mode`` is validated and kept for the record — ``sequential`` (the HF path's
    one cache per row) is the same function, so the lean path computes it batched. Tree verification, the
    additive mask, device-side KV compaction and ``compile_forward`` are ``StaticGPTTarget``'s.
    """

    def __init__(
        self,
        lm: Any,
        vq: Any,
        tokenizer: Any,
        grid: tuple[int, int],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        cfg_mode: str | None = None,
    ) -> None:
        super().__init__()
        cfg_mode = cfg_mode or self.default_cfg_mode
        if cfg_mode not in CFG_MODES:
            raise ConfigError("model.cfg_mode", f"unknown CFG mode {cfg_mode!r}; choose one of {CFG_MODES}")
        self.cfg_mode = cfg_mode
        self.net = lm.to(device=device, dtype=dtype).eval()
        self.device, self.dtype = torch.device(device), dtype
        a = lm.arch
        self.hidden_size, self.num_heads, self.num_kv_heads = a.hidden_size, a.num_heads, a.num_kv_heads
        self.head_dim, self.intermediate_size, self.rope_theta = a.head_dim, a.intermediate_size, a.rope_theta
        self.cache: StaticKVCache | None = None
        self._init_vocab(lm.config, vq, tokenizer, grid, device)

    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        dev = self.device
        ids, valid, pos = (inputs.data[k].to(dev) for k in ("ids", "valid", "positions"))
        self.cache = self.kv_cache(ids.shape[0], capacity)
        x = self.net.tok_embeddings(ids)
        feats = self.net.forward_embeds(x, pos, prompt_mask(valid), self.cache, 0)
        return PrefillResult(
            logits=self.logits_head(feats[:, -1]),
            features=feats,
            input_embeds=x,
            positions=pos,
            valid=valid,
            ids=ids,
        )

    def drafter_rope(self, head_dim: int) -> Rope:
        return Rope1D(head_dim, theta=self.rope_theta)  # HF rotate_half pairing, as the target's own


# ---------------------------------------------------------------------------------------------------------
# Building from config
# ---------------------------------------------------------------------------------------------------------


def make_tokenizer(cfg: Any, config: Any, base: Path | None = None) -> Any:
    """``model.tokenizer``: ``hash`` (tiny stand-in over the filler ids) or a tokenizer folder / hub id.

    Random-weight models (``random_init``) use a configured tokenizer only when it is a local folder, ``hash``
    otherwise (never a download: with random weights a real tokenizer adds nothing).
    """
    from adtbench.models.registry import get, resolve_dir

    kind = str(get(cfg, "tokenizer", "hash"))
    if bool(get(cfg, "random_init", False)) and not Path(kind).expanduser().is_dir():
        kind = "hash"
    if kind != "hash":
        return HFTokenizer(resolve_dir("model.tokenizer", kind, ["tokenizer*.json"], base))
    vm = config.vocabulary_map
    image_token_range(vm)  # validates the image block
    # filler ids: everything above the highest named (non-filler) token
    lo = max(int(i) for n, i in vm.items() if not n.startswith(FILLER_PREFIX)) + 1
    return HashTokenizer(lo, int(config.vocab_size), int(get(cfg, "max_text_tokens", 16)))


def make_vq(cfg: Any, seed: int, base: Path | None = None) -> Any:
    """``model.vq``: ``tiny`` (random), ``taming`` (``ckpt`` = vqgan.ckpt, ``yaml`` = vqgan.yaml) or ``none``."""
    from adtbench.models.registry import get, plain, resolve_file

    vq_cfg = plain(get(cfg, "vq", None)) or {}
    kind = vq_cfg.get("kind", "none")
    if kind == "tiny":
        from adtbench.models.chameleon.vq import make_tiny_taming_vq

        return make_tiny_taming_vq(seed + 1)
    if kind == "taming":
        from adtbench.models.chameleon.vq import load_taming_vqgan

        ckpt = resolve_file("model.vq.ckpt", vq_cfg.get("ckpt"), "vqgan.ckpt (Chameleon VQGAN weights)", base)
        yml = resolve_file("model.vq.yaml", vq_cfg.get("yaml"), "vqgan.yaml (Chameleon VQGAN config)", base)
        try:
            return load_taming_vqgan(ckpt, yml)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError("model.vq.ckpt", str(e)) from e
    if kind in ("none", None):
        return None
    raise ConfigError("model.vq.kind", f"unknown VQ kind {kind!r}; choose tiny, taming or none")


def grid_of(cfg: Any, example: str) -> tuple[int, int]:
    from adtbench.models.registry import get, plain

    grid = plain(get(cfg, "grid", None))
    if grid is None:
        raise ConfigError("model.grid", f"set the generated image grid, e.g. {example}")
    grid = (int(grid), int(grid)) if isinstance(grid, int) else tuple(int(g) for g in grid)
    if len(grid) != 2 or min(grid) < 1:
        raise ConfigError("model.grid", f"expected [h, w] with positive entries, got {grid}")
    return grid  # type: ignore[return-value]


def random_chameleon(cfg: Any, num_codes: int, extra_names: tuple[str, ...] = ()) -> nn.Module:
    """A seeded random ``ChameleonForConditionalGeneration`` from ``model.arch`` (tiny vocabulary if absent).

    Built directly on ``model.device`` (a full-size 7B cost-model instance never touches host memory), then cast
    to ``model.dtype``.
    """
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from adtbench.models.registry import get, plain

    device, dtype, attn, seed = common_options(cfg)
    arch = dict(plain(get(cfg, "arch", None)) or {})
    if "vocabulary_map" not in arch:
        arch["vocabulary_map"] = tiny_vocabulary_map(int(arch["vocab_size"]), num_codes, extra_names)
    arch.pop("num_codes", None)
    config = ChameleonConfig(**arch)
    config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        lm = ChameleonForConditionalGeneration(config)  # float32 on the device (7B: 28 GB), cast below
    spread_init_(lm, seed, float(get(cfg, "head_std", 2.0)))
    return lm.to(dtype)


def build_parts(cfg: Any, extra_names: tuple[str, ...] = ()) -> tuple[Any, Any, Any]:
    """``(lm, vq, tokenizer)`` of a Chameleon-family ``model`` node (Anole, Lumina-mGPT).

    ``lm`` follows ``model.impl``: ``lean`` (default) a ``chameleon.lean.ChameleonLM``, ``hf`` a transformers
    ``ChameleonForConditionalGeneration``; both carry the checkpoint's ``ChameleonConfig`` as ``.config``.
    ``random_init: true``: ``random_chameleon`` (tiny vocabulary plus ``extra_names`` unless ``arch`` carries its
    own ``vocabulary_map``; the lean path converts it, so both paths get the same seeded weights) and a tiny VQ only
    when ``vq.kind: tiny`` (a checkpoint VQ makes no sense with random LM weights). Otherwise every path
    (``model.path``, the VQ files) is validated before the LM weights are read by ``load_chameleon_net`` (lean) or
    ``load_chameleon_lm`` (hf). Tokenizer problems are a ``ConfigError`` on ``model.tokenizer``.
    """
    from adtbench.models.registry import get, model_impl, resolve_dir

    impl = model_impl(cfg)
    device, dtype, attn, seed = common_options(cfg)
    base = None
    lm: Any
    if bool(get(cfg, "random_init", False)):
        vq = make_vq(cfg, seed) if str(get(cfg, "vq.kind", "none")) == "tiny" else None
        k = vq.codebook_size if vq is not None else int(get(cfg, "arch.num_codes", 64))
        lm = random_chameleon(cfg, k, extra_names)
        if impl == "lean":
            lm = lean_from_hf(lm)
    else:
        base = resolve_dir("model.path", get(cfg, "path"), ["config.json", "*.safetensors"])
        vq = make_vq(cfg, seed, base)  # validate every path before reading the LM weights
        lm = load_chameleon_net(base, dtype, device) if impl == "lean" else load_chameleon_lm(base, dtype, attn)
    try:
        tokenizer = make_tokenizer(cfg, lm.config, base)
    except ValueError as e:
        raise ConfigError("model.tokenizer", str(e)) from e
    return lm, vq, tokenizer


def build_target(cfg: Any) -> ChameleonTarget | LeanChameleonTarget:
    """Build from a ``model`` config node (``conf/model/anole.yaml``, ``conf/model/tiny_chameleon.yaml``).

    ``model.impl``: ``lean`` (default) → ``LeanChameleonTarget``, ``hf`` → ``ChameleonTarget`` (the reference).
    ``random_init: true`` builds ``ChameleonConfig(**arch)`` with the tiny vocabulary map (unless ``arch``
    carries its own ``vocabulary_map``) and seeded, spread-out random weights; otherwise the LM is loaded from
    ``model.path`` (an HF folder or hub id). ``grid: [h, w]`` is the generated grid.
    """
    from adtbench.models.registry import get, model_impl

    cls = LeanChameleonTarget if model_impl(cfg) == "lean" else ChameleonTarget
    device, dtype, _, _ = common_options(cfg)
    grid = grid_of(cfg, "[32, 32] for Anole")
    lm, vq, tokenizer = build_parts(cfg)
    return cls(lm, vq, tokenizer, grid, device=device, dtype=dtype, cfg_mode=str(get(cfg, "cfg_mode", "batched")))


__all__ = [
    "ChameleonTarget",
    "ChameleonVocab",
    "LeanChameleonTarget",
    "build_parts",
    "build_target",
    "grid_of",
    "image_code_of",
    "image_token_name",
    "image_token_range",
    "make_tokenizer",
    "make_vq",
    "random_chameleon",
    "special_token_ids",
    "tiny_vocabulary_map",
]
