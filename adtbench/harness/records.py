"""The records of a run directory as types: a prompt's :class:`SampleRecord` (a ``samples.jsonl`` line), its trace
(:func:`trace_record`, a ``trace.jsonl`` line) and the run's :class:`Summary` (``summary.json``), each built here
from what the engine returns (``GenerationResult``) and the baseline timing, with ``to_json()`` / ``from_json()``
giving the on-disk JSON (docs/outputs.md documents every field). :meth:`Summary.line` is the one-line result a run
prints. :func:`migrate_run_config` reads the ``run_config.json`` of runs made before config keys were added (resume).

Pure types and builders: :mod:`adtbench.harness.rundir` is the one module that writes (and reads) these files.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from adtbench.graph_modes import GRAPH_MODES, GRAPH_PARTS
from adtbench.harness.stats import summarize

if TYPE_CHECKING:
    from adtbench.algorithm.records import GenerationResult

__all__ = [
    "CONTEXT_FIELDS",
    "MERGE_FIELDS",
    "RESUME_NEW_KEYS",
    "SLIM_DROP",
    "TIMING_SCOPE",
    "SampleRecord",
    "Summary",
    "TraceRecord",
    "aa_part",
    "eval_part",
    "lantern_part",
    "migrate_run_config",
    "moved_graph_keys",
    "slim",
    "summary_line",
    "trace_record",
]

TIMING_SCOPE = "prefill + decode loop (text encoding, VQ decode and image writing excluded); CUDA synchronised"

# ----------------------------------------------------------------------------------------------------
# samples.jsonl
# ----------------------------------------------------------------------------------------------------


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


@dataclass
class SampleRecord:
    """One ``samples.jsonl`` line (fields in file order). Old lines may lack fields added since (``None`` here)."""

    prompt_id: str
    prompt: str | None = None
    seed: int | None = None
    tokens: list[int] | None = None
    cycles: int = 0
    committed: int = 0
    tau: float | None = None
    d_bar: float | None = None
    d_bar_tree: float | None = None
    drafted_depth_sum: int = 0
    tree_depth_sum: int = 0
    target_forwards: int | None = None
    drafter_forwards: int | None = None
    latency_s: float = 0.0
    prefill_s: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    latency_repeats_s: list[float] | None = None
    baseline_latency_s: float | None = None
    baseline_latency_repeats_s: list[float] | None = None
    baseline_target_forwards: int | None = None
    speedup: float | None = None
    tokens_match_baseline: bool | None = None
    encode_s: float | None = None
    baseline_encode_s: float | None = None
    reference_latency_s: float | None = None  # timing.reference_baseline: AR through the reference implementation
    reference_latency_repeats_s: list[float] | None = None
    speedup_ref: float | None = None  # reference_latency_s / latency_s
    reference_tokens_match_baseline: bool | None = None  # the two implementations' AR decoded the same tokens
    aa_latency_s: float | None = None  # timing.aa: the AR baseline timed again, in the method's role (A/A control)
    aa_latency_repeats_s: list[float] | None = None
    aa_ratio: float | None = None  # baseline_latency_s / aa_latency_s: 1 up to timing noise
    stats: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    batch: dict[str, Any] | None = None  # decode.batch_size > 1: the window it was decoded in (docs/outputs.md)
    image: str | None = None  # set by ``ResultStore.commit``: ``images/<safe id>.png``, or None without an image

    @classmethod
    def build(
        cls,
        prompt: Any,
        seed: int,
        runs: list[GenerationResult],
        bases: list[GenerationResult] | None,
        batch: dict[str, Any] | None = None,
        refs: list[GenerationResult] | None = None,
        aas: list[GenerationResult] | None = None,
    ) -> SampleRecord:
        """The record of a prompt's timed repeats (``runs`` of the method, ``bases`` of the baseline, ``refs`` of
        the baseline through the reference implementation: ``timing.reference_baseline``, ``aas`` of the baseline
        timed again in the method's role: ``timing.aa``).

        Token and count fields come from the first repeat (every repeat decodes the same tokens); ``latency_s``,
        ``prefill_s``, ``draft_s``, ``verify_s``, ``baseline_latency_s``, ``reference_latency_s`` and
        ``aa_latency_s`` are medians over the repeats, whose latencies are kept in ``latency_repeats_s`` /
        ``baseline_latency_repeats_s`` / ``reference_latency_repeats_s`` / ``aa_latency_repeats_s``; ``speedup`` =
        baseline / method, ``speedup_ref`` = reference / method, ``aa_ratio`` = baseline / A/A side.
        """
        res, base = runs[0], (bases[0] if bases else None)
        lat = _median([r.latency_s for r in runs])
        base_lat = None if not bases else _median([b.latency_s for b in bases])
        ref_lat = None if not refs else _median([r.latency_s for r in refs])
        aa_lat = None if not aas or base_lat is None else _median([a.latency_s for a in aas])
        return cls(
            prompt_id=prompt.prompt_id,
            prompt=prompt.text,
            seed=seed,
            tokens=res.tokens,
            cycles=len(res.cycles),
            committed=res.committed,
            tau=res.tau,
            d_bar=res.d_bar,
            d_bar_tree=res.d_bar_tree,
            drafted_depth_sum=sum(c.drafted_depth for c in res.cycles),
            tree_depth_sum=sum(c.tree_depth for c in res.cycles),
            target_forwards=res.target_forwards,
            drafter_forwards=res.drafter_forwards,
            latency_s=lat,
            prefill_s=_median([r.prefill_s for r in runs]),
            draft_s=_median([r.draft_s for r in runs]),
            verify_s=_median([r.verify_s for r in runs]),
            latency_repeats_s=[r.latency_s for r in runs],
            baseline_latency_s=base_lat,
            baseline_latency_repeats_s=None if not bases else [b.latency_s for b in bases],
            baseline_target_forwards=None if base is None else base.target_forwards,
            speedup=None if base_lat is None else base_lat / lat,
            tokens_match_baseline=None if base is None else res.tokens == base.tokens,
            encode_s=_median([r.encode_s for r in runs]),
            baseline_encode_s=None if not bases else _median([b.encode_s for b in bases]),
            reference_latency_s=ref_lat,
            reference_latency_repeats_s=None if not refs else [r.latency_s for r in refs],
            speedup_ref=None if ref_lat is None else ref_lat / lat,
            reference_tokens_match_baseline=None if not refs or base is None else refs[0].tokens == base.tokens,
            aa_latency_s=aa_lat,
            aa_latency_repeats_s=None if aa_lat is None or not aas else [a.latency_s for a in aas],
            aa_ratio=None if aa_lat is None or base_lat is None else base_lat / aa_lat,
            stats=res.stats,
            meta=prompt.meta,
            batch=batch,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the line (every field, in order; ``image`` last)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SampleRecord:
        """A record from a line; fields the line lacks (older runs) take their defaults, unknown keys are dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})

    def slim(self) -> dict[str, Any]:
        """:func:`slim` of the JSON."""
        return slim(self.to_json())


