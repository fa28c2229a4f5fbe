"""Janus-Pro (``model=janus_pro``, ``adtbench.models.janus``) on a tiny random checkpoint in the HF-converted layout.

- The lean target's raw logits equal transformers' ``JanusForConditionalGeneration`` (its ``language_model`` on the
  embeddings ``generate`` feeds, its ``generation_head``) within 1e-5 in float32: the prefill and cached steps (AR
  steps and a chain), both CFG rows; the ``hf`` target (the reference implementation) too.
- The CFG rows are ``generate``'s (every prompt token but BOS and ``<begin_of_image>`` replaced by the pad token),
  and greedy decoding at CFG 5 equals ``generate(..., generation_mode="image", guidance_scale=5, do_sample=False)``
  token for token over the whole tiny image (16 tokens).
- Images decode through ``JanusVQVAE`` (equal to its own ``decode``) to 16 × 16 px.
- Greedy ``ar`` / ``scd`` / ``sjd`` (and ``gsd``, ``sjd_pac``) equal AR; SCD's law at T = 1 is AR's
  (``adtbench/algorithm/laws.py``).
- The app: ``make-tiny model=janus_pro``, ``run.py model=janus_pro model.path=DIR policy=scd`` writes images, a
  drafting policy without ``drafter.path`` names how to train a drafter, bad keys name themselves.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import run_in_process
from omegaconf import OmegaConf

from adtbench.algorithm import laws as L
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies import POLICIES
from adtbench.errors import ConfigError
from adtbench.harness.config import register_resolvers
from adtbench.models.registry import build_target
from adtbench.sampling_params import SamplingParams
from adtbench.tools.make_tiny import write_tiny

ROOT = Path(__file__).resolve().parents[1]
TEXT = "a red cat on a mat"
register_resolvers()
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """The tiny Janus-Pro folder and the in-memory ``JanusForConditionalGeneration`` it was written from."""
    out = tmp_path_factory.mktemp("janus") / "janus_pro"
    return out, write_tiny("janus_pro", out, seed=0)["model"]


def model_cfg(path: Path | str, dtype: str = "float32", **over):
    cfg = OmegaConf.load(ROOT / "conf" / "model" / "janus_pro.yaml")
    cfg.path, cfg.device, cfg.dtype = str(path), "cpu", dtype
    for k, v in over.items():
        OmegaConf.update(cfg, k, v, merge=True)
    return cfg


_TARGETS: dict[tuple, object] = {}


def target(path: Path, **over):
    key = (str(path), tuple(sorted(over.items())))
    if key not in _TARGETS:
        _TARGETS[key] = build_target(model_cfg(path, **over))
    return _TARGETS[key]


# ---------------------------------------------------------------------------------------------------------
# The checkpoint and the prompt rows
# ---------------------------------------------------------------------------------------------------------


def test_tiny_checkpoint_has_the_hf_layout(tiny) -> None:
    out, _ = tiny
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "preprocessor_config.json", "processor_config.json"} <= names  # fmt: skip
    shards = sorted(n for n in names if n.startswith("model-") and n.endswith(".safetensors"))
    assert len(shards) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index.values()) == set(shards)
    for key in ("model.generation_embeddings.weight", "model.generation_aligner.fc1.weight",
                "model.generation_head.vision_head.weight", "model.language_model.layers.0.self_attn.q_proj.weight",
                "model.vqmodel.quantize.embedding.weight", "model.vqmodel.decoder.conv_out.weight"):  # fmt: skip
        assert key in index, key
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "janus" and config["architectures"] == ["JanusForConditionalGeneration"]
    assert config["vq_config"]["num_embeddings"] == 64 and config["text_config"]["model_type"] == "llama"
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(str(out))
    assert type(proc).__name__ == "JanusProcessor" and proc.tokenizer.boi_token == "<begin_of_image>"


def test_layout_and_cfg_rows_are_generates(tiny) -> None:
    """576-token layout's tiny form (4 × 4 codes, token id = code, no EOL) and the uncond row ``generate`` builds:
    the prompt with every token but BOS and boi replaced by pad, every column attended, positions 0 … P − 1."""
    out, ref = tiny
    t = target(out)
    lay = t.layout
    assert (lay.vocab_size, lay.image_token_offset, lay.num_codes, lay.grid_h, lay.grid_w) == (64, 0, 64, 4, 4)
    assert lay.eol_token is None and lay.eoi_token is None and lay.num_gen_tokens == 16
    inp = t.encode_prompt(TEXT, cfg=True)
    ids, valid, pos = (inp.data[k] for k in ("ids", "valid", "positions"))
    gen = ref.generation_config
    bos, pad, boi = gen.bos_token_id, gen.pad_token_id, gen.generation_kwargs["boi_token_id"]
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(str(out))
    want = proc(text=t.template.format(text=TEXT), generation_mode="image", return_tensors="pt")["input_ids"][0]
    assert ids[0].tolist() == want.tolist() and ids[0, 0] == bos and ids[0, -1] == boi
    uncond = ids[0].clone().masked_fill((ids[0] != bos) & (ids[0] != boi), pad)  # generate's masking, step 7
    assert ids[1].tolist() == uncond.tolist() and (ids[1] == pad).sum() == ids.shape[1] - 2
    assert valid.all() and (pos == torch.arange(ids.shape[1])).all()
    assert t.encode_prompt(TEXT, cfg=False).data["ids"].shape[0] == 1


# ---------------------------------------------------------------------------------------------------------
# Logits against transformers
# ---------------------------------------------------------------------------------------------------------


def reference_logits(ref, ids: torch.Tensor, steps: list[torch.Tensor]) -> list[torch.Tensor]:
    """transformers' logits as ``generate`` computes them: the prompt rows through ``language_model`` on
    ``embed_tokens``, then each step's codes (``[n]``, the same for both rows) through
    ``prepare_embeddings_for_image_generation``, the generation head on every position; one cache throughout."""
    from transformers import DynamicCache

    lm, cache = ref.model.language_model, DynamicCache(config=ref.config.text_config)
    R, P = ids.shape
    with torch.no_grad():
        h = lm(inputs_embeds=lm.embed_tokens(ids), past_key_values=cache, use_cache=True).last_hidden_state
        out = [ref.model.generation_head(h[:, -1:])]
        seen = P
        for codes in steps:
            x = ref.prepare_embeddings_for_image_generation(codes[None].expand(R, -1))
            pos = torch.arange(seen, seen + codes.numel())[None].expand(R, -1)
            h = lm(inputs_embeds=x, position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state
            out.append(ref.model.generation_head(h))
            seen += codes.numel()
    return out


@pytest.mark.parametrize("impl", ["lean", "hf"])
def test_logits_equal_transformers_float32(tiny, impl: str) -> None:
    """Prefill, three AR steps and a 4-token chain (cached), both CFG rows: within 1e-5 of transformers."""
    out, ref = tiny
    t = target(out, impl=impl)
    inp = t.encode_prompt(TEXT, cfg=True)
    steps = [torch.tensor([c]) for c in (7, 63, 0)] + [torch.tensor([5, 17, 42, 9])]
    want = reference_logits(ref, inp.data["ids"], steps)
    res = t.start(inp, 8)
    assert res.ids is None and res.input_embeds.shape == (2, inp.data["ids"].shape[1], 64)
    torch.testing.assert_close(res.logits, want[0][:, 0], atol=1e-5, rtol=0)
    for codes, w in zip(steps, want[1:]):
        n = codes.numel()
        logits, feats = t.verify_forward(codes, torch.ones(n, n, dtype=torch.bool).tril(), torch.arange(n))
        torch.testing.assert_close(logits, w, atol=1e-5, rtol=0)
        assert feats.shape == (2, n, 64)
        t.commit(torch.arange(n), in_place=True)
    assert want[0].std() > 0.3 and (want[0][0] - want[0][1]).abs().max() > 1e-2  # spread, and the rows differ
    torch.testing.assert_close(t.lm_head(feats), w, atol=1e-5, rtol=0)
    torch.testing.assert_close(t.embed_tokens(steps[0]), ref.prepare_embeddings_for_image_generation(steps[0]))


def test_tree_verify_equals_sequential(tiny) -> None:
    """A branching tree in one forward equals each path's tokens one step at a time (the lean static cache)."""
    from adtbench.algorithm.tree import DraftTree

    out, _ = tiny
    t = target(out, dtype="float64")
    one, zero = torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
    tree = DraftTree(tokens=torch.tensor([5, 17, 30, 41, 2]), parents=[-1, 0, 0, 1, 2], drafted_depth=2)
    t.start(t.encode_prompt(TEXT, cfg=True), tree.size)
    tree_logits, _ = t.verify_forward(tree.tokens, tree.ancestor_mask, tree.depth)
    for node in range(tree.size):
        t.start(t.encode_prompt(TEXT, cfg=True), tree.size)
        for tok in tree.tokens[tree.path_to(node)].tolist():
            logits, _ = t.verify_forward(torch.tensor([tok]), one, zero)
            t.commit(zero)
        torch.testing.assert_close(tree_logits[:, node], logits[:, 0], atol=1e-10, rtol=0)


