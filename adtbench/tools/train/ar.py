"""Stage ``ar``: train a LlamaGen-architecture t2i GPT and its small text encoder on VQ-coded scenes.

Sequence (identical to inference in ``LlamaGenTarget``): ``P = cls_token_num`` condition positions holding
``cap_proj(caption features)`` — the text encoder's word features right-aligned, pad slots zero and masked
as keys (each position still attends to itself) — then the image tokens ``x_0 … x_{N−2}``; image token k
sits at position ``P + k``. Logits at position ``P − 1 + k`` predict ``x_k``:

    L = − Σ_k log softmax(output(f_{P−1+k}))[x_k]   (mean over k and the batch)

Caption-attribute loss (``aux_weight`` λ > 0, off by default): on the conditional rows, a training-only linear head
per caption attribute (``scenes.ATTRIBUTES``: background kind and colour, object count, axis, each object's size,
colour and shape) reads the GPT's final features at every image position, and ``λ · mean_attr CE`` is added:

    L_total = L + λ · (1/|A|) Σ_a CE(head_a(f_{P−1+k}), attr_a(caption))   (mean over k, rows, present attributes)

Why: under teacher forcing an object's colour and shape are visible from its first tokens on, so the caption
informs the next-token loss only where an object *starts* (≈ 0.4 % of tokens; docs/mini_diagnosis.md,
"Conditioning"); the GPT learnt backgrounds from the caption and drew objects blind. The heads make the residual stream
carry the caption's object attributes at every position. They feed nothing into the logits and are dropped at
export, so the next-token model's optimum is unchanged (the loss shapes features, not the target distribution).

Condition dropout (CFG): with probability ``cond_dropout`` a caption's features are replaced by the
GPT's ``uncond_embedding`` buffer *keeping the caption's valid mask* — exactly the unconditional row
``LlamaGenTarget`` builds at inference — so ``l_u + s·(l_c − l_u)`` works.

Data: the first ``data.count`` train-split scenes rendered at ``data.size`` px and encoded by the VQ at
``vq_path`` (cached per VQ weights hash); batches are drawn from the step generator (resumable).

Outputs in ``out_dir/final``: ``gpt.safetensors`` (official LlamaGen keys), ``text_encoder.safetensors``,
``config.json`` (``{"gpt": GPTConfig, "text_encoder": TextEncoderConfig}``), ``train_info.json``;
``out_dir/samples.png``: held-out captions, AR samples (CFG) above the ground-truth renders.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from adtbench.errors import ConfigError
from adtbench.io import atomic_write_json, save_png
from adtbench.models.llamagen.gpt import GPTConfig, LlamaGenGPT
from adtbench.models.mini.target import MiniTextEncoder, TextEncoderConfig, ar_config_dict, load_vq, right_align
from adtbench.models.registry import resolve_device
from adtbench.scenes import ATTRIBUTES, VOCAB, parse_caption, to_tensor_range
from adtbench.tools.train.common import (
    attribute_targets,
    batches,
    export_dir,
    init_from,
    save_safetensors,
    scene_pool,
    stage_dir,
    step_rng,
    train_loop,
)


class ARModel(nn.Module):
    """The trainable pair (keys ``gpt.*``, ``text.*``) and the teacher-forced training forward."""

    def __init__(self, gpt: LlamaGenGPT, text: MiniTextEncoder) -> None:
        super().__init__()
        self.gpt, self.text = gpt, text

    def condition(
        self, ids: torch.Tensor, words: torch.Tensor, drop: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Caption ids ``[B, L]`` → condition embeddings ``[B, P, dim]`` and valid mask ``[B, P]``."""
        P = self.gpt.cfg.cls_token_num
        feats, valid = right_align(self.text(ids, words), words, P)
        unc = self.gpt.cls_embedding.uncond_embedding.to(feats.dtype)
        feats = torch.where(drop[:, None, None], unc[None].expand_as(feats), feats)
        return self.gpt.cls_embedding(feats), valid

    def forward(self, ids: torch.Tensor, words: torch.Tensor, drop: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, N, V]`` of every image token given the caption and the previous tokens."""
        return self.gpt.output(self.features(ids, words, drop, codes))

    def features(self, ids: torch.Tensor, words: torch.Tensor, drop: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Final (post-norm) features ``[B, N, dim]``; row k is the one whose logits predict image token k."""
        g = self.gpt
        B, N = codes.shape
        cond, valid = self.condition(ids, words, drop)
        P = cond.shape[1]
        x = torch.cat([cond, g.tok_embeddings(codes[:, :-1])], dim=1)
        S = x.shape[1]
        dev = x.device
        keys = torch.cat([valid, torch.ones(B, N - 1, dtype=torch.bool, device=dev)], dim=1)
        causal = torch.ones(S, S, dtype=torch.bool, device=dev).tril()
        mask = ((causal[None] & keys[:, None, :]) | torch.eye(S, dtype=torch.bool, device=dev)[None])[:, None]
        pos = torch.arange(S, device=dev)[None].expand(B, S)
        return g.forward_embeds(x, pos, mask, g.new_cache(B, S), 0)[:, P - 1 :]


