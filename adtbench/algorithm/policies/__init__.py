"""Tree policies and loop policies (``LoopPolicy``: ZipAR, MuLo-SD, the Jacobi loops SJD / SCD / GSD / SJD-PAC).

Importing the package imports every module in it — each policy module registers its ``Method`` in ``POLICIES``
(``policy.name``) when imported, so a new module here needs no edit elsewhere — then the methods of installed plugin
packages (entry points of ``adtbench.policies``: ``adtbench.plugins``)."""

import importlib
import pkgutil

from adtbench.algorithm.policies.base import POLICIES, LoopPolicy, Method, Policy, TreePolicy, method_of, methods
from adtbench.plugins import load_policies

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
load_policies()

__all__ = ["POLICIES", "LoopPolicy", "Method", "Policy", "TreePolicy", "method_of", "methods"]
