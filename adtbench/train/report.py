"""Figures of the mini model card (``docs/mini_model.md``): cost ratios and the sample grid.

    python -m adtbench.train.report ratios [model=mini] [threads=N] [repeats=R]
    python -m adtbench.train.report grid [out=docs/mini_samples.png] [n=8]

``ratios`` measures, on the current machine, with the shipped drafter and CFG (2 rows), mid-image
(128 committed tokens), medians over ``repeats``:

- ``step_ms``: one target AR step = ``verify_forward`` of one token (+ LM head), the AR baseline's unit;
- ``verify_ms``: one ``verify_forward`` of a real EAGLE-2 tree (depth 4, K 10, 59 nodes incl. the root);
- ``draft_ms``: one drafter level = ``DraftSession.expand`` of K = 10 nodes (drafter forward, LM head,
  logits processing) — what each of the D sequential drafting levels costs;

and reports ``verify / step`` (target ≲ 2: verification is nearly free, as on a GPU) and
``draft / step`` (target ≤ 1/5).

``grid`` decodes ``n`` held-out prompts with AR and with EAGLE-2 speculative decoding (same seeds, T = 1,
CFG 3) and writes rows: AR samples, speculative samples, ground-truth renders.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]


def _load(model: str = "mini", drafter: str = "mini") -> tuple[Any, Any]:
    from adtbench.config import register_resolvers
    from adtbench.drafters.build import build_drafter
    from adtbench.models.registry import build_target

    register_resolvers()
    target = build_target(OmegaConf.load(ROOT / "conf" / "model" / f"{model}.yaml"))
    d = build_drafter(OmegaConf.load(ROOT / "conf" / "drafter" / f"{drafter}.yaml"), target)
    return target, d


def _median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


@torch.no_grad()
def cost_ratios(target: Any, drafter: Any, repeats: int = 30, prefix: int = 128) -> dict[str, float]:
    """Module docstring: target step, tree verify and drafter level costs and their ratios."""
    from adtbench.drafters.session import DraftSession
    from adtbench.policies.eagle2 import Eagle2Policy
    from adtbench.sampling import SamplingParams

    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    prompt = "a large red circle left of a small blue square on a striped green background"
    inputs = target.encode_prompt(prompt, cfg=True)
    res = target.start(inputs, 64)
    R = target.rows
    drafter.reset(R, res.features.shape[1] + target.layout.num_gen_tokens + 80)
    toks = torch.randint(target.layout.num_codes, (prefix,)) + target.layout.image_token_offset
    root_e = target.embed_tokens(toks[:1])[None].expand(R, 1, -1)
    drafter.extend(res.features, torch.cat([res.input_embeds[:, 1:], root_e], 1), res.positions, res.valid)
    chain = torch.ones(prefix, prefix, dtype=torch.bool).tril()
    _, f = target.verify_forward(toks, chain, torch.arange(prefix))
    pos = target.next_pos[:, None] + torch.arange(prefix)[None]
    target.commit(torch.arange(prefix))
    emb = target.embed_tokens(torch.cat([toks[1:], toks[:1]]))[None].expand(R, -1, -1)
    out = drafter.extend(f, emb, pos, torch.ones(R, prefix, dtype=torch.bool))
    one, zero = torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)

    def session() -> DraftSession:
        drafter.rollback()
        return DraftSession(drafter, target, sp, int(toks[0]), prefix, target.next_pos.clone(), out, None)

    tree = Eagle2Policy(4, 10, 59).propose(session(), 5)
    drafter.rollback()
    step = _median_ms(lambda: target.verify_forward(toks[:1], one, zero), repeats)
    verify = _median_ms(lambda: target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth), repeats)

    def level() -> None:
        s = session()
        top = s.root_logprobs().topk(10).indices
        s.expand([0] * 10, top)

    draft = _median_ms(level, repeats)
    drafter.rollback()
    return {
        "threads": torch.get_num_threads(),
        "tree_nodes": tree.size,
        "step_ms": step,
        "verify_ms": verify,
        "draft_ms": draft,
        "verify_over_step": verify / step,
        "draft_over_step": draft / step,
    }


@torch.no_grad()
def sample_grid(out: Path, n: int = 8, seed: int = 0) -> dict:
    """AR vs EAGLE-2 samples (same seeds) and the ground truth of ``n`` held-out prompts → PNG."""
    from PIL import Image

    from adtbench.engine import decode_ar, generate
    from adtbench.models.mini_evaluator import load_mini_evaluator
    from adtbench.policies.eagle2 import Eagle2Policy
    from adtbench.sampling import SamplingParams
    from adtbench.scenes import iter_split, render

    target, drafter = _load()
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    scenes = [s for _, s in iter_split(0, "heldout", n)]
    rows: dict[str, list[np.ndarray]] = {"ar": [], "spec": [], "truth": []}
    taus = []
    for i, s in enumerate(scenes):
        inputs = target.encode_prompt(s.caption, cfg=True)
        a = decode_ar(target, inputs, sp, torch.Generator().manual_seed(seed + i))
        b = generate(target, drafter, Eagle2Policy(4, 10, 59), inputs, sp, torch.Generator().manual_seed(seed + i))
        taus.append(b.tau)
        rows["ar"].append(target.decode_image(target.layout.tokens_to_codes(a.tokens)))
        rows["spec"].append(target.decode_image(target.layout.tokens_to_codes(b.tokens)))
        rows["truth"].append(render(s, 64))
    pad = np.full((64, 2, 3), 255, np.uint8)

    def row(imgs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([x for im in imgs for x in (im, pad)][:-1], axis=1)

    sep = np.full((2, row(rows["ar"]).shape[1], 3), 255, np.uint8)
    grid = np.concatenate([row(rows["ar"]), sep, row(rows["spec"]), sep, row(rows["truth"])], axis=0)
    Image.fromarray(grid).resize((grid.shape[1] * 2, grid.shape[0] * 2), Image.NEAREST).save(out)
    ev = load_mini_evaluator()
    caps = [s.caption for s in scenes]
    return {
        "captions": caps,
        "tau": taus,
        "agreement_ar": float(np.mean(ev.score(np.stack(rows["ar"]), caps))),
        "agreement_spec": float(np.mean(ev.score(np.stack(rows["spec"]), caps))),
        "agreement_truth": float(np.mean(ev.score(np.stack(rows["truth"]), caps))),
    }


def main(args: list[str]) -> int:
    if not args or args[0] not in ("ratios", "grid"):
        print(__doc__)
        return 2
    kv = dict(a.split("=", 1) for a in args[1:])
    if "threads" in kv:
        torch.set_num_threads(int(kv["threads"]))
    if args[0] == "ratios":
        target, drafter = _load(kv.get("model", "mini"), kv.get("drafter", "mini"))
        print(json.dumps(cost_ratios(target, drafter, int(kv.get("repeats", 30))), indent=2))
    else:
        out = Path(kv.get("out", str(ROOT / "docs" / "mini_samples.png")))
        out.parent.mkdir(parents=True, exist_ok=True)
        print(json.dumps(sample_grid(out, int(kv.get("n", 8))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