def test_greedy_cfg_equals_transformers_generate(tiny) -> None:
    """Greedy at CFG 5: our AR decode equals ``JanusForConditionalGeneration.generate(generation_mode="image",
    guidance_scale=5, do_sample=False)`` on the same checkpoint and prompt — all 16 tokens of the tiny image (its
    ``ClassifierFreeGuidanceLogitsProcessor``: ``u + 5·(c − u)`` on raw logits, the pad-token uncond row)."""
    out, ref = tiny
    t = target(out)
    inp = t.encode_prompt("two dogs", cfg=True)  # a prompt whose greedy image is not one repeated code
    ids = inp.data["ids"][:1]
    with torch.no_grad():
        want = ref.generate(
            inputs=ids, attention_mask=torch.ones_like(ids), generation_mode="image", do_sample=False,
            guidance_scale=5.0,
        )  # fmt: skip
    ours = decode_ar(t, inp, SamplingParams(temperature=0.0, cfg_scale=5.0), None).tokens
    assert want.shape == (1, 16) and ours[:16] == want[0].tolist()
    assert len(set(ours)) >= 3  # not a constant image
    plain = decode_ar(t, t.encode_prompt("two dogs", cfg=False), SamplingParams(temperature=0.0, cfg_scale=1.0), None)
    assert plain.tokens != ours  # CFG changes the image (the comparison above has teeth)


