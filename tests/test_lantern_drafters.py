"""LANTERN's Chameleon drafters as published (``jadohu/anole_drafter``; ``cnets_anole`` / ``cnets_lumina_mgpt``).

- The drafter's decoder layer is transformers' ``ChameleonDecoderLayer`` (per-head q/k LayerNorm, RMSNorms, RoPE
  θ = 1e4 with rotate-half pairs) with the same weights, within 1e-5 in float32, for Anole's ``[heads, head_dim]`` and
  Lumina-mGPT's ``[1, head_dim]`` q/k norms, through the reference modules and the ``no_grad`` lean path.
- ``make-tiny model=anole_drafter | lumina_mgpt_drafter`` writes LANTERN's layout (file names, key names, dtypes,
  Lumina's ``[1, head_dim]`` norms, the tiny target's embedding); ``drafter.path`` reads it as ``pytorch_model.bin``,
  as ``model.safetensors`` and converted (``tools.convert_drafter``) into the same drafter, bit for bit.
- The drafter embeds its inputs with the embedding it stores, everywhere (prompt, catch-up, tree levels, Jacobi
  drafts): the target's table is never read for them.
- A checkpoint that does not fit is a ``ConfigError`` naming ``drafter.path``.
- The ADT-Tree README's setting from the command line on the tiny checkpoints: ``policy=adt lantern=on`` greedy
  equals AR.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_in_process
from omegaconf import OmegaConf

from adtbench.algorithm.drafters.checkpoint import convert_state_dict
from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.policies.jacobi import JacobiModels
from adtbench.errors import ConfigError
from adtbench.harness.drafters import build_drafter, read_drafter
from adtbench.models.chameleon.tiny import CHAMELEON_ARCH, lantern_drafter_config
from adtbench.models.registry import build_target
from adtbench.models.rope import Rope1D
from adtbench.sampling_params import SamplingParams
from adtbench.tools.make_tiny import main as make_tiny

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("anole", "lumina_mgpt")
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
LANTERN_KEYS = {  # papers_as_published.md, "LANTERN's Chameleon drafters": the keys of cnets_anole.Model
    "embed_tokens.weight",
    "fc.weight",
    "fc.bias",
    *(f"layers.0.self_attn.{n}_proj.weight" for n in "qkvo"),
    *(f"layers.0.self_attn.{n}_norm.{p}" for n in "qk" for p in ("weight", "bias")),
    *(f"layers.0.mlp.{n}_proj.weight" for n in ("gate", "up", "down")),
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
}
H, HEADS, HD = CHAMELEON_ARCH["hidden_size"], CHAMELEON_ARCH["num_attention_heads"], 16


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make-tiny`` as a user runs it: each tiny target, then its drafter copying the target's embedding."""
    root = tmp_path_factory.mktemp("lantern")
    for fam in FAMILIES:
        assert make_tiny([f"model={fam}", f"out={root / fam}"]) == 0
        assert make_tiny([f"model={fam}_drafter", f"out={root / (fam + '_drafter')}", f"target={root / fam}"]) == 0
    return root


def target_of(root: Path, fam: str, dtype: str = "float32"):
    cfg = OmegaConf.load(ROOT / "conf" / "model" / f"{fam}.yaml")
    OmegaConf.update(cfg, "path", str(root / fam), merge=True)
    OmegaConf.update(cfg, "dtype", dtype, merge=True)
    OmegaConf.update(cfg, "device", "cpu", merge=True)
    return build_target(cfg)


def drafter_of(path: Path, target) -> EagleDrafter:
    drafter = build_drafter(OmegaConf.create({"kind": "eagle", "path": str(path), "seed": 0}), target)
    assert drafter is not None
    return drafter


# ---------------------------------------------------------------------------------------------------------
# The layer: transformers' ChameleonDecoderLayer
# ---------------------------------------------------------------------------------------------------------


