"""Evaluation stage on tiny random models: exact checks of FID / IS / P&R on hand-made features, CLIP / HPS /
aesthetic with a tiny random open_clip loaded through the real config path, pairing by prompt id, missing
weights, the mini evaluator contract, GenEval / DPG exports, the `adtbench eval` command and the app hook."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_OVERRIDES, tiny_open_clip
from hydra import compose, initialize_config_dir
from PIL import Image

from adtbench.errors import ConfigError
from adtbench.harness.eval import EVAL_SAMPLES_FILE, run_eval
from adtbench.harness.eval.features import Extractor
from adtbench.harness.eval.fid import frechet_distance, inception_score
from adtbench.harness.eval.prc import precision_recall
from adtbench.harness.rundir_write import ResultStore

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = {"p-b": "a red cube", "p-a": "two blue spheres", "p-c": "a green cat on a sofa", "p-d": "an old clock"}


def compose_cfg(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=list(overrides))


def make_run(path: Path, prompts: dict[str, str] = PROMPTS, seed: int = 0, size: int = 8) -> Path:
    """A run dir with random images committed in dict order (deliberately not sorted by id)."""
    rng = np.random.default_rng(seed)
    store = ResultStore(path)
    for pid, text in prompts.items():
        img = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        store.commit({"prompt_id": pid, "prompt": text, "meta": {}}, None, img)
    store.write_summary({"n_samples": len(prompts), "model": "fake"})
    return path


def lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


# ----------------------------------------------------------------------------------------------------
# exact checks on hand-made features
# ----------------------------------------------------------------------------------------------------


def test_fid_of_identical_sets_is_zero():
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert abs(frechet_distance(x, x)) < 1e-8
    assert frechet_distance(x, x + 1.0) == pytest.approx(6.0, rel=1e-9)  # pure mean shift: ‖Δμ‖² = 6


def test_fid_known_gaussian_case():
    # A = {±a e1, ±b e2}: mean 0, covariance (ddof 1) diag(2a²/3, 2b²/3). B = c·A + m.
    a, b, c = 3.0, 1.5, 2.5
    m = torch.tensor([1.0, -2.0], dtype=torch.float64)
    A = torch.tensor([[a, 0], [-a, 0], [0, b], [0, -b]], dtype=torch.float64)
    B = c * A + m
    expected = float(m.square().sum()) + (1 - c) ** 2 * (2 * a * a / 3 + 2 * b * b / 3)
    assert frechet_distance(A, B) == pytest.approx(expected, rel=1e-9)


def test_fid_matches_an_independent_sqrtm_formula():
    from scipy import linalg

    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 4, generator=g, dtype=torch.float64) @ torch.randn(4, 4, generator=g, dtype=torch.float64)
    y = torch.randn(150, 4, generator=g, dtype=torch.float64) * 0.7 + 0.3
    mx, my = x.mean(0).numpy(), y.mean(0).numpy()
    sx, sy = np.cov(x.numpy(), rowvar=False), np.cov(y.numpy(), rowvar=False)
    ref = ((mx - my) ** 2).sum() + np.trace(sx + sy - 2 * linalg.sqrtm(sx @ sy).real)
    assert frechet_distance(x, y) == pytest.approx(ref, rel=1e-7)


def test_inception_score_exact_cases():
    eye = torch.eye(5, dtype=torch.float64) * 50.0  # near one-hot predictions, 5 classes evenly used
    mean, _ = inception_score(eye.repeat(4, 1), splits=1)
    assert mean == pytest.approx(5.0, rel=1e-6)
    mean, _ = inception_score(torch.zeros(20, 7), splits=2)  # identical predictions: IS = 1
    assert mean == pytest.approx(1.0, abs=1e-9)


def test_precision_recall_hand_made():
    real = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    # real 3-NN radii 3,2,2,3 → manifold [-3, 6]; 6 lies on the boundary and counts (≤)
    p, r = precision_recall(real, torch.tensor([[5.0], [7.0], [20.0], [6.0]]), k=3)
    assert (p, r) == (0.5, 1.0)
    # a tight fake cluster: fake manifold [-0.3, 0.6] covers only the real point 0
    p, r = precision_recall(real, torch.tensor([[0.0], [0.1], [0.2], [0.3]]), k=3)
    assert p == 1.0 and r == pytest.approx(0.25)


def test_precision_recall_matches_prdc():
    prdc = pytest.importorskip("prdc")
    rng = np.random.default_rng(3)
    real, fake = rng.normal(size=(60, 5)), rng.normal(0.4, 1.2, size=(50, 5))
    ref = prdc.compute_prdc(real, fake, nearest_k=3)
    p, r = precision_recall(torch.from_numpy(real), torch.from_numpy(fake), k=3)
    assert p == pytest.approx(ref["precision"]) and r == pytest.approx(ref["recall"])
    assert 0.0 < r < 1.0 and 0.0 < p < 1.0


# ----------------------------------------------------------------------------------------------------
# open_clip metrics with a tiny random model through the config path
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A tiny open_clip architecture (config json) and random weights saved to a file."""
    pytest.importorskip("open_clip")
    d = tmp_path_factory.mktemp("clip")
    tiny_open_clip(d, seed=0)
    mlp = {  # aesthetic MLP over the 16-d embedding, released key layout
        "layers.0.weight": torch.randn(32, 16), "layers.0.bias": torch.randn(32),
        "layers.2.weight": torch.randn(8, 32), "layers.2.bias": torch.randn(8),
        "layers.4.weight": torch.randn(6, 8), "layers.4.bias": torch.randn(6),
        "layers.6.weight": torch.randn(4, 6), "layers.6.bias": torch.randn(4),
        "layers.7.weight": torch.randn(1, 4), "layers.7.bias": torch.randn(1),
    }  # fmt: skip
    torch.save(mlp, d / "aesthetic.pth")
    return {"dir": d, "json": d / "adtbench-tiny-clip.json", "weights": d / "tiny_clip.pt", "mlp": d / "aesthetic.pth"}


