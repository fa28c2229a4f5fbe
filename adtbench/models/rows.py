"""Prompt rows of a CFG target: the conditional row and, under CFG, the unconditional one, as one left-padded batch.

Every family's adapter builds its two token lists (Chameleon / Lumina-mGPT: the prompt and a header-only row; Emu3:
the prompt and the negative prompt, either the longer; Janus-Pro: the prompt and its pad-token copy, the same length)
and hands them to ``prompt_rows``, which is the one place that pads, masks and numbers them:

- ``ids [R, P]``: each row left-padded with ``pad`` to the longest, ``P = max(len(cond), len(uncond))``;
- ``valid [R, P]``: False on the pad columns (never attended: ``hf_causal.prompt_mask``), True on the tokens;
- ``positions [R, P]``: the real tokens of each row numbered 0, 1, … (pads 0), so each row's function is that of its
  own unpadded forward — transformers' separate unconditional pass with its own cache.

A row without padding is numbered ``0 … P − 1`` with every column valid (Janus's pad-token row is such a row: its
pad *tokens* are attended, as transformers attends them; they are not padding)."""

from __future__ import annotations

import torch

from adtbench.models.base import PromptInputs


def prompt_rows(text: str, cfg: bool, cond: list[int], uncond: list[int], pad: int) -> PromptInputs:
    """``PromptInputs`` of the cond row and (when ``cfg``) the uncond row, left-padded with ``pad`` to one length
    (module docstring); ``uncond`` is ignored without CFG. ValueError on an empty row."""
    rows = [cond, uncond] if cfg else [cond]
    if any(not r for r in rows):
        raise ValueError("a prompt row is empty")
    P = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (P - len(r)) + list(r) for r in rows], dtype=torch.long)
    valid = torch.tensor([[False] * (P - len(r)) + [True] * len(r) for r in rows])
    positions = (valid.long().cumsum(1) - 1).clamp_min(0)  # real tokens 0, 1, …; pads 0
    return PromptInputs(text=text, cfg=cfg, data={"ids": ids, "valid": valid, "positions": positions})


__all__ = ["prompt_rows"]
