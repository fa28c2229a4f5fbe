"""``lantern=on``: LANTERN relaxed acceptance (algorithms.md §3) as an ``AcceptanceRule``.

Neighbourhoods. For VQ code c, ``n_1(c), n_2(c), …`` are the other codes in ascending Euclidean distance of
their codebook vectors (optionally L2-normalised first); only the first k are ever computed (chunked
``torch.cdist`` + ``topk``, never a full argsort), stored int64 ``[num_codes, k]`` and cached on disk under a
key hashing the codebook bytes, k and ``normalize``. Token id = code + ``image_token_offset``; non-image
tokens have no neighbours and are never relaxed.

Relaxed probability. At a node with target distribution p (processed, as the AR baseline samples it) and a
draft image token x, with neighbour masses ``C_m(x) = Σ_{i ≤ m} p(n_i(x))`` (m ≤ k)::

    τ(x) = δ                      additive bound (``delta``; p̃ moves ≤ δ mass: TV(p, p̃_x) ≤ δ)
         = (λ − 1)·p(x)           multiplicative bound (``lam``; p̃(x) ≤ λ·p(x))
         = min of both            when both are set (the tighter bound holds, so both guarantees hold)
    m*(x) = max{m ≤ k : C_m(x) ≤ τ(x)}   (0 if none). C_m is non-decreasing, so A(x) = {n_1..n_{m*}} is a prefix.
    p̃(x) = p(x) + C_{m*}(x)            p̃_x = p with the mass of A(x) moved onto x.

Verification hooks (``AcceptanceRule``):

- greedy: accept x iff x = argmax of p with p(x) replaced by p̃(x), i.e. p̃(x) ≥ max_{y≠x} p(y) with ties to
  the lower index (the reference rule). When no mass was moved (C_{m*} = 0) the exact rule ``argmax
  logits == x`` is used, so δ = 0 is bit-identical to ``lantern=off``.
- point mass (top-k trees at T > 0): accept with probability p̃(x). Principled residual on rejection: p with
  {x} ∪ A(x) zeroed — the speculative-sampling residual ``max(p̃_x − δ_x, 0)``, so one step emits exactly p̃_x.
  ``reference_residual``: zero x and, if m* ≥ 1, its first k + 1 neighbours (the reference code; it
  over-removes and is not lossless even at δ = 0); if that leaves no mass, the principled residual is used
  (the reference falls back to a uniform over the whole vocabulary instead).
- true q (sampled trees): accept with min(1, p̃_x(x)/q(x)); residual ``max(p − q, 0)`` from the *unmodified*
  p (our choice). Given the acceptance, every y receives at least min(q(y), p̃_y(y)); this residual fills only
  the deficit where q < p, proportionally, and never overshoots, so the emitted law o has the smallest
  possible TV(o, p) = Σ_y [min(q(y), p̃_y(y)) − min(q(y), p(y))] ≤ Σ_y min((q − p)⁺(y), C_{m*}(y)), and equals
  the exact rule when p̃ = p (zeroing A(x) as in the point-mass case is not needed for this bound and would
  make the residual depend on the draft). ``reference_residual``: LANTERN++'s ``max(p − q', 0)`` with
  q' = q zeroed at the first k + 1 neighbours when m* ≥ 1.

``lossless`` is True iff the bound is identically 0 (δ = 0 or λ = 1) and the principled residual is used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from adtbench.algorithm.verify import AcceptanceRule, HostProposal

log = logging.getLogger(__name__)

CHUNK = 1024  # codebook rows per cdist block: memory ≈ CHUNK × num_codes doubles


# --- neighbour tables ------------------------------------------------------------------------------------
def nearest_codes(codebook: torch.Tensor, k: int, normalize: bool = False, chunk: int = CHUNK) -> torch.Tensor:
    """int64 ``[num_codes, k]``: row c = the k codes nearest to c (Euclidean, ascending, c itself excluded).

    Computed in float64, ``chunk`` rows at a time (``cdist`` + ``topk``); ties keep ``topk``'s order.
    """
    n = codebook.shape[0]
    if not 1 <= k <= n - 1:
        raise ValueError(f"k must be in [1, {n - 1}] for a codebook of {n} codes, got {k}")
    x = codebook.detach().to(torch.float64)
    if normalize:
        x = torch.nn.functional.normalize(x, dim=-1)
    out = torch.empty(n, k, dtype=torch.long, device=x.device)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        dist = torch.cdist(x[lo:hi], x)  # [hi − lo, n]
        rows = torch.arange(hi - lo, device=x.device)
        dist[rows, rows + lo] = float("inf")  # exclude self
        out[lo:hi] = torch.topk(dist, k, dim=1, largest=False, sorted=True).indices
    return out.cpu()


@dataclass(frozen=True)
class Relaxation:
    """Per draft (vectorised over m drafts): the moved mass C_{m*}, m*, and the neighbour token ids."""

    extra: torch.Tensor  # [m] C_{m*}(x) (0 where nothing moves or x is not an image token)
    mstar: torch.Tensor  # [m] long, m*(x)
    neighbours: torch.Tensor  # [m, cols] token ids of n_1(x).. (meaningless where ``valid`` is False)
    valid: torch.Tensor  # [m] bool: x is an image token


class LanternRule(AcceptanceRule):
    """Relaxed acceptance over codebook neighbourhoods (module docstring)."""

    name = "lantern"

    def __init__(
        self,
        neighbours: torch.Tensor,
        image_token_offset: int,
        *,
        delta: float | None = 0.1,
        lam: float | None = None,
        k: int | None = None,
        reference_residual: bool = False,
    ) -> None:
        """``neighbours``: int64 code table ``[num_codes, cols]``; the relaxation reads its first ``k`` columns
        (default all), the reference residual its first k + 1 (capped at ``cols``)."""
        if neighbours.ndim != 2 or neighbours.shape[1] < 1:
            raise ValueError("neighbours must be a [num_codes, k ≥ 1] table")
        if delta is None and lam is None:
            raise ValueError("set delta (additive bound) or lam (multiplicative bound)")
        if delta is not None and not 0.0 <= delta <= 1.0:
            raise ValueError(f"delta must be in [0, 1], got {delta}")
        if lam is not None and lam < 1.0:
            raise ValueError(f"lam must be ≥ 1, got {lam}")
        self.table = neighbours.to(torch.long)
        self.num_codes, cols = self.table.shape
        self.k = cols if k is None else k
        if not 1 <= self.k <= cols:
            raise ValueError(f"k must be in [1, {cols}], got {self.k}")
        self.offset = image_token_offset
        self.delta, self.lam, self.reference_residual = delta, lam, reference_residual
        zero_bound = (delta is not None and delta == 0.0) or (lam is not None and lam == 1.0)
        self.lossless = zero_bound and not reference_residual
        self._tables: dict[torch.device, torch.Tensor] = {}
        self._np_table: np.ndarray | None = None  # host copy of the first k columns + offset (``host_extra``)

    def _table(self, device: torch.device) -> torch.Tensor:
        if device not in self._tables:
            self._tables[device] = self.table.to(device)
        return self._tables[device]

    def bound(self, px: torch.Tensor) -> torch.Tensor:
        """τ(x) per draft from p(x) ``[m]``: δ, (λ − 1)·p(x), or the smaller of both."""
        tau = torch.full_like(px, float("inf"))
        if self.delta is not None:
            tau = tau.clamp_max(self.delta)
        if self.lam is not None:
            tau = torch.minimum(tau, (self.lam - 1.0) * px)
        return tau

    def relax(self, p: torch.Tensor, x: torch.Tensor) -> Relaxation:
        """m*(x) and C_{m*}(x) for drafts ``x [m]`` under probability rows ``p [m, V]``."""
        codes = x.to(p.device) - self.offset
        valid = (codes >= 0) & (codes < self.num_codes)
        table = self._table(p.device)
        nbr = table[codes.clamp(0, self.num_codes - 1)] + self.offset  # [m, cols] token ids
        cum = p.gather(1, nbr[:, : self.k]).cumsum(1)  # C_1..C_k, non-decreasing
        px = p.gather(1, codes.clamp(0, self.num_codes - 1)[:, None] + self.offset)[:, 0]
        within = cum <= self.bound(px)[:, None]
        mstar = within.sum(1) * valid  # a prefix: C_m ≤ τ holds for m ≤ m* only
        extra = torch.where(mstar > 0, cum.gather(1, (mstar - 1).clamp_min(0)[:, None])[:, 0], 0.0)
        return Relaxation(extra.to(p.dtype), mstar, nbr, valid)

    def host_proposal(self) -> HostProposal | None:
        """The proposal step on the verifier's float64 host loop: p(x) + C_{m*}(x) (``host_extra``), unless
        ``reference_residual`` (which also edits q on rejection: only ``with_proposal`` runs that)."""
        return None if self.reference_residual else HostProposal(self.host_extra)

    def host_extra(self, p: np.ndarray, x: int) -> float:
        """C_{m*}(x) of ``relax`` for one draft on a float64 host vector ``p [V]`` (the same prefix rule: the
        cumulative neighbour mass is non-decreasing, so m* = #{m : C_m ≤ τ} is a ``searchsorted``)."""
        code = x - self.offset
        if not 0 <= code < self.num_codes:
            return 0.0
        if self._np_table is None:
            self._np_table = self.table[:, : self.k].cpu().numpy() + self.offset
        cum = np.cumsum(p[self._np_table[code]])
        tau = float("inf") if self.delta is None else self.delta  # ``bound``, as floats
        if self.lam is not None:
            tau = min(tau, (self.lam - 1.0) * float(p[x]))
        m = int(np.searchsorted(cum, tau, side="right"))
        return float(cum[m - 1]) if m > 0 else 0.0

    def relaxed_prob(self, p: torch.Tensor, x: int) -> float:
        """p̃(x) under the probability vector ``p [V]``."""
        r = self.relax(p[None], torch.tensor([x], device=p.device))
        return float(p[x] + r.extra[0])

    def aggregated(self, p: torch.Tensor, x: int) -> list[int]:
        """A(x): the token ids whose mass is moved onto x (the first m* neighbours)."""
        r = self.relax(p[None], torch.tensor([x], device=p.device))
        return r.neighbours[0, : int(r.mstar[0])].tolist()

    # --- AcceptanceRule hooks (rows on any device; the base class derives the scalar ones) -----------------------
    def greedy_accept(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        exact = logits.argmax(-1) == tokens
        p = logits.softmax(-1)
        r = self.relax(p, tokens)
        p_mod = p.scatter_add(1, tokens[:, None], r.extra[:, None])  # p̃(x) at x, p elsewhere
        return torch.where(r.extra > 0, p_mod.argmax(-1) == tokens, exact)

    def _first(self, r: Relaxation, cols: int, upto: torch.Tensor) -> torch.Tensor:
        """Bool ``[m, cols]``: neighbour column i < ``upto`` (per row) and the draft an image token."""
        i = torch.arange(cols, device=upto.device)
        return (i[None] < upto[:, None]) & r.valid[:, None]

    def point_mass_rows(self, p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.relax(p, x)
        accept = p.gather(1, x[:, None])[:, 0] + r.extra
        nbr = r.neighbours[:, : self.k]
        residual = p.scatter(1, x[:, None], 0.0)
        principled = residual.scatter(
            1, nbr, torch.where(self._first(r, self.k, r.mstar), 0.0, residual.gather(1, nbr))
        )
        if not self.reference_residual:
            return accept, principled
        wide = r.neighbours[:, : self.k + 1]
        drop = self._first(r, wide.shape[1], torch.where(r.mstar > 0, wide.shape[1], 0))
        ref = residual.scatter(1, wide, torch.where(drop, 0.0, residual.gather(1, wide)))
        return accept, torch.where((ref.sum(-1) > 0)[:, None], ref, principled)

    def proposal_rows(
        self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor, px: torch.Tensor, qx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.relax(p, x)
        accept = ((px + r.extra) / qx).clamp_max(1.0).nan_to_num(1.0)  # q(x) = 0: 1
        if self.reference_residual:
            wide = r.neighbours[:, : self.k + 1]
            drop = self._first(r, wide.shape[1], torch.where(r.mstar > 0, wide.shape[1], 0))
            q = q.scatter(1, wide, torch.where(drop, 0.0, q.gather(1, wide)))
        return accept, (p - q).clamp_min(0.0)
