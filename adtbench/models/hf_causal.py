"""The generic transformers causal-LM target (Chameleon, Lumina-mGPT and Tar's Qwen2 build on it).

``HFCausalTarget`` drives any transformers causal LM with ``.model`` + ``.lm_head`` (Chameleon, Qwen2) behind
``Target``: explicit 4-D float masks ``[R, 1, q, kv]`` (0 = attend, ``finfo(dtype).min`` = blocked) and explicit
``position_ids`` on a ``DynamicCache``; transformers (4.57 and 5.x) passes a 4-D mask through
``create_causal_mask`` unchanged. Flash attention ignores such masks (algorithms.md §10, pitfall 7), so only
``eager`` and ``sdpa`` are accepted. CFG rows run either *batched* (one forward, one cache, the uncond row
left-padded with masked pad columns) or *sequential* (one forward and one cache per row; a row's cache holds
only its valid columns — Lumina-mGPT's official unbatched CFG). Both give the same logits up to float
rounding. After verification ``_compact`` keeps the committed prefix plus the accepted tree nodes, in order,
leaving every cache exactly as a sequential forward over the committed tokens would.

Also here: the options every transformers-LM model node shares (``common_options``) and the seeded
non-degenerate re-initialisation of random LMs (``spread_init_``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.models.base import PrefillResult, PromptInputs, Target
from adtbench.models.rope import Rope, Rope1D

ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
CFG_MODES = ("batched", "sequential")


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


def prompt_mask(valid: torch.Tensor) -> torch.Tensor:
    """Boolean prefill mask ``[R, 1, P, P]`` of left-padded prompt rows ``valid [R, P]``: causal over the row's real
    tokens, and every position attends to itself so that no mask row is empty (a pad row's output is unused)."""
    P = valid.shape[1]
    causal = torch.ones(P, P, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(P, dtype=torch.bool, device=valid.device)
    return ((causal[None] & valid[:, None, :]) | eye[None])[:, None]


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
        if self.sequential:  # each row alone, its pad columns dropped
            causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
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
            self.cache, self.caches = self._new_cache(), []
            feats = self._run(ids, prompt_mask(valid), pos, self.cache)
        return PrefillResult(
            logits=self.lm.lm_head(feats[:, -1]),
            features=feats,
            input_embeds=self.lm.model.embed_tokens(ids),
            positions=pos,
            valid=valid,
            ids=ids,
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

    def weights(self) -> list[torch.Tensor]:
        return list(self.lm.parameters())

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
# Options and random initialisation
# ---------------------------------------------------------------------------------------------------------


def _rope_theta(config: Any) -> float:
    """``rope_theta`` (transformers 4.x) or ``rope_parameters["rope_theta"]`` (5.x)."""
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def spread_init_(lm: nn.Module, seed: int, head_std: float = 2.0, head_names: tuple[str, ...] = ("lm_head",)) -> None:
    """Re-initialise a random LM so its logits are non-degenerate (spread over a few units).

    Linear weights ~ N(0, 1/fan_in) (heads — modules whose last name component is in ``head_names`` — std
    ``head_std/sqrt(fan_in)``), embeddings ~ N(0, 1),
    biases 0; norm weights stay 1. Draws from a local generator seeded with ``seed`` on the parameters' device
    (CPU for the tiny models; the GPU for full-size cost-model instances).
    """
    dev = next(lm.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    with torch.no_grad():
        for name, mod in lm.named_modules():
            if isinstance(mod, nn.Linear):
                std = mod.in_features**-0.5 * (head_std if name.split(".")[-1] in head_names else 1.0)
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen, device=dev) * std)
                if mod.bias is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.Embedding):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen, device=dev))


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


__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "CFG_MODES",
    "HFCausalTarget",
    "additive_mask",
    "cache_get",
    "cache_num_layers",
    "cache_set",
    "common_options",
    "prompt_mask",
    "spread_init_",
]
