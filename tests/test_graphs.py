"""Static-shape verify forwards (``models.graphs``), on the CPU: the bucketing and padding a CUDA graph replays.

A target asked for static verifies (``request_static``) keeps one pinned KV cache for every image and runs every
tree at its bucket's size over the whole capacity. These tests check, in float64, that the n real nodes get exactly
the variable-shape forward's logits and features through a run of trees and non-prefix commits (padding is inert),
that the pinned cache is reused across images, that a prompt too long for it falls back to variable shapes, and
that greedy speculation through the buckets is AR greedy. The capture itself needs CUDA (``tests/test_gpu.py``)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny

from adtbench.algorithm.cost import random_tree
from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.sampling import SamplingParams
from adtbench.models.graphs import BUCKETS, StaticVerify, bucket_of

MODELS = ["tiny_llamagen", "tiny_chameleon"]


def test_buckets_are_the_smallest_power_of_two_that_holds_the_tree() -> None:
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 63, 64, 65, 128)] == [1, 2, 4, 4, 8, 64, 64, 128, 128]
    assert bucket_of(129) is None and BUCKETS[-1] == 128


@pytest.mark.parametrize("model", MODELS)
def test_bucketed_verifies_equal_variable_shapes_through_commits(model: str) -> None:
    """Trees of 1 … 17 nodes, each verified at its bucket (1, 2, 4, 8, 16, 32) and then committed along a path that
    is not a prefix: the real nodes' logits and features equal the variable-shape target's within 1e-10."""
    plain, _ = tiny(model)
    static, _ = tiny(model)
    static.request_static(graphs=False)
    used: list[int] = []
    run = StaticVerify.run

    def spy(self: StaticVerify) -> tuple[torch.Tensor, torch.Tensor]:
        used.append(self.b)
        return run(self)

    gen = torch.Generator().manual_seed(0)
    lay = plain.layout
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StaticVerify, "run", spy)
        for t in (plain, static):
            t.start(t.encode_prompt("a red circle", cfg=True), 32)
        for n in (1, 3, 2, 5, 9, 17, 4):
            mask, depth = random_tree(n, gen)
            toks = lay.image_token_offset + torch.randint(0, lay.num_codes, (n,), generator=gen)
            (a, fa), (b, fb) = (t.verify_forward(toks, mask, depth) for t in (plain, static))
            assert a.shape == b.shape and (a - b).abs().max() <= 1e-10 and (fa - fb).abs().max() <= 1e-10, n
            path = torch.nonzero(mask[-1]).view(-1)  # the deepest-last node's root path: not a prefix in general
            for t in (plain, static):
                t.commit(path)
    assert used == [1, 4, 2, 8, 16, 32, 4]
    assert static.cache is static.pinned


@pytest.mark.parametrize("model", MODELS)
def test_the_pinned_cache_serves_every_image_and_greedy_speculation_is_ar(model: str) -> None:
    target, drafter = tiny(model)
    target.request_static(graphs=False)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    first = None
    for prompt in ("a red circle", "two blue squares on a striped floor"):
        inputs = target.encode_prompt(prompt, cfg=True)
        ar = decode_ar(target, inputs, sp, None)
        spec = generate(target, drafter, Eagle2Policy(depth=3, top_k=4, total_tokens=20), inputs, sp, None)
        assert spec.tokens == ar.tokens
        first = first or target.pinned
        assert target.cache is target.pinned is first


def test_a_prompt_longer_than_the_pinned_room_runs_at_variable_shapes(caplog: pytest.LogCaptureFixture) -> None:
    target, drafter = tiny("tiny_chameleon")
    target.request_static(graphs=False, extra_prompt=0)
    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    short = target.encode_prompt("a cat", cfg=True)
    decode_ar(target, short, sp, None)
    long = target.encode_prompt("a very long prompt about a red circle left of a blue square on a floor", cfg=True)
    ar = decode_ar(target, long, sp, None)
    assert target.cache is not target.pinned and "variable shapes" in caplog.text
    spec = generate(target, drafter, Eagle2Policy(depth=2, top_k=3, total_tokens=8), long, sp, None)
    assert spec.tokens == ar.tokens
