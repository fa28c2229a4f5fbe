"""Chameleon-family adapter (Anole) and the generic transformers-LM target it is built on.

``HFCausalTarget`` drives any transformers causal LM with ``.model`` + ``.lm_head`` (Chameleon, Qwen2) behind
``Target``: explicit 4-D float masks ``[R, 1, q, kv]`` (0 = attend, ``finfo(dtype).min`` = blocked) and explicit
``position_ids`` on a ``DynamicCache``; transformers (4.57 and 5.x) passes a 4-D mask through
``create_causal_mask`` unchanged. Flash attention ignores such masks (algorithms.md §10, pitfall 7), so only
``eager`` and ``sdpa`` are accepted. CFG rows run either *batched* (one forward, one cache, the uncond row
left-padded with masked pad columns) or *sequential* (one forward and one cache per row; a row's cache holds
only its valid columns — Lumina-mGPT's official unbatched CFG). Both give the same logits up to float
rounding. After verification ``_compact`` keeps the committed prefix plus the accepted tree nodes, in order,
leaving every cache exactly as a sequential forward over the committed tokens would.

The Chameleon LM runs through ``lm.model`` + ``lm.lm_head``, never ``ChameleonForConditionalGeneration.forward``,
which sets every image-token logit to ``finfo.min``.

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

Checkpoint loading (``load_chameleon_lm``): an HF folder (``config.json`` + safetensors shards). q/k-norm
tensors stored as ``(d0, head_dim)`` with ``d0`` < heads (Lumina-mGPT's pre-release layout, models.md §1.4) are
expanded with ``repeat_interleave`` to ``(heads, head_dim)``; every other shape must match, and only
``model.vqmodel.*`` (the unused VQ encoder) may be missing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
CFG_MODES = ("batched", "sequential")
FILLER_PREFIX = "<reserved9"  # tiny-vocabulary filler names <reserved9xxxx> (stand-in text ids)


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
    ``<reserved08799>`` and size tokens ``<reserved088NN>``); the remaining ids are filler ``<reserved9xxxx>``
    names (the stand-in text tokens; they cannot collide with real reserved names, which stop below 10000).
    """
    names = ["<s>", "<pad>", "</s>", "<unk>"]
    names += [image_token_name(c) for c in range(num_codes)]
    names += ["<eoss>", "<racm3:break>", "<image>", "<reserved08706>", *extra]
    if len(set(names)) != len(names):
        raise ValueError("duplicate names in the tiny vocabulary")
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
# The generic transformers-LM target
# ---------------------------------------------------------------------------------------------------------


