"""Tests for the VQ image decoders (LlamaGen VQ-16 and the taming/Chameleon VQGAN layouts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from adtbench.io import save_png
from adtbench.models.chameleon.vq import (
    TamingVQConfig,
    TamingVQModel,
    load_taming_vqgan,
    make_tiny_taming_vq,
    save_taming_vqgan,
    tiny_taming_vq_config,
)
from adtbench.models.llamagen.vq import (
    LlamaGenVQConfig,
    LlamaGenVQModel,
    load_llamagen_vq,
    make_tiny_llamagen_vq,
    save_llamagen_vq,
    tiny_llamagen_vq_config,
)
from adtbench.models.vq_common import AttnBlock, VQDecoder, to_uint8_images

GRID = 4  # 4×4 code grid


class Opaque:
    """A non-allow-listed pickled object, as in some Lightning callback states."""


def _codes(n_codes: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_codes, (batch, GRID * GRID), generator=gen)


# ---------------------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------------------


def test_attn_block_matches_explicit_softmax() -> None:
    torch.manual_seed(0)
    blk = AttnBlock(32).eval()
    x = torch.randn(2, 32, 3, 5)
    with torch.no_grad():
        got = blk(x)
        n = blk.norm(x)
        q, k, v = (t.reshape(2, 32, 15) for t in (blk.q(n), blk.k(n), blk.v(n)))
        w = torch.softmax(torch.bmm(q.transpose(1, 2), k) * 32**-0.5, dim=2)  # [B, hw_q, hw_k]
        ref = x + blk.proj_out(torch.bmm(v, w.transpose(1, 2)).reshape(2, 32, 3, 5))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_to_uint8_images_and_save_png(tmp_path: Path) -> None:
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 3.0]).reshape(1, 1, 1, 5).expand(1, 3, 1, 5)
    arr = to_uint8_images(x)
    assert arr.shape == (1, 1, 5, 3) and arr.dtype == np.uint8
    assert arr[0, 0, :, 0].tolist() == [0, 0, 128, 255, 255]  # 127.5 rounds to even → 128

    out = tmp_path / "sub" / "img.png"
    save_png(arr[0], out)
    assert out.is_file()
    assert not list(out.parent.glob("*.tmp"))
    assert np.array_equal(np.asarray(Image.open(out)), arr[0])


# ---------------------------------------------------------------------------------------------------------
# LlamaGen VQ-16 layout
# ---------------------------------------------------------------------------------------------------------


def test_llamagen_decode_shape_and_range() -> None:
    m = make_tiny_llamagen_vq(0)
    assert isinstance(m, VQDecoder)
    assert m.downsample_factor == 2 and m.codebook_size == 64
    assert m.codebook().shape == (64, 8)
    px = m.decode_codes(_codes(64), GRID, GRID)
    assert px.shape == (2, 3, GRID * 2, GRID * 2)
    assert torch.isfinite(px).all()
    c = px.clamp(-1, 1)
    assert c.min() >= -1 and c.max() <= 1
    assert px.std() > 1e-3  # not a constant image


def test_llamagen_tiny_is_deterministic_and_leaves_global_rng() -> None:
    state = torch.get_rng_state()
    a, b, c = make_tiny_llamagen_vq(3), make_tiny_llamagen_vq(3), make_tiny_llamagen_vq(4)
    assert torch.equal(torch.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["decoder.conv_out.weight"], sc["decoder.conv_out.weight"])


def test_llamagen_official_key_layout() -> None:
    # VQ_16 topology (ch_mult (1,1,2,2,4), 2 res blocks) at width 32: key names do not depend on widths
    narrow = LlamaGenVQConfig(codebook_size=16384, z_channels=32, ch=32)
    keys = set(LlamaGenVQModel(LlamaGenVQConfig(**{**narrow.__dict__, "with_encoder": True})).state_dict())
    sd = LlamaGenVQModel(narrow).state_dict()
    # decoder.conv_blocks[0] is the lowest resolution: attention after each of its 3 (=2+1) res blocks
    for j in range(3):
        assert f"decoder.conv_blocks.0.attn.{j}.norm.weight" in keys
        assert f"decoder.conv_blocks.0.attn.{j}.proj_out.weight" in keys
    assert "decoder.conv_blocks.0.attn.3.norm.weight" not in keys
    assert "decoder.conv_blocks.0.res.2.conv2.weight" in keys
    assert not any(k.startswith("decoder.conv_blocks.1.attn.") for k in keys)
    assert "decoder.conv_blocks.0.upsample.conv.weight" in keys
    assert "decoder.conv_blocks.4.upsample.conv.weight" not in keys  # full resolution: no upsampler
    assert "decoder.mid.1.q.weight" in keys and "decoder.mid.2.norm1.weight" in keys
    assert "decoder.conv_blocks.1.res.0.nin_shortcut.weight" in keys  # 512 → 256 channels
    # encoder: conv_blocks[0] is full resolution, 2 blocks/level, attention only at the last level
    assert "encoder.conv_blocks.4.attn.1.k.weight" in keys
    assert "encoder.conv_blocks.4.attn.2.k.weight" not in keys
    assert "encoder.conv_blocks.0.downsample.conv.weight" in keys
    assert "encoder.conv_blocks.4.downsample.conv.weight" not in keys
    assert "encoder.mid.0.conv1.weight" in keys and "encoder.conv_out.weight" in keys
    assert {"quant_conv.weight", "post_quant_conv.weight"} <= keys
    assert sd["quantize.embedding.weight"].shape == (16384, 8)
    assert sd["quantize.codebook_used"].shape == (65536,)
    assert sd["decoder.conv_in.weight"].shape == (4 * 32, 32, 3, 3)  # ch * ch_mult[-1], z_channels
    assert sd["decoder.conv_out.weight"].shape == (3, 32, 3, 3)
    assert not any(k.startswith(("encoder.", "quant_conv.")) for k in sd)  # decoder-only by default


def test_llamagen_save_load_round_trip(tmp_path: Path) -> None:
    m = make_tiny_llamagen_vq(1)
    path = save_llamagen_vq(m, tmp_path / "vq_ds16_t2i.pt")
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert set(raw) == {"model"} and "quantize.codebook_used" in raw["model"]
    state = torch.get_rng_state()
    loaded = load_llamagen_vq(path, tiny_llamagen_vq_config())
    assert torch.equal(torch.get_rng_state(), state)
    codes = _codes(64, seed=5)
    assert torch.equal(m.decode_codes(codes, GRID, GRID), loaded.decode_codes(codes, GRID, GRID))
    assert not loaded.training


@pytest.mark.parametrize("wrapper", ["model", "state_dict", "module", None])
def test_llamagen_accepts_wrappers(tmp_path: Path, wrapper: str | None) -> None:
    m = make_tiny_llamagen_vq(2, with_encoder=True)
    sd = m.state_dict()
    obj = sd if wrapper is None else {wrapper: sd, "steps": 7}
    path = tmp_path / "vq.pt"
    torch.save(obj, path)
    loaded = load_llamagen_vq(path, tiny_llamagen_vq_config())  # extra encoder keys are ignored
    assert torch.equal(loaded.codebook(), m.codebook())


def test_llamagen_missing_key_names_key_and_path(tmp_path: Path) -> None:
    sd = make_tiny_llamagen_vq(0).state_dict()
    del sd["decoder.conv_blocks.0.attn.0.norm.weight"]
    path = tmp_path / "broken.pt"
    torch.save({"model": sd}, path)
    with pytest.raises(ValueError, match=r"decoder\.conv_blocks\.0\.attn\.0\.norm\.weight") as ei:
        load_llamagen_vq(path, tiny_llamagen_vq_config())
    assert str(path) in str(ei.value)
    with pytest.raises(FileNotFoundError, match=r"nope\.pt"):
        load_llamagen_vq(tmp_path / "nope.pt", tiny_llamagen_vq_config())


def test_llamagen_codebook_used_optional_and_encoder_required(tmp_path: Path) -> None:
    sd = make_tiny_llamagen_vq(0).state_dict()
    del sd["quantize.codebook_used"]
    path = tmp_path / "no_usage.pt"
    torch.save({"model": sd}, path)
    loaded = load_llamagen_vq(path, tiny_llamagen_vq_config())
    assert torch.count_nonzero(loaded.quantize.codebook_used) == 0
    with pytest.raises(ValueError, match=r"encoder\.conv_in\.weight"):
        load_llamagen_vq(path, tiny_llamagen_vq_config(with_encoder=True))


def test_llamagen_config_mismatch_is_reported(tmp_path: Path) -> None:
    path = save_llamagen_vq(make_tiny_llamagen_vq(0), tmp_path / "vq.pt")
    bigger = LlamaGenVQConfig(**{**tiny_llamagen_vq_config().__dict__, "codebook_size": 128})
    with pytest.raises(ValueError, match="shape mismatch"):
        load_llamagen_vq(path, bigger)


def test_llamagen_encode_decode_round_trip() -> None:
    m = make_tiny_llamagen_vq(0, with_encoder=True)
    codes = _codes(64, batch=3, seed=9)
    px = m.decode_codes(codes, GRID, GRID).clamp(-1, 1)
    back = m.encode(px)
    assert back.shape == (3, GRID * GRID) and back.dtype == torch.long
    assert int(back.min()) >= 0 and int(back.max()) < 64
    again = m.decode_codes(back, GRID, GRID)
    assert again.shape == px.shape
    # the chosen code is the nearest normalised codebook row to the normalised encoder output
    z = torch.nn.functional.normalize(m.quant_conv(m.encoder(px)), dim=1)
    e = torch.nn.functional.normalize(m.codebook(), dim=1)
    d = torch.cdist(z.permute(0, 2, 3, 1).reshape(-1, 8), e)
    torch.testing.assert_close(d.gather(1, back.reshape(-1, 1)).squeeze(1), d.min(1).values)


def test_llamagen_decode_uses_normalised_codebook() -> None:
    m = make_tiny_llamagen_vq(0)
    codes = _codes(64)
    before = m.decode_codes(codes, GRID, GRID)
    with torch.no_grad():
        m.quantize.embedding.weight.mul_(3.0)  # rescaling rows changes nothing under l2-norm
    torch.testing.assert_close(m.decode_codes(codes, GRID, GRID), before, rtol=1e-5, atol=1e-5)


def test_bad_codes_rejected() -> None:
    m = make_tiny_llamagen_vq(0)
    with pytest.raises(ValueError, match="shape"):
        m.decode_codes(torch.zeros(1, 15, dtype=torch.long), GRID, GRID)
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        m.decode_codes(torch.full((1, 16), 64), GRID, GRID)


# ---------------------------------------------------------------------------------------------------------
# taming / Chameleon VQGAN layout
# ---------------------------------------------------------------------------------------------------------


def test_taming_decode_shape_and_range() -> None:
    m = make_tiny_taming_vq(0)
    assert isinstance(m, VQDecoder)
    assert m.downsample_factor == 4 and m.codebook_size == 64
    assert m.codebook().shape == (64, 8)
    px = m.decode_codes(_codes(64), GRID, GRID)
    assert px.shape == (2, 3, GRID * 4, GRID * 4)
    assert torch.isfinite(px).all()
    c = px.clamp(-1, 1)
    assert c.min() >= -1 and c.max() <= 1
    assert px.std() > 1e-3


def test_taming_official_key_layout() -> None:
    # Chameleon topology (ch_mult (1,1,2,2,4), 2 res blocks, no level attention) at width 32
    narrow = TamingVQConfig(z_channels=32, ch=32, embed_dim=16)
    keys = set(TamingVQModel(TamingVQConfig(**{**narrow.__dict__, "with_encoder": True})).state_dict())
    sd = TamingVQModel(narrow).state_dict()
    assert "decoder.up.0.block.0.norm1.weight" in keys
    assert "decoder.up.0.block.2.conv2.weight" in keys  # num_res_blocks + 1 = 3 per decoder level
    assert "decoder.up.0.block.3.conv2.weight" not in keys
    assert "decoder.up.0.upsample.conv.weight" not in keys  # up[0] is full resolution
    assert "decoder.up.4.upsample.conv.weight" in keys
    assert "decoder.up.1.block.0.nin_shortcut.weight" in keys  # 256 → 128 channels
    assert {
        "decoder.mid.block_1.conv1.weight",
        "decoder.mid.attn_1.q.weight",
        "decoder.mid.block_2.norm2.bias",
    } <= keys
    assert not any(".up." in k and ".attn." in k for k in keys)  # attn_resolutions = []
    assert {"decoder.conv_in.weight", "decoder.norm_out.weight", "decoder.conv_out.weight"} <= keys
    assert "encoder.down.0.block.1.conv1.weight" in keys and "encoder.down.0.block.2.conv1.weight" not in keys
    assert "encoder.down.3.downsample.conv.weight" in keys and "encoder.down.4.downsample.conv.weight" not in keys
    assert {"encoder.mid.attn_1.proj_out.weight", "quant_conv.weight", "post_quant_conv.weight"} <= keys
    assert not any("temb_proj" in k for k in keys)
    assert sd["quantize.embedding.weight"].shape == (8192, 16)
    assert sd["decoder.conv_in.weight"].shape == (4 * 32, 32, 3, 3)
    assert sd["decoder.up.0.block.0.conv1.weight"].shape == (32, 32, 3, 3)
    assert sd["post_quant_conv.weight"].shape == (32, 16, 1, 1)
    # attention placement follows attn_resolutions, like taming (resolution halves per level)
    cfg = TamingVQConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, resolution=16, attn_resolutions=(8,), z_channels=32)
    k2 = set(TamingVQModel(cfg).state_dict())
    assert {"decoder.up.1.attn.0.q.weight", "decoder.up.1.attn.1.q.weight"} <= k2
    assert not any(k.startswith("decoder.up.0.attn") for k in k2)


def test_taming_save_load_round_trip(tmp_path: Path) -> None:
    m = make_tiny_taming_vq(1)
    ckpt, yml = save_taming_vqgan(m, tmp_path / "vqgan.ckpt", tmp_path / "vqgan.yaml")
    assert TamingVQConfig.from_yaml(yml) == tiny_taming_vq_config()
    assert set(torch.load(ckpt, map_location="cpu", weights_only=True)) == {"state_dict"}
    loaded = load_taming_vqgan(ckpt, yml)
    codes = _codes(64, seed=3)
    assert torch.equal(m.decode_codes(codes, GRID, GRID), loaded.decode_codes(codes, GRID, GRID))


def test_taming_lightning_checkpoint_with_loss_keys(tmp_path: Path) -> None:
    m = make_tiny_taming_vq(2, with_encoder=True)
    sd = dict(m.state_dict())
    sd["loss.discriminator.main.0.weight"] = torch.zeros(4, 3, 4, 4)
    sd["loss.perceptual_loss.net.slice1.0.weight"] = torch.zeros(2)
    ckpt = tmp_path / "vqgan.ckpt"
    torch.save({"state_dict": sd, "epoch": 3, "global_step": 100, "optimizer_states": []}, ckpt)
    _, yml = save_taming_vqgan(m, tmp_path / "ignored.ckpt", tmp_path / "vqgan.yaml")
    dec = load_taming_vqgan(ckpt, yml)
    codes = _codes(64)
    assert torch.equal(dec.decode_codes(codes, GRID, GRID), m.decode_codes(codes, GRID, GRID))
    enc = load_taming_vqgan(ckpt, yml, with_encoder=True)
    px = enc.decode_codes(codes, GRID, GRID).clamp(-1, 1)
    back = enc.encode(px)
    assert back.shape == (2, GRID * GRID) and int(back.max()) < 64


def test_taming_missing_key_names_key_and_path(tmp_path: Path) -> None:
    m = make_tiny_taming_vq(0)
    _, yml = save_taming_vqgan(m, tmp_path / "ok.ckpt", tmp_path / "vqgan.yaml")
    sd = m.state_dict()
    del sd["decoder.up.0.block.0.norm1.weight"]
    ckpt = tmp_path / "broken.ckpt"
    torch.save({"state_dict": sd}, ckpt)
    with pytest.raises(ValueError, match=r"decoder\.up\.0\.block\.0\.norm1\.weight") as ei:
        load_taming_vqgan(ckpt, yml)
    assert str(ckpt) in str(ei.value)
    with pytest.raises(FileNotFoundError, match=r"missing\.yaml"):
        load_taming_vqgan(tmp_path / "ok.ckpt", tmp_path / "missing.yaml")


def test_taming_pickled_extras_raise_clear_error(tmp_path: Path) -> None:
    m = make_tiny_taming_vq(0)
    _, yml = save_taming_vqgan(m, tmp_path / "ok.ckpt", tmp_path / "vqgan.yaml")
    ckpt = tmp_path / "lightning.ckpt"
    torch.save({"state_dict": m.state_dict(), "callbacks": {"x": Opaque}}, ckpt)
    with pytest.raises(ValueError, match="weights_only") as ei:
        load_taming_vqgan(ckpt, yml)
    assert str(ckpt) in str(ei.value)
    # numpy scalars and argparse.Namespace (common, harmless extras) are allowed
    import argparse

    ok = tmp_path / "np.ckpt"
    torch.save({"state_dict": m.state_dict(), "best": np.float64(0.5), "args": argparse.Namespace(a=1)}, ok)
    assert load_taming_vqgan(ok, yml).codebook_size == 64


def test_local_encoder_codes_a_flat_image_with_one_code_whatever_the_weights() -> None:
    """``encoder: local`` (mini-model diagnosis: the official encoder's attention, GroupNorm and zero padding make a
    flat colour many position-dependent codes): no image-wide path, so a flat image is one code everywhere."""
    from adtbench.models.llamagen.vq import LlamaGenVQConfig, LlamaGenVQModel

    kw = dict(codebook_size=64, codebook_embed_dim=4, z_channels=32, ch=32, ch_mult=(1, 2), num_res_blocks=1,
              with_encoder=True)  # fmt: skip
    flat = torch.zeros(3, 3, 32, 32)
    for i, colour in enumerate(([0.8, -0.2, 0.1], [-0.9, -0.9, 0.7], [0.0, 0.5, -0.5])):
        flat[i] = torch.tensor(colour)[:, None, None]
    for seed in range(3):
        local = LlamaGenVQModel.tiny_random(LlamaGenVQConfig(**kw, encoder="local"), seed)
        with torch.no_grad():
            codes = local.encode(flat)
        assert all(row.unique().numel() == 1 for row in codes), codes
        glob = LlamaGenVQModel.tiny_random(LlamaGenVQConfig(**kw), seed)  # negative control: borders differ
        with torch.no_grad():
            z = glob.encoder(flat)
        assert not torch.allclose(z[:, :, 0, 0], z[:, :, 4, 4], atol=1e-4)
    with pytest.raises(ValueError, match="encoder"):
        LlamaGenVQConfig(**kw, encoder="nope")
