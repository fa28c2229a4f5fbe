"""GPU-only checks (``@pytest.mark.gpu``; skipped without CUDA): the lean forward, the engine and the timer on
a CUDA device. Exactness on GPU is checked against the CPU in float32 at float32 tolerance (cuBLAS/SDPA kernels
round differently), and greedy decoding is checked token for token within the device."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny

from adtbench.algorithm.cost import random_tree
from adtbench.algorithm.engine import Clock, decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.sampling import SamplingParams
from adtbench.harness.caches import cost_source

pytestmark = pytest.mark.gpu


def test_verify_forward_on_cuda_matches_cpu() -> None:
    cpu_t, _ = tiny(dtype="float32")
    gpu_t, _ = tiny(dtype="float32", device="cuda")
    gen = torch.Generator().manual_seed(0)
    outs = []
    for t in (cpu_t, gpu_t):
        t.start(t.encode_prompt("a red circle", cfg=True), 16)
        mask, depth = random_tree(9, torch.Generator().manual_seed(1))
        toks = torch.randint(0, 16, (9,), generator=gen.manual_seed(2))
        logits, feats = t.verify_forward(toks, mask, depth)
        outs.append((logits.float().cpu(), feats.float().cpu()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-4, rtol=1e-4)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("budget", ["fixed", "cost"])
def test_greedy_speculation_equals_ar_on_cuda(budget: str, tmp_path) -> None:
    target, drafter = tiny(dtype="float32", device="cuda")
    policy = Eagle2Policy(depth=3, top_k=4, total_tokens=20, budget=budget)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    policy.bind(cost_source(target, drafter, sp, tmp_path))
    inputs = target.encode_prompt("two blue squares", cfg=True)
    ar = decode_ar(target, inputs, sp, None)
    spec = generate(target, drafter, policy, inputs, sp, None)
    assert spec.tokens == ar.tokens and spec.tau > 1.0


def test_clock_synchronises_on_cuda() -> None:
    assert Clock(torch.device("cuda")).sync and not Clock(torch.device("cpu")).sync
