"""``StaticGPTTarget.reuse_prefill``: the law tests' prompt prefill, run once and restored for every further image.

The images of every law setup and loop (B = 1 trees and Jacobi chains, the batched slots, the graphed levels on the
simulated device, the tree verify's step; CFG's two rows and a prompt without CFG) are token-identical with and
without it, seed for seed; decoding never writes the prompt's K/V columns; the reuse is off unless entered, and no
library module but the law check (``harness.check``, untimed) enters it — a timed run prefills every image.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import test_jacobi_step as TJ
import test_laws as TL
import torch
from conftest import tiny

from adtbench.algorithm.engine import decode_ar, generate
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.models.base import StaticGPTTarget
from adtbench.models.batch import BatchTarget
from adtbench.sampling_params import SamplingParams

PKG = Path(__file__).resolve().parents[1] / "adtbench"
ENTERS_REUSE = {"models/base.py", "harness/check.py"}
"""The library files that may name ``reuse_prefill``: its definition, and the law check (``adtbench check``'s law
test: many untimed images of one prompt)."""
SEEDS, IMAGES = (7, 8, 9), 6


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Recorder(TL.PathWatch):
    """A ``PathWatch`` that also keeps each image's tokens, in the order ``sample_images`` files them."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[list[int]] = []

    def image(self, generator: Any, res: Any, chain: bool, depth: int = 0) -> None:
        self.tokens.append(list(res.tokens))
        super().image(generator, res, chain, depth)


def images(case: TL.Case, seed: int, reuse: bool) -> list[list[int]]:
    """``IMAGES`` images of ``case`` from ``seed`` (``sample_images``: a batched case's first ones also checked against
    B = 1 decodes), with or without the prefill's reuse."""
    with Recorder() as rec:
        TL.sample_images(case, IMAGES, seed, paths=rec, reuse=reuse)
    return rec.tokens


def cases_per_setup() -> dict[str, TL.Case]:
    """Per setup, the first case of each loop it is drawn by (drafter or Jacobi, B = 1 or batched), and the EAGLE-2
    headline on the simulated device with graphed levels (``q3-graphed``, what the graphed-levels test draws)."""
    seen: dict[tuple[str, str, bool], str] = {}
    for name, (case, _, _) in TL.ALL.items():
        seen.setdefault((case[0], case[2], case[5] > 1), name)
    eagle = TL.HEADLINE[TL.EAGLE]
    return {
        **{name: TL.ALL[name][0] for name in sorted(seen.values())},
        f"{TL.EAGLE}-graphed": ("q3-graphed", *eagle[1:]),
    }


CASES = cases_per_setup()


