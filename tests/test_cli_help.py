"""The command line a newcomer explores: ``adtbench --help`` lists every subcommand with one line, each
``adtbench <sub> --help`` prints its help and exits 0 (no Hydra traceback), an unknown first word is one line on
stderr and exit 2, and overrides still reach the app.

The top-level help runs ``python -m adtbench.cli`` in a new interpreter (the entry point as a user starts it); the
subcommands' help, the unknown word and ``run --help`` run the same entry function in this process
(``conftest.run_in_process``: no interpreter, torch and Hydra start-up, ≈ 3 s a launch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_in_process

from adtbench.cli import BENCH_SUBCOMMANDS, SUBCOMMANDS, SUMMARIES

ROOT = Path(__file__).resolve().parents[1]


def adtbench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": "0"}
    env.pop("ADTBENCH_SIMULATE_DEVICE", None)
    return subprocess.run(
        [sys.executable, "-m", "adtbench.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def adtbench_in_process(*args: str) -> subprocess.CompletedProcess:
    """``adtbench(*args)``, run in this process (``conftest.run_in_process``: exit status, stdout, stderr)."""
    return run_in_process(*args, env={"HYDRA_FULL_ERROR": "0"})


def test_every_subcommand_has_a_summary_line():
    assert set(SUMMARIES) == {"run", *SUBCOMMANDS}
    assert all(text and "\n" not in text for text in SUMMARIES.values())


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_top_help_lists_the_subcommands_one_line_each(flag):
    proc = adtbench(flag)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name, text in SUMMARIES.items():
        assert sum(line.split()[:1] == [name] and text in line for line in lines) == 1, name
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "== Configuration groups ==" not in proc.stdout  # not Hydra's page


@pytest.mark.parametrize("sub", [*SUBCOMMANDS, *(f"bench {b}" for b in BENCH_SUBCOMMANDS)])
def test_subcommand_help_exits_zero_without_a_traceback(sub):
    proc = adtbench_in_process(*sub.split(), "--help")
    assert proc.returncode == 0, (sub, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "adtbench" in proc.stdout
    assert len(proc.stdout.strip().splitlines()) >= 2


def test_report_help_names_its_options():
    proc = adtbench_in_process("report", "--help")
    assert proc.returncode == 0 and "--out" in proc.stdout and "usage: adtbench report" in proc.stdout


def test_unknown_word_is_one_line_and_exit_2():
    proc = adtbench_in_process("reprot", "sweep/")
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "unknown command 'reprot'" in proc.stderr and "report" in proc.stderr


def test_run_help_is_hydras_page():
    proc = adtbench_in_process("run", "--help")
    assert proc.returncode == 0 and "== Configuration groups ==" in proc.stdout, proc.stderr[-2000:]
