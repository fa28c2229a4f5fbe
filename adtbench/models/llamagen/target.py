"""LlamaGen adapter: the in-project GPT + VQ-16 decoder behind the ``Target`` interface.

Sequence layout: ``cls_token_num`` condition positions (caption features projected by ``cap_proj``,
or one class embedding), then the image tokens; image token k sits at position ``cls_token_num + k``.
Token id = VQ code (no offset, no special tokens). CFG is batched: row 0 cond, row 1 uncond (the learned
``uncond_embedding`` with the *cond* caption mask for t2i, the null class for c2i), mixed on raw logits.
Captions are left-padded: valid features are right-aligned and pad columns are masked as keys (each
position still attends to itself), as in ``sample_t2i``. c2i prompts are ImageNet class ids (a prompt that
starts with an integer, e.g. ``"207"`` or ``"207 golden retriever"``).

Drafter positions (``drafter_cls_shift``): drafter slot t holds ``(f_t, x_{t+1})``. With shift 0 its 2-D RoPE
uses the grid cell of position t (zero rotation on the condition prefix); with shift 1 (LANTERN's drafters,
``cnets_llamagen``: ``cls_token_num`` 119 for t2i, 0 for c2i) it uses the grid cell of the input token
``x_{t+1}``. Converted LANTERN drafters need shift 1 (``drafter_rope: lantern`` in the model yaml).

Official sampling: ``sample_t2i.py`` (GPT-XL, 512 px) CFG 7.5, top-k 1000, top-p 1.0, T 1.0;
``sample_c2i.py`` (GPT-B, 384 px) CFG 4.0, top-k 2000, top-p 1.0, T 1.0; bf16.

Loading (``build_target``): ``model.path`` is the GPT checkpoint file (or the folder / hub repo holding
``model.checkpoint``), or a LANTERN HF folder (``checkpoint: null``); ``model.vq`` the VQ-16 checkpoint
(``vq_ds16_t2i.pt`` / ``vq_ds16_c2i.pt``); ``model.text_encoder`` the FLAN-T5 folder (t2i). Relative
companion paths are looked up next to the GPT checkpoint first (``registry`` conventions).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from adtbench.layout import TokenLayout
from adtbench.models.base import PrefillResult, PromptInputs, StaticGPTTarget
from adtbench.models.kv import StaticKVCache
from adtbench.models.llamagen.gpt import LlamaGenGPT
from adtbench.models.rope import Rope, Rope2D


class LlamaGenTarget(StaticGPTTarget):
    def __init__(
        self,
        gpt: LlamaGenGPT,
        vq: Any,
        text_encoder: Callable[[str], torch.Tensor] | None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        drafter_cls_shift: int = 0,
    ) -> None:
        super().__init__()
        if drafter_cls_shift not in (0, 1):
            raise ValueError(f"drafter_cls_shift must be 0 or 1, got {drafter_cls_shift}")
        self.drafter_cls_shift = drafter_cls_shift
        self.gpt = self.net = gpt.to(device=device, dtype=dtype).eval()
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
            m = re.match(r"\s*(\d+)", text)
            if m is None:
                raise ValueError(f"c2i LlamaGen expects an ImageNet class id as the prompt, got {text!r}")
            label = int(m.group(1))
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
        self.cache = self.kv_cache(R, capacity)
        causal = torch.ones(P, P, dtype=torch.bool, device=self.device).tril()
        eye = torch.eye(P, dtype=torch.bool, device=self.device)
        mask = ((causal[None] & valid[:, None, :]) | eye[None])[:, None]
        pos = torch.arange(P, device=self.device)[None].expand(R, P)
        feats = self.gpt.forward_embeds(x, pos, mask, self.cache, 0)
        return PrefillResult(
            logits=self.gpt.output(feats[:, -1]), features=feats, input_embeds=x, positions=pos, valid=valid
        )

    def drafter_rope(self, head_dim: int) -> Rope:
        c = self.gpt.cfg
        return Rope2D(head_dim, c.grid, c.cls_token_num - self.drafter_cls_shift, c.rope_base)


DRAFTER_ROPE = {"feature": 0, "lantern": 1}


def build_target(cfg: Any) -> LlamaGenTarget:
    """Build from a ``model`` config node (``conf/model/llamagen_{t2i,c2i}.yaml``, ``tiny_llamagen.yaml``).

    ``random_init: true`` draws every weight from ``seed`` (tiny vehicles and cost models, ``model.arch`` or the
    ``gpt_model`` preset); otherwise the checkpoint at ``model.path`` is loaded (module docstring). Every path
    is checked before any weights are read.
    """
    from adtbench.errors import ConfigError
    from adtbench.models.llamagen.gpt import load_gpt, load_gpt_state_dict
    from adtbench.models.registry import get, resolve_device, resolve_dtype

    device = resolve_device(get(cfg, "device", "cpu"))
    dtype = resolve_dtype(get(cfg, "dtype", "auto"), device)
    rope = str(get(cfg, "drafter_rope", "feature"))
    if rope not in DRAFTER_ROPE:
        raise ConfigError("model.drafter_rope", f"unknown convention {rope!r}; choose one of {sorted(DRAFTER_ROPE)}")
    seed = int(get(cfg, "seed", 0))
    if bool(get(cfg, "random_init", False)):
        arch = _arch(cfg)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            gpt = LlamaGenGPT(arch)
            if arch.model_type == "t2i":
                gpt.cls_embedding.uncond_embedding.normal_(0.0, 1.0)
        # random weights: a checkpoint VQ / T5 makes no sense; keep only the tiny random VQ and hash captions
        vq = _vq(cfg, arch, None) if str(get(cfg, "vq.kind", "none")) == "tiny" else None
        text = None
        if arch.model_type == "t2i":
            from adtbench.models.text import HashTextEncoder

            text = HashTextEncoder(arch.caption_dim, arch.cls_token_num, seed)
        return LlamaGenTarget(gpt, vq, text, device=device, dtype=dtype, drafter_cls_shift=DRAFTER_ROPE[rope])
    ckpt = _checkpoint(cfg)
    base = ckpt if ckpt.is_dir() else ckpt.parent
    # validate the companions' paths first (cheap), then read the GPT weights
    _vq_path(cfg, base)
    try:
        sd, lantern = load_gpt_state_dict(ckpt)
        arch = lantern if lantern is not None else _arch(cfg)
        gpt = load_gpt(sd, arch, str(ckpt))
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError("model.path", str(e)) from e
    vq = _vq(cfg, arch, base)
    text = _text_encoder(cfg, arch, base, device, dtype)
    return LlamaGenTarget(gpt, vq, text, device=device, dtype=dtype, drafter_cls_shift=DRAFTER_ROPE[rope])


def _arch(cfg: Any) -> Any:
    """``GPTConfig`` from ``gpt_model`` (preset) + ``image_size`` (→ ``block_size``) + ``arch`` overrides."""
    from adtbench.errors import ConfigError
    from adtbench.models.llamagen.gpt import GPTConfig, gpt_config_fields, preset_config
    from adtbench.models.registry import get, plain

    arch = dict(plain(get(cfg, "arch", None)) or {})
    unknown = sorted(set(arch) - gpt_config_fields())
    if unknown:
        raise ConfigError("model.arch", f"unknown GPTConfig fields {unknown}")
    size = get(cfg, "image_size")
    if size is not None and "block_size" not in arch:
        if int(size) % 16:
            raise ConfigError("model.image_size", f"must be a multiple of 16 (VQ-16), got {size}")
        arch["block_size"] = (int(size) // 16) ** 2
    name = get(cfg, "gpt_model")
    try:
        return preset_config(str(name), **arch) if name is not None else GPTConfig(**arch)
    except ValueError as e:
        raise ConfigError("model.gpt_model" if name is not None else "model.arch", str(e)) from e


def _checkpoint(cfg: Any) -> Path:
    """The GPT checkpoint: a file, a folder holding ``model.checkpoint``, a LANTERN HF folder, or a hub repo."""
    from adtbench.models.registry import get, resolve_dir, resolve_file

    path, name = get(cfg, "path"), get(cfg, "checkpoint")
    if path is not None and Path(str(path)).expanduser().is_file():
        return Path(str(path)).expanduser()
    if name is None:  # LANTERN HF layout
        return resolve_dir("model.path", path, ["config.json"])
    return resolve_file("model.path", path, f"the LlamaGen GPT checkpoint {name}", repo_file=str(name))


def _vq_path(cfg: Any, base: Path | None) -> Path | None:
    from adtbench.models.registry import get, resolve_file

    if str(get(cfg, "vq.kind", "none")) != "llamagen":
        return None
    file = str(get(cfg, "vq.file", "vq_ds16_t2i.pt"))
    return resolve_file("model.vq.path", get(cfg, "vq.path", file), f"{file} (LlamaGen VQ-16)", base, file)


def _vq(cfg: Any, arch: Any, base: Path | None) -> Any:
    """``model.vq.kind``: ``llamagen`` (checkpoint), ``tiny`` (random, seed + 1) or ``none``."""
    from adtbench.errors import ConfigError
    from adtbench.models.llamagen.vq import LlamaGenVQConfig, load_llamagen_vq, make_tiny_llamagen_vq
    from adtbench.models.registry import get, plain

    kind = str(get(cfg, "vq.kind", "none"))
    if kind == "none":
        return None
    if kind == "tiny":
        vq = make_tiny_llamagen_vq(int(get(cfg, "seed", 0)) + 1)
    elif kind == "llamagen":
        path = _vq_path(cfg, base)
        try:
            vq = load_llamagen_vq(path, LlamaGenVQConfig(**(plain(get(cfg, "vq.config", None)) or {})))
        except (ValueError, TypeError, FileNotFoundError) as e:
            raise ConfigError("model.vq.path", str(e)) from e
    else:
        raise ConfigError("model.vq.kind", f"unknown VQ kind {kind!r}; choose llamagen, tiny or none")
    if vq.config.codebook_size != arch.vocab_size:
        raise ConfigError("model.vq", f"codebook {vq.config.codebook_size} ≠ GPT vocabulary {arch.vocab_size}")
    return vq


def _text_encoder(cfg: Any, arch: Any, base: Path | None, device: torch.device, dtype: torch.dtype) -> Any:
    """t2i caption features: ``text_encoder.kind`` ``t5`` (FLAN-T5 folder) or ``hash`` (tiny stand-in)."""
    from adtbench.errors import ConfigError
    from adtbench.models.registry import get, resolve_dir, resolve_dtype
    from adtbench.models.text import HashTextEncoder

    if arch.model_type != "t2i":
        return None
    kind = str(get(cfg, "text_encoder.kind", "hash"))
    if kind == "hash":
        return HashTextEncoder(arch.caption_dim, arch.cls_token_num, int(get(cfg, "seed", 0)))
    if kind != "t5":
        raise ConfigError("model.text_encoder.kind", f"unknown text encoder {kind!r}; choose t5 or hash")
    from adtbench.models.t5 import T5CaptionEncoder

    path = resolve_dir(
        "model.text_encoder.path", get(cfg, "text_encoder.path"), ["config.json", "tokenizer*.json"], base
    )
    t_dtype = resolve_dtype(get(cfg, "text_encoder.dtype", "auto"), device, "model.text_encoder.dtype")
    from adtbench.io import check_weights

    for f in sorted(path.glob("*.safetensors")):  # a truncated file: ConfigError naming key and file
        check_weights("model.text_encoder.path", f)
    enc = T5CaptionEncoder(path, int(get(cfg, "text_encoder.max_length", arch.cls_token_num)), device, t_dtype)
    if enc.dim != arch.caption_dim:
        raise ConfigError("model.text_encoder", f"T5 width {enc.dim} ≠ GPT caption_dim {arch.caption_dim}")
    return enc