def _hf_layer(lumina: bool, seed: int):
    """transformers' ChameleonDecoderLayer (eager attention) at the tiny sizes, random non-trivial weights; Lumina-mGPT:
    its q/k norms one row repeated over every head (LANTERN's ``repeat_param`` with model_parallel_size 1)."""
    from transformers import ChameleonConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer

    cfg = ChameleonConfig(**{k: v for k, v in lantern_drafter_config(lumina).items() if k != "torch_dtype"})
    cfg._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed)
    layer = ChameleonDecoderLayer(cfg, 0).eval()
    stored: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if ".q_norm." in name or ".k_norm." in name:
                shape = (1, HD) if lumina else tuple(p.shape)
                v = (1.0 if name.endswith("weight") else 0.0) + 0.5 * torch.randn(shape, generator=g)
                p.copy_(v.expand_as(p))
            elif name.endswith("layernorm.weight"):
                v = 1.0 + 0.3 * torch.randn(p.shape, generator=g)
                p.copy_(v)
            else:
                v = torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5
                p.copy_(v)
            stored[f"layers.0.{name}"] = v.clone()
    return layer, stored, cfg


@pytest.mark.parametrize("lumina", [False, True], ids=["anole", "lumina_mgpt"])
def test_layer_equals_transformers_chameleon_decoder_layer(lumina: bool) -> None:
    """fc(cat[e; f]) → our layer == fc → ``ChameleonDecoderLayer`` (float32, 1e-5): CFG's two rows at their own
    positions, causal; the reference modules (autograd) and the no_grad lean path (fused weights, interleaved pairs,
    the per-head affine in ``lean.qk_affine``) alike. The state dict enters as published (Lumina: ``[1, head_dim]``
    q/k norms)."""
    hf, stored, cfg = _hf_layer(lumina, seed=3 + lumina)
    g = torch.Generator().manual_seed(7)
    vocab = CHAMELEON_ARCH["vocab_size"]
    sd = {
        **stored,
        "embed_tokens.weight": torch.randn(vocab, H, generator=g),
        "fc.weight": torch.randn(H, 2 * H, generator=g) * (2 * H) ** -0.5,
        "fc.bias": 0.1 * torch.randn(H, generator=g),
    }
    if lumina:
        assert sd["layers.0.self_attn.q_norm.weight"].shape == (1, HD)
    ours, ecfg, _ = convert_state_dict(sd, lantern_drafter_config(lumina))
    dcfg = EagleConfig(**ecfg)
    assert dcfg.qk_norm and dcfg.input_norm and dcfg.rms_norm_eps == 1e-5 and dcfg.vocab_size == vocab
    drafter = EagleDrafter(dcfg, Rope1D(HD, theta=cfg.rope_theta))
    drafter.load_state_dict(ours, strict=True)
    m = 9
    ids = torch.randint(vocab, (2, m), generator=g)
    feats = torch.randn(2, m, H, generator=g)
    pos = torch.stack([torch.arange(5, 5 + m), torch.arange(m)])  # the cond row and the shorter uncond row
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    x = torch.cat([sd["embed_tokens.weight"][ids], feats], -1) @ sd["fc.weight"].T + sd["fc.bias"]
    additive = torch.zeros(m, m).masked_fill(~causal, float("-inf"))[None, None].expand(2, 1, m, m)
    with torch.no_grad():
        ref = hf(x, attention_mask=additive, position_ids=pos)
        ref = ref[0] if isinstance(ref, tuple) else ref
    embeds = drafter.embed(None, ids)  # type: ignore[arg-type]  # its own table: the target is never read
    for grad in (True, False):  # reference modules, then the lean path
        drafter.reset(2, m)
        with torch.set_grad_enabled(grad):
            got = drafter.forward(embeds, feats, pos, causal[None, None].expand(2, 1, m, m), 0)
        err = float((got.detach() - ref).abs().max())
        assert err < 1e-5, (grad, err)
    # negative control: the same weights with the q/k norms' affine dropped are far from it
    with torch.no_grad():
        for n in ("q_norm", "k_norm"):
            getattr(drafter.layers[0].self_attn, n).weight.fill_(1.0)
            getattr(drafter.layers[0].self_attn, n).bias.zero_()
    drafter.reset(2, m)
    with torch.no_grad():
        assert (
            float((drafter.forward(embeds, feats, pos, causal[None, None].expand(2, 1, m, m), 0) - ref).abs().max())
            > 1e-2
        )


