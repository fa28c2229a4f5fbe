"""Benchmarks (scripts, not tests).

    adtbench bench overhead [hydra overrides] [bench.prompts=N] [bench.out=FILE]

``overhead``: engine overhead per draft–verify cycle = cycle wall time − time inside the target's verify
forwards − time inside the drafter (its forwards and the LM-head calls that score its outputs). Prefill
(the target prompt pass and the drafter's prefix pass) is excluded from both sides. Timers wrap the forward
calls; on CUDA each reading synchronises. Reports the mean per cycle over ``bench.prompts`` prompts after
one warm-up generation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from adtbench.config import build_rule, prompt_seed, register_resolvers, validate
from adtbench.drafters.build import build_drafter
from adtbench.engine import generate
from adtbench.errors import ConfigError


class _Timed:
    """Wrap ``obj.name`` to accumulate its wall time (seconds) and call count."""

    def __init__(self, obj: Any, name: str, sync: bool) -> None:
        self.total, self.calls, self.sync = 0.0, 0, sync
        fn = getattr(obj, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            if self.sync:
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*a, **k)
            if self.sync:
                torch.cuda.synchronize()
            self.total += time.perf_counter() - t
            self.calls += 1
            return out

        setattr(obj, name, wrapped)


def overhead(cfg: Any) -> dict:
    register_resolvers()
    sp, policy = validate(cfg)
    if not policy.uses_drafter:
        raise ConfigError("policy", "the overhead benchmark needs a drafting policy")
    from adtbench.app import load_dataset
    from adtbench.models.registry import build_target

    if cfg.get("threads") is not None:
        torch.set_num_threads(int(cfg.threads))
    prompts = load_dataset(cfg)[: int(cfg.bench.prompts)]
    target = build_target(cfg.model)
    drafter = build_drafter(cfg.drafter, target)
    rule = build_rule(cfg, target)
    sync = target.device.type == "cuda"
    use_cfg = sp.use_cfg and target.supports_cfg

    def run(text: str, seed: int):
        g = torch.Generator(device=target.device if sync else "cpu").manual_seed(seed)
        return generate(target, drafter, policy, target.encode_prompt(text, use_cfg), sp, g, rule)

    run(prompts[0].text, 0)  # warm-up
    t_fwd = _Timed(target, "_forward", sync)
    d_fwd = _Timed(drafter, "forward", sync)
    head = _Timed(target, "lm_head", sync)
    cycles, cycle_s, prefix_drafter = 0, 0.0, 0.0
    for p in prompts:
        before = d_fwd.total
        calls = d_fwd.calls
        res = run(p.text, prompt_seed(int(cfg.seed), p.prompt_id))
        cycles += len(res.cycles)
        cycle_s += res.latency_s - res.prefill_s
        # the drafter's first forward of each image is its prefix pass (inside prefill_s)
        if d_fwd.calls > calls:
            prefix_drafter += min(d_fwd.total - before, res.prefill_s)
    target_s = t_fwd.total
    drafter_s = d_fwd.total - prefix_drafter + head.total
    per = {
        "cycle_ms": 1e3 * cycle_s / cycles,
        "target_forward_ms": 1e3 * target_s / cycles,
        "drafter_ms": 1e3 * drafter_s / cycles,
    }
    per["overhead_ms"] = per["cycle_ms"] - per["target_forward_ms"] - per["drafter_ms"]
    per["overhead_frac"] = per["overhead_ms"] / per["cycle_ms"]
    return {
        "model": str(cfg.model.name),
        "policy": policy.name,
        "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "cycles": cycles,
        **per,
    }


def main(args: list[str]) -> int:
    if not args or args[0] != "overhead":
        print("usage: adtbench bench overhead [hydra overrides]")
        return 2
    conf = str(Path(__file__).resolve().parent.parent / "conf")
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=conf):
        cfg = compose("config", overrides=["+bench.prompts=8", "+bench.out=null", *args[1:]])
    try:
        r = overhead(cfg)
    except ConfigError as e:
        print(f"adtbench: config error: {e}")
        return 2
    cols = ["model", "policy", "device", "threads", "cycles", "cycle_ms", "target_forward_ms", "drafter_ms",
            "overhead_ms", "overhead_frac"]  # fmt: skip
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    if cfg.bench.out:
        Path(str(cfg.bench.out)).write_text(json.dumps(r, indent=2))
    return 0
