"""The lean inference path (``adtbench.models.lean``) against the reference modules, and its op-count guards.

Equalities run in float64 (the lean path folds RMSNorm weights and fuses projections, so float32 agrees only up
to rounding). Op counts are deterministic (a ``TorchDispatchMode`` counter), never timed.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch
from conftest import tiny
from torch.utils._python_dispatch import TorchDispatchMode

from adtbench.algorithm.cost import random_tree
from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.models.kv import StaticKVCache
from adtbench.models.llamagen.gpt import GPTConfig, LlamaGenGPT
from adtbench.models.rope import Rope1D, Rope2D, _direct_tables, apply_rope, qkv_tables, rotary, rotate
from adtbench.sampling_params import SamplingParams

ONE = torch.ones(1, 1, dtype=torch.bool)
ZERO = torch.zeros(1, dtype=torch.long)


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn) -> Counter[str]:
    with OpCounter() as c:
        fn()
    return c.ops


def _gpt(n_kv_head: int | None = None, seed: int = 0) -> LlamaGenGPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        dim=64, n_layer=2, n_head=4, n_kv_head=n_kv_head, multiple_of=32, vocab_size=64, block_size=16,
        cls_token_num=8, model_type="t2i", caption_dim=32,
    )  # fmt: skip
    gpt = LlamaGenGPT(cfg).double()
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0.0, 0.3)
    return gpt.eval()


def _mask(R: int, n: int, L: int, gen: torch.Generator) -> torch.Tensor:
    m = torch.rand(R, 1, n, L + n, generator=gen) > 0.4
    m[..., L:] &= torch.ones(n, n, dtype=torch.bool).tril()
    m[..., L:] |= torch.eye(n, dtype=torch.bool)
    return m


# --- RoPE --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rope", [Rope2D(16, 4, 8), Rope1D(16)], ids=["2d-interleaved", "1d-half"])
def test_rotate_equals_apply_rope(rope) -> None:
    """``x·C + partner(x)·S`` over fused q|k|v heads = ``apply_rope`` on q and k; v heads pass unchanged."""
    gen = torch.Generator().manual_seed(0)
    R, n, H, KV = 2, 7, 4, 2
    pos = torch.randint(0, 40, (R, n), generator=gen)
    qkv = torch.randn(R, n, H + 2 * KV, 16, dtype=torch.float64, generator=gen)
    C, S = qkv_tables(rope, pos, torch.float64, H + KV, KV)
    out = rotate(qkv, C, S, rope.style)
    cos, sin = rope.cos_sin(pos, torch.float64)
    ref = apply_rope(qkv[:, :, : H + KV].transpose(1, 2), cos, sin, rope.style).transpose(1, 2)
    torch.testing.assert_close(out[:, :, : H + KV], ref, atol=1e-14, rtol=0)
    assert torch.equal(out[:, :, H + KV :], qkv[:, :, H + KV :])


@pytest.mark.parametrize("rope", [Rope2D(16, 4, 8), Rope1D(16)], ids=["2d-interleaved", "1d-half"])
def test_rotary_tables_equal_apply_rope(rope) -> None:
    """The lean stack's rotation (``rope.Rotary``: one complex product for interleaved pairs, ``x·C + roll(x)·S`` for
    halves) over fused q|k|v heads = ``apply_rope`` on q and k; v heads pass unchanged (bit for bit)."""
    gen = torch.Generator().manual_seed(0)
    R, n, H, KV = 2, 7, 4, 2
    pos = torch.randint(0, 40, (R, n), generator=gen)
    qkv = torch.randn(R * n, H + 2 * KV, 16, dtype=torch.float64, generator=gen)
    rot = rotary(rope, pos, torch.float64, H + KV, KV)
    assert rot.style == rope.style and rot.dtype == torch.float64
    if rope.style == "interleaved":
        out = torch.view_as_real(torch.view_as_complex(qkv.unflatten(-1, (8, 2))) * rot.complex()).flatten(-2)
    else:
        out = qkv * rot.cos + torch.roll(qkv, 8, -1) * rot.sin
    cos, sin = rope.cos_sin(pos, torch.float64)
    ref = apply_rope(qkv.view(R, n, H + 2 * KV, 16)[:, :, : H + KV].transpose(1, 2), cos, sin, rope.style)
    torch.testing.assert_close(out.view(R, n, -1, 16)[:, :, : H + KV], ref.transpose(1, 2), atol=1e-14, rtol=0)
    assert torch.equal(out[:, H + KV :], qkv[:, H + KV :])


def test_position_table_equals_direct() -> None:
    """The CPU per-position table (grown on demand) gives the rows of the direct formula."""
    rope = Rope2D(16, 4, 8)
    for hi in (5, 300, 900):  # 300 and 900 force the table to grow
        pos = torch.tensor([[0, 3, 8, 9, hi], [1, 7, 8, 20, hi - 1]])
        C, S = qkv_tables(rope, pos, torch.float32, 3, 1)
        direct = _direct_tables(rope, pos, torch.float32)
        torch.testing.assert_close(C[:, :, :3], direct[0].expand(2, 5, 3, 16), atol=1e-6, rtol=0)
        torch.testing.assert_close(S[:, :, :3], direct[1].expand(2, 5, 3, 16), atol=1e-6, rtol=0)
    with pytest.raises(IndexError, match="negative"):
        qkv_tables(rope, torch.tensor([[-1, 0]]), torch.float32, 1, 1)


# --- the GPT ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_kv_head", [None, 2], ids=["mha", "gqa"])
def test_lean_gpt_equals_reference(n_kv_head) -> None:
    """Prefill then a tree block on the same cache: lean (no_grad) = reference modules (grad mode), features and
    KV cache, float64."""
    gpt = _gpt(n_kv_head)
    gen = torch.Generator().manual_seed(1)
    R, P, n, cap = 2, 9, 6, 20
    x0 = torch.randn(R, P, 64, dtype=torch.float64, generator=gen)
    x1 = torch.randn(R, n, 64, dtype=torch.float64, generator=gen)
    pos0 = torch.arange(P)[None].expand(R, P)
    pos1 = P + torch.randint(0, 3, (R, n), generator=gen)
    m0, m1 = _mask(R, P, 0, gen), _mask(R, n, P, gen)
    caches = []
    outs = []
    for grad in (True, False):
        cache = gpt.new_cache(R, cap)
        with torch.set_grad_enabled(grad):
            f0 = gpt.forward_embeds(x0, pos0, m0, cache, 0)
            f1 = gpt.forward_embeds(x1, pos1, m1, cache, P)
        outs.append((f0.detach(), f1.detach()))
        caches.append(cache.buf[..., : P + n, :].clone())
    (r0, r1), (l0, l1) = outs
    torch.testing.assert_close(l0, r0, atol=1e-12, rtol=0)
    torch.testing.assert_close(l1, r1, atol=1e-12, rtol=0)
    torch.testing.assert_close(caches[1], caches[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("n_kv_head", [None, 2], ids=["mha", "gqa"])
def test_the_functional_layers_torch_compile_traces_equal_the_scratch_layers(n_kv_head) -> None:
    """``compile_stack`` traces ``lean.functional_layer`` (no scratch buffers: AOT autograd refuses their complex views
    and ``out=`` writes under dynamic shapes); uncompiled, it computes what the scratch layers compute (float64,
    prefill and a tree block, features and KV cache), so the slow compile test checks the same function."""
    from adtbench.models.lean import lean_stack

    gen = torch.Generator().manual_seed(3)
    R, P, n = 2, 9, 6
    x0, x1 = (torch.randn(R, m, 64, dtype=torch.float64, generator=gen) for m in (P, n))
    pos0, pos1 = torch.arange(P)[None].expand(R, P), P + torch.randint(0, 3, (R, n), generator=gen)
    m0, m1 = _mask(R, P, 0, gen), _mask(R, n, P, gen)
    outs = []
    for functional in (False, True):
        gpt = _gpt(n_kv_head)
        if functional:
            gpt.__dict__["_lean_stack"] = lean_stack  # as ``compile_stack`` installs it: no scratch memo
        cache = gpt.new_cache(R, P + n)
        with torch.no_grad():
            outs.append((gpt.forward_embeds(x0, pos0, m0, cache, 0), gpt.forward_embeds(x1, pos1, m1, cache, P)))
        outs[-1] += (cache.buf.clone(),)
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=0)


def test_lean_gpt_in_bfloat16_follows_the_reference() -> None:
    """bfloat16 (the GPU dtype; the rotation in float32 through the scratch's staging buffers, the RMSNorms cast to
    float32): the lean path follows the reference modules within bfloat16 rounding, prefill and a tree block."""
    gpt = _gpt(2).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    R, P, n = 2, 9, 6
    x0, x1 = (torch.randn(R, m, 64, generator=gen).to(torch.bfloat16) for m in (P, n))
    pos0, pos1 = torch.arange(P)[None].expand(R, P), P + torch.arange(n)[None].expand(R, n)
    m0, m1 = _mask(R, P, 0, gen), _mask(R, n, P, gen)
    outs = []
    for grad in (True, False):
        cache = gpt.new_cache(R, P + n)
        with torch.set_grad_enabled(grad):
            outs.append([gpt.forward_embeds(x, p, m, cache, s).detach().float() for x, p, m, s in
                         ((x0, pos0, m0, 0), (x1, pos1, m1, P))])  # fmt: skip
    for ref, lean in zip(*outs, strict=True):
        assert lean.dtype == torch.float32 and (lean - ref).abs().max() <= 0.02 * ref.abs().max()


def test_bool_and_additive_masks_agree() -> None:
    gpt = _gpt()
    gen = torch.Generator().manual_seed(2)
    x, pos = torch.randn(2, 5, 64, dtype=torch.float64, generator=gen), torch.arange(5)[None].expand(2, 5)
    m = _mask(2, 5, 0, gen)
    add = torch.zeros(m.shape, dtype=torch.float64).masked_fill_(~m, float("-inf"))
    with torch.no_grad():
        a = gpt.forward_embeds(x, pos, m, gpt.new_cache(2, 5), 0)
        b = gpt.forward_embeds(x, pos, add, gpt.new_cache(2, 5), 0)
    assert torch.equal(a, b)


def test_grad_path_trains_through_the_cache() -> None:
    """Grad mode: the reference modules; gradients reach every weight and the cache buffer stays out of the graph."""
    gpt = _gpt().train()
    x = torch.randn(2, 6, 64, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(6)[None].expand(2, 6)
    cache = gpt.new_cache(2, 6)
    gpt.forward_embeds(x, pos, torch.ones(6, 6, dtype=torch.bool).tril()[None, None], cache, 0).sum().backward()
    assert all(p.grad is not None for n, p in gpt.named_parameters() if n.startswith("layers."))
    assert not cache.buf.requires_grad and cache.buf.abs().sum() > 0


def test_inference_weights_follow_the_parameters() -> None:
    """Derived weights are rebuilt after in-place updates, dtype moves and reloads; never state-dict keys."""
    gpt = _gpt()
    keys = set(gpt.state_dict())
    x = torch.randn(1, 3, 64, dtype=torch.float64)
    pos, mask = torch.arange(3)[None], torch.ones(3, 3, dtype=torch.bool).tril()[None, None]

    def both():
        with torch.no_grad():
            lean = gpt.forward_embeds(x, pos, mask, gpt.new_cache(1, 3), 0)
        ref = gpt.forward_embeds(x, pos, mask, gpt.new_cache(1, 3), 0).detach()
        return lean, ref

    lean, ref = both()
    torch.testing.assert_close(lean, ref, atol=1e-12, rtol=0)
    first = gpt.inference_weights()
    assert gpt.inference_weights() is first  # cached
    with torch.no_grad():
        gpt.layers[0].feed_forward.w3.weight.mul_(2.0)  # an in-place update (an optimizer step)
    lean2, ref2 = both()
    assert (ref2 - ref).abs().max() > 1e-3
    torch.testing.assert_close(lean2, ref2, atol=1e-12, rtol=0)
    sd = {k: v.clone() for k, v in _gpt(seed=5).state_dict().items()}
    gpt.load_state_dict(sd, assign=True)
    torch.testing.assert_close(*both(), atol=1e-12, rtol=0)
    gpt.float()
    assert gpt.inference_weights()[0][0].qkv.dtype == torch.float32
    assert set(gpt.state_dict()) == keys


def test_kv_compaction_moves_every_layer() -> None:
    cache = StaticKVCache(3, 2, 2, 10, 4, torch.float64, "cpu")
    cache.buf.copy_(torch.randn_like(cache.buf))
    before = cache.buf.clone()
    keep = torch.tensor([0, 2, 5])
    cache.compact(4, keep)
    torch.testing.assert_close(cache.buf[..., 4:7, :], before[..., 4 + keep, :], atol=0, rtol=0)
    assert torch.equal(cache.buf[..., :4, :], before[..., :4, :])
    assert torch.equal(cache.k[1], cache.buf[1, :, :2]) and torch.equal(cache.v[2], cache.buf[2, :, 2:])


# --- the EAGLE drafter -------------------------------------------------------------------------------------
@pytest.mark.parametrize("rope", [Rope2D(16, 4, 7), Rope1D(16)], ids=["2d-interleaved", "1d-half"])
@pytest.mark.parametrize(
    "kw", [{}, {"input_norm": True, "attention_bias": True, "num_kv_heads": 2, "num_layers": 2}, {"qk_norm": True}]
)
def test_lean_drafter_equals_reference(kw, rope) -> None:
    """The lean drafter = its modules, float64; a half-paired RoPE (a Chameleon target's) through inference weights
    whose q / k rows, biases and q/k-norm affine are stored in interleaved pairs (``lean.interleave_pairs``)."""
    cfg = EagleConfig(
        **{"hidden_size": 64, "num_heads": 4, "num_kv_heads": 4, "head_dim": 16, "intermediate_size": 96, **kw}
    )
    torch.manual_seed(3)
    d = EagleDrafter(cfg, rope).double()
    with torch.no_grad():
        for p in d.parameters():
            p.normal_(0.0, 0.3)
    gen = torch.Generator().manual_seed(4)
    R, m = 2, 6
    e, f = (torch.randn(R, m, 64, dtype=torch.float64, generator=gen) for _ in range(2))
    pos = torch.randint(0, 24, (R, m), generator=gen)
    mask = _mask(R, m, 0, gen)
    outs = []
    for grad in (True, False):
        d.reset(R, m)
        with torch.set_grad_enabled(grad):
            outs.append(d.forward(e, f, pos, mask, 0).detach())
    torch.testing.assert_close(outs[1], outs[0], atol=1e-12, rtol=0)


def test_drafter_masks_match_their_definition() -> None:
    """``extend``: slot L+i sees valid columns ≤ L+i and itself; ``expand``: the prefix plus ``slot_mask``."""
    target, d = tiny()
    R, H = 2, target.hidden_size
    d.reset(R, 32)
    gen = torch.Generator().manual_seed(5)
    seen = []
    fwd = d.forward
    d.forward = lambda e, f, p, mask, start: (seen.append(mask), fwd(e, f, p, mask, start))[1]
    valid = torch.tensor([[False, True, True, True], [True, True, False, True]])
    feats, embeds = (torch.randn(R, 4, H, dtype=torch.float64, generator=gen) for _ in range(2))
    d.extend(feats, embeds, torch.arange(4)[None].expand(R, 4), valid)
    d.extend(feats[:, :2], embeds[:, :2], 4 + torch.arange(2)[None].expand(R, 2), torch.ones(R, 2, dtype=torch.bool))
    slot = torch.tensor([[True, False, False], [True, True, False], [False, False, True]])
    d.expand(feats[:, :3], embeds[:, :3], torch.full((R, 3), 6), slot)
    assert all(m.dtype == torch.float64 for m in seen)
    allowed = [m[:, 0] == 0 for m in seen]
    keys = torch.cat([valid, torch.ones(R, 2, dtype=torch.bool)], 1)
    exp1 = (torch.ones(4, 4, dtype=torch.bool).tril() & valid[:, None]) | torch.eye(4, dtype=torch.bool)
    assert torch.equal(allowed[0], exp1)
    exp2 = torch.cat(
        [keys[:, None, :4].expand(R, 2, 4), torch.ones(2, 2, dtype=torch.bool).tril()[None].expand(R, 2, 2)], -1
    )
    assert torch.equal(allowed[1], exp2)
    assert torch.equal(allowed[2], torch.cat([keys[:, None].expand(R, 3, 6), slot[None].expand(R, 3, 3)], -1))


# --- op counts (deterministic regression guards) -------------------------------------------------------------
def test_verify_builds_one_additive_mask_and_stays_lean() -> None:
    """One additive mask per verify forward — the tree's block converted once (``where``) and joined to the committed
    columns' kept bias (``cat``) — no per-layer bool→float conversion, and a bounded op count (was ≈ 82 per layer
    before the lean path, ≈ 36 before ``lean.Scratch``, now ≈ 17; the first forward of a shape also builds its
    scratch buffers)."""
    target, _ = tiny(dtype="float32")
    target.start(target.encode_prompt("a red circle", cfg=True), 8)
    layers = target.net.cfg.n_layer
    target.verify_forward(torch.tensor([3]), ONE, ZERO)  # builds the scratch of one token
    ops = count_ops(lambda: target.verify_forward(torch.tensor([3]), ONE, ZERO))
    assert ops["aten.where"] == 1 and ops["aten.full"] == 0 and ops["aten.masked_fill_"] == 0
    # qkv, gate|up (into scratch), o and down (added to the residual stream in place) per layer; the head
    assert ops["aten.mm"] + ops["aten.addmm_"] == 4 * layers + 1 and ops["aten.addmm"] == 0
    assert sum(ops.values()) <= 20 * layers + 40, ops
    tree = torch.ones(4, 4, dtype=torch.bool).tril()
    target.verify_forward(torch.tensor([3, 4, 5, 6]), tree, torch.arange(4))
    ops4 = count_ops(lambda: target.verify_forward(torch.tensor([3, 4, 5, 6]), tree, torch.arange(4)))
    assert sum(ops4.values()) <= 20 * layers + 40, ops4


def test_drafter_expand_stays_lean() -> None:
    target, d = tiny(dtype="float32")
    R, H = 2, target.hidden_size
    d.reset(R, 64)
    with torch.no_grad():
        e = torch.randn(R, 9, H)
        pos = torch.arange(9)[None].expand(R, 9)
        d.extend(e, e, pos, torch.ones(R, 9, dtype=torch.bool))
        d.expand(e[:, :3], e[:, :3], pos[:, :3] + 9, torch.eye(3, dtype=torch.bool))  # builds the scratch of 3 slots
        d.rollback()
        ops = count_ops(lambda: d.expand(e[:, :3], e[:, :3], pos[:, :3] + 9, torch.eye(3, dtype=torch.bool)))
    assert ops["aten.where"] == 0 and ops["aten.full"] == 1
    assert sum(ops.values()) <= 55, ops  # was 111 (one layer) before the lean path, 60 before ``lean.Scratch``


@pytest.mark.parametrize(
    ("model", "eager", "static", "kernels"),
    [("tiny_llamagen", 15, 15, 13), ("tiny_chameleon", 18, 18, 16)],  # before: 33, 32, 21 and 41, 40, 28
)
def test_the_lean_ar_step_issues_half_the_ops_per_layer(model: str, eager: int, static: int, kernels: int) -> None:
    """``adtbench bench count``'s figures for one AR step (``bench_count.step_ops``): aten ops per decoder layer on
    the variable-shape path and on the static one a CUDA graph captures, at most half of what they were before the
    vector-norm RMSNorm, the one-product rotary embedding, the scratch buffers and the K/V views of a new width made
    per forward, not per layer (``StaticKVCache.windows``), and its kernels (ops that are not views) per layer."""
    from adtbench.tools.bench_count import step_ops

    sp = SamplingParams(temperature=0.0, cfg_scale=3.0)
    rows = [step_ops(tiny(model, dtype="float32")[0], sp, 1, static) for static in (False, True)]
    assert [r["per_layer_ops"] for r in rows] == [eager, static]
    assert [r["per_layer_kernels"] for r in rows] == [kernels, kernels]
    assert rows[0]["key_columns"] == rows[0]["live_columns"] + 1  # the variable-shape step: the live columns
    assert rows[1]["key_columns"] == 64  # the static step: the first capacity bucket, not the pinned ≈ 280 columns


def test_the_gpu_step_benchmark_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """``benchmarks/lean_step.py`` (the graphed 7B-shaped step a GPU session times) runs at its small CPU shape."""
    import json
    import runpy
    from pathlib import Path

    monkeypatch.setenv("SMALL", "1")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "lean_step.py"
    with torch.random.fork_rng(devices=[]), pytest.raises(SystemExit) as done:  # the host RNG (no device to fork)
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["code"] == "new" and {"eager_ms_capacity", "eager_ms_bucket_imghead"} <= set(out)


# --- optional compile ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_compiled_forward_matches_eager() -> None:
    """``compile_forward`` (inductor, dynamic shapes) = eager within 1e-5 in float32 over AR steps, trees of
    varying size, commits (the compiled graph mutates the real KV cache: the 2-layer target's per-layer caches are
    views of one buffer) and drafter expansions; and the path is really compiled: both stacks became inductor graphs
    with no graph break, and trees of 3 and 5 nodes (and the drafter's expansions of them) share one graph.

    CI time: each graph costs 5–15 s of inductor compilation on the CPU, so the test compiles three, the decode
    loop's: the target's AR step and tree, and the drafter's expansion of several nodes. The prompt's prefill runs
    eagerly before ``compile_forward`` (the compiled graphs then read the KV cache it wrote), and the drafter does not
    expand the AR step's single node: those three graphs (n = the prompt length at cache start 0, and n = 1) took
    40 % of the time."""
    pytest.importorskip("torch._inductor")
    from torch._dynamo.utils import counters

    t0 = time.perf_counter()
    eager_t, eager_d = tiny(dtype="float32")
    comp_t, comp_d = tiny(dtype="float32")
    inputs = eager_t.encode_prompt("a red circle", cfg=True)
    gen = torch.Generator().manual_seed(6)
    trees = [(torch.tensor([3]), ONE, ZERO)]
    for n in (3, 5):
        mask, depth = random_tree(n, gen)
        trees.append((torch.randint(0, 16, (n,), generator=gen), mask, depth))
    res, graphs = [], []
    for t, d in ((eager_t, eager_d), (comp_t, comp_d)):
        out = []
        r = t.start(inputs, 8)
        d.reset(t.rows, 64)
        with torch.no_grad():
            out.append(d.extend(r.features, r.input_embeds, r.positions, r.valid))
        if t is comp_t:
            t.compile_forward()
            d.compile_forward()
            counters.clear()
        for toks, mask, depth in trees * 2:
            logits, feats = t.verify_forward(toks, mask, depth)
            out += [logits, feats]
            t.commit(torch.tensor([0]))
            m = feats.shape[1]
            if m > 1:
                with torch.no_grad():
                    pos, slot = t.next_pos[:, None].expand(-1, m), torch.eye(m, dtype=torch.bool)
                    out.append(d.expand(feats, feats, pos, slot))
                d.rollback()
            if t is comp_t:
                graphs.append(counters["stats"]["unique_graphs"])
        res.append(out)
    for a, b in zip(*res, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    # compiled: the graphs so far after each step (AR, tree of 3, tree of 5, the three again): the target's at the
    # AR step, the drafter's and at most one more of the target's at the first tree (torch 2.14 specialises n = 1:
    # [1, 3, 3, 3, 3, 3]), none for another tree size or a step seen before; no graph break splits a stack
    assert graphs[0] >= 1 and graphs[0] < graphs[1] <= 3 and graphs[1:] == [graphs[1]] * 5, graphs
    assert not counters["graph_break"], dict(counters["graph_break"])
    print(f"compile test: {time.perf_counter() - t0:.1f} s")