SLIM_DROP = ("tokens", "prompt", "meta")


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """A sample's JSON without its bulky fields (:data:`SLIM_DROP`): what a job keeps in memory for summaries."""
    return {k: v for k, v in obj.items() if k not in SLIM_DROP}


# ----------------------------------------------------------------------------------------------------
# trace.jsonl
# ----------------------------------------------------------------------------------------------------


class TraceRecord(TypedDict, total=False):
    """One ``trace.jsonl`` line: the per-cycle trace as parallel lists (plus policy-specific fields)."""

    prompt_id: str
    pos: list[int]
    nodes: list[int]
    D: list[int]
    d: list[int]
    K: list[int]
    a: list[int]


def trace_record(prompt_id: str, res: GenerationResult) -> dict[str, Any]:
    """The trace line of a decode: ``TRACE_FIELDS`` per cycle, then each cycle's extra fields (sorted by name)."""
    from adtbench.algorithm.records import TRACE_FIELDS

    t: dict[str, Any] = {"prompt_id": prompt_id}
    for key, attr in TRACE_FIELDS.items():
        t[key] = [getattr(c, attr) for c in res.cycles]
    for key in sorted({k for c in res.cycles for k in c.extra}):
        t[key] = [c.extra.get(key) for c in res.cycles]
    return t


# ----------------------------------------------------------------------------------------------------
# summary.json
# ----------------------------------------------------------------------------------------------------

#: The run's context in a summary, after :func:`summarize`'s keys (the composed choices and what they decoded with).
CONTEXT_FIELDS = (
    "lantern",
    "model",
    "drafter",
    "policy",
    "dataset",
    "sampling",
    "choices",
    "policy_params",
    "sampling_params",
    "greedy_matches_baseline",
    "n_prompts",
    "complete",
    "acceptance_rule",
    "lantern_params",
    "timing_scope",
    "lossless",
    "lossless_reason",
)
#: What a merged run (``adtbench merge``) adds after ``env``.
MERGE_FIELDS = ("envs", "env_consistent", "merged_from")
_EMPTY_STATS = {"n_samples": 0, "tau": None, "d_bar": None, "speedup": None}


