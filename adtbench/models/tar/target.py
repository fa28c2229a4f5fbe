"""Tar (csuhan/Tar-1.5B, Tar-7B) adapter: LM → TA-Tok decode → AR-DTok → LlamaGen VQ-16 → pixels.

Stages (``model.stage`` chooses which one is speculated; the other runs plainly, outside the timed scope):

- ``lm``: the LM (``transformers.Qwen2ForCausalLM`` loaded from the LLaVA-style checkpoint: ``model_type
  llava_qwen``, extra ``mm_*`` fields and vision-tower weights are ignored) generates the TA-Tok codes of the
  ``p × p`` LM grid (``<S0>``: 27×27 = 729, ``<S1>``: 13×13, ``<S2>``: 9×9 — ``p = base_grid // (scale + 1)``).
  Prompt (official ``t2i_inference.py``): the Qwen chat template (system "You are a helpful assistant.",
  user = caption, generation prompt), then ``<im_start>`` and ``<S{scale}>`` — appended as ids from the config
  (``image_start_tag_id``, ``scale_start_token_id + scale``). Image token ``<I{c}>`` = ``image_start_token_id +
  c`` for ``c < num_image_tokens``; all ids are read from ``config.json``. No CFG at the LM level (the target
  reports ``supports_cfg = False``). Deviation from the reference: we restrict the LM to image ids (the
  reference regex-parses ``<I(\\d+)>`` out of free text and pads/truncates). Official LM sampling: T 1.0,
  top-p 0.95, top-k 1200. ``decode_image`` runs TA-Tok decode → AR-DTok (plain AR, ``model.detok_sampling``)
  → VQ.
- ``detok``: the AR de-tokenizer (``tar.ardtok``) is speculated: its condition is the TA-Tok features of the LM
  codes, produced in ``encode_prompt`` by a plain AR run of the LM (``model.lm_sampling``, seeded from
  ``model.seed`` and the prompt) — the path MuLo-SD uses. CFG batched with all-zero uncond features
  (official CFG 4.0). ``decode_image`` = VQ decode of the code grid.

Checkpoint files (``model.*`` keys; relative names are looked up in the LM folder first): ``model.path`` the
LM folder (``config.json``, safetensors, tokenizer), ``model.tatok.path`` ``ta_tok.pth``
(``csuhan/TA-Tok``), ``model.detok.path`` ``ar_dtok_lp_{256,512,1024}px.pth`` (``csuhan/TA-Tok``),
``model.vq.path`` ``vq_ds16_t2i.pt`` (``peizesun/llamagen_t2i``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.base import PlainDecode, PromptInputs
from adtbench.models.hf_causal import HFCausalTarget, common_options
from adtbench.models.tar.ardtok import ARDTokTarget
from adtbench.sampling_params import SamplingParams, build_sampling

SYSTEM_PROMPT = "You are a helpful assistant."
QWEN_CHAT = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
BASE_GRID = 27  # SigLIP2-so400m-patch14-384: 384 / 14 → 27 × 27 tokens at pool scale 1


@dataclass(frozen=True)
class TarIds:
    """Vocabulary extension ids of a Tar checkpoint (``config.json``; ``initialize_vision_tokenizer``)."""

    image_start_tag: int  # <im_start>
    scale_start: int  # <S0>
    image_start: int  # <I0>
    num_image_tokens: int

    @classmethod
    def from_config(cls, config: Any, source: str = "config.json") -> TarIds:
        def need(name: str) -> int:
            v = getattr(config, name, None)
            if v is None:
                raise ConfigError("model.path", f"{source} lacks {name!r} (not a Tar checkpoint?)")
            return int(v)

        start = need("image_start_token_id")
        n = getattr(config, "num_image_tokens", None)
        if n is None:
            n = need("image_end_token_id") - start + 1
        return cls(need("image_start_tag_id"), need("scale_start_token_id"), start, int(n))


class TarLMTarget(HFCausalTarget):
    """Stage ``lm`` (module docstring). ``detok``/``tatok`` are only used by ``decode_image`` and ``codebook``."""

    supports_cfg = False

    def __init__(
        self,
        lm: nn.Module,
        tokenizer: Any,
        scale: int = 0,
        base_grid: int = BASE_GRID,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tatok: Any = None,
        detok: ARDTokTarget | None = None,
        detok_sampling: SamplingParams | None = None,
        seed: int = 0,
        plain_decode: PlainDecode | None = None,
    ) -> None:
        super().__init__(lm, device, dtype, "batched")
        self.plain_decode = plain_decode
        self.ids = TarIds.from_config(lm.config)
        if not 0 <= scale <= 2:
            raise ConfigError("model.scale", f"Tar has scale tokens <S0>..<S2>, got {scale}")
        self.scale, self.tokenizer, self.seed = scale, tokenizer, seed
        p = base_grid // (scale + 1)
        vocab = int(lm.get_output_embeddings().weight.shape[0])
        if self.ids.image_start + self.ids.num_image_tokens > vocab:
            raise ConfigError("model.path", f"image ids end beyond the LM head ({vocab} rows)")
        self.layout = TokenLayout(
            vocab_size=vocab,
            image_token_offset=self.ids.image_start,
            num_codes=self.ids.num_image_tokens,
            grid_h=p,
            grid_w=p,
            special={"image_start_tag": self.ids.image_start_tag, "scale": self.ids.scale_start + scale},
        )
        self.tatok = tatok.to(device=device, dtype=dtype).eval() if tatok is not None else None
        self.detok, self.detok_sampling = detok, detok_sampling or SamplingParams(cfg_scale=4.0)

    def chat_ids(self, text: str) -> list[int]:
        """The Qwen chat prompt (system + user caption + generation prompt) as ids."""
        tok = self.tokenizer
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
        if getattr(tok, "chat_template", None):
            chat = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        else:
            chat = QWEN_CHAT.format(system=SYSTEM_PROMPT, user=text)
        return list(tok(chat, add_special_tokens=False)["input_ids"])

    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        """One row ``chat(text) + [<im_start>, <S{scale}>]`` (no CFG at the LM level: ``cfg`` is ignored)."""
        ids = torch.tensor([[*self.chat_ids(text), self.ids.image_start_tag, self.ids.scale_start + self.scale]])
        valid = torch.ones_like(ids, dtype=torch.bool)
        pos = torch.arange(ids.shape[1])[None]
        return PromptInputs(text=text, cfg=False, data={"ids": ids, "valid": valid, "positions": pos})

    def codebook(self) -> torch.Tensor:
        """TA-Tok's effective codebook ``get_emb()`` (code c ↔ LM token ``<I{c}>``)."""
        if self.tatok is None:
            raise RuntimeError("no TA-Tok decoder configured (model.tatok)")
        with torch.no_grad():
            return self.tatok.codebook()

    def features(self, codes: torch.Tensor) -> torch.Tensor:
        """TA-Tok codes ``[p, p]`` (or ``[p·p]``) → AR-DTok condition features ``[p·p, H]``."""
        if self.tatok is None:
            raise RuntimeError("no TA-Tok decoder configured (model.tatok)")
        return self.tatok.decode(codes.reshape(1, -1).to(self.device))[0]

    def generate_codes(self, text: str, sp: SamplingParams, decode: PlainDecode | None = None) -> torch.Tensor:
        """Plain AR LM run (``decode``, else ``plain_decode``) → TA-Tok code grid ``[p, p]`` (seeded from ``seed`` and
        ``text``)."""
        decode = decode or self.plain_decoder()
        g = torch.Generator(device=self.device).manual_seed(self.seed ^ zlib.crc32(text.encode()))
        return self.layout.tokens_to_codes(decode(self, self.encode_prompt(text, False), sp, g))

    @torch.no_grad()
    def decode_image(self, codes: torch.Tensor) -> np.ndarray:
        """TA-Tok decode → AR-DTok (plain AR, ``detok_sampling``) → VQ-16 → uint8 ``[H, W, 3]``."""
        if self.detok is None:
            raise RuntimeError("no AR-DTok de-tokenizer configured (model.detok)")
        decode = self.plain_decoder()
        feats = self.features(codes)
        sp = self.detok_sampling
        inputs = self.detok.encode_features("", feats, sp.use_cfg)
        g = torch.Generator(device=self.detok.device).manual_seed(self.seed)
        tokens = decode(self.detok, inputs, sp, g)
        return self.detok.decode_image(self.detok.layout.tokens_to_codes(tokens))