# ---------------------------------------------------------------------------------------------------------
# make-tiny: LANTERN's layout
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES)
def test_make_tiny_writes_lanterns_layout(tiny_dirs: Path, fam: str) -> None:
    from safetensors import safe_open

    d = tiny_dirs / f"{fam}_drafter"
    assert {p.name for p in d.iterdir()} == {"config.json", "pytorch_model.bin", "README.txt"}
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == "chameleon" and config["num_hidden_layers"] == 1
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 1e4 and config["torch_dtype"] == "bfloat16"
    assert (config["hidden_size"], config["intermediate_size"], config["vocab_size"]) == (
        CHAMELEON_ARCH["hidden_size"], CHAMELEON_ARCH["intermediate_size"], CHAMELEON_ARCH["vocab_size"],
    )  # fmt: skip
    assert ("dropout" in config) == (fam == "lumina_mgpt")
    sd = torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    assert set(sd) == LANTERN_KEYS and all(v.dtype == torch.float32 for v in sd.values())
    rows = 1 if fam == "lumina_mgpt" else HEADS
    assert all(sd[f"layers.0.self_attn.{n}_norm.{p}"].shape == (rows, HD) for n in "qk" for p in ("weight", "bias"))
    assert sd["fc.weight"].shape == (H, 2 * H) and sd["embed_tokens.weight"].shape == (CHAMELEON_ARCH["vocab_size"], H)
    index = json.loads((tiny_dirs / fam / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(tiny_dirs / fam / index["model.embed_tokens.weight"]), framework="pt") as f:
        assert torch.equal(sd["embed_tokens.weight"], f.get_tensor("model.embed_tokens.weight").float())
    assert make_tiny([f"model={fam}_drafter", f"out={d}"]) == 2  # refuses a non-empty folder
    assert make_tiny(["model=anole", f"out={tiny_dirs / 'x'}", f"target={tiny_dirs / fam}"]) == 2  # drafters only


# ---------------------------------------------------------------------------------------------------------
# Loading: .bin, .safetensors, converted — one drafter
# ---------------------------------------------------------------------------------------------------------


def _outputs(drafter: EagleDrafter, target) -> torch.Tensor:
    """Prompt extend + one tree level through the drafter's own embeddings (seeded inputs)."""
    g = torch.Generator().manual_seed(0)
    R, m = 2, 6
    ids = torch.randint(CHAMELEON_ARCH["vocab_size"], (m + 3,), generator=g)
    feats = torch.randn(R, m + 3, H, generator=g)
    pos = torch.arange(m + 3)[None].expand(R, -1)
    drafter.reset(R, 16)
    out = drafter.extend(feats[:, :m], drafter.embed(target, ids[:m])[None].expand(R, -1, -1), pos[:, :m])
    lvl = drafter.expand(feats[:, m:], drafter.embed(target, ids[m:])[None].expand(R, -1, -1), pos[:, m:],
                         torch.eye(3, dtype=torch.bool))  # fmt: skip
    return torch.cat([out[:, None], lvl], 1)


@pytest.mark.parametrize("fam", FAMILIES)
def test_bin_safetensors_and_converted_load_one_drafter(tiny_dirs: Path, tmp_path: Path, fam: str) -> None:
    from safetensors.torch import save_file

    from adtbench.tools.convert_drafter import main as convert

    src = tiny_dirs / f"{fam}_drafter"
    st = tmp_path / "st"
    st.mkdir()
    shutil.copy(src / "config.json", st / "config.json")
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(st / "model.safetensors"))
    assert convert([str(src), str(tmp_path / "conv")]) == 0
    assert json.loads((tmp_path / "conv" / "config.json").read_text())["vocab_size"] == CHAMELEON_ARCH["vocab_size"]
    t = target_of(tiny_dirs, fam)
    drafters = [drafter_of(p, t) for p in (src, st, tmp_path / "conv")]
    layouts = [read_drafter(p)[2] for p in (src, st, tmp_path / "conv")]
    assert layouts == ["public", "public", "adtbench"]
    ref = drafters[0].state_dict()
    assert ref["layers.0.self_attn.q_norm.weight"].shape == (HEADS, HD)  # Lumina's row expanded over the heads
    if fam == "lumina_mgpt":
        assert torch.equal(
            ref["layers.0.self_attn.q_norm.weight"], sd["layers.0.self_attn.q_norm.weight"].expand(HEADS, HD)
        )
    assert torch.equal(ref["embed_tokens.weight"], sd["embed_tokens.weight"])
    outs = [_outputs(d, t) for d in drafters]
    for d, o in zip(drafters[1:], outs[1:], strict=True):
        assert d.state_dict().keys() == ref.keys() and all(torch.equal(d.state_dict()[k], ref[k]) for k in ref)
        assert torch.equal(o, outs[0])


