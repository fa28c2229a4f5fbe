"""Benchmarks (scripts, not tests).

    adtbench bench overhead [hydra overrides] [bench.prompts=N] [bench.out=FILE]
    adtbench bench cost model=anole model.random_init=true [bench.tree_sizes=[1,2,...]] [bench.level_nodes=16]
                        [bench.repeats=20] [bench.overhead_prompts=2] [bench.out=FILE]
    adtbench bench speed [bench.rows=[...]] [bench.prompts=20] [bench.out=DIR] [bench.readme=README.md] [overrides]
    adtbench bench versus [overrides] --variant NAME [overrides] --variant NAME [overrides] ... [bench.prompts=20]

``overhead``: engine overhead per draft–verify cycle = cycle wall time − time inside the target's verify
forwards − time inside the drafter (its forwards and the LM-head calls that score its outputs). Prefill
(the target prompt pass and the drafter's prefix pass) is excluded from both sides. Timers wrap the forward
calls; on CUDA each reading synchronises. Reports the mean per cycle over ``bench.prompts`` prompts after
one warm-up generation.

``cost``: the cost model of one draft–verify cycle on this machine (``adtbench.algorithm.cost.measure_cost``, the same
measurement ``budget: cost`` trees use), for any model — real-shaped ones with random weights included (timing
does not depend on the weights): the target's verification forward vs tree size (1…128 nodes by default) at a
KV length of half the image, one drafter level vs its node count (drafter forward + LM head + processing), the
fixed per-cycle work, and — unless ``bench.overhead_prompts=0`` — the engine's non-model overhead per cycle
measured by ``overhead`` on full generations. Each timing is the median of ``bench.repeats`` runs after warm-up,
CUDA-synchronised on a GPU. CPU and GPU alike.

``speed``: the speed table (``adtbench.tools.bench_speed``): one app job per row on the same prompts, each timing the
AR baseline in the same job; τ, d̄, speedup with its CI and median, and the cost model's bound per row.

``versus``: a head-to-head (``adtbench.tools.bench_versus``): several policy settings and the AR baseline timed in one
job, interleaved per prompt, with each setting's time ratio to the first and its CI.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from adtbench.algorithm.cost import fill_cache, fill_cache_to, median_ms, random_tree  # noqa: F401 (re-exported)
from adtbench.algorithm.engine import generate
from adtbench.errors import ConfigError
from adtbench.harness.caches import cost_source
from adtbench.harness.config import build_rule, build_sampling, prompt_seed, register_resolvers, resolve_paths, validate
from adtbench.harness.drafters import build_drafter
from adtbench.io import atomic_write_json
from adtbench.resources import conf_dir


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


def overhead(cfg: Any, target: Any = None, drafter: Any = None) -> dict:
    """Engine overhead per cycle (module docstring); ``target``/``drafter`` reuse already-built models."""
    register_resolvers()
    sp, policy = validate(cfg)
    if not policy.uses_drafter:
        raise ConfigError("policy", "the overhead benchmark needs a drafting policy")
    from adtbench.harness.app import load_dataset
    from adtbench.models.registry import build_target

    if cfg.get("threads") is not None:
        torch.set_num_threads(int(cfg.threads))
    prompts = load_dataset(cfg)[: int(cfg.bench.prompts)]
    if target is None:
        target = build_target(cfg.model)
    if drafter is None:
        drafter = build_drafter(cfg.drafter, target)
    rule = build_rule(cfg, target)
    cache_dir = cfg.get("paths", {}).get("cache_dir")
    policy.bind(cost_source(target, drafter, sp, None if cache_dir is None else Path(str(cache_dir))))
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


DEFAULT_TREE_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)


@torch.no_grad()
def cost(cfg: Any) -> dict:
    """The cost model of this machine for ``cfg.model`` (``algorithm.cost.measure_cost``: verify forward vs tree size,
    one drafter level vs its node count, the fixed per-cycle work) plus, unless ``bench.overhead_prompts=0``, the
    engine's non-model overhead per cycle on full generations. CPU and GPU alike; weights may be random."""
    from omegaconf import OmegaConf

    from adtbench.algorithm.cost import measure_cost
    from adtbench.harness.drafters import build_drafter
    from adtbench.models.registry import build_target

    b = cfg.bench
    register_resolvers()
    sizes = [int(x) for x in (b.get("tree_sizes") or DEFAULT_TREE_SIZES)]
    if not sizes or min(sizes) < 1:
        raise ConfigError("bench.tree_sizes", f"need positive tree sizes, got {sizes}")
    repeats = int(b.get("repeats", 20))
    if cfg.get("threads") is not None:
        torch.set_num_threads(int(cfg.threads))
    target = build_target(cfg.model)
    drafter = build_drafter(cfg.drafter, target) if str(cfg.drafter.get("kind")) == "eagle" else None
    if drafter is None:
        drafter = build_drafter(OmegaConf.merge(cfg.drafter, {"kind": "eagle", "path": None}), target)
    sp = build_sampling(cfg.sampling)  # the composed sampling group (default: T = 1, CFG 3)
    if not target.supports_cfg:
        sp = dataclasses.replace(sp, cfg_scale=1.0)
    model = measure_cost(target, drafter, sp, max(sizes), int(b.get("level_nodes", 16)), repeats, sizes=sizes)
    sync = target.device.type == "cuda"
    result: dict[str, Any] = {
        "model": str(cfg.model.name),
        "device": torch.cuda.get_device_name(target.device) if sync else f"cpu ({torch.get_num_threads()} threads)",
        "dtype": str(target.dtype).replace("torch.", ""),
        "cfg_rows": 2 if sp.use_cfg else 1,
        "kv_len": model.meta["kv_len"],
        "repeats": repeats,
        "cost_model": model.to_json(),
        "verify": [
            {"tree_nodes": n, "target_forward_ms": ms, "ms_per_node": ms / n, "x_step": ms / model.step_ms}
            for n, ms in zip(model.verify_nodes, model.verify_ms)
        ],
        "drafter_level": [
            {"nodes": m, "ms": ms, "x_step": ms / model.step_ms} for m, ms in zip(model.level_nodes, model.level_ms)
        ],
        "fixed_ms": model.fixed_ms,
    }
    n_over = int(b.get("overhead_prompts", 2))
    if n_over > 0:
        resolved = {"dtype": result["dtype"], "device": str(target.device)}  # `auto` → what was built
        over_cfg = OmegaConf.merge(cfg, {"bench": {"prompts": n_over}, "model": resolved})
        result["overhead"] = overhead(over_cfg, target=target, drafter=drafter)
    return result