def _sampling(node: Any, default: SamplingParams, key: str) -> SamplingParams:
    """``model.lm_sampling`` / ``model.detok_sampling``: ``default`` overridden by the node's entries, validated by
    ``sampling_params.build_sampling`` (the app's own ``sampling`` rules); errors name ``<key>.<field>``."""
    from adtbench.models.registry import plain

    fields = ("temperature", "top_k", "top_p", "cfg_scale")
    d = {f: getattr(default, f) for f in fields} | (plain(node) or {})
    return build_sampling({f: d[f] for f in fields}, key)


OFFICIAL_LM_SAMPLING = SamplingParams(temperature=1.0, top_k=1200, top_p=0.95, cfg_scale=1.0)
OFFICIAL_DETOK_SAMPLING = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, cfg_scale=4.0)


def build_target(cfg: Any, plain_decode: PlainDecode | None = None) -> TarLMTarget | ARDTokTarget:
    """Build the stage ``model.stage`` (``lm`` | ``detok``) from ``conf/model/tar.yaml`` (module docstring). The other
    stage runs through ``plain_decode`` (``algorithm.ar.ar_tokens``; the registry hands it over): the LM stage's
    ``decode_image`` and the AR-DTok stage's ``encode_prompt`` call it, and raise without it."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from adtbench.models.llamagen.vq import LlamaGenVQConfig, load_llamagen_vq
    from adtbench.models.registry import get, plain, resolve_dir, resolve_file
    from adtbench.models.tar.ardtok import load_ardtok
    from adtbench.models.tar.tatok import load_tatok

    stage = str(get(cfg, "stage", "lm"))
    if stage not in ("lm", "detok"):
        raise ConfigError("model.stage", f"choose lm (speculate the LM) or detok (speculate AR-DTok), got {stage!r}")
    if bool(get(cfg, "random_init", False)):
        raise ConfigError("model.random_init", "tar has no random_init; write a tiny checkpoint with make-tiny")
    device, dtype, attn, seed = common_options(cfg)
    scale = int(get(cfg, "scale", 0))
    # every path first (cheap), then the weights
    base = resolve_dir("model.path", get(cfg, "path"), ["config.json", "*.safetensors"])
    tok_dir = resolve_dir("model.tokenizer", get(cfg, "tokenizer", str(base)), ["tokenizer*.json"], base)
    tatok_file = str(get(cfg, "tatok.file", "ta_tok.pth"))
    tatok_path = resolve_file("model.tatok.path", get(cfg, "tatok.path", tatok_file), tatok_file, base, tatok_file)
    detok_file = str(get(cfg, "detok.file", "ar_dtok_lp_256px.pth"))
    detok_path = resolve_file("model.detok.path", get(cfg, "detok.path", detok_file), detok_file, base, detok_file)
    vq_file = str(get(cfg, "vq.file", "vq_ds16_t2i.pt"))
    vq_path = resolve_file("model.vq.path", get(cfg, "vq.path", vq_file), f"{vq_file} (VQ-16)", base, vq_file)
    from adtbench.io import check_weights

    for shard in sorted(base.glob("*.safetensors")):  # truncated shards: ConfigError naming the file, up front
        check_weights("model.path", shard)
    for key, file in (("model.tatok.path", tatok_path), ("model.detok.path", detok_path), ("model.vq.path", vq_path)):
        check_weights(key, file)

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "llava_qwen → qwen2" is expected: the LLaVA-style config loads as Qwen2
    try:
        lm = Qwen2ForCausalLM.from_pretrained(str(base), dtype=dtype, attn_implementation=attn)
    finally:
        hf_logging.set_verbosity(level)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    try:
        tatok = load_tatok(tatok_path, plain(get(cfg, "tatok.decoder_config", None)))
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError("model.tatok.path", str(e)) from e
    try:
        ardtok = load_ardtok(detok_path)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError("model.detok.path", str(e)) from e
    try:
        vq = load_llamagen_vq(vq_path, LlamaGenVQConfig(**(plain(get(cfg, "vq.config", None)) or {})))
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise ConfigError("model.vq.path", str(e)) from e
    base_grid = int(get(cfg, "base_grid", BASE_GRID))
    p = base_grid // (scale + 1)
    if ardtok.cfg.cls_token_num != p * p:  # official scripts set cls_token_num = gen_seq_len
        ardtok.cfg.cls_token_num = p * p
        if ardtok.abs_pe.shape[1] < p * p + ardtok.cfg.max_seq_len - 1:
            raise ConfigError("model.scale", f"AR-DTok position table too short for a {p}×{p} condition")
    if ardtok.cfg.cond_dim != tatok.hidden:
        raise ConfigError("model.detok.path", f"AR-DTok cond_dim {ardtok.cfg.cond_dim} ≠ TA-Tok width {tatok.hidden}")
    detok_sp = _sampling(get(cfg, "detok_sampling"), OFFICIAL_DETOK_SAMPLING, "model.detok_sampling")
    lm_sp = _sampling(get(cfg, "lm_sampling"), OFFICIAL_LM_SAMPLING, "model.lm_sampling")
    detok = ARDTokTarget(ardtok, vq, None, device=device, dtype=dtype)
    lm_target = TarLMTarget(lm, tokenizer, scale, base_grid, device, dtype, tatok, detok, detok_sp, seed, plain_decode)
    if tatok.codebook_size != lm_target.ids.num_image_tokens:
        raise ConfigError(
            "model.tatok.path", f"TA-Tok codebook {tatok.codebook_size} ≠ {lm_target.ids.num_image_tokens} LM image ids"
        )
    if stage == "lm":
        return lm_target

    def feature_source(text: str) -> torch.Tensor:
        return lm_target.features(lm_target.generate_codes(text, lm_sp, detok.plain_decoder()))

    detok.plain_decode, detok.feature_source = plain_decode, feature_source
    detok.lm_target = lm_target  # type: ignore[attr-defined]  # kept for inspection (codes of the LM pass)
    return detok


__all__ = ["OFFICIAL_DETOK_SAMPLING", "OFFICIAL_LM_SAMPLING", "TarIds", "TarLMTarget", "build_target"]
