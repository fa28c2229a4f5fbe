"""``policy=sjd_pac``: SJD-PAC (arXiv 2603.18599) — the SCD loop verifying a tree (``algorithm.sjd_pac``).

Keys: every ``policy=scd`` key except ``redraw`` (coupled only), ``rule`` (exact only) and ``init=drafter``, plus
``branch`` (K), ``tree_depth`` (D) and ``variant`` (exact | authors: the authors' code, lossy)."""

from __future__ import annotations

from typing import Any

from adtbench.algorithm.methods.sjd_pac import SJDPACParams, sjd_pac_params
from adtbench.algorithm.policies.base import register_method
from adtbench.algorithm.policies.jacobi import JacobiPolicy, jacobi_method


class SJDPACPolicy(JacobiPolicy):
    """SJD-PAC: lossless iff ``variant: exact``; accepts with its own rule (``lantern=on`` is refused)."""

    def __init__(self, params: SJDPACParams) -> None:
        super().__init__("sjd_pac", params)
        self.lossless = params.variant == "exact"
        self.accepts_rule = False


def build_sjd_pac(node: Any) -> SJDPACPolicy:
    """``policy=sjd_pac`` from a plain dict node (``sjd_pac_params``: ConfigError naming the key)."""
    return SJDPACPolicy(sjd_pac_params(dict(node)))


register_method(
    jacobi_method(
        "sjd_pac", build_sjd_pac, SJDPACParams, graphs=("verify",), smoke=("policy.window=8",), law_keys={"window": 16}
    )
)
