"""``policy=sjd`` / ``scd`` / ``gsd``: training-free speculative decoding by Jacobi iteration (``methods.jacobi.loop``).

The three names differ in their defaults only (``conf/policy/{sjd,scd,gsd}.yaml``): SJD redraws independently, SCD
couples each redraw to the previous draft, GSD is SJD with the grouped acceptance rule (lossy). Every key applies to
all three (``policy.window``, ``policy.init``, ``policy.redraw``, ``policy.rule``, …)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from adtbench.algorithm.methods.gsd import grouped_rule
from adtbench.algorithm.methods.jacobi.batch import generate_jacobi_batch
from adtbench.algorithm.methods.jacobi.loop import JacobiParams, decode_jacobi, jacobi_params
from adtbench.algorithm.methods.jacobi.step import fixed_shape_step
from adtbench.algorithm.policies.base import LoopPolicy, Method, register_method
from adtbench.algorithm.records import GenerationResult
from adtbench.algorithm.verify import EXACT


@dataclass
class JacobiModels:
    """What a Jacobi loop runs besides the target (``aux``, built by ``harness.loops``): the EAGLE drafter
    (``init: drafter``) and the calibrated L of ``window: cost`` (``calibration.calibrate_window`` on the machine's cost
    model, with its table); each None when not needed."""

    drafter: Any = None
    window: int | None = None
    calibration: dict[str, Any] | None = None


class JacobiPolicy(LoopPolicy):
    """A Jacobi decoding loop with ``params``. ``lossless`` iff the rule is exact (and, at run time, the app's rule:
    LANTERN relaxes the acceptance of ``sjd`` / ``scd``, ``accepts_rule``). What it needs built it declares:
    ``drafts_with_eagle`` (``init: drafter``) and ``calibrated_window`` (a window rule that declares ``calibrated``,
    ``window: cost``), read by ``harness.loops``."""

    def __init__(self, name: str, params: JacobiParams) -> None:
        self.name, self.params = name, params
        self.lossless = params.rule == "exact"
        self.accepts_rule = params.rule == "exact"  # the app's acceptance rule (LANTERN) applies
        self.batchable = params.init != "drafter"  # decode.batch_size > 1: a ragged window per slot
        if params.init == "drafter":
            self.one_prompt = ("policy.init", "init=drafter decodes one prompt at a time")
        self.drafts_with_eagle = params.init == "drafter"  # drafts start from the EAGLE drafter's chain
        self.calibrated_window = params.calibrated_window  # window: cost — the machine's L, built by the harness
        self._rule: tuple[Any, Any] | None = None  # (target, GroupedRule)
        self.limit: int | None = None  # stop each image once this many tokens are committed (``bench.overhead_tokens``)

    def models_for(self, drafter: Any) -> JacobiModels:
        """``JacobiModels`` with ``drafter`` where ``init: drafter`` runs it (``window: cost`` needs the harness's
        calibration: refused here)."""
        if self.calibrated_window:
            raise ValueError(f"policy.window={self.params.window} needs the machine's calibrated L (the harness)")
        return JacobiModels(drafter if self.drafts_with_eagle else None)

    def max_nodes(self) -> int:
        return self.params.max_nodes

    def step_refusal(self) -> str | None:
        """The keys' reasons against the fixed-shape step (``JacobiParams.step_refusal``)."""
        return self.params.step_refusal()

    def rule_for(self, target: Any, rule: Any) -> Any:
        """The acceptance rule: ``rule`` (exact or LANTERN), or GSD's grouped rule on ``target``'s embeddings."""
        if self.params.rule == "exact":
            return EXACT if rule is None else rule
        if self._rule is None or self._rule[0] is not target:
            self._rule = (target, grouped_rule(target, self.params))
        return self._rule[1]

    def generate(
        self,
        target: Any,
        aux: Any,
        inputs: Any,
        sp: Any,
        generator: torch.Generator | None,
        rule: Any,
        acceptance: str = "auto",
    ) -> GenerationResult:
        """Decode one image with ``jacobi.decode_jacobi`` (``aux``: ``JacobiModels`` or None), through the fixed-shape
        step where ``engine.graphs.step`` (``self.graphs.step``) selects it (``jacobi.step.fixed_shape_step``)."""
        models = aux if isinstance(aux, JacobiModels) else JacobiModels()
        return decode_jacobi(
            target,
            inputs,
            sp,
            generator,
            self.params,
            self.rule_for(target, rule),
            acceptance,
            models.drafter,
            models.window,
            limit=self.limit,
            make_step=partial(fixed_shape_step, mode=self.graphs.step),
        )

    def generate_batch(
        self,
        bt: Any,
        aux: Any,
        items: Any,
        sp: Any,
        on_done: Any,
        rule: Any,
        acceptance: str = "auto",
    ) -> None:
        """Batched decoding (``jacobi.batch.generate_jacobi_batch``: a ragged window per slot) of ``items`` through
        ``bt`` (a ``models.batch.BatchTarget``); ``on_done(key, result)`` per prompt. ``init: drafter`` is
        single-prompt."""
        if self.params.init == "drafter":
            raise ValueError("policy.init=drafter decodes one prompt at a time")
        models = aux if isinstance(aux, JacobiModels) else JacobiModels()
        generate_jacobi_batch(
            bt, items, sp, self.params, on_done, self.rule_for(bt.target, rule), acceptance, models.window
        )


NAME_DEFAULTS: dict[str, dict[str, str]] = {
    "sjd": {"redraw": "independent", "rule": "exact"},
    "scd": {"redraw": "coupled", "rule": "exact", "init": "up"},
    "gsd": {"redraw": "independent", "rule": "gsd"},
}
"""What each paper's name means where its yaml (``conf/policy/<name>.yaml``) or the node leaves a key out."""

JACOBI_MODELS = "adtbench.harness.loops:build_jacobi_models"  # the EAGLE drafter, the calibrated L (``JacobiModels``)
JACOBI_CHECK = "adtbench.harness.loops:check_jacobi_config"  # init=drafter needs drafter=eagle, … (no weights read)


def jacobi_method(
    name: str,
    build: Callable[[dict[str, Any]], LoopPolicy],
    schema: type = JacobiParams,
    lossless: tuple[str, ...] = ("exact",),
    graphs: tuple[str, ...] = ("verify", "step"),
    **declared: Any,
) -> Method:
    """The ``Method`` of a Jacobi loop: its models and checks are the Jacobi family's (``harness.loops``), its keys
    ``schema`` (``JacobiParams`` or a subclass with keys of its own). ``law_keys``: a window of 3 (the 2 × 2 image's
    law test)."""
    declared.setdefault("law_keys", {"window": 3})
    return Method(name, build, schema, lossless, graphs, JACOBI_MODELS, JACOBI_CHECK, **declared)


def _builder(name: str) -> Callable[[dict[str, Any]], JacobiPolicy]:
    def build(node: dict[str, Any]) -> JacobiPolicy:
        return JacobiPolicy(name, jacobi_params({**NAME_DEFAULTS[name], **dict(node)}))

    build.__doc__ = f"``policy={name}`` from a plain dict node (``jacobi_params``: ConfigError naming the key)."
    return build


register_method(jacobi_method("sjd", _builder("sjd"), smoke=("policy.init=left",)))
register_method(jacobi_method("scd", _builder("scd"), smoke=("policy.window=8",)))
register_method(jacobi_method("gsd", _builder("gsd"), lossless=(), smoke=("sampling=greedy",)))
