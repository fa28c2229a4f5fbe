"""The target distribution, processed exactly as the AR baseline processes it.

Order (one place, used by the AR baseline, the verifier and the drafter alike):

    raw logits per CFG row  →  CFG mix  l_u + s·(l_c − l_u)
                            →  constraint: only image tokens, or the single forced token (EOL/EOI)
                            →  temperature  →  top-k (ties kept)  →  top-p (nucleus)

Greedy decoding (temperature 0) stops after the constraint: argmax is invariant to the rest.
All helpers are pure functions of tensors; processing runs in at least float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout

NEG_INF = float("-inf")
ENTROPY_EDGES = np.array([0.25, 1.0, 2.0, 3.0, 4.0])
"""Entropy bins (nats) of a processed distribution, shared by the sampled trees' acceptance model (H of the drafter's
q) and the draft gate (H of the target's p). Acceptance of a sampled draft is U-shaped in H, hence narrow bins."""


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; ``top_k <= 0`` and ``top_p >= 1`` switch those filters off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def use_cfg(self) -> bool:
        return self.cfg_scale != 1.0


def cfg_mix(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """``[R, ..., V]`` → ``[..., V]``: row 0 alone (R = 1) or ``u + s·(c − u)`` with rows (c, u)."""
    if logits.shape[0] == 1:
        return logits[0]
    cond, uncond = logits[0], logits[1]
    return uncond + scale * (cond - uncond)


@lru_cache(maxsize=32)
def _image_bias(vocab: int, offset: int, codes: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Additive ``[V]`` row: 0 on image tokens, −inf elsewhere (one add instead of a mask per call)."""
    bias = torch.full((vocab,), NEG_INF, dtype=dtype, device=device)
    bias[offset : offset + codes] = 0.0
    return bias


def constrain(logits: torch.Tensor, gen_idx: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """Mask ``[n, V]`` logits to image tokens, or to the forced token where ``gen_idx`` forces one.

    Allowed logits keep their exact values (x + 0 = x); the rest become −inf.
    """
    bias = _image_bias(layout.vocab_size, layout.image_token_offset, layout.num_codes, logits.device, logits.dtype)
    out = logits + bias
    if layout.eol_token is None and layout.eoi_token is None:
        return out
    forced = layout.forced_tokens(gen_idx.to(logits.device))
    rows = (forced >= 0).nonzero(as_tuple=True)[0]
    if rows.numel():
        cols = forced[rows]
        out[rows] = NEG_INF
        out[rows, cols] = logits[rows, cols]
    return out


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row, and every logit tied with the k-th (LlamaGen semantics)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Smallest set of highest-probability tokens whose mass reaches ``p`` (the top token always kept)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop_sorted = (cum - sorted_logits.softmax(-1)) >= p  # mass strictly before this token already ≥ p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def process_logits(raw: torch.Tensor, gen_idx: torch.Tensor, layout: TokenLayout, sp: SamplingParams) -> torch.Tensor:
    """Raw ``[R, n, V]`` logits → processed ``[n, V]`` logits (−inf outside the support).

    ``gen_idx[i]`` is the generation index of the token *predicted* by row i.
    """
    dtype = torch.promote_types(raw.dtype, torch.float32)
    x = constrain(cfg_mix(raw.to(dtype), sp.cfg_scale), gen_idx, layout)
    if sp.greedy:
        return x
    x = x / sp.temperature
    return top_p_filter(top_k_filter(x, sp.top_k), sp.top_p)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a (possibly unnormalised) probability vector ``[V]``: ``sample_np`` on a float64 host copy."""
    return sample_np(probs.detach().to("cpu", torch.float64).numpy(), generator)


def sample_np(p: np.ndarray, generator: torch.Generator | None) -> int:
    """One draw from a (possibly unnormalised) float64 probability vector by inverse CDF: the first i with
    ``cumsum(p)[i] > u · Σp`` for one ``u ~ U[0, 1)`` from ``generator`` (a zero-probability entry never satisfies it
    first). Same law as ``torch.multinomial``, a third of its cost per call on CPU."""
    device = generator.device if generator is not None else "cpu"
    u = float(torch.rand(1, generator=generator, device=device, dtype=torch.float64))
    c = np.cumsum(p)
    i = int(np.searchsorted(c, u * c[-1], side="right"))
    return i if i < c.size else int(np.flatnonzero(p > 0)[-1])  # u · Σp rounded up to Σp: the last positive entry


def next_token(processed: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None) -> int:
    """AR next token from processed logits ``[V]``: argmax (greedy) or a sample."""
    if sp.greedy:
        return int(processed.argmax())
    return sample(processed.softmax(-1), generator)


# --- SamplingParams from config (the one builder; ``adtbench.harness.config`` re-exports it) ------------------------

SAMPLING_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    "temperature": (float, 0.0, None), "top_k": (int, 0, None), "top_p": (float, None, 1.0),
    "cfg_scale": (float, 0.0, None),
}  # fmt: skip


def check_number(value: Any, key: str, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    """``value`` as ``kind`` (int: no bools, no floats) within [lo, hi]; else ConfigError naming ``key``."""
    v = value
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise ConfigError(key, f"must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    if lo is not None and v < lo:
        raise ConfigError(key, f"must be ≥ {lo}, got {v}")
    if hi is not None and v > hi:
        raise ConfigError(key, f"must be ≤ {hi}, got {v}")
    return kind(v)


def build_sampling(node: Any, key: str = "sampling") -> SamplingParams:
    """The one place a ``SamplingParams`` is made from config: ``node`` is a sampling mapping (``cfg.sampling``,
    a training stage's ``sampling`` / ``teacher.sampling``, a model's ``lm_sampling``, or a dict) with any of
    ``temperature``, ``top_k``, ``top_p``, ``cfg_scale``; an absent key takes ``SamplingParams``' default, a
    ``???`` one is an error. Checked: types (no bools; ``top_k`` an integer), temperature ≥ 0, top_k ≥ 0,
    top_p in (0, 1], cfg_scale ≥ 0. Errors name ``<key>.<field>`` (``<field>`` when ``key`` is empty).
    Any ``Mapping`` works (an OmegaConf ``DictConfig`` is one), so this layer needs no config library."""
    if node is None or not isinstance(node, Mapping):
        raise ConfigError(key or "sampling", f"must be a mapping of {sorted(SAMPLING_FIELDS)}, got {node!r}")
    values: dict[str, Any] = {}
    for name, (kind, lo, hi) in SAMPLING_FIELDS.items():
        full = f"{key}.{name}" if key else name
        if name not in list(node.keys()):  # a DictConfig is False for `in` on a ??? value; keys() hold it
            continue
        try:
            raw = node[name]
        except Exception as e:  # OmegaConf's MissingMandatoryValue for ``???`` (caught by name: no import here)
            if type(e).__name__ != "MissingMandatoryValue":
                raise
            raise ConfigError(full, f"is required (value ???) — set it on the command line, e.g. {full}=...") from e
        values[name] = check_number(raw, full, kind, lo, hi)
    if values.get("top_p", 1.0) <= 0.0:
        raise ConfigError(f"{key}.top_p" if key else "top_p", f"must be in (0, 1], got {values['top_p']}")
    return SamplingParams(**values)
