"""No hard-coded device in the decode loop, checked without a GPU.

On a GPU the algorithm's tensors must be born on the model's device and its random numbers drawn by the
generator on *its* device: a CPU ``torch.rand(..., generator=cuda_generator)`` crashes there (the bug the first GPU
run found), and a CPU-born tensor is a host→device copy per cycle. On the CPU both mistakes are silent, so this test
watches every torch call of full decodes — every tree policy × exact / LANTERN × greedy / T = 1, with a gate, the
ZipAR and MuLo-SD loops — and fails when

- a random-number call with a generator (``torch.rand*``, ``randint``, ``randperm``, ``normal``, ``bernoulli``,
  ``multinomial``) in an algorithm module does not name the generator's device, or one anywhere in adtbench names
  another device, or an in-place sampler (``exponential_`` …) fills a tensor on another device than its generator's;
  or
- a tensor factory (``tensor``, ``zeros``, ``ones``, ``full``, ``empty``, ``arange``, ``eye``, ``rand*`` …) called
  from the tree loop's modules (engine, tree, verify, sampling, lantern, gate, the drafting session, the policies)
  does not pass ``device=``.

A negative control plants the original bug (a CPU draw from a generator) in an algorithm module's namespace and
checks that the watcher reports it. Acceptance runs on the device here (``engine.acceptance=device``: what a GPU
runs; on the CPU the default is the float64 host walk, the reference).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import synthetic_cost_model, tiny
from torch.overrides import TorchFunctionMode

from adtbench.algorithm.cost import TreeBudget
from adtbench.algorithm.engine import generate
from adtbench.algorithm.methods.lantern import LanternRule, nearest_codes
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.policies.static import ChainPolicy, StaticTreePolicy
from adtbench.algorithm.policies.zipar import ZipARPolicy
from adtbench.algorithm.verify import EXACT
from adtbench.sampling_params import SamplingParams

PKG = Path(__file__).resolve().parents[1] / "adtbench"
LOOP = [PKG / "algorithm" / f for f in ("engine.py", "tree.py", "verify.py", "sampling.py")]
LOOP += [PKG / "algorithm" / "methods" / f for f in ("lantern.py", "gate.py")]
LOOP += [PKG / "algorithm" / "drafters" / "session.py", PKG / "algorithm" / "policies"]
FACTORIES = frozenset(
    {"tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "eye", "linspace", "rand", "randn",
     "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson", "empty_strided", "scalar_tensor"}
)  # fmt: skip
RANDOM = frozenset({"rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson"})
IN_PLACE = frozenset({"uniform_", "exponential_", "normal_", "random_", "bernoulli_", "geometric_", "log_normal_"})


def _site() -> tuple[Path, int] | None:
    """The innermost adtbench frame of the current call (None: the call came from test code)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if path.is_relative_to(PKG):
            return path, frame.f_lineno
        frame = frame.f_back
    return None


