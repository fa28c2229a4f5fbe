"""LlamaGen adapter: the in-project GPT + VQ-16 decoder behind the ``Target`` interface.

Sequence layout: ``cls_token_num`` condition positions (caption features projected by ``cap_proj``,
or one class embedding), then the image tokens; image token k sits at position ``cls_token_num + k``.
Token id = VQ code (no offset, no special tokens). CFG is batched: row 0 cond, row 1 uncond (the learned
``uncond_embedding`` with the *cond* caption mask for t2i, the null class for c2i), mixed on raw logits.
Captions are left-padded: valid features are right-aligned and pad columns are masked as keys (each
position still attends to itself), as in ``sample_t2i``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from adtbench.layout import TokenLayout
from adtbench.models.base import PrefillResult, PromptInputs, Target
from adtbench.models.kv import StaticKVCache
from adtbench.models.llamagen_gpt import LlamaGenGPT
from adtbench.models.rope import Rope, Rope2D


class LlamaGenTarget(Target):
    def __init__(
        self,
        gpt: LlamaGenGPT,
        vq: Any,
        text_encoder: Callable[[str], torch.Tensor] | None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.gpt = gpt.to(device=device, dtype=dtype).eval()
        self.vq = vq.to(device=device).eval() if vq is not None else None
        self.text_encoder = text_encoder
        self.device, self.dtype = torch.device(device), dtype
        c = gpt.cfg
        self.layout = TokenLayout(
            vocab_size=c.vocab_size, image_token_offset=0, num_codes=c.vocab_size, grid_h=c.grid, grid_w=c.grid
        )
        self.hidden_size, self.num_heads, self.num_kv_heads = c.dim, c.n_head, c.kv_heads
        self.head_dim, self.intermediate_size = c.head_dim, c.ffn_hidden
        self.cache: StaticKVCache | None = None

    # --- prompt ------------------------------------------------------------------------------------
    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        c = self.gpt.cfg
        if c.model_type == "c2i":
            try:
                label = int(text)
            except ValueError as e:
                raise ValueError(f"c2i LlamaGen expects an ImageNet class id as the prompt, got {text!r}") from e
            if not 0 <= label < c.num_classes:
                raise ValueError(f"class id {label} outside 0..{c.num_classes - 1}")
            return PromptInputs(text=text, cfg=cfg, data={"label": label})
        if self.text_encoder is None:
            raise RuntimeError("t2i LlamaGen needs a text encoder (model.text_encoder)")
        feats = self.text_encoder(text)[-c.cls_token_num :]
        n = feats.shape[0]
        caption = torch.zeros(c.cls_token_num, c.caption_dim)
        caption[c.cls_token_num - n :] = feats.to(caption.dtype)
        valid = torch.zeros(c.cls_token_num, dtype=torch.bool)
        valid[c.cls_token_num - n :] = True
        return PromptInputs(text=text, cfg=cfg, data={"caption": caption, "valid": valid})

    def prompt_length(self, inputs: PromptInputs) -> int:
        return self.gpt.cfg.cls_token_num

    def _condition(self, inputs: PromptInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Condition embeddings ``[R, P, dim]`` and valid mask ``[R, P]``."""
        c, dev = self.gpt.cfg, self.device
        emb = self.gpt.cls_embedding
        if c.model_type == "c2i":
            labels = [inputs.data["label"]] + ([c.num_classes] if inputs.cfg else [])
            x = emb(torch.tensor(labels, device=dev))[:, None, :]
            return x, torch.ones(len(labels), 1, dtype=torch.bool, device=dev)
        caption = inputs.data["caption"].to(dev, self.dtype)
        rows = [caption] + ([emb.uncond_embedding.to(self.dtype)] if inputs.cfg else [])
        x = emb(torch.stack(rows))
        valid = inputs.data["valid"].to(dev)[None].expand(len(rows), -1).clone()
        return x, valid

    # --- target hooks ------------------------------------------------------------------------------
    def _prefill(self, inputs: PromptInputs, capacity: int) -> PrefillResult:
        x, valid = self._condition(inputs)
        R, P, _ = x.shape
        self.cache = self.gpt.new_cache(R, capacity)
        causal = torch.ones(P, P, dtype=torch.bool, device=self.device).tril()
        eye = torch.eye(P, dtype=torch.bool, device=self.device)
        mask = ((causal[None] & valid[:, None, :]) | eye[None])[:, None]
        pos = torch.arange(P, device=self.device)[None].expand(R, P)
        feats = self.gpt.forward_embeds(x, pos, mask, self.cache, 0)
        return PrefillResult(
            logits=self.gpt.output(feats[:, -1]), features=feats, input_embeds=x, positions=pos, valid=valid
        )

    def _forward(
        self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.cache is not None
        x = self.gpt.tok_embeddings(tokens)[None].expand(self.rows, -1, -1)
        feats = self.gpt.forward_embeds(x, position_ids, mask, self.cache, self.length)
        return self.gpt.output(feats), feats

    def _compact(self, start: int, keep: torch.Tensor) -> None:
        assert self.cache is not None
        self.cache.compact(start, keep)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gpt.tok_embeddings(ids.to(self.device))

    def lm_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.gpt.output(features)

    def drafter_rope(self, head_dim: int) -> Rope:
        c = self.gpt.cfg
        return Rope2D(head_dim, c.grid, c.cls_token_num, c.rope_base)

    @torch.no_grad()
    def decode_image(self, codes: torch.Tensor) -> np.ndarray:
        from adtbench.models.vq_common import to_uint8_images

        if self.vq is None:
            raise RuntimeError("no VQ decoder configured (model.vq)")
        h, w = codes.shape
        pixels = self.vq.decode_codes(codes.reshape(1, -1).to(self.device), h, w)
        return to_uint8_images(pixels.float().cpu())[0]


def _dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        from adtbench.errors import ConfigError

        raise ConfigError("model.dtype", f"unknown dtype {name!r}; choose one of {sorted(table)}")
    return table[name]


def build_target(cfg: Any) -> LlamaGenTarget:
    """Build from a ``model`` config node (see ``conf/model/tiny_llamagen.yaml``).

    ``random_init: true`` draws every weight from ``seed`` (tiny vehicles and cost models); real checkpoints
    are loaded by the LlamaGen checkpoint loader (``model.path``).
    """
    from adtbench.models.llamagen_gpt import GPTConfig
    from adtbench.models.text import HashTextEncoder
    from adtbench.models.vq_llamagen import make_tiny_llamagen_vq

    arch = GPTConfig(**dict(cfg.arch))
    dtype = _dtype(str(cfg.dtype))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(cfg.seed))
        gpt = LlamaGenGPT(arch)
        if arch.model_type == "t2i":
            gpt.cls_embedding.uncond_embedding.normal_(0.0, 1.0)
    vq = make_tiny_llamagen_vq(int(cfg.seed) + 1) if cfg.vq.kind == "tiny" else None
    if vq is not None and vq.config.codebook_size != arch.vocab_size:
        from adtbench.errors import ConfigError

        raise ConfigError("model.vq", f"codebook {vq.config.codebook_size} ≠ GPT vocabulary {arch.vocab_size}")
    text = HashTextEncoder(arch.caption_dim, arch.cls_token_num, int(cfg.seed)) if arch.model_type == "t2i" else None
    return LlamaGenTarget(gpt, vq, text, device=str(cfg.device), dtype=dtype)
