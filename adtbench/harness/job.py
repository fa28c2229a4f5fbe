"""One decode job, built: the one place a composed config becomes models, a bound policy and the calls that decode.

``Job.build(cfg, checked)`` checks nothing new: it takes a config the app's checks passed (``app.check_config``:
schema, ranges, prompts) with its typed values (``config.Checked``: what it reads of the keys the schema types) and
builds, in this order — the order matters for what is measured —

1. the target (``model``; ``threads`` set first), its sampling parameters clamped to it (``clamp_top_k``);
2. the drafter (``drafter``) for a tree policy, or a loop policy's own models (``harness.loops``), or none;
3. the acceptance rule (``lantern``), where acceptance runs (``engine.acceptance``);
4. ``engine.compile``: the target's (and drafter's) static buckets and CUDA graphs on a GPU (or the simulated one),
   ``torch.compile`` elsewhere (``compile_models``) — *before* the policy is bound, so a ``budget: cost`` policy's cost
   model is measured on what the run replays;
5. ``policy.bind`` (the cost model: cached under ``paths.cache_dir`` or measured);
6. batched decoding (``decode.batch_size > 1``: ``harness.batched.BatchedDecoder``).

Then ``warm_up``, ``decode(prompt, method)`` (one prompt, one side, its seed from ``seed`` and the prompt id) and
``decode_window(prompts, index)`` (a batched window, both sides) are what the app, every ``adtbench bench`` tool and
the drafter's training evaluation call: nothing else assembles a job, so a benchmark measures what ``python run.py``
runs.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from adtbench import accel
from adtbench.algorithm.drafters.eagle import EagleDrafter
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies import POLICIES, LoopPolicy, Method, Policy
from adtbench.algorithm.records import Clock, GenerationResult
from adtbench.algorithm.verify import AcceptanceRule
from adtbench.errors import ConfigError
from adtbench.harness.caches import cost_source
from adtbench.harness.config import Checked, build_rule, prompt_seed
from adtbench.harness.data.prompts import Prompt
from adtbench.harness.drafters import build_drafter
from adtbench.harness.loops import build_loop_models
from adtbench.harness.schema import AppConf
from adtbench.sampling_params import SamplingParams

log = logging.getLogger("adtbench")

_SAME_AS_AR = "greedy token-identical, sampled distribution-identical to AR"


@dataclasses.dataclass(frozen=True)
class Exactness:
    """Whether a composed method decodes exactly what AR would (``lossless``: greedy token-identical, sampled
    distribution-identical), and why (``reason``, one line naming the policy, the rule and the deciding setting)."""

    lossless: bool
    reason: str


def _rule_text(rule: Any) -> str:
    """The acceptance rule as a config reader names it: ``exact acceptance`` or ``lantern=on(delta=…, …)``."""
    if getattr(rule, "name", "exact") == "exact":
        return "exact acceptance"
    keys = ("delta", "lam", "k", "reference_residual")
    used = [f"{k}={getattr(rule, k)}" for k in keys if getattr(rule, k, None) is not None]
    name = "lantern" if rule.name == "lantern" else f"acceptance rule {rule.name}"
    return f"{name}=on({', '.join(used)})" if used else f"{name}=on"


def _policy_text(policy: Policy) -> str:
    """``policy=<name>`` and the keys that decide a loop's exactness (``policy.rule`` / ``variant`` / ``window``)."""
    params = getattr(policy, "params", None)
    keys = [f"policy.{k}={getattr(params, k)}" for k in ("rule", "variant") if hasattr(params, k)]
    if not keys and isinstance(getattr(policy, "window", None), int):
        keys = [f"policy.window={policy.window}"]  # type: ignore[union-attr]
    return f"policy={policy.name}" + (f" ({', '.join(keys)})" if keys else "")


