"""Chameleon-family adapter (Anole): transformers' ``ChameleonForConditionalGeneration`` behind ``Target``.

The LM runs through ``lm.model`` (a ``ChameleonModel``) and ``lm.lm_head`` directly, never through
``ChameleonForConditionalGeneration.forward``, which sets every image-token logit to ``finfo.min``.

Vocabulary: image tokens are the ``IMGIMG<letters>Z`` entries of ``config.vocabulary_map`` (letters A–J
spell the decimal VQ code); their id range is derived from the map and must be contiguous,
``id = code + image_token_offset`` (Anole: offset 4, 8192 codes). Anole generates a plain raster grid
(32×32 real, 4×4 tiny): no end-of-line or end-of-image tokens inside the generated sequence.

Prompt rows (batched CFG, models.md §2): cond ``[<s>] + text + [<reserved08706> (eot), <racm3:break> (boi)]``
at positions ``0..P-1``; uncond ``[<s>, <racm3:break>]`` left-padded with ``<pad>`` to the cond length, its
two real tokens at positions 0 and 1 (pad columns get position 0 and are masked as keys; every position
still attends to itself so no mask row is empty). Both rows then continue at their own ``next_pos``.

Attention masks are always built here as explicit 4-D float masks ``[R, 1, q, kv]`` (0 = attend,
``finfo(dtype).min`` = blocked) with explicit ``position_ids``; transformers (4.57 and 5.x) passes a 4-D
mask through ``create_causal_mask`` unchanged. Flash attention ignores such masks (algorithms.md §10,
pitfall 7), so only ``eager`` and ``sdpa`` are accepted.

KV cache: a transformers ``DynamicCache``; after verification ``_compact`` keeps the committed prefix plus
the accepted tree nodes, in order, and drops everything else — leaving the cache exactly as a sequential
forward over the committed tokens would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.base import PrefillResult, PromptInputs, Target
from adtbench.models.rope import Rope, Rope1D

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
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")


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


def tiny_vocabulary_map(vocab_size: int, num_codes: int) -> dict[str, int]:
    """The tiny test vocabulary (models.md §6.3).

    ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3, image tokens at ``4 .. 4+K-1``, then ``<eoss>``,
    ``<racm3:break>``, ``<image>``, ``<reserved08706>``; the remaining ids are filler ``<reserved9xxxx>`` names
    (the stand-in text tokens; they cannot collide with real reserved names, which stop below 10000).
    """
    names = ["<s>", "<pad>", "</s>", "<unk>"]
    names += [image_token_name(c) for c in range(num_codes)]
    names += ["<eoss>", "<racm3:break>", "<image>", "<reserved08706>"]
    if len(names) >= vocab_size:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for text tokens after {len(names)} specials")
    names += [f"<reserved{90000 + i}>" for i in range(len(names), vocab_size)]
    return {name: i for i, name in enumerate(names)}


# ---------------------------------------------------------------------------------------------------------
# KV-cache helpers (transformers ≥ 4.56: ``cache.layers[i].keys/values``; older: ``key_cache[i]``)
# ---------------------------------------------------------------------------------------------------------


def cache_num_layers(cache: Any) -> int:
    return len(cache.layers) if hasattr(cache, "layers") else len(cache.key_cache)


def cache_get(cache: Any, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i``'s keys and values ``[R, kv_heads, L, head_dim]``."""
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


