"""Emu3-Gen adapter (``BAAI/Emu3-Gen-hf``, transformers 4.57 ``Emu3ForConditionalGeneration``): vocabulary, token
layout, prompt rows with the negative prompt, the VQ-VAE decoder, the lean (default) and HF targets, the builder.

Vocabulary (``config.json``'s ``vocabulary_map``, transformers' ``Emu3ImageVocabularyMapping``): image tokens are
ordinary ids of the full vocabulary, named ``<|visual token NNNNNN|>`` (NNNNNN the decimal VQ code); their ids are
derived from the map and asserted contiguous, ``id = code + image_token_offset`` (Emu3-Gen: 32,768 codes at
151,854 … 184,621 of 184,622). Named specials: BOS ``<|extra_203|>``, EOS ``<|extra_204|>``, pad
``<|endoftext|>``, image start ``<|image start|>``, image end ``<|image end|>``, image wrapper ``<|image token|>``,
end-of-line ``<|extra_200|>``, end-of-frame ``<|extra_201|>`` — every one looked up by name and required.

Token layout (``TokenLayout``; the grid is ``model.grid``, so tiny checkpoints use small grids): ``grid_h`` rows of
``grid_w`` image tokens each followed by the end-of-line ``<|extra_200|>``, then the end-of-frame ``<|extra_201|>``
(the layout's ``eoi_token``): 90 × 91 + 1 = 8,191 generated tokens at 720² (``Emu3ForConditionalGeneration``'s
``decode_image_tokens`` reads the first 8,190, dropping EOF, image end and EOS). Both forced tokens are forced by the
constraint, as BAAI's ``prefix_allowed_tokens_fn`` forces them; the image end and EOS that follow EOF in BAAI's
sequence carry no image information and are not generated (each would cost a forward and change no pixel).

Prompt rows (``Emu3Processor(return_for_image_generation=True)``): cond
``[BOS] + tok(prompt + model.prompt_suffix) + [<|image start|>] + tok("{h}*{w}") + [<|image token|>]``; uncond the
same with ``model.negative_prompt`` in place of the prompt (BAAI's recipe: the positive suffix
" masterpiece, film grained, best quality." and its negative prompt, ``conf/model/emu3.yaml``). The two rows are
left-padded with ``<|endoftext|>`` to one length (pad columns never attended, positions counting real tokens only), so
each row's function is that of its own unpadded forward — transformers' separate unconditional forward with its own
cache (``UnbatchedClassifierFreeGuidanceLogitsProcessor``). The mix there is on log-softmaxes, ``u' + s·(c' − u')``;
``process_logits`` mixes raw logits, which differ from those by one constant per row: the same distribution and the
same argmax after the constraint.

``model.impl``: ``lean`` (default) → ``LeanEmu3Target``, ``emu3.lean.Emu3LM`` on the lean stack with one static KV
cache (its CFG rows run batched whatever ``cfg_mode`` says: static buckets, CUDA graphs, batching); ``hf`` →
``Emu3Target``, transformers' ``Emu3TextModel`` + ``lm_head`` through ``hf_causal.HFCausalTarget`` (``cfg_mode``
``sequential`` by default: the reference's separate unconditional forward), the reference the lean path is tested
against and ``timing.reference_baseline``'s.

Images: ``Emu3VQDecoder`` wraps transformers' ``Emu3VQVAE`` (the checkpoint's ``vqmodel.*``): codes ``[h, w]`` →
codebook embedding → ``post_quant_conv`` → decoder, spatial ×8 (720 px from 90 codes), ``[-1, 1]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adtbench.errors import ConfigError
from adtbench.layout import TokenLayout
from adtbench.models.base import PromptInputs
from adtbench.models.chameleon.target import LeanChameleonTarget
from adtbench.models.hf_causal import CFG_MODES, HFCausalTarget, common_options, spread_init_
from adtbench.models.rows import prompt_rows

VISUAL_PREFIX, VISUAL_SUFFIX = "<|visual token ", "|>"
SPECIAL_NAMES: dict[str, str] = {
    "pad": "<|endoftext|>",
    "bos": "<|extra_203|>",
    "eos": "<|extra_204|>",
    "boi": "<|image start|>",
    "eoi": "<|image end|>",
    "img": "<|image token|>",
    "eol": "<|extra_200|>",
    "eof": "<|extra_201|>",
}
NUM_EXTRAS = 205  # <|extra_0|> … <|extra_204|> (Qwen's reserved specials)
SPECIALS_AFTER_TEXT = 3 + NUM_EXTRAS + 3  # endoftext, im_start, im_end, the extras, image start / end / token
SPATIAL = 8  # Emu3VQVAE's spatial factor: 2^(len(channel_multiplier) − 1)


# ---------------------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------------------


def visual_token_name(code: int) -> str:
    """VQ code → its vocabulary name: 12 → ``<|visual token 000012|>``."""
    return f"{VISUAL_PREFIX}{code:06d}{VISUAL_SUFFIX}"


def image_token_range(vocab_map: Mapping[str, int]) -> tuple[int, int]:
    """``(image_token_offset, num_codes)`` of an Emu3 ``vocabulary_map``: codes ``0 … K−1`` (the six digits of
    ``<|visual token NNNNNN|>``, as ``Emu3ImageVocabularyMapping.img2bpe`` reads them) with ``id = code + offset``
    for every one. ValueError naming the offending entries otherwise."""
    ids: dict[int, int] = {}
    for name, idx in vocab_map.items():
        if name.startswith(VISUAL_PREFIX):
            ids[int(name[-8:-2])] = int(idx)
    if not ids:
        raise ValueError("vocabulary map has no <|visual token NNNNNN|> image tokens")
    k = len(ids)
    if sorted(ids) != list(range(k)):
        raise ValueError(f"visual token codes are not 0..{k - 1}")
    offset = ids[0]
    bad = [(c, i) for c, i in sorted(ids.items()) if i != c + offset]
    if bad:
        raise ValueError(f"visual token ids are not contiguous (id = code + {offset}); first (code, id): {bad[:5]}")
    return offset, k


def special_token_ids(vocab_map: Mapping[str, int]) -> dict[str, int]:
    """Ids of ``SPECIAL_NAMES`` in ``vocab_map``; every one is required (ValueError naming the missing)."""
    missing = [n for n in SPECIAL_NAMES.values() if n not in vocab_map]
    if missing:
        raise ValueError(f"vocabulary map lacks Emu3 special tokens {missing}")
    return {key: int(vocab_map[name]) for key, name in SPECIAL_NAMES.items()}


def emu3_vocabulary_map(text_tokens: list[str] | int, num_codes: int) -> dict[str, int]:
    """A vocabulary map in Emu3's order: the text tokens (names, or ``n`` stand-in names ``<|text NNNNNN|>``) at
    ``0 … T−1``, ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<|extra_0|>`` … ``<|extra_204|>``,
    ``<|image start|>``, ``<|image end|>``, ``<|image token|>``, then the ``num_codes`` visual tokens. Emu3-Gen's is
    T = 151,643 and K = 32,768: 184,622 ids, visual tokens from 151,854 (``random_init``'s full-shape map)."""
    names = [f"<|text {i:06d}|>" for i in range(text_tokens)] if isinstance(text_tokens, int) else list(text_tokens)
    names += ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(NUM_EXTRAS))]
    names += ["<|image start|>", "<|image end|>", "<|image token|>"]
    names += [visual_token_name(c) for c in range(num_codes)]
    if len(set(names)) != len(names):
        raise ValueError("duplicate names in the Emu3 vocabulary")
    return {name: i for i, name in enumerate(names)}


