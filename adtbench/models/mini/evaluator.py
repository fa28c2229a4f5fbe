"""The mini evaluator: a small CNN trained on the scene generator's ground truth (``adtbench.scenes``).

It predicts the canonical attributes of a picture (background kind and colour, number of objects, the
axis of the relation, size/colour/shape of the first (left/top) and second (right/bottom) object) and
gives the harness a real, CPU-cheap quality signal:

- ``score(images, prompts)``: **caption agreement** ∈ [0, 1] per image — the fraction of the attributes
  the caption states (``scenes.parse_caption``) that the evaluator's argmax prediction reproduces. Every
  caption of the grammar states bg_kind, bg_color, n_objects and the first object's three attributes;
  two-object captions add axis and the second object's three (7 or 11 attributes). Prompts outside the
  grammar score ``None``.
- ``features(images)``: the penultimate activation ``[B, feature_dim]`` (for FID-like / P&R metrics).

Input: uint8 ``[B, H, W, 3]`` (numpy or torch) of any square size; images are area-resized (or bilinearly
up-sampled) to ``image_size`` and mapped to [-1, 1].
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from adtbench.scenes import ATTRIBUTES, parse_caption

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "weights" / "mini" / "evaluator"


@dataclass
class EvaluatorConfig:
    image_size: int = 32
    width: int = 32
    feature_dim: int = 128
    stem_stride: int = 1  # 2: a stride-2 first conv (full-resolution edges at the cost of a 2× smaller input)
    attributes: dict[str, list[str]] = field(default_factory=lambda: {k: list(v) for k, v in ATTRIBUTES.items()})


class MiniEvaluator(nn.Module):
    """conv(3→w, stride ``stem_stride``) → 3 × stride-2 conv (w→2w→4w→4w) → flatten → Linear → attribute heads."""

    def __init__(self, cfg: EvaluatorConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.convs = nn.Sequential(
            nn.Conv2d(3, w, 3, stride=cfg.stem_stride, padding=1),
            nn.GELU(),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1),
            nn.GroupNorm(8, 2 * w),
            nn.GELU(),
            nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1),
            nn.GroupNorm(8, 4 * w),
            nn.GELU(),
            nn.Conv2d(4 * w, 4 * w, 3, stride=2, padding=1),
            nn.GELU(),
        )
        side = cfg.image_size // (8 * cfg.stem_stride)
        self.proj = nn.Linear(4 * w * side * side, cfg.feature_dim)
        self.heads = nn.ModuleDict({k: nn.Linear(cfg.feature_dim, len(v)) for k, v in cfg.attributes.items()})

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``x [B, 3, s, s]`` in [-1, 1] → features ``[B, F]`` and logits per attribute ``[B, n_classes]``."""
        h = F.gelu(self.proj(self.convs(x).flatten(1)))
        return h, {k: head(h) for k, head in self.heads.items()}

    # --- inference API -----------------------------------------------------------------------------
    def preprocess(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, H, W, 3]`` → float ``[B, 3, s, s]`` in [-1, 1] (area resize to ``image_size``)."""
        t = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
        if t.dim() == 3:
            t = t[None]
        x = t.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        s = self.cfg.image_size
        if x.shape[-1] > s:
            x = F.interpolate(x, size=(s, s), mode="area")
        elif x.shape[-1] < s:
            x = F.interpolate(x, size=(s, s), mode="bilinear", align_corners=False)
        return x.to(next(self.parameters()).device)

    @torch.no_grad()
    def features(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Penultimate features ``[B, feature_dim]`` (float32, CPU)."""
        return self(self.preprocess(images))[0].float().cpu()

    @torch.no_grad()
    def predict(self, images: np.ndarray | torch.Tensor) -> list[dict[str, str]]:
        """Argmax attribute values per image."""
        _, logits = self(self.preprocess(images))
        idx = {k: v.argmax(-1).tolist() for k, v in logits.items()}
        n = len(next(iter(idx.values())))
        return [{k: self.cfg.attributes[k][idx[k][i]] for k in idx} for i in range(n)]

    @torch.no_grad()
    def attribute_hits(self, images: np.ndarray | torch.Tensor, prompts: Sequence[str]) -> list[dict[str, bool] | None]:
        """Per image: for every attribute its prompt states, whether the evaluator recognises the stated value;
        None where the prompt is outside the grammar."""
        preds = self.predict(images)
        if len(preds) != len(prompts):
            raise ValueError(f"{len(preds)} images but {len(prompts)} prompts")
        out: list[dict[str, bool] | None] = []
        for pred, text in zip(preds, prompts):
            want = parse_caption(text)
            out.append(None if want is None else {k: pred[k] == v for k, v in want.items()})
        return out

    @torch.no_grad()
    def score(self, images: np.ndarray | torch.Tensor, prompts: Sequence[str]) -> list[float | None]:
        """Caption agreement per image (module docstring): the mean of ``attribute_hits``; None off-grammar."""
        return [None if h is None else sum(h.values()) / len(h) for h in self.attribute_hits(images, prompts)]


def load_mini_evaluator(
    path: str | Path | None = None, device: str | torch.device = "cpu", key: str = "eval.mini.path"
) -> MiniEvaluator:
    """Load ``model.safetensors`` + ``config.json`` from ``path`` (default: the shipped weights); a corrupt file
    is a ``ConfigError`` naming ``key`` and the file."""
    from adtbench.io import load_weights

    p = Path(path) if path is not None else DEFAULT_PATH
    if not (p / "model.safetensors").exists():
        raise FileNotFoundError(f"no mini evaluator weights at {p} (expected model.safetensors + config.json)")
    cfg = EvaluatorConfig(**json.loads((p / "config.json").read_text()))
    model = MiniEvaluator(cfg)
    model.load_state_dict(load_weights(key, p / "model.safetensors"))
    return model.to(device).eval()


def config_dict(cfg: EvaluatorConfig) -> dict:
    return asdict(cfg)
