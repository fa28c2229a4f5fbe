"""What wrote a run dir (``harness.provenance``, ``rundir_write.record_provenance``) and whether its method is lossless
(``job.exactness``, the one place a policy's and a rule's declarations compose): the git commit and dirty flag of
the code's checkout (None with a reason outside one), the commits list a resume by other code extends, the
one-line warning naming both shas, merged runs, and the lossless flag against the speed table's own row labels."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from adtbench.errors import ConfigError
from adtbench.harness import rundir, rundir_write
from adtbench.harness.config import build_policy
from adtbench.harness.job import exactness
from adtbench.harness.provenance import code_version, merged_provenance, resume_warning
from adtbench.harness.records import RESUME_NEW_KEYS
from adtbench.tools.bench_speed import ROWS

ROOT = Path(__file__).resolve().parents[1]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *env_args, "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


@needs_git
def test_code_version_names_the_checkout_the_package_is_in(tmp_path: Path) -> None:
    """A package folder tracked in a checkout: HEAD's sha, dirty iff a tracked file changed (untracked files do not
    count); untracked in a checkout, or outside any: commit and dirty None with the reason."""
    version = code_version.__wrapped__  # uncached: the tree changes between the calls
    repo, pkg = tmp_path / "repo", tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    got = version(str(pkg))
    assert got["commit"] is None and "not tracked" in got["commit_reason"]
    _git(repo, "add", "pkg/__init__.py")
    _git(repo, "commit", "-qm", "one")
    sha = _git(repo, "rev-parse", "HEAD").strip()
    assert version(str(pkg)) | {"version": None} == {
        "commit": sha,
        "dirty": False,
        "commit_reason": None,
        "version": None,
    }
    (repo / "untracked.txt").write_text("?")
    assert version(str(pkg))["dirty"] is False
    (pkg / "__init__.py").write_text("x = 2\n")
    assert version(str(pkg))["dirty"] is True and version(str(pkg))["commit"] == sha
    outside = tmp_path / "site-packages" / "pkg"
    outside.mkdir(parents=True)
    got = version(str(outside))
    assert got["commit"] is None and got["dirty"] is None and "not in a git checkout" in got["commit_reason"]


@needs_git
def test_the_imported_package_reports_its_checkout() -> None:
    got = code_version()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:  # the tests of an unpacked sdist: no checkout, a reason instead
        assert got["commit"] is None and got["commit_reason"]
        return
    assert got["commit"] == head.stdout.strip() and isinstance(got["dirty"], bool) and got["commit_reason"] is None


def _prov(commit: str | None, dirty: bool = False) -> dict:
    return {"commit": commit, "dirty": dirty, "commit_reason": None, "version": "0.1.0", "torch": torch.__version__,
            "device": "cpu", "device_name": "cpu (x)", "lossless": True, "lossless_reason": "r"}  # fmt: skip


def test_record_provenance_keeps_the_config_apart_and_lists_the_commits(tmp_path: Path) -> None:
    """The block sits beside the config in run_config.json: the resume check and every config reader see the config
    alone; each other code version that opens the dir to decode is appended; a dir with samples from before the
    key starts with an unknown entry; the warning names both shas."""
    fingerprint = {**RESUME_NEW_KEYS, "model": {"name": "m"}, "seed": 0}  # today's fingerprint has these nodes
    rundir_write.check_resume(tmp_path, fingerprint)
    prev, block = rundir_write.record_provenance(tmp_path, _prov("a" * 40), decoding=True)
    assert prev is None and [c["commit"] for c in block["commits"]] == ["a" * 40]
    assert rundir.read_run_config(tmp_path) == fingerprint and rundir.read_provenance(tmp_path) == block
    rundir_write.check_resume(tmp_path, fingerprint)  # the provenance is no config difference
    prev, block = rundir_write.record_provenance(tmp_path, _prov("a" * 40), decoding=True)  # same code: nothing added
    assert len(block["commits"]) == 1 and resume_warning(tmp_path, prev, _prov("a" * 40)) is None
    prev, block = rundir_write.record_provenance(tmp_path, _prov("b" * 40), decoding=False)  # nothing to decode
    assert len(block["commits"]) == 1 and block["device_name"] == "cpu (x)"
    prev, block = rundir_write.record_provenance(tmp_path, _prov("b" * 40, dirty=True), decoding=True)
    assert [(c["commit"], c["dirty"]) for c in block["commits"]] == [("a" * 40, False), ("b" * 40, True)]
    line = resume_warning(tmp_path, prev, _prov("b" * 40, dirty=True))
    assert line is not None and "\n" not in line and "a" * 40 in line and "b" * 40 in line
    with pytest.raises(ConfigError, match="provenance"):
        rundir_write.check_resume(tmp_path / "other", {**fingerprint, "provenance": 1})

    old = tmp_path / "old"  # a run dir from before provenance: a config and samples, no block
    old.mkdir()
    (old / "run_config.json").write_text(json.dumps(fingerprint))
    (old / "samples.jsonl").write_text('{"prompt_id": "p"}\n')
    assert rundir.read_provenance(old) is None
    prev, block = rundir_write.record_provenance(old, _prov("c" * 40), decoding=True)
    assert prev is not None and prev["commit"] is None and "before" in prev["reason"]
    assert [c["commit"] for c in block["commits"]] == [None, "c" * 40]
    assert resume_warning(old, prev, _prov("c" * 40)) is None  # nothing to name: the old code is unknown

    merged = merged_provenance([rundir.read_provenance(tmp_path), None, rundir.read_provenance(old)])
    assert merged is not None and merged["merged"] and merged["lossless"] is True
    assert [c["commit"] for c in merged["commits"]] == ["a" * 40, "b" * 40, None, None, "c" * 40]
    assert merged_provenance([None, None]) is None


def _composed(*override_lists: list[str]) -> list:
    """The composed configs of ``override_lists`` (one Hydra initialisation for all: composing is the slow part)."""
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return [compose("config", overrides=o) for o in override_lists]


def _rule(cfg):
    """The run's rule without a model, as ``adtbench table`` rebuilds it for a run that recorded no flag: exact, or
    LANTERN with the config's bounds over a stand-in neighbour table (its losslessness depends on the bounds and the
    residual only)."""
    from omegaconf import OmegaConf

    from adtbench.reporting.load import _recorded_rule

    node = OmegaConf.to_container(cfg.lantern, resolve=True) if cfg.get("lantern") is not None else {}
    return _recorded_rule({"lantern": node}, None)


def test_exactness_agrees_with_the_speed_tables_row_labels() -> None:
    """Every row of ``adtbench bench speed`` labelled exact is lossless by :func:`exactness`, every row labelled
    lossy or ``lantern=on`` is not (the labels were written by hand from the methods' docs: two sources agree)."""
    rows = {
        n: (label, o) for n, (label, o) in ROWS.items() if "exact" in label or "lossy" in label or "lantern=on" in label
    }
    for (name, (label, _)), cfg in zip(rows.items(), _composed(*(o for _, o in rows.values()))):
        lossy_label = "lossy" in label or "lantern=on" in label
        got = exactness(build_policy(cfg), _rule(cfg))
        assert got.lossless is not lossy_label, (name, label, got)
        assert got.reason.startswith(f"policy={cfg.policy.name}")
    assert len(rows) >= 20


def test_exactness_of_the_compositions_the_rows_do_not_cover() -> None:
    """AR whatever the rule; LANTERN with a zero bound is exact; a loop with its own rule ignores the run's; the
    loops' exact arms (MuLo-SD ``rule=exact``, SJD-PAC ``variant=exact``) and their lossy ones."""
    cases = {
        ("policy=ar", "lantern=on"): True,
        ("policy=adt", "lantern=on", "lantern.delta=0.0"): True,
        ("policy=adt", "lantern=on", "lantern.delta=0.0", "lantern.reference_residual=true"): False,
        ("policy=scd", "lantern=on"): False,
        ("policy=mulo", "policy.rule=exact"): True,
        ("policy=sjd_pac",): True,
        ("policy=sjd_pac", "policy.variant=authors"): False,
        ("policy=zipar", "policy.window=64"): False,  # ZipAR declares itself lossy at every window
    }
    reasons = {}
    for (overrides, lossless), cfg in zip(cases.items(), _composed(*(list(o) for o in cases))):
        got = exactness(build_policy(cfg), _rule(cfg))
        assert got.lossless is lossless, (overrides, got)
        reasons[overrides] = got.reason
    assert "lantern=on(delta=0.1" in reasons[("policy=scd", "lantern=on")]  # the bound that makes it lossy, named
    assert "policy.variant=authors" in reasons[("policy=sjd_pac", "policy.variant=authors")]


def test_a_lossy_summary_says_so_on_its_line() -> None:
    from adtbench.harness.records import Summary

    exact = Summary(model="m", policy="adt", lossless=True, lossless_reason="exact").line()
    lossy = Summary(model="m", policy="zipar", lossless=False, lossless_reason="policy=zipar: lossy").line()
    assert "LOSSY" not in exact and lossy.endswith("LOSSY (policy=zipar: lossy)")
    assert Summary.from_json(Summary(lossless=False, lossless_reason="r").to_json()).lossless is False