@dataclass
class Summary:
    """``summary.json``: ``stats`` (:func:`summarize` of the samples) first, then the run's context
    (:data:`CONTEXT_FIELDS`), ``run`` (this job's machine state and set-up times: threads, cores, load averages,
    warm-up / bind / compile), ``env`` (software and device), ``merge`` (merged runs: :data:`MERGE_FIELDS`) and the
    ``eval`` block (``adtbench eval`` / ``eval=…``). The JSON is flat: :meth:`to_json` writes these parts' keys in
    that order, :meth:`from_json` splits them again."""

    stats: dict[str, Any] = field(default_factory=lambda: dict(_EMPTY_STATS))
    lantern: Any = False
    model: str | None = None
    drafter: str | None = None
    policy: str | None = None
    dataset: str | None = None
    sampling: str | None = None
    choices: dict[str, Any] = field(default_factory=dict)
    policy_params: dict[str, Any] | None = None
    sampling_params: dict[str, Any] | None = None
    greedy_matches_baseline: bool | None = None
    n_prompts: int = 0
    complete: bool = False
    acceptance_rule: str = "exact"
    lantern_params: dict[str, Any] | None = None
    timing_scope: str = TIMING_SCOPE
    lossless: bool | None = None  # job.exactness: greedy token- / sampled distribution-identical to AR; None: unknown
    lossless_reason: str | None = None
    run: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] | None = None
    merge: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None

    @classmethod
    def build(
        cls,
        records: list[dict[str, Any]],
        cfg: Any,
        choices: dict[str, Any],
        env: dict[str, Any] | None,
        n_prompts: int,
        rule_name: str = "exact",
        run_info: dict[str, Any] | None = None,
        lantern_used: dict[str, Any] | None = None,
        lossless: tuple[bool, str] | None = None,
    ) -> Summary:
        """The summary of a job: :func:`summarize` of its ``records`` (sample JSON, slim or whole) plus the config
        choices, the environment, ``run_info``, ``lantern_used`` (the LANTERN values the job decoded with,
        ``caches.lantern_used``; None with LANTERN off) and ``lossless`` (``job.exactness``: the flag and its
        reason; None: unknown)."""
        from omegaconf import OmegaConf

        greedy = float(cfg.sampling.temperature) == 0.0
        return cls(
            stats=summarize(records) if records else dict(_EMPTY_STATS),
            lantern=bool(cfg.get("lantern", {}).get("enabled", False)),
            model=choices.get("model", cfg.model.get("name")),
            drafter=choices.get("drafter"),
            policy=choices.get("policy", cfg.policy.name),
            dataset=choices.get("dataset"),
            sampling=choices.get("sampling"),
            choices=choices,
            policy_params=OmegaConf.to_container(cfg.policy, resolve=True),  # type: ignore[arg-type]
            sampling_params=OmegaConf.to_container(cfg.sampling, resolve=True),  # type: ignore[arg-type]
            greedy_matches_baseline=_greedy_matches(records) if greedy else None,
            n_prompts=n_prompts,
            complete=len(records) == n_prompts,
            acceptance_rule=rule_name,
            lantern_params=lantern_used,
            lossless=None if lossless is None else lossless[0],
            lossless_reason=None if lossless is None else lossless[1],
            run=dict(run_info or {}),
            env=env,
        )

    @classmethod
    def merged(
        cls,
        records: list[dict[str, Any]],
        shard_summaries: list[Summary | None],
        sources: list[dict[str, Any]],
        greedy: bool,
        n_prompts: int,
        complete: bool,
    ) -> Summary:
        """The summary of a merged run: :func:`summarize` of all shards' ``records``, the context of the first
        shard summary (None: a shard without one), the shards' distinct environments (``env`` when they agree) and
        ``sources``."""
        first = next((s for s in shard_summaries if s is not None), None)
        own = ("greedy_matches_baseline", "n_prompts", "complete")  # the merged run's own
        context = {k: getattr(first, k) for k in CONTEXT_FIELDS if k not in own} if first is not None else {}
        envs = [s.env for s in shard_summaries if s is not None and s.env]
        distinct = [json.loads(e) for e in sorted({json.dumps(e, sort_keys=True) for e in envs})]
        return cls(
            stats=summarize(records),
            **context,
            greedy_matches_baseline=_greedy_matches(records) if greedy else None,
            n_prompts=n_prompts,
            complete=complete,
            env=distinct[0] if len(distinct) == 1 else None,
            merge={"envs": distinct, "env_consistent": len(distinct) <= 1, "merged_from": sources},
        )

    def to_json(self) -> dict[str, Any]:
        """The flat JSON object of ``summary.json`` (class docstring)."""
        out = dict(self.stats)
        out |= {k: getattr(self, k) for k in CONTEXT_FIELDS}
        out |= self.run
        out["env"] = self.env
        out |= self.merge or {}
        if self.eval is not None:
            out["eval"] = self.eval
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Summary:
        """A summary from its JSON: context, ``env``, merge and ``eval`` keys by name; any other key is a statistic
        before the first context key and a ``run`` key after it (the order :meth:`to_json` writes)."""
        parts: dict[str, Any] = {"stats": {}, "run": {}}
        merge: dict[str, Any] = {}
        seen_context = False
        for k, v in obj.items():
            if k in CONTEXT_FIELDS:
                parts[k], seen_context = v, True
            elif k in ("env", "eval"):
                parts[k] = v
            elif k in MERGE_FIELDS:
                merge[k] = v
            else:
                parts["run" if seen_context else "stats"][k] = v
        return cls(**parts, merge=merge or None)

    def line(self) -> str:
        """The one-line result a run prints: model, policy, LANTERN on/off (:func:`lantern_part`), n, τ, d̄,
        latency, the speedup with its CI, the A/A control's ratio with its CI and its flag (:func:`aa_part`;
        ``timing.aa``), ``speedup_ref`` (against the reference implementation's AR), eval
        scores, ``LOSSY (<reason>)`` for a lossy method (``lossless`` false), a randomly initialised drafter
        (``drafter_random``) and the timing warnings."""
        s = self.to_json()

        def f(key: str, fmt: str, unit: str = "") -> str:
            v = s.get(key)
            return "n/a" if v is None else f"{v:{fmt}}{unit}"

        line = f"adtbench: model={s.get('model')} policy={s.get('policy')} {lantern_part(s)} n={s.get('n_samples')} "
        line += f"tau={f('tau', '.3f')} d_bar={f('d_bar', '.2f')} latency={f('latency_s', '.4f', 's')}"
        jac = s.get("jacobi")
        if isinstance(jac, dict) and jac.get("window_mean") is not None:  # policy=sjd|scd|gsd: the mean window
            line += f" window={jac['window_mean']:.1f}"
        if s.get("speedup") is not None:
            line += f" baseline={f('baseline_latency_s', '.4f', 's')} speedup={f('speedup', '.3f', 'x')}"
            ci = s.get("speedup_ci")
            if ci and None not in ci:
                line += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
                if s.get("speedup_ci_caveat"):
                    line += f" (CI over {s.get('speedup_n')} < 5 prompts)"
            line += f" median={f('speedup_median', '.3f', 'x')}"
        line += aa_part(s)
        if s.get("speedup_ref") is not None:  # timing.reference_baseline: against the papers' AR (transformers)
            line += f" reference={f('reference_latency_s', '.4f', 's')} speedup_ref={f('speedup_ref', '.3f', 'x')}"
            ci = s.get("speedup_ref_ci")
            if ci and None not in ci:
                line += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
        if (s.get("batch_size") or 1) > 1:
            line += f" batch={s['batch_size']} throughput={f('throughput_images_per_s', '.3f', ' img/s')}"
            if s.get("throughput_speedup") is not None:
                line += f" baseline={f('baseline_throughput_images_per_s', '.3f', ' img/s')}"
                line += f" throughput_speedup={f('throughput_speedup', '.3f', 'x')}"
        line += eval_part(s.get("eval"))
        if s.get("lossless") is False:  # never read a lossy speedup as an exact method's
            line += f" LOSSY ({s.get('lossless_reason')})"
        if s.get("drafter_random"):
            line += " RANDOM DRAFTER (no drafter.path): a smoke test, tau and speedup mean nothing"
        if s.get("load_warning"):
            line += f" LOAD {f('load_peak', '.2f')} > {s.get('cpus_available')} CORES: timings unreliable"
        if s.get("timing_warning"):
            line += f" NOISY TIMING (repeats differ by {100 * s['timing_spread']:.1f} %): timings unreliable"
        return line


