"""Tree policies and loop policies (``LoopPolicy``: ZipAR, MuLo-SD, the Jacobi loops SJD / SCD / GSD / SJD-PAC).

Importing the package registers every policy's builder in ``POLICIES`` (``policy.name``)."""

from adtbench.algorithm.policies import adt, ar, eagle2, jacobi, mulo, sjd_pac, static, zipar
from adtbench.algorithm.policies.base import POLICIES, LoopPolicy, Policy, TreePolicy

__all__ = [
    "POLICIES",
    "LoopPolicy",
    "Policy",
    "TreePolicy",
    "adt",
    "ar",
    "eagle2",
    "jacobi",
    "mulo",
    "sjd_pac",
    "static",
    "zipar",
]
