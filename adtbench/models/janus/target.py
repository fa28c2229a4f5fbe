"""Janus-Pro adapter: prompt rows (the pad-token CFG row), the token layout, the two targets and the builder.

Janus-Pro generates an image as ``grid_h × grid_w`` VQ codes (384² → 24 × 24 = 576; no end-of-line or end-of-image
tokens) through its own generation embedding and head (``janus.lean``): the token space of generation *is* the code
space, ``TokenLayout(vocab_size=K, image_token_offset=0, num_codes=K)`` with K = 16384. Prompt positions carry text
ids of the Llama tokenizer; ``PrefillResult.ids`` is None (they are not generation tokens: a drafter embeds the
prompt through the target's text embeddings, ``input_embeds``).

Prompt rows, as transformers' ``JanusForConditionalGeneration.generate(generation_mode="image")`` builds them
(DeepSeek's ``generation_inference.py`` the same):

- cond: the tokenizer's ids of ``model.prompt_template`` filled with the caption (BOS first: the tokenizer adds it;
  DeepSeek's SFT format with an empty system prompt, ``<|User|>: {text}\\n\\n<|Assistant|>:``), then
  ``<begin_of_image>`` (boi);
- uncond (CFG): the cond row with every token except BOS and boi replaced by the pad token — the same length, every
  column attended, positions ``0 … P − 1`` like the cond row (not a left-padded short row as Anole's).

The CFG mix is the engine's on raw logits, ``u + s·(c − u)`` (``ClassifierFreeGuidanceLogitsProcessor``); DeepSeek's
scale is 5. The ids of BOS, pad and boi are read from the checkpoint's ``generation_config.json`` (``bos_token_id``,
``pad_token_id``, ``generation_kwargs.boi_token_id``: what transformers' ``generate`` reads), else from the
tokenizer (``bos_token``, ``pad_token``, ``boi_token``).

``model.impl``: ``lean`` (default) — ``LeanJanusTarget`` on ``StaticGPTTarget`` (static KV cache, static buckets,
CUDA graphs, batching, ``compile_forward``); ``hf`` — ``JanusHFTarget``, transformers' ``JanusForConditionalGeneration``
(its ``language_model`` on explicit 4-D masks, its generation embedding + aligner, ``generation_head``:
``ImageGenerationLM``): the reference the lean path is tested against, and the papers' baseline
(``timing.reference_baseline``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.base import PrefillResult, PromptInputs, StaticGPTTarget
from adtbench.models.hf_causal import HFCausalTarget, additive_mask, common_options, prompt_mask
from adtbench.models.janus.lean import JanusArch, JanusLM, load_janus_net
from adtbench.models.kv import StaticKVCache
from adtbench.models.rope import Rope, Rope1D
from adtbench.models.rows import prompt_rows

SIZES = ("1B", "7B")  # ``model.size``: deepseek-community/Janus-Pro-<size>
DEFAULT_TEMPLATE = "<|User|>: {text}\n\n<|Assistant|>:"


class JanusPrompt:
    """Prompt rows and layout shared by both implementations (module docstring); a mixin before the network base.
    ``_init_prompt`` sets ``tokenizer``, ``special`` (bos, pad, boi), ``template``, ``layout`` and ``vq``."""

    tokenizer: Any
    special: dict[str, int]
    template: str
    layout: TokenLayout
    vq: Any

    def _init_prompt(
        self, tokenizer: Any, special: dict[str, int], template: str, arch: JanusArch, grid: tuple[int, int], vq: Any
    ) -> None:
        self.tokenizer, self.special, self.template, self.vq = tokenizer, dict(special), template, vq
        if vq is not None and vq.codebook_size != arch.num_codes:
            raise ConfigError("model.path", f"VQ codebook {vq.codebook_size} ≠ the generation head's {arch.num_codes}")
        K = arch.num_codes
        self.layout = TokenLayout(vocab_size=K, image_token_offset=0, num_codes=K, grid_h=grid[0], grid_w=grid[1])

    def prompt_ids(self, text: str) -> list[int]:
        """The cond row: the template's token ids (BOS first), then boi."""
        sp = self.special
        ids = list(self.tokenizer(self.template.format(text=text), add_special_tokens=True)["input_ids"])
        if not ids or ids[0] != sp["bos"]:
            ids = [sp["bos"], *ids]
        return [*ids, sp["boi"]]

    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        """``ids [R, P]`` (cond; under CFG the pad-token uncond row), ``valid`` all True, ``positions`` 0 … P − 1."""
        sp = self.special
        cond = self.prompt_ids(text)
        uncond = [t if t in (sp["bos"], sp["boi"]) else sp["pad"] for t in cond]  # same length: no padding
        return prompt_rows(text, cfg, cond, uncond, sp["pad"])

    def prompt_length(self, inputs: PromptInputs) -> int:
        return int(inputs.data["ids"].shape[1])