def _greedy_matches(records: list[dict[str, Any]]) -> bool | None:
    """Whether every record with a baseline decoded its tokens (None without any)."""
    matches = [r["tokens_match_baseline"] for r in records if r.get("tokens_match_baseline") is not None]
    return all(matches) if matches else None


def summary_line(s: dict[str, Any]) -> str:
    """:meth:`Summary.line` of a ``summary.json`` object."""
    return Summary.from_json(s).line()


def aa_part(s: dict[str, Any]) -> str:
    """`` aa=<ratio>x [lo, hi]`` (``timing.aa``: the AR baseline against itself, in the speedup's interleaving),
    followed by ``A/A EXCLUDES 1: …`` when its interval excludes 1 (``aa_warning``); empty without an A/A timing."""
    if s.get("aa_ratio") is None:
        return ""
    out = f" aa={s['aa_ratio']:.3f}x"
    ci = s.get("aa_ratio_ci")
    if ci and None not in ci:
        out += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
        if (s.get("aa_ratio_n") or 0) < 5:
            out += f" (CI over {s.get('aa_ratio_n')} < 5 prompts)"
    if s.get("aa_warning"):
        out += " A/A EXCLUDES 1: the timing favours one side at this level"
    return out


def lantern_part(s: dict[str, Any]) -> str:
    """``lantern=off``, or ``lantern=on`` with the bounds and k used (``lantern=on(delta=0.1,k=511)``)."""
    if not s.get("lantern"):
        return "lantern=off"
    p = s.get("lantern_params") or {}
    used = [
        f"{name}={p[key]:g}"
        for key, name in (("delta", "delta"), ("lam", "lam"), ("k", "k"))
        if isinstance(p.get(key), int | float)
    ]
    return "lantern=on" + (f"({','.join(used)})" if used else "")


