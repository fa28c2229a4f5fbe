"""MuLo-SD (arXiv 2601.05149, CVPR 2026): multi-scale local speculative decoding; the first public implementation.

A low-resolution model of the same family (``MuloModels.drafter``: its own ``Target``, KV cache and prompt encoding;
same VQ codebook) drafts the image at grid h × w; an up-sampler U_r turns its codes into a high-resolution draft
x̃ at H × W = (r·h) × (r·w); the target verifies every drafted position in ONE raster-causal forward, accepts each
independently, and resamples only a neighbourhood of the rejections. Spec: docs ``mulo_sd.md`` §A.2 (every [D]
there is a ``policy.*`` key, ``MuloParams`` here). Positions are raster indices u = row·W + col (no end-of-line
layouts); slot u's token is read from the target's output at slot u − 1 (u = 0: the prefill's logits).

One cycle per block of ``block_rows`` low-resolution rows (``None`` = all: one cycle per image), block =
high-resolution slots [b0, b1):

1. **Draft.** The drafter samples the block's low-resolution rows: ``draft=ar`` one drafter forward per token
   (teacher-forced first on D_r of the committed high-resolution rows when ``block_rows`` < all), or
   ``draft=zipar`` (``zipar.decode_zipar`` with ``draft_window``; the whole low-resolution image, block = all).
2. **Up-sample.** x̃[b0:b1] = rows [k0·r, k1·r) of U_r(ỹ[rows < k1]) (U_r is row-causal: the prefix rows give the
   block its context). The draft law q is a point mass at x̃.
3. **Verify.** One ``Target.forward_at`` feeds, as real tokens, every slot from the first stale one (``clean``)
   up to the block end: stale committed tokens (fused K/V refresh, no extra sequential step) and the drafts.
   ``RasterCache`` masks each token to the newest value of every raster-earlier slot. p_i = processed output at
   slot i − 1 (``process_logits``: CFG rows, temperature, top-k/top-p exactly as the AR baseline).
4. **Accept.** ``rule=pooled`` (eq. 5): accept x̃_i iff Σ_{x ∈ {x̃_i} ∪ kNN_k(x̃_i)} p_i(x) ≥ τ
   (``regions.pooled_accept``, LANTERN's neighbour table; at T = 0 p_i is the point mass at the argmax, as AR
   samples it). R_T = rejected positions, t0 = min R_T. ``rule=exact`` (lossless control arm): the drafts as one
   chain (x̃_{b0} … x̃_{b1−2}) through ``verify.verify_cycle`` with the exact point-mass rule → accepted prefix and
   a bonus from the residual at the first rejection; the rest of the block is resampled sequentially (raster rule,
   l = ∞).
5. **Expand** (eq. 6–7, pooled): R_X = ``expand_rejections(R_T, l)`` on the block grid (never before t0);
   positions outside R_X keep their draft, even after t0.
6. **Resample R_X** from the full processed p_u (not the SD residual). ``sequential``: raster order; p_u from one
   forward feeding every slot [clean, u) with its current value (exact teacher forcing, which also refreshes the
   kept tokens' K/V); the first one, t0, needs no forward (p_{t0} came with the verify). ``islands``: 8-connected
   components of R_X (``islands``) scheduled by ``island_schedule`` (``island_window``); each parallel step is one
   forward feeding the previous steps' resampled tokens (real) and querying the next position u of every island
   at slot u − 1 (a temporary re-query when slot u − 1 is not fed in that forward). **Approximation**: a query sees
   the stale (rejected-draft) values of other unfinished islands and K/V of kept tokens computed from draft
   context; ``sequential`` has neither.
7. **Commit**; for ``block_rows`` < all, D_r(committed rows) of the new low-resolution rows becomes the drafter's
   teacher-forced context of the next cycle (each row down-sampled once, when it is committed).

Not lossless (``mulo_sd.md`` §A.5) except: ``rule=exact`` (exact SD with a deterministic drafter, tested with χ²);
and τ > 1, which rejects every draft, so R_X = the whole block from t0 = b0 and sequential resampling is exact AR
sampling (token-identical to ``decode_ar`` at T = 0). τ = 0 accepts every draft: one target forward per block.

Exactness bookkeeping (``_Side``): slots [0, clean) hold final values whose newest K/V was computed with every
raster-earlier slot at its final value; ``p_clean`` is slot ``clean``'s processed distribution given them.
Verification fed [clean, b1) in final context up to t0, so afterwards clean = t0 (no rejection: the last fed slot
+ 1); kept tokens after t0 stay stale until a teacher-forcing forward or the next verify refreshes them.

Records: one ``CycleRecord`` per sequential target forward after the prefill; a + 1 = the tokens finalised with a
distribution that forward computed (the verify: accepted tokens that stay and the first resampled one; a resample
forward: its resampled token(s); the prefill's p_0 finalises slot 0 and has no record, as in ``engine``). So
Σ(a + 1) = N − 1 and τ = committed / sequential target forwards, comparable with the tree methods; a forward that
finalises nothing has a = −1 (e.g. the verify at τ > 1, when every draft is rejected). ``pos`` = smallest slot
it finalised (else its first fed slot), ``nodes`` = tokens fed, ``D`` = drafter forwards of the block (verify
records), ``extra["phase"]`` = verify | resample. ``stats``: per image ``cycles``, ``R_T``, ``R_X``, ``islands``,
``largest_island``, ``target_forwards`` (after the prefill), ``drafter_forwards``, ``upsampler_s`` (U_r and D_r),
``accept_rate`` (drafts accepted before expansion / drafts judged), plus the run's ``MuloParams`` and
``MuloModels.info`` keys and ``kv_refresh = "fused"``.

Timed scope (as ``engine.generate``): from before the target's prefill to the last token — the drafter's prefill
and drafting, up/down-sampling, verification and resampling inside; text / prompt encoding of both models outside.
``draft_s`` = drafting + resampler time, ``verify_s`` = verify + accept + resample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from adtbench.algorithm.raster import RasterCache
from adtbench.algorithm.records import Clock, CycleRecord, GenerationResult
from adtbench.algorithm.regions import expand_rejections, island_schedule, islands, pooled_accept
from adtbench.algorithm.sampling import next_token, process_logits
from adtbench.algorithm.tree import DraftTree
from adtbench.algorithm.verify import EXACT, AcceptanceRule, verify_cycle
from adtbench.errors import ConfigError, check_choice, check_number
from adtbench.models.base import PromptInputs, Target
from adtbench.models.resample import Resampler
from adtbench.sampling_params import SamplingParams

DRAFTS = ("ar", "zipar")
RULES = ("pooled", "exact")
RESAMPLES = ("sequential", "islands")


@dataclass
class MuloModels:
    """What the loop runs besides the target (built by ``adtbench.harness.mulo.build_mulo_models``)."""

    drafter: Target  # the low-resolution model (same family and codebook)
    resampler: Resampler  # U_r and D_r
    neighbours: torch.Tensor | None  # LANTERN table [num_codes, K] of codes (None: k = 0)
    r: int
    encode: Callable[[PromptInputs], PromptInputs]  # the target's prompt inputs → the drafter's (not timed)
    info: dict[str, Any] = field(default_factory=dict)  # run-level keys recorded in every image's stats


@dataclass(frozen=True)
class MuloParams:
    """``policy.*`` of ``policy=mulo`` (``mulo_params`` checks them; docs ``mulo_sd.md`` §A.2)."""

    tau: float = 0.3
    k: int = 10
    l: int = 1
    block_rows: int | None = None  # None: all low-resolution rows in one cycle
    draft: str = "ar"
    draft_window: int = 2
    rule: str = "pooled"
    resample: str = "sequential"
    island_window: int | None = None

    def run_info(self) -> dict[str, Any]:
        return {
            "tau": self.tau,
            "k": self.k,
            "l": self.l,
            "block_rows": "all" if self.block_rows is None else self.block_rows,
            "draft": self.draft,
            "draft_window": self.draft_window,
            "rule": self.rule,
            "resample": self.resample,
            "island_window": self.island_window,
            "kv_refresh": "fused",
        }


def _int(node: dict[str, Any], key: str, default: Any, lo: int) -> int:
    return int(check_number(node.get(key, default), f"policy.{key}", int, lo=lo))


def _choice(node: dict[str, Any], key: str, default: str, choices: Sequence[str]) -> str:
    return check_choice(node.get(key, default), f"policy.{key}", choices)


def mulo_params(node: dict[str, Any]) -> MuloParams:
    """``policy`` node (plain dict) → ``MuloParams``; ``ConfigError`` naming ``policy.<key>`` on a bad value
    (``tau`` ≥ 0: 0 accepts every draft, above 1 none)."""
    tau = check_number(node.get("tau", 0.3), "policy.tau", float, lo=0)
    block = node.get("block_rows", "all")
    block_rows = None if block == "all" else _int(node, "block_rows", block, 1)
    island = node.get("island_window")
    draft = _choice(node, "draft", "ar", DRAFTS)
    if draft == "zipar" and block_rows is not None:
        raise ConfigError("policy.draft", "draft=zipar drafts the whole low-resolution image: use block_rows=all")
    return MuloParams(
        tau=float(tau),
        k=_int(node, "k", 10, 0),
        l=_int(node, "l", 1, 0),
        block_rows=block_rows,
        draft=draft,
        draft_window=_int(node, "draft_window", 2, 1),
        rule=_choice(node, "rule", "pooled", RULES),
        resample=_choice(node, "resample", "sequential", RESAMPLES),
        island_window=None if island is None else _int(node, "island_window", island, 1),
    )


# --- one model's generated slots ------------------------------------------------------------------------------


@dataclass
class _Forward:
    """Trace of one target forward after the prefill (→ a ``CycleRecord``)."""

    phase: str
    first_fed: int
    fed: int
    finalised: list[int] = field(default_factory=list)
    drafted: int = 0


class _Side:
    """A model's generated slots: current values, ``RasterCache``, and the exact prefix (module docstring).

    Invariant: slots [0, clean) hold final values whose newest K/V saw every raster-earlier slot at its final
    value; ``p_clean`` (None when unknown) is the processed distribution of slot ``clean`` given them, computed
    by forward ``src_clean`` (index into ``log``; −1 = the prefill).
    """

    def __init__(self, model: Target, sp: SamplingParams, p0: torch.Tensor) -> None:
        self.model, self.sp = model, sp
        n = model.layout.num_gen_tokens
        self.cache = RasterCache(n)
        self.vals = [-1] * n
        self.clean, self.src_clean = 0, -1
        self.p_clean: torch.Tensor | None = p0
        self.log: list[_Forward] = []

    def set(self, slot: int, value: int) -> None:
        """New value at ``slot``: if it lies in the exact prefix, the prefix ends there."""
        if self.vals[slot] != value:
            self.vals[slot] = value
            if slot < self.clean:
                self.clean, self.p_clean = slot, None

    def forward(self, slots: list[int], real: list[bool], phase: str, commit: bool = True) -> torch.Tensor:
        """Feed ``slots`` (their current values; ``real`` ones are seen by later slots of this forward, and their
        K/V kept unless ``commit`` is False: then ``keep`` decides); raw logits ``[R, n, V]``."""
        ids = torch.tensor([self.vals[s] for s in slots], dtype=torch.long)
        raw, _ = self.model.forward_at(ids, torch.tensor(slots, dtype=torch.long), self.cache.allowed(slots, real))
        if commit:
            self.keep(slots, real)
        self.log.append(_Forward(phase, slots[0], len(slots)))
        return raw

    def keep(self, slots: list[int], real: list[bool]) -> None:
        """Commit the K/V of the ``real`` tokens of the last forward (``slots``); the others are discarded."""
        self.model.commit(self.cache.commit(slots, real).to(self.model.device))

    def process(self, raw: torch.Tensor, rows: list[int], predicts: list[int]) -> torch.Tensor:
        """Processed ``[m, V]`` logits of output ``rows`` predicting slots ``predicts``."""
        idx = torch.tensor(rows, dtype=torch.long, device=raw.device)
        return process_logits(raw[:, idx], torch.tensor(predicts, dtype=torch.long), self.model.layout, self.sp)

    def advance(self, hi: int, phase: str = "resample") -> tuple[torch.Tensor, int]:
        """(p_hi, forward index) given the final values of [0, hi): teacher-forces [clean, hi) in one forward,
        none when ``clean == hi`` with ``p_clean`` known. Afterwards clean = hi."""
        if self.clean == hi and self.p_clean is not None:
            return self.p_clean, self.src_clean
        slots = list(range(min(self.clean, hi - 1), hi))
        p = self.process(self.forward(slots, [True] * len(slots), phase), [len(slots) - 1], [hi])[0]
        self.clean, self.p_clean, self.src_clean = hi, p, len(self.log) - 1
        return p, self.src_clean

    def finalise(self, slot: int, src: int) -> None:
        if src >= 0:
            self.log[src].finalised.append(slot)


# --- steps of a cycle ---------------------------------------------------------------------------------------------


def draft_rows(side: _Side, lo: int, hi: int, sp: SamplingParams, generator: torch.Generator | None) -> None:
    """AR drafting of low-resolution slots [lo, hi): teacher-force [clean, lo), then one forward per token."""
    p, _ = side.advance(lo, "draft")
    for s in range(lo, hi):
        side.set(s, next_token(p, sp, generator))
        if s + 1 < hi:
            p, _ = side.advance(s + 1, "draft")


def upsample_block(models: MuloModels, low: list[int], k0: int, k1: int, w: int, offsets: tuple[int, int]) -> list[int]:
    """Target token ids of high-resolution rows [k0·r, k1·r) = U_r of the low-resolution rows < k1 (row-causal)."""
    off_d, off_t = offsets
    codes = torch.tensor(low[: k1 * w], dtype=torch.long).view(k1, w) - off_d
    high = models.resampler.up(codes)[k0 * models.r : k1 * models.r]
    return (high.reshape(-1).cpu() + off_t).tolist()


def downsample_rows(
    models: MuloModels, vals: list[int], k0: int, k1: int, W: int, offsets: tuple[int, int]
) -> list[int]:
    """Drafter token ids of low-resolution rows [k0, k1) = D_r of the committed high-resolution rows < k1·r."""
    off_d, off_t = offsets
    r = models.r
    codes = torch.tensor(vals[: k1 * r * W], dtype=torch.long).view(k1 * r, W) - off_t
    return (models.resampler.down(codes)[k0:k1].reshape(-1).cpu() + off_d).tolist()


def verify_block(side: _Side, b0: int, b1: int) -> tuple[dict[int, tuple[torch.Tensor, int]], list[int]]:
    """One forward feeding [clean, b1) (the image's last slot never: nothing reads its output) as real tokens, not
    yet committed (``commit_verified``); returns {i: (processed p_i, forward index)} for every slot i it
    predicts, plus slot ``clean`` when known, and the fed slots."""
    n = side.model.layout.num_gen_tokens
    lo, hi = side.clean, min(b1, n - 1)
    out: dict[int, tuple[torch.Tensor, int]] = {}
    if side.p_clean is not None:
        out[lo] = (side.p_clean, side.src_clean)
    elif lo > 0:
        lo -= 1  # re-feed the slot before: its output is p_clean (a superseding column of the same value)
    slots = list(range(lo, hi))
    if slots:
        raw = side.forward(slots, [True] * len(slots), "verify", commit=False)
        p = side.process(raw, list(range(len(slots))), [s + 1 for s in slots])
        src = len(side.log) - 1
        out |= {s + 1: (p[j], src) for j, s in enumerate(slots)}
    return out, slots


def commit_verified(side: _Side, slots: list[int], upto: int) -> None:
    """Keep the verify forward's K/V of slots < ``upto`` (the exact prefix). The stale draft columns from ``upto``
    on are never attended under sequential resampling (each query sees only raster-earlier slots, all re-fed
    first), so dropping them keeps the cache as short as AR's; island resampling keeps them (``upto`` = ∞)."""
    if slots:
        side.keep(slots, [s < upto for s in slots])


def target_probs(processed: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The law AR samples from: softmax of the processed logits, or the point mass at the argmax (T = 0)."""
    if sp.greedy:
        return torch.nn.functional.one_hot(processed.argmax(-1), processed.shape[-1]).to(torch.float32)
    return processed.float().softmax(-1)


def resample_sequential(side: _Side, todo: list[int], sp: SamplingParams, generator: torch.Generator | None) -> int:
    """Raster-order resampling of ``todo`` (ascending) from the full processed p_u; returns forwards run."""
    before = len(side.log)
    for u in todo:
        p, src = side.advance(u)
        side.set(u, next_token(p, sp, generator))
        side.finalise(u, src)
    return len(side.log) - before


def resample_islands(side: _Side, steps: list[list[int]], sp: SamplingParams, generator: torch.Generator | None) -> int:
    """Concurrent island resampling (module docstring, step 6); ``steps`` from ``island_schedule`` (absolute slots).
    Returns forwards run. ``clean`` does not move: everything after t0 is refreshed by the next verify."""
    before, pending = len(side.log), list[int]()  # resampled slots whose new value is not fed yet
    for step in steps:
        dists: dict[int, tuple[torch.Tensor, int]] = {}
        if side.clean in step and side.p_clean is not None:  # t0: its p came with the verify
            dists[side.clean] = (side.p_clean, side.src_clean)
        need = [u for u in step if u not in dists]
        if need:
            real = set(pending)
            slots = sorted(real | {u - 1 for u in need})
            raw = side.forward(slots, [s in real for s in slots], "resample")
            row = {s: j for j, s in enumerate(slots)}
            p = side.process(raw, [row[u - 1] for u in need], need)
            dists |= {u: (p[j], len(side.log) - 1) for j, u in enumerate(need)}
            pending = []
        for u in step:
            side.set(u, next_token(dists[u][0], sp, generator))
            side.finalise(u, dists[u][1])
        pending += step
    return len(side.log) - before


@dataclass
class _Stats:
    cycles: int = 0
    R_T: int = 0
    R_X: int = 0
    islands: int = 0
    largest_island: int = 0
    judged: int = 0
    accepted: int = 0
    drafter_forwards: int = 0
    upsampler_s: float = 0.0


def pooled_cycle(
    side: _Side,
    b0: int,
    b1: int,
    W: int,
    params: MuloParams,
    models: MuloModels,
    sp: SamplingParams,
    generator: torch.Generator | None,
    stats: _Stats,
) -> None:
    """Verify → pooled acceptance (eq. 5) → expansion (eq. 6–7) → resampling of R_X, for block [b0, b1)."""
    P, fed = verify_block(side, b0, b1)
    lay = side.model.layout
    probs = target_probs(torch.stack([P[i][0] for i in range(b0, b1)]), sp)
    codes = torch.tensor(side.vals[b0:b1], dtype=torch.long, device=probs.device) - lay.image_token_offset
    img = probs[:, lay.image_token_offset : lay.image_token_offset + lay.num_codes]
    k = 0 if models.neighbours is None else min(params.k, models.neighbours.shape[1])  # k ≥ codes − 1: all
    ok = pooled_accept(img, codes, models.neighbours, k, params.tau).cpu()
    rejected = ~ok
    region = expand_rejections(rejected, (b1 - b0) // W, W, params.l)
    stats.judged, stats.accepted = stats.judged + (b1 - b0), stats.accepted + int(ok.sum())
    stats.R_T, stats.R_X = stats.R_T + int(rejected.sum()), stats.R_X + int(region.sum())
    for i in (~region).nonzero().view(-1).tolist():
        side.finalise(b0 + i, P[b0 + i][1])
    if not bool(rejected.any()):  # every fed slot is final and was computed in final context
        commit_verified(side, fed, b1)
        if fed:
            side.clean, (side.p_clean, side.src_clean) = fed[-1] + 1, P[fed[-1] + 1]
        return
    t0 = b0 + int(rejected.nonzero()[0])
    commit_verified(side, fed, t0 if params.resample == "sequential" else b1)
    side.clean, (side.p_clean, side.src_clean) = t0, P[t0]
    isl = islands(region, (b1 - b0) // W, W)
    stats.islands, stats.largest_island = stats.islands + len(isl), max(stats.largest_island, *map(len, isl))
    if params.resample == "sequential":
        resample_sequential(side, [b0 + u for u in region.nonzero().view(-1).tolist()], sp, generator)
        return
    steps = island_schedule(isl, (b1 - b0) // W, W, params.island_window)
    resample_islands(side, [[b0 + u for u in s] for s in steps], sp, generator)


def exact_cycle(
    side: _Side,
    b0: int,
    b1: int,
    rule: AcceptanceRule,
    sp: SamplingParams,
    generator: torch.Generator | None,
    stats: _Stats,
) -> None:
    """Lossless control arm: the drafts x̃_{b0..b1−2} as a chain, exact point-mass verification (accepted prefix +
    bonus from the residual at slot t), then [t + 1, b1) resampled sequentially from the full p."""
    P, fed = verify_block(side, b0, b1)
    n = b1 - b0
    root = side.vals[b0 - 1] if b0 > 0 else side.vals[b0]  # never judged: only its row p_{b0} is read
    rows = torch.stack([P[i][0] for i in range(b0, b1)])
    chain = torch.tensor([root, *side.vals[b0 : b1 - 1]], device=rows.device)
    tree = DraftTree(chain, list(range(-1, n - 1)), drafted_depth=n - 1)
    acc = verify_cycle(tree, rows, sp.greedy, generator, rule).acceptance
    t = b0 + acc.accepted
    commit_verified(side, fed, t)
    for i in range(b0, t + 1):
        side.finalise(i, P[i][1])
    side.clean, (side.p_clean, side.src_clean) = t, P[t]
    side.set(t, acc.bonus)
    stats.judged, stats.accepted = stats.judged + n - 1, stats.accepted + acc.accepted
    stats.R_T, stats.R_X = stats.R_T + int(acc.accepted < n - 1), stats.R_X + (b1 - t)
    resample_sequential(side, list(range(t + 1, b1)), sp, generator)


# --- the loop --------------------------------------------------------------------------------------------------


def grids(target: Target, drafter: Target, r: int) -> tuple[int, int, int, int]:
    """(H, W, h, w), checking that both are plain raster grids with H = r·h, W = r·w and one codebook."""
    lt, ld = target.layout, drafter.layout
    for name, lay in (("target", lt), ("drafter", ld)):
        if lay.eol_token is not None or lay.eoi_token is not None:
            raise ValueError(f"MuLo-SD needs a plain raster grid; the {name} layout has end-of-line/-image tokens")
    if (lt.grid_h, lt.grid_w) != (r * ld.grid_h, r * ld.grid_w) or lt.num_codes != ld.num_codes:
        raise ValueError(
            f"target grid {lt.grid_h}×{lt.grid_w} ({lt.num_codes} codes) ≠ r={r} × drafter grid "
            f"{ld.grid_h}×{ld.grid_w} ({ld.num_codes} codes)"
        )
    return lt.grid_h, lt.grid_w, ld.grid_h, ld.grid_w


def records(log: list[_Forward]) -> list[CycleRecord]:
    """One ``CycleRecord`` per target forward after the prefill (module docstring)."""
    return [
        CycleRecord(
            root_gen=min(f.finalised, default=f.first_fed),
            nodes=f.fed,
            drafted_depth=f.drafted,
            tree_depth=0,
            width=0,
            accepted=len(f.finalised) - 1,
            extra={"phase": f.phase, "positions": sorted(f.finalised)},
        )
        for f in log
    ]


def prefill_dist(model: Target, inputs: PromptInputs, extra: int, sp: SamplingParams) -> torch.Tensor:
    """``model.start`` with ``extra`` KV columns beyond the image; returns slot 0's processed distribution."""
    res = model.start(inputs, extra)
    return process_logits(res.logits[:, None], torch.zeros(1, dtype=torch.long), model.layout, sp)[0]


def draft_block(
    dside: _Side | None,
    models: MuloModels,
    dinputs: PromptInputs,
    lo: int,
    hi: int,
    params: MuloParams,
    sp: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """The drafter's tokens after drafting low-resolution slots [lo, hi), and the drafter forwards it took
    (``draft=zipar``: the whole image by ``decode_zipar``, its prefill included)."""
    if dside is None:
        from adtbench.algorithm.methods.zipar import decode_zipar

        zres = decode_zipar(models.drafter, dinputs, sp, generator, params.draft_window)
        return zres.tokens, zres.target_forwards
    before = models.drafter.forwards
    draft_rows(dside, lo, hi, sp, generator)
    return dside.vals, models.drafter.forwards - before


@torch.no_grad()
def decode_mulo(
    target: Target,
    models: MuloModels,
    inputs: PromptInputs,
    sp: SamplingParams,
    generator: torch.Generator | None,
    params: MuloParams,
    rule: AcceptanceRule = EXACT,
) -> GenerationResult:
    """MuLo-SD decoding of one image (module docstring), timed like ``engine.generate``."""
    drafter, r = models.drafter, models.r
    H, W, h, w = grids(target, drafter, r)
    N, B = H * W, h if params.block_rows is None else min(params.block_rows, h)
    offsets = (drafter.layout.image_token_offset, target.layout.image_token_offset)
    clock, stats = Clock(target.device), _Stats()
    te = clock.now()
    dinputs = models.encode(inputs)  # the drafter's prompt encoding: outside latency_s, counted in encode_s
    t0 = clock.now()
    side = _Side(target, sp, prefill_dist(target, inputs, 3 * N + 1, sp))  # ≤ 3 columns per slot, + temporaries
    dside = None if params.draft == "zipar" else _Side(drafter, sp, prefill_dist(drafter, dinputs, 2 * h * w + 1, sp))
    t_prefill = clock.now() - t0
    draft_s = verify_s = 0.0
    for k0 in range(0, h, B):
        k1, ta = min(h, k0 + B), clock.now()
        low, used = draft_block(dside, models, dinputs, k0 * w, k1 * w, params, sp, generator)
        tu = clock.now()
        b0, b1 = k0 * r * W, k1 * r * W
        side.vals[b0:b1] = upsample_block(models, low, k0, k1, w, offsets)
        tb, first = clock.now(), len(side.log)
        if params.rule == "exact":
            exact_cycle(side, b0, b1, rule, sp, generator, stats)
        else:
            pooled_cycle(side, b0, b1, W, params, models, sp, generator, stats)
        if len(side.log) > first:
            side.log[first].drafted = used
        tc = clock.now()
        if dside is not None and k1 < h:  # D_r of the committed rows: the drafter's context of the next block
            for s, v in enumerate(downsample_rows(models, side.vals, k0, k1, W, offsets), start=k0 * w):
                dside.set(s, v)
        td = clock.now()
        stats.cycles, stats.drafter_forwards = stats.cycles + 1, stats.drafter_forwards + used
        stats.upsampler_s += (tb - tu) + (td - tc)
        draft_s, verify_s = draft_s + (tb - ta) + (td - tc), verify_s + (tc - tb)
    latency = clock.now() - t0
    cycles = records(side.log)
    drafter_total = stats.drafter_forwards + (0 if dside is None else 1)  # + the drafter's prefill (ar)
    out = {
        "cycles": stats.cycles,
        "R_T": stats.R_T,
        "R_X": stats.R_X,
        "islands": stats.islands,
        "largest_island": stats.largest_island,
        "target_forwards": len(cycles),
        "drafter_forwards": drafter_total,
        "upsampler_s": stats.upsampler_s,
        "accept_rate": stats.accepted / max(1, stats.judged),
        "r": r,
        **params.run_info(),
        **models.info,
    }
    return GenerationResult(
        list(side.vals),
        cycles,
        latency,
        t_prefill,
        draft_s,
        verify_s,
        target.forwards,
        drafter_total,
        out,
        encode_s=t0 - te,
    )
