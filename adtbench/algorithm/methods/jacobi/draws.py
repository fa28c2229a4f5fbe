"""The Jacobi loop's draws and tables (``loop``): the chain's structure and the layout's forced tokens and
neighbours (``LayoutTables``), the redraw of the positions past the bonus (``redraw``: ``independent``, ``coupled``,
``gumbel``; ``jacobi``'s module docstring, step 2) and the initialisation of new window positions (``init_drafts``:
``random``, ``left``, ``up``; step 3). Vectorised over the window's rows, no host read; shared by the host-driven loop
(``jacobi.JacobiState``) and the fixed-shape device step (``jacobi.step``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from adtbench.algorithm.sampling import sample_rows_cdf, uniforms
from adtbench.algorithm.tree import arange_on
from adtbench.layout import TokenLayout

# --------------------------------------------------------------------------------------------------------
# static tables: the chain's structure, the layout's forced tokens and neighbours
# --------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=512)
def chain_structure(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(parents, depth, ancestor mask, child ranks) of a chain of ``n`` nodes on ``device`` (cached, never written)."""
    ar = torch.arange(n, device=device)
    ranks = torch.where(ar + 1 < n, ar + 1, -1)[:, None]
    return ar - 1, ar, torch.ones(n, n, dtype=torch.bool, device=device).tril(), ranks


@dataclass(frozen=True)
class LayoutTables:
    """Per (layout, device): ``forced [n_gen + pad]`` (the forced token at each generation index, −1 where none, on
    the device), ``prev_image`` (host: the latest non-forced index before each index, −1 for none), ``uniform [V]``
    (the uniform proposal over the image tokens), ``has_forced``, ``prev_device`` (``prev_image`` on the device)."""

    forced: torch.Tensor
    prev_image: list[int]
    uniform: torch.Tensor
    has_forced: bool
    prev_device: torch.Tensor  # ``prev_image`` on the device (the fixed-shape step's ``init_sources``)


def layout_tables(layout: TokenLayout, device: torch.device, dtype: torch.dtype, pad: int) -> LayoutTables:
    """The ``LayoutTables`` of ``layout`` (cached per layout shape, device, dtype and padding; never written)."""
    key = (
        layout.vocab_size,
        layout.image_token_offset,
        layout.num_codes,
        layout.grid_h,
        layout.grid_w,
        layout.eol_token,
        layout.eoi_token,
    )
    return _tables(key, device, dtype, pad)


@lru_cache(maxsize=32)
def _tables(key: tuple[Any, ...], device: torch.device, dtype: torch.dtype, pad: int) -> LayoutTables:
    layout = TokenLayout(*key)
    n = layout.num_gen_tokens
    forced = [layout.forced_token(g) for g in range(n)] + [-1] * pad
    prev, last = [], -1
    for g in range(n + pad):
        prev.append(last)
        if g >= n or forced[g] < 0:
            last = g
    uniform = torch.zeros(layout.vocab_size, dtype=dtype, device=device)
    uniform[layout.image_token_offset : layout.image_token_offset + layout.num_codes] = 1.0 / layout.num_codes
    fd = torch.tensor(forced, dtype=torch.long, device=device)
    pd = torch.tensor(prev, dtype=torch.long, device=device)
    return LayoutTables(fd, prev, uniform, any(f >= 0 for f in forced), pd)


