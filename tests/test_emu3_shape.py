"""The Emu3-Gen shape's probe (``MODELS=emu3 benchmarks/gpu.sh probe``, issue 42 item 5) on the CPU, through the code
path a GPU runs: the simulated CUDA device (``accel.simulate()``: CUDA's placement rules, counted synchronisations,
the CUDA-graph stand-in) and ``engine.compile=true`` (static buckets over one pinned cache, every (node bucket,
attention width) pair captured), at the REAL token layout and a reduced network.

What is real: the 90 × 90 grid with an end-of-line token after every row and the end-of-frame after the last (8,191
generated tokens), hence an 8k-token sequence (a pinned cache past 8,400 columns, its eight attention widths, the
half-image fill of 4,095 tokens); GQA with 8 K/V heads (16 query heads); 32,768 image codes as ordinary ids past the
text and special tokens; CFG rows with the negative prompt; the gpu.sh probe stage's overrides (checked against the
script). What is reduced, and why: width 32 over 2 layers (head dim 2), and the vocabulary to 34,003 ids — the 211
specials and 32,768 codes of Emu3-Gen's map with 1,024 text ids instead of 151,643 — since every verify writes
``[rows, nodes, V]`` logits and a 184,622-wide row made the stage 3× slower on the CPU (a stated reduction: the
image-token span the head computes, 32,776 rows, is Emu3-Gen's). Sampling is greedy (the short decode's check).

One run of ``bench probe`` in process (the CLI's entry, ``tools.bench.main``) is checked for structure, not time:
verify(n) for n in 1, 2, 32 replayed through the captured graphs (graphed = eager logits in float32), the AR step
graphed (one replay per step) and eager, continuing from the half-filled cache; the weight bytes and the tighter
bytes-an-AR-step-reads figure against the arch's own count; the SCD 32 overhead run (the gpu.sh stage policy) through
the device-resident Jacobi step (``jacobi.step.JacobiStep``: one host read per image) over the first row of each
image (``bench.overhead_tokens``: whole 8,191-token images cost 5 minutes here; a GPU runs them whole). The overhead
run's measured image, greedy SCD through the Jacobi step, equals AR's greedy tokens on the same captured target over
that row, its forced end-of-line and 5 more."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from adtbench import accel
from adtbench.algorithm.ar import ar_step, prefill_token
from adtbench.algorithm.methods.jacobi.step import JacobiStep
from adtbench.algorithm.policies import jacobi as jacobi_policy
from adtbench.models.emu3.target import SPECIALS_AFTER_TEXT
from adtbench.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"
GRID, CODES, TEXT_IDS = 90, 32768, 1024
VOCAB = TEXT_IDS + SPECIALS_AFTER_TEXT + CODES  # 34,003: Emu3-Gen's map with 1,024 text ids (module docstring)
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 32, 64, 2, 16, 8
# what EMU3_ARCH appends to gpu.sh's emu3 overrides here (empty on a GPU: the 8B shape)
ARCH = [
    f"model.arch.vocab_size={VOCAB}",
    f"model.arch.num_codes={CODES}",
    f"model.arch.hidden_size={HIDDEN}",
    f"model.arch.intermediate_size={FFN}",
    f"model.arch.num_hidden_layers={LAYERS}",
    f"model.arch.num_attention_heads={HEADS}",
    f"model.arch.num_key_value_heads={KV_HEADS}",
    "model.dtype=float32",
]
BUCKETS = [1, 2, 32]
OVERHEAD = SHORT = GRID + 1 + 5  # the overhead run's tokens per image (the greedy check's): a row, its EOL, 5 more


def _script_overrides() -> list[str]:
    """gpu.sh's probe-stage overrides for ``MODELS=emu3`` with ``DEVICE=cuda``, read from the script (its ``over_of``
    line and the default ``STAGE_POLICY``), so that this test runs what the GPU session will."""
    text = SCRIPT.read_text()
    over = re.search(r"^\s*emu3\) over=\((.*)\) ;;$", text, re.M)
    policy = re.search(r"^STAGE_POLICY=\$\{STAGE_POLICY-(.*)\}", text, re.M)
    assert over is not None and policy is not None, "gpu.sh's emu3 overrides or STAGE_POLICY moved"
    words = over.group(1).replace('"model.device=$DEVICE"', "model.device=cuda").split()
    assert words[-1] == "$EMU3_ARCH"
    return [*words[:-1], *ARCH, *policy.group(1).split()]


@pytest.mark.slow
def test_the_emu3_shape_probe_runs_through_the_graphs_at_the_real_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adtbench.tools import bench

    monkeypatch.setenv("ADTBENCH_ROOT", str(tmp_path))
    models: dict[str, Any] = {}
    images: list[int] = []  # the device-resident step's images
    decodes: list[tuple[Any, list[int]]] = []  # the SCD policy's decodes: (prompt rows, tokens)
    real_overhead, real_run_image, real_decode = bench.overhead, JacobiStep.run_image, jacobi_policy.decode_jacobi

    def overhead(cfg: Any, target: Any = None, drafter: Any = None) -> dict:
        models["target"] = target  # the probe's compiled target, kept for the greedy check below
        return real_overhead(cfg, target=target, drafter=drafter)

    def run_image(self: JacobiStep, *a: Any, **k: Any) -> Any:
        images.append(1)
        return real_run_image(self, *a, **k)

    def decode_jacobi(target: Any, inputs: Any, *a: Any, **k: Any) -> Any:
        res = real_decode(target, inputs, *a, **k)
        decodes.append((inputs, list(res.tokens)))
        return res

    monkeypatch.setattr(bench, "overhead", overhead)
    monkeypatch.setattr(JacobiStep, "run_image", run_image)
    monkeypatch.setattr(jacobi_policy, "decode_jacobi", decode_jacobi)
    out = tmp_path / "probe.json"
    args = [*_script_overrides(), "sampling=greedy", "bench.repeats=2", "bench.prompts=1"]
    args += [f"bench.overhead_tokens={OVERHEAD}"]
    args += [f"bench.buckets=[{','.join(map(str, BUCKETS))}]", "dataset=mini", f"bench.out={out}"]
    with accel.simulate() as sim:
        assert bench.main(["probe", *args]) == 0
        r = json.loads(out.read_text())
        target = models["target"]
        lay = target.layout

        # the real layout, GQA, the reduced vocabulary as stated
        assert (lay.grid_h, lay.grid_w, lay.row_len, lay.num_gen_tokens) == (90, 90, 91, 8191)
        assert lay.eol_token is not None and lay.eoi_token == lay.eol_token + 1
        assert (lay.vocab_size, lay.num_codes, lay.image_token_offset) == (VOCAB, CODES, VOCAB - CODES)
        assert (target.num_heads, target.num_kv_heads) == (HEADS, KV_HEADS)
        assert r["model"] == "emu3" and r["cfg_rows"] == 2 and r["dtype"] == "float32"
        assert r["device"] == "simulated cuda (cpu)" and r["timing"] == "perf_counter marks (no GPU figure)"
        # the 8k sequence: half the image in the cache, a pinned capacity past the whole image plus the largest bucket
        prompt = target.prompt_length(target.encode_prompt("a large red circle on a striped blue background", True))
        assert r["kv_len"] == prompt + 8191 // 2
        assert r["pinned_capacity"]["target"] >= prompt + 8191 + 128
        assert target.static.widths[-1] == r["pinned_capacity"]["target"] and len(target.static.widths) == 8

        # verify(n) against n: every bucket replayed through its captured graph, graphed = eager logits (float32)
        v = r["verify"]
        assert [x["bucket"] for x in v] == BUCKETS and [x["routed_to"] for x in v] == BUCKETS
        assert all(x["argmax_agree"] == 1.0 and x["max_abs_diff"] < 1e-4 and x["rel_diff"] < 1e-5 for x in v)
        assert v[0]["x_step"] == 1.0 and all(x["x_step"] > 0 for x in v) and all(x["floor_x"] is None for x in v)

        # the AR step: graphed one replay per step, eager none; continued from the half-filled cache (no refill)
        ar = r["ar_step"]
        assert ar["graphed_work"]["graph_replays"] == 1 and ar["eager_work"]["graph_replays"] == 0
        assert r["kv_len"] < ar["kv_len"] <= r["kv_len"] + 2 * (2 + 2 + 1 + 3)

        # the weight-read floor's bytes (every parameter: the tied head / embedding once), and the bytes an AR step
        # reads: the head's span (end-of-line … last code: the 32,768 codes, 6 specials between, the end-of-frame)
        layer = HIDDEN * (HIDDEN + 2 * (HIDDEN // HEADS) * KV_HEADS) + HIDDEN * HIDDEN + 3 * HIDDEN * FFN
        net = target.net
        mats = 1 if net.output.weight.data_ptr() == net.tok_embeddings.weight.data_ptr() else 2  # one storage or two
        assert r["weight_bytes"] == 4 * (LAYERS * layer + mats * VOCAB * HIDDEN + HIDDEN)
        span = lay.image_token_offset + CODES - lay.eol_token
        assert span == CODES + 8 and target.head_span() == (lay.eol_token, VOCAB)
        rows_read = span + (0 if mats == 1 else 2)  # the head's span; an untied embedding: the 2 CFG rows' token
        assert r["step_read_bytes"] == 4 * (LAYERS * layer + rows_read * HIDDEN + HIDDEN)
        assert r["weight_read_ms"] is None and r["step_read_ms"] is None and r["step_read_x"] is None

        # the Jacobi forward's overhead: SCD 32 on the first OVERHEAD tokens of an image (the warm-up and one prompt),
        # through the device-resident step and its captured graphs, one host read per image
        o = r["overhead"]
        assert o["policy"] == "scd" and o["engine_mode"] == "graphs"  # compiled by the probe, not by the overhead's job
        assert len(images) == 2 and o["prompts"] == 1 and OVERHEAD / 32 < o["cycles"] <= OVERHEAD
        assert o["graph_replays_per_cycle"] >= 1 and o["syncs_per_cycle"] == pytest.approx(1 / o["cycles"])
        assert r["goals"]["syncs_per_cycle"]["met"] is True and r["goals"]["step_floor_x"]["met"] is None
        assert sim.counts["graph_replays"] > o["cycles"]

        # greedy SCD through the Jacobi step (the overhead run's measured image) = AR's greedy tokens, on the probe's
        # captured target
        assert len(decodes) == 2 and all(len(t) >= OVERHEAD for _, t in decodes)
        inputs, jac = decodes[-1]
        sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
        token, _ = prefill_token(target, inputs, sp, 1, None)
        ar_tokens = [int(token)]
        for g in range(1, SHORT):
            token = ar_step(target, token, g, sp, None)[0]
            ar_tokens.append(int(token))
    assert jac[:SHORT] == ar_tokens
    assert ar_tokens[90] == lay.eol_token  # the forced end-of-line token
    codes = [t for i, t in enumerate(ar_tokens) if i % 91 != 90]
    assert all(lay.image_token_offset <= t < VOCAB for t in codes) and len(set(codes)) > 1  # not one repeated code