def test_image_decodes_through_janus_vqvae(tiny) -> None:
    out, ref = tiny
    t = target(out)
    codes = torch.arange(16).view(4, 4) * 3 % 64
    img = t.decode_image(codes)
    assert img.shape == (16, 16, 3) and img.dtype.name == "uint8" and img.std() > 0
    with torch.no_grad():
        want = ref.model.vqmodel.decode(codes.reshape(1, -1))  # transformers' own decode (4 × 4 = num_patches²)
    torch.testing.assert_close(t.vq.decode_codes(codes.reshape(1, -1), 4, 4), want, atol=1e-5, rtol=0)
    assert t.vq.codebook().shape == (64, 8) and t.vq.downsample_factor == 4


# ---------------------------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["lean", "hf"])
def test_greedy_jacobi_equals_ar(tiny, impl: str) -> None:
    out, _ = tiny
    t = target(out, impl=impl)
    sp = SamplingParams(temperature=0.0, cfg_scale=5.0)
    inp = t.encode_prompt("a blue house by the sea", cfg=True)  # greedy: a 2-periodic image, not one code
    ar = decode_ar(t, inp, sp, None)
    assert len(set(ar.tokens)) >= 2
    cases = [("ar", {}), ("scd", {"window": 16, "init": "random", "proposal": "point"}), ("scd", {"window": 4}),
             ("sjd", {"window": 16, "init": "random"}), ("gsd", {"window": 8}), ("sjd_pac", {"window": 8})]  # fmt: skip
    for name, node in cases:
        res = generate(t, None, POLICIES.build(name, node), inp, sp, torch.Generator().manual_seed(1))
        assert res.tokens == ar.tokens, (name, node)
        assert len(res.tokens) == 16 and res.target_forwards <= 16


@pytest.mark.slow
def test_scd_law_at_t1(tiny, record_property) -> None:
    """SCD (the preset's random init with the one-hot proposal and coupled redraws, L = 3) at T = 1, CFG 5, top-k 2
    on a 2 × 2 image of the tiny Janus-Pro (float64): the χ² law test against AR's exact law
    (``adtbench/algorithm/laws.py``)."""
    out, _ = tiny
    t = build_target(model_cfg(out, dtype="float64"))
    t.layout = dataclasses.replace(t.layout, grid_h=2, grid_w=2)
    sp = SamplingParams(temperature=1.0, top_k=2, cfg_scale=5.0)
    inp = t.encode_prompt(TEXT, cfg=True)
    law = L.exact_law(t, inp, sp)
    assert len(law) == 16
    n, g = 2000, torch.Generator().manual_seed(0)
    pol = POLICIES.build("scd", {"window": 3, "init": "random", "proposal": "point", "redraw": "coupled"})
    counts, accepted = Counter(), 0
    with t.reuse_prefill(inp):  # the prompt's prefill run once (tests/test_prefill_reuse.py)
        for _ in range(n):
            res = generate(t, None, pol, inp, sp, g)
            counts[tuple(res.tokens)] += 1
            accepted += sum(c.accepted for c in res.cycles)
    r = L.report(L.chi2_law("scd janus_pro t1", counts, law, n), record_property)
    assert accepted > 0.1 * n, accepted  # drafts were accepted: the acceptance and redraw paths ran
    assert r.tv90 <= 0.095, r.line()
    assert r.pvalue > L.ALPHA, r.line()


