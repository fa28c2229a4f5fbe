"""``adtbench`` console script.

adtbench [hydra overrides]                     decode (the Hydra app; same as ``python run.py``)
adtbench run [hydra overrides]                 the same
adtbench bench overhead|cost|probe|speed|versus|batch [overrides]   benchmarks (adtbench.tools.bench)
adtbench bench count [overrides]               aten ops of one target step, per decoder layer (tools.bench_count)
adtbench train vq|ar|drafter|evaluator ...     training pipeline (Hydra configs under conf/train/)
adtbench make-tiny model=<family> out=DIR      write a tiny random checkpoint in a real on-disk layout
adtbench eval <run dir | tree> eval=<preset>   quality metrics on existing run dirs
adtbench results [render|check]                the published speed tables from results/ (tools.render_results)
adtbench merge <shard dirs | array dir> --out DIR   merge prompt shards into one run
adtbench table <results dir> [...]             paper tables from a results tree
adtbench report <results dirs> --out DIR       one static HTML page of a sweep (adtbench.reporting.report)
adtbench check policy=<name> [policy.<key>=…]  is a method what it claims? (greedy = AR, the law, the device, config)

Help: ``adtbench --help`` (or ``-h``, ``help``) lists the subcommands, one line each (:data:`SUMMARIES`), and exits 0;
``adtbench <sub> --help`` prints that subcommand's help and exits 0 — its own argparse page where it has one
(``merge``, ``table``, ``report``), else its module's docstring (the usage and options it documents); ``adtbench run
--help`` is Hydra's page (config groups and overrides). A first word that is neither a subcommand nor an override
(``key=value``, ``+key=…``, ``~key``) nor a flag (``-m``, ``--cfg``, …) is one line on stderr and exit 2.
"""

from __future__ import annotations

import importlib
import os
import sys

SUBCOMMANDS = {
    "bench": "adtbench.tools.bench",
    "train": "adtbench.tools.train.cli",
    "make-tiny": "adtbench.tools.make_tiny",
    "eval": "adtbench.harness.eval",
    "results": "adtbench.tools.render_results",
    "merge": "adtbench.reporting.merge",
    "table": "adtbench.reporting.tables",
    "report": "adtbench.reporting.report",
    "check": "adtbench.harness.check",
}
BENCH_SUBCOMMANDS = {"count": "adtbench.tools.bench_count"}  # ``adtbench bench count``: not a ``tools.bench`` mode
#: the one-line description of each word ``adtbench --help`` lists (``run`` is the Hydra app itself)
SUMMARIES = {
    "run": "decode prompts with a policy and time the AR baseline (the default; Hydra overrides, `run --help`)",
    "bench": "benchmarks: overhead | cost | probe | speed | versus | batch | count",
    "train": "train the VQ, AR model, drafter, evaluator or upsampler (conf/train/*.yaml)",
    "make-tiny": "write a tiny random checkpoint in a real on-disk layout (smoke tests)",
    "eval": "quality metrics (CLIP, FID, ...) on existing run dirs",
    "results": "render the README's and docs/speed.md's speed tables from results/ (or `check` them)",
    "merge": "merge the prompt shards of one config into one run",
    "table": "paper tables (markdown / LaTeX / CSV) with bootstrap CIs from a results tree",
    "report": "one self-contained HTML page of a sweep: leaderboard, images beside AR's, maps, plots",
    "check": "is a method what it claims? greedy = AR, the T = 1 law test, the simulated GPU, config errors",
}
#: subcommands whose ``main`` parses ``--help`` itself (argparse); the others get their module docstring
OWN_HELP = {"merge", "table", "report"}
HELP_WORDS = ("-h", "--help", "help")


def usage() -> str:
    """The ``adtbench --help`` page: one line per subcommand."""
    width = max(map(len, SUMMARIES))
    lines = [
        "usage: adtbench [<subcommand>] [args]    (no subcommand: `adtbench [key=value ...]` runs the decode app)",
        "",
        "subcommands:",
        *(f"  {name:<{width}}  {text}" for name, text in SUMMARIES.items()),
        "",
        "`adtbench <subcommand> --help` describes one; `adtbench run --help` is Hydra's page (config groups).",
        "Docs: README.md, docs/config.md (overrides), docs/outputs.md (run dirs), docs/report.md (report).",
    ]
    return "\n".join(lines)


def _is_app_argument(word: str) -> bool:
    """A word Hydra's app takes first: an override (``key=value``, ``+key=v``, ``~key``) or a flag (``-m``)."""
    return "=" in word or word.startswith(("-", "+", "~"))


def _module_help(module_name: str) -> str:
    """A subcommand module's docstring — the usage and options it documents — read from its source without
    importing it (no torch, no side effects: help is instant)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module named {module_name!r}", name=module_name)
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    return (doc or f"{module_name}: no documentation").strip()


def main() -> None:
    if os.environ.get("ADTBENCH_SIMULATE_DEVICE", "").strip():  # accel.SIMULATE_ENV, read before importing torch
        from adtbench import accel

        accel.activate_from_env()  # every command on the simulated CUDA device
    args = sys.argv[1:]
    if args[:1] and args[0] in HELP_WORDS:
        print(usage())
        sys.exit(0)
    if args[:1] == ["bench"] and args[1:2] and args[1] in BENCH_SUBCOMMANDS:
        if any(a in HELP_WORDS[:2] for a in args[2:]):
            print(_module_help(BENCH_SUBCOMMANDS[args[1]]))
            sys.exit(0)
        sys.exit(importlib.import_module(BENCH_SUBCOMMANDS[args[1]]).main(args[2:]))
    if args and args[0] in SUBCOMMANDS:
        try:
            if args[0] not in OWN_HELP and any(a in HELP_WORDS[:2] for a in args[1:2]):
                print(_module_help(SUBCOMMANDS[args[0]]))
                sys.exit(0)
            module = importlib.import_module(SUBCOMMANDS[args[0]])
        except ModuleNotFoundError as e:
            if e.name is not None and e.name.startswith("adtbench"):
                print(f"adtbench: '{args[0]}' is not available in this version ({e.name} missing)", file=sys.stderr)
                sys.exit(2)
            raise
        sys.exit(module.main(args[1:]))
    if args and args[0] == "run":
        sys.argv = [sys.argv[0], *args[1:]]
    elif args and not _is_app_argument(args[0]):
        words = ", ".join(SUMMARIES)
        print(f"adtbench: unknown command '{args[0]}' (one of: {words}; or key=value overrides)", file=sys.stderr)
        sys.exit(2)
    from adtbench.harness.app import main as app_main

    app_main()


if __name__ == "__main__":
    main()