def clip_overrides(t: dict, tmp: Path) -> list[str]:
    return [
        "eval.clip.model=adtbench-tiny-clip",
        f"eval.clip.pretrained={t['weights']}",
        f"eval.clip.model_config={t['json']}",
        "eval.clip.quick_gelu=false",
        "eval.device=cpu",
        f"eval.cache_dir={tmp / 'cache'}",
    ]


def test_clip_hps_aesthetic_on_tiny_open_clip_paired_by_prompt_id(tiny_clip, tmp_path):
    run = make_run(tmp_path / "run")
    cfg = compose_cfg(
        "eval=full",
        "eval.metrics=[clip,hps,aesthetic]",
        *clip_overrides(tiny_clip, tmp_path),
        "eval.hps.model=adtbench-tiny-clip",
        f"eval.hps.checkpoint={tiny_clip['weights']}",
        f"eval.hps.model_config={tiny_clip['json']}",
        f"eval.aesthetic.predictor={tiny_clip['mlp']}",
    )
    shared: dict = {}
    s = run_eval(cfg, run, shared=shared)
    ev = s.eval
    assert ev["complete"] and ev["n_images"] == 4 and s.model == "fake"  # the summary keeps its fields
    clip = ev["clip_score"]
    assert clip["n"] == 4 and -100.0 <= clip["value"] <= 100.0 and np.isfinite(clip["std"])
    assert clip["impl"] == "open_clip" and clip["version"] and "100·cos" in clip["scale"]
    assert clip["weights"]["sha256"] == hashlib.sha256(tiny_clip["weights"].read_bytes()).hexdigest()
    assert ev["hpsv21"]["hps_version"] == "v2.1" and -100 <= ev["hpsv21"]["value"] <= 100
    assert np.isfinite(ev["aesthetic"]["value"]) and ev["aesthetic"]["weights"]["path"] == str(tiny_clip["mlp"])
    assert ev["values"]["clip_score"] == clip["value"]
    per = {r["prompt_id"]: r for r in lines(run / EVAL_SAMPLES_FILE)}
    assert list(per) == list(PROMPTS) and all(set(r) >= {"clip_score", "hpsv21", "aesthetic"} for r in per.values())
    # pairing: each per-prompt score is cos(its own image, its own prompt) — recompute one directly
    bundle = next(v for k, v in shared.items() if isinstance(k, tuple) and k[0] == "open_clip")
    img = Image.open(run / "images" / "p-c.png").convert("RGB")
    direct = 100 * float(bundle.cosine([img], [PROMPTS["p-c"]], torch.device("cpu"))[0])
    assert per["p-c"]["clip_score"] == pytest.approx(direct, abs=1e-4)
    wrong = 100 * float(bundle.cosine([img], [PROMPTS["p-a"]], torch.device("cpu"))[0])
    assert per["p-c"]["clip_score"] != pytest.approx(wrong, abs=1e-4)
    assert json.loads((run / "eval.json").read_text())["values"] == ev["values"]