class HFCausalTarget(Target):
    """A transformers causal LM (``lm.model`` + ``lm.lm_head``) behind ``Target`` (see module docstring).

    Subclasses set ``layout`` and implement ``encode_prompt`` (returning ``data`` with ``ids``, ``valid`` and
    ``positions``, all ``[R, P]``), ``drafter_rope`` and ``decode_image``. ``cfg_mode``: ``batched`` (one cache,
    ``R`` rows) or ``sequential`` (one cache per row holding only that row's valid columns).
    """

    def __init__(
        self,
        lm: nn.Module,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        cfg_mode: str = "batched",
    ) -> None:
        super().__init__()
        impl = getattr(lm.config, "_attn_implementation", None)
        if impl not in ATTN_IMPLEMENTATIONS:
            raise ConfigError(
                "model.attn_implementation",
                f"{impl!r} cannot take explicit 4-D tree masks; use one of {ATTN_IMPLEMENTATIONS}",
            )
        if cfg_mode not in CFG_MODES:
            raise ConfigError("model.cfg_mode", f"unknown CFG mode {cfg_mode!r}; choose one of {CFG_MODES}")
        # rotary ``inv_freq`` buffers stay float32 (a bf16 cast would shift the angles at long positions)
        inv = {n: b.float() for n, b in lm.named_buffers() if n.endswith("inv_freq")}
        self.lm = lm.to(device=device, dtype=dtype).eval()
        for name, buf in inv.items():
            mod = self.lm.get_submodule(name.rsplit(".", 1)[0])
            mod.inv_freq = buf.to(device)
        self.device, self.dtype = torch.device(device), dtype
        self.cfg_mode = cfg_mode
        c = lm.config
        self.hidden_size, self.num_heads = c.hidden_size, c.num_attention_heads
        self.num_kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.intermediate_size = c.intermediate_size
        self.rope_theta = _rope_theta(c)
        self.cache: Any = None  # batched: one DynamicCache over all rows
        self.caches: list[Any] = []  # sequential: one DynamicCache per row

    def prompt_length(self, inputs: PromptInputs) -> int:
        return int(inputs.data["ids"].shape[1])

    @property
    def sequential(self) -> bool:
        return self.cfg_mode == "sequential" and self.rows > 1

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.lm.config)  # grows on demand: capacity is not preallocated

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        """One LM forward: ids ``[B, n]``, bool mask ``[B, 1, n, kv]``, positions ``[B, n]`` → features."""
        out = self.lm.model(
            input_ids=ids,
            attention_mask=additive_mask(mask, self.dtype),
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        )
        return out.last_hidden_state  # post final norm

    # --- target hooks ------------------------------------------------------------------------------
    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        dev = self.device
        ids = inputs.data["ids"].to(dev)
        valid = inputs.data["valid"].to(dev)
        pos = inputs.data["positions"].to(dev)
        R, P = ids.shape
        self.rows = R  # ``sequential`` reads it before ``start`` sets it
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        if self.sequential:  # each row alone, its pad columns dropped
            self.cache, self.caches = None, []
            feats = torch.zeros(R, P, self.hidden_size, dtype=self.dtype, device=dev)
            for r in range(R):
                cols = valid[r]
                n = int(cols.sum())
                cache = self._new_cache()
                mask = causal[:n, :n][None, None]
                feats[r, cols] = self._run(ids[r : r + 1, cols], mask, pos[r : r + 1, cols], cache)[0]
                self.caches.append(cache)
        else:
            eye = torch.eye(P, dtype=torch.bool, device=dev)
            mask = ((causal[None] & valid[:, None, :]) | eye[None])[:, None]  # [R, 1, P, P]
            self.cache, self.caches = self._new_cache(), []
            feats = self._run(ids, mask, pos, self.cache)
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
        if self.cache is None and not self.caches:
            raise RuntimeError("call start() (prefill) before verify_forward")
        R, n = position_ids.shape
        L = self.length
        if self.caches:
            feats = []
            for r in range(R):
                cols = self.valid[r, :L]
                _truncate(self.caches[r], int(cols.sum()))  # drop an uncommitted tree block
                m = torch.cat([mask[r : r + 1, :, :, :L][..., cols], mask[r : r + 1, :, :, L:]], dim=-1)
                feats.append(self._run(tokens[None], m, position_ids[r : r + 1], self.caches[r]))
            f = torch.cat(feats, dim=0)
        else:
            _truncate(self.cache, L)
            f = self._run(tokens[None].expand(R, n), mask, position_ids, self.cache)
        return self.lm.lm_head(f), f

    def _compact(self, start: int, keep: torch.Tensor) -> None:
        """Cache entries ``[:start] + (start + keep)``, in that order, per row; everything after is dropped."""
        if self.caches:
            for r, cache in enumerate(self.caches):
                _compact_cache(cache, int(self.valid[r, :start].sum()), keep, self.device)
        else:
            _compact_cache(self.cache, start, keep, self.device)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm.model.embed_tokens(ids.to(self.device))

    def lm_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(features)

    def drafter_rope(self, head_dim: int) -> Rope:
        return Rope1D(head_dim, theta=self.rope_theta)  # HF rotate_half pairing


