"""analysis/main_table.ipynb runs headless (nbclient + ipykernel, the `notebook` / `dev` extras) on a synthetic
results tree given through its parameter cell's environment variables, in a kernel on this interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from test_plots import RUNS, make_tree

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "analysis" / "main_table.ipynb"


@pytest.mark.slow
def test_main_table_notebook_executes_headless(tmp_path, monkeypatch):
    """Run as ``jupyter execute analysis/main_table.ipynb`` runs it (the kernel in ``analysis/``), with relative
    results dirs: they are taken against the checkout (``paths.root_dir``; here ``$ADTBENCH_ROOT``), not
    ``analysis/``."""
    make_tree(tmp_path / "sweep")
    out = tmp_path / "tables"
    monkeypatch.setenv("ADTBENCH_ROOT", str(tmp_path))
    monkeypatch.setenv("ADTBENCH_SWEEP", "sweep")
    monkeypatch.setenv("ADTBENCH_TABLES", "tables")
    monkeypatch.setenv("ADTBENCH_N_BOOT", "50")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "ADTBENCH_SWEEP" in params[0].source
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))
    kernel_dir = {"metadata": {"path": str(NOTEBOOK.parent)}}  # what `jupyter execute` gives the kernel
    NotebookClient(nb, timeout=120, kernel_name="python3", resources=kernel_dir).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    exe = "".join(o.get("text", "") for o in nb.cells[-1].outputs).strip()
    assert Path(exe).resolve() == Path(sys.executable).resolve()  # the kernel runs on the venv's interpreter
    figures = ["acceptance_maps.png", "speedup.png", "speedup_vs_clip_score.png", "tau_vs_dbar.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(["main.csv", "main.md", "main.tex", *figures])
    table_cell = next(c for c in nb.cells if c.cell_type == "code" and 'render(table, "md")' in c.source)
    md = "".join(o.get("text", "") for o in table_cell.outputs)
    assert md.count("| mini ") == len(RUNS) and "†" in md  # one row per job; 3 prompts → caveat mark
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 4  # the figures displayed inline


@pytest.mark.slow
def test_main_table_notebook_stops_on_a_results_dir_without_runs(tmp_path, monkeypatch):
    from nbclient.exceptions import CellExecutionError

    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("ADTBENCH_ROOT", str(tmp_path))
    monkeypatch.setenv("ADTBENCH_SWEEP", "empty")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    with pytest.raises(CellExecutionError) as ei:
        client.execute()
    assert "FileNotFoundError" in str(ei.value) and f"{tmp_path / 'empty'} holds no run" in str(ei.value)
    assert not (tmp_path / "empty" / "tables").exists()  # nothing written