def exactness(policy: Policy, rule: Any) -> Exactness:
    """Whether ``policy`` decoding under the acceptance ``rule`` is lossless: the one place the two declarations
    compose (summaries, ``run_config.json``'s provenance, ``adtbench table`` and ``adtbench report`` read it).

    What each side declares (tested where it is declared): a tree policy's draft tree is verified by ``rule``, so it
    is lossless iff ``rule.lossless`` (``verify.AcceptanceRule``: exact; ``lantern.LanternRule``: only with a zero
    bound, δ = 0 or λ = 1, and the principled residual); AR (no drafts) is AR whatever the rule. A loop policy
    declares ``lossless`` for its own loop (ZipAR never, MuLo-SD and the Jacobi loops by their ``rule``, SJD-PAC by
    its ``variant``); one that ``accepts_rule`` (SJD, SCD) is lossless iff it declares so and ``rule.lossless``; a
    registered method that declares no lossless rule (``Method.lossless`` empty) is lossy whatever its policy says.
    ``rule``: anything with ``name`` and ``lossless`` (an ``AcceptanceRule``; LANTERN's bounds are named when set)."""
    what, rule_ok = _policy_text(policy), bool(getattr(rule, "lossless", False))
    method = POLICIES.get(policy.name) if policy.name in POLICIES else None
    if isinstance(method, Method) and not method.lossless:  # the method's own declaration (``Method.lossless``)
        return Exactness(False, f"{what}: the method declares itself lossy")
    if isinstance(policy, LoopPolicy):
        if not policy.lossless:
            return Exactness(False, f"{what}: the loop is lossy by its own rule, not distribution-identical to AR")
        if policy.accepts_rule and not rule_ok:
            return Exactness(False, f"{what} accepts with the run's rule and {_rule_text(rule)} relaxes it: lossy")
        how = _rule_text(rule) if policy.accepts_rule else "its own exact rule"
        return Exactness(True, f"{what} with {how}: {_SAME_AS_AR}")
    if not policy.uses_drafter:
        return Exactness(True, f"{what}: no drafts, AR itself")
    if not rule_ok:
        return Exactness(False, f"{what}: {_rule_text(rule)} relaxes the verification of its drafts: lossy")
    return Exactness(True, f"{what}, drafts verified by {_rule_text(rule)}: {_SAME_AS_AR}")


