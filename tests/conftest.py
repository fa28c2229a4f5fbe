"""Shared fixtures: tiny targets/drafters built from the shipped model configs, and a fake draft session."""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Bytecode. Where the environment forbids writing it (``PYTHONDONTWRITEBYTECODE``, as on this project's machines)
# every interpreter the suite starts — two xdist workers and every CLI or script subprocess — compiles torch's,
# transformers' and scipy's Python sources afresh: 2–3 CPU s of the 5–6 s that importing the app, transformers and
# scipy takes. The suite writes it instead under its own git-ignored cache dir (``PYTHONPYCACHEPREFIX``: the source
# trees and the venv stay as they are), set before torch loads and inherited by every interpreter started from here.
if sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE"):
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    sys.pycache_prefix = os.environ.setdefault(
        "PYTHONPYCACHEPREFIX", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "pycache")
    )

import pytest
import torch
from omegaconf import OmegaConf

from adtbench import accel
from adtbench.harness.config import register_resolvers

ROOT = Path(__file__).resolve().parents[1]
register_resolvers()
torch.set_num_threads(1)  # tiny models: threading only adds overhead (and CI has 2 cores)
# numpy's and scipy's OpenBLAS likewise: on 2 cores its second thread spin-waits whenever another process runs (FID's
# 2048 × 2048 eigvals in tests/test_eval.py: 5 s on one thread, 15–85 s on two on a loaded machine). The variable is
# read by the BLAS libraries loaded from now on (scipy's, and subprocesses'); threadpoolctl limits numpy's, loaded by
# torch above.
BLAS_THREADS = int(os.environ.setdefault("OPENBLAS_NUM_THREADS", "1"))
with contextlib.suppress(ImportError):
    from threadpoolctl import threadpool_limits

    threadpool_limits(BLAS_THREADS, user_api="blas")
# Hypothesis's per-example deadline (200 ms) is a wall clock: under pytest-xdist (README's test command runs two
# workers on CI's two cores) or a shared machine it measures the neighbours, not the example. The examples and their
# number are unchanged; the tests that set their own settings keep them.
with contextlib.suppress(ImportError):
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("adtbench", deadline=None)
    _hypothesis_settings.load_profile("adtbench")
# App tests drive the tiny random vehicle, not the default run (the trained mini model, policy=adt: tests/test_mini.py)
TINY_RUN = {"model": "tiny_llamagen", "drafter": "eagle", "dataset": "smoke", "policy": "eagle2"}
TINY_OVERRIDES = [f"{k}={v}" for k, v in TINY_RUN.items()]


def model_cfg(name: str, **over):
    cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml")
    for k, v in over.items():
        OmegaConf.update(cfg, k, v, merge=True)
    return cfg


def tiny(name: str = "tiny_llamagen", dtype: str = "float64", **over):
    """A tiny target and a random EAGLE drafter (float64 by default: exactness tests): ``harness.check.tiny_models``."""
    from adtbench.harness.check import tiny_models

    return tiny_models(name, dtype, **over)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = ROOT.parent / "shared" / "data"
    if not path.exists():
        pytest.skip("../shared/data not present")
    return path


def pooled_chisquare(counts, expected: dict, n: int) -> tuple[float, int]:
    """χ² p-value of observed ``counts`` (outcome → count over ``n`` draws) against ``n · expected``, the outcomes
    expected fewer than 5 times pooled into one cell (dropped when that cell is empty); also the number of unpooled
    outcomes."""
    from scipy.stats import chisquare

    keys = [k for k in expected if expected[k] * n >= 5]
    rest = [k for k in expected if expected[k] * n < 5]
    obs = [counts.get(k, 0) for k in keys] + [sum(counts.get(k, 0) for k in rest)]
    exp = [expected[k] * n for k in keys] + [sum(expected[k] for k in rest) * n]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue), len(keys)


def synthetic_cost_model():
    """A cost model whose verify cost grows 2 % per node (1 ms + 0.02 ms · n) with cheap drafter levels: on the
    tiny random models it yields trees of many sizes and depths (tests assert that)."""
    from adtbench.algorithm.cost import CostModel

    sizes = [1, 2, 4, 8, 16, 32, 64]
    return CostModel(sizes, [1.0 + 0.02 * n for n in sizes], [1, 4, 16], [0.02, 0.03, 0.04], 0.05)


