"""The target distribution, processed exactly as the AR baseline processes it.

Order (one place, used by the AR baseline, the verifier and the drafter alike):

    raw logits per CFG row  →  CFG mix  l_u + s·(l_c − l_u)
                            →  constraint: only image tokens, or the single forced token (EOL/EOI)
                            →  temperature  →  top-k (ties kept)  →  top-p (nucleus)

Greedy decoding (temperature 0) stops after the constraint: argmax is invariant to the rest.
All helpers are pure functions of tensors; processing runs in at least float32.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from adtbench.layout import TokenLayout
from adtbench.sampling_params import SamplingParams

NEG_INF = float("-inf")
ENTROPY_EDGES = np.array([0.25, 1.0, 2.0, 3.0, 4.0])
"""Entropy bins (nats) of a processed distribution, shared by the sampled trees' acceptance model (H of the drafter's
q) and the draft gate (H of the target's p). Acceptance of a sampled draft is U-shaped in H, hence narrow bins."""


def cfg_mix(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """``[R, ..., V]`` → ``[..., V]``: row 0 alone (R = 1) or ``u + s·(c − u)`` with rows (c, u)."""
    if logits.shape[0] == 1:
        return logits[0]
    cond, uncond = logits[0], logits[1]
    return uncond + scale * (cond - uncond)


@lru_cache(maxsize=64)
def _allowed_bias(
    vocab: int, offset: int, codes: int, forced: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Additive ``[V]`` row: 0 on the allowed tokens, −inf elsewhere (one add instead of a mask per call). Allowed:
    the image tokens, or the single ``forced`` token when ``forced ≥ 0``."""
    bias = torch.full((vocab,), NEG_INF, dtype=dtype, device=device)
    if forced >= 0:
        bias[forced] = 0.0
    else:
        bias[offset : offset + codes] = 0.0
    return bias


def _bias(layout: TokenLayout, forced: int, like: torch.Tensor) -> torch.Tensor:
    return _allowed_bias(
        layout.vocab_size, layout.image_token_offset, layout.num_codes, forced, like.device, like.dtype
    )


def constrain(logits: torch.Tensor, gen_idx: torch.Tensor | int, layout: TokenLayout) -> torch.Tensor:
    """Mask ``[n, V]`` logits to image tokens, or to the forced token where ``gen_idx`` forces one.

    Allowed logits keep their exact values (x + 0 = x); the rest become −inf. ``gen_idx``: the generation index of
    each row (a tensor ``[n]``), or one index for every row (an int: the constraint is chosen on the host, one add).
    Either way no device value is read: a tensor index picks each row's additive row from a small table.
    """
    if isinstance(gen_idx, int):
        return logits + _bias(layout, layout.forced_token(gen_idx), logits)
    if layout.eol_token is None and layout.eoi_token is None:
        return logits + _bias(layout, -1, logits)
    # rows of the table: image tokens, then one per forced token (EOL, EOI); kind = which row a generation index uses
    forced = [t for t in (layout.eol_token, layout.eoi_token) if t is not None]
    table = torch.stack([_bias(layout, -1, logits), *(_bias(layout, t, logits) for t in forced)])
    kind = layout.forced_kind(gen_idx.to(logits.device))
    return logits + table[kind]


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
    probs = sorted_logits.softmax(-1)
    drop_sorted = (probs.cumsum(-1) - probs) >= p  # mass strictly before this token already ≥ p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def process_logits(
    raw: torch.Tensor, gen_idx: torch.Tensor | int, layout: TokenLayout, sp: SamplingParams
) -> torch.Tensor:
    """Raw ``[R, n, V]`` logits → processed ``[n, V]`` logits (−inf outside the support).

    ``gen_idx[i]`` is the generation index of the token *predicted* by row i (an int: the same for every row).
    Temperature 1 divides by nothing (``x / 1 = x`` bit for bit); a layout that masks nothing
    (``TokenLayout.masks_logits`` False) adds no all-zero row to a CFG mix (already a new tensor; ``x + 0 = x``).
    """
    dtype = torch.promote_types(raw.dtype, torch.float32)
    x = cfg_mix(raw.to(dtype), sp.cfg_scale)
    if raw.shape[0] == 1 or layout.masks_logits:
        x = constrain(x, gen_idx, layout)
    if sp.greedy:
        return x
    if sp.temperature != 1.0:
        x = x / sp.temperature
    return top_p_filter(top_k_filter(x, sp.top_k), sp.top_p)


# --- draws on the generator's device (the decode loop's hot path: no host copy) ----------------------------------


def _draw(fill: str, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """float64 random numbers of ``shape`` on ``device``, drawn by ``generator`` on *its* device (a CPU generator for
    CUDA data draws on the CPU and copies; None: the default generator of ``device``). ``fill``: a ``Tensor`` in-place
    sampler (``uniform_``, ``exponential_``)."""
    where = device if generator is None else generator.device
    out: torch.Tensor = getattr(torch.empty(shape, dtype=torch.float64, device=where), fill)(generator=generator)
    return out if out.device == device else out.to(device)


def draw_into(buf: torch.Tensor, fill: str, generator: torch.Generator | None) -> None:
    """:func:`_draw` into the float64 buffer ``buf`` in place (the same values from the same generator state): one
    launch where ``generator`` lives on ``buf``'s device (or is None), else drawn on the generator's device and
    copied. What a captured graph's draw buffer is filled with, outside the graph."""
    if generator is None or generator.device == buf.device:
        getattr(buf, fill)(generator=generator)
    else:
        buf.copy_(_draw(fill, tuple(buf.shape), generator, buf.device))


def uniforms(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """U[0, 1) draws (float64) on ``device`` (:func:`_draw`)."""
    return _draw("uniform_", shape, generator, device)


def exponentials(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Exp(1) draws (float64) on ``device`` (:func:`_draw`); ``−log E`` is a standard Gumbel."""
    return _draw("exponential_", shape, generator, device)


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of (possibly unnormalised) probabilities ``[..., V]`` on their device: the exponential race
    ``argmax_v p_v / E_v`` with E i.i.d. Exp(1) — the categorical law exactly (``P(argmin E_v / p_v = v) =
    p_v / Σp``); zero-probability entries are never drawn. Returns long ``[...]``."""
    race = probs.to(torch.float64) / exponentials(tuple(probs.shape), generator, probs.device)
    token: torch.Tensor = race.argmax(-1)
    return token


def sample_rows_cdf(
    probs: torch.Tensor, generator: torch.Generator | None, u: torch.Tensor | None = None
) -> torch.Tensor:
    """One draw per row of (possibly unnormalised) probabilities ``[m, V]`` on their device by inverse CDF: the first v
    with ``cumsum(p)[v] > u · Σp`` for one ``u ~ U[0, 1)`` per row (``sample_np``'s rule, vectorised; a zero-probability
    entry is never first). The categorical law exactly, like ``sample_rows``, with m uniforms instead of m·V
    exponentials (the Jacobi loops' redraws: a window of rows every forward). ``u [m]``: the uniforms, drawn by the
    caller (the graphed Jacobi step fills them outside its graph); None: drawn from ``generator``. Returns long
    ``[m]``."""
    cdf = probs.to(torch.float64).cumsum(-1)
    total = cdf[:, -1:]
    if u is None:
        u = uniforms((probs.shape[0], 1), generator, probs.device)
    u = u.view(-1, 1).to(torch.float64) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u·Σp rounded up to Σp: stay below it
    return torch.searchsorted(cdf, u, right=True)[:, 0]


def gumbel_top_k(
    logprobs: torch.Tensor, k: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` draws without replacement from each row of ``softmax(logprobs)`` ``[m, V]``, in draw order, on the rows'
    device: the k largest keys ``logprobs − log E`` (Gumbel-top-k, Kool et al. 2019). Returns (tokens ``[m, k]``,
    drawn ``[m, k]`` bool: False where a row has fewer than k tokens of positive probability — those entries hold no
    draw)."""
    keys = logprobs.to(torch.float64) - exponentials(tuple(logprobs.shape), generator, logprobs.device).log()
    top = keys.topk(min(k, keys.shape[-1]), dim=-1)
    return top.indices, top.values > NEG_INF


def next_token_tensor(processed: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """AR next token from processed logits ``[V]`` as a device tensor ``[]`` (argmax, or a draw): no host read."""
    if sp.greedy:
        return processed.argmax(-1)
    return sample_rows(processed.softmax(-1), generator)


# --- host draws (the reference paths and the loops that decide on the host: ZipAR, MuLo-SD) -----------------------


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
    """``next_token_tensor`` read to the host (the loops that decide on the host: ZipAR, MuLo-SD): the same draws as
    the AR baseline's, so a seeded generator gives the same tokens through either."""
    return int(next_token_tensor(processed, sp, generator))