def cache_set(cache: Any, i: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    if hasattr(cache, "layers"):
        cache.layers[i].keys, cache.layers[i].values = keys, values
    else:
        cache.key_cache[i], cache.value_cache[i] = keys, values


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (True = attend) → float additive mask: 0 where True, ``finfo(dtype).min`` elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


# ---------------------------------------------------------------------------------------------------------
# The target
# ---------------------------------------------------------------------------------------------------------


class ChameleonTarget(Target):
    """Anole-style Chameleon target (see module docstring).

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
    ) -> None:
        super().__init__()
        impl = getattr(lm.config, "_attn_implementation", None)
        if impl not in ATTN_IMPLEMENTATIONS:
            raise ConfigError(
                "model.attn_implementation",
                f"{impl!r} cannot take explicit 4-D tree masks; use one of {ATTN_IMPLEMENTATIONS}",
            )
        # rotary ``inv_freq`` buffers stay float32 (a bf16 cast would shift the angles at long positions)
        inv = {n: b.float() for n, b in lm.named_buffers() if n.endswith("inv_freq")}
        self.lm = lm.to(device=device, dtype=dtype).eval()
        for name, buf in inv.items():
            mod = self.lm.get_submodule(name.rsplit(".", 1)[0])
            mod.inv_freq = buf.to(device)
        self.vq = vq.to(device=device).eval() if vq is not None else None
        self.tokenizer = tokenizer
        self.device, self.dtype = torch.device(device), dtype
        c = lm.config
        offset, k = image_token_range(c.vocabulary_map)
        self.special = special_token_ids(c.vocabulary_map)
        if self.vq is not None and self.vq.codebook_size != k:
            raise ConfigError("model.vq", f"VQ codebook {self.vq.codebook_size} ≠ {k} image tokens in the vocabulary")
        self.layout = TokenLayout(
            vocab_size=c.vocab_size,
            image_token_offset=offset,
            num_codes=k,
            grid_h=int(grid[0]),
            grid_w=int(grid[1]),
            special=dict(self.special),
        )
        self.hidden_size, self.num_heads = c.hidden_size, c.num_attention_heads
        self.num_kv_heads = c.num_key_value_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.intermediate_size = c.intermediate_size
        self.rope_theta = _rope_theta(c)
        self.cache: Any = None

    # --- prompt ------------------------------------------------------------------------------------
    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        """Token rows ``ids [R, P]`` (cond, then uncond under CFG), ``valid [R, P]`` and ``positions [R, P]``."""
        sp = self.special
        cond = [sp["bos"], *self.tokenizer(text), sp["eot"], sp["boi"]]
        rows = [cond]
        if cfg:  # uncond: [bos, boi], left-padded to the cond length
            rows.append([sp["pad"]] * (len(cond) - 2) + [sp["bos"], sp["boi"]])
        ids = torch.tensor(rows, dtype=torch.long)
        valid = torch.ones_like(ids, dtype=torch.bool)
        if cfg:
            valid[1, : len(cond) - 2] = False
        positions = (valid.long().cumsum(1) - 1).clamp_min(0)  # real tokens 0, 1, …; pads 0
        return PromptInputs(text=text, cfg=cfg, data={"ids": ids, "valid": valid, "positions": positions})

    def prompt_length(self, inputs: PromptInputs) -> int:
        return int(inputs.data["ids"].shape[1])

    # --- target hooks ------------------------------------------------------------------------------
    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        from transformers import DynamicCache

        dev = self.device
        ids = inputs.data["ids"].to(dev)
        valid = inputs.data["valid"].to(dev)
        pos = inputs.data["positions"].to(dev)
        P = ids.shape[1]
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        eye = torch.eye(P, dtype=torch.bool, device=dev)
        mask = ((causal[None] & valid[:, None, :]) | eye[None])[:, None]  # [R, 1, P, P]
        self.cache = DynamicCache(config=self.lm.config)  # grows on demand: ``capacity`` is not preallocated
        out = self.lm.model(
            input_ids=ids,
            attention_mask=additive_mask(mask, self.dtype),
            position_ids=pos,
            past_key_values=self.cache,
            use_cache=True,
        )
        feats = out.last_hidden_state  # post final norm
        return PrefillResult(
            logits=self.lm.lm_head(feats[:, -1]),
            features=feats,
            input_embeds=self.lm.model.embed_tokens(ids),
            positions=pos,
            valid=valid,
        )

    def _forward(
        self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens [n]``, bool ``mask [R, 1, n, L + n]``, ``position_ids [R, n]``.

        Returns raw logits ``[R, n, V]`` and post-norm features ``[R, n, H]``; appends n K/V entries per row.
        """
        if self.cache is None:
            raise RuntimeError("call start() (prefill) before verify_forward")
        self._truncate(self.length)  # drop an uncommitted tree block (verify without commit)
        R, n = position_ids.shape
        out = self.lm.model(
            input_ids=tokens[None].expand(R, n),
            attention_mask=additive_mask(mask, self.dtype),
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
        )
        feats = out.last_hidden_state
        return self.lm.lm_head(feats), feats

    def _truncate(self, length: int) -> None:
        """Keep the first ``length`` cache entries of every layer."""
        for i in range(cache_num_layers(self.cache)):
            k, v = cache_get(self.cache, i)
            if k.shape[-2] > length:
                cache_set(self.cache, i, k[:, :, :length], v[:, :, :length])

    def _compact(self, start: int, keep: torch.Tensor) -> None:
        """Cache entries ``[:start] + (start + keep)``, in that order; everything after is dropped.

        Only the kept tree entries are copied (in place, into slots ``start..``); the prefix is a view.
        """
        n = keep.numel()
        idx = start + keep.to(self.device).long()
        for i in range(cache_num_layers(self.cache)):
            k, v = cache_get(self.cache, i)
            k_sel, v_sel = k.index_select(2, idx), v.index_select(2, idx)  # copies before the overwrite
            k, v = k[:, :, : start + n], v[:, :, : start + n]
            k[:, :, start:] = k_sel
            v[:, :, start:] = v_sel
            cache_set(self.cache, i, k, v)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm.model.embed_tokens(ids.to(self.device))

    def lm_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(features)

    def drafter_rope(self, head_dim: int) -> Rope:
        return Rope1D(head_dim, theta=self.rope_theta)  # HF rotate_half pairing, as Chameleon

    @torch.no_grad()
    def decode_image(self, codes: torch.Tensor) -> np.ndarray:
        from adtbench.models.vq_common import to_uint8_images

        if self.vq is None:
            raise RuntimeError("no VQ decoder configured (model.vq)")
        h, w = codes.shape
        pixels = self.vq.decode_codes(codes.reshape(1, -1).to(self.device), h, w)
        return to_uint8_images(pixels.float().cpu())[0]


# ---------------------------------------------------------------------------------------------------------
# Building from config
# ---------------------------------------------------------------------------------------------------------


def _rope_theta(config: Any) -> float:
    """``rope_theta`` (transformers 4.x) or ``rope_parameters["rope_theta"]`` (5.x)."""
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def _plain(node: Any) -> Any:
    """OmegaConf node → plain Python containers (plain dicts/lists pass through)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, DictConfig | ListConfig):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return node


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise ConfigError("model.dtype", f"unknown dtype {name!r}; choose one of {sorted(table)}")
    return table[name]


def spread_init_(lm: nn.Module, seed: int, head_std: float = 2.0) -> None:
    """Re-initialise a random tiny LM so its logits are non-degenerate (spread over a few units).

    Linear weights ~ N(0, 1/fan_in) (``lm_head``: std ``head_std/sqrt(fan_in)``), embeddings ~ N(0, 1),
    biases 0; norm weights stay 1. Draws from a local generator seeded with ``seed``.
    """
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, mod in lm.named_modules():
            if isinstance(mod, nn.Linear):
                std = mod.in_features**-0.5 * (head_std if name.endswith("lm_head") else 1.0)
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * std)
                if mod.bias is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.Embedding):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen))


class HFTokenizer:
    """``text → ids`` through a transformers tokenizer (no special tokens added: the prompt adds them)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)

    def __call__(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])