@dataclasses.dataclass
class Job:
    """A built job (module docstring). ``cfg``: the composed config (the open ``model`` node, the nodes the loaders
    take whole); ``conf``: its typed, checked values (``config.Checked.conf``), which the job reads. ``models``: the
    EAGLE drafter of a tree policy, a loop policy's own models (``LoopPolicy.generate``'s ``aux``), or None (AR)."""

    cfg: DictConfig
    conf: AppConf
    sp: SamplingParams
    policy: Policy
    target: Any
    models: Any
    rule: AcceptanceRule
    acceptance: str
    compiled: bool
    batch_size: int
    window: int
    bind_s: float
    batched: Any = None  # ``harness.batched.BatchedDecoder`` when batch_size > 1
    reference: Any = None  # ``timing.reference_baseline``: the target on the reference implementation (AR only)

    @classmethod
    def build(cls, cfg: DictConfig, checked: Checked, prompts: list[Prompt] | None = None) -> Job:
        """Build the job of a checked config (``config.validate``): ``build_models``, then ``Job.over`` them.
        ``prompts`` (optional): warn about those longer than the model's text window."""
        target, models = build_models(cfg, checked.conf, checked.policy)
        if prompts:
            warn_long_prompts(target, prompts, str(cfg.model.get("name")))
        job = cls.over(cfg, checked, target, models)
        if checked.conf.timing.reference_baseline:
            job.reference = build_reference(cfg)
        return job

    @classmethod
    def over(cls, cfg: DictConfig, checked: Checked, target: Any, models: Any) -> Job:
        """The job over models ``build_models`` made (compiled already under ``engine.compile``): the sampling
        parameters clamped to the target, the rule, where acceptance runs, the policy bound to the machine's cost
        model (timed: ``bind_s``), the batched decoder under ``decode.batch_size > 1``."""
        conf, policy = checked.conf, checked.policy
        sp = clamp_top_k(checked.sp, target)
        t = time.perf_counter()
        drafted = policy.uses_drafter and models is not None
        policy.bind(cost_source(target, models, sp, conf.cache_dir) if drafted else None)
        bind_s = time.perf_counter() - t
        log.info("policy bind: %.1f s", bind_s)
        batch, window = conf.decode.batch_size, conf.decode.window
        rule, acceptance, compiled = build_rule(cfg, conf, target), conf.engine.acceptance, conf.engine.compile
        job = cls(cfg, conf, sp, policy, target, models, rule, acceptance, compiled, batch, window, bind_s)
        if batch > 1:
            from adtbench.harness.batched import BatchedDecoder

            parts = (target, models, policy, job.sp, job.rule, job.acceptance, batch, job.use_cfg, job.gen_device)
            job.batched = BatchedDecoder(*parts, seed_of=job.seed_of, baseline=conf.baseline)
        return job

    def variant(self, cfg: DictConfig, checked: Checked) -> Job:
        """The same target with another setting that differs in ``policy.*`` / ``lantern.*`` only (``adtbench bench
        versus``): its own rule and bound policy; the drafter is shared (built here when this job had none)."""
        conf, policy, models = checked.conf, checked.policy, self.models
        if policy.uses_drafter and not self.policy.uses_drafter:
            models = build_drafter(cfg.drafter, self.target)
            if self.compiled:
                compile_models(self.target, models, cfg)
        elif not policy.uses_drafter:
            models = build_loop_models(cfg, conf, policy, self.target)
        t = time.perf_counter()
        policy.bind(cost_source(self.target, models, self.sp, conf.cache_dir) if policy.uses_drafter else None)
        return dataclasses.replace(
            self,
            cfg=cfg,
            conf=conf,
            policy=policy,
            models=models,
            rule=build_rule(cfg, conf, self.target),
            bind_s=time.perf_counter() - t,
            batched=None,
        )

    # --- what a decode needs -------------------------------------------------------------------------------------
    @property
    def use_cfg(self) -> bool:
        return self.sp.use_cfg and bool(self.target.supports_cfg)

    @property
    def gen_device(self) -> torch.device:
        """Where a decode's random generator lives: the model's device on a GPU, the host otherwise."""
        dev = self.target.device
        return dev if accel.is_cuda(dev) else torch.device("cpu")

    def seed_of(self, prompt: Prompt) -> int:
        """The prompt's seed (``seed`` and its id: stable under sharding and resume)."""
        return prompt_seed(self.conf.seed, prompt.prompt_id)

    def decode(self, prompt: Prompt, method: bool, seed: int | None = None) -> GenerationResult:
        """Decode ``prompt`` with the method (``method``) or the AR baseline, seeded by ``seed`` (default: the
        prompt's). The text encoding is timed apart (``encode_s``), outside ``latency_s``."""
        clock = Clock(self.target.device)
        t0 = clock.now()
        inputs = self.target.encode_prompt(prompt.text, cfg=self.use_cfg)
        encode_s = clock.now() - t0
        g = accel.generator(self.gen_device, self.seed_of(prompt) if seed is None else seed)
        if method:
            res = generate(self.target, self.models, self.policy, inputs, self.sp, g, self.rule, self.acceptance)
        else:
            res = decode_ar(self.target, inputs, self.sp, g)
        res.encode_s += encode_s  # + what the loop encoded itself (MuLo-SD's drafter prompt)
        return res

    def decode_reference(self, prompt: Prompt, seed: int | None = None) -> GenerationResult:
        """The AR baseline of ``prompt`` through the reference implementation (``timing.reference_baseline``): the
        same prompt, seed, sampling and CFG rows as :meth:`decode`'s baseline, on the reference target (never
        compiled: the papers' eager step). Its text encoding is timed apart, as :meth:`decode`'s."""
        ref = self.reference
        assert ref is not None, "timing.reference_baseline is off"
        clock = Clock(ref.device)
        t0 = clock.now()
        inputs = ref.encode_prompt(prompt.text, cfg=self.sp.use_cfg and bool(ref.supports_cfg))
        encode_s = clock.now() - t0
        g = accel.generator(self.gen_device, self.seed_of(prompt) if seed is None else seed)
        res = decode_ar(ref, inputs, self.sp, g)
        res.encode_s += encode_s
        return res

    def decode_window(self, prompts: list[Prompt], index: int) -> list[Any]:
        """A batched window (``BatchedDecoder.window``): both sides, baseline first when ``index`` is even."""
        assert self.batched is not None, "decode.batch_size is 1"
        return self.batched.window(prompts, index)

    def warm_up(self, prompts: list[Prompt], rounds: int, baseline: bool = True, aa: bool = False) -> float:
        """``rounds`` untimed decodes of the first prompt (a batched window of the first ``batch_size``), the method
        and (``baseline``) the AR side, its reference (``timing.reference_baseline``) and the A/A side (``aa``: the AR
        side again), so every timed side gets the same pre-work; compilation and graph capture happen here. Returns
        the seconds it took."""
        t = time.perf_counter()
        for _ in range(rounds if prompts else 0):
            if self.batched is not None:
                self.decode_window(prompts[: self.batch_size], 0)
                continue
            self.decode(prompts[0], True, seed=0)
            if baseline:
                self.decode(prompts[0], False, seed=0)
            if baseline and self.reference is not None:
                self.decode_reference(prompts[0], seed=0)
            if baseline and aa:
                self.decode(prompts[0], False, seed=0)
        return time.perf_counter() - t

    @property
    def exactness(self) -> Exactness:
        """Whether this job's method is lossless, and why (:func:`exactness` of its policy and rule)."""
        return exactness(self.policy, self.rule)

    @property
    def drafter_random(self) -> bool | None:
        """Whether the EAGLE drafter this job drafts with is randomly initialised (no ``drafter.path``: the tiny
        in-memory models, or ``drafter.random=true``); None when the policy runs no EAGLE drafter."""
        if not self.policy.drafts_with_eagle:
            return None
        return self.conf.drafter is None or self.conf.drafter.path is None

    def run_info(self) -> dict[str, Any]:
        """What a summary records of the built job: compile mode, graph capture times, batching, bind time, whether
        the drafter is random."""
        static = (self.batched.bt if self.batched and self.batched.bt else self.target).static
        drafter_static = self.models.static if isinstance(self.models, EagleDrafter) else None
        return {
            "drafter_random": self.drafter_random,
            "engine_compile": self.compiled,
            "graph_capture_s": None if static is None else static.capture_s,
            "drafter_graph_capture_s": None if drafter_static is None else drafter_static.capture_s,
            "batch_size": self.batch_size,
            "batch_window": self.window if self.batch_size > 1 else None,
            "bind_s": self.bind_s,
            "reference_baseline": None if self.reference is None else reference_name(self.cfg),
        }