@pytest.mark.parametrize(
    "overrides,key,expected",
    [
        (["eval=clip"], "eval.clip.pretrained", "open_clip checkpoint"),
        (["eval=hps"], "eval.hps.checkpoint", "HPS_v2.1_compressed.pt"),
        (["eval=aesthetic"], "eval.aesthetic.predictor", "sac+logos+ava1-l14-linearMSE.pth"),
        (["eval=fid", "eval.reference.dir=/tmp"], "eval.weights.inception", "weights-inception-2015-12-05"),
        (["eval=prc", "eval.reference.dir=/tmp"], "eval.weights.inception", "weights-inception-2015-12-05"),
        (["eval=prc", "eval.prc.features=vgg16", "eval.reference.dir=/tmp"], "eval.weights.vgg16", "vgg16-397923af"),
        (["eval=clip", "eval.clip.pretrained=/nonexistent/clip.bin"], "eval.clip.pretrained", "/nonexistent/clip.bin"),
        (["eval=geneval"], "eval.geneval.metadata", "evaluation_metadata.jsonl"),
    ],
)
def test_missing_weights_name_the_key_and_the_file(tmp_path, overrides, key, expected):
    run = make_run(tmp_path / "run")
    with pytest.raises(ConfigError) as e:
        run_eval(compose_cfg(*overrides), run)
    assert e.value.key == key and expected in str(e.value)
    assert "eval" not in json.loads((run / "summary.json").read_text())  # failed before anything was written


# ----------------------------------------------------------------------------------------------------
# set metrics through run_eval with an injected extractor; the reference feature cache
# ----------------------------------------------------------------------------------------------------


def color_extractor(calls: list[int]) -> Extractor:
    """Features = per-channel mean and std of the image; logits = a fixed random projection of them."""
    proj = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))

    def fn(x: torch.Tensor) -> dict[str, torch.Tensor]:
        calls.append(len(x))
        f = x.float().flatten(2)
        feats = torch.cat([f.mean(-1), f.std(-1)], dim=1) / 255.0
        return {"features": feats, "logits": feats @ proj}

    return Extractor("inception", "test-color-features", fn, None, {"impl": "test"})


