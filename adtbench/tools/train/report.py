"""Figures of the mini model card (``docs/mini_model.md``): cost ratios and the sample grid.

    python -m adtbench.tools.train.report ratios [model=mini] [threads=N] [repeats=R] [device=cuda]
    python -m adtbench.tools.train.report grid [out=docs/mini_samples.png] [n=8] [device=cuda]
    python -m adtbench.tools.train.report sweep DIR      # τ / d̄ / speedup rows of a `run.py -m` sweep
    python -m adtbench.tools.train.report card           # regenerate adtbench/weights/mini/MODEL_CARD.md
    python -m adtbench.tools.train.report evaluator      # re-measure the evaluator against the shipped VQ

``ratios``, ``grid`` and ``sweep`` also store what they measured in ``adtbench/weights/mini/figures.json``
(with the machine and thread count); ``card`` renders the model card from the stages' ``train_info.json``
and ``figures.json`` only — no figure in the card is typed by hand.

The measurements live in :mod:`adtbench.tools.train.figures`, the card in :mod:`adtbench.tools.train.card`;
this module is their command line.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import torch

from adtbench.io import atomic_write_text
from adtbench.tools.train.card import render_card
from adtbench.tools.train.figures import ROOT, WEIGHTS, cost_ratios, load_models, sample_grid, store_figure, sweep_rows


def main(args: list[str]) -> int:
    if not args or args[0] not in ("ratios", "grid", "sweep", "card", "evaluator"):
        print(__doc__)
        return 2
    pos = [a for a in args[1:] if "=" not in a]
    kv = dict(a.split("=", 1) for a in args[1:] if "=" in a)
    if "threads" in kv:
        torch.set_num_threads(int(kv["threads"]))
    if args[0] == "ratios":
        target, drafter = load_models(kv.get("model", "mini"), kv.get("drafter", "mini"), kv.get("device"))
        r = cost_ratios(target, drafter, int(kv.get("repeats", 30)))
        r["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
        store_figure(f"ratios_t{r['threads']}", r)
        print(json.dumps(r, indent=2))
    elif args[0] == "grid":
        out = Path(kv.get("out", str(ROOT / "docs" / "mini_samples.png")))
        out.parent.mkdir(parents=True, exist_ok=True)
        g = sample_grid(out, int(kv.get("n", 8)), device=kv.get("device"))
        store_figure("grid", g)
        print(json.dumps(g, indent=2))
    elif args[0] == "sweep":
        rows = sweep_rows(Path(pos[0]))
        store_figure(f"sweep_{kv.get('name', 'main')}", {"command": kv.get("command", ""), "rows": rows})
        print(json.dumps(rows, indent=1))
    elif args[0] == "evaluator":  # after a tokenizer change: its agreement through the VQ is stale
        from adtbench.tools.train.evaluator import rescore

        stats = rescore(WEIGHTS / "evaluator", Path(kv.get("vq_path", str(WEIGHTS / "vq"))))
        print(json.dumps(stats, indent=1))
    else:
        atomic_write_text(WEIGHTS / "MODEL_CARD.md", render_card())
    return 0


if __name__ == "__main__":
    from adtbench import accel

    accel.activate_from_env()  # ADTBENCH_SIMULATE_DEVICE=cuda with device=cuda: the simulated device
    sys.exit(main(sys.argv[1:]))
