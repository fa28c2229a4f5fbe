"""``policy=sjd_pac``: SJD-PAC (arXiv 2603.18599) — the SCD loop verifying a tree (``algorithm.sjd_pac``).

Keys: every ``policy=scd`` key except ``redraw`` (coupled only), ``rule`` (exact only) and ``init=drafter``, plus
``branch`` (K), ``tree_depth`` (D) and ``variant`` (exact | authors: the authors' code, lossy)."""

from __future__ import annotations

from typing import Any

from adtbench.algorithm.policies.base import POLICIES
from adtbench.algorithm.policies.jacobi import JacobiPolicy
from adtbench.algorithm.sjd_pac import SJDPACParams, sjd_pac_params


class SJDPACPolicy(JacobiPolicy):
    """SJD-PAC: lossless iff ``variant: exact``; accepts with its own rule (``lantern=on`` is refused)."""

    def __init__(self, params: SJDPACParams) -> None:
        super().__init__("sjd_pac", params)
        self.lossless = params.variant == "exact"
        self.accepts_rule = False


def build_sjd_pac(node: Any) -> SJDPACPolicy:
    """``policy=sjd_pac`` from a plain dict node (``sjd_pac_params``: ConfigError naming the key)."""
    return SJDPACPolicy(sjd_pac_params({k: v for k, v in dict(node).items() if k != "name"}))


POLICIES.register("sjd_pac", build_sjd_pac)