def build_models(cfg: DictConfig, conf: AppConf, policy: Policy | None, eagle: bool = False) -> tuple[Any, Any]:
    """The target (``model``; ``threads`` set first) and what runs beside it: the EAGLE drafter for a drafting
    ``policy`` (or whenever ``eagle``: the measurement tools time drafter levels; a seeded random one when
    ``drafter.kind`` is none), a loop policy's own models, or None; compiled under ``engine.compile``
    (``compile_models``) — before any policy is bound, so a cost model is measured on what the run replays. ``conf``:
    ``cfg``'s typed values (``schema.check``; ``config.validate``'s for a run)."""
    from adtbench.algorithm.ar import ar_tokens
    from adtbench.models.registry import build_target

    if conf.threads is not None:
        torch.set_num_threads(conf.threads)
    log.info(
        "loading model=%s (family %s) on %s, %s",
        cfg.model.get("name"),
        cfg.model.family,
        cfg.model.device,
        cfg.model.dtype,
    )
    target = build_target(cfg.model, plain_decode=ar_tokens)
    drafting = eagle or (policy is not None and policy.uses_drafter)
    if drafting:
        eagle_kind = conf.drafter is not None and conf.drafter.kind == "eagle"
        node = cfg.drafter if eagle_kind else OmegaConf.merge(cfg.drafter, {"kind": "eagle", "path": None})
        models = build_drafter(node, target)
    else:
        models = None if policy is None else build_loop_models(cfg, conf, policy, target)
    if conf.engine.compile:  # one compiled target serves both sides; a loop policy's own models run as they are
        compile_models(target, models if drafting else None, cfg, batched=conf.decode.batch_size > 1)
    return target, models


def build_reference(cfg: DictConfig) -> Any:
    """``timing.reference_baseline``: a second target from the same ``model`` node on the family's reference
    implementation (``config.reference_impl``: transformers for Anole / Lumina-mGPT), same checkpoint, dtype and
    device — a second copy of the weights in memory. Never compiled (``engine.compile`` is the lean target's): it is
    the papers' eager AR step."""
    from adtbench.algorithm.ar import ar_tokens
    from adtbench.harness.config import reference_impl
    from adtbench.models.registry import build_target

    node = copy.deepcopy(cfg.model)
    OmegaConf.set_struct(node, False)
    node.impl = reference_impl(cfg)
    log.info("timing.reference_baseline: loading model=%s again with model.impl=%s", node.get("name"), node.impl)
    return build_target(node, plain_decode=ar_tokens)


def reference_name(cfg: DictConfig) -> str:
    """What the reference baseline ran on, for the summary's ``reference_baseline``: the implementation and its
    attention kernel (``model.attn_implementation``)."""
    from adtbench.harness.config import reference_impl

    attn = cfg.model.get("attn_implementation", "sdpa")
    return f"model.impl={reference_impl(cfg)} (transformers, eager, attention {attn})"


