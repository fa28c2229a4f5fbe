"""``decode.batch_size > 1``: the app's decode of a window of prompts, both sides batched (``algorithm.batch``).

A job's unfinished prompts are taken ``batch_size × window`` at a time. Each window is decoded by the AR baseline
(``decode_ar_batch``, groups of B) and by the method (``generate_batch``: continuous batching over B slots; a
batchable loop's own ``generate_batch``, e.g. the Jacobi loops' ragged windows; or ``decode_ar_batch`` for a policy
without a drafter), in an order that alternates from window to window (ABBA:
the baseline first on even windows), each side's wall time measured from before its first prefill to after its last
token (CUDA synchronised; text encoding outside). Every prompt keeps its own seed (``config.prompt_seed``), so its
tokens are those of a B = 1 run. The app commits a window's records once both sides are done: a killed run loses at
most the window in flight and never writes a prompt twice.

Every record of a window carries ``batch``: ``{size, window, images, window_s, baseline_window_s}`` (``window``: an
id unique to the window), from which the summary's throughput is computed (``stats.throughput``).
"""

from __future__ import annotations

import uuid
from typing import Any

import torch

from adtbench import accel
from adtbench.algorithm.batch import decode_ar_batch, generate_batch
from adtbench.algorithm.policies import LoopPolicy
from adtbench.algorithm.records import Clock, GenerationResult
from adtbench.algorithm.slot import Item
from adtbench.harness.data.prompts import Prompt
from adtbench.models.batch import BatchTarget
from adtbench.models.graphs import bucket_of
from adtbench.sampling_params import SamplingParams

Decoded = tuple[Prompt, int, GenerationResult, GenerationResult | None, dict[str, Any]]


class BatchedDecoder:
    """Decodes windows of prompts for one job (module docstring). ``seed_of(prompt) → int``; ``baseline``: time the
    AR side too."""

    def __init__(
        self,
        target: Any,
        drafter: Any,
        policy: Any,
        sp: SamplingParams,
        rule: Any,
        acceptance: str,
        batch_size: int,
        use_cfg: bool,
        gen_device: torch.device,
        seed_of: Any,
        baseline: bool,
    ) -> None:
        self.target, self.drafter, self.policy, self.sp, self.rule = target, drafter, policy, sp, rule
        self.acceptance, self.B, self.use_cfg, self.gen_device = acceptance, batch_size, use_cfg, gen_device
        self.seed_of, self.baseline = seed_of, baseline
        self.clock = Clock(target.device)
        self.bt: BatchTarget | None = None
        self.nodes = max(policy.max_nodes(), policy.max_draft_slots()) if policy.uses_drafter else policy.max_nodes()

    def batch_target(self, inputs: list[Any]) -> BatchTarget:
        """The job's ``BatchTarget``, reallocated only when a prompt needs more columns than it has."""
        t = self.target
        graphs = t.engine_mode == "graphs"  # engine.compile on a GPU: the batch's own graphs
        nodes = (bucket_of(self.nodes) or self.nodes) if graphs else self.nodes  # room for a bucket's padding
        need = max(t.prompt_length(x) for x in inputs) + t.layout.num_gen_tokens + nodes + 1
        if self.bt is None or self.bt.capacity < need:
            self.bt = BatchTarget(t, self.B, self.use_cfg, need)
            if graphs:
                self.bt.request_static(graphs=True)
        return self.bt

    def _side(self, bt: BatchTarget, items: list[Item], method: bool) -> tuple[list[GenerationResult], float]:
        """Decode ``items`` with one side; returns the results in order and the side's wall seconds."""
        t0 = self.clock.now()
        if method and self.policy.uses_drafter and self.drafter is not None:
            got: dict[Any, GenerationResult] = {}
            generate_batch(bt, self.drafter, self.policy, items, self.sp, got.__setitem__, self.rule, self.acceptance)
            results = [got[key] for key, _, _ in items]
        elif method and isinstance(self.policy, LoopPolicy) and self.policy.batchable:  # its own batched decode
            got = {}
            self.policy.generate_batch(bt, self.drafter, items, self.sp, got.__setitem__, self.rule, self.acceptance)
            results = [got[key] for key, _, _ in items]
        else:
            results = []
            for i in range(0, len(items), self.B):
                results += decode_ar_batch(bt, items[i : i + self.B], self.sp)
        return results, self.clock.now() - t0

    def window(self, prompts: list[Prompt], index: int) -> list[Decoded]:
        """Decode one window (baseline first when ``index`` is even); returns per prompt (prompt, seed, method result,
        baseline result or None, the record's ``batch`` field)."""
        encoded, encode_s = [], []
        for p in prompts:
            t0 = self.clock.now()
            encoded.append(self.target.encode_prompt(p.text, cfg=self.use_cfg))
            encode_s.append(self.clock.now() - t0)
        seeds = [int(self.seed_of(p)) for p in prompts]
        bt = self.batch_target(encoded)

        def items() -> list[Item]:
            gens = [accel.generator(self.gen_device, s) for s in seeds]
            return [(i, x, g) for i, (x, g) in enumerate(zip(encoded, gens, strict=True))]

        base: list[GenerationResult] | None = None
        base_s: float | None = None
        if self.baseline and index % 2 == 0:
            base, base_s = self._side(bt, items(), False)
        runs, run_s = self._side(bt, items(), True)
        if self.baseline and index % 2 == 1:
            base, base_s = self._side(bt, items(), False)
        info = {
            "size": self.B,
            "window": uuid.uuid4().hex[:12],
            "images": len(prompts),
            "window_s": run_s,
            "baseline_window_s": base_s,
        }
        out: list[Decoded] = []
        for i, p in enumerate(prompts):
            runs[i].encode_s += encode_s[i]
            b = None if base is None else base[i]
            if b is not None:
                b.encode_s += encode_s[i]
            out.append((p, seeds[i], runs[i], b, info))
        return out
