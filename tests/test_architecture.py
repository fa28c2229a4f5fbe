"""The layers of ``docs/architecture.md`` hold: every import in the package (module level and inside functions)
points to the importer's own layer or one below it, and no set of modules imports itself in a circle.

``cli`` dispatches to subcommands by module name (``importlib``) on purpose: the console script sits above all
layers and is not an import arrow.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "adtbench"


def parsed(p: Path) -> ast.Module:
    """``p``'s syntax tree, each text parsed once per process (the tests below read the same ≈ 270 files; none
    edits a tree; a file rewritten is its new text's)."""
    return _parse(p.read_text())


@functools.cache
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


LAYERS: dict[str, int] = {  # module or folder under adtbench (longest prefix wins) → layer (0 = foundation)
    **dict.fromkeys(
        [
            *("errors", "registry", "plugins", "layout", "sampling_params", "io", "scenes", "resources"),
            *("accel", "accel_graphs", "accel_sim", "graph_modes", "graph_runner"),
        ],
        0,
    ),
    "models": 1,  # targets: forward, commit, decode images — no token choice (that is the algorithm's)
    "algorithm": 2,  # the AR steps, sampling law, trees, verification, engine, loops, policies, drafters, cost
    "harness": 3,
    "cli": 3,
    "reporting": 4,
    "tools": 5,
}
ALGORITHM_FORBIDDEN_IMPORTS = ("hydra", "omegaconf", "adtbench.io", "adtbench.harness")
FILE_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "save", "load", "mkdir"}


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(m: str, p: Path, mods: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """``(module, names)`` per import statement of module ``m`` (file ``p``), relative imports resolved:
    ``from x import a, b`` → ``("x", ["a", "b"])``, ``import x.y`` → ``("x.y", [])``."""
    pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(parsed(p)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.append((base, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def reexports(mods: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package → {name its ``__init__`` imports from a module of the package tree: that module}."""
    out: dict[str, dict[str, str]] = {}
    for m, p in mods.items():
        if p.name == "__init__.py":
            names = {}
            for base, imported in _imports(m, p, mods):
                for n in imported:
                    target = f"{base}.{n}" if f"{base}.{n}" in mods else base
                    if target in mods and target != m:
                        names[n] = target
            out[m] = names
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the adtbench modules it imports (``from adtbench.x import y`` counts as ``adtbench.x.y`` when
    that is a module, else ``adtbench.x``).

    Package ``__init__`` re-exports are followed: ``from P import name`` of a package ``P`` reads P's namespace,
    so it is an arrow to ``P`` (its ``__init__`` runs first) and, for a name P's ``__init__`` imports from a
    module ``M``, an arrow to ``M`` too — so a submodule importing from its own package's ``__init__`` while
    that ``__init__`` imports the submodule is a cycle."""
    mods = modules()
    packages = reexports(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for base, names in _imports(m, p, mods):
            targets = [base] if not names else []
            for n in names:
                sub = f"{base}.{n}"
                targets.append(sub if sub in mods else base)
                if base in packages:  # from P import name: P's __init__, and where it got name from
                    targets += [base, packages[base].get(n, base)]
            edges[m] |= {t for t in targets if t in mods and t != m and t != "adtbench"}
    return edges


def layer(module: str) -> int:
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise AssertionError(f"{module}: not in a layer — add it to docs/architecture.md and LAYERS")


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} → {b}" for a, bs in edges.items() if a != "adtbench" for b in bs if layer(b) > layer(a))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer_and_imports_point_down() -> None:
    edges = import_graph()
    assert len(edges) > 60  # the walk sees the package
    up = upward(edges)
    assert not up, "imports into a higher layer:\n" + "\n".join(up)


def test_models_import_nothing_of_the_algorithm() -> None:
    """gpt-fast's rule: the model layer is the network and its cache; decoding (the AR steps, the sampling law) is the
    algorithm's. A target that runs a stage plainly (Tar) is handed the loop (``models.base.PlainDecode``)."""
    edges = import_graph()
    bad = sorted(f"{a} → {b}" for a, bs in edges.items() if a.startswith("adtbench.models") for b in bs
                 if b.startswith("adtbench.algorithm"))  # fmt: skip
    assert not bad, bad
    assert layer("adtbench.models.base") < layer("adtbench.algorithm.sampling") < layer("adtbench.harness.job")


def test_no_import_cycles() -> None:
    assert not cycles(import_graph())


def test_package_reexports_are_followed(tmp_path: Path, monkeypatch) -> None:
    """A package whose ``__init__`` re-exports from a submodule that imports ``from <package> import ...`` is a
    cycle (the eval package's ``__init__`` ↔ ``metrics`` was one); importing the sibling module directly is not."""
    import test_architecture as arch

    pkg = tmp_path / "adtbench"
    (pkg / "p").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "p" / "__init__.py").write_text("from adtbench.p.m import run\n")
    (pkg / "p" / "a.py").write_text("X = 1\n")
    (pkg / "p" / "m.py").write_text("from adtbench.p import a\n\ndef run():\n    return a.X\n")
    (pkg / "user.py").write_text("from adtbench.p import run\n")
    monkeypatch.setattr(arch, "PKG", pkg)
    edges = arch.import_graph()
    assert edges["adtbench.user"] == {"adtbench.p", "adtbench.p.m"}  # the package and where `run` comes from
    assert arch.cycles(edges) == [["adtbench.p", "adtbench.p.m"]]
    (pkg / "p" / "m.py").write_text("import adtbench.p.a as a\n\ndef run():\n    return a.X\n")
    assert arch.cycles(arch.import_graph()) == []


def test_the_checks_catch_what_they_should() -> None:
    """Negative controls on synthetic graphs: an upward arrow and a two-module circle are reported."""
    assert upward(
        {"adtbench.algorithm.cost": {"adtbench.tools.bench"}, "adtbench.tools.bench": {"adtbench.algorithm.cost"}}
    ) == ["adtbench.algorithm.cost → adtbench.tools.bench"]
    assert cycles(
        {
            "adtbench.harness.eval.mini": {"adtbench.harness.eval.features"},
            "adtbench.harness.eval.features": {"adtbench.harness.eval.mini"},
        }
    ) == [["adtbench.harness.eval.features", "adtbench.harness.eval.mini"]]


def algorithm_violations(path: Path) -> list[str]:
    """Imports of Hydra / OmegaConf / file helpers / the harness, and file-touching calls, in one module."""
    out = []
    for node in ast.walk(parsed(path)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out += [f"imports {n}" for n in names if n.startswith(ALGORITHM_FORBIDDEN_IMPORTS)]
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in FILE_CALLS:
                out.append(f"calls {name}()")
    return out


def test_the_algorithm_folder_has_no_hydra_and_no_files() -> None:
    """``adtbench/algorithm`` is plain Python + torch: configs arrive as plain values, files through the harness."""
    bad = {
        str(p.relative_to(PKG)): v for p in sorted((PKG / "algorithm").rglob("*.py")) if (v := algorithm_violations(p))
    }
    assert not bad, bad


def test_the_algorithm_check_catches_what_it_should(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from omegaconf import OmegaConf\nimport numpy as np\nnp.save('x', 1)\n")
    assert algorithm_violations(src) == ["imports omegaconf", "calls save()"]


def test_every_engine_module_imports_first() -> None:
    """A user may import any module of ``adtbench.algorithm`` / ``models`` first (``from
    adtbench.algorithm.methods.jacobi.loop import decode_jacobi`` in a notebook): each is imported into a fresh
    ``adtbench`` namespace in turn. The AST check above sees module cycles but not a package ``__init__`` re-entering
    a module half-way (``slot`` → ``policies`` → ``policies.jacobi`` → ``jacobi`` → ``slot``: an ImportError when
    ``slot`` or ``jacobi`` came first)."""
    import importlib
    import sys

    names = sorted(m for m in modules() if m.startswith(("adtbench.algorithm", "adtbench.models")))
    saved = {k: v for k, v in sys.modules.items() if k == "adtbench" or k.startswith("adtbench.")}
    failed = {}
    try:
        for name in names:
            for k in [k for k in sys.modules if k == "adtbench" or k.startswith("adtbench.")]:
                del sys.modules[k]
            try:
                importlib.import_module(name)
            except ImportError as e:
                failed[name] = str(e)
    finally:
        for k in [k for k in sys.modules if k == "adtbench" or k.startswith("adtbench.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    assert names and not failed, failed


def _defined(p: Path) -> set[str]:
    """The names module file ``p`` defines at any level (functions, classes, assignments), not those it imports."""
    names: set[str] = set()
    for node in ast.walk(parsed(p)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {x.id for x in ast.walk(target) if isinstance(x, ast.Name)}
    return names


def test_every_name_is_imported_from_its_home() -> None:
    """One import home per name: ``from adtbench.m import n`` (in the package, the tests and the benchmarks) names the
    module that defines ``n`` — or a package whose ``__init__`` is its public face (``policies``, ``harness.eval``)
    — never a module that merely imported ``n`` itself (a second home: a move then leaves stale import paths working
    by accident, and the reader looks in the wrong file)."""
    mods = modules()
    root = PKG.parent
    files = [*PKG.rglob("*.py"), *(root / "tests").glob("*.py"), *(root / "benchmarks").glob("*.py")]
    defined: dict[str, set[str]] = {}
    bad = []
    for f in files:
        for node in ast.walk(parsed(f)):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("adtbench"):
                continue
            home = mods.get(node.module or "")
            if home is None or home.name == "__init__.py":
                continue
            if node.module not in defined:  # (``setdefault``'s argument would walk the home at every import)
                defined[node.module or ""] = _defined(home)
            names = defined[node.module or ""]
            bad += [
                f"{f.relative_to(root)}:{node.lineno}: {a.name} from {node.module}"
                for a in node.names
                if a.name not in names and f"{node.module}.{a.name}" not in mods
            ]
    assert not bad, "imported from a module that does not define it:\n" + "\n".join(bad)


GRAPH_MAKERS = {"capture", "CudaGraph", "StandInGraph"}  # ``accel_graphs``' ways to make a graph


def graph_makers(p: Path) -> list[str]:
    """The calls in ``p`` that make a graph through ``accel_graphs`` (``accel_graphs.capture(…)``, or a name
    imported from it)."""
    tree = parsed(p)
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and (n.module or "").endswith("accel_graphs") for a in n.names if a.name in GRAPH_MAKERS}  # fmt: skip
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "accel_graphs":
            if f.attr in GRAPH_MAKERS:
                out.append(f"accel_graphs.{f.attr}() at line {node.lineno}")
        elif isinstance(f, ast.Name) and f.id in imported:
            out.append(f"{f.id}() at line {node.lineno}")
    return out


def test_only_the_graph_runner_makes_graphs() -> None:
    """One graph runner (``graph_runner.GraphRunner``): the static buckets, the Jacobi step, the tree verify step,
    the drafting levels and the drafter's catch-up build on it; no other module captures a graph itself."""
    owners = {"adtbench.graph_runner", "adtbench.accel_graphs"}
    bad = {m: v for m, p in sorted(modules().items()) if m not in owners and (v := graph_makers(p))}
    assert not bad, bad
    assert graph_makers(PKG / "graph_runner.py")


def test_the_graph_maker_check_catches_what_it_should(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from adtbench import accel_graphs\nfrom adtbench.accel_graphs import capture as cap\n"
        "accel_graphs.capture(f, d)\ncap(f, d)\naccel_graphs.capturing()\n"
    )
    assert graph_makers(src) == ["accel_graphs.capture() at line 3", "cap() at line 4"]


def test_the_graphed_parts_are_graph_runners() -> None:
    """Each user of the runner is one (subclass): none keeps a graphs dict or a capture of its own."""
    from adtbench.algorithm.batch_step import BatchTreeStep
    from adtbench.algorithm.drafters.catch_up import CatchUp
    from adtbench.algorithm.drafters.graphed import LevelGraphs
    from adtbench.algorithm.methods.jacobi.step import JacobiStep
    from adtbench.algorithm.tree_step import TreeStep
    from adtbench.graph_runner import GraphRunner
    from adtbench.models.batch import StaticBatchVerify
    from adtbench.models.graphs import StaticDraft, StaticVerify

    for cls in (
        JacobiStep,
        TreeStep,
        LevelGraphs,
        CatchUp,
        StaticVerify,
        StaticDraft,
        StaticBatchVerify,
        BatchTreeStep,
    ):
        assert issubclass(cls, GraphRunner), cls
        own = {k for c in cls.__mro__[: cls.__mro__.index(GraphRunner)] for k in vars(c)}
        assert not own & {"replay_or_run", "capture", "buffer", "drop"}, (cls, own)
