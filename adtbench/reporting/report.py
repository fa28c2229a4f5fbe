"""One static HTML page of a sweep: ``adtbench report <sweep or run dirs>... --out DIR``.

    adtbench report <results dir>... --out DIR [--by model,policy] [--n-boot 1000] [--ci 0.95] [--seed 0]
                    [--digits 3] [--metric clip_score] [--no-plots]

writes ``DIR/index.html`` and ``DIR/assets/`` (the images, maps and plots it shows, copied or drawn there). The page
needs no server, no network and no script or style from elsewhere (inline CSS and JS): open it from disk, zip the
folder into a paper's supplement. Sections:

- **Leaderboard**: one row per setting — the groups and the numbers of ``adtbench table`` with the same options
  (:func:`~adtbench.reporting.load.load_tree`, :func:`~adtbench.reporting.tables.aggregate`, its row groups
  :func:`~adtbench.reporting.tables.run_groups` and its text :func:`~adtbench.reporting.tables.cells`: one reader,
  one aggregation, one formatting), plus the setting's model, policy, relaxation (LANTERN), drafter and sampling,
  whether it is lossless (the table's ``lossless`` column: what each run recorded, ``job.exactness`` of its policy and
  acceptance rule, derived the same way from its config for runs from before the flag), the device and the load (the
  highest ``load_peak`` of its runs over their ``cpu_count``).
  Clicking a header sorts by that column (numbers by value, the rest as text); a second click reverses.
- **Prompts**: per prompt, the image of every setting beside AR's for the same seed (AR: a run of ``policy=ar`` with
  the same resolved model, dataset, sampling and seed in the given dirs, :func:`conditions`; without one the page
  says so), and under each the
  acceptance heat map of that prompt (accepted length a + 1 per grid cell, drawn by
  :func:`adtbench.harness.maps.render_map` from the run's ``trace.jsonl``, with its colour bar; one colour scale
  across the settings of a prompt).
- **Plots** (the ``plots`` extra; without matplotlib the section says so), by :mod:`adtbench.reporting.plots` from
  the same table: speedup per setting with its CIs, speedup against each quality metric with the Pareto front, τ
  against d̄, and the accepted-length histogram per setting.
- **Provenance**: the git commit of the checkout that made the page, and per run the commits that wrote its samples
  (``run_config.json``'s provenance; "not recorded" for runs from before it), its command line (``python run.py`` +
  its recorded overrides), software and device, and its full config (collapsed ``<details>``).

A test hook: opened as ``index.html#selftest`` the page's script checks itself after load — every ``<img>`` decoded,
a click on the τ header sorts the rows — and writes the result as JSON into ``<pre id="selftest">`` (read by
``chromium --headless --dump-dom``; ``tests/test_report.py``); script errors are caught into the same element.
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adtbench.harness.maps import GridLayout, position_grids, render_map
from adtbench.harness.rundir import (
    read_override_list,
    read_provenance,
    read_run_config,
    read_run_maps,
    read_samples,
    read_summary,
    read_traces,
    safe_stem,
)
from adtbench.harness.rundir_write import map_file
from adtbench.io import atomic_write_text, save_png
from adtbench.reporting.load import load_tree
from adtbench.reporting.tables import (
    NOT_QUALITY,
    aggregate,
    caveat_note,
    cells,
    default_by,
    group_lossless,
    run_groups,
    table_notes,
)

SETTING_COLUMNS = ("model", "policy", "lantern", "drafter", "sampling")
"""What names a setting on the page (``lantern``: the relaxation), shown whether or not it varies."""
"""Value columns of the table that are no quality metric (no Pareto plot against them)."""
ASSETS = "assets"
PAGE = "index.html"


@dataclass
class Setting:
    """One leaderboard row: its key, label, runs, and what the page shows about it."""

    index: int
    key: dict[str, str]
    label: str
    run_dirs: list[Path]
    describe: dict[str, str]
    lossless: str  # ``yes`` / ``no`` / ``mixed`` / ``?``: the table's ``lossless`` cell (``tables.group_lossless``)
    device: str
    load: str
    samples: dict[str, tuple[Path, dict[str, Any]]] = field(default_factory=dict)  # prompt id → (run dir, record)
    conditions: str = ""  # :func:`conditions` of its first run: what its AR image must share


# ----------------------------------------------------------------------------------------------------
# data: the table reader's groups
# ----------------------------------------------------------------------------------------------------


def _common(values: Sequence[Any]) -> str:
    vals = list(dict.fromkeys("—" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v) for v in values))
    return vals[0] if len(vals) == 1 else " / ".join(vals)


def settings_of(runs: Any, by: Sequence[str]) -> list[Setting]:
    """The leaderboard's rows, one per :func:`run_groups` group (the table's row order)."""
    out = []
    for i, (key, grp) in enumerate(run_groups(runs, by)):
        keyd = {(c[3:] if c.startswith("ov.") else c): str(v) for c, v in zip(by, key)}
        describe = {c: _common(grp[c].tolist()) for c in SETTING_COLUMNS if c in grp}
        describe |= {k: v for k, v in keyd.items() if k not in describe}
        dirs = [Path(d) for d in grp["run_dir"]]
        lossless = group_lossless(grp["lossless"].tolist() if "lossless" in grp else [None])
        peak = max((float(v) for v in grp.get("load_peak", []) if v is not None and np.isfinite(v)), default=None)
        cpus = max((int(v) for v in grp.get("cpu_count", []) if v is not None and np.isfinite(v)), default=None)
        load = "—" if peak is None else f"{peak:.2f}" + (f" / {cpus} cores" if cpus else "")
        label = ", ".join(f"{k}={v}" for k, v in keyd.items())
        out.append(Setting(i, keyd, label, dirs, describe, lossless, _common(grp["device"].tolist()), load))
        out[-1].conditions = conditions(dirs[0])
    varying = [k for k in (out[0].key if out else {}) if len({s.key[k] for s in out}) > 1]
    for s in out:  # a label names what differs between the rows (all keys when nothing does)
        s.label = ", ".join(f"{k}={s.key[k]}" for k in varying) or s.label
    for s in out:
        for d in s.run_dirs:
            for rec in read_samples(d):
                s.samples.setdefault(str(rec["prompt_id"]), (d, rec))
    return out


def conditions(run_dir: Path) -> str:
    """What an image is conditioned on besides the method: the run's resolved ``model``, ``dataset`` (its shard
    dropped), ``sampling`` and ``seed`` nodes of ``run_config.json``, as canonical JSON. Two runs with equal
    conditions decode the same prompts with the same seeds from the same distribution — AR's image is comparable."""
    cfg = read_run_config(run_dir) or {}
    dataset = {k: v for k, v in (cfg.get("dataset") or {}).items() if k != "shard"}
    node = {"model": cfg.get("model"), "dataset": dataset, "sampling": cfg.get("sampling"), "seed": cfg.get("seed")}
    return json.dumps(node, sort_keys=True, default=str)