class Emu3VQDecoder(nn.Module):
    """transformers' ``Emu3VQVAE`` behind the interface ``Target.decode_image`` / ``codebook`` use:
    ``decode_codes(codes [B, h·w], h, w)`` → pixels ``[B, 3, 8h, 8w]`` in ``[-1, 1]``, ``codebook()`` ``[K, d]``,
    ``codebook_size``."""

    def __init__(self, vqvae: Any) -> None:
        super().__init__()
        self.vqvae: Any = vqvae.eval()
        self.codebook_size = int(vqvae.config.codebook_size)

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        pixels: torch.Tensor = self.vqvae.decode(codes.reshape(-1, h, w).long())
        return pixels

    def codebook(self) -> torch.Tensor:
        weight: torch.Tensor = self.vqvae.quantize.embedding.weight.detach()
        return weight


# ---------------------------------------------------------------------------------------------------------
# Vocabulary, layout and prompt rows shared by both targets
# ---------------------------------------------------------------------------------------------------------


class Emu3Vocab:
    """Emu3's layout, prompt rows and image decoding (module docstring): the mixin before both targets' network base
    class. ``_init_vocab`` sets ``vq``, ``tokenizer``, ``special`` and ``layout``; the prompt texts
    (``prompt_suffix``, ``negative_prompt``: ``model.*``) are set by the builder, empty by default."""

    layout: TokenLayout
    special: dict[str, int]
    tokenizer: Any
    vq: Any
    prompt_suffix: str = ""
    negative_prompt: str = ""

    def _init_vocab(self, config: Any, vq: Any, tokenizer: Any, grid: tuple[int, int], device: Any) -> None:
        self.vq = vq.to(device=device).eval() if vq is not None else None
        self.tokenizer = tokenizer
        try:
            offset, k = image_token_range(config.vocabulary_map)
            self.special = special_token_ids(config.vocabulary_map)
        except ValueError as e:
            raise ConfigError("model.path", f"config.json's vocabulary_map: {e}") from e
        if self.vq is not None and self.vq.codebook_size != k:
            raise ConfigError("model.vq", f"VQ codebook {self.vq.codebook_size} ≠ {k} image tokens in the vocabulary")
        sp = self.special
        self.layout = TokenLayout(
            vocab_size=int(config.text_config.vocab_size),
            image_token_offset=offset,
            num_codes=k,
            grid_h=int(grid[0]),
            grid_w=int(grid[1]),
            eol_token=sp["eol"],
            eoi_token=sp["eof"],
            special=dict(sp),
        )

    def prompt_row(self, text: str) -> list[int]:
        """``[BOS] + tok(text) + [<|image start|>] + tok("{h}*{w}") + [<|image token|>]`` (``Emu3Processor``)."""
        sp, lay = self.special, self.layout
        return [sp["bos"], *self.tokenizer(text), sp["boi"], *self.tokenizer(f"{lay.grid_h}*{lay.grid_w}"), sp["img"]]

    def encode_prompt(self, text: str, cfg: bool) -> PromptInputs:
        """Cond row (prompt + suffix) and, under CFG, the negative-prompt row, both left-padded to one length
        (``rows.prompt_rows``)."""
        uncond = self.prompt_row(self.negative_prompt) if cfg else []
        return prompt_rows(text, cfg, self.prompt_row(text + self.prompt_suffix), uncond, self.special["pad"])

    def prompt_length(self, inputs: PromptInputs) -> int:
        return int(inputs.data["ids"].shape[1])