class Watcher(TorchFunctionMode):
    """Records the device-discipline violations of the torch calls made while active (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        gen = kwargs.get("generator")
        if name in FACTORIES or (name in IN_PLACE and gen is not None):
            site = _site()
            if site is not None:
                self._check(name, args, kwargs, gen, *site)
        return func(*args, **kwargs)

    def _check(self, name: str, args: tuple, kwargs: dict, gen: Any, path: Path, line: int) -> None:
        where = f"{path.relative_to(PKG.parent)}:{line} {name}"
        if name in IN_PLACE:
            if args[0].device != gen.device:
                self.violations.append(f"{where}: fills a {args[0].device} tensor from a {gen.device} generator")
            return
        if gen is not None or name in RANDOM:
            if "device" not in kwargs and gen is not None and path.is_relative_to(PKG / "algorithm"):
                self.violations.append(f"{where}: draws from a generator without naming its device")
            elif gen is not None and "device" in kwargs and torch.device(kwargs["device"]) != gen.device:
                self.violations.append(f"{where}: draws on {kwargs['device']} from a {gen.device} generator")
        if "device" not in kwargs and any(path.is_relative_to(p) for p in LOOP):
            self.violations.append(f"{where}: a tensor built without device= in the decode loop")


def _lantern(target: Any) -> LanternRule:
    return LanternRule(nearest_codes(target.codebook(), 4), target.layout.image_token_offset, delta=0.2)


def _cost(policy: Any) -> Any:
    policy.cost.tree = TreeBudget(synthetic_cost_model(), calibrate=True)
    return policy


POLICIES = {
    "chain": lambda: ChainPolicy(3),
    "static": lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1]]),
    "static_sampled": lambda: StaticTreePolicy([[0], [1], [0, 0]], "sample"),
    "static_gated": lambda: _gated(StaticTreePolicy([[0], [1], [0, 0]], "sample")),
    "eagle2": lambda: Eagle2Policy(depth=3, top_k=4, total_tokens=20),
    "eagle2_cost": lambda: _cost(Eagle2Policy(depth=3, top_k=4, total_tokens=20, budget="cost")),
    "eagle2_sampled": lambda: Eagle2Policy(depth=3, top_k=4, total_tokens=20, draft_sampling="sample"),
    "adt_fixed": lambda: ADTPolicy(D0=3, K0=4, K_max=6, N_max=19, budget="fixed"),
    "adt_cost": lambda: _cost(ADTPolicy(D0=3, K0=4, K_max=6, N_max=19, budget="cost")),
    "adt_cost_sampled": lambda: _cost(ADTPolicy(D0=3, K0=4, K_max=6, N_max=19, budget="cost", draft_sampling="sample")),
    "zipar": lambda: ZipARPolicy(window=2),
}


def _gated(policy: Any) -> Any:
    from adtbench.algorithm.methods.gate import DraftGate

    policy.gate = DraftGate(1.5, 2)
    return policy


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T1"])
@pytest.mark.parametrize("relax", ["exact", "lantern"])
def test_every_policy_keeps_its_tensors_and_draws_on_the_device(relax: str, temperature: float) -> None:
    target, drafter = tiny("tiny_llamagen", dtype="float32")
    rule = EXACT if relax == "exact" else _lantern(target)
    sp = SamplingParams(temperature=temperature, cfg_scale=3.0)
    inputs = target.encode_prompt("a red circle", cfg=True)
    with Watcher() as w:
        for make in POLICIES.values():
            generate(target, drafter, make(), inputs, sp, torch.Generator().manual_seed(0), rule, "device")
    assert w.violations == [], "\n".join(sorted(set(w.violations)))


def test_mulo_keeps_its_draws_on_the_generator_device() -> None:
    from test_mulo import pair

    from adtbench.algorithm.methods.mulo import MuloParams, decode_mulo

    target, models = pair()
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    with Watcher() as w:
        decode_mulo(target, models, target.encode_prompt("a red circle", cfg=True), sp, torch.Generator(), MuloParams())
    assert not [v for v in w.violations if "generator" in v], "\n".join(sorted(set(w.violations)))


def test_the_watcher_catches_a_cpu_draw_from_a_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the first GPU run's bug, planted in ``sampling`` (compiled under its file name, so the call
    site is the algorithm module), is reported — as are a device-less tensor in the loop and a mismatched fill."""
    import adtbench.algorithm.sampling as S
    import adtbench.algorithm.verify as V

    source = (
        "def bad(shape, generator, device):\n    return torch.rand(shape, generator=generator, dtype=torch.float64)\n"
    )
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(source, S.__file__, "exec"), scope)
    monkeypatch.setattr(V, "uniforms", scope["bad"])  # the acceptance step's draws
    target, drafter = tiny("tiny_llamagen", dtype="float32")
    sp = SamplingParams(temperature=1.0, cfg_scale=3.0)
    with Watcher() as w:
        generate(target, drafter, POLICIES["static_sampled"](), target.encode_prompt("a", cfg=True), sp,
                 torch.Generator().manual_seed(0), acceptance="device")  # fmt: skip
    assert any("without naming its device" in v and "sampling.py" in v for v in w.violations)
    assert any("without device= in the decode loop" in v for v in w.violations)