def ar_reference(settings: list[Setting], s: Setting) -> Setting | None:
    """The AR setting to show beside ``s`` (itself when it is AR): the first ``policy=ar`` setting whose runs have
    the same :func:`conditions` as ``s``'s — whatever the method's keys (policy, LANTERN, drafter) and however the
    sampling was spelled (an override equal to the default matches the default); None when the dirs hold none."""
    if s.describe.get("policy") == "ar":
        return s
    for cand in settings:
        if cand.describe.get("policy") == "ar" and cand.conditions == s.conditions:
            return cand
    return None


def grid_layout(run_dir: Path, stem: str, n_tokens: int | None) -> GridLayout | None:
    """The run's grid (for a prompt's trace): its maps sidecar's ``layout`` (``<stem>_maps.json``, else
    ``run_maps.json``); for runs written before the layout was recorded, inferred from ``run_maps.json``'s grid
    shape (h × w) and a sample's token count — h·w (raster), h·(w + 1) (an end-of-line slot per row), + 1 (an
    end-of-image token). None without maps."""
    doc = read_run_maps(run_dir)
    side = map_file(run_dir, stem, "maps")  # <stem>_maps.json is written beside the PNGs
    side = side.with_suffix(".json")
    if side.is_file():
        got = json.loads(side.read_text()).get("layout")
        if got:
            return GridLayout.from_doc(got)
    if doc is None:
        return None
    if doc.get("layout"):
        return GridLayout.from_doc(doc["layout"])
    grid = doc.get("accept") or []
    h, w = len(grid), len(grid[0]) if grid else 0
    if not h or not w:
        return None
    for row_len in (w, w + 1):
        for eoi in (False, True):
            if n_tokens == h * row_len + int(eoi):
                return GridLayout(h, w, row_len, eoi)
    return GridLayout(h, w, w, False)