def _truncate(cache: Any, length: int) -> None:
    """Keep the first ``length`` entries of every layer of ``cache``."""
    for i in range(cache_num_layers(cache)):
        k, v = cache_get(cache, i)
        if k.shape[-2] > length:
            cache_set(cache, i, k[:, :, :length], v[:, :, :length])


def _compact_cache(cache: Any, start: int, keep: torch.Tensor, device: torch.device) -> None:
    """Entries ``[:start] + (start + keep)``; only the kept tree entries are copied (into slots ``start..``)."""
    n = keep.numel()
    idx = start + keep.to(device).long()
    for i in range(cache_num_layers(cache)):
        k, v = cache_get(cache, i)
        k_sel, v_sel = k.index_select(2, idx), v.index_select(2, idx)  # copies before the overwrite
        k, v = k[:, :, : start + n], v[:, :, : start + n]
        k[:, :, start:] = k_sel
        v[:, :, start:] = v_sel
        cache_set(cache, i, k, v)


# ---------------------------------------------------------------------------------------------------------
# Anole
# ---------------------------------------------------------------------------------------------------------


class ChameleonTarget(HFCausalTarget):
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
        cfg_mode: str = "batched",
    ) -> None:
        super().__init__(lm, device, dtype, cfg_mode)
        self.vq = vq.to(device=device).eval() if vq is not None else None
        self.tokenizer = tokenizer
        c = lm.config
        offset, k = image_token_range(c.vocabulary_map)
        self.special = special_token_ids(c.vocabulary_map)
        if self.vq is not None and self.vq.codebook_size != k:
            raise ConfigError("model.vq", f"VQ codebook {self.vq.codebook_size} ≠ {k} image tokens in the vocabulary")
        self.layout = self._make_layout(c, offset, k, grid)

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
        return _rows(text, cfg, cond, [sp["bos"], sp["boi"]], sp["pad"])


def _rows(text: str, cfg: bool, cond: list[int], uncond: list[int], pad: int) -> PromptInputs:
    """Cond row and (under CFG) the uncond row left-padded with ``pad``; positions count real tokens only."""
    rows = [cond]
    if cfg:
        if len(uncond) > len(cond):
            raise ValueError("the uncond prompt is longer than the cond prompt")
        rows.append([pad] * (len(cond) - len(uncond)) + uncond)
    ids = torch.tensor(rows, dtype=torch.long)
    valid = torch.ones_like(ids, dtype=torch.bool)
    if cfg:
        valid[1, : len(cond) - len(uncond)] = False
    positions = (valid.long().cumsum(1) - 1).clamp_min(0)  # real tokens 0, 1, …; pads 0
    return PromptInputs(text=text, cfg=cfg, data={"ids": ids, "valid": valid, "positions": positions})


# ---------------------------------------------------------------------------------------------------------
# Checkpoint loading
# ---------------------------------------------------------------------------------------------------------


def safetensors_files(path: Path) -> list[Path]:
    """The weight shards of an HF folder: from ``model.safetensors.index.json`` if present, else ``*.safetensors``."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ConfigError("model.path", f"{index} lists shards that are missing: {missing}")
        return files
    return sorted(path.glob("*.safetensors"))


def checkpoint_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape for every tensor in ``files`` (safetensors headers only; no data is read)."""
    from safetensors import safe_open

    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[k] = tuple(h.get_slice(k).get_shape())
    return out


def is_qk_norm(key: str) -> bool:
    return ".q_norm." in key or ".k_norm." in key


