"""Figures of the mini model card (``docs/mini_model.md``): cost ratios and the sample grid.

    python -m adtbench.tools.train.report ratios [model=mini] [threads=N] [repeats=R]
    python -m adtbench.tools.train.report grid [out=docs/mini_samples.png] [n=8]
    python -m adtbench.tools.train.report sweep DIR      # τ / d̄ / speedup rows of a `run.py -m` sweep
    python -m adtbench.tools.train.report card           # regenerate adtbench/weights/mini/MODEL_CARD.md

``ratios``, ``grid`` and ``sweep`` also store what they measured in ``adtbench/weights/mini/figures.json``
(with the machine and thread count); ``card`` renders the model card from the stages' ``train_info.json``
and ``figures.json`` only — no figure in the card is typed by hand.

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
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from adtbench.io import atomic_write_json, atomic_write_text
from adtbench.resources import conf_dir

ROOT = Path(__file__).resolve().parents[3]


def _sampling_params(name: str = "default") -> Any:
    """The ``conf/sampling/<name>.yaml`` group as ``SamplingParams`` (built where the app builds its own)."""
    from adtbench.harness.config import build_sampling

    return build_sampling(OmegaConf.load(conf_dir() / "sampling" / f"{name}.yaml"))


def _load(model: str = "mini", drafter: str = "mini") -> tuple[Any, Any]:
    from adtbench.harness.config import register_resolvers
    from adtbench.harness.drafters import build_drafter
    from adtbench.models.registry import build_target

    register_resolvers()
    target = build_target(OmegaConf.load(conf_dir() / "model" / f"{model}.yaml"))
    d = build_drafter(OmegaConf.load(conf_dir() / "drafter" / f"{drafter}.yaml"), target)
    return target, d


def _median_ms(fn: Any, repeats: int, device: torch.device) -> float:
    """One warm-up call, then :func:`adtbench.tools.bench.median_ms` (CUDA-synchronised on a GPU)."""
    from adtbench.algorithm.cost import median_ms

    fn()
    return median_ms(fn, repeats, device.type == "cuda")


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
    step = _median_ms(lambda: target.verify_forward(toks[:1], one, zero), repeats, target.device)
    verify = _median_ms(
        lambda: target.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth), repeats, target.device
    )

    s0 = session()
    top = s0.root_logprobs().topk(10).indices

    def level() -> None:
        session().expand([0] * 10, top)

    draft = _median_ms(level, repeats, target.device)
    feats = s0.outputs[:, :1].expand(R, 10, -1)
    embeds = target.embed_tokens(top)[None].expand(R, -1, -1)
    dpos = target.next_pos[:, None].expand(R, 10)
    eye = torch.eye(10, dtype=torch.bool)
    gen_idx = torch.full((10,), prefix + 2)

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
def sample_grid(out: Path, n: int = 8, seed: int = 0) -> dict:
    """AR vs EAGLE-2 samples (same seeds) and the ground truth of ``n`` held-out prompts → PNG."""
    from PIL import Image

    from adtbench.algorithm.engine import decode_ar, generate
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.models.mini_evaluator import load_mini_evaluator
    from adtbench.scenes import iter_split, render

    target, drafter = _load()
    sp = _sampling_params()
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


WEIGHTS = ROOT / "adtbench" / "weights" / "mini"
FIGURES = WEIGHTS / "figures.json"
STAGES = ("vq", "ar8", "ar16", "drafter", "evaluator")
REPRODUCE = """adtbench train vq
adtbench train vq init_from=outputs/train/vq/final out_dir=outputs/train/vq2 steps=300 lr=1e-3 warmup=10 \\
    export='${pkg:weights/mini/vq}'
adtbench train evaluator
adtbench train evaluator init_from=outputs/train/evaluator/final out_dir=outputs/train/evaluator2 steps=800 \\
    lr=1e-3 warmup=10 export='${pkg:weights/mini/evaluator}'
adtbench train ar config=ar_lowres export='${pkg:weights/mini/ar8}'
adtbench train ar
adtbench train ar init_from=outputs/train/ar16/final out_dir=outputs/train/ar16b data.count=10000 steps=2000 \\
    lr=1e-3 warmup=20 export='${pkg:weights/mini/ar16}'
