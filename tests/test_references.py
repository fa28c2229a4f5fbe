"""Every reference resolves: what a reader is pointed at exists.

Checked:

- every Markdown link in README.md and docs/*.md: a URL, or a path (relative to the document) that exists in the
  repository, with its ``#anchor`` (if any) one of the target's headings (GitHub's slugs);
- every path named in a docstring (module, class, function; the package, analysis/, tests/, run.py) or in a yaml
  comment (conf/): each ``*.md`` name and each relative path with a folder part ending in .py / .md / .yaml /
  .yml / .ipynb / .sh. It resolves when it exists in the repository (next to the citing file, at the root, under
  adtbench/, conf/, docs/ or tests/, or — a bare name — as the name of a tracked file), when the code spells it
  as a string (a run-dir file such as ``.hydra/config.yaml``), or when README.md or docs/*.md name it verbatim:
  files outside the repository (upstream sources, checkpoint layouts, output files) are explained there, with
  their public source (docs/models.md §0, docs/evaluation.md).

CHANGELOG.md is history and is not checked. Parts of URLs are never paths.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTS = ("md", "py", "yaml", "yml", "ipynb", "sh")
# a relative path with a folder part (a/b.py, ../x/y.md) or a bare *.md name; never the inside of a URL or a longer
# path (no word character, slash, dot, colon or hyphen right before it)
PATH = re.compile(rf"(?<![\w/.:\-])((?:\.\.?/)?(?:[\w.\-]+/)+[\w.\-]+\.(?:{'|'.join(EXTS)})|[\w.\-]+\.md)(?![\w/\-])")
LINK = re.compile(r"(?<![\w\]])\[[^\]\n]*\]\(([^)\s]+)\)")
SEARCH = ("", "adtbench", "conf", "docs", "tests")


@cache
def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False).stdout
    files = out.split() if out else [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    return [f for f in files if not f.startswith((".venv/", "build/"))]


@cache
def docs_text() -> str:
    return "\n".join(p.read_text() for p in DOCS)


@cache
def code_strings() -> frozenset[str]:
    """Every string literal of the package (file names the code itself defines)."""
    out: set[str] = set()
    for p in (ROOT / "adtbench").rglob("*.py"):
        out |= {n.value for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant)
                and isinstance(n.value, str)}  # fmt: skip
    return frozenset(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces → hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*$", md.read_text(), re.M)}


def docstrings() -> Iterator[tuple[Path, str]]:
    files = [ROOT / "run.py", *sorted(p for d in ("adtbench", "analysis", "tests") for p in (ROOT / d).rglob("*.py"))]
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    yield p, doc


def yaml_comments() -> Iterator[tuple[Path, str]]:
    for p in sorted((ROOT / "conf").rglob("*.yaml")):
        for line in p.read_text().splitlines():
            if "#" in line:
                yield p, line.split("#", 1)[1]


def named_paths(text: str) -> list[str]:
    return [m.group(1) for m in PATH.finditer(text)]


def resolves(ref: str, where: Path) -> bool:
    """Whether the path ``ref`` named in ``where`` exists or is explained (module docstring)."""
    candidates = [where.parent / ref, *(ROOT / base / ref for base in SEARCH)]
    if any(c.exists() for c in candidates):
        return True
    if "/" not in ref and any(Path(f).name == ref for f in tracked()):
        return True
    return ref in code_strings() or ref in docs_text()


def link_problem(target: str, doc: Path) -> str | None:
    """What is wrong with a Markdown link ``target`` in ``doc`` (None: it resolves)."""
    if re.match(r"^[a-z][a-z0-9+.\-]*:", target):  # https:, mailto:, ...
        return None
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    if not dest.exists() or ROOT.resolve() not in (dest, *dest.parents):
        return "no such file in the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor} in {dest.relative_to(ROOT.resolve())}"
    return None


def test_every_markdown_link_resolves() -> None:
    bad = []
    for doc in DOCS:
        for m in LINK.finditer(doc.read_text()):
            problem = link_problem(m.group(1), doc)
            if problem:
                bad.append(f"{doc.relative_to(ROOT)}: ({m.group(1)}) {problem}")
    assert not bad, "\n".join(bad)


def test_every_path_in_docstrings_and_yaml_comments_resolves() -> None:
    bad = [
        f"{where.relative_to(ROOT)}: {ref}"
        for where, text in (*docstrings(), *yaml_comments())
        for ref in named_paths(text)
        if not resolves(ref, where)
    ]
    assert not bad, "dangling references (fix the name, or explain the file in docs/ with its source):\n" + "\n".join(
        sorted(set(bad))
    )


def test_the_checks_catch_what_they_should(tmp_path: Path) -> None:
    """Negative controls: a dangling doc name, a path outside the repo, a wrong anchor; URLs are not paths."""
    text = "spec: mulo_spec_v9.md §2, code https://github.com/a/b/blob/main/x/y.py, see ../shared/docs/z.md"
    assert named_paths(text) == ["mulo_spec_v9.md", "../shared/docs/z.md"]
    assert not resolves("mulo_spec_v9.md", ROOT / "adtbench" / "x.py")
    assert not resolves("drafters/build.py", ROOT / "conf" / "train" / "drafter.yaml")
    assert resolves("docs/architecture.md", ROOT / "README.md") and resolves("mulo_sd.md", ROOT / "adtbench" / "x.py")
    readme = ROOT / "README.md"
    assert link_problem("../shared/docs/mulo_sd.md", readme) == "no such file in the repository"
    assert link_problem("#no-such-heading", readme) and link_problem("https://example.org/x.md", readme) is None
    assert LINK.findall("E[committed](N) and [a](b.md)") == ["b.md"]  # math is not a link
    assert slug("Sampled drafts at T > 0") == "sampled-drafts-at-t--0"
