"""The fixed-shape Jacobi step (``algorithm.methods.jacobi.step``) against the host-driven loop on the CPU, one process.

SCD at window L (argv[1], default 16) on ``model=mini``, T = 1, its verifies through static buckets without graphs
(``request_static(graphs=False)``, the CPU's stand-in for ``engine.compile``): ``engine.graphs.step=eager`` (the loop)
and ``engine.graphs.step=graph`` (the step run eagerly at its fixed shapes) alternate per image (ABBA over 3 prompts × 2
repeats, after one warm-up each); prints decode seconds, forwards, τ and ms per forward of each, and the ratio.
Usage: ``.venv/bin/python benchmarks/jacobi_step_cpu.py [L]`` (docs/speed.md, "The device-resident Jacobi step")."""

from __future__ import annotations

import sys

import torch

from adtbench.algorithm.ar import ar_tokens
from adtbench.algorithm.engine import generate
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.policies.jacobi import JacobiModels
from adtbench.graph_modes import GraphModes
from adtbench.harness.config import compose_config, resolve_paths
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams

PROMPTS = (
    "a small red circle on a plain white background",
    "a large blue square left of a small green circle on a striped yellow background",
    "a small purple square above a large orange circle on a checkered blue background",
)


def main(L: int) -> None:
    torch.set_num_threads(1)
    cfg = compose_config("config", ["model=mini"])
    resolve_paths(cfg)
    target = build_target(cfg.model, plain_decode=ar_tokens)
    target.request_static(graphs=False)
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    pols = {s: POLICIES.build("scd", {"window": L}) for s in ("eager", "graph")}
    for s, pol in pols.items():
        pol.graphs = GraphModes(step=s)  # engine.graphs.step (``config.build_policy`` sets it from the config)
    inputs = [target.encode_prompt(p, cfg=True) for p in PROMPTS]
    seconds: dict[str, float] = dict.fromkeys(pols, 0.0)
    forwards, committed = dict.fromkeys(pols, 0), dict.fromkeys(pols, 0)

    def decode(s: str, x: object, seed: int) -> object:
        return generate(
            target, JacobiModels(), pols[s], x, sp, torch.Generator().manual_seed(seed), acceptance="device"
        )

    for s in pols:
        decode(s, inputs[0], 0)  # warm-up
    for rep in range(2):
        for i, x in enumerate(inputs):
            for s in ("eager", "graph") if (i + rep) % 2 == 0 else ("graph", "eager"):
                r = decode(s, x, 10 * rep + i)
                assert r.stats["step"] == ("fixed-shape" if s == "graph" else "eager"), r.stats["step"]
                seconds[s] += r.latency_s - r.prefill_s
                forwards[s] += len(r.cycles)
                committed[s] += r.committed
    for s in pols:
        print(
            f"engine.graphs.step={s}: decode {seconds[s]:.2f} s, {forwards[s]} forwards, "
            f"τ {committed[s] / forwards[s]:.2f}, {1e3 * seconds[s] / forwards[s]:.1f} ms per forward"
        )
    ratio = (seconds["graph"] / forwards["graph"]) / (seconds["eager"] / forwards["eager"])
    print(f"ms per forward, fixed-shape step / host-driven loop: {ratio:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
