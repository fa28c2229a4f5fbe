"""Tree policies; importing the package registers every policy's builder in ``POLICIES`` (``policy.name``)."""

from adtbench.policies import adt, ar, eagle2, static
from adtbench.policies.base import POLICIES, TreePolicy

__all__ = ["POLICIES", "TreePolicy", "adt", "ar", "eagle2", "static"]
