"""``policy=sjd`` / ``scd`` / ``gsd``: training-free speculative decoding by Jacobi iteration (``algorithm.jacobi``).

The three names differ in their defaults only (``conf/policy/{sjd,scd,gsd}.yaml``): SJD redraws independently, SCD
couples each redraw to the previous draft, GSD is SJD with the grouped acceptance rule (lossy). Every key applies to
all three (``policy.window``, ``policy.init``, ``policy.redraw``, ``policy.rule``, …)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adtbench.algorithm.jacobi import JacobiParams, decode_jacobi, generate_jacobi_batch, grouped_rule, jacobi_params
from adtbench.algorithm.jacobi_step import fixed_shape_step
from adtbench.algorithm.policies.base import POLICIES, LoopPolicy
from adtbench.algorithm.records import GenerationResult
from adtbench.algorithm.verify import EXACT


@dataclass
class JacobiModels:
    """What a Jacobi loop runs besides the target (``aux``, built by ``harness.loops``): the EAGLE drafter
    (``init: drafter``) and the calibrated L of ``window: cost`` (``jacobi.calibrate_window`` on the machine's cost
    model, with its table); each None when not needed."""

    drafter: Any = None
    window: int | None = None
    calibration: dict[str, Any] | None = None


class JacobiPolicy(LoopPolicy):
    """A Jacobi decoding loop with ``params``. ``lossless`` iff the rule is exact (and, at run time, the app's rule:
    LANTERN relaxes the acceptance of ``sjd`` / ``scd``, ``accepts_rule``)."""

    def __init__(self, name: str, params: JacobiParams) -> None:
        self.name, self.params = name, params
        self.lossless = params.rule == "exact"
        self.accepts_rule = params.rule == "exact"  # the app's acceptance rule (LANTERN) applies
        self.batchable = params.init != "drafter"  # decode.batch_size > 1: a ragged window per slot
        self.drafts_with_eagle = params.init == "drafter"  # drafts start from the EAGLE drafter's chain
        self._rule: tuple[Any, Any] | None = None  # (target, GroupedRule)
        self.limit: int | None = None  # stop each image once this many tokens are committed (``bench.overhead_tokens``)

    def max_nodes(self) -> int:
        return self.params.max_nodes

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
        """Decode one image with ``jacobi.decode_jacobi`` (``aux``: ``JacobiModels`` or None)."""
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
            make_step=fixed_shape_step,
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
        """Batched decoding (``jacobi.generate_jacobi_batch``: a ragged window per slot) of ``items`` through ``bt``
        (a ``models.batch.BatchTarget``); ``on_done(key, result)`` per prompt. ``init: drafter`` is single-prompt."""
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


def _builder(name: str) -> Any:
    def build(node: Any) -> JacobiPolicy:
        return JacobiPolicy(name, jacobi_params({**NAME_DEFAULTS[name], **dict(node)}))

    build.__doc__ = f"``policy={name}`` from a plain dict node (``jacobi_params``: ConfigError naming the key)."
    return build


for _name in ("sjd", "scd", "gsd"):
    POLICIES.register(_name, _builder(_name))
