"""``adtbench make-tiny model=<family> out=DIR [seed=N] [layout=...] [target=DIR]``: tiny random checkpoints in real
layouts.

Each writer produces a folder that the family's real loader reads exactly as it reads the full-size release
(same file names, wrappers, key names, config fields and traps), scaled down to CPU-millisecond sizes
(models.md §6.3). Facts the real files do not carry (architecture sizes of the tiny nets, the grid, VQ
hyper-parameters) go into the ``adtbench.json`` sidecar (``registry`` conventions). A ``README.txt`` says what the
folder is. Then ``python run.py model=<family> model.path=DIR policy=eagle2`` runs end to end.

Families and their writers (each beside the loader it must mirror; the module docstrings list the layouts):
``anole``, ``lumina_mgpt`` → ``models/chameleon/tiny.py``; ``llamagen_t2i``, ``llamagen_c2i`` (``layout=official|
bare|lantern``) → ``models/llamagen/tiny.py``; ``tar`` → ``models/tar/tiny.py``;
``emu3`` → ``models/emu3/tiny.py``; ``janus_pro`` → ``models/janus/tiny.py``. Drafters (``DRAFTERS``, not
targets: no sidecar): ``anole_drafter``, ``lumina_mgpt_drafter`` → ``models/chameleon/tiny.py``, LANTERN's published
drafter layout sized for the tiny Chameleon targets, its embedding copied from ``target=DIR`` (a tiny target folder;
default: the tiny target of the same seed). Shared helpers (sizes, tokenizers,
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
    "emu3": "adtbench.models.emu3.tiny:write_tiny",
    "janus_pro": "adtbench.models.janus.tiny:write_tiny",
}
_DRAFTER_PATHS = {  # tiny drafters in a published layout, for the tiny target of the same family
    "anole_drafter": "adtbench.models.chameleon.tiny:write_tiny_anole_drafter",
    "lumina_mgpt_drafter": "adtbench.models.chameleon.tiny:write_tiny_lumina_drafter",
}
WRITERS: Registry[dict[str, Any]] = Registry("model")  # make-tiny's ``model=`` argument
for _name, _path in (_WRITER_PATHS | _DRAFTER_PATHS).items():
    WRITERS.register(_name, _path)
FAMILIES = tuple(_WRITER_PATHS)  # targets, in CLI / usage order
DRAFTERS = tuple(_DRAFTER_PATHS)


def write_tiny(
    family: str, out: str | Path, seed: int = 0, layout: str = "official", target: str | Path | None = None
) -> dict[str, Any]:
    """Write the tiny checkpoint of ``family`` (a target or a drafter) into ``out``; returns the in-memory reference
    modules (a drafter: its written state dict and config). ``target``: a drafter's tiny target folder.

    Raises ``ValueError`` (a ``ConfigError`` on key ``model``) for an unknown family.
    """
    if family in DRAFTERS:
        return WRITERS.build(family, Path(out), seed, layout, None if target is None else Path(target))
    if target is not None:
        raise ValueError(f"target= applies to the drafters ({', '.join(DRAFTERS)}), not model={family}")
    return WRITERS.build(family, Path(out), seed, layout)


USAGE = (
    "usage: adtbench make-tiny model=<family> out=DIR [seed=N] [layout=official|bare|lantern] [target=DIR]\n"
    f"  families: {', '.join(FAMILIES)} (layout applies to llamagen_*)\n"
    f"  drafters: {', '.join(DRAFTERS)} (LANTERN's layout; target= the tiny anole / lumina_mgpt folder whose "
    "embedding it copies, default: the tiny target of the same seed)"
)


def main(args: list[str]) -> int:
    """CLI: ``key=value`` arguments (``model``, ``out``, ``seed``, ``layout``); returns the exit code."""
    opts: dict[str, str] = {}
    for a in args:
        k, sep, v = a.partition("=")
        if not sep or k not in ("model", "out", "seed", "layout", "target"):
            print(USAGE, file=sys.stderr)
            return 2
        opts[k] = v
    if "model" not in opts or "out" not in opts:
        print(USAGE, file=sys.stderr)
        return 2
    family, layout = opts["model"], opts.get("layout", "official")
    if family not in FAMILIES + DRAFTERS or layout not in LAYOUTS:
        print(f"adtbench: unknown model={family} or layout={layout}\n{USAGE}", file=sys.stderr)
        return 2
    target = Path(opts["target"]).expanduser().resolve() if "target" in opts else None
    if target is not None and (family not in DRAFTERS or not target.is_dir()):
        why = "is not a folder" if family in DRAFTERS else f"applies to the drafters only ({', '.join(DRAFTERS)})"
        print(f"adtbench: target={opts['target']} {why}\n{USAGE}", file=sys.stderr)
        return 2
    out = Path(opts["out"]).expanduser().resolve()
    if out.exists() and any(out.iterdir()):
        print(f"adtbench: {out} exists and is not empty; choose a new folder", file=sys.stderr)
        return 2
    torch.set_num_threads(min(4, torch.get_num_threads()))
    try:
        write_tiny(family, out, int(opts.get("seed", 0)), layout, target)
    except (ValueError, KeyError) as e:  # a target folder without a Chameleon embedding
        print(f"adtbench: cannot write {family}: {e}", file=sys.stderr)
        return 2
    if family in DRAFTERS:
        fam = family.removesuffix("_drafter")
        where = target if target is not None else f"<make-tiny model={fam} seed={opts.get('seed', 0)}>"
        print(
            f"wrote tiny {family} (LANTERN's layout) to {out}\n"
            f"run: python run.py model={fam} model.path={where} drafter.path={out} policy=adt lantern=on"
        )
        return 0
    print(f"wrote tiny {family} ({layout}) to {out}\nrun: {run_command(family, out)}")
    return 0


__all__ = ["DRAFTERS", "FAMILIES", "LAYOUTS", "WRITERS", "main", "write_tiny"]