class HashTokenizer:
    """Stand-in tokenizer for tiny vocabularies: each word → a stable id in the filler range ``[lo, hi)``."""

    def __init__(self, lo: int, hi: int, max_len: int) -> None:
        if not 0 <= lo < hi:
            raise ValueError(f"empty text-id range [{lo}, {hi})")
        self.lo, self.hi, self.max_len = lo, hi, max_len

    def __call__(self, text: str) -> list[int]:
        from adtbench.models.text import text_token_ids

        return text_token_ids(text, self.lo, self.hi, self.max_len)


def _make_tokenizer(cfg: Any, config: Any) -> Any:
    kind = str(_get(cfg, "tokenizer", "hash"))
    if kind != "hash":
        return HFTokenizer(kind)  # a local path or hub id of a real Chameleon tokenizer
    # filler ids: everything above the highest special / image id
    vm = config.vocabulary_map
    offset, k = image_token_range(vm)
    lo = max([offset + k - 1, *special_token_ids(vm).values()]) + 1
    return HashTokenizer(lo, int(config.vocab_size), int(_get(cfg, "max_text_tokens", 16)))


def _make_vq(cfg: Any, seed: int) -> Any:
    vq_cfg = _plain(_get(cfg, "vq", None)) or {}
    kind = vq_cfg.get("kind", "none")
    if kind == "tiny":
        from adtbench.models.vq_taming import make_tiny_taming_vq

        return make_tiny_taming_vq(seed + 1)
    if kind == "taming":
        from adtbench.models.vq_taming import load_taming_vqgan

        if "ckpt" not in vq_cfg or "yaml" not in vq_cfg:
            raise ConfigError("model.vq", "kind taming needs `ckpt` (vqgan.ckpt) and `yaml` (vqgan.yaml)")
        return load_taming_vqgan(vq_cfg["ckpt"], vq_cfg["yaml"])
    if kind in ("none", None):
        return None
    raise ConfigError("model.vq.kind", f"unknown VQ kind {kind!r}; choose tiny, taming or none")