def test_fid_is_prc_against_itself_and_reference_cache(tmp_path):
    prompts = {f"q-{i:02d}": f"prompt {i}" for i in range(12)}
    run = make_run(tmp_path / "run", prompts)
    other = make_run(tmp_path / "other", prompts, seed=5)
    calls: list[int] = []
    inject = {"extractor:inception": color_extractor(calls)}
    base = ["eval=fid", "eval.metrics=[fid,is,prc]", "eval.prc.features=inception", "eval.preprocess.resolution=16",
            f"eval.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    s = run_eval(compose_cfg(*base, f"eval.reference.dir={run}"), run, inject=inject).eval
    assert abs(s["fid"]["value"]) < 1e-6 and s["precision"]["value"] == 1.0 and s["recall"]["value"] == 1.0
    assert s["fid"]["reference"]["n"] == 12 and s["fid"]["reference"]["cached"] is False
    assert s["is"]["value"] >= 1.0 and s["is"]["splits"] == 10 and s["is"]["n"] == 12
    assert s["precision"]["k"] == 3 and "torch-fidelity" in s["fid"]["impl"] and s["fid"]["version"]["torch-fidelity"]
    n_calls = len(calls)
    s2 = run_eval(compose_cfg(*base, f"eval.reference.dir={other}"), run, inject=inject).eval
    assert s2["fid"]["value"] > 0.0 and s2["fid"]["reference"]["cached"] is False
    s3 = run_eval(compose_cfg(*base, f"eval.reference.dir={other}"), run, inject=inject).eval
    assert s3["fid"]["reference"]["cached"] is True and s3["fid"]["value"] == pytest.approx(s2["fid"]["value"])
    assert len(calls) - n_calls == 3  # run 2: generated + reference (1 batch each); run 3: generated only


@pytest.mark.slow
def test_fid_is_prc_with_torch_fidelity_inception_from_a_local_file(tmp_path):
    """The real extractor path: torch-fidelity's Inception-v3 built from a weights file (random here)."""
    from unittest import mock

    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3 as Inception

    with mock.patch("torch.load", return_value={}), mock.patch.object(Inception, "load_state_dict", lambda s, sd: None):
        net = Inception("inception-v3-compat", ["2048", "logits_unbiased"], feature_extractor_weights_path="x")
    torch.manual_seed(0)
    weights = tmp_path / "weights-inception-random.pth"
    torch.save(net.state_dict(), weights)
    prompts = {f"q-{i}": f"prompt {i}" for i in range(4)}  # k=3 P&R needs 4 per set
    run, ref = make_run(tmp_path / "run", prompts, size=16), make_run(tmp_path / "ref", prompts, seed=4, size=16)
    cfg = compose_cfg("eval=fid", "eval.metrics=[fid,is,prc]", "eval.prc.features=inception",
                      f"eval.weights.inception={weights}", f"eval.reference.dir={ref}", "eval.preprocess.resolution=32",
                      f"eval.cache_dir={tmp_path / 'cache'}", "eval.is.splits=2")  # fmt: skip
    ev = run_eval(cfg, run).eval
    assert np.isfinite(ev["fid"]["value"]) and ev["fid"]["value"] >= 0.0 and ev["fid"]["n"] == 4
    assert ev["is"]["value"] >= 1.0 - 1e-9 and 0.0 <= ev["precision"]["value"] <= 1.0
    assert ev["fid"]["features"]["impl"] == "torch-fidelity inception-v3-compat"
    assert ev["fid"]["weights"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert ev["fid"]["reference"]["resize"] == "centre crop + lanczos" and ev["fid"]["reference"]["resolution"] == 32
    assert "rank-deficient" in ev["fid"]["note"]  # 4 images vs 2048 features: flagged


# ----------------------------------------------------------------------------------------------------
# the mini evaluator
# ----------------------------------------------------------------------------------------------------


class TinyMini(torch.nn.Module):
    """Stand-in with the mini evaluator API: uint8 [N, H, W, 3] in; ``score`` → list (None off-grammar)."""

    ident = "tiny-mini"

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 4)
        self.seen: list[tuple[tuple[int, ...], list[str]]] = []

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        assert images.dtype == torch.uint8 and images.shape[-1] == 3
        return self.proj(images.float().mean(dim=(1, 2)) / 255.0)

    @torch.no_grad()
    def score(self, images: torch.Tensor, prompts: list[str]) -> list[float | None]:
        self.seen.append((tuple(images.shape), list(prompts)))
        s = torch.sigmoid(self.features(images).sum(-1) + torch.tensor([len(p) / 10 for p in prompts]))
        return [None if "clock" in p else float(v) for p, v in zip(prompts, s)]  # "clock": off-grammar


def test_eval_mini_with_injected_stand_in(tmp_path):
    run = make_run(tmp_path / "run")
    ref = make_run(tmp_path / "ref", seed=9)
    mini = TinyMini()
    cfg = compose_cfg("eval=mini", f"eval.reference.dir={ref}", "eval.batch_size=3")
    ev = run_eval(cfg, run, inject={"mini": mini}).eval
    agr = ev["mini_agreement"]
    assert agr["n"] == 4 and agr["n_scored"] == 3 and 0.0 < agr["value"] < 1.0 and agr["ident"] == "tiny-mini"
    assert [s[0] for s in mini.seen] == [(3, 8, 8, 3), (1, 8, 8, 3)]
    assert [p for s in mini.seen for p in s[1]] == list(PROMPTS.values())  # prompts travel with their images
    per = {r["prompt_id"]: r for r in lines(run / EVAL_SAMPLES_FILE)}
    assert "mini_agreement" not in per.get("p-d", {}) and agr["value"] == pytest.approx(
        np.mean([per[k]["mini_agreement"] for k in ("p-a", "p-b", "p-c")])
    )
    assert "by_attribute" not in agr  # the stand-in has no attribute_hits
    assert np.isfinite(ev["mini_fid"]["value"]) and ev["mini_fid"]["value"] >= 0.0
    assert ev["mini_precision"]["k"] == 3 and 0.0 <= ev["mini_recall"]["value"] <= 1.0


def test_eval_mini_with_the_real_module(tmp_path):
    """The shipped mini evaluator on ground-truth scene renders: correct pairs agree more than shuffled ones.
    Module and weights are shipped: their absence is a packaging failure, not a skip."""
    from adtbench.models.mini import evaluator as mini_evaluator
    from adtbench.scenes import iter_split, render

    assert (Path(mini_evaluator.DEFAULT_PATH) / "model.safetensors").is_file(), "the shipped evaluator weights"
    scenes = [s for _, s in iter_split(7, "heldout", 8)]
    for name, caps in (
        ("good", [s.caption for s in scenes]),
        ("shuffled", [s.caption for s in scenes[1:] + scenes[:1]]),
    ):
        store = ResultStore(tmp_path / name)
        for i, (sc, cap) in enumerate(zip(scenes, caps)):
            store.commit({"prompt_id": f"m-{i}", "prompt": cap, "meta": {}}, None, render(sc, 32))
    good = run_eval(compose_cfg("eval=mini"), tmp_path / "good").eval["mini_agreement"]
    bad = run_eval(compose_cfg("eval=mini"), tmp_path / "shuffled").eval["mini_agreement"]
    assert good["n_scored"] == 8 and 0.0 <= bad["value"] < good["value"] <= 1.0
    assert good["weights"]["sha256"]
    # per attribute: every scene states its background; the mean over attribute hits is the agreement
    by = good["by_attribute"]
    assert (
        by["bg_kind"]["n"] == by["bg_color"]["n"] == 8
        and by["bg_color"]["value"] > bad["by_attribute"]["bg_color"]["value"]
    )
    assert sum(b["value"] * b["n"] for b in by.values()) / sum(b["n"] for b in by.values()) <= 1.0


# ----------------------------------------------------------------------------------------------------
# exports, the command, the app hook
# ----------------------------------------------------------------------------------------------------


def test_geneval_and_dpg_exports(tmp_path):
    run = make_run(tmp_path / "run")
    seed2 = make_run(tmp_path / "seed2", seed=3)
    order = ["an old clock", "a red cube", "two blue spheres", "a green cat on a sofa", "unused prompt"]
    meta = tmp_path / "evaluation_metadata.jsonl"
    meta.write_text("".join(json.dumps({"tag": "single_object", "prompt": p, "include": []}) + "\n" for p in order))
    pdir = tmp_path / "dpg_prompts"
    pdir.mkdir()
    for i, p in enumerate(reversed(list(PROMPTS.values()))):
        (pdir / f"item{i}.txt").write_text(p + "\n")
    cfg = compose_cfg("eval=geneval", "eval.metrics=[geneval,dpg]", f"eval.geneval.metadata={meta}",
                      f"eval.geneval.extra_runs=[{seed2}]", f"eval.dpg.prompts_dir={pdir}", "eval.dpg.resolution=16",
                      f"eval.dpg.extra_runs=[{seed2}]")  # fmt: skip
    ev = run_eval(cfg, run).eval
    g = Path(ev["geneval"]["path"])
    assert sorted(p.name for p in g.iterdir() if p.is_dir()) == ["00000", "00001", "00002", "00003"]
    assert json.loads((g / "00002" / "metadata.jsonl").read_text())["prompt"] == "two blue spheres"
    assert (g / "00002" / "samples" / "0000.png").read_bytes() == (run / "images" / "p-a.png").read_bytes()
    assert (g / "00002" / "samples" / "0001.png").read_bytes() == (seed2 / "images" / "p-a.png").read_bytes()
    d = Path(ev["dpg"]["path"])
    assert sorted(p.name for p in d.iterdir()) == [f"item{i}.png" for i in range(4)]
    assert Image.open(d / "item3.png").size == (32, 32) and ev["dpg"]["pic_num"] == 2
    assert "--pic-num 2" in ev["dpg"]["command"]


def test_adtbench_eval_command_on_a_tree(tmp_path, capsys):
    from adtbench.harness.eval import main

    make_run(tmp_path / "sweep" / "0_a")
    make_run(tmp_path / "sweep" / "1_b", seed=1)
    rc = main([str(tmp_path / "sweep"), "eval=mini", f"eval.mini.loader={__name__}:_tiny_loader"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.out.count("adtbench eval: mini_agreement=") == 2
    for job in ("0_a", "1_b"):
        assert "mini_agreement" in json.loads((tmp_path / "sweep" / job / "summary.json").read_text())["eval"]
    assert main([str(tmp_path / "sweep"), "eval=none"]) == 2
    assert main([str(tmp_path / "sweep"), "eval=clip"]) == 2 and "eval.clip.pretrained" in capsys.readouterr().err


def test_cli_dispatches_eval():
    """``adtbench eval`` reaches the eval command (a missing entry is this test's failure, not a skip)."""
    import importlib

    from adtbench.cli import SUBCOMMANDS

    assert SUBCOMMANDS.get("eval") == "adtbench.harness.eval"
    assert callable(importlib.import_module(SUBCOMMANDS["eval"]).main)


def _tiny_loader() -> TinyMini:
    """``eval.mini.loader`` target for the command test (a module-level function, as the real loader)."""
    torch.manual_seed(0)
    return TinyMini()


def test_app_runs_eval_after_decoding(tiny_clip, tmp_path):
    from adtbench.harness.app import run

    cfg = compose_cfg(*TINY_OVERRIDES, "dataset.limit=2",
                      "warmup=0", "progress=false", "maps.per_run=false", "eval=clip",
                      *clip_overrides(tiny_clip, tmp_path))  # fmt: skip
    s = run(cfg, tmp_path / "job", {"model": "tiny_llamagen", "policy": "eagle2"})
    assert s["n_samples"] == 2 and s["eval"]["clip_score"]["n"] == 2
    disk = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert disk["eval"]["values"]["clip_score"] == pytest.approx(s["eval"]["values"]["clip_score"])
    assert disk["tau"] == s["tau"]


@pytest.mark.parametrize(("cli", "mode"), [([], "online"), (["logger.mode=offline"], "offline")])
def test_adtbench_eval_tracker_mode_env_vs_command_line(tmp_path, monkeypatch, cli, mode):
    """`adtbench eval ... logger=wandb`: WANDB_MODE wins over the config unless logger.mode is on the command line;
    the evaluation logs into the evaluated run's W&B run (its stable id; a hand-made run without a policy or a
    decode entry in tracking.json: job type "decode"), resumed online, a whole offline attempt offline."""
    import sys
    import types

    from adtbench.harness.eval import main
    from adtbench.harness.tracking import stable_run_id

    inits: list[dict] = []

    class Run:
        id, dir, summary = "x", "", {}

        def log(self, *a, **kw): ...

        def finish(self): ...

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: inits.append(kw) or Run()
    fake.Settings = lambda **kw: kw
    fake.Image = fake.Table = lambda *a, **kw: None
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "online")
    run = make_run(tmp_path / "run")
    assert main([str(run), "eval=mini", f"eval.mini.loader={__name__}:_tiny_loader", "logger=wandb", *cli]) == 0
    (kw,) = inits
    assert kw["mode"] == mode and kw["job_type"] == "decode" and kw["resume"] == ("allow" if mode == "online" else None)
    assert kw["id"] == stable_run_id(run, "decode")
    entry = json.loads((run / "tracking.json").read_text())["runs"][0]
    assert entry["mode_source"] == ("cli" if cli else "env")


# ----------------------------------------------------------------------------------------------------
# set metrics go through torch-fidelity's own functions
# ----------------------------------------------------------------------------------------------------


def test_set_metrics_call_torch_fidelity(monkeypatch):
    """P&R, FID and IS are torch-fidelity's feature-level functions (the extractor stays ours / injectable)."""
    import torch_fidelity.metric_fid as tf_fid
    import torch_fidelity.metric_isc as tf_isc
    import torch_fidelity.metric_prc as tf_prc

    calls: list[str] = []
    for mod, name in ((tf_prc, "prc_features_to_metric"), (tf_fid, "fid_statistics_to_metric"),
                      (tf_isc, "isc_features_to_metric")):  # fmt: skip
        real_fn = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _f=real_fn, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    g = torch.Generator().manual_seed(0)
    real, fake = torch.randn(30, 5, generator=g), torch.randn(25, 5, generator=g) + 0.3
    p, r = precision_recall(real, fake, k=3)
    ref = tf_prc.calculate_precision_recall_full(fake.double(), real.double(), 3)  # generated first, as in tf
    assert (p, r) == ref
    assert frechet_distance(real, fake) > 0.0
    inception_score(torch.randn(12, 6, generator=g), splits=3)
    assert calls == ["prc_features_to_metric", "fid_statistics_to_metric", "isc_features_to_metric"]


def test_inception_score_split_convention():
    """IS = torch-fidelity's isc: rows permuted by numpy RandomState(seed), split i = rows [i·N//s, (i+1)·N//s),
    per split exp(mean_x KL(p(y|x) ‖ mean p(y) of the split)), then the mean and the population std (ddof 0)."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(10, 4, generator=g, dtype=torch.float64) * 3
    x = logits.numpy()[np.random.RandomState(7).permutation(10)]
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    scores = []
    for i in range(3):  # 10 rows in 3 splits: 3, 3, 4
        c = p[i * 10 // 3 : (i + 1) * 10 // 3]
        scores.append(np.exp((c * (np.log(c) - np.log(c.mean(0, keepdims=True)))).sum(1).mean()))
    mean, std = inception_score(logits, splits=3, seed=7)
    assert mean == pytest.approx(np.mean(scores), rel=1e-12) and std == pytest.approx(np.std(scores), rel=1e-12)
    mean, std = inception_score(logits, splits=20, seed=7)  # more splits than rows: one row per split
    assert mean == pytest.approx(1.0) and std == pytest.approx(0.0, abs=1e-12)


def test_mini_fid_notes_rank_deficient_covariance(tmp_path):
    three = dict(list(PROMPTS.items())[:3])
    run, ref = make_run(tmp_path / "run", three), make_run(tmp_path / "ref", three, seed=9)
    ev = run_eval(compose_cfg("eval=mini", f"eval.reference.dir={ref}"), run, inject={"mini": TinyMini()}).eval
    assert "rank-deficient" in ev["mini_fid"]["note"] and "n=3 < feature dim 4" in ev["mini_fid"]["note"]
    assert "torch-fidelity" in ev["mini_fid"]["impl"]
