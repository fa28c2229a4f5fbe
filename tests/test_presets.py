"""One preset per paper (``conf/experiment/*``, docs/reproducing.md): each composes to the authors' setting and
decodes on tiny checkpoints in the real on-disk layouts, from the command line as a user runs it (the paths are the
user's: here the tiny folders). Greedy runs check the lossless presets against AR token for token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_in_process
from hydra import compose, initialize_config_dir

from adtbench.harness.config import register_resolvers
from adtbench.tools.make_tiny import write_tiny

ROOT = Path(__file__).resolve().parents[1]
register_resolvers()

# preset → (model family, needs the tiny drafter, the paper's keys as composed)
PRESETS: dict[str, tuple[str, bool, dict[str, object]]] = {
    "adt_tree_anole": ("anole", True, {"policy.name": "adt", "policy.budget": "fixed", "policy.N_max": 58,
                                       "policy.D0": 5, "policy.K0": 10, "lantern.enabled": True, "lantern.k": 100,
                                       "lantern.delta": 0.5, "drafter.path": "jadohu/anole_drafter",
                                       "dataset.kind": "coco"}),
    "lantern_anole": ("anole", True, {"policy.name": "eagle2", "policy.total_tokens": 59, "policy.depth": 4,
                                      "policy.top_k": 10, "lantern.enabled": True, "lantern.k": 1000,
                                      "lantern.delta": 0.1}),
    "eagle2_anole": ("anole", True, {"policy.name": "eagle2", "policy.total_tokens": 59, "lantern.enabled": False}),
    "sjd_lumina": ("lumina_mgpt", False, {"policy.name": "sjd", "policy.window": 16, "policy.init": "random",
                                          "policy.proposal": "point", "policy.redraw": "independent"}),
    "scd_lumina": ("lumina_mgpt", False, {"policy.name": "scd", "policy.window": 32, "policy.init": "random",
                                          "policy.proposal": "point", "policy.redraw": "coupled"}),
    "scd_gumbel_lumina": ("lumina_mgpt", False, {"policy.name": "scd", "policy.window": 32,
                                                 "policy.redraw": "gumbel", "policy.proposal": "point"}),
    "sjd_pac_lumina": ("lumina_mgpt", False, {"policy.name": "sjd_pac", "policy.window": 64, "policy.branch": 3,
                                              "policy.tree_depth": 3, "policy.variant": "exact",
                                              "policy.init": "random"}),
    "gsd_lumina": ("lumina_mgpt", False, {"policy.name": "gsd", "policy.window": 16, "policy.rule": "gsd",
                                          "policy.group_size": 14, "policy.group_gap": 0.15}),
    "sjd_emu3": ("emu3", False, {"policy.name": "sjd", "policy.window": 16, "policy.init": "random",
                                 "policy.proposal": "point", "policy.redraw": "independent",
                                 "sampling.top_k": 2048, "model.grid": [90, 90]}),
    "scd_janus_pro": ("janus_pro", False, {"policy.name": "scd", "policy.window": 16, "policy.init": "random",
                                           "policy.proposal": "point", "policy.redraw": "coupled",
                                           "sampling.top_k": 1000, "sampling.cfg_scale": 5.0,
                                           "model.path": "deepseek-community/Janus-Pro-7B"}),
}  # fmt: skip
COMMON = {"sampling.temperature": 1.0, "sampling.top_k": 2000, "sampling.cfg_scale": 3.0}


def test_every_preset_is_listed_here_and_in_the_docs() -> None:
    names = {p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")}
    papers = names - {"lossless_check", "mini_lantern", "mini_adt_lantern"}
    assert papers == set(PRESETS)
    doc = (ROOT / "docs" / "reproducing.md").read_text()
    assert all(f"`{name}`" in doc and f"experiment={name}" in doc for name in PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_composes_to_the_authors_setting(name: str) -> None:
    family, _, keys = PRESETS[name]
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=[f"experiment={name}"])
    assert cfg.model.name == family
    if family == "emu3":  # BAAI's CFG form: the negative prompt is the unconditional row
        assert cfg.model.negative_prompt.startswith("lowres, bad anatomy")
    for key, want in {**COMMON, **keys}.items():
        got = cfg
        for part in key.split("."):
            got = got[part]
        assert got == want, (name, key)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("presets")
    dirs = {fam: root / fam for fam in ("anole", "lumina_mgpt", "janus_pro")}
    write_tiny("janus_pro", dirs["janus_pro"], seed=0)  # no drafter: its preset's SCD drafts for itself
    dirs["emu3"] = root / "emu3"
    write_tiny("emu3", dirs["emu3"], seed=0)
    for fam in ("anole", "lumina_mgpt"):
        out = dirs[fam]
        write_tiny(fam, out, seed=0)
        dirs[f"{fam}_drafter"] = root / f"{fam}_drafter"  # LANTERN's published layout (pytorch_model.bin)
        write_tiny(f"{fam}_drafter", dirs[f"{fam}_drafter"], seed=0, target=out)
    return dirs


def run_preset(name: str, dirs: dict[str, Path], out: Path, *extra: str) -> dict:
    family, drafted, _ = PRESETS[name]
    argv = [
        f"experiment={name}", f"model.path={dirs[family]}", "dataset=inline", "dataset.text='a red cat on a mat'",
        "model.device=cpu", "model.dtype=float32", "warmup=0", "progress=false", "maps.per_run=false",
        f"hydra.run.dir={out}", *extra,
    ]  # fmt: skip
    if drafted:
        argv.append(f"drafter.path={dirs[family + '_drafter']}")
    proc = run_in_process(*argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_decodes_on_tiny_checkpoints(name: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    summary = run_preset(name, tiny_dirs, tmp_path / "run")
    assert summary["n_samples"] == 1 and summary["tau"] >= 1.0 and summary["policy"] == PRESETS[name][2]["policy.name"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_greedy_equals_ar(name: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Each preset at T = 0 in float64: the same tokens as AR (GSD's grouped test is exact there; LANTERN is not —
    greedy LANTERN accepts a draft near the argmax — so the LANTERN presets run at δ = 0, its exact limit)."""
    exact = ["lantern.delta=0"] if PRESETS[name][2].get("lantern.enabled") else []
    summary = run_preset(name, tiny_dirs, tmp_path / "run", "sampling.temperature=0", "model.dtype=float64", *exact)
    assert summary["greedy_matches_baseline"] is True