def eval_part(block: Any) -> str:
    """`` eval=<kind> name=value ...`` from a summary's ``eval`` block (4 significant digits; ``n/a`` for a
    metric without a value; ``FAILED(<metric>)`` when a metric raised); empty without an eval block."""
    if not isinstance(block, dict) or (not block.get("values") and not block.get("error")):
        return ""
    parts = [f" eval={block.get('kind', '?')}"]
    for name, v in (block.get("values") or {}).items():
        parts.append(f"{name}={'n/a' if not isinstance(v, int | float) else f'{v:.4g}'}")
    if block.get("error"):
        parts.append(f"FAILED({block['error'].get('metric', '?')})")
    return " ".join(parts)


# ----------------------------------------------------------------------------------------------------
# run_config.json of older runs (resume)
# ----------------------------------------------------------------------------------------------------

#: Config nodes and keys added after run dirs existed: a run_config.json without them ran with these values.
RESUME_NEW_KEYS: dict[str, Any] = {
    "timing": {"repeats": 1, "reference_baseline": False, "aa": False},
    "engine": {"compile": False, "acceptance": "auto", "graphs": dict.fromkeys(GRAPH_PARTS, "auto")},  # the CPU: eager
    "decode": {"batch_size": 1, "window": 4},
}


def migrate_run_config(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved ``run_config.json`` as today's config fingerprint would read: nodes and keys added since
    (:data:`RESUME_NEW_KEYS`, and ``drafter.random`` of an EAGLE drafter) take the values the run decoded with;
    saved values win; the keys that moved into ``engine.graphs`` read as their new keys (:func:`moved_graph_keys`)."""
    saved = moved_graph_keys(saved)
    old = {**RESUME_NEW_KEYS, **saved}
    for key, defaults in RESUME_NEW_KEYS.items():  # a node that gained keys: the saved values over the defaults
        if isinstance(saved.get(key), dict):
            old[key] = {**defaults, **saved[key]}
    drafter = saved.get("drafter")
    if isinstance(drafter, dict) and drafter.get("kind") == "eagle":  # drafter.random (an EAGLE drafter's key)
        old["drafter"] = {"random": False, **drafter}
    return old


def moved_graph_keys(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with the keys ``engine.graphs`` replaced (``graph_modes.MOVED_KEYS``) moved there:
    ``engine.verify_step`` → ``engine.graphs.verify``, a Jacobi ``policy.step`` (a value among ``auto | graph |
    eager``) → ``engine.graphs.step``, the flag ``policy.graph_levels`` → ``engine.graphs.levels`` (true: ``auto``,
    false: ``eager``); the parts none of them set ``auto``, as they decoded. A config without them is returned as
    is."""
    engine, policy = dict(saved.get("engine") or {}), dict(saved.get("policy") or {})
    found: dict[str, Any] = {}
    if "verify_step" in engine:
        found["verify"] = engine.pop("verify_step")
    if policy.get("step") in GRAPH_MODES:
        found["step"] = policy.pop("step")
    if isinstance(policy.get("graph_levels"), bool):
        found["levels"] = "auto" if policy.pop("graph_levels") else "eager"
    if not found:
        return saved
    engine["graphs"] = {**dict.fromkeys(GRAPH_PARTS, "auto"), **found, **(engine.get("graphs") or {})}
    return {**saved, "engine": engine, **({"policy": policy} if "policy" in saved else {})}
