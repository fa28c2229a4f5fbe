"""``engine.graphs``: graph or eager for each part that can run as fixed-shape graph replays (``graph_runner``).

One node, one switch per part, each ``auto | graph | eager``:

- ``step`` — a Jacobi iteration (SJD / SCD / GSD at a fixed window) as one device step, its verdict read one step
  late (``algorithm.methods.jacobi.step``). ``auto``: where the target's verifies are captured (``engine.compile``
  on CUDA or the simulated device), acceptance is on the device and the setting can run it; ``graph``: always — a
  ``ConfigError`` naming ``engine.graphs.step`` before any weights load where the keys cannot (``window=adaptive``,
  ``init=drafter``, ``redraw=gumbel``, LANTERN's own iteration) and, once the target is built, where the target
  cannot (no static buckets, a rule other than exact / GSD, L < 2); on static buckets that are not captured the
  same step runs eagerly; ``eager``: the host-driven loop.
- ``verify`` — a drafted tree's verify forward, processing, acceptance and packed verdict as one replay
  (``algorithm.tree_step``). ``auto``: where the target's verifies are captured and acceptance is on the device;
  ``graph``: also on static buckets that are not captured (run eagerly), a ``ConfigError`` naming
  ``engine.graphs.verify`` with ``engine.acceptance=host`` (before weights load) or without static buckets;
  ``eager``: op by op.
- ``levels`` — a tree policy's drafting levels as one replay per level (``algorithm.drafters.graphed``). ``auto``:
  where the drafter's forwards are captured (``engine.compile`` on CUDA or the simulated device) and acceptance is
  on the device; ``graph``: the same, and a ``ConfigError`` naming ``engine.graphs.levels`` before any weights load
  where the levels can never be graphed (``engine.compile=false``, a model not on CUDA, ``engine.acceptance=host``);
  a cycle without room in the pinned cache drafts eagerly under both; ``eager``: op by op.

A part the run's method does not have is not used (``policy=eagle2`` has no ``step``). The keys these replace —
``policy.step``, ``engine.verify_step``, ``policy.graph_levels`` — are refused naming the old key and the new one
(:data:`MOVED_KEYS`: no silent alias); run configs saved with them are read as today's (``harness.records``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from adtbench.errors import ConfigError

GRAPH_MODES = ("auto", "graph", "eager")
GRAPH_PARTS = ("step", "verify", "levels")

MOVED_KEYS: dict[str, str] = {
    "policy.step": "engine.graphs.step",
    "engine.verify_step": "engine.graphs.verify",
    "policy.graph_levels": "engine.graphs.levels",
}
"""Old key → the ``engine.graphs`` key that replaced it (issue 50)."""


@dataclass
class GraphModes:
    """``engine.graphs`` typed (module docstring): ``auto`` | ``graph`` | ``eager`` for ``step``, ``verify`` and
    ``levels``. The harness merges the composed node into this class (``harness.schema.EngineConf``: not frozen, which
    OmegaConf's merge into a nested node needs); a policy holds one (``policy.graphs``), replaced whole, never
    edited."""

    step: str = "auto"
    verify: str = "auto"
    levels: str = "auto"

    def __post_init__(self) -> None:
        for part in GRAPH_PARTS:
            value = getattr(self, part)
            if value not in GRAPH_MODES:
                raise ConfigError(f"engine.graphs.{part}", f"must be one of {list(GRAPH_MODES)}, got {value!r}")


def graph_modes(node: Any) -> GraphModes:
    """``GraphModes`` from a plain ``engine.graphs`` mapping (None: every part ``auto``); an unknown part or a bad
    value is a ``ConfigError`` naming ``engine.graphs.<part>``."""
    if node is None:
        return GraphModes()
    if not hasattr(node, "items"):
        raise ConfigError("engine.graphs", f"must be a mapping (engine.graphs.step=...), got {node!r}")
    known = {f.name for f in fields(GraphModes)}
    for k in node:
        if k not in known:
            raise ConfigError(f"engine.graphs.{k}", f"unknown part; known: {list(GRAPH_PARTS)}")
    return GraphModes(**{str(k): v for k, v in node.items()})


def moved_key(old: str, value: Any = None) -> ConfigError:
    """The error for a key of :data:`MOVED_KEYS` given by a user: names the old key and says the new one."""
    new = MOVED_KEYS[old]
    hint = ("auto" if value else "eager") if isinstance(value, bool) else value  # graph_levels was a flag
    example = f"{new}={hint}" if isinstance(hint, str) and hint in GRAPH_MODES else f"{new}=<{'|'.join(GRAPH_MODES)}>"
    return ConfigError(old, f"moved to {new} (engine.graphs: graph or eager for each part); use {example}")


__all__ = ["GRAPH_MODES", "GRAPH_PARTS", "MOVED_KEYS", "GraphModes", "graph_modes", "moved_key"]