class LeanEmu3Target(Emu3Vocab, LeanChameleonTarget):
    """Emu3-Gen on the lean stack (``model.impl: lean``, the default): ``LeanChameleonTarget``'s static-cache
    machinery (prefill, tree verification, static buckets, CUDA graphs, batching, compaction) over
    ``emu3.lean.Emu3LM``, with Emu3's layout and prompt rows. The LM head is computed over the rows from the
    end-of-line token to the last visual token only (``StaticGPTTarget.logits_head``)."""

    default_cfg_mode = "sequential"


class _TextLM(nn.Module):
    """transformers' Emu3 text model and head as the ``.model`` + ``.lm_head`` + ``.config`` ``HFCausalTarget``
    drives (``Emu3ForConditionalGeneration.model`` is the multimodal wrapper, without ``embed_tokens``)."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        inner: Any = lm.model
        self.model = inner.text_model if hasattr(inner, "text_model") else inner
        self.lm_head = lm.lm_head
        self.config = self.model.config


class Emu3Target(Emu3Vocab, HFCausalTarget):
    """Emu3-Gen on transformers (``model.impl: hf``, the reference): ``lm`` an ``Emu3ForConditionalGeneration`` or
    ``Emu3ForCausalLM`` (its text model and ``lm_head`` are driven), ``config`` the ``Emu3Config`` (vocabulary).
    ``cfg_mode``: ``sequential`` (default, transformers' separate unconditional forward) or ``batched``."""

    def __init__(
        self,
        lm: nn.Module,
        config: Any,
        vq: Any,
        tokenizer: Any,
        grid: tuple[int, int],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        cfg_mode: str | None = None,
    ) -> None:
        super().__init__(_TextLM(lm), device, dtype, cfg_mode or "sequential")
        self._init_vocab(config, vq, tokenizer, grid, device)

    def drafter_rope(self, head_dim: int) -> Any:
        from adtbench.models.rope import Rope1D

        return Rope1D(head_dim, theta=self.rope_theta)


# ---------------------------------------------------------------------------------------------------------
# Building from config
# ---------------------------------------------------------------------------------------------------------


def tiny_vq_config(num_codes: int) -> dict[str, Any]:
    """A tiny ``Emu3VQVAEConfig`` (spatial ×8 as the real one, channels a multiple of GroupNorm's 32)."""
    return {
        "codebook_size": num_codes,
        "embed_dim": 4,
        "latent_channels": 4,
        "base_channels": 32,
        "channel_multiplier": [1, 1, 1, 1],
        "num_res_blocks": 1,
        "attn_resolutions": [3],
        "hidden_size": 32,
        "temporal_downsample_factor": 4,
    }


def random_vq(vq_config: Any, seed: int) -> Emu3VQDecoder:
    """A seeded random ``Emu3VQVAE`` of ``vq_config`` (an ``Emu3VQVAEConfig`` or its fields)."""
    from transformers import Emu3VQVAE, Emu3VQVAEConfig

    conf = vq_config if isinstance(vq_config, Emu3VQVAEConfig) else Emu3VQVAEConfig(**vq_config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Emu3VQDecoder(Emu3VQVAE(conf))


def load_emu3_vq(path: Path, config: Any, files: list[Path], key: str = "model.vq") -> Emu3VQDecoder:
    """The checkpoint's ``Emu3VQVAE`` (``vqmodel.*`` / ``model.vqmodel.*`` tensors, ``config.vq_config``); a
    missing or misshapen tensor is a ``ConfigError`` on ``key``."""
    from safetensors import safe_open
    from transformers import Emu3VQVAE

    from adtbench.models.emu3.lean import canonical_key

    sd: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118
                c = canonical_key(k)
                if c.startswith("vq."):
                    sd[c[3:]] = h.get_tensor(k)
    with torch.device("meta"):
        vqvae = Emu3VQVAE(config.vq_config)
    own = vqvae.state_dict()
    missing = [k for k in own if k not in sd]
    bad = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or bad:
        raise ConfigError(key, f"{path}: the VQ-VAE (vqmodel.*) does not match vq_config; missing {missing[:4]}, "
                          f"shapes {bad[:4]}")  # fmt: skip
    vqvae.load_state_dict(sd, strict=False, assign=True)
    return Emu3VQDecoder(vqvae.float())


def make_tokenizer(cfg: Any, config: Any, base: Path | None) -> Any:
    """``model.tokenizer``: a tokenizer folder / hub id (``AutoTokenizer``: the checkpoint's byte-level BPE), or
    ``hash`` (a word-hash stand-in over the text ids ``0 … <|endoftext|> − 1``; ``random_init`` uses it unless the
    value is a local folder)."""
    from adtbench.models.hf_checkpoint import HashTokenizer, HFTokenizer
    from adtbench.models.registry import get, resolve_dir

    kind = str(get(cfg, "tokenizer", "hash"))
    if bool(get(cfg, "random_init", False)) and not Path(kind).expanduser().is_dir():
        kind = "hash"
    if kind != "hash":
        return HFTokenizer(resolve_dir("model.tokenizer", kind, ["tokenizer*.json"], base))
    hi = int(config.vocabulary_map[SPECIAL_NAMES["pad"]])
    return HashTokenizer(0, hi, int(get(cfg, "max_text_tokens", 16)))


def random_emu3(cfg: Any) -> tuple[nn.Module, Any]:
    """A seeded random ``Emu3ForCausalLM`` from ``model.arch`` (``Emu3TextConfig`` fields plus ``num_codes``) and the
    ``Emu3Config`` holding its vocabulary map (``emu3_vocabulary_map``: the text ids are what the arch leaves);
    built on ``model.device``, cast to ``model.dtype``."""
    from transformers import Emu3Config, Emu3ForCausalLM, Emu3TextConfig

    from adtbench.models.registry import get, plain

    device, dtype, attn, seed = common_options(cfg)
    arch = dict(plain(get(cfg, "arch", None)) or {})
    k = int(arch.pop("num_codes", 64))
    text = int(arch["vocab_size"]) - SPECIALS_AFTER_TEXT - k
    if text < 1:
        raise ConfigError("model.arch.vocab_size", f"{arch['vocab_size']} leaves no text ids beside {k} codes")
    vm = emu3_vocabulary_map(text, k)
    text_config = Emu3TextConfig(
        **arch, pad_token_id=vm["<|endoftext|>"], bos_token_id=vm["<|extra_203|>"], eos_token_id=vm["<|extra_204|>"]
    )
    text_config._attn_implementation = attn
    config = Emu3Config(text_config=text_config.to_dict(), vq_config=tiny_vq_config(k), vocabulary_map=vm)  # type: ignore[arg-type]
    config.text_config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        lm = Emu3ForCausalLM(config.text_config)
    spread_init_(lm, seed, float(get(cfg, "head_std", 2.0)))
    return lm.to(dtype).eval(), config  # type: ignore[arg-type]


def build_target(cfg: Any) -> LeanEmu3Target | Emu3Target:
    """Build from a ``model`` node (``conf/model/emu3.yaml``; a ``make-tiny model=emu3`` folder's sidecar sets the
    grid). ``model.impl`` picks the target (module docstring); ``model.vq.kind``: ``checkpoint`` (the folder's
    ``vqmodel.*``), ``tiny`` (seeded random, ``random_init``) or ``none``. ``random_init: true``: ``random_emu3`` (the
    lean path converts the same seeded weights); otherwise ``model.path`` (a folder or hub id) is validated before any
    weight is read."""
    from adtbench.models.chameleon.target import grid_of
    from adtbench.models.emu3.lean import lean_from_hf, load_emu3_net, open_emu3_checkpoint
    from adtbench.models.registry import get, model_impl, resolve_dir

    impl = model_impl(cfg)
    device, dtype, attn, seed = common_options(cfg)
    grid = grid_of(cfg, "[90, 90] for Emu3-Gen at 720 px")
    mode = str(get(cfg, "cfg_mode", "sequential"))
    if mode not in CFG_MODES:
        raise ConfigError("model.cfg_mode", f"unknown CFG mode {mode!r}; choose one of {CFG_MODES}")
    prompts = (str(get(cfg, "prompt_suffix", "")), str(get(cfg, "negative_prompt", "")))
    vq_kind = str(get(cfg, "vq.kind", "checkpoint"))
    if vq_kind not in ("checkpoint", "tiny", "none"):
        raise ConfigError("model.vq.kind", f"unknown VQ kind {vq_kind!r}; choose checkpoint, tiny or none")
    base: Path | None = None
    lm: Any
    if bool(get(cfg, "random_init", False)):
        hf, config = random_emu3(cfg)
        vq = random_vq(config.vq_config, seed + 1) if vq_kind == "tiny" else None
        lm = lean_from_hf(hf, config) if impl == "lean" else hf
    else:
        base = resolve_dir("model.path", get(cfg, "path"), ["config.json", "*.safetensors"])
        config, files, _ = open_emu3_checkpoint(base)
        if vq_kind == "tiny":
            raise ConfigError("model.vq.kind", "tiny is for random_init; a checkpoint decodes with its own VQ-VAE")
        vq = load_emu3_vq(base, config, files) if vq_kind == "checkpoint" else None
        if impl == "lean":
            lm = load_emu3_net(base, dtype, device)
        else:
            from transformers import Emu3ForConditionalGeneration

            lm = Emu3ForConditionalGeneration.from_pretrained(str(base), dtype=dtype, attn_implementation=attn)
            lm.model.vqmodel = nn.Module()  # the VQ-VAE lives in ``vq`` (float32), not in the LM's dtype
    try:
        tokenizer = make_tokenizer(cfg, config, base)
    except (ValueError, OSError) as e:
        raise ConfigError("model.tokenizer", str(e)) from e
    target: LeanEmu3Target | Emu3Target
    if impl == "lean":
        target = LeanEmu3Target(lm, vq, tokenizer, grid, device=device, dtype=dtype, cfg_mode=mode)
    else:
        target = Emu3Target(lm, config, vq, tokenizer, grid, device=device, dtype=dtype, cfg_mode=mode)
    target.prompt_suffix, target.negative_prompt = prompts
    return target


__all__ = [
    "SPECIAL_NAMES",
    "Emu3Target",
    "Emu3VQDecoder",
    "Emu3Vocab",
    "LeanEmu3Target",
    "build_target",
    "emu3_vocabulary_map",
    "image_token_range",
    "load_emu3_vq",
    "make_tokenizer",
    "random_emu3",
    "random_vq",
    "special_token_ids",
    "tiny_vq_config",
    "visual_token_name",
]
