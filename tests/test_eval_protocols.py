"""The published protocols: P&R on Inception features (ADM suite, eval=adm), FID against precomputed statistics (ADM
``.npz``, torch-fidelity's cached ``.pt``) and ADM reference batches, KID and FD-DINOv2 from torch-fidelity, FID / P&R /
KID equal to torch-fidelity's own CLI on the same images, progress bars, and `adtbench eval` on an array's dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_eval import color_extractor, compose_cfg, make_run

from adtbench.errors import ConfigError
from adtbench.harness.eval import run_eval
from adtbench.harness.eval.fid import kernel_inception_distance, load_statistics

PROMPTS = {f"q-{i:02d}": f"prompt {i}" for i in range(12)}  # sorted ids = commit order = torch-fidelity's file order


def test_presets_use_the_adm_suite():
    """P&R defaults to Inception pool3 features (ADM's suite, k = 3), eval=adm runs FID, IS and P&R on them."""
    adm = compose_cfg("eval=adm").eval
    assert list(adm.metrics) == ["fid", "is", "prc"] and adm.prc.features == "inception" and adm.prc.k == 3
    assert compose_cfg("eval=prc").eval.prc.features == "inception"
    assert compose_cfg("eval=full").eval.prc.features == "inception"


def _set_cfg(tmp_path: Path, *extra: str):
    return compose_cfg("eval=adm", "eval.metrics=[fid,kid,prc]", "eval.preprocess.resolution=16",
                       f"eval.cache_dir={tmp_path / 'cache'}", "eval.kid.subsets=7", *extra)  # fmt: skip


def test_fid_from_precomputed_statistics_equals_fid_from_the_images(tmp_path):
    """An FID over an image folder writes the folder's statistics (.npz mu / sigma); FID against that file, against
    torch-fidelity's own cached statistics (.pt) and against an ADM-style .npz give the same number."""
    from torch_fidelity.metric_fid import fid_features_to_statistics
    from torch_fidelity.utils import torch_atomic_save

    run, ref = make_run(tmp_path / "run", PROMPTS), make_run(tmp_path / "ref", PROMPTS, seed=7)
    inject = {"extractor:inception": color_extractor([])}
    ev = run_eval(_set_cfg(tmp_path, f"eval.reference.dir={ref}"), run, inject=inject).eval
    from_images = ev["fid"]["value"]
    stats_file = Path(ev["fid"]["reference"]["stats_file"])
    assert stats_file.suffix == ".npz" and from_images > 0.0
    with np.load(stats_file) as z:
        assert sorted(z.files) == ["mu", "sigma"] and z["sigma"].dtype == np.float64
    ev2 = run_eval(_set_cfg(tmp_path, f"eval.reference.stats={stats_file}", "eval.metrics=[fid]"), run, inject=inject)
    assert ev2.eval["fid"]["value"] == pytest.approx(from_images, rel=1e-12, abs=1e-12)
    assert ev2.eval["fid"]["reference"]["stats"] == str(stats_file)
    # torch-fidelity's cache format: a torch-saved {"mu", "sigma"} of numpy arrays
    feats = torch.load(next((tmp_path / "cache" / "reference").glob("inception-*.pt")), weights_only=True)
    tf_file = tmp_path / "ref-inception-v3-compat-stat-fid-2048.pt"
    torch_atomic_save(fid_features_to_statistics(feats["features"].double()), str(tf_file))
    ev3 = run_eval(_set_cfg(tmp_path, f"eval.reference.stats={tf_file}", "eval.metrics=[fid]"), run, inject=inject)
    assert ev3.eval["fid"]["value"] == pytest.approx(from_images, rel=1e-12, abs=1e-12)
    # an ADM reference batch: images in arr_0, statistics in mu / sigma (float32 here; ADM's evaluator reads both)
    images = np.stack([np.asarray(__import__("PIL.Image").Image.open(ref / "images" / f"{p}.png").convert("RGB"))
                       for p in PROMPTS])  # fmt: skip
    with np.load(stats_file) as z:
        mu, sigma = z["mu"], z["sigma"]
    adm = tmp_path / "VIRTUAL_test.npz"
    np.savez(adm, arr_0=images, mu=mu, sigma=sigma)
    ev4 = run_eval(_set_cfg(tmp_path, f"eval.reference.dir={adm}"), run, inject=inject).eval
    assert ev4["fid"]["value"] == pytest.approx(from_images, rel=1e-9)  # arr_0's images = the folder's images
    assert ev4["precision"]["value"] == ev["precision"]["value"] and ev4["kid"]["value"] == pytest.approx(
        ev["kid"]["value"], rel=1e-9
    )
    assert ev4["fid"]["reference"]["format"].startswith("ADM reference batch")
    ev5 = run_eval(_set_cfg(tmp_path, f"eval.reference.stats={adm}", "eval.metrics=[fid]"), run, inject=inject)
    assert ev5.eval["fid"]["value"] == pytest.approx(from_images, rel=1e-9)


def test_bad_statistics_and_batches_are_one_line(tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, mu=np.zeros(3))
    with pytest.raises(ConfigError) as e:
        load_statistics(str(bad))
    assert e.value.key == "eval.reference.stats" and "sigma" in str(e.value)
    np.savez(bad, mu=np.zeros(3), sigma=np.zeros((2, 2)))
    with pytest.raises(ConfigError, match=r"not \[d\] and \[d, d\]"):
        load_statistics(str(bad))
    run = make_run(tmp_path / "run", PROMPTS)
    w = tmp_path / "weights-inception-test.pth"
    torch.save({}, w)
    with pytest.raises(ConfigError) as e:  # 3-d statistics against the 2048-d Inception: refused before decoding
        np.savez(bad, mu=np.zeros(3), sigma=np.eye(3))
        run_eval(compose_cfg("eval=fid", f"eval.weights.inception={w}", f"eval.reference.stats={bad}"), run)
    assert e.value.key == "eval.reference.stats" and "2048" in str(e.value)
    inject = {"extractor:inception": color_extractor([])}
    with pytest.raises(ConfigError) as e:  # a stats-only file is not an image batch
        np.savez(bad, mu=np.zeros(3), sigma=np.eye(3))
        run_eval(_set_cfg(tmp_path, f"eval.reference.dir={bad}"), run, inject=inject)
    assert e.value.key == "eval.reference.dir" and "arr_0" in str(e.value)


def test_kid_is_torch_fidelity_with_the_generated_set_first(tmp_path):
    from torch_fidelity.metric_kid import kid_features_to_metric

    g = torch.Generator().manual_seed(0)
    real, fake = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randn(30, 6, generator=g) + 0.2
    mean, std = kernel_inception_distance(real, fake, subsets=9, subset_size=20, seed=3)
    ref = kid_features_to_metric(fake.double(), real, kid_subsets=9, kid_subset_size=20, rng_seed=3, verbose=False)
    assert (mean, std) == (ref["kernel_inception_distance_mean"], ref["kernel_inception_distance_std"])
    far, _ = kernel_inception_distance(real, fake + 3.0, subsets=9, subset_size=20, seed=3)
    assert far > 10 * abs(mean)  # a larger mean shift: a larger MMD²
    run, ref_run = make_run(tmp_path / "run", PROMPTS), make_run(tmp_path / "ref", PROMPTS, seed=2)
    ev = run_eval(_set_cfg(tmp_path, f"eval.reference.dir={ref_run}"), run,
                  inject={"extractor:inception": color_extractor([])}).eval  # fmt: skip
    assert ev["kid"]["subset_size"] == 12 and ev["kid"]["subset_size_requested"] == 1000 and ev["kid"]["subsets"] == 7


def _random_inception(path: Path) -> Path:
    """torch-fidelity's Inception-v3 with random weights (its own init zeroes the batch-norm scales, so every image
    would get the same features), saved where its loader reads a weights file."""
    from unittest import mock

    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3 as Inception

    with mock.patch("torch.load", return_value={}), mock.patch.object(Inception, "load_state_dict", lambda s, sd: None):
        net = Inception("inception-v3-compat", ["2048", "logits_unbiased"], feature_extractor_weights_path="x")
    g = torch.Generator().manual_seed(0)
    sd = net.state_dict()
    for k, v in sd.items():  # He-initialised convolutions, unit batch norms: features that vary across images
        if k.endswith("running_var") or (v.is_floating_point() and v.ndim == 1 and k.endswith("weight")):
            v.fill_(1.0)
        elif v.is_floating_point() and v.ndim >= 2:
            v.copy_(torch.randn(v.shape, generator=g) * (2.0 / v[0].numel()) ** 0.5)
        elif v.is_floating_point():
            v.zero_()
    torch.save(sd, path)
    return path


@pytest.mark.slow
def test_fid_prc_kid_equal_torch_fidelity_cli(tmp_path):
    """The Inception protocol end to end: FID / P&R / KID of `run_eval` (eval=adm, native size) equal torch-fidelity's
    own command line (``fidelity --fid --prc --kid --feature-extractor inception-v3-compat``) on the same image folders
    and weights file. With ``ADTBENCH_INCEPTION_WEIGHTS`` = the real ``weights-inception-2015-12-05-6726825d.pth`` it
    runs on the published weights; otherwise on random weights of the same network (no download here)."""
    weights = os.environ.get("ADTBENCH_INCEPTION_WEIGHTS") or str(_random_inception(tmp_path / "inception-random.pth"))
    run, ref = make_run(tmp_path / "run", PROMPTS, size=32), make_run(tmp_path / "ref", PROMPTS, seed=3, size=32)
    cfg = compose_cfg("eval=adm", "eval.metrics=[fid,prc,kid]", "eval.preprocess.resolution=null", "eval.device=cpu",
                      f"eval.weights.inception={weights}", f"eval.reference.dir={ref}", "eval.kid.subsets=10",
                      f"eval.cache_dir={tmp_path / 'cache'}", "progress=false")  # fmt: skip
    ev = run_eval(cfg, run).eval
    cli = [sys.executable, "-m", "torch_fidelity.fidelity", "--cpu", "--json", "--silent", "--no-cache",
           "--no-samples-shuffle", "--fid", "--prc", "--kid", "--feature-extractor", "inception-v3-compat",
           "--feature-layer-fid", "2048", "--feature-layer-prc", "2048", "--feature-layer-kid", "2048",
           "--feature-extractor-weights-path", weights, "--kid-subsets", "10", "--kid-subset-size", str(len(PROMPTS)),
           "--input1", str(run / "images"), "--input2", str(ref / "images")]  # fmt: skip
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tf = json.loads(proc.stdout)
    print(f"ours: FID {ev['fid']['value']!r} P {ev['precision']['value']!r} R {ev['recall']['value']!r} "
          f"KID {ev['kid']['value']!r}; torch-fidelity CLI: {tf}")  # fmt: skip
    assert ev["fid"]["value"] > 1e-3  # not a degenerate case (torch-fidelity's own init gives FID 0)
    assert abs(ev["fid"]["value"] - tf["frechet_inception_distance"]) <= 1e-6
    n = len(PROMPTS)  # P&R are counts over n; torch-fidelity returns them as float32
    assert round(ev["precision"]["value"] * n) == round(tf["precision"] * n)
    assert round(ev["recall"]["value"] * n) == round(tf["recall"] * n)
    # torch-fidelity's KID runs in float32 on the features (ours in float64): equal up to float32 noise
    assert abs(ev["kid"]["value"] - tf["kernel_inception_distance_mean"]) <= 1e-5


def test_dinov2_extractor_is_torch_fidelity_forward():
    """FD-DINOv2's extractor is torch-fidelity's ``FeatureExtractorDinoV2`` forward around a locally built network:
    the same output as torch-fidelity's own class (its hub download replaced by the same tiny network)."""
    from unittest import mock

    import torch_fidelity.feature_extractor_dinov2 as tf_dino

    from adtbench.harness.eval.features import dinov2_extractor

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 16, stride=16), torch.nn.Flatten(), torch.nn.LazyLinear(5))
    net(torch.zeros(1, 3, 224, 224))
    with mock.patch.object(torch.hub, "load", lambda *a, **k: net):
        theirs = tf_dino.FeatureExtractorDinoV2("dinov2-vit-l-14", ["dinov2"])
    ours = dinov2_extractor(net)
    x = torch.randint(0, 256, (3, 3, 40, 40), dtype=torch.uint8)
    assert torch.equal(ours(x)[0], theirs(x)[0]) and ours(x)[0].shape == (3, 5)