def with_cost(policy: Any) -> Any:
    """``policy`` with a calibrated ``synthetic_cost_model`` budget (``budget: cost`` without a measured model)."""
    from adtbench.algorithm.cost import TreeBudget

    policy.cost.tree = TreeBudget(synthetic_cost_model(), calibrate=True)
    return policy


def small_tree_policies() -> dict[str, Callable[[], Any]]:
    """Small instances of every tree policy and budget (the graphed-level and tree-verify tests' cases): the static
    tree, its sampled drafts, a chain, EAGLE-2 fixed and ``budget: cost``, ADT-Tree fixed and ``budget: cost``."""
    from adtbench.algorithm.policies.adt import ADTPolicy
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.algorithm.policies.static import ChainPolicy, StaticTreePolicy

    return {
        "static": lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
        "static_sampled": lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1]], "sample"),
        "chain": lambda: ChainPolicy(3),
        "eagle2": lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9),
        "eagle2_cost": lambda: with_cost(Eagle2Policy(depth=3, top_k=3, total_tokens=12, budget="cost")),
        "adt_fixed": lambda: ADTPolicy(D0=3, K0=3, K_min=2, K_max=4, N_max=10, budget="fixed"),
        "adt_cost": lambda: with_cost(ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8, budget="cost")),
    }


def recording_trees(policy: Any) -> Any:
    """``policy`` with every proposed tree kept in ``policy.trees`` as host copies of its live nodes: (tokens,
    parents renumbered over them (the root's −1), (depth, ancestor mask), None, proposal rows) — the graphed-level and
    draft-phase tests compare them across paths (``budget: cost`` in the draft phase verifies the tree at the bucket
    of the kept candidates with the nodes past its N dead, the host path builds the N nodes alone)."""
    trees: list[tuple[Any, ...]] = []
    propose = policy.propose

    def wrapped(session: Any, max_depth: int) -> Any:
        tree = propose(session, max_depth)
        live = list(range(tree.size)) if tree.alive is None else torch.nonzero(tree.alive.cpu())[:, 0].tolist()
        new = {old: i for i, old in enumerate(live)}
        tokens, parents, depth = (x.cpu().tolist() for x in (tree.tokens, tree.parents, tree.depth))
        anc = tree.ancestor_mask.cpu()[live][:, live].tolist()
        q = None if tree.proposal is None else tree.proposal.cpu()[live]
        shape = ([depth[i] for i in live], anc)
        trees.append(([tokens[i] for i in live], [new.get(parents[i], -1) for i in live], shape, None, q))
        return tree

    policy.propose = wrapped
    policy.trees = trees
    return policy


@contextlib.contextmanager
def _logging_restored() -> Iterator[None]:
    """Put every logger back as it was (level, handlers, propagate, disabled) and close the handlers added meanwhile:
    Hydra's job runs ``logging.config.dictConfig`` on the root logger (a console and an ``app.log`` handler)."""

    def loggers() -> list[logging.Logger]:
        return [
            logging.getLogger(),
            *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
        ]

    saved = {id(lg): (lg.level, lg.handlers[:], lg.propagate, lg.disabled) for lg in loggers()}
    disabled = logging.root.manager.disable
    try:
        yield
    finally:
        for lg in loggers():
            level, handlers, propagate, off = saved.get(id(lg), (logging.NOTSET, [], True, False))
            for h in lg.handlers:
                if h not in handlers:
                    h.close()
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, off
        logging.disable(disabled)


