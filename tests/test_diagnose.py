"""``analysis/diagnose.py``: invariants of every measurement on small samples (shipped mini weights)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from adtbench import scenes as S
from analysis import diagnose as D


@pytest.fixture(scope="module")
def vq():
    torch.set_num_threads(1)
    return D.load_vq_model()


@pytest.fixture(scope="module")
def held():
    sc = D.scene_set("heldout", 4)
    return sc, S.render_batch(sc, 64)


def test_codebook_usage_counts_sum_to_tokens(vq, held) -> None:
    _sc, images = held
    codes, mse = D.reconstruction(vq, images)
    assert codes.shape == (4, 16, 16) and mse.shape == (4,)
    assert (mse >= 0).all() and 5 < D.psnr_db(float(mse.mean())) < 60
    u = D.codebook_usage(codes)
    assert sum(u["counts"]) == u["tokens"] == 4 * 256
    assert 1 <= u["codes_used"] <= min(512, 4 * 256)
    assert 1.0 <= u["perplexity"] <= u["codes_used"] + 1e-6
    # the diagnosis encodes exactly like the training pipeline's encoder call
    np.testing.assert_array_equal(codes, D.encode_images(vq, images))


def test_flat_colour_maps_to_a_small_known_set(vq) -> None:
    res = D.flat_image_codes(vq, {"red": S.COLORS["red"], "blue": S.COLORS["blue"]})
    for d in res.values():
        assert 1 <= d["interior_distinct"] <= d["distinct"] == len(d["codes"]) <= 32  # 256 tokens, few codes
        assert 1 / d["distinct"] <= d["majority_share"] <= 1
    again = D.flat_image_codes(vq, {"red": S.COLORS["red"]})
    assert again["red"]["codes"] == res["red"]["codes"]  # deterministic
    near = D.near_colour_codes(vq, {"red": S.COLORS["red"]})
    assert near["red"]["distinct"] >= 1 and 0 <= near["red"]["changed"] <= 26


def test_flat_patches_on_a_plain_scene(vq) -> None:
    s = next(s for _, s in S.iter_split(0, "heldout", 50) if s.bg_kind == "plain")
    img = S.render_batch([s], 64)
    codes = D.encode_images(vq, img)
    res = D.flat_patch_codes(img, codes, D.FLAT_COLOURS)
    bg = res[s.bg_color]
    assert bg["patches"] >= 100  # most of a plain scene is uniform background
    assert 0 <= bg["H"] <= math.log(bg["distinct"]) + 1e-9
    assert bg["isolated"] <= bg["patches"] and 0 <= res["_overall"]["isolated_p_same_left"] <= 1


def test_position_types_partition() -> None:
    rng = np.random.default_rng(0)
    grids = rng.integers(0, 3, size=(3, 16, 16))
    sc = D.scene_set("heldout", 3)
    t = D.position_types(grids, sc)
    assert all(m.shape == (3, 256) for m in t.values())
    np.testing.assert_array_equal(t["same_left"] ^ t["diff_left"] ^ t["first_col"], np.ones((3, 256), bool))
    assert not (t["same_left"] & t["diff_left"]).any()
    parts = t["object_interior"].astype(int) + t["object_edge"] + t["background"]
    assert (parts == 1).all()
    assert sum(t[f"bg_{k}"].sum() for k in S.BG_KINDS) == t["background"].sum()
    # one first object token per image (every scene has an object), on an object's top edge
    assert (t["object_first"].sum(1) == 1).all() and not (t["object_first"] & ~t["object_top"]).any()
    assert not (t["object_top"] & t["background"]).any()


def test_linear_probe_reads_a_planted_signal_and_not_noise() -> None:
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 4, (400,), generator=g)
    x = torch.randn(400, 8, generator=g)
    signal = x.clone()
    signal[:, 0] += 4 * y.float()
    assert D.linear_probe(signal[:300], y[:300], signal[300:], y[300:], 4) > 0.9
    assert D.linear_probe(x[:300], y[:300], x[300:], y[300:], 4) < 0.45


def test_conditional_entropy_below_marginal() -> None:
    rng = np.random.default_rng(1)
    # rows of mostly repeated codes: x is predictable from its left neighbour
    base = rng.integers(0, 40, size=(60, 16, 1))
    grids = np.where(rng.random((60, 16, 16)) < 0.8, base, rng.integers(0, 40, size=(60, 16, 16)))
    f = D.context_features(grids)
    x = grids.reshape(60, -1)
    tr, he = slice(0, 50), slice(50, 60)
    ftr, fhe = ({k: v[s] for k, v in f.items()} for s in (tr, he))
    probs = D.backoff_probs(x[tr], ftr, x[he], fhe, [0.0] + [4.0] * (len(D.LEVELS) - 1))
    assert len(probs) == len(D.LEVELS)
    for p in probs:
        assert p.shape == x[he].shape and ((p > 0) & (p <= 1)).all()
    ce = [float(-np.log(p).mean()) for p in probs]
    assert ce[1] < ce[0] - 0.5  # left context helps a lot here
    # each level is a normalised distribution over the 512 codes for a fixed context
    ctx = {k: np.full((1, D.V), v[50, 37]) for k, v in f.items()}
    for p in D.backoff_probs(x[tr], ftr, np.arange(D.V)[None], ctx, [0.0] + [4.0] * (len(D.LEVELS) - 1)):
        assert abs(p.sum() - 1.0) < 1e-9
    h = [D.plugin_entropy(x, f, names) for _, names in D.LEVELS]
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(h))  # plug-in: more context never raises H


def test_data_coverage_small() -> None:
    res = D.data_diagnosis(train_count=300, heldout_n=40)
    g = res["grammar"]
    assert res["train_distinct_captions"] <= min(300, g["captions"])
    assert g["combos"] < g["captions"] and 0 < g["caption_entropy"] <= math.log(g["captions"])
    assert res["heldout_caption_in_train"] == 0.0  # split by caption: disjoint
    assert 0 <= res["heldout_combo_in_train"] <= 1 and res["heldout_part_in_train"]["bg"] <= 1
    assert set(res["word_counts"]) <= set(S.VOCAB)


def test_ar_and_drafter_stats_ranges(vq, held) -> None:
    sc, images = held
    grids = D.encode_images(vq, images[:2])
    st = D.ar_token_stats(D.load_ar_model(), [s.caption for s in sc[:2]], grids)
    for k, v in st.items():
        assert v.shape == (2, 256), k
    assert (st["ce_cond"] >= 0).all() and st["ce_cond"].mean() < math.log(512)  # better than uniform
    assert set(np.unique(st["top1_mix"])) <= {0.0, 1.0}
    assert (st["ent_mix"] <= math.log(512) + 1e-4).all() and ((st["pmax_mix"] > 0) & (st["pmax_mix"] <= 1)).all()
    rows = D.by_type(st, D.position_types(grids, sc[:2]))
    assert abs(rows["all"]["loss_share"] - 1) < 1e-9 and rows["all"]["share"] == 1.0

    target, drafter = D.load_target_and_drafter()
    ds = D.drafter_token_stats(target, drafter, [(sc[0].caption, grids[0].ravel().tolist())])
    assert all(v.shape == (1, 255) for v in ds.values())
    assert ((ds["accept"] >= 0) & (ds["accept"] <= 1 + 1e-5)).all()
    # one token drafted greedily (q one-hot at argmax) is accepted with prob p_max ≤ Σ min(p, q) when q = p
    assert (ds["pmax"] <= 1 + 1e-6).all() and ds["agree"].mean() > 0.1


def test_by_confidence_and_bg_kind_partition_planted_stats() -> None:
    """Bins partition the tokens (pmax = 1 falls in the last bin); per-bin and per-kind means are the planted ones."""
    pmax = np.array([[0.1, 0.4, 0.95, 1.0], [0.2, 0.6, 0.8, 0.995]])
    agree = np.array([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    st = {"pmax": pmax, "agree": agree, "accept": 0.5 * agree}
    rows = D.by_confidence(st)
    assert abs(sum(r["share"] for r in rows.values()) - 1) < 1e-12
    assert rows["0-0.3"] == {"share": 0.25, "agree": 0.0, "accept": 0.0}
    assert rows["0.99-1"]["share"] == 0.25 and rows["0.99-1"]["agree"] == 1.0  # 0.995 and 1.0
    assert rows["0.3-0.5"]["agree"] == 1.0 and rows["0.5-0.7"]["agree"] == 0.0
    sc = [S.sample_scene(0, i) for i in range(40)]
    plain = next(s for s in sc if s.bg_kind == "plain")
    noisy = next(s for s in sc if s.bg_kind == "noisy")
    kinds = D.by_bg_kind(st, [plain, noisy])
    assert kinds["plain"] == {"images": 1, "agree": 0.75, "accept": 0.375, "unsure": 0.5, "confident": 0.5}
    assert kinds["noisy"]["unsure"] == 0.25 and kinds["noisy"]["confident"] == 0.25


def test_vq_diagnosis_of_another_tokenizer(tmp_path) -> None:
    """``what=vq vq_path=DIR`` diagnoses a retraining candidate: here a random local-encoder VQ saved in the
    mini layout (config.json + model.safetensors), whose flat images are one code each by construction."""
    import json

    from safetensors.torch import save_file

    from adtbench.models.llamagen.vq import LlamaGenVQConfig, LlamaGenVQModel

    cfg = json.loads((D.WEIGHTS / "vq" / "config.json").read_text()) | {"encoder": "local"}
    model = LlamaGenVQModel.tiny_random(LlamaGenVQConfig(**cfg), 0)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    res = D.vq_diagnosis(4, str(tmp_path))
    assert all(f["distinct"] == 1 for f in res["flat_images"].values()), res["flat_images"]


@pytest.mark.slow
def test_cond_diagnosis_small() -> None:
    res = D.cond_diagnosis(n=6, probe_train=12)
    assert res["by_type"]["object_first"]["share"] == pytest.approx(1 / 256)
    for attr, row in res["probes"].items():
        assert 0 < row["chance"] <= 1 and row["n"] <= 6, attr
        assert all(0 <= row[f"pos{p}"] <= 1 for p in D.PROBE_POSITIONS)
    assert "linear probes" in D.summary("cond", res)
