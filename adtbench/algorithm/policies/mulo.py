"""``policy=mulo``: MuLo-SD (``algorithm.mulo``): a low-resolution drafter + up-sampler, pooled threshold acceptance,
local rejection and resampling. Its models (``aux``) come from ``adtbench.harness.mulo.build_mulo_models``."""

from __future__ import annotations

from typing import Any

import torch

from adtbench.algorithm.methods.mulo import MuloModels, MuloParams, decode_mulo, mulo_params
from adtbench.algorithm.policies.base import LoopPolicy, Method, register_method
from adtbench.algorithm.records import GenerationResult


class MuloPolicy(LoopPolicy):
    """MuLo-SD with ``params``; lossless only as the control arm ``rule=exact`` (tested: T = 0 identity with AR and
    a χ² test at T = 1). ``rule=pooled`` is lossy for τ in (0, 1] (docs ``mulo_sd.md`` §A.5)."""

    name = "mulo"

    def __init__(self, params: MuloParams) -> None:
        self.params = params
        self.lossless = params.rule == "exact"

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
        """Decode one image with ``decode_mulo`` (``aux``: ``MuloModels``; ``rule``: exact, read by ``rule=exact``)."""
        if not isinstance(aux, MuloModels):
            raise TypeError("policy=mulo needs its models (adtbench.harness.mulo.build_mulo_models) as aux")
        return decode_mulo(target, aux, inputs, sp, generator, self.params, rule)


def build_mulo(node: Any) -> MuloPolicy:
    """``policy=mulo`` from a plain dict node (``mulo_params``: ConfigError naming ``policy.<key>``). The model-
    facing keys (``drafter_model``, ``upsampler``, ``downsampler``, ``upsampler_path``) are the harness's."""
    return MuloPolicy(mulo_params(dict(node)))


register_method(
    Method(
        "mulo",
        build_mulo,
        "adtbench.harness.schema:MuloConf",
        lossless=("exact",),  # the control arm rule=exact only (the built policy's ``lossless``)
        graphs=("verify",),
        models="adtbench.harness.mulo:build_mulo_models",
        check="adtbench.harness.mulo:check_mulo_config",
        smoke=("policy.block_rows=2",),
        tiny=False,
    )
)
