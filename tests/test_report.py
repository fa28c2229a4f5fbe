"""``adtbench report``: on a real 2 × 2 sweep of the mini model (``policy=ar,gsd`` × ``sampling.temperature=1.0,0.7``,
4 prompts, made with the app's own command line) the page is one HTML file plus its images, written within 10 s of
CPU; it parses, every ``<img>`` it names exists, and its leaderboard shows exactly ``adtbench table``'s numbers for
the same dirs. In headless Chromium (where ``chromium`` is on PATH) it renders without a script error, sorts, and
every image decodes. Plus the pieces: the AR pairing, the grid layout of older runs, the lossless flag."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import run_in_process

from adtbench.harness.maps import GridLayout
from adtbench.reporting import report

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("ADTBENCH_SIMULATE_DEVICE", None)
    return subprocess.run([sys.executable, "-m", "adtbench.cli", *args], capture_output=True, text=True, env=full)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2 × 2 sweep, decoded once for the module (≈ 30 s on an idle 2-core CPU)."""
    tmp = tmp_path_factory.mktemp("report")
    out = tmp / "sweep"
    proc = run_in_process("-m", "policy=ar,gsd", "sampling.temperature=1.0,0.7", "warmup=0", "progress=false",
                          f"hydra.sweep.dir={out}", env={"ADTBENCH_ROOT": str(tmp)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def page(sweep: Path) -> tuple[Path, float, float]:
    """``adtbench report <sweep> --out <dir>`` as its own process: (page, wall s, CPU s of the process)."""
    out = sweep.parent / "page"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = cli("report", str(sweep), "--out", str(out))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"adtbench report: wall {wall:.1f} s, CPU {cpu:.1f} s, load {os.getloadavg()}: {proc.stdout.strip()}")
    return out / "index.html", wall, cpu


class Page(HTMLParser):
    """The parts of the page the tests read: every ``<img src>``, the leaderboard's headers and cell texts, the
    ``<pre id=selftest>`` text."""

    def __init__(self) -> None:
        super().__init__()
        self.imgs: list[str] = []
        self.headers: list[str] = []
        self.rows: list[list[str]] = []
        self.values: list[list[str | None]] = []
        self._in: str | None = None
        self._board = False
        self.selftest = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(str(a["src"]))
        elif tag == "table" and a.get("id") == "leaderboard":
            self._board = True
        elif self._board and tag == "tr" and a.get("id", "").startswith("setting-"):  # type: ignore[union-attr]
            self.rows.append([])
            self.values.append([])
        elif self._board and tag in ("th", "td"):
            self._in = tag
            if tag == "td":
                self.rows[-1].append("")
                self.values[-1].append(a.get("data-v"))
            else:
                self.headers.append("")
        elif tag == "pre" and a.get("id") == "selftest":
            self._in = "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._board = False
        if tag in ("th", "td", "pre"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "th":
            self.headers[-1] += data
        elif self._in == "td":
            self.rows[-1][-1] += data
        elif self._in == "pre":
            self.selftest += data


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


def markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    return cells[0], cells[2:]


@pytest.mark.slow
def test_one_page_with_its_images_within_10_s(page):
    path, wall, cpu = page
    files = [p for p in path.parent.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} == {".html", ".png"} and sum(p.suffix == ".html" for p in files) == 1
    p = parse(path)
    assert p.imgs and all((path.parent / src).is_file() for src in p.imgs)
    assert not any(src.startswith(("http:", "https:", "//", "/")) for src in p.imgs)  # nothing from elsewhere
    text = path.read_text()
    assert "<script src" not in text and "<link" not in text and "http://" not in text and "https://" not in text
    # 4 prompts × (2 AR + 2 GSD images + 2 maps) + 4 plots (speedup, τ vs d̄, histogram; no metric: no Pareto)
    assert len(p.imgs) == 4 * 6 + 3, p.imgs
    assert cpu <= 10.0, f"{cpu:.1f} s of CPU (wall {wall:.1f} s, load {os.getloadavg()})"


@pytest.mark.slow
def test_leaderboard_numbers_are_the_tables(sweep, page):
    path, _, _ = page
    table = cli("table", str(sweep))
    assert table.returncode == 0, table.stderr
    head, rows = markdown_table(table.stdout)
    p = parse(path)
    assert len(p.rows) == len(rows) == 4
    keys = head[: head.index("n")]
    page_rows = {tuple(r[p.headers.index(k)] for k in keys): r for r in p.rows}
    for row in rows:
        got = page_rows[tuple(row[: len(keys)])]
        for col, want in zip(head[len(keys) :], row[len(keys) :]):
            assert got[p.headers.index(col)] == want, (col, row[: len(keys)])
    lossless = {r[p.headers.index("policy")]: r[p.headers.index("lossless")] for r in p.rows}
    assert lossless == {"ar": "yes", "gsd": "no"}  # GSD's grouped acceptance is lossy
    csv = cli("table", str(sweep), "--format", "csv")
    import io

    import pandas as pd

    raw = pd.read_csv(io.StringIO(csv.stdout))
    tau = sorted(float(v[p.headers.index("τ")]) for v in p.values)  # type: ignore[arg-type]
    assert tau == sorted(raw["tau"].tolist())  # the sort keys are the table's full-precision numbers


@pytest.mark.slow
def test_each_setting_sits_beside_its_ar_with_the_same_seed(page):
    path, _, _ = page
    text = path.read_text()
    assert "No AR run" not in text  # both temperatures have their AR
    assert "≠" not in text  # no seed mismatch between a setting and its AR
    assert text.count('class="prompt"') == 4
    assert text.count("<b>AR</b>") == 4 * 2


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not on PATH (Debian: apt install chromium)")
def test_page_in_headless_chromium(page, tmp_path):
    """Rendered by Chromium from disk: no script error, the τ column sorts, every image decodes; a full-page
    screenshot is written (and is not blank)."""
    path, _, _ = page
    url = path.resolve().as_uri() + "#selftest"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000", "--window-size=1400,4000"]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    p = Page()
    p.feed(dom.stdout)
    result = json.loads(p.selftest)
    assert result["errors"] == [] and result["broken"] == [] and result["sorted"] is True, result
    assert result["images"] == len(parse(path).imgs)
    shot = tmp_path / "page.png"
    run = subprocess.run(["chromium", *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert run.returncode == 0 and shot.is_file()
    from PIL import Image

    assert len(Image.open(shot).convert("RGB").getcolors(1 << 20) or []) > 100  # images drawn, not a blank page


# ----------------------------------------------------------------------------------------------------------
# pieces (no sweep)
# ----------------------------------------------------------------------------------------------------------


def _setting(i: int, policy: str, temperature: float = 1.0, model: str = "mini") -> report.Setting:
    describe = {"model": model, "policy": policy}
    s = report.Setting(i, {"policy": policy}, policy, [], describe, None, "cpu", "—")
    s.conditions = json.dumps({"model": model, "sampling": {"temperature": temperature}, "seed": 0})
    return s


def test_ar_reference_is_the_ar_run_with_the_same_conditions(tmp_path):
    ar_hot, ar_cold, gsd_cold = _setting(0, "ar"), _setting(1, "ar", 0.7), _setting(2, "gsd", 0.7)
    settings = [ar_hot, ar_cold, gsd_cold]
    assert report.ar_reference(settings, gsd_cold) is ar_cold  # same temperature
    assert report.ar_reference(settings, ar_hot) is ar_hot
    lantern_chain = _setting(4, "chain")
    assert report.ar_reference([*settings, lantern_chain], lantern_chain) is ar_hot  # the method's keys do not count
    assert report.ar_reference(settings, _setting(3, "gsd", 0.7, "mini_lowres")) is None
    from adtbench.harness.rundir import RUN_CONFIG_FILE

    a, b = tmp_path / "a", tmp_path / "b"
    for d, shard, policy in ((a, "0/2", "ar"), (b, None, "gsd")):
        d.mkdir()
        cfg = {"model": {"name": "mini"}, "dataset": {"kind": "text", "shard": shard}, "sampling": {"temperature": 1.0},
               "seed": 0, "policy": {"name": policy}, "lantern": {"enabled": policy == "gsd"}}  # fmt: skip
        (d / RUN_CONFIG_FILE).write_text(json.dumps(cfg))
    assert report.conditions(a) == report.conditions(b)  # shard, policy and LANTERN aside, the same conditions


def test_grid_layout_of_a_run_without_a_recorded_layout(tmp_path):
    """Runs written before the sidecar held ``layout``: the grid from ``run_maps.json``, the end-of-line / end-of-image
    slots from a sample's token count."""
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "run_maps.json").write_text(json.dumps({"n_prompts": 1, "accept": [[1.0] * 4] * 3}))
    assert report.grid_layout(tmp_path, "p", 12) == GridLayout(3, 4, 4, False)
    assert report.grid_layout(tmp_path, "p", 15) == GridLayout(3, 4, 5, False)
    assert report.grid_layout(tmp_path, "p", 16) == GridLayout(3, 4, 5, True)
    doc = {"n_prompts": 1, "accept": [[1.0] * 4] * 3, "layout": {"grid_h": 3, "grid_w": 4, "row_len": 5, "eoi": True}}
    (tmp_path / "maps" / "run_maps.json").write_text(json.dumps(doc))
    assert report.grid_layout(tmp_path, "p", None) == GridLayout(3, 4, 5, True)
    assert report.grid_layout(tmp_path / "none", "p", 12) is None


@pytest.mark.parametrize(
    "policy, lantern, want",
    [("ar", False, True), ("gsd", False, False), ("scd", False, True), ("chain", True, False), ("chain", False, True),
     ("zipar", False, False)],
)  # fmt: skip
def test_lossless_flag_of_a_run_from_before_the_flag_is_derived_by_exactness(tmp_path, policy, lantern, want):
    """A run that recorded no ``lossless``: ``job.exactness`` of the policy the registry builds from its
    ``run_config.json`` and its rule (LANTERN at the config's default δ = 0.1: lossy); a recorded flag wins."""
    import yaml

    from adtbench.harness.records import Summary
    from adtbench.harness.rundir import RUN_CONFIG_FILE
    from adtbench.reporting.load import run_lossless

    node = yaml.safe_load((ROOT / "conf" / "policy" / f"{policy}.yaml").read_text())  # the group's defaults
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps({"policy": node, "lantern": {"enabled": lantern}}))
    flag, why = run_lossless(tmp_path)
    assert flag is want and why.startswith(f"policy={policy}") and "derived" in why
    assert run_lossless(tmp_path, Summary(lossless=not want, lossless_reason="recorded")) == (not want, "recorded")


def test_no_runs_is_exit_1_naming_the_dir(tmp_path):
    proc = cli("report", str(tmp_path), "--out", str(tmp_path / "page"))
    assert proc.returncode == 1 and "no summary.json under" in proc.stderr and str(tmp_path) in proc.stderr


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not on PATH")
def test_page_script_is_valid_javascript(tmp_path):
    """The inline script parses (``node --check``): a syntax error would stop sorting and the self-test."""
    js = tmp_path / "page.js"
    js.write_text(report.JS)
    proc = subprocess.run(["node", "--check", str(js)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


SHIM = r"""
// a minimal DOM: one leaderboard (header cells, body rows of data-v cells), enough for the page's script
function cell(v, i){ return {cellIndex: i, attrs: {'data-v': v},
  getAttribute(k){ return k in this.attrs ? this.attrs[k] : null; },
  setAttribute(k, v){ this.attrs[k] = v; }, removeAttribute(k){ delete this.attrs[k]; }}; }
const spec = JSON.parse(process.argv[2]);
const heads = spec.types.map((t, i) => { const c = cell(null, i); c.attrs = {'data-type': t}; return c; });
const body = {rows: spec.rows.map((r, j) => ({id: j, cells: r.map(cell)})),
  appendChild(r){ this.rows = this.rows.filter(x => x !== r).concat([r]); }};
const table = {tBodies: [body], tHead: {rows: [{cells: heads}]}};
heads.forEach(h => { h.closest = () => table; h.addEventListener = (e, f) => { h.click = f; }; });
global.window = {addEventListener(){}}; global.location = {hash: ''};
global.document = {getElementById(){ return {}; }, querySelectorAll(q){ return q === 'table.lb th' ? heads : []; }};
eval(require('fs').readFileSync(process.argv[3], 'utf8'));
const out = [];
for (const col of spec.clicks){ heads[col].click(); out.push(body.rows.map(r => r.id)); }
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not on PATH")
def test_header_click_sorts_numbers_by_value_and_text_alphabetically(tmp_path):
    """The page's sort, run by node on a stand-in DOM: numbers by value (missing last), a second click reverses,
    text alphabetically."""
    (tmp_path / "page.js").write_text(report.JS)
    (tmp_path / "shim.js").write_text(SHIM)
    spec = {
        "types": ["text", "num"],
        "rows": [["gsd", "2.5"], ["ar", "10"], ["scd", ""], ["adt", "1.25"]],
        "clicks": [1, 1, 0],
    }
    proc = subprocess.run(["node", str(tmp_path / "shim.js"), json.dumps(spec), str(tmp_path / "page.js")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    asc, desc, text = json.loads(proc.stdout)
    assert asc == [3, 0, 1, 2]  # 1.25 < 2.5 < 10 (not "10" < "2.5"), the missing value last
    assert desc == [1, 0, 3, 2]  # reversed; missing still last
    assert text == [3, 1, 0, 2]  # adt, ar, gsd, scd