def cost_table(r: dict) -> str:
    """Markdown tables of a ``cost`` result (for docs/README)."""
    from adtbench.algorithm.cost import CostModel

    head = f"{r['model']} on {r['device']}, {r['dtype']}, {r['cfg_rows']} CFG row(s), KV ≈ {r['kv_len']}"
    lines = [head, "", CostModel.from_json(r["cost_model"]).table()]
    if "overhead" in r:
        o = r["overhead"]
        lines.append(
            f"engine overhead: {o['overhead_ms']:.2f} ms of a {o['cycle_ms']:.2f} ms cycle "
            f"({100 * o['overhead_frac']:.1f} %; target {o['target_forward_ms']:.2f} ms, "
            f"drafter {o['drafter_ms']:.2f} ms)"
        )
    return "\n".join(lines)


USAGE = "usage: adtbench bench overhead|cost|speed|versus [hydra overrides]"


def main(args: list[str]) -> int:
    if not args or args[0] not in ("overhead", "cost", "speed", "versus"):
        print(USAGE)
        return 2
    if args[0] == "speed":
        from adtbench.tools.bench_speed import main as speed_main

        return speed_main(args[1:])
    if args[0] == "versus":
        from adtbench.tools.bench_versus import main as versus_main

        return versus_main(args[1:])
    conf = str(conf_dir())
    register_resolvers()
    extra = ["+bench.prompts=8", "+bench.out=null"]
    if args[0] == "cost":
        extra += ["+bench.tree_sizes=null", "+bench.level_nodes=16", "+bench.repeats=20", "+bench.overhead_prompts=2"]
    with initialize_config_dir(version_base="1.3", config_dir=conf):
        cfg = compose("config", overrides=[*extra, *args[1:]])
    resolve_paths(cfg)  # relative dataset / weight paths against paths.root_dir, as in the app
    try:
        r = overhead(cfg) if args[0] == "overhead" else cost(cfg)
    except ConfigError as e:
        print(f"adtbench: config error: {e}")
        return 2
    if args[0] == "cost":
        print(cost_table(r))
    else:
        cols = ["model", "policy", "device", "threads", "cycles", "cycle_ms", "target_forward_ms", "drafter_ms",
                "overhead_ms", "overhead_frac"]  # fmt: skip
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    if cfg.bench.out:
        atomic_write_json(Path(str(cfg.bench.out)), r, newline=False)
    return 0