def tiny_app_config(*overrides: str):
    """The app's composed config for the tiny vehicle (``TINY_OVERRIDES``) with ``overrides``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=[*TINY_OVERRIDES, *overrides])


def tiny_app_run(run_dir: Path, *overrides: str) -> dict:
    """``harness.app.run`` of ``tiny_app_config(*overrides)`` into ``run_dir``: its summary."""
    from adtbench.harness import app

    cfg = tiny_app_config(*overrides)
    return app.run(cfg, run_dir, {"model": "tiny_llamagen", "policy": str(cfg.policy.name)})


def read_jsonl(path: Path) -> list[dict]:
    """The records of a ``.jsonl`` file."""
    import json

    return [json.loads(x) for x in path.read_text().splitlines()]


def run_in_process(*argv: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python run.py *argv`` run in this process: the same entry function (``adtbench.cli.main``: the command-line
    precheck, Hydra's app, the task) without an interpreter, torch and Hydra to start (≈ 3 s a run). Returns what
    ``subprocess.run(..., capture_output=True, text=True)`` would: the exit status (``SystemExit``'s code) and the
    text written to stdout and stderr. What a process exit does is undone: run-dir locks are released, the lock
    module's record of created dirs, Hydra's global state, the logging setup, ``sys.argv`` and ``env`` (set for the
    run) restored, the simulated device ``ADTBENCH_SIMULATE_DEVICE=cuda`` entered left (its exit line printed); a
    run still going after ``timeout`` seconds is interrupted (``TimeoutError``: Hydra reports it, exit 1). Tests
    that kill a run, or check what a fresh interpreter prints, use a real process."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from adtbench.cli import main
    from adtbench.harness import app, lock

    out, err = io.StringIO(), io.StringIO()
    argv0, environ = sys.argv, dict(os.environ)
    locks, created, hydra_cfg = dict(lock._LOCKS), dict(lock._CREATED), HydraConfig.instance().cfg
    code: int = 0

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"run.py {' '.join(argv)}: still running after {timeout} s (in process)")

    GlobalHydra.instance().clear()
    sim_before = accel.simulation()
    alarm = signal.signal(signal.SIGALRM, expired)
    with _logging_restored(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = [str(ROOT / "run.py"), *argv]
        os.environ.update(env or {})
        signal.alarm(timeout)
        try:
            main()
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:  # as the interpreter does with a message
                print(e.code, file=sys.stderr)
                code = 1
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, alarm)
            sys.argv = argv0
            os.environ.clear()
            os.environ.update(environ)
            for key, held in list(lock._LOCKS.items()):
                if key not in locks:
                    held.release()  # the kernel drops a process's flocks when it ends
            lock._CREATED.clear()
            lock._CREATED.update(created)
            GlobalHydra.instance().clear()
            HydraConfig.instance().cfg = hydra_cfg
            app.RESUME.clear()
            sim = accel.simulation()
            if sim is not None and sim is not sim_before:  # ADTBENCH_SIMULATE_DEVICE=cuda entered it for the process
                sim.__exit__(None, None, None)
                if sim.report_at_exit is not None:
                    atexit.unregister(sim.report_at_exit)
                    sim.report_at_exit()  # the line the process would print at exit
    return subprocess.CompletedProcess(["run.py", *argv], code, out.getvalue(), err.getvalue())


class FakeSession:
    """A scripted ``DraftSession``: distributions keyed by the token path from the root."""

    def __init__(self, dists: dict[tuple[int, ...], torch.Tensor], vocab: int, greedy: bool = True, root: int = 99):
        self.dists, self.vocab, self.greedy = dists, vocab, greedy
        self.root_token = torch.tensor([root])
        self.device = torch.device("cpu")
        self.generator = torch.Generator().manual_seed(0)
        self.paths: list[tuple[int, ...]] = [()]
        self.expansions: list[list[int]] = []
        self.levels: list[int] = []

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    def _lp(self, path: tuple[int, ...]) -> torch.Tensor:
        p = self.dists.get(path, torch.full((self.vocab,), 1.0 / self.vocab))
        return p.log()

    def root_logprobs(self) -> torch.Tensor:
        return self._lp(())

    def expand(self, parents, tokens, level):
        tokens = torch.as_tensor(tokens).view(-1).tolist()
        parents = torch.as_tensor(parents).view(-1).tolist()
        ids = []
        for par, tok in zip(parents, tokens):
            assert len(self.paths[par]) == level - 1, "expand's parents sit at depth level − 1"
            ids.append(len(self.paths))
            self.paths.append((*self.paths[par], tok))
        self.expansions.append(ids)
        self.levels.append(len(ids))
        return range(ids[0], ids[-1] + 1), torch.stack([self._lp(self.paths[i]) for i in ids])


def _gpu_mode() -> str:
    """Where ``@pytest.mark.gpu`` tests run: ``cuda`` (a CUDA device is present), ``cpu``
    (``ADTBENCH_GPU_TEST_DEVICE=cpu``: the module on the plain CPU, a check of the tests themselves), ``simulated``
    (``ADTBENCH_SIMULATE_DEVICE=cuda``: every one on the simulated CUDA device), else ``none`` (they skip, except the
    ``gpu_sim`` ones, which run on the simulated device: CI's cheap subset)."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("ADTBENCH_GPU_TEST_DEVICE") == "cpu":
        return "cpu"
    return "simulated" if os.environ.get(accel.SIMULATE_ENV, "").strip() == "cuda" else "none"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Under ``-n N`` without a ``--dist`` of the command line's own, pytest-xdist's ``worksteal`` scheduler: each
    worker starts with a contiguous half of the (longest-first, below) order and one that runs out takes half of the
    other's queue, so both end together. xdist's default ``load`` hands each worker a quarter of its share at once —
    the first worker every ``slow`` test — and left the second idle for the last minutes of CI. Set here rather than
    in ``addopts``, which would break ``pytest`` where xdist is not installed (``benchmarks/gpu.sh tests`` allows
    that); runs before xdist's own hook (a conftest's ``tryfirst`` implementation is called before a plugin's)."""
    opt = config.option
    if getattr(opt, "numprocesses", None) and getattr(opt, "dist", "no") == "no" and not getattr(opt, "distload", 0):
        opt.dist = "worksteal"


MEASURED_S = {
    "test_gpu_script.py::test_every_gpu_stage_runs_on_the_simulated_device": 38,
    "test_lean_forward.py::test_compiled_forward_matches_eager": 17,
    "test_report.py::test_one_page_with_its_images_within_10_s": 28,  # the module's sweep (≈ 25 s) for its 4 tests:
    "test_report.py::test_leaderboard_numbers_are_the_tables": 28,  # listed together, so that one worker runs them
    "test_report.py::test_each_setting_sits_beside_its_ar_with_the_same_seed": 28,  # (split: 2 × 30 s, measured)
    "test_report.py::test_page_in_headless_chromium": 28,
    "test_eval_protocols.py::test_fid_prc_kid_equal_torch_fidelity_cli": 22,
    "test_jacobi_step.py::test_law_of_the_fixed_shape_step[scd-up-step-t1]": 25,
    "test_laws.py::test_law[static-sampled-cycle-graphed-k2w4]": 18,  # the graphed cycle (ci3's measure, load 1.3-2.3)
    "test_laws.py::test_law[eagle2-cycle-graphed-k2w4]": 21,
    "test_laws.py::test_law[eagle2-cycle-graphed-k2w4-b2]": 16,  # load 2.3, one core
    "test_typecheck.py::test_algorithm_layer_is_mypy_clean": 21,
    "test_emu3_shape.py::test_the_emu3_shape_probe_runs_through_the_graphs_at_the_real_layout": 21,
    "test_laws.py::test_law[sjd_pac-K2D2-pac]": 20,
    "test_laws.py::test_q_not_reduced_fails_the_sjd_pac_headline": 17,
    "test_slurm.py::test_submitit_local_multirun_of_two_shard_jobs_then_merge": 9,
    "test_laws.py::test_law[eagle2-K2-q3]": 16,
    "test_tracking.py::test_kill_9_at_sample_5_of_12_then_rerun_gives_one_wandb_run_with_12_samples": 10,
    "test_laws.py::test_law[adt-sampled-K2-q3]": 14,
    "test_gpu_script.py::test_the_emu3_shape_probes_on_the_simulated_device": 7,
    "test_bench_compare.py::test_a_one_prompt_one_row_comparison_writes_its_table": 8,
    "test_window_ship.py::test_shipped_table_agrees_with_a_fresh_calibration": 11,
    "test_plugins.py::test_the_entropy_window_as_a_plugin_passes_adtbench_check_and_runs_in_the_app": 11,
    "test_bench_speed.py::test_speed_table_rows_readme_and_reuse": 8,
    "test_bench_device.py::test_probe_judges_every_policy_at_a_pinned_shape_on_one_set_of_models": 10,
    "test_laws.py::test_law[static-sampled-q3]": 10,
    "test_laws.py::test_law[sjd-random-long]": 10,
    "test_laws.py::test_a_residual_reprocessed_by_the_warper_fails[eagle2-warped]": 10,
    "test_batch.py::test_batched_speculation_has_the_ar_law_at_t1": 9,
    "test_laws.py::test_law[scd-up-t1]": 9,
    "test_laws.py::test_law[eagle2-warped]": 9,
    "test_laws.py::test_law[chain-t3]": 8,
    "test_batch.py::test_mini_batched_speculation_equals_one_prompt_at_a_time": 8,  # 4 cases, one module's models
    "test_bench_speed.py::test_bench_count_reads_the_device_at_most_twice_per_cycle[policy1]": 8,
    "test_janus.py::test_scd_law_at_t1": 8,
    "test_mini.py::test_default_run_from_the_command_line": 7,
    "test_families.py::test_run_py_literal_command": 7,
    "test_simulated.py::test_the_command_line_runs_on_the_simulated_device": 7,
    "test_bench_device.py::test_bench_batch_and_versus_on_the_simulated_device": 7,
    "test_emu3.py::test_scd_law_at_t1_on_tiny_emu3": 7,
    "test_tree_step.py::test_bench_count_of_a_graphed_tree_cycle": 8,
    "test_user_faults.py::test_ctrl_c_is_one_line_and_the_run_dir_resumes": 6,
    "test_simulated.py::test_every_policy_and_rule_on_the_simulated_device": 3,  # 4 cases, one module's models
    "test_plugins.py::test_adtbench_check_fails_scd_with_the_authors_stored_proposal": 6,
    "test_mulo.py::test_sampling_law_equals_ar[tau>1]": 6,
    "test_notebook.py::test_main_table_notebook_executes_headless": 5,
    "test_verify.py::test_device_acceptance_has_the_host_walks_law[lantern_point_mass]": 5,
    "test_mulo.py::test_sampling_law_equals_ar[exact]": 5,
    "test_aa.py::test_the_floor_script_runs_the_app_and_judges_each_run": 5,
    "test_bench_speed.py::test_bench_count_reads_the_device_at_most_twice_per_cycle[policy0]": 5,
    "test_app.py::test_kill_mid_run_then_resume_loses_and_duplicates_nothing": 5,
    "test_batch.py::test_kill_a_batched_run_then_resume_loses_and_duplicates_nothing": 5,
}
"""The longest tests' CPU seconds (every phase, their subprocesses' included: ``ADTBENCH_TEST_CPU``, below), those of
5 s or more, per test function or per parametrisation (``file::function[id]``, looked up first), from one run of the
README's test command (``ADTBENCH_TEST_CPU=cpu.jsonl pytest -q -n 2``; the files ``tests/test_prefill_reuse.py``
changed measured again after it; the tests that start interpreters scaled by their change in a run with the bytecode
written, above): the scheduling order, longest first. Tests that share an expensive module fixture
are listed at one value, adjacent, so that one worker runs them all (a worker that steals one builds it again).
Those not marked ``slow`` are marked here
(over ~5 s, the marker's definition). A test missing from the list is only scheduled by its marker; refresh the list
from such a run when the ranking changes."""


def _measured_s(item: pytest.Item) -> float:
    """``MEASURED_S`` of ``item``: of its parametrisation, else of its function (parametrisations pooled), else 0."""
    name = f"{item.path.name}::{item.name}"
    if name in MEASURED_S:
        return MEASURED_S[name]
    return MEASURED_S.get(f"{item.path.name}::{getattr(item, 'originalname', item.name)}", 0.0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``slow`` tests run first, the longest measured ones (``MEASURED_S``) first among them (a stable sort: the
    rest keep the collection's order), so that under pytest-xdist (README's test command, ``-n 2``, with
    ``--dist worksteal``, ``pytest_cmdline_main``: a worker that runs out of tests takes half of the other's queue)
    the long tests start early and the short ones fill both workers at the end — longest-first scheduling: a
    100-400 s test started last would otherwise run on one worker while the other idles. ``@pytest.mark.gpu`` tests
    skip (with the reason shown by ``-ra``) where no CUDA device is present, unless ``ADTBENCH_GPU_TEST_DEVICE=cpu``
    or ``ADTBENCH_SIMULATE_DEVICE=cuda`` asks to run them, or they are marked ``gpu_sim`` as well (run on the
    simulated device)."""
    for item in items:
        if _measured_s(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, -_measured_s(item)))
    if _gpu_mode() != "none":
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (ADTBENCH_SIMULATE_DEVICE=cuda runs it on the simulated one)")
    for item in items:
        if "gpu" in item.keywords and "gpu_sim" not in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _simulated_cuda(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A ``gpu`` test without a CUDA device (``ADTBENCH_SIMULATE_DEVICE=cuda``, or a ``gpu_sim`` test) runs inside
    ``accel.simulate()``: ``cuda`` is the simulated device, with CUDA's placement rules, counted synchronisations and
    the CUDA-graph stand-in; the variable is set for the subprocesses it starts (the CLI) too."""
    mode, marks = _gpu_mode(), request.keywords
    if "gpu" not in marks or mode in ("cuda", "cpu") or (mode == "none" and "gpu_sim" not in marks):
        yield None
        return
    monkeypatch.setenv(accel.SIMULATE_ENV, "cuda")
    with accel.simulate() as sim:
        yield sim


@contextlib.contextmanager
def static_runs() -> Iterator[Counter]:
    """Counts the static-shape forwards of ``models.graphs`` while active: ``(class name, bucket, graphed) → runs``
    (``StaticVerify`` / ``StaticDraft``; graphed: through a captured graph, CUDA's or its stand-in), and the drafted
    trees' verifies through ``algorithm.tree_step`` (``TreeStep``: its own graph over a ``StaticVerify`` bucket)."""
    from adtbench.algorithm import tree_step
    from adtbench.models import graphs

    counts: Counter = Counter()
    original, launch = graphs._Step.run, tree_step.TreeStep.launch

    def run(step):
        counts[(type(step).__name__, step.b, step.graph is not None)] += 1
        return original(step)

    def tree_launch(step, K):
        counts[("TreeStep", step.b, step.graphed)] += 1
        return launch(step, K)

    graphs._Step.run, tree_step.TreeStep.launch = run, tree_launch
    try:
        yield counts
    finally:
        graphs._Step.run, tree_step.TreeStep.launch = original, launch


_SESSION_T0 = time.perf_counter()
CPU_LOG = os.environ.get("ADTBENCH_TEST_CPU")
"""Where to append each test's CPU seconds (its process's and its finished subprocesses', all phases), one JSON line
per test: ``ADTBENCH_TEST_CPU=cpu.jsonl pytest -n 2`` ranks the tests by the core time CI spends on them, which a
loaded machine's wall times (``--durations``) do not."""


def _cpu_now() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With ``ADTBENCH_TEST_CPU`` set, the CPU seconds of ``item`` (``CPU_LOG``)."""
    if not CPU_LOG:
        yield
        return
    import json

    t0 = _cpu_now()
    yield
    with open(CPU_LOG, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_now() - t0, 2)}) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The test time summed over every phase and worker against the session's wall time (CI's 15-minute budget:
    under ``-n 2`` the sum is what one core would take, the wall what CI takes); then every law test's power line
    (``adtbench/algorithm/laws.py``: ``record_property("law", …)``, xdist workers included): draws, cells, the TV it
    detects at 90 % power, its p-value."""
    summed = sum(getattr(rep, "duration", 0.0) for reps in terminalreporter.stats.values() for rep in reps)
    workers = getattr(terminalreporter.config.option, "numprocesses", None) or 1
    wall = time.perf_counter() - _SESSION_T0
    terminalreporter.write_line(
        f"test time: {summed:.0f} s summed over {workers} worker(s), {wall:.0f} s wall since startup"
        + (f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "")
    )
    lines = [
        value
        for outcome in ("passed", "failed")
        for rep in terminalreporter.stats.get(outcome, [])
        if getattr(rep, "when", None) == "call"
        for key, value in getattr(rep, "user_properties", [])
        if key == "law"
    ]
    if lines:
        terminalreporter.section("law tests: the TV each detects at 90 % power (α = 1e-3)")
        for line in lines:
            terminalreporter.write_line(str(line))


def tiny_open_clip(d: Path, seed: int, quick_gelu: bool = False):
    """A tiny open_clip architecture (``d/adtbench-tiny-clip.json``, registered with open_clip) and a model of it with
    random weights from ``seed`` (the eval tests' CLIP stand-in); ``d/tiny_clip.pt`` holds its state dict."""
    import json

    import open_clip

    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (d / "adtbench-tiny-clip.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(str(d / "adtbench-tiny-clip.json"))
    torch.manual_seed(seed)
    model = open_clip.create_model("adtbench-tiny-clip", pretrained=None, force_quick_gelu=quick_gelu)
    torch.save(model.state_dict(), d / "tiny_clip.pt")
    return model


def batched_against_single(target, pol, inputs, sp, where: str) -> tuple[list[list[int]], dict]:
    """``inputs`` decoded one at a time by ``pol`` (seed i for prompt i) and through 3 slots of a ``BatchTarget``
    (``pol.generate_batch``, the same seeds): (the single decodes' tokens, the batched results by prompt index)."""
    from adtbench.algorithm.engine import generate
    from adtbench.models.batch import BatchTarget

    single = [generate(target, None, pol, x, sp, torch.Generator().manual_seed(i), acceptance=where).tokens
              for i, x in enumerate(inputs)]  # fmt: skip
    got: dict = {}
    bt = BatchTarget(target, 3, True, 64 + target.layout.num_gen_tokens)
    items = [(i, x, torch.Generator().manual_seed(i)) for i, x in enumerate(inputs)]
    pol.generate_batch(bt, None, items, sp, got.__setitem__, None, where)
    return single, got
