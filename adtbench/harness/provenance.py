"""What wrote a run dir: the code (:func:`code_version`: the git commit of the checkout the package is imported from,
or the installed package's version), the software and device, and whether the composed method is lossless
(``job.exactness``). The app records it in ``run_config.json`` under :data:`PROVENANCE_KEY`
(``rundir_write.record_provenance``, the one writer; ``rundir.read_provenance`` reads it back), before the first sample
of the job is written.

Invariants. ``commit`` is the 40-hex sha of ``HEAD`` of the git checkout whose tracked files include this package's
``__init__.py`` (a virtual environment or site-packages that merely lies inside some repository is not that
checkout); ``dirty`` is whether that checkout's tracked files differ from ``HEAD`` (index or work tree; untracked
files do not count). Outside such a checkout both are None and ``commit_reason`` says why (``version``: the installed
package's version then tells the code apart). ``commits`` lists, oldest first, every code version ((commit, dirty))
that opened the run dir to decode prompts; a resume by another commit appends one entry and warns
(:func:`resume_warning`) naming both shas.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "GIT_TIMEOUT_S",
    "PROVENANCE_KEY",
    "code_version",
    "job_provenance",
    "merged_provenance",
    "resume_warning",
    "same_code",
]

#: The key of ``run_config.json`` that holds the provenance (never a config node: ``check_resume`` refuses one).
PROVENANCE_KEY = "provenance"
GIT_TIMEOUT_S = 20.0


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``git -C cwd args`` (no optional locks: reading the status must not write the index)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    return subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env=env, check=False
    )


def _package_version() -> str | None:
    try:
        return metadata.version("adtbench")
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=4)
def code_version(package_dir: str | None = None) -> dict[str, Any]:
    """``{"commit", "dirty", "commit_reason", "version"}`` of the code at ``package_dir`` (default: the imported
    ``adtbench`` package's folder); see the module docstring. Runs git at most four times (cached per folder)."""
    if package_dir is None:
        import adtbench

        package_dir = str(Path(adtbench.__file__).resolve().parent)
    pkg = Path(package_dir)
    out: dict[str, Any] = {"commit": None, "dirty": None, "commit_reason": None, "version": _package_version()}
    if shutil.which("git") is None:
        return out | {"commit_reason": "git is not on PATH"}
    try:
        top = _git(pkg, "rev-parse", "--show-toplevel")
        if top.returncode != 0:  # git's own words say which: no checkout, or one git refuses (safe.directory)
            said = (top.stderr.strip().splitlines() or ["no output"])[0]
            why = f"{pkg} is not in a git checkout git can read (an installed package?): {said}"
            return out | {"commit_reason": why}
        root = Path(top.stdout.strip())
        tracked = _git(root, "ls-files", "--error-unmatch", "--", str(pkg / "__init__.py"))
        if tracked.returncode != 0:
            return out | {"commit_reason": f"{pkg} is not tracked by the git checkout at {root} (an installed package)"}
        head = _git(root, "rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            return out | {"commit_reason": f"the git checkout at {root} has no commit"}
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired) as e:
        return out | {"commit_reason": f"git failed: {type(e).__name__}: {e}"}
    dirty = None if status.returncode != 0 else bool(status.stdout.strip())
    return out | {"commit": head.stdout.strip(), "dirty": dirty}


def job_provenance(env: dict[str, Any], lossless: bool, lossless_reason: str) -> dict[str, Any]:
    """The provenance of a job: :func:`code_version`; from the summary's ``env`` (``timing.environment``, read, not
    recomputed) ``torch``, ``device`` and ``device_name`` (the GPU's name; on the CPU, the processor); ``lossless``
    and ``lossless_reason`` (``job.exactness`` of the composed policy × acceptance rule)."""
    return {
        **code_version(),
        "torch": env["torch"],
        "device": env["device"],
        "device_name": env.get("gpu") or f"cpu ({env['cpu']})",
        "lossless": lossless,
        "lossless_reason": lossless_reason,
    }


def same_code(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two ``commits`` entries name the same code version: equal (commit, dirty), or, outside a git checkout,
    equal package versions."""
    if a.get("commit") is None and b.get("commit") is None:
        return bool(a.get("version") == b.get("version"))
    return bool(a.get("commit") == b.get("commit") and a.get("dirty") == b.get("dirty"))


def resume_warning(run_dir: Any, previous: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """The one-line warning of a resume by other code than wrote the run's last samples (``previous``: the last
    ``commits`` entry; None: none recorded), naming both shas; None when the commit is the same or none is known."""
    if previous is None or previous.get("commit") is None or current.get("commit") is None:
        return None
    old, new = str(previous["commit"]), str(current["commit"])
    if old == new:
        return None
    return (
        f"resuming {run_dir}: its samples so far were written by commit {old}"
        f"{' (dirty)' if previous.get('dirty') else ''}, this code is commit {new}"
        f"{' (dirty)' if current.get('dirty') else ''}; both are listed in run_config.json "
        f"{PROVENANCE_KEY}.commits"
    )


def merged_provenance(blocks: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The provenance of a merged run from its shards' (in shard order; None: a shard that recorded none): ``commits``
    = every shard's entries, each code version once (first seen first; a shard without provenance adds an entry with
    commit null and its reason), ``lossless`` / ``lossless_reason`` the first recording shard's (one config), and
    ``merged`` true. None when no shard recorded any."""
    known = [b for b in blocks if b]
    if not known:
        return None
    commits: list[dict[str, Any]] = []
    for b in blocks:
        none = {"commit": None, "dirty": None, "version": None, "reason": "a shard without recorded provenance"}
        for c in (b.get("commits") or []) if b else [none]:
            if not any(same_code(c, x) and c.get("reason") == x.get("reason") for x in commits):
                commits.append(c)
    first = known[0]
    return {
        "lossless": first.get("lossless"),
        "lossless_reason": first.get("lossless_reason"),
        "commits": commits,
        "merged": True,
    }