def test_fd_dinov2_needs_its_local_hub_code(tmp_path):
    run = make_run(tmp_path / "run", PROMPTS)
    w = tmp_path / "dinov2_vitl14_pretrain.pth"
    torch.save({"x": torch.zeros(1)}, w)
    cfg = compose_cfg("eval=fd_dinov2", f"eval.weights.dinov2={w}", f"eval.dinov2.repo={tmp_path / 'nohub'}",
                      f"eval.reference.dir={run}")  # fmt: skip
    with pytest.raises(ConfigError) as e:
        run_eval(cfg, run)
    assert e.value.key == "eval.dinov2.repo" and "facebookresearch/dinov2" in str(e.value)


DINOV2_CACHE = Path(torch.hub.get_dir())


@pytest.mark.slow
@pytest.mark.skipif(
    not (DINOV2_CACHE / "facebookresearch_dinov2_main" / "hubconf.py").is_file()
    or not (DINOV2_CACHE / "checkpoints" / "dinov2_vitl14_pretrain.pth").is_file(),
    reason="needs the DINOv2 hub code and weights in torch hub's cache "
    "($TORCH_HOME/hub/facebookresearch_dinov2_main, checkpoints/dinov2_vitl14_pretrain.pth): an online machine",
)
def test_fd_dinov2_with_the_published_weights(tmp_path):
    run, ref = make_run(tmp_path / "run", PROMPTS, size=32), make_run(tmp_path / "ref", PROMPTS, seed=3, size=32)
    base = ["eval=fd_dinov2", f"eval.weights.dinov2={DINOV2_CACHE / 'checkpoints' / 'dinov2_vitl14_pretrain.pth'}",
            "eval.preprocess.resolution=null", "progress=false"]  # fmt: skip
    ev = run_eval(compose_cfg(*base, f"eval.reference.dir={ref}"), run).eval
    assert ev["fd_dinov2"]["value"] > 0.0 and ev["fd_dinov2"]["features"]["kind"] == "dinov2"
    assert abs(run_eval(compose_cfg(*base, f"eval.reference.dir={run}"), run).eval["fd_dinov2"]["value"]) < 1e-6