adtbench train drafter export='${pkg:weights/mini/drafter}'"""


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


def _store(key: str, value: Any) -> None:
    figs = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    figs[key] = value
    atomic_write_json(FIGURES, figs, indent=1, sort_keys=True)


def _metrics(d: dict[str, Any], prefix: str = "") -> str:
    return ", ".join(
        f"{k[len(prefix) :]} {v:.3f}"
        for k, v in d.items()
        if k.startswith(prefix) and k != "grad_norm" and isinstance(v, float)
    )


def _sampling(sp: dict[str, Any]) -> str:
    t = "greedy" if sp["temperature"] == 0 else f"T = {sp['temperature']:g}"
    extra = [f"top-k {sp['top_k']}"] * (sp["top_k"] > 0) + [f"top-p {sp['top_p']:g}"] * (sp["top_p"] < 1)
    return ", ".join([t, f"CFG {sp['cfg_scale']:g}", *extra])


def render_card() -> str:
    """MODEL_CARD.md from every stage's ``train_info.json`` and ``figures.json`` (see module docstring)."""
    info = {st: json.loads((WEIGHTS / st / "train_info.json").read_text()) for st in STAGES}
    figs = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    size = {st: sum(p.stat().st_size for p in (WEIGHTS / st).glob("*.safetensors")) / 2**20 for st in STAGES}
    lines = [
        "# Mini model card (adtbench's embedded default)",
        "",
        "Generated by `python -m adtbench.tools.train.report card` from each stage's `train_info.json` and the",
        "measured `figures.json` next to the weights; full description in `docs/mini_model.md`.",
        "",
        "| stage | steps (last run) | wall (min, last run) | weights (MiB) | seed | training items | final train "
        "| held-out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for st in STAGES:
        i, c = info[st], info[st].get("config", {})
        items = i.get("train_scenes") or i.get("teacher_train") or (c.get("data") or {}).get("count") or "fresh"
        held = {
            k: v
            for k, v in i.items()
            if k.startswith("heldout_")
            or k.startswith("psnr")
            or k.startswith("agreement")
            or k.endswith("_agreement")
            or k == "engine_tau_greedy"
            or k == "engine_tau_t1"
        }
        lines.append(
            f"| `{st}` | {i['steps']} | {i['wall_s'] / 60:.1f} | {size[st]:.2f} | {c.get('seed')} | {items} | "
            f"{_metrics(i['final'])} | {_metrics(held)} |"
        )
    lines += ["", f"Total weights: {sum(size.values()):.1f} MiB (budget 40 MiB).", ""]
    for key, r in sorted(figs.items()):
        if key.startswith("ratios"):
            lines += [
                f"**Cost ratios** ({r['threads']} thread(s), {r.get('machine', '?')}): "
                f"target step {r['step_ms']:.1f} ms, "
                f"59-node tree verify {r['verify_ms']:.1f} ms (verify/step **{r['verify_over_step']:.2f}**), drafter "
                f"network on 10 nodes {r['draft_forward_ms']:.2f} ms (/step **{r['draft_forward_over_step']:.2f}**), "
                f"drafting level incl. bookkeeping {r['draft_ms']:.2f} ms (/step {r['draft_over_step']:.2f}).",
                "",
            ]
    if "grid" in figs:
        g = figs["grid"]
        lines += [
            f"**Caption agreement** (mini evaluator, {len(g['captions'])} held-out prompts, T = 1, CFG 3): AR "
            f"{g['agreement_ar']:.3f}, EAGLE-2 speculative {g['agreement_spec']:.3f}, ground truth "
            f"{g['agreement_truth']:.3f}.",
            "",
        ]
    for key, rows in sorted(figs.items(), reverse=True):  # sweep_t1 before sweep_greedy
        if not key.startswith("sweep"):
            continue
        r0 = rows["rows"][0]
        lines += [
            f"**Speculative decoding** (`{rows['command']}`; {r0['n']} prompts of `{r0['dataset']}`, "
            f"{_sampling(r0['sampling'])}, {r0['threads']} thread(s); speedup = mean AR latency / mean method latency, "
            "same job):",
            "",
            "| policy | lantern | τ | d̄ | speedup | latency (s) | AR latency (s) | caption agreement |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['policy']} | {r['lantern']} | {r['tau']:.2f} | {r['d_bar']:.2f} | {r['speedup']:.2f} | "
            f"{r['latency_s']:.2f} | {r['baseline_latency_s']:.2f} | "
            + ("–" if r.get("agreement") is None else f"{r['agreement']:.3f}")
            + " |"
            for r in rows["rows"]
        ]
        lines.append("")
    lines += ["## Reproduce", "", "```bash", REPRODUCE, "```", ""]
    return "\n".join(lines)


def main(args: list[str]) -> int:
    if not args or args[0] not in ("ratios", "grid", "sweep", "card"):
        print(__doc__)
        return 2
    pos = [a for a in args[1:] if "=" not in a]
    kv = dict(a.split("=", 1) for a in args[1:] if "=" in a)
    if "threads" in kv:
        torch.set_num_threads(int(kv["threads"]))
    if args[0] == "ratios":
        target, drafter = _load(kv.get("model", "mini"), kv.get("drafter", "mini"))
        r = cost_ratios(target, drafter, int(kv.get("repeats", 30)))
        r["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
        _store(f"ratios_t{r['threads']}", r)
        print(json.dumps(r, indent=2))
    elif args[0] == "grid":
        out = Path(kv.get("out", str(ROOT / "docs" / "mini_samples.png")))
        out.parent.mkdir(parents=True, exist_ok=True)
        g = sample_grid(out, int(kv.get("n", 8)))
        _store("grid", g)
        print(json.dumps(g, indent=2))
    elif args[0] == "sweep":
        rows = sweep_rows(Path(pos[0]))
        _store(f"sweep_{kv.get('name', 'main')}", {"command": kv.get("command", ""), "rows": rows})
        print(json.dumps(rows, indent=1))
    else:
        atomic_write_text(WEIGHTS / "MODEL_CARD.md", render_card())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
