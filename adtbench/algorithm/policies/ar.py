"""``policy=ar``: no drafting. The engine decodes one token per target forward (the AR baseline)."""

from __future__ import annotations

from typing import Any

from adtbench.algorithm.drafters.session import DraftSession
from adtbench.algorithm.policies.base import Method, TreePolicy, register_method
from adtbench.algorithm.tree import DraftTree, root_only


class ArPolicy(TreePolicy):
    name = "ar"
    uses_drafter = False

    def propose(self, session: DraftSession, max_depth: int) -> DraftTree:
        return root_only(session.root_token)


def build_ar(node: Any) -> ArPolicy:
    """``policy=ar`` (no keys besides ``name``)."""
    return ArPolicy()


register_method(Method("ar", build_ar, "adtbench.harness.schema:ArConf", lossless=("exact",), graphs=("verify",)))
