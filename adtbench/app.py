"""The Hydra app: decode a prompt set with one model × drafter × policy, timing the AR baseline alongside.

Per job (Hydra's run dir):
- ``samples.jsonl``: one line per prompt, appended and fsynced when its image is done (the commit marker);
- ``trace.jsonl``: the compact per-cycle trace of each prompt (pos, nodes, D, d, K, a);
- ``images/<prompt_id>.png``;
- ``summary.json``: τ, d̄, speedup (ratio of mean latencies) and its per-prompt spread, the composed choices,
  the environment; refreshed during the run (every 10 s) and written at the end;
- ``run_config.json``: the resolved config; a rerun into the same dir resumes only if it matches.

Speedup protocol: the baseline is ``decode_ar`` of the same target, same prompts, seeds, sampling, CFG rows,
dtype and device; ``warmup`` untimed generations of both after model load; baseline and method alternate in
order from prompt to prompt. Timed scope: prefill + decode loop (text encoding and VQ decode excluded).
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from adtbench.config import build_rule, config_fingerprint, prompt_seed, register_resolvers, validate
from adtbench.data.prompts import Prompt, load_prompts
from adtbench.drafters.build import build_drafter
from adtbench.engine import GenerationResult, decode_ar, generate
from adtbench.errors import ConfigError
from adtbench.results import ResultStore, summarize

log = logging.getLogger("adtbench")
register_resolvers()

SUMMARY_EVERY_S = 10.0  # summary.json refresh interval during a run (always written at the end)
TIMING_SCOPE = "prefill + decode loop (text encoding, VQ decode and image writing excluded); CUDA synchronised"


def environment(target: Any) -> dict[str, Any]:
    import transformers

    dev = target.device
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(dev),
        "dtype": str(target.dtype).replace("torch.", ""),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if dev.type == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(dev), "cuda": torch.version.cuda}
    return info


def load_dataset(cfg: DictConfig) -> list[Prompt]:
    d = cfg.dataset
    return load_prompts(
        str(d.kind),
        None if d.get("path") is None else str(d.path),
        d.get("limit"),
        d.get("shard"),
        caption=str(d.get("caption", "first")),
        text=None if d.get("text") is None else str(d.text),
    )


def sample_record(prompt: Prompt, seed: int, res: GenerationResult, base: GenerationResult | None) -> dict:
    rec: dict[str, Any] = {
        "prompt_id": prompt.prompt_id,
        "prompt": prompt.text,
        "seed": seed,
        "tokens": res.tokens,
        "cycles": len(res.cycles),
        "committed": res.committed,
        "tau": res.tau,
        "d_bar": res.d_bar,
        "d_bar_tree": res.d_bar_tree,
        "drafted_depth_sum": sum(c.D for c in res.cycles),
        "tree_depth_sum": sum(c.d for c in res.cycles),
        "target_forwards": res.target_forwards,
        "drafter_forwards": res.drafter_forwards,
        "latency_s": res.latency_s,
        "prefill_s": res.prefill_s,
        "draft_s": res.draft_s,
        "verify_s": res.verify_s,
        "baseline_latency_s": None if base is None else base.latency_s,
        "baseline_target_forwards": None if base is None else base.target_forwards,
        "speedup": None if base is None else base.latency_s / res.latency_s,
        "tokens_match_baseline": None if base is None else res.tokens == base.tokens,
        "meta": prompt.meta,
    }
    return rec


def trace_record(prompt_id: str, res: GenerationResult) -> dict:
    t: dict[str, Any] = {"prompt_id": prompt_id}
    for key in ("pos", "nodes", "D", "d", "K", "a"):
        t[key] = [getattr(c, key) for c in res.cycles]
    for key in sorted({k for c in res.cycles for k in c.extra}):
        t[key] = [c.extra.get(key) for c in res.cycles]
    return t


SLIM_DROP = ("tokens", "prompt", "meta")


def slim(record: dict) -> dict:
    """A samples record without its bulky fields (kept in memory for summaries)."""
    return {k: v for k, v in record.items() if k not in SLIM_DROP}


def make_summary(
    records: list[dict], cfg: DictConfig, choices: dict, env: dict, n_prompts: int, rule_name: str = "exact"
) -> dict:
    s = summarize(records) if records else {"n_samples": 0, "tau": None, "d_bar": None, "speedup": None}
    greedy = float(cfg.sampling.temperature) == 0.0
    matches = [r["tokens_match_baseline"] for r in records if r.get("tokens_match_baseline") is not None]
    s |= {
        "lantern": bool(cfg.get("lantern", {}).get("enabled", False)),
        "model": choices.get("model", cfg.model.get("name")),
        "drafter": choices.get("drafter"),
        "policy": choices.get("policy", cfg.policy.name),
        "dataset": choices.get("dataset"),
        "sampling": choices.get("sampling"),
        "choices": choices,
        "policy_params": OmegaConf.to_container(cfg.policy, resolve=True),
        "sampling_params": OmegaConf.to_container(cfg.sampling, resolve=True),
        "greedy_matches_baseline": (all(matches) if matches else None) if greedy else None,
        "n_prompts": n_prompts,
        "complete": len(records) == n_prompts,
        "acceptance_rule": rule_name,
        "timing_scope": TIMING_SCOPE,
        "env": env,
    }
    return s


def summary_line(s: dict) -> str:
    """The one-line result a run prints."""

    def f(key: str, fmt: str, unit: str = "") -> str:
        v = s.get(key)
        return "n/a" if v is None else f"{v:{fmt}}{unit}"

    line = f"adtbench: model={s.get('model')} policy={s.get('policy')} n={s.get('n_samples')} "
    line += f"tau={f('tau', '.3f')} d_bar={f('d_bar', '.2f')} latency={f('latency_s', '.4f', 's')}"
    if s.get("speedup") is not None:
        line += f" baseline={f('baseline_latency_s', '.4f', 's')} speedup={f('speedup', '.3f', 'x')}"
    return line


def check_resume(run_dir: Path, cfg: DictConfig) -> None:
    """Refuse to append to a run dir whose results came from a different config."""
    path = run_dir / "run_config.json"
    fp = config_fingerprint(cfg)
    if path.exists():
        old = json.loads(path.read_text())
        if old != fp:
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            raise ConfigError(
                "hydra.run.dir", f"{run_dir} holds results of a different config (differs in: {', '.join(diff)})"
            )
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fp, indent=2))


def run(cfg: DictConfig, run_dir: Path, choices: dict[str, str]) -> dict:
    """Validate, load, decode every unfinished prompt, write records; returns the summary."""
    sp, policy = validate(cfg)
    if cfg.get("eval") is not None and str(cfg.eval.get("kind", "none")) != "none":
        from adtbench.eval import validate as validate_eval

        validate_eval(cfg)  # missing metric weights fail before any model loads
    prompts = load_dataset(cfg)
    check_resume(run_dir, cfg)
    store = ResultStore(run_dir)
    done = store.done_ids()
    todo = [p for p in prompts if p.prompt_id not in done]
    log.info("%d prompts (%d already done) → %s", len(prompts), len(prompts) - len(todo), run_dir)

    from adtbench.models.registry import build_target

    if cfg.get("threads") is not None:
        torch.set_num_threads(int(cfg.threads))
    log.info(
        "loading model=%s (family %s) on %s, %s",
        choices.get("model"),
        cfg.model.family,
        cfg.model.device,
        cfg.model.dtype,
    )
    target = build_target(cfg.model)
    drafter = build_drafter(cfg.drafter, target) if policy.uses_drafter else None
    rule = build_rule(cfg, target)
    env = environment(target)
    use_cfg = sp.use_cfg and target.supports_cfg
    gen_device = target.device if target.device.type == "cuda" else torch.device("cpu")

    def decode(p: Prompt, seed: int, method: bool) -> GenerationResult:
        inputs = target.encode_prompt(p.text, cfg=use_cfg)
        g = torch.Generator(device=gen_device).manual_seed(seed)
        if method:
            return generate(target, drafter, policy, inputs, sp, g, rule)
        return decode_ar(target, inputs, sp, g)

    if todo:
        for _ in range(int(cfg.warmup)):
            decode(todo[0], 0, True)
            if cfg.baseline:
                decode(todo[0], 0, False)
    from adtbench.tracking import build_logger

    tracker = build_logger(cfg, run_dir, choices)
    try:
        summary = _decode_all(cfg, todo, target, decode, store, tracker, run_dir, choices, env, len(prompts), rule)
        if cfg.get("eval") is not None and str(cfg.eval.get("kind", "none")) != "none":
            from adtbench.eval import run_eval

            summary = run_eval(cfg, run_dir, target=target)
            tracker.log_summary(summary)
    finally:
        tracker.finish()
    print(f"{summary_line(summary)} -> {run_dir}")
    return summary


def _decode_all(cfg, todo, target, decode, store, tracker, run_dir, choices, env, n_prompts, rule) -> dict:
    """Decode every unfinished prompt (baseline and method), commit its records, refresh the summary."""
    from tqdm import tqdm

    policy_name = str(cfg.policy.name)
    records = [slim(r) for r in store.records()]
    last_summary = time.perf_counter()
    for i, p in enumerate(tqdm(todo, desc=policy_name, disable=not cfg.progress, file=sys.stderr)):
        seed = prompt_seed(int(cfg.seed), p.prompt_id)
        base = None
        if cfg.baseline and i % 2 == 0:
            base = decode(p, seed, False)
        res = decode(p, seed, True)
        if cfg.baseline and i % 2 == 1:
            base = decode(p, seed, False)
        image = target.decode_image(target.layout.tokens_to_codes(res.tokens)) if cfg.save_images else None
        trace = trace_record(p.prompt_id, res)
        record = sample_record(p, seed, res, base)
        store.commit(record, trace, image)
        if cfg.get("maps") is not None and cfg.maps.get("per_image"):
            from adtbench.maps import write_sample_maps

            write_sample_maps(run_dir, trace, target.layout)
        records.append(slim(record))
        if time.perf_counter() - last_summary > SUMMARY_EVERY_S:  # keep summary.json current, cheaply
            store.write_summary(make_summary(records, cfg, choices, env, n_prompts, rule.name))
            last_summary = time.perf_counter()
        tracker.log_sample(record, trace, image)
    summary = make_summary(records, cfg, choices, env, n_prompts, rule.name)
    store.write_summary(summary)
    if cfg.get("maps") is not None and cfg.maps.get("per_run"):
        from adtbench.maps import write_run_maps

        write_run_maps(run_dir, store.traces(), target.layout)
    tracker.log_summary(summary)
    return summary


CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    try:
        return run(cfg, Path(hc.runtime.output_dir), dict(hc.runtime.choices))
    except ConfigError as e:
        log.error("config error: %s", e)
        print(f"adtbench: config error: {e}", file=sys.stderr)
        sys.exit(2)
