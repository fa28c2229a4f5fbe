"""Stage ``drafter``: train an EAGLE drafter against any target the engine supports.

Model-generic by construction: the teacher step uses only the ``Target`` interface, the training step
only the target's frozen ``embed_tokens`` / ``full_lm_head`` / ``drafter_rope`` and its sizes.

**Teacher step** (``teacher_sample``): for a prompt and a complete token sequence ``x_0 … x_{N−1}``
(dataset images coded by the target's VQ, self-generated samples, or a file), run
``target.start(encode_prompt(prompt, cfg))`` — the prompt features ``f_0 … f_{P−1}`` of every CFG row,
the *unconditional row included* — then one ``verify_forward`` of ``x_0 … x_{N−2}`` with a chain
(lower-triangular) mask and depths ``0 … N−2``, which gives the teacher-forced features of every image
position in every row. Stored per sample: features ``[R, P+N−1, H]``, the prompt's input embeddings
``[R, P, H]``, positions and validity ``[R, P+N−1]``, the tokens.

**Pairing** (``drafter_slots``; algorithms.md §2.1, §7.3, §10 items 2 and 28). Slot ``s`` holds
``(f_s, e_{s+1})`` where ``e_{s+1}`` is the target's *input embedding at position s+1*: the prompt's own
input embedding for ``s+1 < P`` (condition features — never a fake token id 0) and ``e(x_{s+1−P})``
for image positions. The slot sits at the target position of ``f_s`` and regresses ``f_{s+1}``; the
head of its output predicts the token after ``x_{s+1−P}``. This is exactly what the engine feeds at
inference (``drafter.extend(res.features, cat(res.input_embeds[:, 1:], e(root)), ...)`` after the prefill,
then ``(f of each committed token, e(next committed token))``) — ``tests/test_train.py`` checks the
equality against a real ``generate`` run, with the unshifted pairing ``(f_t, x_t)`` as negative control.
Only slots whose target ``f_{s+1}`` is an image position (``s ≥ P−1``) enter the loss.

**Loss** (EAGLE, per CFG row, masked means over slots):

    vloss = mean_h SmoothL1(g_s, f_{s+1})                       (β = 1)
    ploss = − Σ_v softmax(head(f_{s+1}))_v · log_softmax(head(g_s))_v
    cfg   = the same soft CE on the CFG mix l_u + s·(l_c − l_u) of both rows (the drafting distribution;
            the correct form of the reference ``--cfg_loss``, §10 item 19), when the rows are (cond, uncond)
    loss  = vloss + p_w · ploss + cfg_w · cfg

Input features get uniform noise ``(U − ½)·noise`` (EAGLE's data augmentation). AdamW, warm-up + cosine,
gradient-norm clipping; every step's batch is drawn from the step generator (resumable).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from adtbench import accel
from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.harness.drafters import eagle_config_for
from adtbench.io import atomic_write_json
from adtbench.models.base import Target
from adtbench.tools.train.common import (
    atomic_save,
    export_dir,
    init_from,
    save_safetensors,
    scene_pool,
    stage_dir,
    step_rng,
    train_loop,
)

# ----------------------------------------------------------------------------------------------------
# Teacher data (Target interface only)
# ----------------------------------------------------------------------------------------------------


@dataclass
class TeacherSample:
    """Target features of one teacher-forced sequence, every CFG row (see module docstring)."""

    prompt: str
    tokens: torch.Tensor  # [N] the full sequence (token ids of the target's vocabulary)
    feats: torch.Tensor  # [R, P+N−1, H] post-norm features: prompt positions, then x_0 … x_{N−2}
    prompt_embeds: torch.Tensor  # [R, P, H] the target's input embeddings at the prompt positions
    positions: torch.Tensor  # [R, P+N−1] position ids
    valid: torch.Tensor  # [R, P+N−1] real (non-padding) positions
    prompt_len: int  # P

    def as_dict(self) -> dict[str, Any]:
        """Plain tensors / str / int (what shards store, so they load with ``weights_only=True``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TeacherSample:
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    def to(self, dtype: torch.dtype) -> TeacherSample:
        return TeacherSample(
            self.prompt,
            self.tokens,
            self.feats.to(dtype),
            self.prompt_embeds.to(dtype),
            self.positions,
            self.valid,
            self.prompt_len,
        )


@torch.no_grad()
def teacher_sample(target: Target, prompt: str, tokens: torch.Tensor | list[int], cfg_rows: bool) -> TeacherSample:
    """Prefill ``prompt`` (cond + uncond rows when ``cfg_rows``) and teacher-force ``tokens[:-1]`` in one pass."""
    tok = torch.as_tensor(tokens, dtype=torch.long).flatten().cpu()
    n = tok.numel() - 1
    if n < 1:
        raise ValueError("a teacher sequence needs at least two tokens")
    res = target.start(target.encode_prompt(prompt, cfg=cfg_rows), max_tree_nodes=n)
    chain = torch.ones(n, n, dtype=torch.bool).tril()
    _, f = target.verify_forward(tok[:n], chain, torch.arange(n))
    R = f.shape[0]
    dev = res.positions.device
    pos = torch.cat([res.positions, target.next_pos[:, None] + torch.arange(n, device=dev)[None]], dim=1)
    valid = torch.cat([res.valid, torch.ones(R, n, dtype=torch.bool, device=res.valid.device)], dim=1)
    return TeacherSample(
        prompt=prompt,
        tokens=tok,
        feats=torch.cat([res.features, f], dim=1).cpu(),
        prompt_embeds=res.input_embeds.cpu(),
        positions=pos.cpu(),
        valid=valid.cpu(),
        prompt_len=res.features.shape[1],
    )


@dataclass
class Slots:
    """Drafter training inputs/targets of one sample: ``L = P + N − 2`` slots, ``R`` rows."""

    feats: torch.Tensor  # [R, L, H] f_s
    embeds: torch.Tensor  # [R, L, H] input embedding at position s+1
    positions: torch.Tensor  # [R, L] target position of f_s
    key_valid: torch.Tensor  # [R, L] slot is a real position (keys of the attention mask)
    target: torch.Tensor  # [R, L, H] f_{s+1}
    loss_mask: torch.Tensor  # [R, L] target is a real image position


def drafter_slots(sample: TeacherSample, embed_tokens: Any) -> Slots:
    """Slot ``s`` = ``(f_s, e_{s+1})`` → regress ``f_{s+1}`` (module docstring: the f_t ↔ x_{t+1} pairing)."""
    P = sample.prompt_len
    S = sample.feats.shape[1]  # P + n positions with features
    n = S - P  # teacher-forced tokens x_0 … x_{n−1}
    R = sample.feats.shape[0]
    tok_emb = embed_tokens(sample.tokens[:n]).detach().to(sample.feats.device, sample.feats.dtype)
    embeds = torch.cat([sample.prompt_embeds[:, 1:].to(sample.feats.dtype), tok_emb[None].expand(R, -1, -1)], dim=1)
    L = S - 1
    is_image_target = torch.arange(L) >= P - 1
    return Slots(
        feats=sample.feats[:, :L],
        embeds=embeds,
        positions=sample.positions[:, :L],
        key_valid=sample.valid[:, :L],
        target=sample.feats[:, 1:],
        loss_mask=is_image_target[None] & sample.valid[:, :L] & sample.valid[:, 1:],
    )


def collate(slots: list[Slots]) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sample and stack: tensors ``[B, R, L, ·]`` (pad slots invalid, no loss)."""
    Lm = max(s.feats.shape[1] for s in slots)

    def pad(t: torch.Tensor, value: Any = 0) -> torch.Tensor:
        extra = Lm - t.shape[1]
        if extra == 0:
            return t
        shape = (t.shape[0], extra, *t.shape[2:])
        return torch.cat([t, torch.full(shape, value, dtype=t.dtype)], dim=1)

    keys = ("feats", "embeds", "positions", "key_valid", "target", "loss_mask")
    return {
        k: torch.stack([pad(getattr(s, k), False if k in ("key_valid", "loss_mask") else 0) for s in slots])
        for k in keys
    }


def drafter_forward(drafter: EagleDrafter, batch: dict[str, torch.Tensor], noise: float = 0.0) -> torch.Tensor:
    """Full-sequence drafter forward over slots ``[B, R, L]`` (causal, pad keys masked) → ``g [B, R, L, H]``.

    The same computation as ``EagleDrafter.extend`` over the committed prefix at inference.
    """
    B, R, L, H = batch["feats"].shape
    dev = drafter.fc.weight.device
    dt = drafter.fc.weight.dtype
    feats = batch["feats"].to(dev, dt).reshape(B * R, L, H)
    if noise > 0:
        feats = feats + (torch.rand_like(feats) - 0.5) * noise
    embeds = batch["embeds"].to(dev, dt).reshape(B * R, L, H)
    pos = batch["positions"].to(dev).reshape(B * R, L)
    keys = batch["key_valid"].to(dev).reshape(B * R, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    mask = ((causal[None] & keys[:, None, :]) | torch.eye(L, dtype=torch.bool, device=dev)[None])[:, None]
    drafter.reset(B * R, L)
    out = drafter.forward(embeds, feats, pos, mask, 0)
    drafter.cache = None  # free the training cache
    return out.view(B, R, L, H)


def soft_ce(target_logits: torch.Tensor, pred_logits: torch.Tensor) -> torch.Tensor:
    """``−Σ_v softmax(t)_v · log_softmax(p)_v`` over the last dim."""
    return -(target_logits.softmax(-1) * pred_logits.log_softmax(-1)).sum(-1)


def drafter_loss(
    g: torch.Tensor, batch: dict[str, torch.Tensor], lm_head: Any, p_w: float, cfg_w: float, cfg_scale: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE loss (module docstring) and metrics: top-1 agreement of drafter and target per row and mixed."""
    dev = g.device
    tgt = batch["target"].to(dev, g.dtype)
    m = batch["loss_mask"].to(dev).to(g.dtype)  # [B, R, L]
    denom = m.sum().clamp_min(1.0)
    vloss = (F.smooth_l1_loss(g, tgt, reduction="none").mean(-1) * m).sum() / denom
    with torch.no_grad():
        lt = lm_head(tgt).float()
    lp = lm_head(g).float()
    ploss = (soft_ce(lt, lp) * m).sum() / denom
    loss = vloss + p_w * ploss
    metrics = {"vloss": float(vloss.detach()), "ploss": float(ploss.detach())}
    with torch.no_grad():
        metrics["acc"] = float(((lt.argmax(-1) == lp.argmax(-1)).float() * m).sum() / denom)
    if g.shape[1] == 2:  # rows (cond, uncond): the CFG-mixed drafting distribution
        mt = lt[:, 1] + cfg_scale * (lt[:, 0] - lt[:, 1])
        mp = lp[:, 1] + cfg_scale * (lp[:, 0] - lp[:, 1])
        mm = m[:, 0] * m[:, 1]
        dm = mm.sum().clamp_min(1.0)
        cfg_loss = (soft_ce(mt, mp) * mm).sum() / dm
        if cfg_w > 0:
            loss = loss + cfg_w * cfg_loss
        metrics["cfg"] = float(cfg_loss.detach())
        with torch.no_grad():
            metrics["acc_mix"] = float(((mt.argmax(-1) == mp.argmax(-1)).float() * mm).sum() / dm)
    metrics["loss"] = float(loss.detach())
    return loss, metrics


# ----------------------------------------------------------------------------------------------------
# Teacher sequences: dataset scenes, self-generated samples, or a file
# ----------------------------------------------------------------------------------------------------


def scene_sequences(target: Target, seed: int, split: str, count: int, size: int | None) -> list[tuple[str, list[int]]]:
    """(caption, tokens) of procedural scenes coded by the target's own VQ (raster layouts only)."""
    from adtbench.scenes import to_tensor_range

    vq = target.vq
    lay = target.layout
    if vq is None or not hasattr(vq, "encode"):
        raise ValueError("teacher.source=scenes needs a target whose VQ has an encoder (e.g. model=mini)")
    if lay.eol_token is not None or lay.eoi_token is not None:
        raise ValueError("teacher.source=scenes supports plain raster layouts only; use source=generated")
    px = size or lay.grid_w * vq.downsample_factor
    captions, images = scene_pool(seed, split, count, px, None)
    out = []
    with torch.no_grad():
        for i in range(0, count, 64):
            x = to_tensor_range(images[i : i + 64]).to(target.device)
            codes = vq.encode(x).cpu() + lay.image_token_offset
            out += [(c, row.tolist()) for c, row in zip(captions[i : i + 64], codes)]
    return out


def generated_sequences(target: Target, prompts: list[str], sp: Any, seed: int) -> list[tuple[str, list[int]]]:
    """Self-distillation: AR samples of the target itself (``decode_ar``, same processing as the baseline)."""
    from adtbench.algorithm.engine import decode_ar

    out = []
    for i, p in enumerate(prompts):
        g = accel.generator(target.device if accel.is_cuda(target.device) else torch.device("cpu"), seed + i)
        res = decode_ar(target, target.encode_prompt(p, cfg=sp.use_cfg and target.supports_cfg), sp, g)
        out.append((p, res.tokens))
    return out


def teacher_sequences(cfg: DictConfig, target: Target, split: str, count: int) -> list[tuple[str, list[int]]]:
    t = cfg.teacher
    src = str(t.source)
    if src == "scenes":
        return scene_sequences(target, int(t.scene_seed), split, count, t.get("size"))
    if src == "generated":
        from adtbench.sampling_params import build_sampling

        if t.get("prompts"):
            lines = Path(str(t.prompts)).read_text().splitlines()
            prompts = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
            prompts = prompts[:count] if split == "train" else prompts[-count:]
        else:
            from adtbench.scenes import iter_split

            prompts = [s.caption for _, s in iter_split(int(t.scene_seed), split, count)]
        sp = build_sampling(t.sampling, "teacher.sampling")
        return generated_sequences(target, prompts, sp, int(cfg.seed) + (0 if split == "train" else 10**6))
    if src == "file":
        return file_sequences(str(t.file), split, count)
    raise ValueError(f"teacher.source must be scenes, generated or file, got {src!r}")


def file_sequences(path: str, split: str, count: int) -> list[tuple[str, list[int]]]:
    """``teacher.file``: a torch file holding a list of ``{"prompt": str, "tokens": [int] | LongTensor}``, read with
    ``weights_only=True`` (it may come from anyone); the first ``count`` items train, the last ``count`` are held
    out. A corrupt, unsafe or malformed file is a ``ConfigError`` naming ``teacher.file``."""
    from adtbench.errors import ConfigError
    from adtbench.io import load_weights

    items = load_weights("teacher.file", path)
    ok = isinstance(items, list) and all(isinstance(d, dict) and {"prompt", "tokens"} <= set(d) for d in items)
    if not ok:
        raise ConfigError("teacher.file", f"{path}: expected a list of {{'prompt': str, 'tokens': [int]}}")
    items = items[:count] if split == "train" else items[-count:]
    return [(str(d["prompt"]), [int(x) for x in d["tokens"]]) for d in items]


def build_teacher(cfg: DictConfig, target: Target, out: Path, split: str, count: int) -> list[TeacherSample]:
    """Teacher samples, computed in shards of ``teacher.shard_size`` under ``out/teacher_<split>/`` (resumable)."""
    from tqdm import tqdm

    t = cfg.teacher
    store = getattr(torch, str(t.dtype))
    shard = int(t.shard_size)
    d = out / f"teacher_{split}"
    d.mkdir(parents=True, exist_ok=True)
    n_shards = math.ceil(count / shard)
    if all((d / f"shard_{k:04d}.pt").exists() for k in range(n_shards)):
        seqs = None
    else:
        seqs = teacher_sequences(cfg, target, split, count)
    samples: list[TeacherSample] = []
    cfg_rows = bool(t.cfg) and target.supports_cfg
    bar = tqdm(total=count, desc=f"teacher {split}", disable=not cfg.get("progress", True), dynamic_ncols=True)
    for k in range(n_shards):
        path = d / f"shard_{k:04d}.pt"
        if path.exists():  # shards are plain dicts (weights_only=True); earlier pickled-dataclass shards: recompute
            from adtbench.io import WeightsError, read_torch

            try:
                part = [TeacherSample.from_dict(d) for d in read_torch(path)]
            except (WeightsError, TypeError, KeyError):
                path.unlink()
        if not path.exists():
            if seqs is None:
                seqs = teacher_sequences(cfg, target, split, count)
            part = [teacher_sample(target, p, tok, cfg_rows).to(store) for p, tok in seqs[k * shard : (k + 1) * shard]]
            atomic_save([s.as_dict() for s in part], path)
        samples += part
        bar.update(len(part))
    bar.close()
    return samples[:count]


# ----------------------------------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------------------------------


def freeze(target: Target) -> None:
    """No gradients into the target's weights (the drafter's loss goes through its head and embeddings)."""
    for v in vars(target).values():
        if isinstance(v, torch.nn.Module):
            v.requires_grad_(False)


def build_student(cfg: DictConfig, target: Target) -> EagleDrafter:
    dcfg: EagleConfig = eagle_config_for(target, cfg.drafter)
    torch.manual_seed(int(cfg.seed))
    return EagleDrafter(dcfg, target.drafter_rope(dcfg.head_dim)).to(target.device)


def run(cfg: DictConfig) -> dict:
    from adtbench.algorithm.ar import ar_tokens
    from adtbench.models.registry import build_target

    out = stage_dir(cfg)
    target = build_target(cfg.model, plain_decode=ar_tokens)
    freeze(target)
    t0 = time.perf_counter()
    train = build_teacher(cfg, target, out, "train", int(cfg.teacher.count))
    held = build_teacher(cfg, target, out, "heldout", int(cfg.teacher.eval_count))
    teacher_s = time.perf_counter() - t0  # this invocation (cached shards load in seconds)
    drafter = build_student(cfg, target)
    init_from(drafter, cfg)  # warm start (e.g. the shipped drafter, fine-tuned on the target's own samples)
    drafter.train()
    optim = torch.optim.AdamW(
        drafter.parameters(), lr=float(cfg.lr), betas=(0.9, 0.95), weight_decay=float(cfg.weight_decay)
    )
    seed, bs = int(cfg.seed), int(cfg.batch_size)
    p_w, cfg_w, scale, noise = float(cfg.p_w), float(cfg.cfg_w), float(cfg.cfg_scale), float(cfg.noise)

    def step_fn(step: int) -> dict[str, float]:
        idx = step_rng(seed, step).integers(len(train), size=bs)
        batch = collate([drafter_slots(train[int(i)], target.embed_tokens) for i in idx])
        g = drafter_forward(drafter, batch, noise)
        loss, m = drafter_loss(g, batch, target.full_lm_head, p_w, cfg_w, scale)
        loss.backward()
        return m

    res = train_loop(cfg, out, drafter, optim, step_fn, "drafter")
    if not res["complete"]:
        return res  # stopped early (stop_after): resume later
    drafter.eval()
    stats = evaluate(cfg, drafter, target, held)
    final = out / "final"
    save_safetensors(drafter.state_dict(), final / "model.safetensors")
    atomic_write_json(final / "config.json", drafter.config.to_dict())
    info = {
        "stage": "drafter",
        **res,
        **stats,
        "teacher_s": teacher_s,
        "teacher_train": len(train),
        "teacher_heldout": len(held),
        "params": sum(p.numel() for p in drafter.parameters()),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    atomic_write_json(final / "train_info.json", info)
    export_dir(final, cfg.get("export"))
    return info


@torch.no_grad()
def evaluate(cfg: DictConfig, drafter: EagleDrafter, target: Target, held: list[TeacherSample]) -> dict:
    """Held-out losses / top-1 agreement, then τ of the trained drafter through the real engine."""
    sums: dict[str, float] = {}
    for i in range(0, len(held), 8):
        batch = collate([drafter_slots(s, target.embed_tokens) for s in held[i : i + 8]])
        g = drafter_forward(drafter, batch)
        _, m = drafter_loss(g, batch, target.full_lm_head, float(cfg.p_w), float(cfg.cfg_w), float(cfg.cfg_scale))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v * len(held[i : i + 8])
    stats: dict[str, Any] = {f"heldout_{k}": v / max(1, len(held)) for k, v in sums.items()}
    n = int(cfg.get("eval_prompts", 0))
    if n > 0:
        stats |= engine_tau(cfg, drafter, target, [s.prompt for s in held[:n]])
    return stats


@torch.no_grad()
def engine_tau(cfg: DictConfig, drafter: EagleDrafter, target: Target, prompts: list[str]) -> dict[str, float]:
    """Mean τ of EAGLE-2 trees (depth 4, K 10, 59 nodes) with this drafter, greedy and T = 1 (CFG 3)."""
    from adtbench.algorithm.engine import generate
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.sampling_params import build_sampling

    out = {}
    for tag, temp in (("greedy", 0.0), ("t1", 1.0)):
        sp = build_sampling({"temperature": temp, "cfg_scale": cfg.cfg_scale}, key="")  # errors name cfg_scale
        taus = []
        for i, p in enumerate(prompts):
            g = accel.generator(target.device if accel.is_cuda(target.device) else torch.device("cpu"), i)
            res = generate(target, drafter, Eagle2Policy(4, 10, 59), target.encode_prompt(p, cfg=True), sp, g)
            taus.append(res.tau)
        out[f"engine_tau_{tag}"] = float(np.mean(taus))
    return out