@lru_cache(maxsize=16)
def zero_row(V: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(1, V, dtype=dtype, device=device)


# --------------------------------------------------------------------------------------------------------
# redraws and initialisation (vectorised over the window's rows; no host read)
# --------------------------------------------------------------------------------------------------------


def redraw(
    kind: str,
    probs: torch.Tensor,
    old: torch.Tensor,
    q_old: torch.Tensor,
    has_old: torch.Tensor,
    generator: torch.Generator | None,
    noise: torch.Tensor | None = None,
    draws: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New drafts from this forward's rows ``probs [r, V]`` (module docstring, step 2): returns (tokens ``[r]``, their
    proposals ``[r, V]`` = ``probs``, kept ``[r]`` bool). ``coupled``: row i keeps ``old[i]`` (drawn from
    ``q_old[i]``) with probability min(1, p(x)/q_old(x)) where ``has_old[i]``, else draws from
    norm(max(p − q_old, 0)) (rows without an old draft: ``q_old`` is 0, so from p). ``gumbel``: the exponential race
    argmax_v p(v) / E_v (Gumbel-max) on the position's own Exp(1) row ``noise [r, V]``, drawn once when the position
    entered the window and reused by every redraw there (the SCD authors' Gumbel coupling); kept = the old draft
    won again. ``draws``: (the keep test's uniforms ``[r]``, the residual draws' ``[r]``), drawn by the caller (the
    graphed step, ``jacobi.step``); None: both drawn from ``generator`` here."""
    keep_u, resid_u = (None, None) if draws is None else draws
    if kind == "independent":
        return sample_rows_cdf(probs, generator, resid_u), probs, torch.zeros_like(has_old)
    if kind == "gumbel":
        assert noise is not None, "redraw=gumbel needs the window's noise rows"
        tok = (probs.to(noise.dtype) / noise).argmax(-1)
        return tok, probs, has_old & (tok == old)
    u = uniforms((probs.shape[0],), generator, probs.device) if keep_u is None else keep_u
    px = probs.gather(1, old[:, None])[:, 0]
    qx = q_old.gather(1, old[:, None])[:, 0]
    keep = has_old & (u * qx < px)  # u is float64: the test runs in float64
    resid = (probs - q_old).clamp_min(0.0)
    resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, probs)  # zero only if p = q_old: then keep is sure
    return torch.where(keep, old, sample_rows_cdf(resid, generator, resid_u)), probs, keep


def init_sources(layout: TokenLayout, tables: LayoutTables, s: int | torch.Tensor, t: int, init: str) -> torch.Tensor:
    """Generation indices whose tokens ``left`` / ``up`` copy into positions s … s + t − 1 (all known: committed, the
    root or drafts before s). ``left``: the latest non-forced index before s, for every position (a repeated
    neighbour); ``up``: the same column in the nearest row above that is known (before s), else ``left``'s. ``s``: a
    host int, or a device ``[1]`` tensor (the fixed-shape step, ``jacobi.step``: no read)."""
    dev = tables.forced.device
    left: int | torch.Tensor = tables.prev_image[s] if isinstance(s, int) else tables.prev_device[s]
    j = s + arange_on(t, dev)
    if init == "left":
        return torch.full_like(j, left) if isinstance(left, int) else left.expand(t)
    src = j - layout.row_len * ((j - s) // layout.row_len + 1)
    return torch.where(src >= 0, src, left)


def init_drafts(
    init: str,
    seq: torch.Tensor,
    s: int | torch.Tensor,
    t: int,
    layout: TokenLayout,
    tables: LayoutTables,
    generator: torch.Generator | None,
    greedy: bool,
    proposal: str = "uniform",
    u: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New drafts for positions s … s + t − 1 (``random`` / ``left`` / ``up``; module docstring, step 3): (tokens
    ``[t]``, proposals ``[t, V]``, None when greedy). ``proposal``: ``random`` drafts' stored q, ``uniform`` or
    ``point`` (a point mass on the draft: exact too, the draft is known once q is). ``s``: a host int or a device
    ``[1]`` tensor (``init_sources``); ``u [t]``: ``random``'s uniforms drawn by the caller (None: from
    ``generator``)."""
    dev, V = seq.device, layout.vocab_size
    if init == "random":
        if u is None:
            u = uniforms((t,), generator, dev)
        tok = layout.image_token_offset + (u * layout.num_codes).long().clamp_max(layout.num_codes - 1)
    else:
        tok = seq[init_sources(layout, tables, s, t, init)]
    forced = None
    if tables.has_forced:
        f = tables.forced[s : s + t] if isinstance(s, int) else tables.forced[s + arange_on(t, dev)]
        forced = f >= 0
        tok = torch.where(forced, f, tok)
    if greedy:
        return tok, None
    if init != "random" or proposal == "point":  # left / up (or random with point masses): a point mass everywhere
        return tok, _point_masses(tok, V, tables.uniform.dtype)
    uniform = tables.uniform[None].expand(t, V)
    if forced is None:
        return tok, uniform
    return tok, torch.where(forced[:, None], _point_masses(tok, V, uniform.dtype), uniform)


def _point_masses(tok: torch.Tensor, V: int, dtype: torch.dtype) -> torch.Tensor:
    """One-hot rows ``[t, V]`` of ``tok`` (``one_hot`` would read the device to check the range)."""
    return torch.zeros(tok.numel(), V, dtype=dtype, device=tok.device).scatter_(1, tok[:, None], 1.0)


__all__ = ["LayoutTables", "init_drafts", "init_sources", "layout_tables", "redraw"]
