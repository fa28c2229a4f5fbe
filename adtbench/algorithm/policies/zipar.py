"""``policy=zipar``: ZipAR spatially parallel decoding (``algorithm.zipar``; training-free, no drafter, lossy)."""

from __future__ import annotations

from typing import Any

import torch

from adtbench.algorithm.methods.zipar import decode_zipar
from adtbench.algorithm.policies.base import LoopPolicy, Method, register_method
from adtbench.algorithm.records import GenerationResult
from adtbench.errors import check_number


class ZipARPolicy(LoopPolicy):
    """ZipAR with window ``w`` (an integer ≥ 1): row r + 1 starts once row r has w tokens; every active row
    decodes one token per target forward. ``w`` ≥ the row length (EOL column included) is plain AR, token for
    token; smaller windows are lossy, so ``lossless`` stays False."""

    name = "zipar"
    lossless = False

    def __init__(self, window: int = 4) -> None:
        self.window = check_number(window, "policy.window", int, lo=1)

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
        """Decode one image with ``decode_zipar`` (no models besides the target; ``rule`` unused: no acceptance)."""
        return decode_zipar(target, inputs, sp, generator, self.window)


def build_zipar(node: Any) -> ZipARPolicy:
    """``policy=zipar`` from a plain dict node: ``window`` (ConfigError naming ``policy.window`` unless an int ≥ 1)."""
    return ZipARPolicy(window=node.get("window", 4))


register_method(Method("zipar", build_zipar, "adtbench.harness.schema:ZiparConf", smoke=("policy.window=2",)))