# ---------------------------------------------------------------------------------------------------------
# Config errors and the app
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "over,key",
    [
        ({"size": "3B"}, "model.size"),
        ({"prompt_template": "no caption here"}, "model.prompt_template"),
        ({"random_init": True}, "model.random_init"),
        ({"impl": "fast"}, "model.impl"),
        ({"grid": [0, 4]}, "model.grid"),
    ],
)
def test_bad_keys_name_themselves(tiny, over: dict, key: str) -> None:
    out, _ = tiny
    with pytest.raises(ConfigError) as e:
        build_target(model_cfg(out, **over))
    assert e.value.key == key


def test_paths_name_the_key(tiny, tmp_path: Path) -> None:
    out, _ = tiny
    with pytest.raises(ConfigError) as e:
        build_target(model_cfg(tmp_path / "nope"))
    assert e.value.key == "model.path"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "other" / "model.safetensors").write_bytes((out / "model-00001-of-00004.safetensors").read_bytes())
    with pytest.raises(ConfigError, match=r"expected 'janus'") as e:
        build_target(model_cfg(tmp_path / "other"))
    assert e.value.key == "model.path"


def test_size_picks_the_hub_id() -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["model=janus_pro"])
        small = compose("config", overrides=["model=janus_pro", "model.size=1B"])
    assert cfg.model.path == "deepseek-community/Janus-Pro-7B" and small.model.path == "deepseek-community/Janus-Pro-1B"
    assert cfg.model.published_drafters == []


def test_app_decodes_and_writes_images(tiny, tmp_path: Path) -> None:
    """``python run.py model=janus_pro model.path=<tiny> policy=scd`` on two prompts: images through the VQ decoder;
    with ``timing.reference_baseline=true`` the AR baseline is timed through transformers' classes too."""
    out, _ = tiny
    run = tmp_path / "run"
    r = run_in_process("model=janus_pro", f"model.path={out}", "policy=scd", "dataset=smoke", "dataset.limit=2",
                       f"hydra.run.dir={run}", "model.dtype=float32", "timing.reference_baseline=true")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "model=janus_pro policy=scd" in r.stdout and "speedup_ref=" in r.stdout
    pngs = sorted((run / "images").glob("*.png"))
    assert len(pngs) == 2
    from PIL import Image

    assert Image.open(pngs[0]).size == (16, 16)
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(row["tokens"]) == 16 for row in rows)


def test_batched_decoding_equals_single(tiny, tmp_path: Path) -> None:
    """``decode.batch_size=3`` (continuous batching over the lean static cache, ``models.batch``) with greedy SCD at
    CFG 5 in float64: every prompt's tokens equal its B = 1 run's."""
    out, _ = tiny
    tokens = {}
    for b in (1, 3):
        run = tmp_path / f"b{b}"
        r = run_in_process("model=janus_pro", f"model.path={out}", "policy=scd", "sampling=greedy",
                           "sampling.cfg_scale=5.0", "dataset=smoke", "dataset.limit=3", "model.dtype=float64",
                           "save_images=false", f"decode.batch_size={b}", f"hydra.run.dir={run}")  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        tokens[b] = {row["prompt_id"]: row["tokens"] for row in rows}
        assert json.loads((run / "summary.json").read_text()).get("batch_size", 1) == b
    assert len(tokens[1]) == 3 and tokens[3] == tokens[1]