@pytest.fixture
def prompt_kv_watch(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """After every commit (a target's ``commit`` or the tree step's in-replay one, both ending in ``committed``; a
    batch's, or the batched step's in-replay one, both ending in ``BatchTarget.committed``), the prompt's K/V columns of
    every prefilled row equal the prefill's kept copy (``reuse_prefill``'s): decoding — the trees' scratch columns,
    compaction, rollback — writes past the prompt only. Returns the number of commits checked."""
    checked = [0]
    committed, batch_committed = StaticGPTTarget.committed, BatchTarget.committed

    def kept(t: Any) -> torch.Tensor | None:
        if t._reuse is None:
            return None
        kvs = list(t._reuse[1].values())
        return kvs[0][1] if kvs else None

    def target_committed(self: Any, *args: Any, **kwargs: Any) -> None:  # ``commit``'s end, or the tree step's
        committed(self, *args, **kwargs)
        kv = kept(self)
        if kv is not None and self.cache.buf.shape[1] == kv.shape[1]:
            assert torch.equal(self.cache.buf[:, :, :, : kv.shape[3]], kv), "decoding wrote the prompt's K/V"
            checked[0] += 1

    def slots_committed(self: Any, k: Any) -> None:  # a batch's ``commit``'s end, or the batched step's
        batch_committed(self, k)
        kv = kept(self.target)
        if kv is not None:
            for s in (s for s in range(self.B) if self.length[s] > 0):
                got = self.cache.buf[:, self.slot_rows(s), :, : kv.shape[3]]
                assert torch.equal(got, kv), f"decoding wrote slot {s}'s prompt K/V"
            checked[0] += 1

    monkeypatch.setattr(StaticGPTTarget, "committed", target_committed)
    monkeypatch.setattr(BatchTarget, "committed", slots_committed)
    return checked


@pytest.mark.parametrize("name", list(CASES))
def test_the_images_are_the_same_with_the_prefill_reused(name: str, prompt_kv_watch: list[int]) -> None:
    """Every setup (CFG's two rows; the end-of-line layout; the simulated device with graphed levels; the tree step)
    through each loop that draws it: the same tokens per seed with the prefill reused as without, and the prompt's
    K/V untouched by decoding."""
    case = CASES[name]
    for seed in SEEDS:
        assert images(case, seed, reuse=True) == images(case, seed, reuse=False), (name, seed)
    assert prompt_kv_watch[0] >= len(SEEDS) * IMAGES  # the K/V checked after the commits of every image


@pytest.mark.parametrize("setup", list(TJ.LAW_SETUPS))
def test_the_fixed_shape_step_draws_the_same_with_the_prefill_reused(setup: str, prompt_kv_watch: list[int]) -> None:
    """The device-resident Jacobi step's law-test images (``test_jacobi_step.step_images``: SCD, its static buckets
    over the pinned cache), per seed, with and without the reuse; the prompt's K/V as a prefill leaves it after the
    reused images (the step commits on its own, not through ``commit``)."""
    target, inputs, _ = TJ.law_setup(setup)
    P = target.start(inputs, 1).valid.shape[1]
    prompt_kv = target.cache.buf[:, :, :, :P].clone()
    for seed in SEEDS:
        runs = []
        for reuse in (True, False):
            runs.append(TJ.step_images(target, inputs, "scd", {"window": 3}, IMAGES, gen(seed), reuse))
            assert torch.equal(target.cache.buf[:, :, :, :P], prompt_kv), (setup, seed, reuse)
        assert [r.tokens for r in runs[0]] == [r.tokens for r in runs[1]], (setup, seed)


def test_a_prompt_without_cfg_is_the_same_with_the_prefill_reused(prompt_kv_watch: list[int]) -> None:
    """One row (no CFG): EAGLE-2's B = 1 images per seed, with and without the reuse."""
    s = TL.setup_of("q3")
    inputs, sp = s.target.encode_prompt("a blue square", cfg=False), SamplingParams(temperature=1.0, top_k=3)

    def draw(seed: int) -> list[list[int]]:
        g = gen(seed)
        return [generate(s.target, s.drafter, Eagle2Policy(depth=2, top_k=2, total_tokens=7), inputs, sp, g).tokens
                for _ in range(IMAGES)]  # fmt: skip

    plain = [draw(seed) for seed in SEEDS]
    with s.target.reuse_prefill(inputs):
        assert [draw(seed) for seed in SEEDS] == plain
    assert prompt_kv_watch[0] >= len(SEEDS) * IMAGES


def test_a_wrong_restore_changes_the_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: a restore that leaves the prompt's K/V out (kept as zeros) changes the
    images of the same seed."""
    case = TL.ALL["eagle2-K2-q3"][0]
    right = images(case, 7, reuse=False)
    restore = StaticGPTTarget.prompt_prefill

    def zeroed(self: Any, inputs: Any, capacity: int) -> Any:
        res = restore(self, inputs, capacity)
        for _, kv in (self._reuse or (None, {}))[1].values():
            kv.zero_()
        return res

    monkeypatch.setattr(StaticGPTTarget, "prompt_prefill", zeroed)
    assert images(case, 7, reuse=True) != right


def test_the_reuse_is_off_unless_entered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``reuse_prefill`` every image runs the adapter's prefill (the AR baseline and the speculative loop
    alike); inside it, one prefill per (prompt, capacity) — another prompt runs its own each time —; after it, every
    image again, also after an exception; it does not nest."""
    target, drafter = tiny()
    runs: list[str] = []
    adapter = type(target)._prefill

    def counted(self: Any, inputs: Any, capacity: int) -> Any:
        runs.append(inputs.text)
        return adapter(self, inputs, capacity)

    monkeypatch.setattr(type(target), "_prefill", counted)
    a, b = target.encode_prompt("a red circle", cfg=True), target.encode_prompt("a green tree", cfg=True)
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    g = torch.Generator().manual_seed(0)

    def three() -> None:
        decode_ar(target, a, sp, g)
        generate(target, drafter, Eagle2Policy(depth=2, top_k=2, total_tokens=7), a, sp, g)
        generate(target, drafter, Eagle2Policy(depth=2, top_k=2, total_tokens=7), a, sp, g)

    assert target._reuse is None
    three()
    assert runs == ["a red circle"] * 3
    runs.clear()
    with target.reuse_prefill(a):
        three()
        decode_ar(target, b, sp, g)
        decode_ar(target, b, sp, g)
        with pytest.raises(RuntimeError, match="already entered"), target.reuse_prefill(b):
            pass
    assert runs == ["a red circle"] * 2 + ["a green tree"] * 2  # one per capacity (AR's, the tree policy's)
    runs.clear()
    with pytest.raises(KeyError), target.reuse_prefill(a):
        raise KeyError("left by an exception")
    three()
    assert target._reuse is None and runs == ["a red circle"] * 3


def test_only_the_law_check_enters_the_reuse() -> None:
    """No library module but ``ENTERS_REUSE`` names ``reuse_prefill``: the app, ``bench`` and the AR baseline time a
    prefill per image."""
    named = {
        str(p.relative_to(PKG))
        for p in PKG.rglob("*.py")
        if any(isinstance(n, ast.Attribute) and n.attr == "reuse_prefill" for n in ast.walk(ast.parse(p.read_text())))
        or "def reuse_prefill" in p.read_text()
    }
    assert named <= ENTERS_REUSE, named - ENTERS_REUSE
    assert "models/base.py" in named