def clamp_top_k(sp: SamplingParams, target: Any) -> SamplingParams:
    """``sampling.top_k`` at or above the model's image-token count keeps every image token: it is clamped to 0
    (off, the same distribution without a top-k pass per step) with a warning naming the count."""
    n = int(target.layout.num_codes)
    if sp.top_k < n:
        return sp
    log.warning(
        "sampling.top_k=%d ≥ the model's %d image tokens: it keeps every token; running with top-k off", sp.top_k, n
    )
    return dataclasses.replace(sp, top_k=0)


def prompt_overflow(target: Any, text: str) -> tuple[int, int, str] | None:
    """``(length, limit, unit)`` when ``text`` is longer than the target's text window, else ``None`` (the target's
    ``text_window()``: word-level encoders count words, tokenizer encoders tokens; targets that take the whole prompt
    into their context have none)."""
    spec = target.text_window()
    if spec is None:
        return None
    limit, unit, count = spec
    n = count(text)
    return (n, limit, unit) if n > limit else None


def warn_long_prompts(target: Any, prompts: list[Prompt], model: str) -> None:
    """One warning per prompt longer than the model's text window (:func:`prompt_overflow`); it is truncated."""
    for p in prompts:
        over = prompt_overflow(target, p.text)
        if over is not None:
            n, limit, unit = over
            log.warning(
                "prompt %s has %d %s; model=%s reads at most %d (the rest is ignored)",
                p.prompt_id,
                n,
                unit,
                model,
                limit,
            )


def compile_models(target: Any, drafter: EagleDrafter | None, cfg: DictConfig, batched: bool = False) -> None:
    """``engine.compile``: on a GPU (and on the simulated one, ``accel``: through the graphs' stand-in), a target with
    static-shape verifies (``capabilities.graphs``: the in-project lean GPTs — LlamaGen, mini, the lean Chameleon) pins
    its KV cache and captures its verify forwards as CUDA graphs at its first prefill, and a drafter with static
    shapes (EAGLE) its ``extend`` / ``expand`` at its first reset (``models.graphs``; both capture times are
    reported); otherwise compile the target's (and the drafter's) forward with ``torch.compile`` and the warm-up
    compiles it. Either way outside the timed scope, and for both sides (baseline and method share the target).
    What the target offers is its declaration (``target.capabilities``: ``graphs``, ``compile``); the EAGLE drafter
    offers both. ``drafter`` None: the target only. ``batched`` (``decode.batch_size`` > 1): the graphs are the batch's
    (``BatchTarget.request_static``, captured per batch cache by ``harness.batched``; the batched drafter runs
    eagerly). Sets ``target.engine_mode`` (``graphs`` | ``compiled``; the cost model's cache key and the batched
    decoder read it)."""
    family, caps = str(cfg.model.family), target.capabilities
    graphs = caps.graphs and isinstance(target.device, torch.device) and accel.graphs_supported(target.device)
    drafter_graphs = graphs and drafter is not None
    target.engine_mode = "graphs" if graphs else "compiled"
    if graphs and batched:
        log.info("engine.compile: %s batched verifies will run as CUDA graphs (captured per batch cache)", family)
        return
    if graphs:
        target.request_static(graphs=True)
        log.info("engine.compile: %s verifies will run as CUDA graphs (captured at the first prefill)", family)
    if drafter_graphs:
        assert drafter is not None
        drafter.request_static(graphs=True)
        log.info("engine.compile: the drafter's extend / expand will run as CUDA graphs (captured at its first reset)")
    if not graphs and not caps.compile:
        raise ConfigError("engine.compile", f"model family {family} does not support compile")
    if accel.simulation() is not None and not graphs:
        raise ConfigError(
            "model.device" if not accel.is_cuda(target.device) else "engine.compile",
            f"under {accel.SIMULATE_ENV}=cuda engine.compile runs CUDA graphs through their stand-in "
            + (
                "and needs model.device=cuda; torch.compile cannot trace under the simulation"
                if not accel.is_cuda(target.device)
                else f"and model family {family} declares none; torch.compile cannot trace under the simulation: "
                "use engine.compile=false"
            ),
        )
    for name, obj in (("target", target), ("drafter", drafter)):
        if obj is None or (graphs and name == "target") or (drafter_graphs and name == "drafter"):
            continue
        t = time.perf_counter()
        obj.compile_forward()
        log.info("engine.compile: %s.compile_forward() in %.1f s", name, time.perf_counter() - t)