def expand_qk_norm(t: torch.Tensor, heads: int, key: str = "") -> torch.Tensor:
    """``(d0, head_dim)`` → ``(heads, head_dim)`` by ``repeat_interleave(heads // d0)`` (models.md §1.4)."""
    d0 = t.shape[0]
    if d0 == heads:
        return t
    if t.dim() != 2 or heads % d0:
        raise ValueError(f"{key}: q/k-norm of shape {tuple(t.shape)} cannot be expanded to {heads} heads")
    return t.repeat_interleave(heads // d0, dim=0)


def load_chameleon_lm(path: Path, dtype: torch.dtype, attn: str, key: str = "model.path") -> nn.Module:
    """``ChameleonForConditionalGeneration`` from an HF folder, with the q/k-norm fix (module docstring).

    Checks (``ConfigError(key, …)``): at least one safetensors shard; every checkpoint tensor's shape equals the
    model's, except q/k-norms of shape ``(d0, head_dim)`` with ``d0`` dividing the head count; only
    ``model.vqmodel.*`` may be missing. Extra keys (e.g. a VQ decoder) are ignored.
    """
    from safetensors import safe_open
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from adtbench.io import check_weights

    files = safetensors_files(path)
    if not files:
        raise ConfigError(key, f"{path} holds no *.safetensors weights")
    for f in files:  # a truncated shard: ConfigError naming key and file, before any tensor is read
        check_weights(key, f)
    config = ChameleonConfig.from_pretrained(str(path))
    if getattr(config, "vocabulary_map", None) is None:
        raise ConfigError(key, f"{path / 'config.json'} has no vocabulary_map (needed for the image-token ids)")
    shapes = checkpoint_shapes(files)
    qk = {k: s for k, s in shapes.items() if is_qk_norm(k)}
    need_fix = any(len(s) == 2 and s[0] != _heads_for(k, config) for k, s in qk.items())
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the expected q/k-norm / VQ-encoder reports are checked below instead
    try:
        lm, info = ChameleonForConditionalGeneration.from_pretrained(
            str(path), dtype=dtype, attn_implementation=attn, ignore_mismatched_sizes=need_fix, output_loading_info=True
        )
    finally:
        hf_logging.set_verbosity(level)
    own = lm.state_dict()
    bad = [
        f"{k}: checkpoint {s} vs model {tuple(own[k].shape)}"
        for k, s in shapes.items()
        if k in own and tuple(own[k].shape) != s and not (is_qk_norm(k) and len(s) == 2 and s[1:] == own[k].shape[1:])
    ]
    missing = [k for k in info["missing_keys"] if not k.startswith("model.vqmodel.")]
    if bad or missing:
        raise ConfigError(
            key, f"{path}: checkpoint does not match its config; shapes: {bad[:5]}; missing: {missing[:5]}"
        )
    if need_fix:  # copy every q/k-norm from the files, expanded to (heads, head_dim)
        with torch.no_grad():
            for f in files:
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():  # noqa: SIM118
                        if is_qk_norm(k) and k in own:
                            t = expand_qk_norm(h.get_tensor(k), _heads_for(k, config), k)
                            own[k].copy_(t.to(own[k].dtype))
    return lm.eval()


def _heads_for(key: str, config: Any) -> int:
    return config.num_attention_heads if ".q_norm." in key else config.num_key_value_heads


# ---------------------------------------------------------------------------------------------------------
# Building from config
# ---------------------------------------------------------------------------------------------------------


def _rope_theta(config: Any) -> float:
    """``rope_theta`` (transformers 4.x) or ``rope_parameters["rope_theta"]`` (5.x)."""
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def spread_init_(lm: nn.Module, seed: int, head_std: float = 2.0) -> None:
    """Re-initialise a random LM so its logits are non-degenerate (spread over a few units).

    Linear weights ~ N(0, 1/fan_in) (``lm_head``: std ``head_std/sqrt(fan_in)``), embeddings ~ N(0, 1),
    biases 0; norm weights stay 1. Draws from a local generator seeded with ``seed`` on the parameters' device
    (CPU for the tiny models; the GPU for full-size cost-model instances).
    """
    dev = next(lm.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    with torch.no_grad():
        for name, mod in lm.named_modules():
            if isinstance(mod, nn.Linear):
                std = mod.in_features**-0.5 * (head_std if name.endswith("lm_head") else 1.0)
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen, device=dev) * std)
                if mod.bias is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.Embedding):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen, device=dev))


