"""MuLo-SD resamplers (``adtbench.models.resample``) and their training stage (``adtbench train upsampler``).

Invariants checked: shapes of every kind (2-D and batched); the learned U_r is row-causal (low-res row k only
reaches high-res rows ≥ k·r, so a prefix of rows up-samples to the prefix); ``nearest`` round-trips; the bicubic
route is decode → bicubic → encode on the real mini VQ; the shipped weights load and beat code repetition on
held-out scenes; the stage is resumable with bit-identical weights; bad configs are ConfigErrors naming the key.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from adtbench.errors import ConfigError
from adtbench.models.mini.target import load_vq
from adtbench.models.resample import (
    BicubicResampler,
    LearnedResampler,
    NearestResampler,
    ResampleNets,
    Resampler,
    ResamplerConfig,
    RowCausalConv2d,
    build_resampler,
    codebook_checksum,
    load_resample_nets,
)
from adtbench.scenes import iter_split, render, to_tensor_range
from adtbench.tools.train.cli import main as train_main
from adtbench.tools.train.upsampler import save_nets

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "adtbench" / "weights" / "mini"
SHIPPED = WEIGHTS / "upsampler"
R = 2  # mini: 32 px → 8×8 codes, 64 px → 16×16 codes


@pytest.fixture(scope="module")
def vq():
    return load_vq(WEIGHTS / "vq")


@pytest.fixture(scope="module")
def heldout(vq) -> dict[str, torch.Tensor]:
    """Codes of the first 16 held-out scenes of stream 0 at 32 px [16, 8, 8] and 64 px [16, 16, 16]."""
    scenes = [s for _, s in iter_split(0, "heldout", 16)]
    out = {}
    for size in (32, 64):
        x = to_tensor_range(np.stack([render(s, size) for s in scenes]))
        g = size // vq.downsample_factor
        out[size] = vq.encode(x).view(len(scenes), g, g)
    return out


def _random_nets(tmp_path: Path, vq, seed: int = 0, **over) -> Path:
    """Freshly initialised nets with a *non-zero* head (the zero-init head makes causality trivial), saved."""
    cfg = ResamplerConfig(width=16, codebook_checksum=codebook_checksum(vq), **over)
    torch.manual_seed(seed)
    nets = ResampleNets(cfg)
    for head in (nets.up.head, nets.down.head):
        torch.nn.init.normal_(head.weight, std=0.3)
    save_nets(nets, tmp_path / "nets")
    return tmp_path / "nets"


def _codes(h: int, w: int, seed: int = 0, n: int = 512) -> torch.Tensor:
    return torch.randint(0, n, (h, w), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------
# Shapes and the nearest round trip
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["nearest", "bicubic", "learned"])
def test_shapes_for_every_kind(kind, vq, tmp_path):
    path = _random_nets(tmp_path, vq) if kind == "learned" else None
    rs = build_resampler(kind, kind, vq, R, path)
    assert isinstance(rs, Resampler) and rs.r == R
    c = _codes(8, 8)
    up = rs.up(c)
    assert up.shape == (16, 16) and up.dtype == torch.long and int(up.min()) >= 0 and int(up.max()) < 512
    down = rs.down(_codes(16, 16))
    assert down.shape == (8, 8) and down.dtype == torch.long
    # non-square grids, and a batch dimension (used by training / evaluation)
    assert rs.up(_codes(3, 5)).shape == (6, 10)
    assert rs.down(_codes(4, 6)).shape == (2, 3)
    assert rs.up(torch.stack([c, c])).shape == (2, 16, 16)
    with pytest.raises(ValueError, match="multiple of r"):
        rs.down(_codes(5, 6))


def test_mixed_kinds_compose(vq, tmp_path):
    path = _random_nets(tmp_path, vq)
    rs = build_resampler("learned", "nearest", vq, R, path)
    c = _codes(16, 16)
    assert torch.equal(rs.down(c), c[::2, ::2])
    assert torch.equal(rs.up(c[:4, :4]), LearnedResampler(vq, load_resample_nets(path, vq)).up(c[:4, :4]))


def test_nearest_round_trip_and_definition():
    rs = NearestResampler(3)
    for seed in range(3):
        c = _codes(4, 7, seed)
        up = rs.up(c)
        assert torch.equal(rs.down(up), c)
        # up = repeat each code r×r; down = top-left code of each block
        assert torch.equal(up[3 * 2 + 1, 3 * 5 + 2], c[2, 5])
    big = _codes(6, 9)
    assert torch.equal(rs.down(big), big[::3, ::3])


# ----------------------------------------------------------------------------------------------------
# Row causality of the learned up-sampler
# ----------------------------------------------------------------------------------------------------


def test_row_causal_conv_pads_only_above():
    torch.manual_seed(0)
    conv = RowCausalConv2d(2, 3, 3)
    x = torch.randn(1, 2, 6, 5)
    y = conv(x)
    assert y.shape == (1, 3, 6, 5)
    x2 = x.clone()
    x2[:, :, 4] += 1.0
    y2 = conv(x2)
    assert torch.equal(y[:, :, :4], y2[:, :, :4]) and not torch.equal(y[:, :, 4:], y2[:, :, 4:])


@pytest.mark.parametrize("weights", ["random", "shipped"])
def test_learned_up_is_row_causal(weights, vq, tmp_path):
    path = _random_nets(tmp_path, vq, up_blocks=3) if weights == "random" else SHIPPED
    rs = build_resampler("learned", "learned", vq, R, path)
    assert isinstance(rs, LearnedResampler)
    c = _codes(8, 8, seed=1)
    base = rs.up(c)
    e = vq.quantize.effective_codebook()
    changed_below = 0
    for k in range(8):
        c2 = c.clone()
        c2[k] = (c2[k] + 1 + torch.arange(8)) % 512  # change every code of low-res row k
        out = rs.up(c2)
        assert torch.equal(out[: k * R], base[: k * R]), f"row {k} reached high-res rows above {k * R}"
        changed_below += int((out[k * R :] != base[k * R :]).sum())
        # latents too (exactly: the same shapes run the same arithmetic on identical inputs above row k·r)
        with torch.no_grad():
            za = rs.nets.up(e[c].permute(2, 0, 1)[None])
            zb = rs.nets.up(e[c2].permute(2, 0, 1)[None])
        assert torch.equal(za[:, :, : k * R], zb[:, :, : k * R])
    assert changed_below > 0  # the net is not trivially constant
    # incremental use: the first k rows up-sample to the first k·r rows of the full grid
    for k in (1, 3, 8):
        assert torch.equal(rs.up(c[:k]), base[: k * R])


# ----------------------------------------------------------------------------------------------------
# Bicubic route on the real mini VQ
# ----------------------------------------------------------------------------------------------------


def test_bicubic_route_is_decode_interpolate_encode(vq, heldout):
    rs = build_resampler("bicubic", "bicubic", vq, R, None)
    assert isinstance(rs, BicubicResampler)
    lo, hi = heldout[32][:4], heldout[64][:4]
    with torch.no_grad():
        x = vq.decode_codes(lo.reshape(4, -1), 8, 8)
        ref_up = vq.encode(F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False).clamp(-1, 1))
        y = vq.decode_codes(hi.reshape(4, -1), 16, 16)
        ref_down = vq.encode(F.avg_pool2d(y, 2).clamp(-1, 1))  # area ÷2 = 2×2 box mean
    for i in range(4):
        assert torch.equal(rs.up(lo[i]), ref_up[i].view(16, 16))
        assert torch.equal(rs.down(hi[i]), ref_down[i].view(8, 8))
    # on real scenes the pixel route agrees with encode(64 px) more often than repeating codes (64 scenes: .22 vs .14)
    up_b = rs.up(heldout[32])
    up_n = NearestResampler(R).up(heldout[32])
    assert (up_b == heldout[64]).float().mean() > (up_n == heldout[64]).float().mean()


# ----------------------------------------------------------------------------------------------------
# Shipped weights
# ----------------------------------------------------------------------------------------------------


#: measured on the 16 held-out scenes of the fixture with the shipped (second-generation, local-tokenizer) weights:
#: code agreement up (with encode(64 px)) learned 0.365, bicubic 0.478, nearest 0.287; down (with encode(32 px))
#: learned 0.594, bicubic 0.443, nearest 0.275. With the local tokenizer a flat colour is one code, so the
#: training-free pixel route is the better U_r; the learned D_r stays well ahead.
MARGIN_UP_NEAREST = 0.05  # observed 0.078
MARGIN_DOWN_NEAREST = 0.25  # observed 0.319
MARGIN_DOWN_BICUBIC = 0.10  # observed 0.151


def test_shipped_weights_load_and_beat_nearest(vq, heldout):
    files = {p.name for p in SHIPPED.iterdir()}
    assert {"model.safetensors", "config.json", "train_info.json"} <= files
    assert (SHIPPED / "model.safetensors").stat().st_size < 1_000_000  # both nets together, well under 1 MB
    rs = build_resampler("learned", "learned", vq, R, SHIPPED)
    assert isinstance(rs, LearnedResampler)
    lo, hi = heldout[32], heldout[64]
    kinds = {"learned": rs, "bicubic": BicubicResampler(vq, R), "nearest": NearestResampler(R)}
    up = {k: float((r.up(lo) == hi).float().mean()) for k, r in kinds.items()}
    down = {k: float((r.down(hi) == lo).float().mean()) for k, r in kinds.items()}
    assert up["bicubic"] > up["learned"] >= up["nearest"] + MARGIN_UP_NEAREST, up
    assert down["learned"] >= down["nearest"] + MARGIN_DOWN_NEAREST, down
    assert down["learned"] >= down["bicubic"] + MARGIN_DOWN_BICUBIC, down
    info = json.loads((SHIPPED / "train_info.json").read_text())
    assert info["heldout_up_agree_bicubic"] > info["heldout_up_agree_learned"] > info["heldout_up_agree_nearest"]
    assert info["heldout_down_agree_learned"] > info["heldout_down_agree_bicubic"] > info["heldout_down_agree_nearest"]


# ----------------------------------------------------------------------------------------------------
# Config errors
# ----------------------------------------------------------------------------------------------------


def test_config_errors(vq, tmp_path):
    with pytest.raises(ConfigError) as e:
        build_resampler("lanczos", "nearest", vq, R, None)
    assert e.value.key == "policy.upsampler"
    with pytest.raises(ConfigError) as e:
        build_resampler("nearest", "max", vq, R, None)
    assert e.value.key == "policy.downsampler"
    for path in (None, tmp_path / "missing"):
        with pytest.raises(ConfigError) as e:
            build_resampler("learned", "nearest", vq, R, path)
        assert e.value.key == "policy.upsampler_path"
    with pytest.raises(ConfigError) as e:  # a learned down-sampler needs the weights too
        build_resampler("nearest", "learned", vq, R, None)
    assert e.value.key == "policy.upsampler_path"
    # trained for another r
    with pytest.raises(ConfigError, match="r=3") as e:
        build_resampler("learned", "learned", vq, 3, SHIPPED)
    assert e.value.key == "policy.upsampler_path"
    # another codebook size / latent dim (the tiny LlamaGen VQ: 64 × 8)
    from adtbench.models.llamagen.vq import make_tiny_llamagen_vq

    with pytest.raises(ConfigError, match="64 × 8") as e:
        build_resampler("learned", "nearest", make_tiny_llamagen_vq(0, with_encoder=True), R, SHIPPED)
    assert e.value.key == "policy.upsampler_path"
    # the same shape, other values: two rows swapped
    other = copy.deepcopy(vq)
    with torch.no_grad():
        w = other.quantize.embedding.weight
        w[[0, 1]] = w[[1, 0]]
    with pytest.raises(ConfigError, match="different codebook") as e:
        build_resampler("learned", "nearest", other, R, SHIPPED)
    assert e.value.key == "policy.upsampler_path"
    # bicubic needs an encoder
    from adtbench.models.llamagen.vq import make_tiny_llamagen_vq as tiny_vq

    with pytest.raises(ConfigError) as e:
        build_resampler("nearest", "bicubic", tiny_vq(0, with_encoder=False), R, None)
    assert e.value.key == "policy.downsampler"


# ----------------------------------------------------------------------------------------------------
# The training stage
# ----------------------------------------------------------------------------------------------------

TINY = [
    "steps=4",
    "batch_size=2",
    "pixel_batch=1",
    "warmup=1",
    "eval_count=2",
    "arch.width=8",
    "arch.up_blocks=1",
    "arch.down_blocks=1",
    "log_every=2",
    "ckpt_every=2",
    "threads=1",
    "progress=false",
]


def _run(out: Path, *over: str) -> dict:
    assert train_main(["upsampler", f"out_dir={out}", *over]) == 0
    return json.loads((out / "final" / "train_info.json").read_text())


def test_stage_trains_resumes_and_exports(vq, tmp_path):
    info = _run(tmp_path / "a", *TINY, f"export={tmp_path / 'export'}")
    assert info["steps"] == 4 and info["complete"]
    for name in ("learned", "bicubic", "nearest"):
        for key in ("up_agree", "up_psnr", "down_agree", "down_psnr"):
            assert f"heldout_{key}_{name}" in info
    assert {"up_rec", "up_commit", "up_code_ce", "down_rec", "down_agree"} <= set(info["final"])
    # stopped after 3 steps, then resumed: the same weights as the uninterrupted run
    assert train_main(["upsampler", f"out_dir={tmp_path / 'b'}", *TINY, "stop_after=3"]) == 0
    assert not (tmp_path / "b" / "final").exists()
    _run(tmp_path / "b", *TINY)
    a = load_file(str(tmp_path / "a" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the export loads through the public builder
    rs = build_resampler("learned", "learned", vq, R, tmp_path / "export")
    assert rs.up(_codes(8, 8)).shape == (16, 16)
    # a resume with another config is refused
    with pytest.raises(RuntimeError, match="different config"):
        train_main(["upsampler", f"out_dir={tmp_path / 'b'}", *TINY, "lr=0.5"])


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit is deprecated in torch ≥ 2.9 but still works
def test_stage_lpips_and_bad_options(tmp_path, capsys):
    class L1(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (x - y).abs().mean(dim=(1, 2, 3))

    x = torch.zeros(1, 3, 8, 8)
    torch.jit.trace(L1(), (x, x)).save(str(tmp_path / "lp.pt"))
    short = [t for t in TINY if not t.startswith("steps")] + ["steps=2"]
    info = _run(tmp_path / "l", *short, f"lpips_path={tmp_path / 'lp.pt'}", "decode_input=continuous")
    assert info["final"]["up_lpips"] > 0
    capsys.readouterr()
    assert train_main(["upsampler", f"out_dir={tmp_path / 'm'}", *short, f"lpips_path={tmp_path / 'nope.pt'}"]) == 2
    assert "config error: lpips_path: not a file" in capsys.readouterr().err
    assert train_main(["upsampler", f"out_dir={tmp_path / 'n'}", *short, "decode_input=soft"]) == 2
    assert "config error: decode_input:" in capsys.readouterr().err
