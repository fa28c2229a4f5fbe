"""Lumina-mGPT adapter (Alpha-VLLM/Lumina-mGPT-7B-768): the Chameleon LM with end-of-line/size tokens.

Architecture = Chameleon-7B at inference (``ChameleonXLLMXForConditionalGeneration`` is only a training
wrapper); the checkpoints store q/k-norms as ``(1, head_dim)`` and are expanded at load time
(``hf_checkpoint.load_chameleon_lm``, models.md §1.4). ``model.vqmodel`` is absent (decoding uses Meta's
``vqgan.ckpt``).

Sequence (models.md §3; ``FlexARItemProcessor.process_image``): the prompt is
``[<s>] + tok("Generate an image of {W}x{H} according to the following prompt:\\n{caption}") +
[<reserved08706>]``, to which we append the image header ``[<racm3:break>, h-size, w-size]`` (LANTERN forces
it); size token = ``<reserved{8800 + n:05d}>`` with ``n`` = grid / 2 (32 px per unit, 16 px per code: 768 px →
n = 24 → ``<reserved08824>``, latent 48×48). The generated part is ``grid_h`` rows of ``grid_w`` image tokens
each followed by the end-of-line ``<reserved08799>``, then ``<eoss>`` (end of image): ``48·49 + 1 = 2353``
tokens. EOL and EOI are *forced* through ``TokenLayout`` (a logits constraint the verifier and the drafter
both apply); every other position allows image ids only. All ids are looked up by name in
``config.vocabulary_map`` and must exist.

CFG: the unconditional context is the image header alone, ``[<racm3:break>, h-size, w-size]`` at positions
0, 1, 2 (the official ``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor``); mixed as
``u + s·(c − u)`` on raw logits before the constraint and filtering. ``cfg_mode: sequential`` (default,
official) runs the uncond row as a second, unbatched forward with its own cache; ``batched`` runs it as a
left-padded second row. Greedy (``temperature: 0``) and temperature sampling both work (the reference EAGLE
path supports neither).

``model.impl`` as for Anole (``chameleon``): ``LeanLuminaTarget`` (default; its CFG rows always run batched in
one static cache — the same logits as the sequential layout up to float rounding) or ``LuminaTarget`` (hf).

Official sampling (README): CFG 4.0, image top-k 2000, temperature 1.0. LANTERN: CFG 3.0 (its drafter was
trained with 3.0), top-k 2000, temperature 1.0.
"""

from __future__ import annotations

from typing import Any

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.base import PromptInputs
from adtbench.models.chameleon.target import (
    ChameleonTarget,
    ChameleonVocab,
    LeanChameleonTarget,
    build_parts,
    grid_of,
)
from adtbench.models.hf_causal import common_options
from adtbench.models.rows import prompt_rows

EOL_NAME = "<reserved08799>"
PROMPT_TEMPLATE = "Generate an image of {w}x{h} according to the following prompt:\n{caption}"
PX_PER_CODE = 16  # Chameleon VQGAN factor: prompt sizes are in pixels of the real model


def size_token_name(n: int) -> str:
    """Grid-size token for ``n`` units of 32 px (Lumina ``get_n_grids_token``): 24 → ``<reserved08824>``."""
    return f"<reserved{8800 + n:05d}>"


def lumina_extra_names(grid: tuple[int, int]) -> tuple[str, ...]:
    """Vocabulary names a Lumina checkpoint must hold beyond Anole's: EOL and the size tokens of ``grid``."""
    return (EOL_NAME, *dict.fromkeys(size_token_name(g // 2) for g in grid))


class LuminaVocab(ChameleonVocab):
    """Lumina-mGPT's layout (EOL/EOI forced, size tokens) and prompt rows (module docstring); mixin of the HF and
    the lean Lumina targets. ``grid`` entries must be even (one size unit = 2 codes)."""

    default_cfg_mode = "sequential"  # the official unbatched CFG

    def _init_vocab(self, config: Any, vq: Any, tokenizer: Any, grid: tuple[int, int], device: Any) -> None:
        if grid[0] % 2 or grid[1] % 2:
            raise ConfigError("model.grid", f"Lumina grids are whole size units of 2 codes; got {grid}")
        super()._init_vocab(config, vq, tokenizer, grid, device)

    def _make_layout(self, c: Any, offset: int, k: int, grid: tuple[int, int]) -> TokenLayout:
        vm = c.vocabulary_map
        missing = [n for n in lumina_extra_names(grid) if n not in vm]
        if missing or "eoi" not in self.special:
            raise ConfigError(
                "model.path", f"vocabulary_map lacks Lumina tokens {missing or ['<eoss>']} for grid {list(grid)}"
            )
        special = dict(self.special)
        special["eol"] = int(vm[EOL_NAME])
        special["size_h"] = int(vm[size_token_name(grid[0] // 2)])
        special["size_w"] = int(vm[size_token_name(grid[1] // 2)])
        self.special = special
        return TokenLayout(
            vocab_size=c.vocab_size,
            image_token_offset=offset,
            num_codes=k,
            grid_h=int(grid[0]),
            grid_w=int(grid[1]),
            eol_token=special["eol"],
            eoi_token=special["eoi"],
            special=special,
        )

    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        """Cond ``[<s>] + template(text) + [eot, boi, h, w]``; uncond ``[boi, h, w]`` (left-padded under batched)."""
        sp, lay = self.special, self.layout
        words = PROMPT_TEMPLATE.format(w=lay.grid_w * PX_PER_CODE, h=lay.grid_h * PX_PER_CODE, caption=text)
        header = [sp["boi"], sp["size_h"], sp["size_w"]]
        cond = [sp["bos"], *self.tokenizer(words), sp["eot"], *header]
        return prompt_rows(text, cfg, cond, header, sp["pad"])


class LuminaTarget(LuminaVocab, ChameleonTarget):
    """Lumina-mGPT on transformers (``model.impl: hf``); same constructor as ``ChameleonTarget`` (default
    ``cfg_mode: sequential``, the official unbatched CFG: ``LuminaVocab.default_cfg_mode``)."""


class LeanLuminaTarget(LuminaVocab, LeanChameleonTarget):
    """Lumina-mGPT on the lean stack (``model.impl: lean``, the default): ``LeanChameleonTarget`` with Lumina's
    layout and prompt rows; its CFG rows run batched whatever ``cfg_mode`` says (the same logits as the official
    sequential CFG up to float rounding)."""


def build_target(cfg: Any) -> LuminaTarget | LeanLuminaTarget:
    """Build from a ``model`` node (``conf/model/lumina_mgpt.yaml``); ``model.impl`` as for Anole
    (``chameleon.build_target``).

    ``random_init: true``: a seeded tiny Chameleon whose tiny vocabulary also holds the EOL/size names;
    otherwise ``model.path`` (HF folder or hub id) with the q/k-norm fix.
    """
    from adtbench.models.registry import get, model_impl

    cls = LeanLuminaTarget if model_impl(cfg) == "lean" else LuminaTarget
    device, dtype, _, _ = common_options(cfg)
    grid = grid_of(cfg, "[48, 48] for Lumina-mGPT-7B-768")
    lm, vq, tokenizer = build_parts(cfg, lumina_extra_names(grid))
    mode = str(get(cfg, "cfg_mode", "sequential"))
    return cls(lm, vq, tokenizer, grid, device=device, dtype=dtype, cfg_mode=mode)


__all__ = [
    "EOL_NAME",
    "PROMPT_TEMPLATE",
    "LeanLuminaTarget",
    "LuminaTarget",
    "LuminaVocab",
    "build_target",
    "lumina_extra_names",
    "size_token_name",
]
