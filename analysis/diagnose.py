"""Why is the mini model weak? Measurements of every component of the mini model (docs/mini_diagnosis.md).

    python -m analysis.diagnose [what=all|vq|tokens|ar|cond|drafter|data] [n=256] [out=...] [threads=1]
        [train_n=4000] [ar_train_n=n] [drafter_n=32] [gen_n=8] [greedy_n=0] [cfg=3.0] [ar_path=DIR]
        [probe_train=768]

Inference and counting only (no training). Every number is computed on scenes of stream 0 of
``adtbench.scenes``: *held-out* = the first ``n`` held-out-split scenes (``iter_split(0, "heldout", n)``, the
split the AR model never saw), *train* = the first scenes of the train split (a subset of the 10 000 the
shipped ``ar16`` was trained on). Results are printed and merged into ``out`` (JSON, default
``<paths.root_dir>/outputs/diagnose/diagnosis.json``; running one part replaces only that part). A research tool
of the checkout (``analysis/``, run from its root), not part of the installed package. docs/mini_diagnosis.md holds
the numbers of the shipped weights and the diagnosis.

Parts (the JSON keys):

``vq``       reconstruction MSE / PSNR of held-out 64 px renders (overall and per background kind); codebook
             usage on them (codes used of 512, perplexity = exp(entropy of the code frequencies)); flat
             single-colour images (distinct codes, share of the most frequent code); uniform 4×4-px patches
             inside real scenes (distinct codes per colour, entropy of the code given the colour); near-identical
             colours (±4 levels per channel); the codebook geometry (distances between the codes one colour uses
             vs nearest-neighbour distances) and how many codes decode to (almost) the same flat colour.
``tokens``   cross-entropy (nats/token) on held-out token grids of count-based local-context models fitted on
             train token grids: p(x), p(x | left), p(x | left, up), … (hierarchical Dirichlet back-off, the
             concentration of each level chosen on a validation part of train), plus the plug-in entropies of
             the held-out grids themselves (optimistic). A reference for what a purely local model reaches.
``ar``       teacher-forced CE / top-1 of ``model=mini`` (16×16) on ground-truth held-out grids and on as many
             train grids (the generalisation gap: compare per type, or at n ≥ 1 000 — the CE of a few hundred
             scenes moves by ±0.15 nats with their share of noisy backgrounds), for the conditional row, the
             unconditional row and the CFG mix ``l_u + s·(l_c − l_u)``, split by position type
             (``position_types``), with each type's share of the total loss; the CFG-mixed distribution's entropy
             and max probability.
``drafter``  the shipped EAGLE drafter teacher-forced on the target's own features (``teacher_sample``, the
             training pairing): top-1 agreement with the target and the expected one-token acceptance
             Σ_v min(p_v, q_v) at T = 1 (both distributions CFG-mixed), split by type, on held-out ground-truth
             grids and on the target's own AR samples (T = 1, CFG 3); with ``greedy_n`` > 0 also on the target's
             own greedy samples (T = 0: what bounds greedy τ), split by the target's confidence max_v p_v
             (``by_confidence``) and by the caption's background kind (``by_bg_kind``).
``cond``     does the caption reach the object tokens? (a) teacher-forced CE of the conditional and unconditional
             rows where an object *starts* — ``object_first`` (an image's first object-covered token in raster
             order) and ``object_top`` (object-covered, the token above not) — the only places the caption can
             inform the next-token loss about an object, since its colour and shape are visible afterwards;
             (b) a linear probe (multinomial logistic regression fitted on ``probe_train`` train scenes) of each
             caption attribute from the GPT's final features at image positions 0, 64, 128, 192 of the
             conditional row: held-out accuracy against the majority-class rate. ``ar_path=DIR`` diagnoses
             another GPT (a training run's ``final/``) in place of the shipped one (also for ``ar``).
``data``     size of the caption grammar vs the captions / canonical attribute combinations of the 10 000
             training scenes; how often held-out scenes' attribute combinations occur in training; caption
             entropy (the most information a caption can give about the image).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise, product
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adtbench import scenes as S
from adtbench.io import atomic_write_json
from adtbench.resources import PACKAGE_DIR, conf_dir, root_dir

WEIGHTS = PACKAGE_DIR / "weights" / "mini"
DEFAULT_OUT = root_dir() / "outputs" / "diagnose" / "diagnosis.json"
GRID = 16  # tokens per side of model=mini (64 px, VQ factor 4)
V = 512  # codebook size

# ----------------------------------------------------------------------------------------------------
# Data helpers
# ----------------------------------------------------------------------------------------------------


def scene_set(split: str, n: int, seed: int = 0) -> list[S.Scene]:
    """The first ``n`` scenes of ``split`` in stream ``seed`` (the AR / VQ data stream is 0)."""
    return [s for _, s in S.iter_split(seed, split, n)]


def load_vq_model(path: str | Path | None = None) -> Any:
    """The shipped tokenizer (``adtbench/weights/mini/vq``) or the one at ``path`` (a stage's ``final/``), eval mode,
    CPU."""
    from adtbench.models.mini.target import load_vq

    return load_vq(Path(path) if path is not None else WEIGHTS / "vq")


@torch.no_grad()
def encode_images(vq: Any, images: np.ndarray, bs: int = 64) -> np.ndarray:
    """uint8 ``[n, H, W, 3]`` → codes ``[n, H/4, W/4]`` (int64)."""
    out = []
    for i in range(0, len(images), bs):
        x = S.to_tensor_range(np.ascontiguousarray(images[i : i + bs]))
        out.append(vq.encode(x).numpy())
    g = images.shape[1] // vq.downsample_factor
    return np.concatenate(out).reshape(len(images), g, images.shape[2] // vq.downsample_factor)


def object_cover(scene: S.Scene, grid: int = GRID, ss: int = 8) -> np.ndarray:
    """``[grid, grid]`` fraction (0..1) of each token's area covered by an object (``ss``² samples per token)."""
    n = grid * ss
    c = (np.arange(n, dtype=np.float32) + 0.5) / n
    v, u = np.meshgrid(c, c, indexing="ij")
    m = np.zeros((n, n), bool)
    for o in scene.objects:
        m |= S._coverage(o, u, v)
    return m.reshape(grid, ss, grid, ss).mean(axis=(1, 3))


def position_types(grids: np.ndarray, scenes: Sequence[S.Scene] | None = None) -> dict[str, np.ndarray]:
    """Boolean masks ``[n, g*g]`` (row-major token order) of position types.

    Token-based (any grid): ``all``; ``first_row``; ``first_col``; ``same_left`` (not first column, token =
    its left neighbour: flat interior); ``diff_left`` (not first column, token ≠ left: edges, texture, or a
    flat region coded by varying codes); ``same_left_up`` (= left and = up). Scene-based (``scenes`` given,
    from the geometry): ``object_interior`` (token fully covered by objects), ``object_edge`` (partly),
    ``background`` (not at all), ``bg_<kind>``: background tokens of scenes with that background kind;
    ``object_top`` (covered, the token above not: where an object's top edge enters each column) and
    ``object_first`` (an image's first covered token in raster order) — overlapping the other object types.
    """
    n, h, w = grids.shape
    col = np.broadcast_to(np.arange(w)[None, None], (n, h, w))
    row = np.broadcast_to(np.arange(h)[None, :, None], (n, h, w))
    left = np.zeros_like(grids, dtype=bool)
    left[:, :, 1:] = grids[:, :, 1:] == grids[:, :, :-1]
    up = np.zeros_like(grids, dtype=bool)
    up[:, 1:, :] = grids[:, 1:, :] == grids[:, :-1, :]
    t = {
        "all": np.ones_like(grids, dtype=bool),
        "first_row": row == 0,
        "first_col": col == 0,
        "same_left": left,
        "diff_left": (col > 0) & ~left,
        "same_left_up": left & up,
    }
    if scenes is not None:
        cover = np.stack([object_cover(s, h) for s in scenes])
        t["object_interior"] = cover >= 1.0
        t["object_edge"] = (cover > 0) & (cover < 1.0)
        t["background"] = cover == 0
        occ = cover > 0
        above = np.zeros_like(occ)
        above[:, 1:] = occ[:, :-1]
        t["object_top"] = occ & ~above
        flat = occ.reshape(n, -1)
        first = np.zeros_like(flat)
        has = flat.any(1)
        first[np.flatnonzero(has), flat.argmax(1)[has]] = True
        t["object_first"] = first.reshape(n, h, w)
        kinds = np.array([s.bg_kind for s in scenes])
        for k in S.BG_KINDS:
            t[f"bg_{k}"] = (cover == 0) & (kinds == k)[:, None, None]
    return {k: np.ascontiguousarray(v).reshape(n, h * w) for k, v in t.items()}


def _entropy(counts: np.ndarray) -> float:
    """Entropy in nats of the empirical distribution given by ``counts``."""
    c = counts[counts > 0].astype(np.float64)
    p = c / c.sum()
    return float(-(p * np.log(p)).sum())


# ----------------------------------------------------------------------------------------------------
# 1. VQ tokenizer
# ----------------------------------------------------------------------------------------------------

#: flat test colours: the palette plus the second colour of stripes / checks on light backgrounds
FLAT_COLOURS: dict[str, tuple[int, int, int]] = {**S.COLORS, "grey60": (60, 60, 60)}


def codebook_usage(codes: np.ndarray, size: int = V) -> dict[str, Any]:
    """Usage of a code sample: ``tokens`` encoded, ``codes_used`` (distinct), ``perplexity`` = exp(H) of the code
    frequencies (the effective number of equally used codes), ``top16_share`` (token share of the 16 most used)
    and ``counts`` (per code, sums to ``tokens``)."""
    counts = np.bincount(codes.ravel(), minlength=size)
    srt = np.sort(counts)[::-1]
    return {
        "tokens": int(counts.sum()),
        "codes_used": int((counts > 0).sum()),
        "perplexity": float(math.exp(_entropy(counts))),
        "top16_share": float(srt[:16].sum() / max(1, counts.sum())),
        "counts": counts.tolist(),
    }


@torch.no_grad()
def reconstruction(vq: Any, images: np.ndarray, bs: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[n, g, g]`` and per-image MSE ``[n]`` of the reconstruction (pixels in [-1, 1], clamped)."""
    codes, mse = [], []
    for i in range(0, len(images), bs):
        x = S.to_tensor_range(np.ascontiguousarray(images[i : i + bs]))
        c = vq.encode(x)
        g = x.shape[-1] // vq.downsample_factor
        rec = vq.decode_codes(c, g, g).clamp(-1, 1)
        codes.append(c.view(-1, g, g).numpy())
        mse.append((rec - x).pow(2).mean(dim=(1, 2, 3)).numpy())
    return np.concatenate(codes), np.concatenate(mse)


def psnr_db(mse: float) -> float:
    """PSNR (dB) for pixels in [-1, 1] (peak-to-peak 2), the convention of ``adtbench.tools.train.common.psnr``."""
    return 10 * math.log10(4.0 / max(mse, 1e-12))


def flat_image_codes(vq: Any, colours: dict[str, tuple[int, int, int]], size: int = 64) -> dict[str, dict]:
    """Per colour: codes of a flat ``size`` px image — ``distinct`` codes, ``interior_distinct`` (one-token
    border excluded), ``majority_share`` (share of the most frequent code), ``codes`` (distinct, sorted)."""
    imgs = np.stack([np.full((size, size, 3), c, np.uint8) for c in colours.values()])
    grids = encode_images(vq, imgs)
    out = {}
    for name, g in zip(colours, grids):
        inner = g[1:-1, 1:-1]
        cnt = np.bincount(g.ravel(), minlength=V)
        out[name] = {
            "distinct": int((cnt > 0).sum()),
            "interior_distinct": len(np.unique(inner)),
            "majority_share": float(cnt.max() / cnt.sum()),
            "codes": sorted(int(c) for c in np.unique(g)),
        }
    return out


def near_colour_codes(vq: Any, colours: dict[str, tuple[int, int, int]], delta: int = 4) -> dict[str, dict]:
    """Per colour: the 27 colours ``c + {−delta, 0, +delta}³`` as flat 32 px images; the interior 4×4 tokens
    of each. ``distinct`` = distinct interior codes over all 27; ``changed`` = variants whose most frequent
    interior code differs from the exact colour's."""
    offs = list(product((-delta, 0, delta), repeat=3))
    out = {}
    for name, c in colours.items():
        var = [np.clip(np.array(c) + np.array(o), 0, 255).astype(np.uint8) for o in offs]
        imgs = np.stack([np.broadcast_to(v, (32, 32, 3)) for v in var])
        inner = encode_images(vq, imgs)[:, 2:-2, 2:-2].reshape(len(offs), -1)
        modes = [int(np.bincount(r, minlength=V).argmax()) for r in inner]
        ref = modes[offs.index((0, 0, 0))]
        out[name] = {"distinct": len(np.unique(inner)), "changed": int(sum(m != ref for m in modes))}
    return out


def flat_patch_codes(images: np.ndarray, codes: np.ndarray, colours: dict[str, tuple[int, int, int]]) -> dict:
    """Codes of *uniform* 4×4-px patches (all 16 pixels one palette colour) in real scene renders.

    Per colour and overall: ``patches``; ``distinct`` codes; ``majority_share``; ``H`` = entropy (nats) of the
    code given the colour; the same for ``isolated`` patches (whose 3×3-token neighbourhood is uniform in the
    same colour, i.e. no edge within the encoder's near field); ``p_same_left`` = P(code = left token's code)
    for isolated patches (1.0 if one flat colour were one code)."""
    n, H, _W, _ = images.shape
    g = codes.shape[1]
    f = H // g
    p = images.reshape(n, g, f, g, f, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, g, g, f * f, 3).astype(np.int32)
    uniform = (p.max(axis=3) == p.min(axis=3)).all(-1)  # [n, g, g]
    col = p[:, :, :, 0, :]  # [n, g, g, 3]
    cid = np.full((n, g, g), -1)
    for k, c in enumerate(colours.values()):
        cid[uniform & (col == np.array(c)).all(-1)] = k
    iso = np.zeros_like(uniform)
    inner = cid[:, 1:-1, 1:-1]
    ok = inner >= 0
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            ok &= cid[:, 1 + dy : g - 1 + dy, 1 + dx : g - 1 + dx] == inner
    iso[:, 1:-1, 1:-1] = ok
    same_left = np.zeros_like(uniform)
    same_left[:, :, 1:] = codes[:, :, 1:] == codes[:, :, :-1]
    out: dict[str, Any] = {}
    tot = {"patches": 0, "H_sum": 0.0, "iso": 0, "iso_H_sum": 0.0, "iso_same_left": 0}
    for k, name in enumerate(colours):
        m = cid == k
        if not m.any():
            continue
        cnt = np.bincount(codes[m], minlength=V)
        mi = m & iso
        icnt = np.bincount(codes[mi], minlength=V)
        d = {
            "patches": int(m.sum()),
            "distinct": int((cnt > 0).sum()),
            "majority_share": float(cnt.max() / cnt.sum()),
            "H": _entropy(cnt),
            "isolated": int(mi.sum()),
            "isolated_distinct": int((icnt > 0).sum()),
            "isolated_H": _entropy(icnt) if mi.any() else float("nan"),
            "p_same_left": float(same_left[mi].mean()) if mi.any() else float("nan"),
            "codes": [int(c) for c in np.argsort(-cnt)[: int((cnt > 0).sum())]],
        }
        out[name] = d
        tot["patches"] += d["patches"]
        tot["H_sum"] += d["H"] * d["patches"]
        tot["iso"] += d["isolated"]
        tot["iso_H_sum"] += (d["isolated_H"] * d["isolated"]) if d["isolated"] else 0.0
        tot["iso_same_left"] += int(same_left[mi].sum())
    out["_overall"] = {
        "patches": tot["patches"],
        "token_share": float(tot["patches"] / codes.size),
        "H_code_given_colour": tot["H_sum"] / max(1, tot["patches"]),
        "isolated": tot["iso"],
        "isolated_H_code_given_colour": tot["iso_H_sum"] / max(1, tot["iso"]),
        "isolated_p_same_left": tot["iso_same_left"] / max(1, tot["iso"]),
    }
    return out


@torch.no_grad()
def code_colours(vq: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each code decoded as a uniform 4×4-token grid: mean colour ``[V, 3]`` (0..255) and pixel std ``[V]``
    of the centre 8×8 px (the code's "own" appearance, away from the image border)."""
    c = torch.arange(vq.codebook_size)[:, None].expand(-1, 16)
    rec = vq.decode_codes(c, 4, 4).clamp(-1, 1)[:, :, 4:12, 4:12]
    rgb = (rec + 1) * 127.5
    return rgb.mean(dim=(2, 3)).numpy(), rgb.std(dim=(2, 3)).mean(1).numpy()


def codebook_geometry(vq: Any, patch: dict, colours: dict[str, tuple[int, int, int]], tol: float = 8.0) -> dict:
    """Distances in the (l2-normalised, 8-d) codebook and decoded-colour redundancy.

    ``nn_median``: median over codes of the distance to the nearest other code; ``pair_median``: median
    distance over all pairs. Per colour: ``used_pair_mean`` = mean pairwise distance among the codes that
    uniform patches of that colour use (weighted by nothing; ≥ 2 codes); ``used_rgb_spread`` = max RMS
    difference (0..255 levels) between those codes' decoded colours and the true colour; ``near_codes`` =
    codes (of all 512) whose decoded flat colour is within ``tol`` RMS levels of the colour and nearly flat
    (pixel std < ``tol``): how many codes are interchangeable for that colour."""
    cb = vq.quantize.effective_codebook().detach()
    d = torch.cdist(cb, cb)
    off = d + torch.eye(len(cb)) * 1e9
    iu = torch.triu_indices(len(cb), len(cb), 1)
    rgb, std = code_colours(vq)
    out: dict[str, Any] = {
        "nn_median": float(off.min(1).values.median()),
        "pair_median": float(d[iu[0], iu[1]].median()),
        "colours": {},
    }
    for name, c in colours.items():
        err = np.sqrt(((rgb - np.array(c)) ** 2).mean(1))
        near = int(((err < tol) & (std < tol)).sum())
        row: dict[str, Any] = {"near_codes": near, "best_code_rms": float(err.min())}
        used = (patch.get(name) or {}).get("codes", [])[:20]
        if len(used) >= 2:
            u = torch.tensor(used)
            du = d[u][:, u]
            row["used_pair_mean"] = float(du.sum() / (len(used) * (len(used) - 1)))
        if used:
            row["used_rgb_spread"] = float(err[used].max())
        out["colours"][name] = row
    return out


def vq_diagnosis(n: int = 256, vq_path: str | None = None) -> dict:
    """Part 1 (module docstring) on the first ``n`` held-out scenes (``vq_path``: another tokenizer, e.g. a
    retraining candidate; default the shipped one)."""
    vq = load_vq_model(vq_path)
    sc = scene_set("heldout", n)
    images = S.render_batch(sc, 64)
    codes, mse = reconstruction(vq, images)
    kinds = np.array([s.bg_kind for s in sc])
    per_kind = {
        k: {"n": int((kinds == k).sum()), "psnr": psnr_db(float(mse[kinds == k].mean()))}
        for k in S.BG_KINDS
        if (kinds == k).any()
    }
    usage = codebook_usage(codes)
    patch = flat_patch_codes(images, codes, FLAT_COLOURS)
    return {
        "n_images": n,
        "mse": float(mse.mean()),
        "psnr": psnr_db(float(mse.mean())),
        "psnr_per_kind": per_kind,
        "usage": {k: v for k, v in usage.items() if k != "counts"},
        "flat_images": flat_image_codes(vq, FLAT_COLOURS),
        "near_colours": near_colour_codes(vq, FLAT_COLOURS),
        "flat_patches": patch,
        "geometry": codebook_geometry(vq, patch, FLAT_COLOURS),
    }


# ----------------------------------------------------------------------------------------------------
# 2. Token-stream entropy (count-based local-context models)
# ----------------------------------------------------------------------------------------------------


def context_features(grids: np.ndarray, scenes: Sequence[S.Scene] | None = None) -> dict[str, np.ndarray]:
    """Per token (``[n, g*g]``, int64): ``left``, ``up``, ``upleft``, ``upright`` neighbour codes (``V`` = none,
    outside the grid) and ``bg`` = background kind × colour id of the scene (40 values; 0 without scenes)."""
    n, h, w = grids.shape
    pad = np.full((n, h + 1, w + 2), V, np.int64)
    pad[:, 1:, 1:-1] = grids
    f = {
        "left": pad[:, 1:, :-2],
        "up": pad[:, :-1, 1:-1],
        "upleft": pad[:, :-1, :-2],
        "upright": pad[:, :-1, 2:],
    }
    bg = np.zeros((n, 1, 1), np.int64)
    if scenes is not None:
        bg[:, 0, 0] = [S.BG_KINDS.index(s.bg_kind) * 8 + S.COLOR_NAMES.index(s.bg_color) for s in scenes]
    f["bg"] = np.broadcast_to(bg, (n, h, w))
    return {k: np.ascontiguousarray(v).reshape(n, h * w) for k, v in f.items()}


#: back-off chain of the local-context models: each level adds one feature to the previous level's context
LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("H(x)", ()),
    ("H(x|left)", ("left",)),
    ("H(x|left,up)", ("left", "up")),
    ("H(x|left,up,upleft)", ("left", "up", "upleft")),
    ("H(x|left,up,upleft,upright)", ("left", "up", "upleft", "upright")),
    ("H(x|left,up,upleft,upright,bg)", ("left", "up", "upleft", "upright", "bg")),
)


def _key(feats: dict[str, np.ndarray], names: Iterable[str]) -> np.ndarray:
    k = np.zeros_like(feats["left"])
    for name in names:
        k = k * (V + 1) + feats[name]  # bg < 40 < V + 1
    return k


class _Counts:
    """Counts of int64 keys; ``self(q)`` returns the count of each query key (0 when unseen)."""

    def __init__(self, keys: np.ndarray) -> None:
        self.k, self.c = np.unique(keys.ravel(), return_counts=True)

    def __call__(self, q: np.ndarray) -> np.ndarray:
        if len(self.k) == 0:
            return np.zeros(q.shape, np.int64)
        i = np.clip(np.searchsorted(self.k, q), 0, len(self.k) - 1)
        return np.where(self.k[i] == q, self.c[i], 0)


def backoff_probs(
    train_x: np.ndarray,
    train_f: dict[str, np.ndarray],
    eval_x: np.ndarray,
    eval_f: dict[str, np.ndarray],
    betas: Sequence[float],
    levels: Sequence[tuple[str, tuple[str, ...]]] = LEVELS,
) -> list[np.ndarray]:
    """Probability of each evaluated token under every level of the chain (same shape as ``eval_x``).

    Level 0: ``p0(x) = (n(x) + 1) / (N + V)`` (add-one). Level k: ``p_k(x | c_k) = (n(c_k, x) + β_k ·
    p_{k−1}(x | c_{k−1})) / (n(c_k) + β_k)`` (hierarchical Dirichlet smoothing; ``betas[k]`` for k ≥ 1).
    Counts come from the train tokens only.
    """
    tx, ex = train_x.ravel(), eval_x.ravel()
    tf = {k: v.ravel() for k, v in train_f.items()}
    ef = {k: v.ravel() for k, v in eval_f.items()}
    cnt = np.bincount(tx, minlength=V)
    p = (cnt[ex] + 1.0) / (len(tx) + V)
    out = [p.reshape(eval_x.shape)]
    for lvl, (_, names) in enumerate(levels[1:], start=1):
        ctx_t, ctx_e = _key(tf, names), _key(ef, names)
        n_c = _Counts(ctx_t)(ctx_e)
        n_cx = _Counts(ctx_t * V + tx)(ctx_e * V + ex)
        b = float(betas[lvl])
        p = (n_cx + b * p) / (n_c + b)
        out.append(p.reshape(eval_x.shape))
    return out


def plugin_entropy(x: np.ndarray, f: dict[str, np.ndarray], names: Sequence[str]) -> float:
    """Plug-in conditional entropy H(x | names) (nats) of a sample from its own counts (optimistic)."""
    xr = x.ravel()
    if not names:
        return _entropy(np.bincount(xr, minlength=V))
    ctx = _key({k: v.ravel() for k, v in f.items()}, names)
    _, n_cx = np.unique(ctx * V + xr, return_counts=True)
    _, n_c = np.unique(ctx, return_counts=True)
    N = len(xr)
    return float(-(n_cx * np.log(n_cx)).sum() / N + (n_c * np.log(n_c)).sum() / N)


BETA_GRID = (0.25, 1.0, 4.0, 16.0, 64.0, 256.0)


def choose_betas(x: np.ndarray, f: dict[str, np.ndarray], val_frac: float = 0.2) -> list[float]:
    """Concentration per level, chosen greedily level by level on the last ``val_frac`` of the train grids."""
    n = x.shape[0]
    cut = max(1, round(n * (1 - val_frac)))
    fa = {k: v[:cut] for k, v in f.items()}
    fb = {k: v[cut:] for k, v in f.items()}
    betas = [0.0] * len(LEVELS)
    for lvl in range(1, len(LEVELS)):
        best = None
        for b in BETA_GRID:
            trial = [*betas[:lvl], b]
            p = backoff_probs(x[:cut], fa, x[cut:], fb, trial, LEVELS[: lvl + 1])[-1]
            ce = float(-np.log(p).mean())
            if best is None or ce < best[0]:
                best = (ce, b)
        assert best is not None
        betas[lvl] = best[1]
    return betas


def token_diagnosis(n: int = 256, train_n: int = 4000) -> dict:
    """Part 2 (module docstring): train grids = first ``train_n`` train scenes, eval = first ``n`` held-out."""
    vq = load_vq_model()
    tr_sc, he_sc = scene_set("train", train_n), scene_set("heldout", n)
    tr = encode_images(vq, S.render_batch(tr_sc, 64))
    he = encode_images(vq, S.render_batch(he_sc, 64))
    tf, hf = context_features(tr, tr_sc), context_features(he, he_sc)
    x_tr, x_he = tr.reshape(train_n, -1), he.reshape(n, -1)
    betas = choose_betas(x_tr, tf)
    probs = backoff_probs(x_tr, tf, x_he, hf, betas)
    types = position_types(he, he_sc)
    levels = {}
    for (name, names), p, b in zip(LEVELS, probs, betas):
        nll = -np.log(p)
        levels[name] = {
            "beta": b,
            "ce_heldout": float(nll.mean()),
            "plugin_heldout": plugin_entropy(x_he, hf, names),
            "by_type": {t: float(nll[m].mean()) for t, m in types.items() if m.any()},
        }
    return {"train_grids": train_n, "heldout_grids": n, "levels": levels}


# ----------------------------------------------------------------------------------------------------
# 3. AR model (teacher-forced)
# ----------------------------------------------------------------------------------------------------


def load_ar_model(name: str = "ar16", path: str | Path | None = None) -> Any:
    """``ARModel`` (GPT + text encoder, the training forward) of the shipped weights (or of ``path``), eval mode."""
    from adtbench.models.mini.target import load_ar
    from adtbench.tools.train.ar import ARModel

    gpt, text = load_ar(WEIGHTS / name if path is None else Path(path))
    return ARModel(gpt, text).eval()


@torch.no_grad()
def ar_token_stats(model: Any, captions: Sequence[str], grids: np.ndarray, cfg: float = 3.0, bs: int = 16) -> dict:
    """Per token ``[n, N]`` arrays: ``ce_cond``, ``ce_uncond``, ``ce_mix`` (nats; mix = l_u + cfg·(l_c − l_u)),
    ``top1_cond``, ``top1_mix`` (0/1), ``ent_mix`` (entropy of the mixed distribution, nats), ``pmax_mix``."""
    codes = torch.from_numpy(grids.reshape(len(grids), -1)).long()
    ids, words = model.text.batch_ids(list(captions))
    keys = ("ce_cond", "ce_uncond", "ce_mix", "top1_cond", "top1_mix", "ent_mix", "pmax_mix")
    acc: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for i in range(0, len(codes), bs):
        c = codes[i : i + bs]
        b = len(c)
        drop = torch.cat([torch.zeros(b, dtype=torch.bool), torch.ones(b, dtype=torch.bool)])
        lg = model(ids[i : i + bs].repeat(2, 1), words[i : i + bs].repeat(2, 1), drop, c.repeat(2, 1)).float()
        lc, lu = lg[:b].log_softmax(-1), lg[b:].log_softmax(-1)
        mix = (lg[b:] + cfg * (lg[:b] - lg[b:])).log_softmax(-1)
        tgt = c[..., None]
        acc["ce_cond"].append(-lc.gather(-1, tgt)[..., 0].numpy())
        acc["ce_uncond"].append(-lu.gather(-1, tgt)[..., 0].numpy())
        acc["ce_mix"].append(-mix.gather(-1, tgt)[..., 0].numpy())
        acc["top1_cond"].append((lc.argmax(-1) == c).float().numpy())
        acc["top1_mix"].append((mix.argmax(-1) == c).float().numpy())
        acc["ent_mix"].append(-(mix.exp() * mix).sum(-1).numpy())
        acc["pmax_mix"].append(mix.max(-1).values.exp().numpy())
    return {k: np.concatenate(v) for k, v in acc.items()}


def by_type(stats: dict[str, np.ndarray], types: dict[str, np.ndarray], loss_key: str = "ce_cond") -> dict:
    """Mean of every per-token statistic per position type, with ``share`` of the token count and
    ``loss_share`` = the type's share of the summed ``loss_key`` (where the loss is concentrated)."""
    total = float(stats[loss_key].sum())
    n = next(iter(types.values())).size
    out = {}
    for t, m in types.items():
        if not m.any():
            continue
        row = {k: float(v[m].mean()) for k, v in stats.items()}
        row["share"] = float(m.sum() / n)
        row["loss_share"] = float(stats[loss_key][m].sum() / total)
        out[t] = row
    return out


def ar_diagnosis(n: int = 256, train_n: int = 128, cfg: float = 3.0, ar_path: str | None = None) -> dict:
    """Part 3 (module docstring): held-out and train ground-truth grids, teacher-forced."""
    vq, model = load_vq_model(), load_ar_model(path=ar_path)
    out: dict[str, Any] = {"cfg_scale": cfg}
    for split, count in (("heldout", n), ("train", train_n)):
        sc = scene_set(split, count)
        grids = encode_images(vq, S.render_batch(sc, 64))
        st = ar_token_stats(model, [s.caption for s in sc], grids, cfg)
        out[split] = {"n": count, "by_type": by_type(st, position_types(grids, sc))}
    return out


PROBE_POSITIONS = (0, 64, 128, 192)
PROBE_ATTRS = ("bg_color", "a_color", "a_shape", "a_size", "b_color", "b_shape")


@torch.no_grad()
def cond_features(model: Any, captions: Sequence[str], grids: np.ndarray, bs: int = 32) -> torch.Tensor:
    """The conditional row's final features ``[n, N, dim]`` (row k predicts image token k), teacher-forced."""
    codes = torch.from_numpy(grids.reshape(len(grids), -1)).long()
    ids, words = model.text.batch_ids(list(captions))
    out = []
    for i in range(0, len(codes), bs):
        c = codes[i : i + bs]
        out.append(model.features(ids[i : i + bs], words[i : i + bs], torch.zeros(len(c), dtype=torch.bool), c))
    return torch.cat(out).float()


def linear_probe(x_tr: torch.Tensor, y_tr: torch.Tensor, x_te: torch.Tensor, y_te: torch.Tensor, k: int) -> float:
    """Held-out accuracy of an L2-regularised multinomial logistic regression (full-batch Adam, 300 steps)."""
    g = torch.Generator().manual_seed(0)
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    a, b = (x_tr - mu) / sd, (x_te - mu) / sd
    W = (0.01 * torch.randn(a.shape[1], k, generator=g)).requires_grad_()
    bias = torch.zeros(k, requires_grad=True)
    opt = torch.optim.Adam([W, bias], lr=0.05)
    with torch.enable_grad():
        for _ in range(300):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(a @ W + bias, y_tr) + 1e-3 * W.pow(2).sum()
            loss.backward()
            opt.step()
    return float(((b @ W + bias).argmax(1) == y_te).float().mean())


def cond_diagnosis(n: int = 256, probe_train: int = 768, cfg: float = 3.0, ar_path: str | None = None) -> dict:
    """Part ``cond`` (module docstring): the caption's reach at object starts, and linear probes of the features."""
    vq, model = load_vq_model(), load_ar_model(path=ar_path)
    held = scene_set("heldout", n)
    g_held = encode_images(vq, S.render_batch(held, 64))
    st = ar_token_stats(model, [s.caption for s in held], g_held, cfg)
    types = position_types(g_held, held)
    keep = ("all", "object_first", "object_top", "object_interior", "background")
    out: dict[str, Any] = {"n": n, "by_type": by_type(st, {k: types[k] for k in keep}), "probe_train": probe_train}
    train = scene_set("train", probe_train)
    g_train = encode_images(vq, S.render_batch(train, 64))
    f_tr = cond_features(model, [s.caption for s in train], g_train)
    f_te = cond_features(model, [s.caption for s in held], g_held)
    attrs_tr, attrs_te = [S.attributes(s) for s in train], [S.attributes(s) for s in held]
    probes: dict[str, dict[str, float]] = {}
    for attr in PROBE_ATTRS:
        values = S.ATTRIBUTES[attr]
        a_tr = [a.get(attr) for a in attrs_tr]
        a_te = [a.get(attr) for a in attrs_te]
        i_tr = [i for i, v in enumerate(a_tr) if v is not None]
        i_te = [i for i, v in enumerate(a_te) if v is not None]
        y_tr = torch.tensor([values.index(a_tr[i]) for i in i_tr])
        y_te = torch.tensor([values.index(a_te[i]) for i in i_te])
        row = {"chance": float(np.bincount(y_te.numpy(), minlength=len(values)).max() / len(i_te)), "n": len(i_te)}
        for p in PROBE_POSITIONS:
            row[f"pos{p}"] = linear_probe(f_tr[i_tr, p], y_tr, f_te[i_te, p], y_te, len(values))
        probes[attr] = row
    out["probes"] = probes
    return out


# ----------------------------------------------------------------------------------------------------
# 4. Drafter (teacher-forced on the target's own features)
# ----------------------------------------------------------------------------------------------------


def load_target_and_drafter() -> tuple[Any, Any]:
    """``model=mini`` and its shipped EAGLE drafter (``drafter=mini``), as the engine builds them."""
    from omegaconf import OmegaConf

    from adtbench.harness.config import register_resolvers
    from adtbench.harness.drafters import build_drafter
    from adtbench.models.registry import build_target

    register_resolvers()
    target = build_target(OmegaConf.load(conf_dir() / "model" / "mini.yaml"))
    drafter = build_drafter(OmegaConf.load(conf_dir() / "drafter" / "mini.yaml"), target)
    return target, drafter.eval()


@torch.no_grad()
def drafter_token_stats(target: Any, drafter: Any, seqs: Sequence[tuple[str, Sequence[int]]], cfg: float = 3.0) -> dict:
    """Per predicted token x_1 … x_{N−1} (``[n, N−1]``): ``agree`` (drafter's CFG-mixed argmax = target's),
    ``accept`` = Σ_v min(p_v, q_v) with p, q the target's and drafter's CFG-mixed softmax (T = 1): the
    probability that one token drafted from q is accepted (depth 1, the drafter fed the target's true
    features); ``accept_cond`` the same on the conditional rows only; ``pmax`` = max_v p_v; ``ent`` = H(p)."""
    from adtbench.tools.train.drafter import collate, drafter_forward, drafter_slots, teacher_sample

    keys = ("agree", "accept", "accept_cond", "pmax", "ent")
    acc: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for prompt, tokens in seqs:
        smp = teacher_sample(target, prompt, list(tokens), cfg_rows=True)
        batch = collate([drafter_slots(smp, target.embed_tokens)])
        g = drafter_forward(drafter, batch)[0]  # [R, L, H]
        P = smp.prompt_len
        lq = target.lm_head(g[:, P - 1 :]).float()  # slot P−1+k predicts x_{k+1}
        lp = target.lm_head(batch["target"][0, :, P - 1 :].to(g.dtype)).float()
        p = (lp[1] + cfg * (lp[0] - lp[1])).softmax(-1)
        q = (lq[1] + cfg * (lq[0] - lq[1])).softmax(-1)
        acc["agree"].append((p.argmax(-1) == q.argmax(-1)).float().numpy())
        acc["accept"].append(torch.minimum(p, q).sum(-1).numpy())
        acc["accept_cond"].append(torch.minimum(lp[0].softmax(-1), lq[0].softmax(-1)).sum(-1).numpy())
        acc["pmax"].append(p.max(-1).values.numpy())
        acc["ent"].append(-(p * p.clamp_min(1e-30).log()).sum(-1).numpy())
    return {k: np.stack(v) for k, v in acc.items()}


def generated_sequences(
    target: Any, captions: Sequence[str], cfg: float = 3.0, temperature: float = 1.0
) -> list[tuple[str, list[int]]]:
    """The target's own AR samples (CFG ``cfg``, ``temperature``: 0 = greedy; generator seed = index), as the
    engine decodes."""
    from adtbench.algorithm.engine import decode_ar
    from adtbench.sampling_params import SamplingParams

    sp = SamplingParams(temperature=temperature, cfg_scale=cfg)
    out = []
    for i, c in enumerate(captions):
        res = decode_ar(target, target.encode_prompt(c, cfg=True), sp, torch.Generator().manual_seed(i))
        out.append((c, list(res.tokens)))
    return out


PMAX_BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


def by_confidence(stats: dict[str, np.ndarray], edges: Sequence[float] = PMAX_BINS) -> dict:
    """``agree`` / ``accept`` and the token share per bin ``[lo, hi)`` of the target's max probability ``pmax``
    (the last bin includes 1)."""
    pm = stats["pmax"]
    out = {}
    for lo, hi in pairwise(edges):
        m = (pm >= lo) & ((pm < hi) if hi < edges[-1] else (pm <= hi))
        if m.any():
            out[f"{lo:g}-{hi:g}"] = {
                "share": float(m.mean()),
                "agree": float(stats["agree"][m].mean()),
                "accept": float(stats["accept"][m].mean()),
            }
    return out


def by_bg_kind(stats: dict[str, np.ndarray], scenes: Sequence[S.Scene]) -> dict:
    """Per background kind of the captions (rows of ``stats``): image count, ``agree``, ``accept``, and the token
    shares where the target is ``unsure`` (``pmax`` < 0.5) and ``confident`` (≥ 0.9)."""
    kinds = np.array([s.bg_kind for s in scenes])
    out = {}
    for k in sorted(set(kinds.tolist())):
        m = kinds == k
        pm = stats["pmax"][m]
        out[k] = {
            "images": int(m.sum()),
            "agree": float(stats["agree"][m].mean()),
            "accept": float(stats["accept"][m].mean()),
            "unsure": float((pm < 0.5).mean()),
            "confident": float((pm >= 0.9).mean()),
        }
    return out


def drafter_diagnosis(n: int = 32, gen_n: int = 8, cfg: float = 3.0, greedy_n: int = 0) -> dict:
    """Part 4 (module docstring): ``n`` held-out ground-truth grids, ``gen_n`` of the target's own T = 1 samples
    and ``greedy_n`` of its greedy ones (captions of the first held-out scenes)."""
    target, drafter = load_target_and_drafter()
    vq = target.vq
    off = target.layout.image_token_offset
    sc = scene_set("heldout", n)
    grids = encode_images(vq, S.render_batch(sc, 64))
    seqs = [(s.caption, (g.ravel() + off).tolist()) for s, g in zip(sc, grids)]
    out: dict[str, Any] = {"cfg_scale": cfg}
    st = drafter_token_stats(target, drafter, seqs, cfg)
    types = {k: v[:, 1:] for k, v in position_types(grids, sc).items()}
    out["heldout_truth"] = {"n": n, "by_type": by_type(st, types, "accept")}

    def own_samples(scenes: Sequence[S.Scene], temperature: float) -> tuple[dict, dict]:
        """The drafter's token stats on the target's own samples for ``scenes``' captions, and their types."""
        gen = generated_sequences(target, [s.caption for s in scenes], cfg, temperature)
        gg = np.array([np.array(t) - off for _, t in gen]).reshape(len(scenes), GRID, GRID)
        st = drafter_token_stats(target, drafter, gen, cfg)
        return st, {k: v[:, 1:] for k, v in position_types(gg).items()}

    if gen_n > 0:
        st, types = own_samples(sc[:gen_n], 1.0)
        out["generated"] = {"n": gen_n, "by_type": by_type(st, types, "accept")}
    if greedy_n > 0:
        gsc = scene_set("heldout", greedy_n)
        st, types = own_samples(gsc, 0.0)
        out["greedy"] = {
            "n": greedy_n,
            "by_type": by_type(st, types, "accept"),
            "by_confidence": by_confidence(st),
            "by_bg_kind": by_bg_kind(st, gsc),
        }
    return out


# ----------------------------------------------------------------------------------------------------
# 5. Data: caption grammar coverage
# ----------------------------------------------------------------------------------------------------


def _object_colours(bg_kind: str, bg_color: str) -> list[str]:
    hidden = {bg_color}
    if bg_kind in ("striped", "checkered"):
        hidden.add("black" if bg_color == "white" else "white")
    return [c for c in S.COLOR_NAMES if c not in hidden]


def grammar_size() -> dict[str, float]:
    """What ``sample_scene`` can produce: ``captions`` (distinct caption strings), ``combos`` (distinct
    canonical attribute dicts, "A left of B" = "B right of A"), and ``caption_entropy`` (nats) of the
    caption distribution of ``sample_scene`` (exact, from its sampling probabilities)."""
    captions, combos, ent = 0, 0, 0.0
    nb = len(S.BG_KINDS) * len(S.COLOR_NAMES)
    for kind, col in product(S.BG_KINDS, S.COLOR_NAMES):
        k = len(_object_colours(kind, col))
        obj = len(S.SIZES) * len(S.SHAPES) * k
        captions += obj + len(S.RELATIONS) * obj * obj
        combos += obj + 2 * obj * obj  # 2 axes × ordered (first, second) in canonical order
        h1 = math.log(obj)
        ent += (0.4 * h1 + 0.6 * (math.log(len(S.RELATIONS)) + 2 * h1)) / nb
    ent += math.log(nb) + (-0.4 * math.log(0.4) - 0.6 * math.log(0.6))
    return {"captions": captions, "combos": combos, "caption_entropy": ent}


def _combo(s: S.Scene) -> tuple:
    return tuple(sorted(S.attributes(s).items()))


def data_diagnosis(train_count: int = 10000, heldout_n: int = 2000) -> dict:
    """Part 5 (module docstring): the ``train_count`` training scenes of ``ar16`` vs ``heldout_n`` held-out."""
    tr, he = scene_set("train", train_count), scene_set("heldout", heldout_n)
    caps = Counter(s.caption for s in tr)
    combos = Counter(_combo(s) for s in tr)

    def parts(s: S.Scene) -> dict[str, tuple]:
        objs = [(o.size, o.color, o.shape) for o in s.objects]
        return {
            "bg": (s.bg_kind, s.bg_color),
            "object_phrase": tuple(sorted(objs)),
            "objects_on_bg": (s.bg_kind, s.bg_color, tuple(sorted(objs))),
        }

    seen = {k: {parts(s)[k] for s in tr} for k in ("bg", "object_phrase", "objects_on_bg")}
    word_counts = Counter(w for s in tr for w in s.caption.split())
    two = [s for s in he if len(s.objects) == 2]
    return {
        "grammar": grammar_size(),
        "train_scenes": train_count,
        "train_distinct_captions": len(caps),
        "train_distinct_combos": len(combos),
        "train_captions_seen_once": sum(1 for v in caps.values() if v == 1),
        "heldout_scenes": heldout_n,
        "heldout_caption_in_train": float(np.mean([s.caption in caps for s in he])),
        "heldout_combo_in_train": float(np.mean([_combo(s) in combos for s in he])),
        "heldout_two_object_combo_in_train": float(np.mean([_combo(s) in combos for s in two])) if two else 0.0,
        "heldout_part_in_train": {k: float(np.mean([parts(s)[k] in seen[k] for s in he])) for k in seen},
        "min_word_count": int(min(word_counts[w] for w in S.VOCAB)),
        "word_counts": dict(sorted(word_counts.items())),
    }


# ----------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------


def _fmt_types(rows: dict, cols: Sequence[str]) -> str:
    head = f"  {'type':<18}" + "".join(f"{c:>12}" for c in cols)
    lines = [head]
    for t, r in rows.items():
        lines.append(f"  {t:<18}" + "".join(f"{r.get(c, float('nan')):>12.3f}" for c in cols))
    return "\n".join(lines)


def summary(part: str, res: dict) -> str:
    """Human-readable digest of one part's result."""
    if part == "vq":
        u = res["usage"]
        pt = res["flat_patches"]["_overall"]
        lines = [
            f"VQ: PSNR {res['psnr']:.2f} dB (MSE {res['mse']:.4f}) on {res['n_images']} held-out images; "
            f"codes used {u['codes_used']}/512, perplexity {u['perplexity']:.1f}, top-16 share {u['top16_share']:.3f}",
            "  PSNR per kind: " + ", ".join(f"{k} {v['psnr']:.1f}" for k, v in res["psnr_per_kind"].items()),
            f"  uniform patches: {pt['patches']} ({pt['token_share']:.1%} of tokens), H(code|colour) "
            f"{pt['H_code_given_colour']:.2f} nats; isolated {pt['isolated']}: "
            f"H {pt['isolated_H_code_given_colour']:.2f} nats, P(code = left) {pt['isolated_p_same_left']:.3f}",
        ]
        for name, d in res["flat_patches"].items():
            if name.startswith("_"):
                continue
            fi, nc = res["flat_images"][name], res["near_colours"][name]
            g = res["geometry"]["colours"][name]
            lines.append(
                f"  {name:<7} flat image: {fi['distinct']} codes ({fi['interior_distinct']} interior, major "
                f"{fi['majority_share']:.2f}); ±4: {nc['distinct']} codes, {nc['changed']}/27 changed; "
                f"in scenes: {d['distinct']} codes (H {d['H']:.2f}, iso {d['isolated_distinct']} / H "
                f"{d['isolated_H']:.2f}); near codes {g['near_codes']}"
            )
        return "\n".join(lines)
    if part == "tokens":
        lines = [f"tokens: {res['train_grids']} train grids → {res['heldout_grids']} held-out grids"]
        for name, d in res["levels"].items():
            bt = d["by_type"]
            lines.append(
                f"  {name:<32} CE {d['ce_heldout']:.3f} (plug-in {d['plugin_heldout']:.3f}, β {d['beta']:g}); "
                f"same_left {bt.get('same_left', float('nan')):.2f}, diff_left {bt.get('diff_left', float('nan')):.2f}"
            )
        return "\n".join(lines)
    if part == "ar":
        cols = ("share", "ce_cond", "ce_uncond", "ce_mix", "top1_cond", "top1_mix", "ent_mix", "loss_share")
        return "\n".join(
            f"AR {split} (n={res[split]['n']}):\n" + _fmt_types(res[split]["by_type"], cols)
            for split in ("heldout", "train")
        )
    if part == "cond":
        cols = ("share", "ce_cond", "ce_uncond", "top1_cond")
        lines = [f"cond (n={res['n']}): CE where objects start\n" + _fmt_types(res["by_type"], cols)]
        lines.append(
            f"  linear probes of the caption from the cond row's features ({res['probe_train']} train scenes):"
        )
        for attr, r in res["probes"].items():
            accs = ", ".join(f"pos {p} {r[f'pos{p}']:.2f}" for p in PROBE_POSITIONS)
            lines.append(f"  {attr:<9} {accs}  (chance {r['chance']:.2f}, n {r['n']})")
        return "\n".join(lines)
    if part == "drafter":
        cols = ("share", "agree", "accept", "accept_cond", "pmax", "ent", "loss_share")
        lines = [
            f"drafter {k} (n={res[k]['n']}; loss_share = share of Σ accept):\n" + _fmt_types(res[k]["by_type"], cols)
            for k in ("heldout_truth", "generated", "greedy")
            if k in res
        ]
        if "greedy" in res:
            lines.append(
                "  greedy, by the target's max probability:\n"
                + _fmt_types(res["greedy"]["by_confidence"], ("share", "agree", "accept"))
            )
            lines.append(
                "  greedy, by background kind:\n"
                + _fmt_types(res["greedy"]["by_bg_kind"], ("images", "agree", "accept", "unsure", "confident"))
            )
        return "\n".join(lines)
    if part == "data":
        g = res["grammar"]
        return (
            f"data: grammar {g['captions']} captions / {g['combos']} attribute combos, caption entropy "
            f"{g['caption_entropy']:.2f} nats; train {res['train_scenes']} scenes → {res['train_distinct_captions']} "
            f"captions, {res['train_distinct_combos']} combos; held-out caption in train "
            f"{res['heldout_caption_in_train']:.3f}, combo in train {res['heldout_combo_in_train']:.3f}; parts in "
            f"train {res['heldout_part_in_train']}; min word count {res['min_word_count']}"
        )
    return json.dumps(res)[:2000]


PARTS = ("data", "vq", "tokens", "ar", "cond", "drafter")


def main(args: list[str]) -> int:
    kv = dict(a.split("=", 1) for a in args if "=" in a)
    bad = [a for a in args if "=" not in a]
    what = kv.get("what", "all")
    if bad or (what != "all" and what not in PARTS):
        print(__doc__)
        return 2
    torch.set_num_threads(int(kv.get("threads", 1)))
    n = int(kv.get("n", 256))
    cfg = float(kv.get("cfg", 3.0))
    out = Path(kv.get("out", str(DEFAULT_OUT)))
    runs = {
        "data": lambda: data_diagnosis(),
        "vq": lambda: vq_diagnosis(n, kv.get("vq_path")),
        "tokens": lambda: token_diagnosis(n, int(kv.get("train_n", 4000))),
        "ar": lambda: ar_diagnosis(n, int(kv.get("ar_train_n", n)), cfg, kv.get("ar_path")),
        "cond": lambda: cond_diagnosis(n, int(kv.get("probe_train", 768)), cfg, kv.get("ar_path")),
        "drafter": lambda: drafter_diagnosis(
            int(kv.get("drafter_n", 32)), int(kv.get("gen_n", 8)), cfg, int(kv.get("greedy_n", 0))
        ),
    }
    results = json.loads(out.read_text()) if out.exists() else {}
    for part in PARTS if what == "all" else (what,):
        t0 = time.perf_counter()
        res = runs[part]()
        res["wall_s"] = time.perf_counter() - t0
        res["args"] = {"n": n, **{k: v for k, v in kv.items() if k not in ("what", "out")}}
        results[part] = res
        print(summary(part, res), f"[{res['wall_s']:.1f} s]", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, results, indent=1)
    print(f"→ {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