class LeanJanusTarget(JanusPrompt, StaticGPTTarget):
    """Janus-Pro on the lean stack (``model.impl: lean``): ``janus.lean.JanusLM`` behind ``StaticGPTTarget`` — the
    CFG rows batched in one preallocated ``StaticKVCache``, tree verification, the additive mask, device-side KV
    compaction, static buckets / CUDA graphs (``request_static``), ``BatchTarget`` and ``compile_forward``. Its
    ``tok_embeddings`` / ``output`` are the generation embedding (+ aligner) and the generation head, so every
    policy's tokens are codes."""

    def __init__(
        self,
        net: JanusLM,
        vq: Any,
        tokenizer: Any,
        special: dict[str, int],
        grid: tuple[int, int],
        template: str = DEFAULT_TEMPLATE,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.net = net.to(device=device, dtype=dtype).eval()
        self.device, self.dtype = torch.device(device), dtype
        a = net.arch
        self.hidden_size, self.num_heads, self.num_kv_heads = a.hidden_size, a.num_heads, a.num_kv_heads
        self.head_dim, self.intermediate_size, self.rope_theta = a.head_dim, a.intermediate_size, a.rope_theta
        self.cache: StaticKVCache | None = None
        self._init_prompt(tokenizer, special, template, a, grid, vq)

    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        dev = self.device
        ids, valid, pos = (inputs.data[k].to(dev) for k in ("ids", "valid", "positions"))
        self.cache = self.kv_cache(ids.shape[0], capacity)
        x = self.net.text_embeddings(ids)
        feats = self.net.forward_embeds(x, pos, prompt_mask(valid), self.cache, 0)
        return PrefillResult(
            logits=self.logits_head(feats[:, -1]), features=feats, input_embeds=x, positions=pos, valid=valid
        )

    def drafter_rope(self, head_dim: int) -> Rope:
        return Rope1D(head_dim, theta=self.rope_theta)  # HF rotate_half pairing, as the target's own


class ImageGenerationLM(nn.Module):
    """The part of a transformers ``JanusForConditionalGeneration`` that generates images, what ``HFCausalTarget``
    drives: ``model`` its Llama ``language_model`` (``embed_tokens``: the text embeddings), ``generation_embeddings``
    and ``generation_aligner`` (``embed_codes``: ``prepare_embeddings_for_image_generation``), ``lm_head`` its
    ``generation_head``, ``config`` the text config (sizes, attention implementation, cache layout). The vision
    encoder, the VQ model and the text ``lm_head`` are not kept: ``parameters()`` are what a forward reads."""

    def __init__(self, janus: nn.Module) -> None:
        super().__init__()
        m: Any = janus.model
        config: Any = janus.config
        self.config = config.text_config
        self.model = m.language_model
        self.generation_embeddings, self.generation_aligner = m.generation_embeddings, m.generation_aligner
        self.lm_head = m.generation_head

    def embed_codes(self, ids: torch.Tensor) -> torch.Tensor:
        """``JanusForConditionalGeneration.prepare_embeddings_for_image_generation``: aligner(embedding(ids))."""
        x: torch.Tensor = self.generation_aligner(self.generation_embeddings(ids))
        return x


class JanusHFTarget(JanusPrompt, HFCausalTarget):
    """Janus-Pro on transformers (``model.impl: hf``, the reference; module docstring): prompt positions through
    ``language_model.embed_tokens``, generated codes through ``prepare_embeddings_for_image_generation``, logits from
    ``generation_head``; ``HFCausalTarget``'s explicit 4-D masks, positions and cache compaction."""

    def __init__(
        self,
        janus: nn.Module,
        vq: Any,
        tokenizer: Any,
        special: dict[str, int],
        grid: tuple[int, int],
        template: str = DEFAULT_TEMPLATE,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        cfg_mode: str = "batched",
    ) -> None:
        arch = JanusArch.from_config(janus.config, key="model.path")
        super().__init__(ImageGenerationLM(janus), device, dtype, cfg_mode)
        self._text = False  # True while the prefill embeds text ids
        self._init_prompt(tokenizer, special, template, arch, grid, vq)

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        lm: Any = self.lm
        x = lm.model.embed_tokens(ids) if self._text else lm.embed_codes(ids)
        out = lm.model(
            inputs_embeds=x,
            attention_mask=additive_mask(mask, self.dtype),
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        )
        feats: torch.Tensor = out.last_hidden_state
        return feats

    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        self._text = True
        try:
            res = super()._prefill(inputs, capacity)
        finally:
            self._text = False
        res.ids = None  # text ids, not generation tokens
        return res

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        lm: Any = self.lm
        x: torch.Tensor = lm.embed_codes(ids.to(self.device))
        return x


# ---------------------------------------------------------------------------------------------------------
# Building from config
# ---------------------------------------------------------------------------------------------------------


def special_ids(base: Path, tokenizer: Any) -> dict[str, int]:
    """``{"bos", "pad", "boi"}`` ids: ``generation_config.json`` first (what transformers' ``generate`` reads), then
    the tokenizer's ``bos_token`` / ``pad_token`` / ``boi_token``; a missing one is a ``ConfigError`` on
    ``model.path``."""
    gen: dict[str, Any] = {}
    f = base / "generation_config.json"
    if f.is_file():
        try:
            gen = json.loads(f.read_text())
        except ValueError as e:
            raise ConfigError("model.path", f"{f}: not valid JSON ({e})") from e
    out: dict[str, int] = {}
    for key, gen_val, tok_attr in (
        ("bos", gen.get("bos_token_id"), "bos_token"),
        ("pad", gen.get("pad_token_id"), "pad_token"),
        ("boi", (gen.get("generation_kwargs") or {}).get("boi_token_id"), "boi_token"),
    ):
        if gen_val is None:
            name = getattr(tokenizer, tok_attr, None)
            gen_val = tokenizer.convert_tokens_to_ids(name) if name is not None else None
        if gen_val is None:
            raise ConfigError(
                "model.path", f"{base}: no {key} token id (generation_config.json nor the tokenizer's {tok_attr})"
            )
        out[key] = int(gen_val)
    return out


def grid_of(cfg: Any, config: Any) -> tuple[int, int]:
    """``model.grid`` ([h, w] or one int), else the square grid of ``vision_config.num_image_tokens`` (576 → 24)."""
    from adtbench.models.registry import get, plain

    grid = plain(get(cfg, "grid", None))
    if grid is None:
        n = int(config.vision_config.num_image_tokens)
        side = math.isqrt(n)
        if side * side != n:
            raise ConfigError("model.grid", f"num_image_tokens {n} is not a square: set model.grid [h, w]")
        return side, side
    g = (int(grid), int(grid)) if isinstance(grid, int) else tuple(int(x) for x in grid)
    if len(g) != 2 or min(g) < 1:
        raise ConfigError("model.grid", f"expected [h, w] with positive entries, got {grid}")
    return g[0], g[1]


def build_target(cfg: Any) -> LeanJanusTarget | JanusHFTarget:
    """Build from a ``model`` node (``conf/model/janus_pro.yaml``): ``model.path`` an HF-converted Janus-Pro folder or
    hub id (``config.json``, ``model.safetensors`` or shards + index, the tokenizer files, ``generation_config.json``);
    ``model.impl`` lean (default) | hf. Every path and the config are checked before any weight is read."""
    from transformers import AutoTokenizer

    from adtbench.models.janus.lean import open_janus_checkpoint
    from adtbench.models.janus.vq import load_janus_vq
    from adtbench.models.registry import get, model_impl, resolve_dir

    impl = model_impl(cfg)
    if bool(get(cfg, "random_init", False)):
        raise ConfigError("model.random_init", "janus has no random_init; write a tiny checkpoint with make-tiny")
    size = get(cfg, "size", None)
    if size is not None and str(size) not in SIZES:
        raise ConfigError("model.size", f"unknown Janus-Pro size {size!r}; choose one of {list(SIZES)}")
    template = str(get(cfg, "prompt_template", DEFAULT_TEMPLATE))
    if "{text}" not in template:
        raise ConfigError("model.prompt_template", f"must hold {{text}} (where the caption goes), got {template!r}")
    device, dtype, attn, _ = common_options(cfg)
    base = resolve_dir("model.path", get(cfg, "path"), ["config.json", "*.safetensors"])
    config, _, _ = open_janus_checkpoint(base)
    tok_dir = resolve_dir("model.tokenizer", get(cfg, "tokenizer", str(base)), ["tokenizer*.json"], base)
    grid = grid_of(cfg, config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    except (OSError, ValueError) as e:
        raise ConfigError("model.tokenizer", f"{tok_dir}: cannot load the tokenizer ({e})") from e
    special = special_ids(base, tokenizer)
    vq = load_janus_vq(base, config, device)
    if impl == "lean":
        net = load_janus_net(base, dtype, device)
        return LeanJanusTarget(net, vq, tokenizer, special, grid, template, device=device, dtype=dtype)
    from transformers import JanusForConditionalGeneration

    janus = JanusForConditionalGeneration.from_pretrained(str(base), dtype=dtype, attn_implementation=attn)
    cfg_mode = str(get(cfg, "cfg_mode", "batched"))
    return JanusHFTarget(janus, vq, tokenizer, special, grid, template, device=device, dtype=dtype, cfg_mode=cfg_mode)


__all__ = [
    "DEFAULT_TEMPLATE",
    "SIZES",
    "ImageGenerationLM",
    "JanusHFTarget",
    "JanusPrompt",
    "LeanJanusTarget",
    "build_target",
    "grid_of",
    "special_ids",
]