class AttributeHeads(nn.Module):
    """Training-only caption-attribute heads (module docstring): one ``Linear(dim, |values|)`` per attribute."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.heads = nn.ModuleDict({k: nn.Linear(dim, len(v)) for k, v in ATTRIBUTES.items()})

    @staticmethod
    def targets(captions: list[str]) -> dict[str, torch.Tensor]:
        """``{attribute: [n]}`` value indices of each caption (``common.attribute_targets``; −100 where the caption
        lacks the attribute). A caption outside the grammar is an error."""
        parsed = []
        for text in captions:
            want = parse_caption(text)
            if want is None:
                raise ValueError(f"caption outside the scene grammar: {text!r}")
            parsed.append(want)
        return attribute_targets(parsed)

    def loss(self, feats: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean over attributes of the CE of every position's prediction (rows whose attribute is −100 skipped)."""
        N = feats.shape[1]
        parts = []
        for k, head in self.heads.items():
            t = targets[k]
            if bool((t >= 0).any()):
                parts.append(
                    F.cross_entropy(head(feats).flatten(0, 1).float(), t.repeat_interleave(N), ignore_index=-100)
                )
        return torch.stack(parts).mean()


def init_gpt(gpt: LlamaGenGPT) -> None:
    """LlamaGen's init: Linear/Embedding N(0, 0.02), zero output head (global RNG, seeded by the caller)."""
    for m in gpt.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
    nn.init.zeros_(gpt.output.weight)


def build(cfg: DictConfig, grid: int) -> ARModel:
    g = dict(cfg.gpt)
    gcfg = GPTConfig(**g, block_size=grid * grid, model_type="t2i")
    tcfg = TextEncoderConfig(
        words=list(VOCAB), max_len=gcfg.cls_token_num, caption_dim=gcfg.caption_dim, **dict(cfg.text_encoder)
    )
    torch.manual_seed(int(cfg.seed))
    gpt = LlamaGenGPT(gcfg)
    init_gpt(gpt)
    return ARModel(gpt, MiniTextEncoder(tcfg))


@torch.no_grad()
def encode_pool(vq, images: np.ndarray, dev: torch.device, bs: int = 64) -> torch.Tensor:
    """uint8 renders → VQ codes ``[n, grid²]`` (int64)."""
    out = [vq.encode(to_tensor_range(images[s]).to(dev)).cpu() for s in batches(len(images), bs)]
    return torch.cat(out)


def coded_data(cfg: DictConfig, split: str, count: int, vq, dev: torch.device) -> tuple[list[str], torch.Tensor]:
    """Captions and codes of a scene pool, cached by (VQ weights hash, stream, split, count, size)."""
    d = cfg.data
    cache = Path(str(cfg.cache_dir)) if cfg.get("cache_dir") else None
    captions, images = scene_pool(int(d.seed), split, count, int(d.size), cache)
    if cache is None:
        return captions, encode_pool(vq, images, dev)
    digest = hashlib.sha256((Path(str(cfg.vq_path)) / "model.safetensors").read_bytes()).hexdigest()[:12]
    path = cache / f"codes_{digest}_{d.seed}_{split}_{count}_{d.size}.pt"
    if path.exists():
        return captions, torch.load(path, map_location="cpu", weights_only=True)  # a plain int64 tensor
    codes = encode_pool(vq, images, dev)
    torch.save(codes, path)
    return captions, codes