class HFTokenizer:
    """``text → ids`` through a transformers tokenizer (no special tokens added: the prompt adds them)."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(path))

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
        from adtbench.models.vq_taming import make_tiny_taming_vq

        return make_tiny_taming_vq(seed + 1)
    if kind == "taming":
        from adtbench.models.vq_taming import load_taming_vqgan

        ckpt = resolve_file("model.vq.ckpt", vq_cfg.get("ckpt"), "vqgan.ckpt (Chameleon VQGAN weights)", base)
        yml = resolve_file("model.vq.yaml", vq_cfg.get("yaml"), "vqgan.yaml (Chameleon VQGAN config)", base)
        try:
            return load_taming_vqgan(ckpt, yml)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError("model.vq.ckpt", str(e)) from e
    if kind in ("none", None):
        return None
    raise ConfigError("model.vq.kind", f"unknown VQ kind {kind!r}; choose tiny, taming or none")


def common_options(cfg: Any) -> tuple[torch.device, torch.dtype, str, int]:
    """``(device, dtype, attn_implementation, seed)`` of a transformers-LM model node, validated."""
    from adtbench.models.registry import get, resolve_device, resolve_dtype

    device = resolve_device(get(cfg, "device", "cpu"))
    dtype = resolve_dtype(get(cfg, "dtype", "auto"), device)
    attn = str(get(cfg, "attn_implementation", "sdpa"))
    if attn not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(
            "model.attn_implementation", f"{attn!r} ignores explicit tree masks; use one of {ATTN_IMPLEMENTATIONS}"
        )
    return device, dtype, attn, int(get(cfg, "seed", 0))


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


def build_target(cfg: Any) -> ChameleonTarget:
    """Build from a ``model`` config node (``conf/model/anole.yaml``, ``conf/model/tiny_chameleon.yaml``).

    ``random_init: true`` builds ``ChameleonConfig(**arch)`` with the tiny vocabulary map (unless ``arch``
    carries its own ``vocabulary_map``) and seeded, spread-out random weights; otherwise the LM is loaded from
    ``model.path`` (an HF folder or hub id) by ``load_chameleon_lm``. ``grid: [h, w]`` is the generated grid.
    """
    from adtbench.models.registry import get, resolve_dir

    device, dtype, attn, seed = common_options(cfg)
    grid = grid_of(cfg, "[32, 32] for Anole")
    base = None
    if bool(get(cfg, "random_init", False)):  # a checkpoint VQ makes no sense with random LM weights
        vq = make_vq(cfg, seed) if str(get(cfg, "vq.kind", "none")) == "tiny" else None
        k = vq.codebook_size if vq is not None else int(get(cfg, "arch.num_codes", 64))
        lm = random_chameleon(cfg, k)
    else:
        base = resolve_dir("model.path", get(cfg, "path"), ["config.json", "*.safetensors"])
        vq = make_vq(cfg, seed, base)  # validate every path before reading the LM weights
        lm = load_chameleon_lm(base, dtype, attn)
    try:
        tokenizer = make_tokenizer(cfg, lm.config, base)
    except ValueError as e:
        raise ConfigError("model.tokenizer", str(e)) from e
    return ChameleonTarget(
        lm, vq, tokenizer, grid, device=device, dtype=dtype, cfg_mode=str(get(cfg, "cfg_mode", "batched"))
    )


__all__ = [
    "ChameleonTarget",
    "HFCausalTarget",
    "additive_mask",
    "build_target",
    "cache_get",
    "cache_num_layers",
    "cache_set",
    "expand_qk_norm",
    "image_code_of",
    "image_token_name",
    "image_token_range",
    "load_chameleon_lm",
    "special_token_ids",
    "tiny_vocabulary_map",
]
