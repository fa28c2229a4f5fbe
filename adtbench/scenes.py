"""Procedural scenes with captions: the data of the embedded ``mini`` text-to-image model.

A scene is a background (plain colour, smooth gradient, stripes, checks or blocky noise) and one or two
solid objects (circle, square, triangle; small or large; eight colours). Its caption comes from a small
grammar, e.g. ``"a large red circle left of a small blue square on a striped green background"`` or
``"a small yellow triangle on a plain black background"``:

    caption    := object [" " relation " " object] " on a " bg_kind " " colour " background"
    object     := "a " size " " colour " " shape
    relation   := "left of" | "right of" | "above" | "below"

Difficulty varies in space on purpose: plain and gradient regions are easy to predict token by token,
object edges, stripes and checks are structured, blocky noise is unpredictable. That is what makes the
acceptance of speculative decoding vary over the image.

Determinism: ``sample_scene(seed, index)`` depends only on its arguments (a ``numpy`` generator seeded by
``(seed, index)``); ``render(scene, size)`` is a pure function of the scene and the size. Geometry lives in
unit coordinates and is rendered with 2×2 super-sampling, so the 32 px and 64 px renders of one scene agree.

Splits: a caption belongs to the held-out split iff ``sha256(caption) mod 10 == 0`` (``caption_split``), so
train and held-out captions are disjoint by construction while every word occurs in both.

Ground truth for the mini evaluator is the *canonical* attribute dict of a scene (``attributes``): objects
ordered left→right (horizontal relation) or top→bottom (vertical), so "A left of B" and "B right of A" —
the same picture — give the same attributes. ``parse_caption`` maps a caption of the grammar to the same
dict (None for text outside the grammar).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 225),
    "yellow": (240, 215, 40),
    "purple": (145, 60, 185),
    "orange": (245, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
COLOR_NAMES: tuple[str, ...] = tuple(COLORS)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
SIZES: tuple[str, ...] = ("small", "large")
BG_KINDS: tuple[str, ...] = ("plain", "gradient", "striped", "checkered", "noisy")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
AXES: tuple[str, ...] = ("horizontal", "vertical")
RADIUS = {"small": 0.12, "large": 0.2}  # half-extent in unit coordinates

#: every word the grammar can produce (the mini text encoder's vocabulary)
VOCAB: tuple[str, ...] = tuple(
    dict.fromkeys(
        ["a", "on", "background", "left", "right", "of", "above", "below", *SIZES, *COLOR_NAMES, *SHAPES, *BG_KINDS]
    )
)


@dataclass(frozen=True)
class SceneObject:
    shape: str
    color: str
    size: str
    cx: float  # centre, unit coordinates (x right, y down)
    cy: float

    def phrase(self) -> str:
        return f"a {self.size} {self.color} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """A background, 1–2 objects and (for two objects) the relation of the first to the second."""

    bg_kind: str
    bg_color: str
    objects: tuple[SceneObject, ...]
    relation: str | None
    bg_params: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def caption(self) -> str:
        head = self.objects[0].phrase()
        if len(self.objects) == 2:
            head += f" {self.relation} {self.objects[1].phrase()}"
        return f"{head} on a {self.bg_kind} {self.bg_color} background"


def caption_split(caption: str) -> str:
    """``"heldout"`` iff sha256(caption) ≡ 0 (mod 10), else ``"train"`` (disjoint caption sets)."""
    h = int(hashlib.sha256(caption.encode()).hexdigest()[:8], 16)
    return "heldout" if h % 10 == 0 else "train"


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(index)]))


def sample_scene(seed: int, index: int) -> Scene:
    """The ``index``-th scene of stream ``seed`` (deterministic; any split)."""
    r = _rng(seed, index)
    bg_kind = BG_KINDS[r.integers(len(BG_KINDS))]
    bg_color = COLOR_NAMES[r.integers(len(COLOR_NAMES))]
    # objects never share a colour with the background (nor with the second colour of stripes/checks)
    hidden = {bg_color}
    if bg_kind in ("striped", "checkered"):
        hidden.add("black" if bg_color == "white" else "white")
    obj_colors = [c for c in COLOR_NAMES if c not in hidden]
    n = 1 if r.random() < 0.4 else 2

    def obj(cx: float, cy: float) -> SceneObject:
        return SceneObject(
            shape=SHAPES[r.integers(len(SHAPES))],
            color=obj_colors[r.integers(len(obj_colors))],
            size=SIZES[r.integers(len(SIZES))],
            cx=float(cx),
            cy=float(cy),
        )

    if n == 1:
        objects: tuple[SceneObject, ...] = (obj(r.uniform(0.3, 0.7), r.uniform(0.3, 0.7)),)
        relation = None
    else:
        relation = RELATIONS[r.integers(len(RELATIONS))]
        lo, hi = r.uniform(0.22, 0.32), r.uniform(0.68, 0.78)  # along the relation axis
        a, b = r.uniform(0.3, 0.7, size=2)  # across it
        first, second = (lo, hi) if relation in ("left of", "above") else (hi, lo)
        if relation in ("left of", "right of"):
            objects = (obj(first, a), obj(second, b))
        else:
            objects = (obj(a, first), obj(b, second))
    params = {
        "direction": int(r.integers(4)),  # gradient / stripe orientation
        "period": float(r.choice([1 / 8, 1 / 6, 1 / 4])),
        "phase": float(r.random()),
        "noise_seed": int(r.integers(2**31)),
    }
    return Scene(bg_kind, bg_color, objects, relation, params)


def iter_split(seed: int, split: str, count: int, start: int = 0):
    """Yield ``(index, scene)`` for the first ``count`` scenes of stream ``seed`` whose caption is in ``split``."""
    if split not in ("train", "heldout", "any"):
        raise ValueError(f"split must be train, heldout or any, got {split!r}")
    i, n = start, 0
    while n < count:
        s = sample_scene(seed, i)
        if split == "any" or caption_split(s.caption) == split:
            yield i, s
            n += 1
        i += 1


# ----------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------


def _contrast(rgb: np.ndarray) -> np.ndarray:
    """The second colour of stripes/checks: white, or dark grey for light colours."""
    return np.array([60, 60, 60], np.float32) if rgb.mean() > 200 else np.array([245, 245, 245], np.float32)


def _background(scene: Scene, u: np.ndarray, v: np.ndarray, size: int) -> np.ndarray:
    """Background ``[H, W, 3]`` float32 in 0..255 over unit coordinates ``u`` (x) and ``v`` (y)."""
    base = np.array(COLORS[scene.bg_color], np.float32)
    p = scene.bg_params
    kind, d = scene.bg_kind, p["direction"]
    t = [u, v, 1 - u, 1 - v][d]
    if kind == "plain":
        return np.broadcast_to(base, (*u.shape, 3)).copy()
    if kind == "gradient":
        dark = base * 0.35 if base.mean() > 60 else base + 0.6 * (255 - base)
        w = t[..., None]
        return (1 - w) * base + w * dark
    if kind == "striped":
        axis = [u, v, (u + v) / np.sqrt(2), (u - v) / np.sqrt(2)][d]
        on = np.floor(axis / p["period"] + p["phase"]) % 2 == 0
        return np.where(on[..., None], base, _contrast(base))
    if kind == "checkered":
        cell = p["period"]
        on = (np.floor(u / cell) + np.floor(v / cell)) % 2 == 0
        return np.where(on[..., None], base, _contrast(base))
    if kind == "noisy":
        # blocky noise on a 32×32 unit grid (one block = 2×2 px at 64 px): unpredictable token content
        g = np.random.default_rng(p["noise_seed"]).normal(0.0, 55.0, size=(32, 32)).astype(np.float32)
        iu = np.clip((u * 32).astype(int), 0, 31)
        iv = np.clip((v * 32).astype(int), 0, 31)
        return np.clip(base + g[iv, iu][..., None], 0, 255)
    raise ValueError(f"unknown background kind {kind!r}")


def _coverage(o: SceneObject, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    r = RADIUS[o.size]
    dx, dy = u - o.cx, v - o.cy
    if o.shape == "circle":
        return dx * dx + dy * dy <= r * r
    if o.shape == "square":
        s = r * 0.88  # equal-area-ish with the circle
        return (np.abs(dx) <= s) & (np.abs(dy) <= s)
    if o.shape == "triangle":  # upright isosceles triangle inside the box of half-size r
        h = (dy + r) / (2 * r)  # 0 at the apex (top), 1 at the base
        return (dy >= -r) & (dy <= r) & (np.abs(dx) <= h * r)
    raise ValueError(f"unknown shape {o.shape!r}")


def render(scene: Scene, size: int = 64) -> np.ndarray:
    """Scene → uint8 image ``[size, size, 3]`` (2×2 super-sampled; same geometry at every size)."""
    ss = 2
    n = size * ss
    c = (np.arange(n, dtype=np.float32) + 0.5) / n
    v, u = np.meshgrid(c, c, indexing="ij")
    img = _background(scene, u, v, size)
    for o in scene.objects:
        m = _coverage(o, u, v)[..., None]
        img = np.where(m, np.array(COLORS[o.color], np.float32), img)
    img = img.reshape(size, ss, size, ss, 3).mean(axis=(1, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def render_batch(scenes: list[Scene], size: int) -> np.ndarray:
    """``[B, size, size, 3]`` uint8."""
    return np.stack([render(s, size) for s in scenes])


def to_tensor_range(images: np.ndarray):
    """uint8 ``[B, H, W, 3]`` → float32 torch ``[B, 3, H, W]`` in ``[-1, 1]``."""
    import torch

    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


# ----------------------------------------------------------------------------------------------------
# Canonical attributes (evaluator ground truth) and caption parsing
# ----------------------------------------------------------------------------------------------------

#: attribute → class names. ``b_*`` and ``axis`` only apply to two-object scenes.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "bg_kind": BG_KINDS,
    "bg_color": COLOR_NAMES,
    "n_objects": ("1", "2"),
    "axis": AXES,
    "a_size": SIZES,
    "a_color": COLOR_NAMES,
    "a_shape": SHAPES,
    "b_size": SIZES,
    "b_color": COLOR_NAMES,
    "b_shape": SHAPES,
}


def _canonical(objs: list[tuple[str, str, str]], relation: str | None) -> dict[str, str]:
    """Objects ``(size, colour, shape)`` in caption order + relation → canonical attributes."""
    out: dict[str, str] = {"n_objects": str(len(objs))}
    if len(objs) == 2:
        assert relation is not None
        out["axis"] = "horizontal" if relation in ("left of", "right of") else "vertical"
        if relation in ("right of", "below"):  # canonical order: left→right, top→bottom
            objs = [objs[1], objs[0]]
    for tag, (size, color, shape) in zip("ab", objs):
        out |= {f"{tag}_size": size, f"{tag}_color": color, f"{tag}_shape": shape}
    return out


def attributes(scene: Scene) -> dict[str, str]:
    """Canonical ground-truth attributes of a scene (keys ⊂ ``ATTRIBUTES``)."""
    objs = [(o.size, o.color, o.shape) for o in scene.objects]
    return {"bg_kind": scene.bg_kind, "bg_color": scene.bg_color} | _canonical(objs, scene.relation)


_OBJ = rf"a ({'|'.join(SIZES)}) ({'|'.join(COLOR_NAMES)}) ({'|'.join(SHAPES)})"
_CAPTION_RE = re.compile(
    rf"^{_OBJ}(?: ({'|'.join(RELATIONS)}) {_OBJ})? on a ({'|'.join(BG_KINDS)}) ({'|'.join(COLOR_NAMES)}) background$"
)


def parse_caption(text: str) -> dict[str, str] | None:
    """Caption of the grammar → canonical attributes (same dict as ``attributes``); None otherwise."""
    m = _CAPTION_RE.match(" ".join(text.lower().split()))
    if m is None:
        return None
    g = m.groups()
    objs = [(g[0], g[1], g[2])]
    if g[3] is not None:
        objs.append((g[4], g[5], g[6]))
    return {"bg_kind": g[7], "bg_color": g[8]} | _canonical(objs, g[3])


def heldout_prompts(seed: int, count: int) -> list[str]:
    """``count`` distinct held-out captions of stream ``seed`` (the ``dataset=mini`` prompt file)."""
    out: dict[str, None] = {}
    for _, s in iter_split(seed, "heldout", 10 * count):
        out.setdefault(s.caption)
        if len(out) == count:
            break
    return list(out)