def run(cfg: DictConfig) -> dict:
    aux_w = float(cfg.get("aux_weight", 0.0))
    if aux_w < 0:  # checked before any data or model is loaded
        raise ConfigError("aux_weight", f"must be ≥ 0, got {aux_w}")
    out = stage_dir(cfg)
    dev = resolve_device(str(cfg.device), "device")
    vq = load_vq(str(cfg.vq_path), dev)
    grid = int(cfg.data.size) // vq.downsample_factor
    captions, codes = coded_data(cfg, "train", int(cfg.data.count), vq, dev)
    model = build(cfg, grid)
    init_from(model.gpt, cfg, "gpt.safetensors")  # warm start from an earlier run's final/ (same shapes)
    init_from(model.text, cfg, "text_encoder.safetensors")
    model = model.to(dev).train()
    if model.gpt.cfg.vocab_size != vq.config.codebook_size:
        raise ValueError(f"gpt.vocab_size {model.gpt.cfg.vocab_size} ≠ VQ codebook {vq.config.codebook_size}")
    ids, words = model.text.batch_ids(captions)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(cfg.weight_decay)}, {"params": other, "weight_decay": 0.0}],
        lr=float(cfg.lr),
        betas=(0.9, 0.95),
    )
    seed, bs, pdrop = int(cfg.seed), int(cfg.batch_size), float(cfg.cond_dropout)
    heads = AttributeHeads(model.gpt.cfg.dim).to(dev) if aux_w > 0 else None
    attrs = AttributeHeads.targets(captions) if heads is not None else None
    if heads is not None:
        model.add_module("attr_heads", heads)  # trained, checkpointed and resumed with the model; never exported
        optim.add_param_group({"params": list(heads.parameters()), "weight_decay": 0.0})

    def step_fn(step: int) -> dict[str, float]:
        r = step_rng(seed, step)
        idx = torch.from_numpy(r.integers(len(captions), size=bs))
        drop = torch.from_numpy(r.random(bs) < pdrop)
        c = codes[idx].to(dev)
        feats = model.features(ids[idx].to(dev), words[idx].to(dev), drop.to(dev), c)
        logits = model.gpt.output(feats)
        ce = F.cross_entropy(logits.flatten(0, 1).float(), c.flatten())
        loss, logs = ce, {}
        if heads is not None and attrs is not None and bool((~drop).any()):
            keep = (~drop).to(dev)
            aux = heads.loss(feats[keep], {k: t[idx][~drop].to(dev) for k, t in attrs.items()})
            loss, logs = ce + aux_w * aux, {"aux": float(aux.detach())}
        loss.backward()
        acc = (logits.argmax(-1) == c).float().mean()
        return {"loss": float(ce.detach()), "acc": float(acc), **logs}

    res = train_loop(cfg, out, model, optim, step_fn, f"ar{grid}")
    if not res["complete"]:
        return res  # stopped early (stop_after): resume later
    model.eval()
    stats = evaluate(cfg, model, vq, dev, out)
    final = out / "final"
    save_safetensors(model.gpt.state_dict(), final / "gpt.safetensors")
    save_safetensors(model.text.state_dict(), final / "text_encoder.safetensors")
    atomic_write_json(final / "config.json", ar_config_dict(model.gpt.cfg, model.text.cfg))
    info = {
        "stage": "ar",
        **res,
        **stats,
        "grid": grid,
        "train_scenes": len(captions),
        "params_gpt": sum(p.numel() for p in model.gpt.parameters()),
        "params_text": sum(p.numel() for p in model.text.parameters()),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    atomic_write_json(final / "train_info.json", info)
    export_dir(final, cfg.get("export"))
    return info


@torch.no_grad()
def evaluate(cfg: DictConfig, model: ARModel, vq, dev: torch.device, out: Path) -> dict:
    """Held-out teacher-forced loss / accuracy (cond and uncond rows) and a grid of AR samples."""
    n = int(cfg.eval_count)
    captions, codes = coded_data(cfg, "heldout", n, vq, dev)
    ids, words = model.text.batch_ids(captions)
    stats: dict[str, float] = {}
    for tag, dropped in (("cond", False), ("uncond", True)):
        tot, acc, cnt = 0.0, 0.0, 0
        for s in batches(n, 16):
            c = codes[s].to(dev)
            drop = torch.full((c.shape[0],), dropped, device=dev)
            logits = model(ids[s].to(dev), words[s].to(dev), drop, c)
            tot += float(F.cross_entropy(logits.flatten(0, 1).float(), c.flatten(), reduction="sum"))
            acc += float((logits.argmax(-1) == c).float().sum())
            cnt += c.numel()
        stats[f"heldout_loss_{tag}"], stats[f"heldout_acc_{tag}"] = tot / cnt, acc / cnt
    if int(cfg.get("sample_count", 0)) > 0:
        stats |= sample_grid(cfg, model, vq, captions[: int(cfg.sample_count)], dev, out)
    return stats


@torch.no_grad()
def sample_grid(cfg: DictConfig, model: ARModel, vq, captions: list[str], dev: torch.device, out: Path) -> dict:
    """AR samples through the real engine (``decode_ar``, CFG) → ``samples.png`` (+ evaluator agreement)."""

    from adtbench.algorithm.engine import decode_ar
    from adtbench.models.llamagen.target import LlamaGenTarget
    from adtbench.sampling_params import build_sampling

    target = LlamaGenTarget(model.gpt, vq, model.text.encode, device=dev)
    sp = build_sampling(cfg.sampling)
    imgs = []
    for i, text in enumerate(captions):
        g = torch.Generator().manual_seed(int(cfg.seed) * 1000 + i)
        res = decode_ar(target, target.encode_prompt(text, cfg=sp.use_cfg), sp, g)
        imgs.append(target.decode_image(target.layout.tokens_to_codes(res.tokens)))
    size = int(cfg.data.size)
    _, truth = scene_pool(int(cfg.data.seed), "heldout", len(captions), size, None)
    grid = np.concatenate([np.concatenate(imgs, axis=1), np.concatenate(list(truth), axis=1)], axis=0)
    save_png(grid, out / "samples.png")
    stats: dict = {"sample_captions": captions}
    try:
        from adtbench.models.mini.evaluator import load_mini_evaluator

        ev = load_mini_evaluator()
        stats["sample_agreement"] = float(np.mean(ev.score(np.stack(imgs), captions)))
        stats["truth_agreement"] = float(np.mean(ev.score(truth, captions)))
    except FileNotFoundError:
        pass
    return stats
