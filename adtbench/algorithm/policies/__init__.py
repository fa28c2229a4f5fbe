"""Tree policies and loop policies (``LoopPolicy``: ZipAR, MuLo-SD, the Jacobi loops SJD / SCD / GSD / SJD-PAC).

Importing the package registers every policy's ``Method`` in ``POLICIES`` (``policy.name``), the shipped ones and
those of installed plugin packages (entry points of ``adtbench.policies``: ``adtbench.plugins``)."""

from adtbench.algorithm.policies import adt, ar, eagle2, jacobi, mulo, sjd_pac, static, zipar
from adtbench.algorithm.policies.base import POLICIES, LoopPolicy, Method, Policy, TreePolicy, method_of, methods
from adtbench.plugins import load_policies

load_policies()

__all__ = [
    "POLICIES",
    "LoopPolicy",
    "Method",
    "Policy",
    "TreePolicy",
    "adt",
    "ar",
    "eagle2",
    "jacobi",
    "method_of",
    "methods",
    "mulo",
    "sjd_pac",
    "static",
    "zipar",
]