@pytest.mark.parametrize("progress", [True, False])
def test_progress_bars_follow_progress(tmp_path, capsys, progress):
    run = make_run(tmp_path / "run", PROMPTS)
    run_eval(_set_cfg(tmp_path, f"eval.reference.dir={run}", f"progress={str(progress).lower()}"), run,
             inject={"extractor:inception": color_extractor([])})  # fmt: skip
    err = capsys.readouterr().err
    assert ("inception features" in err) == progress


def _shard(path: Path, i: int, n: int, prompts: dict[str, str]) -> Path:
    make_run(path, prompts, seed=i)
    (path / "run_config.json").write_text(json.dumps({"dataset": {"shard": f"{i}/{n}"}}))
    return path


def test_adtbench_eval_on_an_array_dir_scores_the_merged_run(tmp_path, capsys):
    from adtbench.harness.eval import main

    arr = tmp_path / "arrays" / "123"
    items = list(PROMPTS.items())
    shards = [_shard(arr / f"shard_{i}_of_2", i, 2, dict(items[i::2])) for i in range(2)]
    loader = "eval.mini.loader=test_eval:_tiny_loader"
    assert main([str(arr), "eval=mini", loader]) == 2
    err = capsys.readouterr().err
    assert "merge first" in err and "adtbench merge" in err and len(err.strip().splitlines()) == 1
    merged = make_run(arr / "merged", PROMPTS)
    (merged / "merge.json").write_text(json.dumps({"sources": [{"dir": str(s), "shard": f"{i}/2"}
                                                               for i, s in enumerate(shards)]}))  # fmt: skip
    assert main([str(arr), "eval=mini", loader]) == 0
    out = capsys.readouterr().out
    assert out.count("adtbench eval:") == 1 and str(merged) in out
    assert not any((s / "eval.json").exists() for s in shards) and (merged / "eval.json").exists()