# ----------------------------------------------------------------------------------------------------
# page
# ----------------------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1400px;
padding:0 1em;color:#222}
h1{font-size:1.5em}h2{margin-top:2em;border-bottom:1px solid #ccc}
table.lb{border-collapse:collapse;font-variant-numeric:tabular-nums}
table.lb th,table.lb td{border:1px solid #ddd;padding:3px 7px;text-align:left;white-space:nowrap}
table.lb td.num{text-align:right}
table.lb th{background:#f3f3f3;cursor:pointer;user-select:none}
table.lb th[aria-sort=ascending]::after{content:" ▲"}table.lb th[aria-sort=descending]::after{content:" ▼"}
.yes{color:#176a17}.no{color:#a33}
.prompt{margin:1.2em 0;padding:.6em;border:1px solid #e3e3e3;border-radius:6px}
.row{display:flex;flex-wrap:wrap;gap:10px;margin:.4em 0}
figure{margin:0;width:200px}figure img.sample{width:192px;height:192px;image-rendering:pixelated;
border:1px solid #bbb}figure img.map{width:200px}
figcaption{font-size:12px;word-break:break-word}figure.ar figcaption{font-weight:bold}
.plots img{max-width:100%;border:1px solid #eee;margin:.5em 0}
details{margin:.3em 0}pre{background:#f7f7f7;padding:.5em;overflow-x:auto;font-size:12px}
.note{color:#555;font-size:13px}
"""

JS = r"""
(function(){
  var out = document.getElementById('selftest');
  var errors = [];
  window.addEventListener('error', function(e){ errors.push(String(e.message || e)); });
  function key(td){ var v = td.getAttribute('data-v'); return v === null ? null : v; }
  function sortBy(th){
    var table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
    var num = th.getAttribute('data-type') === 'num';
    var dir = th.getAttribute('aria-sort') === 'ascending' ? -1 : 1;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function(c){ c.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', dir === 1 ? 'ascending' : 'descending');
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function(a, b){
      var x = key(a.cells[col]), y = key(b.cells[col]);
      if (num){
        x = x === '' || x === null ? NaN : parseFloat(x); y = y === '' || y === null ? NaN : parseFloat(y);
        if (isNaN(x) && isNaN(y)) return 0; if (isNaN(x)) return 1; if (isNaN(y)) return -1;
        return dir * (x - y);
      }
      return dir * String(x).localeCompare(String(y));
    });
    rows.forEach(function(r){ body.appendChild(r); });
  }
  document.querySelectorAll('table.lb th').forEach(function(th){
    th.addEventListener('click', function(){ sortBy(th); });
  });
  window.adtbenchSort = sortBy;
  if (location.hash !== '#selftest') return;
  window.addEventListener('load', function(){
    var res = {errors: errors, images: 0, broken: [], sorted: null};
    try {
      document.querySelectorAll('img').forEach(function(im){
        res.images += 1;
        if (!im.complete || im.naturalWidth === 0) res.broken.push(im.getAttribute('src'));
      });
      var th = document.querySelector('table.lb th[data-col="tau"]');
      if (th){
        sortBy(th);
        var vals = Array.prototype.map.call(document.querySelectorAll('table.lb tbody tr'), function(r){
          return parseFloat(r.cells[th.cellIndex].getAttribute('data-v'));
        }).filter(function(v){ return !isNaN(v); });
        var ok = true; for (var i = 1; i < vals.length; i++) if (vals[i] < vals[i-1]) ok = false;
        res.sorted = ok; res.tau = vals;
      }
    } catch (e) { res.errors.push(String(e)); }
    out.textContent = JSON.stringify(res);
  });
})();
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


class Assets:
    """The page's files under ``<out>/assets``: copies of run files and drawn pictures, named in order."""

    def __init__(self, out: Path) -> None:
        self.dir = out / ASSETS
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.n = 0

    def _name(self, stem: str) -> Path:
        self.n += 1
        return self.dir / f"{self.n:04d}_{safe_stem(stem)}.png"

    def copy(self, src: Path, stem: str) -> str:
        dst = self._name(stem)
        shutil.copyfile(src, dst)
        return f"{ASSETS}/{dst.name}"

    def picture(self, image: Any, stem: str, text: dict[str, str] | None = None) -> str:
        dst = save_png(image, self._name(stem), text)
        return f"{ASSETS}/{dst.name}"

    def path(self, stem: str) -> Path:
        return self._name(stem)


def _leaderboard(table: Any, settings: list[Setting], digits: int) -> str:
    text, n_keys, marked = cells(table, digits)
    raw_cols = [c for c in table.columns if not c.endswith(("_lo", "_hi"))]  # the columns ``cells`` shows, in order
    keys_shown = list(text.columns[:n_keys])
    extra = [c for c in SETTING_COLUMNS if c not in keys_shown]
    head = [f'<th data-type="text" data-col="{_e(c)}">{_e(c)}</th>' for c in keys_shown]
    head += [f'<th data-type="text" data-col="{_e(c)}">{_e(c)}</th>' for c in extra]
    for label, col in zip(text.columns[n_keys:], raw_cols[n_keys:]):
        head.append(f'<th data-type="num" data-col="{_e(col)}">{_e(label)}</th>')
    head.append('<th data-type="text">device</th>')
    head.append('<th data-type="num" data-col="load">load (peak)</th>')
    rows = []
    for i, s in enumerate(settings):
        tds = [  # the lossless cell coloured by its value (``yes`` / ``no``)
            f'<td{f" class={_e(v)}" if c == "lossless" else ""} data-v="{_e(v)}">{_e(v)}</td>'
            for c, v in zip(keys_shown, text.iloc[i, :n_keys])
        ]
        tds += [f'<td data-v="{_e(s.describe.get(c, "—"))}">{_e(s.describe.get(c, "—"))}</td>' for c in extra]
        for shown, col in zip(text.iloc[i, n_keys:], raw_cols[n_keys:]):
            v = table[col].iloc[i]
            num = "" if v is None or not np.isfinite(float(v)) else repr(float(v))
            tds.append(f'<td class="num" data-v="{num}">{_e(shown)}</td>')
        tds.append(f'<td data-v="{_e(s.device)}">{_e(s.device)}</td>')
        load = s.load.split(" ")[0]
        tds.append(f'<td class="num" data-v="{"" if load == "—" else load}">{_e(s.load)}</td>')
        rows.append(f'<tr id="setting-{s.index}">{"".join(tds)}</tr>')
    notes = ([caveat_note()] if marked else []) + table_notes(table)
    return (
        f'<table class="lb" id="leaderboard"><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>" + "".join(f"<p class=note>{_e(n)}</p>" for n in notes or [""])
    )


def _prompt_section(settings: list[Setting], assets: Assets, limit: int | None) -> tuple[str, int]:
    """Per prompt, AR's image and each setting's image + heat map; returns (HTML, maps drawn)."""
    order = list(dict.fromkeys(pid for s in settings for pid in s.samples))
    if limit is not None:
        order = order[:limit]
    refs = {s.index: ar_reference(settings, s) for s in settings}
    missing_ar = [s.label for s in settings if refs[s.index] is None]
    parts = []
    if missing_ar:
        parts.append(
            "<p class=note>No AR run (<code>policy=ar</code>) with the same model, dataset, sampling and seed in these "
            f"dirs for: {_e('; '.join(missing_ar))}. Add <code>policy=ar</code> to the sweep to see AR's images "
            "(same seeds) beside them.</p>"
        )
    drawn = 0
    traces: dict[Path, dict[str, dict[str, Any]]] = {}
    for pid in order:
        first = next(s.samples[pid][1] for s in settings if pid in s.samples)
        figs = []
        grids: list[tuple[Setting, np.ndarray | None]] = []
        for s in settings:
            if pid not in s.samples:
                continue
            run_dir, rec = s.samples[pid]
            if run_dir not in traces:
                traces[run_dir] = {str(t["prompt_id"]): t for t in read_traces(run_dir)}
            trace = traces[run_dir].get(pid)
            layout = grid_layout(run_dir, safe_stem(pid), len(rec.get("tokens") or []) or None)
            grid = None if trace is None or layout is None else position_grids(trace, layout)["accept"]
            grids.append((s, grid))
        finite = [g[np.isfinite(g)] for _, g in grids if g is not None and np.isfinite(g).any()]
        vrange = (float(min(f.min() for f in finite)), float(max(f.max() for f in finite))) if finite else None
        clusters: dict[int, list[tuple[Setting, np.ndarray | None]]] = {}  # AR setting → the settings beside it
        for s, grid in grids:
            ref = refs[s.index]
            clusters.setdefault(-1 if ref is None else ref.index, []).append((s, grid))
        for ref_index, members in clusters.items():
            ref = settings[ref_index] if ref_index >= 0 else None
            row = []
            if ref is not None and pid in ref.samples:
                row.append(_figure(assets, ref, pid, None, None, ar=True))
            for s, grid in members:
                if s is ref:
                    continue
                seed = None if ref is None or pid not in ref.samples else ref.samples[pid][1].get("seed")
                row.append(_figure(assets, s, pid, grid, vrange, ar=False, seed_of=seed))
                drawn += grid is not None
            figs.append(f'<div class="row">{"".join(row)}</div>')
        parts.append(
            f'<div class="prompt" id="prompt-{_e(safe_stem(pid))}"><h3>{_e(pid)}</h3>'
            f"<p>{_e(first.get('prompt', ''))} <span class=note>seed {_e(first.get('seed'))}</span></p>"
            f"{''.join(figs)}</div>"
        )
    return "".join(parts), drawn


def _figure(
    assets: Assets,
    s: Setting,
    pid: str,
    grid: np.ndarray | None,
    vrange: tuple[float, float] | None,
    ar: bool,
    seed_of: Any = None,
) -> str:
    run_dir, rec = s.samples[pid]
    img = rec.get("image")
    src = run_dir / img if img else None
    body = (
        f'<img class="sample" src="{assets.copy(src, f"{s.index}_{pid}")}" alt="{_e(s.label)}: {_e(pid)}">'
        if src is not None and src.is_file()
        else "<p class=note>no image saved (save_images=false)</p>"
    )
    cap = f"<b>AR</b> ({_e(s.label)})" if ar else _e(s.label)
    cap += (
        f"<br>τ {float(rec.get('tau') or float('nan')):.2f}, speedup {float(rec.get('speedup') or float('nan')):.2f}×"
    )
    if seed_of is not None and rec.get("seed") != seed_of:
        cap += f"<br><span class=no>seed {_e(rec.get('seed'))} ≠ {_e(seed_of)}</span>"
    if grid is not None and not ar:
        pic, text = render_map(grid, "accept", f"{pid}: accepted length", vrange=vrange)
        body += f'<img class="map" src="{assets.picture(pic, f"map_{s.index}_{pid}", text)}" alt="map">'
    return f'<figure class="{"ar" if ar else ""}">{body}<figcaption>{cap}</figcaption></figure>'


def _plots(table: Any, runs: Any, settings: list[Setting], by: Sequence[str], assets: Assets) -> str:
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return f"<p class=note>No plots: {_e(e)}. They need matplotlib: <code>pip install -e '.[plots]'</code>.</p>"
    from adtbench.reporting import plots

    out = []

    def add(draw: Any, stem: str, caption: str) -> None:
        path = assets.path(stem)
        try:
            draw(path)
        except ValueError as e:  # a figure with nothing to draw (e.g. no d̄): say so, keep the rest
            out.append(f"<p class=note>{_e(caption)}: {_e(e)}</p>")
            return
        out.append(f'<figure class="plot"><img src="{ASSETS}/{path.name}" alt="{_e(caption)}"></figure>')

    add(lambda p: plots.speedup_bars(table, p, by, runs), "speedup", "speedup by setting")
    metrics = [c for c in table.columns if f"{c}_lo" in table and c not in NOT_QUALITY]
    metrics = [m for m in metrics if table[m].notna().any()]
    for m in metrics:
        add(lambda p, m=m: plots.speedup_vs_quality(table, m, p, by, runs), f"pareto_{m}", f"speedup vs {m}")
    if not metrics:
        out.append(
            "<p class=note>No quality metric in these runs, so no speedup–quality Pareto plot "
            "(<code>adtbench eval &lt;dir&gt; eval=mini</code> adds one).</p>"
        )
    add(lambda p: plots.tau_vs_dbar(table, p, by, runs), "tau_vs_dbar", "τ vs d̄")
    lengths = {s.label: plots.accepted_lengths(s.run_dirs) for s in settings}
    add(lambda p: plots.accept_histogram(lengths, p), "accepted_lengths", "accepted-length histogram")
    return f'<div class="plots">{"".join(out)}</div>'


def _commit() -> str:
    """The commit of the checkout this package runs from (``provenance.code_version``; its reason outside one)."""
    from adtbench.harness.provenance import code_version

    return _code_text(code_version())


def _code_text(code: dict[str, Any]) -> str:
    """A provenance entry as text: its sha (``with uncommitted changes`` when dirty), else the version and reason."""
    if code.get("commit"):
        return str(code["commit"]) + (" (with uncommitted changes)" if code.get("dirty") else "")
    why = code.get("commit_reason") or code.get("reason") or "no commit recorded"
    return f"unknown ({why})" + (f", adtbench {code['version']}" if code.get("version") else "")


def _provenance(settings: list[Setting], argv: Sequence[str]) -> str:
    parts = [
        f"<p>Page made by <code>adtbench report {_e(' '.join(argv))}</code> at commit <code>{_e(_commit())}</code> "
        "(the checkout that made the page; each run's own commits are under it).</p>"
    ]
    for s in settings:
        for d in s.run_dirs:
            summ = read_summary(d)
            env = summ.get("env") or {}
            cmd = "python run.py " + " ".join(read_override_list(d))
            cfg = json.dumps(read_run_config(d) or {}, indent=2, sort_keys=True)
            envs = ", ".join(f"{k} {v}" for k, v in env.items() if v is not None)
            prov = read_provenance(d)
            commits = [_code_text(c) for c in (prov or {}).get("commits") or []] or ["not recorded (an older run)"]
            parts.append(
                f"<details><summary>{_e(s.label)} — <code>{_e(d)}</code></summary>"
                f"<p>samples written by commit(s) <code>{_e('; '.join(commits))}</code></p>"
                f"<p><code>{_e(cmd)}</code></p><p class=note>{_e(envs)}; load {_e(summ.get('load_before'))} → "
                f"{_e(summ.get('load_peak'))} (peak), {_e(summ.get('cpu_count'))} cores, threads "
                f"{_e(summ.get('threads'))}</p><pre>{_e(cfg)}</pre></details>"
            )
    return "".join(parts)


def build_report(
    roots: Sequence[str | Path],
    out: str | Path,
    by: Sequence[str] | None = None,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    digits: int = 3,
    plots: bool = True,
    max_prompts: int | None = None,
    argv: Sequence[str] = (),
) -> Path:
    """Write ``<out>/index.html`` and ``<out>/assets/`` for the runs under ``roots`` (module docstring); returns the
    page's path. ``by``, ``n_boot``, ``ci``, ``seed``, ``digits``: as ``adtbench table``'s options (the same
    defaults, so the numbers are the table's). Raises ``FileNotFoundError`` when no run is under ``roots``."""
    t0 = time.perf_counter()
    runs, samples = load_tree(list(roots))
    if len(runs) == 0:
        raise FileNotFoundError(f"no summary.json under {' '.join(map(str, roots))}")
    by = list(by) if by else default_by(runs)
    table = aggregate(runs, samples, by, None, n_boot, ci, seed)
    settings = settings_of(runs, by)
    out = Path(out)
    assets = Assets(out)
    board = _leaderboard(table, settings, digits)
    prompts, n_maps = _prompt_section(settings, assets, max_prompts)
    figs = _plots(table, runs, settings, by, assets) if plots else "<p class=note>--no-plots</p>"
    prov = _provenance(settings, argv)
    n_prompts = len({p for s in settings for p in s.samples})
    shared = {c: settings[0].describe[c] for c in SETTING_COLUMNS if c in settings[0].describe}
    shared = {c: v for c, v in shared.items() if all(s.describe.get(c) == v for s in settings)}
    title = f"adtbench report: {len(settings)} setting(s), {len(runs)} run(s), {n_prompts} prompt(s)"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title><style>{CSS}</style></head><body>
<h1>{_e(title)}</h1>
<p class=note>Shared by every setting: {_e(", ".join(f"{k}={v}" for k, v in shared.items()) or "—")}.
Values: point estimate [{100 * ci:.0f}% bootstrap CI over prompts, {n_boot} resamples, seed {seed}] — the numbers
of <code>adtbench table</code> with the same dirs and options. τ: tokens committed per cycle (bonus included);
d̄: drafter levels per cycle; speedup: Σ AR latency / Σ method latency, AR timed in the same job; A/A: Σ AR latency /
Σ AR latency, AR timed against itself in the same interleaving (<code>timing.aa=true</code>; — not measured, ! its
interval excludes 1), the speedup's noise floor.
Click a column header to sort.</p>
<nav><a href="#leaderboard-h">Leaderboard</a> · <a href="#prompts">Prompts</a> · <a href="#plots">Plots</a> ·
<a href="#provenance">Provenance</a></nav>
<h2 id="leaderboard-h">Leaderboard</h2>{board}
<h2 id="prompts">Prompts: each setting beside AR (same seed), with its acceptance map</h2>
<p class=note>Maps: accepted length a + 1 of the cycle that committed each grid cell (grey: no cycle, e.g. the
prefill's token); one colour scale per prompt.</p>{prompts}
<h2 id="plots">Plots</h2>{figs}
<h2 id="provenance">Provenance</h2>{prov}
<pre id="selftest"></pre>
<script>{JS}</script>
</body></html>
"""
    atomic_write_text(out / PAGE, page)
    print(
        f"adtbench report: {len(settings)} setting(s), {n_prompts} prompt(s), {n_maps} map(s), "
        f"{assets.n} asset(s) in {time.perf_counter() - t0:.1f} s -> {out / PAGE}"
    )
    return out / PAGE


def main(args: list[str]) -> int:
    """``adtbench report``: see the module docstring."""
    ap = argparse.ArgumentParser(prog="adtbench report", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="sweep dirs, run dirs, or any tree of them")
    ap.add_argument("--out", type=Path, required=True, help="the page's folder (index.html + assets/)")
    ap.add_argument("--by", default=None, help="comma-separated row keys (default: what varies, as adtbench table)")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--ci", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--max-prompts", type=int, default=None, help="show the first N prompts only")
    ap.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")
    ns = ap.parse_args(args)
    if not 0 < ns.ci < 1 or ns.n_boot < 1:
        print("adtbench report: need 0 < --ci < 1 and --n-boot >= 1", file=sys.stderr)
        return 2
    try:
        build_report(
            ns.roots,
            ns.out,
            ns.by.split(",") if ns.by else None,
            ns.n_boot,
            ns.ci,
            ns.seed,
            ns.digits,
            not ns.no_plots,
            ns.max_prompts,
            args,
        )
    except FileNotFoundError as e:
        print(f"adtbench report: {e}", file=sys.stderr)
        return 1
    except KeyError as e:
        print(f"adtbench report: {e.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
