"""Methods from outside the repo: Python entry points in the group ``adtbench.policies``.

A user's package declares, in its ``pyproject.toml``::

    [project.entry-points."adtbench.policies"]
    my_method = "my_pkg.my_method"            # a module: importing it registers (``register_method``)
    # or "my_pkg.setup:register"              # a callable: called once with no arguments

and ships its yaml as ``my_pkg/conf/policy/<name>.yaml`` (any config group under ``my_pkg/conf``). Then
``import adtbench.algorithm.policies`` loads every such entry point (``load_policies``) and Hydra finds the yaml:
``conf_dirs`` lists each plugin package's ``conf`` folder without importing the plugin, and adtbench's search-path
plugin (``hydra_plugins/adtbench_searchpath``) appends them to every compose — the app (``run.py``), the tools, the
pre-check — after adtbench's own ``conf/`` (a plugin cannot shadow a shipped yaml).

Invariants: an entry point is loaded once per process; a plugin that fails to import is an error naming the entry
point (never skipped silently); a name a plugin registers twice, or that a shipped policy holds, is refused by the
registry.
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

GROUP = "adtbench.policies"

__all__ = ["GROUP", "conf_dirs", "load_policies", "policy_entry_points"]

_LOADED: set[str] = set()


def policy_entry_points() -> list[EntryPoint]:
    """The installed entry points of ``GROUP``, by name (each distribution's once)."""
    seen: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        seen.setdefault(f"{ep.name}={ep.value}", ep)
    return sorted(seen.values(), key=lambda ep: (ep.name, ep.value))


def load_policies() -> list[str]:
    """Import every ``GROUP`` entry point not loaded yet (a ``module:attr`` value: call ``attr()``); returns the
    values loaded now."""
    loaded = []
    for ep in policy_entry_points():
        if ep.value in _LOADED:
            continue
        _LOADED.add(ep.value)
        try:
            module = importlib.import_module(ep.module)
            if ep.attr:
                getattr(module, ep.attr)()
        except Exception as e:
            _LOADED.discard(ep.value)
            raise RuntimeError(f"adtbench plugin {ep.name} = {ep.value!r} ({GROUP}) failed to load: {e}") from e
        loaded.append(ep.value)
    return loaded


def conf_dirs() -> list[Path]:
    """Each plugin package's ``conf`` folder (the top-level package of the entry point's module), where it exists;
    found from the import system's spec, without importing the plugin."""
    out: list[Path] = []
    for ep in policy_entry_points():
        spec = importlib.util.find_spec(ep.module.partition(".")[0])
        roots = [] if spec is None else list(spec.submodule_search_locations or [])
        for root in roots:
            conf = Path(root) / "conf"
            if conf.is_dir() and conf not in out:
                out.append(conf)
    return out