def test_tree_policy_without_a_drafter_says_how_to_train_one(tiny, tmp_path: Path) -> None:
    out, _ = tiny
    r = run_in_process("model=janus_pro", f"model.path={out}", "policy=eagle2", "dataset=smoke", "dataset.limit=1",
                       f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert r.returncode != 0
    err = r.stderr + r.stdout
    assert "drafter.path" in err and "no public EAGLE drafter for model=janus_pro" in err
    assert "adtbench train drafter model=janus_pro" in err


def test_engine_compile_runs_the_static_buckets_on_the_simulated_device(tiny, tmp_path: Path) -> None:
    """``engine.compile=true`` on the simulated CUDA device (``ADTBENCH_SIMULATE_DEVICE=cuda``: the graph stand-in)
    pins the static cache and verifies through captured buckets; the tokens equal the eager run's."""
    out, _ = tiny
    runs = {}
    for name, extra in (("eager", ()), ("graphs", ("engine.compile=true",))):
        run = tmp_path / name
        r = run_in_process("model=janus_pro", f"model.path={out}", "policy=scd", "sampling=greedy",
                           "sampling.cfg_scale=5.0", "dataset=smoke", "dataset.limit=1", "model.dtype=float32",
                           "save_images=false", f"hydra.run.dir={run}", *extra,
                           env={"ADTBENCH_SIMULATE_DEVICE": "cuda"})  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = [json.loads(line)["tokens"] for line in (run / "samples.jsonl").read_text().splitlines()]
        summary = json.loads((run / "summary.json").read_text())
        if name == "graphs":  # the static buckets were captured (the stand-in graphs) and replayed
            assert summary["graph_capture_s"] is not None, summary
            assert summary["simulated_device"]["graph_replays"] > 0, summary["simulated_device"]
    assert runs["graphs"] == runs["eager"]


# ---------------------------------------------------------------------------------------------------------
# On the device (``pytest -m gpu tests/test_janus.py``; skipped without CUDA, ``ADTBENCH_SIMULATE_DEVICE=cuda`` runs
# them on the simulated device, ``ADTBENCH_GPU_TEST_DEVICE=cpu`` on the plain CPU: ``tests/test_gpu.py``'s modes)
# ---------------------------------------------------------------------------------------------------------

GPU_DEVICE = os.environ.get("ADTBENCH_GPU_TEST_DEVICE", "cuda")


@pytest.mark.gpu
def test_cuda_graphs_replay_the_eager_decode(tiny) -> None:
    """``engine.compile`` on the device: with every verify of the lean target through captured CUDA graphs over the
    pinned cache, greedy AR, SCD and SJD at CFG 5 give the eager target's tokens, prompt after prompt."""
    out, _ = tiny
    eager = build_target(model_cfg(out, device=GPU_DEVICE))
    graphed = build_target(model_cfg(out, device=GPU_DEVICE))
    graphed.request_static(graphs=GPU_DEVICE == "cuda")
    sp = SamplingParams(temperature=0.0, cfg_scale=5.0)
    for prompt in ("two dogs", "a blue house by the sea"):
        ins_e, ins_g = eager.encode_prompt(prompt, cfg=True), graphed.encode_prompt(prompt, cfg=True)
        ar = decode_ar(eager, ins_e, sp, None).tokens
        assert decode_ar(graphed, ins_g, sp, None).tokens == ar
        for name, node in (("scd", {"window": 16, "init": "random", "proposal": "point"}), ("sjd", {"window": 8})):
            res = generate(graphed, None, POLICIES.build(name, node), ins_g, sp, torch.Generator().manual_seed(1))
            assert res.tokens == ar, (prompt, name)
        assert graphed.cache is graphed.pinned
    if GPU_DEVICE == "cuda":
        assert graphed.static.capture_s > 0 and all(s.graph is not None for s in graphed.static.steps.values())


@pytest.mark.gpu
def test_lean_and_hf_agree_on_the_device(tiny) -> None:
    """On the device, float32: lean and transformers' logits within 1e-4 (prefill and a cached chain, both rows);
    bfloat16: the lean path no further from the float32 reference than transformers' bf16 path is (+ 0.05)."""
    out, ref = tiny
    steps = [torch.tensor([5, 17, 42, 9])]
    errs = {}
    for dtype in ("float32", "bfloat16"):
        got = {}
        for impl in ("lean", "hf"):
            t = build_target(model_cfg(out, dtype=dtype, device=GPU_DEVICE, impl=impl))
            inp = t.encode_prompt(TEXT, cfg=True)
            res = t.start(inp, 8)
            chain, _ = t.verify_forward(steps[0], torch.ones(4, 4, dtype=torch.bool).tril(), torch.arange(4))
            got[impl] = torch.cat([res.logits[:, None], chain], 1).float().cpu()
        want = torch.cat(reference_logits(ref, inp.data["ids"], steps), 1)
        errs[dtype] = {impl: (g - want).abs().max().item() for impl, g in got.items()}
    assert errs["float32"]["lean"] <= 1e-4 and errs["float32"]["hf"] <= 1e-4, errs
    assert errs["bfloat16"]["lean"] <= errs["bfloat16"]["hf"] + 0.05, errs
