"""One lean AR step of a Chameleon-7B-shaped layer stack (random bf16 weights) on one GPU: what issue 33 §5 changed.

    PYTHONPATH=<checkout> python benchmarks/lean_step.py        # prints one JSON line
    SMALL=1 python benchmarks/lean_step.py                       # a 2-layer float32 shape on the CPU (a smoke test)

The static step a CUDA graph replays (``models.graphs``): 2 CFG rows, one token at live length 600 of a pinned cache of
1,600 columns, K/V written with ``index_copy_``, attention over the mask's width, the final norm and the LM head —
timed eagerly and as a replayed CUDA graph (median of 5 batches), with its CUDA kernel count (profiler), at the whole
capacity and at a capacity bucket of 768 columns, with the full LM head (65,536 rows) and, where the checkout has it,
the image-token head (8,192 rows); also how often CUDA's fused ``rms_norm`` of bf16 equals the cast–normalise–cast
rule. Works on a checkout before issue 33 §5 (``lean_stack(…, tables, style, …)``, q/k ``HeadLayerNorm``s) and after
(``rope.rotary``, ``lean.Scratch``), so run it on both, alternately, on the same warm GPU.
"""

import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from adtbench.models import lean
from adtbench.models import rope as ropem
from adtbench.models.kv import StaticKVCache

NEW = hasattr(ropem, "rotary")
SMALL = os.environ.get("SMALL") == "1"
dev = torch.device("cuda" if torch.cuda.is_available() and not SMALL else "cpu")
dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
if SMALL:
    L, D, H, KV, hd, Fh, V, C, LIVE, IMG = 2, 64, 4, 4, 16, 96, 512, 160, 60, (4, 68)
else:
    L, D, H, KV, hd, Fh, V, C, LIVE, IMG = 32, 4096, 32, 32, 128, 11008, 65536, 1600, 600, (4, 8196)
R = 2
torch.manual_seed(0)


def rnd(*s: int) -> torch.Tensor:
    return torch.randn(*s, device=dev, dtype=dt) * 0.02


layers = []
for _ in range(L):
    kw = dict(
        qkv=rnd(D, (H + 2 * KV) * hd), qkv_bias=None, o=rnd(H * hd, D), up=rnd(D, 2 * Fh), down=rnd(Fh, D),
        heads=H, kv_heads=KV, head_dim=hd, norm_in=True, eps_in=1e-5, eps_ffn=1e-5, norm_dtype=torch.float32,
    )  # fmt: skip
    if NEW:
        kw["qk_norm"] = (1 + rnd(H + KV, hd), rnd(H + KV, hd), 1e-5)
    else:
        kw["q_norm"] = lean.HeadLayerNorm(H, hd).to(dev, dt)
        kw["k_norm"] = lean.HeadLayerNorm(KV, hd).to(dev, dt)
    layers.append(lean.LayerWeights(**kw))
norm_w = 1 + rnd(D)
head_w = rnd(V, D)
cache = StaticKVCache(L, R, KV, C, hd, dt, dev)
cache.buf.normal_()
rope = ropem.Rope1D(hd, 10000.0, "interleaved" if NEW else "half")
memo: dict = {}
x = rnd(R, 1, D)
pos = torch.full((R, 1), LIVE, device=dev)
write = torch.tensor([LIVE], device=dev)


def mask_of(width: int) -> torch.Tensor:
    m = torch.zeros(R, 1, 1, width, device=dev, dtype=dt)
    m[..., LIVE + 1 :] = float("-inf")
    return m


def step(mask: torch.Tensor, image_head: bool) -> torch.Tensor:
    if NEW:
        rot = ropem.rotary(rope, pos, torch.float32, H + KV, KV)
        feats = lean.lean_stack(layers, norm_w, 1e-5, x, rot, mask, cache, write, torch.float32, memo=memo)
    else:
        tables = ropem.qkv_tables(rope, pos, torch.float32, H + KV, KV)
        feats = lean.lean_stack(layers, norm_w, 1e-5, x, tables, rope.style, mask, cache, write, torch.float32)
    if not image_head:
        return F.linear(feats, head_w)
    lo, hi = IMG
    h = feats.reshape(-1, D)
    out = torch.full((h.shape[0], V), torch.finfo(dt).min, dtype=dt, device=dev)
    torch.mm(h, head_w[lo:hi].t(), out=out[:, lo:hi])
    return out


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps: int) -> float:
    """Median ms of ``reps`` calls, in 5 batches (CUDA events on a GPU)."""
    per = []
    for _ in range(5):
        sync()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        per.append(1e3 * (time.perf_counter() - t) / reps)
    per.sort()
    return per[2]


def kernels(fn) -> int:
    if dev.type != "cuda":
        return -1
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


out = {"code": "new" if NEW else "base", "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
widths = {"capacity": C, "bucket": 768 if not SMALL else 64}
with torch.no_grad():
    for name, width in widths.items():
        for image_head in (False, True):
            if image_head and not NEW:
                continue
            mask = mask_of(width)
            key = f"{name}{'_imghead' if image_head else ''}"

            def fwd(mask=mask, image_head=image_head):
                return step(mask, image_head)

            for _ in range(3):
                fwd()
            out[f"eager_ms_{key}"] = timed(fwd, 10 if not SMALL else 3)
            out[f"kernels_{key}"] = kernels(fwd)
            if dev.type == "cuda":
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        fwd()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                t0 = time.perf_counter()
                with torch.cuda.graph(g):
                    res = fwd()
                sync()
                out[f"capture_s_{key}"] = time.perf_counter() - t0
                ref = fwd().float()
                g.replay()
                sync()
                out[f"graph_vs_eager_maxdiff_{key}"] = float((res.float() - ref).abs().max())
                out[f"graph_ms_{key}"] = timed(g.replay, 50)
                del g
    if dev.type == "cuda":  # CUDA's fused rms_norm of bf16 vs the cast–normalise–cast rule
        z = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) * 3
        a = F.rms_norm(z, (4096,), None, 1e-5)
        b = F.rms_norm(z.float(), (4096,), None, 1e-5).to(torch.bfloat16)
        out["rms_fused_bf16_equal_frac"] = float((a == b).float().mean())
        out["rms_fused_bf16_max_rel"] = float(((a.float() - b.float()).abs() / b.float().abs().clamp_min(1e-3)).max())
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
print(json.dumps(out), flush=True)
sys.exit(0)
