"""The measured figures of the mini model card, stored in ``adtbench/weights/mini/figures.json``.

Three measurements, each stored under its own key (with the machine and thread count) by ``store_figure``:

``ratios`` measures, on the current machine, with the shipped drafter and CFG (2 rows), mid-image
(128 committed tokens), medians over ``repeats``:

- ``step_ms``: one target AR step = ``verify_forward`` of one token (+ LM head), the AR baseline's unit;
- ``verify_ms``: one ``verify_forward`` of a real EAGLE-2 tree (depth 4, K 10, 59 nodes incl. the root);
- ``draft_ms``: one drafter level = ``DraftSession.expand`` of K = 10 nodes (drafter forward, LM head,
  logits processing, tree bookkeeping) — what each of the D sequential drafting levels costs;
- ``draft_forward_ms``: the same level without bookkeeping — the drafter network on those 10 nodes
  (``EagleDrafter.expand``), LM head and logits processing, the counterpart of ``step_ms``;
- ``bookkeeping_ms`` = ``draft_ms − draft_forward_ms``: the session's tree bookkeeping per level;

and reports ``verify / step`` (goal ≲ 2: verification is nearly free, as on a GPU),
``draft / step``, ``draft_forward / step`` (goal ≤ 1/5) and ``bookkeeping / step`` (goal ≤ 0.03).

``grid`` decodes ``n`` held-out prompts with AR and with EAGLE-2 speculative decoding (same seeds, T = 1,
CFG 3) and writes rows: AR samples, speculative samples, ground-truth renders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from adtbench import accel
from adtbench.io import atomic_write_json, save_png
from adtbench.resources import conf_dir

ROOT = Path(__file__).resolve().parents[3]
WEIGHTS = ROOT / "adtbench" / "weights" / "mini"
FIGURES = WEIGHTS / "figures.json"


def _sampling_params(name: str = "default") -> Any:
    """The ``conf/sampling/<name>.yaml`` group as ``SamplingParams`` (built where the app builds its own)."""
    from adtbench.sampling_params import build_sampling

    return build_sampling(OmegaConf.load(conf_dir() / "sampling" / f"{name}.yaml"))


def load_models(model: str = "mini", drafter: str = "mini", device: str | None = None) -> tuple[Any, Any]:
    """The target ``conf/model/<model>.yaml`` (on ``device`` when given, e.g. ``cuda``) and its drafter."""
    from adtbench.algorithm.ar import ar_tokens
    from adtbench.harness.config import register_resolvers
    from adtbench.harness.drafters import build_drafter
    from adtbench.models.registry import build_target

    register_resolvers()
    cfg = OmegaConf.load(conf_dir() / "model" / f"{model}.yaml")
    if device is not None:
        cfg.device = device
    target = build_target(cfg, plain_decode=ar_tokens)
    d = build_drafter(OmegaConf.load(conf_dir() / "drafter" / f"{drafter}.yaml"), target)
    return target, d


def _median_ms(fn: Any, repeats: int, device: torch.device) -> float:
    """One warm-up call, then :func:`adtbench.tools.bench.median_ms` (CUDA-synchronised on a GPU)."""
    from adtbench.algorithm.cost import median_ms

    fn()
    return median_ms(fn, repeats, accel.is_cuda(device))


@torch.no_grad()
def cost_ratios(target: Any, drafter: Any, repeats: int = 30, prefix: int = 128) -> dict[str, float]:
    """Module docstring: target step, tree verify and drafter level costs and their ratios."""
    from adtbench.algorithm.drafters.session import DraftSession
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.algorithm.sampling import process_logits

    sp = _sampling_params()
    prompt = "a large red circle left of a small blue square on a striped green background"
    inputs = target.encode_prompt(prompt, cfg=True)
    res = target.start(inputs, 64)
    R, dev = target.rows, target.device
    drafter.reset(R, res.features.shape[1] + target.layout.num_gen_tokens + 80)
    toks = torch.randint(target.layout.num_codes, (prefix,), device=dev) + target.layout.image_token_offset
    root_e = drafter.embed(target, toks[:1])[None].expand(R, 1, -1)
    drafter.extend(
        res.features, torch.cat([drafter.embed_prompt(target, res)[:, 1:], root_e], 1), res.positions, res.valid
    )
    chain = torch.ones(prefix, prefix, dtype=torch.bool, device=dev).tril()
    steps = torch.arange(prefix, device=dev)
    _, f = target.verify_forward(toks, chain, steps)
    pos = target.next_pos[:, None] + steps[None]
    target.commit(steps, in_place=True)
    emb = drafter.embed(target, torch.cat([toks[1:], toks[:1]]))[None].expand(R, -1, -1)
    out = drafter.extend(f, emb, pos, torch.ones(R, prefix, dtype=torch.bool, device=dev))
    one, zero = torch.ones(1, 1, dtype=torch.bool, device=dev), torch.zeros(1, dtype=torch.long, device=dev)

    def session() -> DraftSession:
        drafter.rollback()
        return DraftSession(drafter, target, sp, toks[:1], prefix, target.next_pos.clone(), out, None)

    tree = Eagle2Policy(4, 10, 59).propose(session(), 5)
    drafter.rollback()
    step = _median_ms(lambda: target.verify_forward(toks[:1], one, zero), repeats, target.device)
    verify = _median_ms(
        lambda: target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth), repeats, target.device
    )

    s0 = session()
    top = s0.root_logprobs().topk(10).indices

    roots = torch.zeros(10, dtype=torch.long, device=dev)

    def level() -> None:
        session().expand(roots, top, 1)

    draft = _median_ms(level, repeats, target.device)
    feats = s0.outputs[:, :1].expand(R, 10, -1)
    embeds = drafter.embed(target, top)[None].expand(R, -1, -1)
    dpos = target.next_pos[:, None].expand(R, 10)
    eye = torch.eye(10, dtype=torch.bool, device=dev)
    gen_idx = torch.full((10,), prefix + 2, device=dev)

    def forward() -> None:  # the same level without the bookkeeping: network, LM head, logits processing
        drafter.rollback()
        process_logits(target.lm_head(drafter.expand(feats, embeds, dpos, eye)), gen_idx, target.layout, sp)

    fwd = _median_ms(forward, repeats, target.device)
    drafter.rollback()
    return {
        "threads": torch.get_num_threads(),
        "tree_nodes": tree.size,
        "step_ms": step,
        "verify_ms": verify,
        "draft_ms": draft,
        "draft_forward_ms": fwd,
        "verify_over_step": verify / step,
        "draft_over_step": draft / step,
        "draft_forward_over_step": fwd / step,
        "bookkeeping_ms": draft - fwd,
        "bookkeeping_over_step": (draft - fwd) / step,
    }


@torch.no_grad()
def sample_grid(out: Path, n: int = 8, seed: int = 0, device: str | None = None) -> dict:
    """AR vs EAGLE-2 samples (same seeds) and the ground truth of ``n`` held-out prompts → PNG."""
    from PIL import Image

    from adtbench.algorithm.engine import decode_ar, generate
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.models.mini.evaluator import load_mini_evaluator
    from adtbench.scenes import iter_split, render

    target, drafter = load_models(device=device)
    sp = _sampling_params()
    scenes = [s for _, s in iter_split(0, "heldout", n)]
    gen_device = target.device if accel.is_cuda(target.device) else torch.device("cpu")
    rows: dict[str, list[np.ndarray]] = {"ar": [], "spec": [], "truth": []}
    taus = []
    for i, s in enumerate(scenes):
        inputs = target.encode_prompt(s.caption, cfg=True)
        a = decode_ar(target, inputs, sp, accel.generator(gen_device, seed + i))
        b = generate(target, drafter, Eagle2Policy(4, 10, 59), inputs, sp, accel.generator(gen_device, seed + i))
        taus.append(b.tau)
        rows["ar"].append(target.decode_image(target.layout.tokens_to_codes(a.tokens)))
        rows["spec"].append(target.decode_image(target.layout.tokens_to_codes(b.tokens)))
        rows["truth"].append(render(s, 64))
    pad = np.full((64, 2, 3), 255, np.uint8)

    def row(imgs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([x for im in imgs for x in (im, pad)][:-1], axis=1)

    sep = np.full((2, row(rows["ar"]).shape[1], 3), 255, np.uint8)
    grid = np.concatenate([row(rows["ar"]), sep, row(rows["spec"]), sep, row(rows["truth"])], axis=0)
    save_png(Image.fromarray(grid).resize((grid.shape[1] * 2, grid.shape[0] * 2), Image.NEAREST), out)
    ev = load_mini_evaluator()
    caps = [s.caption for s in scenes]
    return {
        "captions": caps,
        "tau": taus,
        "agreement_ar": float(np.mean(ev.score(np.stack(rows["ar"]), caps))),
        "agreement_spec": float(np.mean(ev.score(np.stack(rows["spec"]), caps))),
        "agreement_truth": float(np.mean(ev.score(np.stack(rows["truth"]), caps))),
    }


def sweep_rows(root: Path) -> list[dict[str, Any]]:
    """One row per job ``summary.json`` under ``root`` (:func:`adtbench.harness.rundir.find_runs`: job 10_… after 9_…):
    policy, lantern, τ, d̄, speedup, latencies, n."""
    from adtbench.harness.rundir import find_runs, lantern_choice, read_summary

    rows = []
    for run_dir in find_runs(root):
        s = read_summary(run_dir)
        rows.append(
            {
                "policy": s.get("policy"),
                "policy_params": s.get("policy_params"),
                "lantern": lantern_choice(s),
                "dataset": s.get("dataset"),
                "n": s.get("n_samples"),
                **{k: s.get(k) for k in ("tau", "d_bar", "speedup", "latency_s", "baseline_latency_s")},
                "agreement": ((s.get("eval") or {}).get("values") or {}).get("mini_agreement"),
                "sampling": s.get("sampling_params"),
                "threads": (s.get("env") or {}).get("threads"),
            }
        )
    return rows


def store_figure(key: str, value: Any) -> None:
    """Set ``figures.json[key] = value`` (atomic rewrite)."""
    figs = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    figs[key] = value
    atomic_write_json(FIGURES, figs, indent=1, sort_keys=True)
