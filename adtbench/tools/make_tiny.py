"""``adtbench make-tiny model=<family> out=DIR [seed=N] [layout=...]``: tiny random checkpoints in real layouts.

Each writer produces a folder that the family's real loader reads exactly as it reads the full-size release
(same file names, wrappers, key names, config fields and traps), scaled down to CPU-millisecond sizes
(models.md §6.3). Facts the real files do not carry (architecture sizes of the tiny nets, the grid, VQ
hyper-parameters) go into the ``adtbench.json`` sidecar (``registry`` conventions). A ``README.txt`` says what the
folder is. Then ``python run.py model=<family> model.path=DIR policy=eagle2`` runs end to end.

Families and their writers (each beside the loader it must mirror; the module docstrings list the layouts):
``anole``, ``lumina_mgpt`` → ``models/chameleon/tiny.py``; ``llamagen_t2i``, ``llamagen_c2i`` (``layout=official|
bare|lantern``) → ``models/llamagen/tiny.py``; ``tar`` → ``models/tar/tiny.py``. Shared helpers (sizes, tokenizers,
sidecar): ``models/tiny_common.py``. This module only dispatches (``Registry`` over lazy dotted paths, so
writing one family imports no other's writer) and parses the CLI.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from adtbench.models.llamagen.tiny import LAYOUTS
from adtbench.models.tiny_common import run_command
from adtbench.registry import Registry

_WRITER_PATHS = {
    "anole": "adtbench.models.chameleon.tiny:write_tiny_anole",
    "lumina_mgpt": "adtbench.models.chameleon.tiny:write_tiny_lumina",
    "llamagen_t2i": "adtbench.models.llamagen.tiny:write_tiny_t2i",
    "llamagen_c2i": "adtbench.models.llamagen.tiny:write_tiny_c2i",
    "tar": "adtbench.models.tar.tiny:write_tiny",
}
WRITERS: Registry[dict[str, Any]] = Registry("model")  # make-tiny's ``model=`` argument
for _name, _path in _WRITER_PATHS.items():
    WRITERS.register(_name, _path)
FAMILIES = tuple(_WRITER_PATHS)  # in CLI / usage order


def write_tiny(family: str, out: str | Path, seed: int = 0, layout: str = "official") -> dict[str, Any]:
    """Write the tiny checkpoint of ``family`` into ``out``; returns the in-memory reference modules.

    Raises ``ValueError`` (a ``ConfigError`` on key ``model``) for an unknown family.
    """
    return WRITERS.build(family, Path(out), seed, layout)


USAGE = (
    "usage: adtbench make-tiny model=<family> out=DIR [seed=N] [layout=official|bare|lantern]\n"
    f"  families: {', '.join(FAMILIES)} (layout applies to llamagen_*)"
)


def main(args: list[str]) -> int:
    """CLI: ``key=value`` arguments (``model``, ``out``, ``seed``, ``layout``); returns the exit code."""
    opts: dict[str, str] = {}
    for a in args:
        k, sep, v = a.partition("=")
        if not sep or k not in ("model", "out", "seed", "layout"):
            print(USAGE, file=sys.stderr)
            return 2
        opts[k] = v
    if "model" not in opts or "out" not in opts:
        print(USAGE, file=sys.stderr)
        return 2
    family, layout = opts["model"], opts.get("layout", "official")
    if family not in FAMILIES or layout not in LAYOUTS:
        print(f"adtbench: unknown model={family} or layout={layout}\n{USAGE}", file=sys.stderr)
        return 2
    out = Path(opts["out"]).expanduser().resolve()
    if out.exists() and any(out.iterdir()):
        print(f"adtbench: {out} exists and is not empty; choose a new folder", file=sys.stderr)
        return 2
    torch.set_num_threads(min(4, torch.get_num_threads()))
    write_tiny(family, out, int(opts.get("seed", 0)), layout)
    print(f"wrote tiny {family} ({layout}) to {out}\nrun: {run_command(family, out)}")
    return 0


__all__ = ["FAMILIES", "LAYOUTS", "WRITERS", "main", "write_tiny"]
