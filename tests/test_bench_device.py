"""The bench tools on the simulated CUDA device (``accel.simulate()``: CUDA's placement rules, counted
synchronisations, the CUDA-graph stand-in), with tiny models and a prompt or two: ``bench overhead`` (plain, phases,
count), ``cost``, ``probe``, ``batch`` and ``versus`` run with no placement violation, graph replays count as model
time, and the cost model is measured in the state a run replays (``benchmarks/gpu.sh``'s smoke,
tests/test_gpu_script.py, covers ``bench speed``'s app jobs the same way)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import static_runs, tiny

from adtbench import accel
from adtbench.tools.bench import TREE_STEP
from adtbench.tools.bench import main as bench_main

TINY = [
    "model=tiny_llamagen",
    "drafter=eagle",
    "policy=static_sampled",
    "dataset=smoke",
    "model.device=cuda",
    "threads=1",
]
SHRUNK_ANOLE = ["model=anole", "model.random_init=true", "model.arch.hidden_size=32", "model.arch.intermediate_size=64",
                "model.arch.num_hidden_layers=1", "model.arch.num_attention_heads=2",
                "model.arch.num_key_value_heads=2", "model.grid=[2,2]", "model.device=cuda"]  # fmt: skip


def test_the_cost_model_is_measured_pinned_at_a_real_images_room_through_the_static_buckets() -> None:
    """``measure_cost`` after ``request_static`` (what ``engine.compile`` asks, before the app's bind) on an image of
    Anole's length (32 × 32 tokens; a tiny width): the drafter is pinned at the room ``engine.prefill_drafter`` asks
    for a real image (prompt + image + scratch slots + 1; landed main pinned it at P + 976 < P + 1029, so every image
    after the measurement ran unpinned, without graphs), and the fixed extend and every level run through captured
    graphs (landed main timed the fixed extend at variable shapes)."""
    from adtbench.algorithm.cost import measure_cost
    from adtbench.algorithm.engine import prefill
    from adtbench.algorithm.policies.static import StaticTreePolicy
    from adtbench.sampling_params import SamplingParams

    with accel.simulate():
        target, drafter = tiny("tiny_chameleon", dtype="float32", device="cuda", grid=[32, 32])
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
        with static_runs() as runs:
            measure_cost(target, drafter, sp, 128, 16, repeats=1, sizes=[1, 2])
        assert not any(graphed is False for _, _, graphed in runs)
        assert {("StaticDraft", b, True) for b in (1, 2, 4, 8, 16)} <= set(runs)  # levels 1 … 16, the fixed extend
        assert ("StaticVerify", 128, True) in runs and ("StaticVerify", 2, True) in runs
        policy = StaticTreePolicy([[0], [1], [0, 0]], "sample")  # the default run's tree
        inputs = target.encode_prompt("a photograph of a red fox in the snow", cfg=True)
        _, res, _ = prefill(target, drafter, inputs, sp, policy.max_nodes(), policy.max_draft_slots(), None)
        need = res.features.shape[1] + target.layout.num_gen_tokens + max(policy.max_nodes(), policy.max_draft_slots())
        assert drafter.static.capacity >= need + 1 and drafter.cache is drafter.pinned[0]
        assert not drafter._warned_unpinned and target.cache is target.pinned


@pytest.mark.parametrize("compile_on", [True, False])
def test_bench_overhead_counts_graph_replays_as_model_time_and_the_synchronisations(tmp_path: Path, compile_on) -> None:
    """``adtbench bench overhead`` on the simulated device: with ``engine.compile=true`` the verifies and drafter levels
    replay graphs and that time is the target's and the drafter's (landed main read 0 ms of target time there, all of
    it overhead); the split adds up to the cycle; one synchronisation per cycle (the verdict; prefill excluded),
    counted by the simulation, and the explicit ones (image boundaries, the encoding's clock) apart."""
    out = tmp_path / "over.json"
    with accel.simulate():
        args = ["overhead", *TINY, f"engine.compile={str(compile_on).lower()}", "bench.prompts=2", f"bench.out={out}"]
        assert bench_main(args) == 0
    r = json.loads(out.read_text())
    assert r["device"] == "simulated cuda (cpu)" and r["engine_compile"] is compile_on and r["cycles"] > 5
    assert (
        r["target_forward_ms"] > 0
        and r["drafter_ms"] > 0
        and r["overhead_ms"] == pytest.approx(r["cycle_ms"] - r["target_forward_ms"] - r["drafter_ms"])
    )
    assert (r["graph_replays_per_cycle"] >= 1) is compile_on and r["static_runs_per_cycle"] == r[
        "graph_replays_per_cycle"
    ]
    assert r["syncs_per_cycle"] == 1.0 and r["sync_count"].startswith("simulated device")
    # explicit: the image's start and end (``engine.generate``) and the encoding's two (``Job.decode``, as the app)
    assert r["explicit_syncs_per_image"] == 4.0 and r["model_calls_per_cycle"]["target verify (verify_forward)"] == 1.0


def test_bench_overhead_phases_and_count_on_the_simulated_device(tmp_path: Path) -> None:
    """``bench.phases=true`` with graphs: the replays land in the network phases (the graphed tree verify's
    ``TreeStep.launch`` / ``StaticDraft.run``), not in the verify's bookkeeping; ``bench.count=true``: one host read per
    cycle."""
    with accel.simulate():
        out = tmp_path / "phases.json"
        assert bench_main(["overhead", *TINY, "engine.compile=true", "bench.phases=true", "bench.prompts=1",
                           f"bench.out={out}"]) == 0  # fmt: skip
        rows = {x["phase"]: x for x in json.loads(out.read_text())["phases"]}
        assert rows[TREE_STEP]["ms_per_cycle"] > 0 and rows["drafter network"]["ms_per_cycle"] > 0
        out = tmp_path / "count.json"
        assert bench_main(["overhead", *TINY, "engine.compile=true", "bench.count=true", "bench.prompts=1",
                           f"bench.out={out}"]) == 0  # fmt: skip
        assert json.loads(out.read_text())["host_reads_per_cycle"] == 1.0


def test_bench_overhead_counts_a_batched_cycle(tmp_path: Path) -> None:
    """``bench.count=true`` at B = 2 (``decode.batch_size``): every prompt in one window of the method's side, counted
    per batched cycle (one target forward for every slot; the slots' admissions are prefill); one host read per
    cycle; at B > 1 the tool counts only (a ``ConfigError`` naming ``decode.batch_size`` otherwise)."""
    batch = [*TINY, "policy=eagle2", "engine.compile=true", "decode.batch_size=2", "dataset.limit=3", "bench.prompts=3"]
    with accel.simulate():
        out = tmp_path / "count.json"
        assert bench_main(["overhead", *batch, "bench.count=true", f"bench.out={out}"]) == 0
        r = json.loads(out.read_text())
        assert r["batch_size"] == 2 and r["cycles"] < r["slot_cycles"] <= 2 * r["cycles"]
        assert r["host_reads_per_cycle"] == pytest.approx(1.0, abs=0.1) and r["graph_replays_per_cycle"] >= 1.0
        assert r["engine_kernels_per_cycle"] > 0
        assert bench_main(["overhead", *batch]) == 2


def test_bench_cost_and_probe_on_the_simulated_device(tmp_path: Path, capsys) -> None:
    """``bench cost`` (the 7B shape's commands, shrunk) measures through the graphs at the pinned capacities and names
    the simulated device, with no bandwidth (no GPU figure); ``bench probe`` replays buckets 1 and 64 (graphed =
    eager logits up to bf16 rounding) and judges the synchronisation goal only; a host model is a key-named error."""
    with accel.simulate():
        out = tmp_path / "cost.json"
        cost = ["cost", *SHRUNK_ANOLE, "engine.compile=true", "bench.tree_sizes=[1,2]", "bench.level_nodes=2",
                "policy=static_sampled"]  # fmt: skip
        assert (
            bench_main([*cost, "bench.repeats=1", "bench.overhead_prompts=1", "dataset=smoke", f"bench.out={out}"]) == 0
        )
        r = json.loads(out.read_text())
        assert (
            r["device"] == "simulated cuda (cpu)" and r["device_bandwidth_gbs"] is None and r["weight_read_ms"] is None
        )
        assert r["measured_graph_replays"] == r["measured_static_runs"] > 0 and r["pinned_capacity"]["drafter"] > 0
        assert r["overhead"]["target_forward_ms"] > 0 and r["overhead"]["syncs_per_cycle"] == 1.0
        assert "graph replays of" in capsys.readouterr().out
        out = tmp_path / "probe.json"
        assert bench_main(["probe", *SHRUNK_ANOLE, "bench.buckets=[1,64]", "bench.repeats=1", "bench.prompts=1",
                           "dataset=smoke", f"bench.out={out}"]) == 0  # fmt: skip
        p = json.loads(out.read_text())
        assert [x["bucket"] for x in p["verify"]] == [1, 64] and all(x["rel_diff"] < 2e-2 for x in p["verify"])
        assert p["ar_step"]["graphed_work"]["graph_replays"] == 1 and p["drafter"]
        assert p["goals"]["syncs_per_cycle"]["met"] is True and p["goals"]["overhead_frac"]["met"] is None
        assert "| 64 |" in capsys.readouterr().out
    assert bench_main(["probe", "model=tiny_llamagen", "model.device=cpu", "bench.prompts=0"]) == 2
    assert "model.device" in capsys.readouterr().out


def test_bench_batch_and_versus_on_the_simulated_device(tmp_path: Path) -> None:
    """``bench batch`` (B = 1 and 2) and ``bench versus`` (two variants, graphed) draw on the device's generator and
    run without a placement violation; both name the simulated device."""
    with accel.simulate() as sim:
        out = tmp_path / "batch"
        assert bench_main(["batch", *TINY, "policy=eagle2", "bench.sizes=[1,2]", "bench.prompts=2",
                           f"bench.out={out}"]) == 0  # fmt: skip
        b = json.loads((out / "batch.json").read_text())
        assert b["environment"]["device"] == "simulated cuda (cpu)" and [x["B"] for x in b["rows"]] == [1, 2]
        out = tmp_path / "versus.json"
        assert bench_main(["versus", *TINY, "engine.compile=true", "bench.prompts=1", "bench.repeats=1",
                           f"bench.out={out}", "--variant", "a", "policy=eagle2", "--variant", "b",
                           "policy=static_sampled"]) == 0  # fmt: skip
        v = json.loads(out.read_text())
        assert v["device"] == "simulated cuda (cpu)" and [x["variant"] for x in v["rows"]] == ["a", "b"]
        assert sim.counts["graph_replays"] > 0
    # the draws are made by the device's generator: no host→device copy of random numbers (landed main: several per
    # cycle, ``sampling._draw`` copying a host generator's draws)
    assert not [site for site in sim.reads_by_op if " in _draw" in site]


@pytest.mark.parametrize("method", [("policy=scd",), ("policy=sjd",), ("policy=gsd",), ("policy=scd", "lantern=on")])
def test_a_jacobi_forward_reads_the_device_once(tmp_path: Path, method: tuple[str, ...]) -> None:
    """Every Jacobi loop on the simulated device: one read per forward (the verdict) and, with coupled redraws, one
    per image (the kept count), the prefill's own reads outside the cycles. GSD's grouped test once made a 0-d tensor
    from a Python scalar each forward: a blocking host→device copy, a second synchronisation per forward on CUDA."""
    with accel.simulate():
        out = tmp_path / "jacobi.json"
        assert bench_main(["overhead", *TINY, *method, "bench.prompts=2", f"bench.out={out}"]) == 0
    r = json.loads(out.read_text())
    assert r["policy"] == method[0].split("=")[1] and r["prefill_syncs_per_image"] > 0
    per_image = r["cycles"] / r["prompts"]
    coupled = method[0] == "policy=scd"
    assert r["syncs_per_cycle"] == pytest.approx(1.0 + coupled / per_image)
    sites = {site.rsplit(" in ", 1)[1] for site in r["sync_sites_per_cycle"]}
    assert "read_chain" in sites and sites <= {"read_chain", "read_verdicts", "stats"}  # a 1-node chain: the tree read


def test_a_jacobi_forward_launches_a_bounded_number_of_kernels(tmp_path: Path) -> None:
    """``bench.count=true`` over the SCD loop (acceptance on the device, what a GPU runs): the verdict's one read per
    forward plus the statistics' one per image, and at most 90 engine kernels per forward outside the network — the
    chain fast path (``verify.accept_chain`` / ``read_chain``) and the scatter-built point masses; the general tree
    path and ``one_hot``'s range check took 114 and half a read more per forward."""
    with accel.simulate():
        out = tmp_path / "count.json"
        assert (
            bench_main(["overhead", *TINY, "policy=scd", "bench.count=true", "bench.prompts=2", f"bench.out={out}"])
            == 0
        )
    r = json.loads(out.read_text())
    assert r["host_reads_per_cycle"] == pytest.approx(1.0 + r["prompts"] / r["cycles"])
    assert r["engine_kernels_per_cycle"] <= 90, r["phases"]


def test_top_kernels_ranks_device_rows_by_time_per_call() -> None:
    """The probe's per-bucket kernel list: device rows only (no copies), most device time first, per call."""
    from types import SimpleNamespace

    from adtbench.tools.bench_probe import top_kernels

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def row(key: str, us: float, count: int, dev: Any = cuda) -> SimpleNamespace:
        return SimpleNamespace(key=key, device_time_total=us, count=count, device_type=dev)

    rows = [row("sgemm_small", 300.0, 6), row("Memcpy DtoD", 900.0, 3), row("aten::mm", 999.0, 3, cpu),
            row("flash_fwd", 600.0, 3), row("elementwise", 30.0, 30)]  # fmt: skip
    top = top_kernels(rows, 3, k=2)
    assert [t["name"] for t in top] == ["flash_fwd", "sgemm_small"]
    assert top[0]["us"] == 200.0 and top[1]["count"] == 2.0


def test_probe_judges_every_policy_at_a_pinned_shape_on_one_set_of_models(tmp_path: Path, capsys) -> None:
    """``bench.policies`` (issue 40.4): the probe's compiled models reused for AR, SCD, SJD-PAC, EAGLE-2, ADT and the
    static tree — each a cycle split with an overhead CI over 3 prompts, synchronisations and launches per cycle,
    and the τ projection (AR's is 1 at every τ); a host µs-per-launch figure; an unknown policy a key-named error."""
    out = tmp_path / "probe.json"
    with accel.simulate():
        args = ["probe", *SHRUNK_ANOLE, "bench.buckets=[1,64]", "bench.repeats=1", "bench.prompts=3", "dataset=smoke",
                "bench.policies=[ar,scd,sjd_pac,eagle2,adt,static]", "bench.project_tau=[2.0,4.0]",
                f"bench.out={out}"]  # fmt: skip
        assert bench_main(args) == 0
        text = capsys.readouterr().out
        assert bench_main([*args[:-2], "bench.policies=[ar,nonsense]"]) == 2
        assert "bench.policies" in capsys.readouterr().out
    p = json.loads(out.read_text())
    rows = {x["policy"]: x for x in p["policies"]}
    assert list(rows) == ["ar", "scd", "sjd_pac", "eagle2", "adt", "static"]
    assert rows["ar"]["projection"] == {"2.0": 1.0, "4.0": 1.0} and p["host_launch_us"] > 0
    for name in ("scd", "sjd_pac", "eagle2", "adt", "static"):
        x = rows[name]
        assert x["prompts"] == 3 and len(x["cycle_ms_per_image"]) == 3 and x["cycles"] > 0
        lo, hi = x["overhead_frac_ci"]
        assert lo <= hi and x["syncs_per_cycle"] is not None and x["work_per_cycle"]["graph_replays"] >= 1
        assert x["projection"]["4.0"] == pytest.approx(2 * x["projection"]["2.0"])
    assert rows["eagle2"]["drafter_ms"] > 0 and rows["scd"]["drafter_ms"] == 0
    assert "| sjd_pac |" in text and "× AR at τ 4" in text