def build_target(cfg: Any) -> ChameleonTarget:
    """Build from a ``model`` config node (see ``conf/model/tiny_chameleon.yaml``).

    ``random_init: true`` builds ``ChameleonConfig(**arch)`` with the tiny vocabulary map (unless ``arch``
    carries its own ``vocabulary_map``) and seeded, spread-out random weights; otherwise the LM is loaded
    with ``from_pretrained(model.path)``. ``grid: [h, w]`` is the generated image grid.
    """
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    dtype = _dtype(str(_get(cfg, "dtype", "float32")))
    device = str(_get(cfg, "device", "cpu"))
    seed = int(_get(cfg, "seed", 0))
    attn = str(_get(cfg, "attn_implementation", "sdpa"))
    if attn not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(
            "model.attn_implementation", f"{attn!r} ignores explicit tree masks; use one of {ATTN_IMPLEMENTATIONS}"
        )
    grid = _plain(_get(cfg, "grid", None))
    if grid is None:
        raise ConfigError("model.grid", "set the generated image grid, e.g. [32, 32] for Anole")
    grid = (int(grid), int(grid)) if isinstance(grid, int) else tuple(int(g) for g in grid)
    if len(grid) != 2:
        raise ConfigError("model.grid", f"expected [h, w], got {grid}")

    vq = _make_vq(cfg, seed)
    if bool(_get(cfg, "random_init", False)):
        arch = dict(_plain(_get(cfg, "arch", None)) or {})
        if "vocabulary_map" not in arch:
            k = vq.codebook_size if vq is not None else int(arch.pop("num_codes", 64))
            arch["vocabulary_map"] = tiny_vocabulary_map(int(arch["vocab_size"]), k)
        arch.pop("num_codes", None)
        config = ChameleonConfig(**arch)
        config._attn_implementation = attn
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            lm = ChameleonForConditionalGeneration(config)
        spread_init_(lm, seed, float(_get(cfg, "head_std", 2.0)))
    else:
        path = _get(cfg, "path", None)
        if not path:
            raise ConfigError("model.path", "set a checkpoint path or random_init: true")
        # NB: Lumina-mGPT checkpoints need the q/k-norm expansion of models.md §1.4 (not handled here yet).
        lm = ChameleonForConditionalGeneration.from_pretrained(str(path), dtype=dtype, attn_implementation=attn)
    try:
        tokenizer = _make_tokenizer(cfg, lm.config)
    except ValueError as e:
        raise ConfigError("model.tokenizer", str(e)) from e
    return ChameleonTarget(lm, vq, tokenizer, grid, device=device, dtype=dtype)


__all__ = [
    "ChameleonTarget",
    "additive_mask",
    "build_target",
    "cache_get",
    "cache_num_layers",
    "cache_set",
    "image_code_of",
    "image_token_name",
    "image_token_range",
    "special_token_ids",
    "tiny_vocabulary_map",
]