def test_the_stored_embedding_is_used_everywhere(tiny_dirs: Path, tmp_path: Path) -> None:
    """A drafter whose stored embedding differs from the target's: every drafter input (prompt, catch-up, tree
    levels, Jacobi drafts) comes from its own table — the target's ``embed_tokens`` is never called — and greedy
    decoding still equals AR (float64)."""
    src = tmp_path / "d"
    shutil.copytree(tiny_dirs / "anole_drafter", src)
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["embed_tokens.weight"] = sd["embed_tokens.weight"].flip(0)  # another table: rows permuted
    torch.save(sd, src / "pytorch_model.bin")
    t = target_of(tiny_dirs, "anole", "float64")
    drafter = drafter_of(src, t)
    ids = torch.arange(10)
    assert torch.equal(drafter.embed(t, ids), sd["embed_tokens.weight"][ids].double())
    assert not torch.equal(drafter.embed(t, ids), t.embed_tokens(ids))
    inputs = t.encode_prompt("a red circle", cfg=True)
    ar = decode_ar(t, inputs, GREEDY, None)

    def refused(ids: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the drafter read the target's embedding")

    t.embed_tokens = refused  # type: ignore[method-assign]
    tree = generate(t, drafter, Eagle2Policy(depth=2, top_k=3, total_tokens=8), inputs, GREEDY, None)
    scd = POLICIES.build("scd", {"window": 4, "init": "drafter"})
    chain = generate(t, JacobiModels(drafter, window=4), scd, inputs, GREEDY, torch.Generator().manual_seed(1))
    assert tree.tokens == ar.tokens and chain.tokens == ar.tokens


# ---------------------------------------------------------------------------------------------------------
# Bad checkpoints: ConfigError naming drafter.path
# ---------------------------------------------------------------------------------------------------------


def _edited(src: Path, dst: Path, edit, config_edit=None) -> Path:
    shutil.copytree(src, dst)
    sd = torch.load(dst / "pytorch_model.bin", weights_only=True)
    edit(sd)
    torch.save(sd, dst / "pytorch_model.bin")
    if config_edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


BAD = {
    "missing_key": (lambda sd: sd.pop("layers.0.self_attn.k_norm.bias"), None, "k_norm.bias"),
    "unexpected_key": (lambda sd: sd.update({"layers.0.self_attn.rotary.inv_freq": torch.ones(8)}), None, "unexpected"),
    "q_norm_shape": (lambda sd: sd.update({"layers.0.self_attn.q_norm.weight": torch.ones(3, HD)}), None, "q_norm"),
    "fc_shape": (lambda sd: sd.update({"fc.weight": torch.ones(H, H)}), None, "fc.weight"),
    "mlp_shape": (lambda sd: sd.update({"layers.0.mlp.up_proj.weight": torch.ones(96, H)}), None, "up_proj"),
    "bias_flag": (lambda sd: None, lambda c: c.update({"bias": False}), "bias"),
    "vocab_config": (lambda sd: None, lambda c: c.update({"vocab_size": 65536}), "vocab_size"),
    "wrong_vocab": (
        lambda sd: sd.update({"embed_tokens.weight": torch.ones(100, H)}),
        lambda c: c.update({"vocab_size": 100}),
        "100 rows",
    ),
    "rope_theta": (lambda sd: None, lambda c: c.update({"rope_theta": 5e5}), "rope_theta"),
    "layers": (lambda sd: None, lambda c: c.update({"num_hidden_layers": 2}), "num_hidden_layers"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_checkpoint_that_does_not_fit_names_drafter_path(tiny_dirs: Path, tmp_path: Path, case: str) -> None:
    edit, config_edit, words = BAD[case]
    bad = _edited(tiny_dirs / "anole_drafter", tmp_path / case, edit, config_edit)
    t = target_of(tiny_dirs, "anole")
    with pytest.raises(ConfigError, match=words) as ei:
        drafter_of(bad, t)
    assert ei.value.key == "drafter.path" and str(bad) in str(ei.value)
    from adtbench.tools.convert_drafter import main as convert

    fits_elsewhere = case in ("wrong_vocab", "rope_theta")  # a consistent checkpoint, for another target
    assert convert([str(bad), str(tmp_path / "out")]) == (0 if fits_elsewhere else 2)


def test_a_folder_without_weights_or_for_another_target_names_drafter_path(
    tiny_dirs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = target_of(tiny_dirs, "anole")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id is fetched, never guessed at: offline, a ConfigError
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE") as ei:
        drafter_of(Path("jadohu/anole_drafter"), t)
    assert ei.value.key == "drafter.path"
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(tiny_dirs / "anole_drafter" / "config.json", empty / "config.json")
    with pytest.raises(ConfigError, match=r"pytorch_model\.bin or model\.safetensors") as ei:
        drafter_of(empty, t)
    assert ei.value.key == "drafter.path"
    bare = tmp_path / "bare"  # LANTERN's weights without their config
    bare.mkdir()
    shutil.copy(tiny_dirs / "anole_drafter" / "pytorch_model.bin", bare / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"no config\.json") as ei:
        drafter_of(bare, t)
    assert ei.value.key == "drafter.path"
    from adtbench.harness.drafters import eagle_config_for  # an adtbench-layout drafter of another hidden size

    wide = tmp_path / "wide"
    wide.mkdir()
    dcfg = eagle_config_for(t, {})
    dcfg.hidden_size, dcfg.num_heads = 128, 8
    from safetensors.torch import save_file

    save_file(EagleDrafter(dcfg, Rope1D(HD)).state_dict(), str(wide / "model.safetensors"))
    (wide / "config.json").write_text(json.dumps(dcfg.to_dict()))
    with pytest.raises(ConfigError, match="hidden size 128") as ei:
        drafter_of(wide, t)
    assert ei.value.key == "drafter.path"


# ---------------------------------------------------------------------------------------------------------
# The ADT-Tree README's setting, from the command line
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES)
def test_readme_setting_from_the_command_line(tiny_dirs: Path, tmp_path: Path, fam: str) -> None:
    """``make-tiny model=anole`` + ``make-tiny model=anole_drafter`` (the fixture), then ``run.py model=anole
    drafter.path=<LANTERN folder> policy=adt lantern=on sampling=greedy`` (the ADT-Tree README's setting; Lumina-mGPT
    alike): it runs with the drafter as published and greedy output equals AR's."""
    out = tmp_path / "run"
    proc = run_in_process(
        f"model={fam}", f"model.path={tiny_dirs / fam}", f"drafter.path={tiny_dirs / (fam + '_drafter')}",
        "policy=adt", "lantern=on", "sampling=greedy", "baseline=true", "dataset=smoke", "dataset.limit=1",
        "model.device=cpu", "model.dtype=float64", "warmup=0", "progress=false", "maps.per_run=false",
        f"paths.output_dir={tmp_path / 'outputs'}", f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={out}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["greedy_matches_baseline"] is True and s["policy"] == "adt" and s["lantern"] is True
    assert s["n_samples"] == 1 and s["drafter"] == "eagle" and s["cycles_total"] > 0
    resolved = OmegaConf.load(out / ".hydra" / "config.yaml")
    assert resolved.drafter.path == str(tiny_dirs / f"{fam}_drafter")


def test_the_precheck_reads_lanterns_file_names(tiny_dirs: Path, tmp_path: Path) -> None:
    """Before any model loads (``config.validate`` / Jacobi's ``init=drafter`` check): a LANTERN folder passes on its
    ``pytorch_model.bin``, a truncated one is ``corrupt`` naming ``drafter.path``, a hub id is left to the loader."""
    from adtbench.harness.drafters import check_path

    check_path(tiny_dirs / "anole_drafter")
    check_path("jadohu/anole_drafter")
    bad = tmp_path / "bad"
    shutil.copytree(tiny_dirs / "anole_drafter", bad)
    data = (bad / "pytorch_model.bin").read_bytes()
    (bad / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    for value, words in ((bad, "corrupt"), (tmp_path / "nope", "no drafter checkpoint")):
        with pytest.raises(ConfigError, match=words) as ei:
            check_path(value)
        assert ei.value.key == "drafter.path"
