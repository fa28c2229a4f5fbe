"""``adtbench check policy=<name> [policy.<key>=<value> …] [check.tier=quick|full] [check.seed=<int>]``

Is a method what it claims? Runs on the tiny float64 models (random weights; no file, no network) and prints one
verdict line per check — ``PASS``, ``FAIL`` or ``SKIP`` with the reason — then exits 1 when any check failed (2 on a
usage error, e.g. an unknown policy):

- ``config``: the policy's yaml and keys compose (Hydra, plugins' search path included) and build; every key its
  schema declares with a rule (``algorithm.params.key``: choices, numbers, flags) rejects a wrong value with a
  ``ConfigError`` naming ``policy.<key>``, and so does an unknown key; ``engine.graphs.step=graph`` either builds or
  is a ``ConfigError`` naming ``engine.graphs.step`` — before any weights load;
- ``greedy``: T = 0 equals AR greedy token for token on both CFG rows, acceptance on the device and on the host, in
  the raster layout and in an end-of-line layout (Lumina's: forced end-of-line / end-of-image tokens); a method that
  declares itself lossy and differs gets a SKIP naming the first differing token, not a failure;
- ``law``: for a method that declares itself lossless (``Method.lossless``; the built policy's ``lossless``), the
  T = 1 law test — N images of a 2 × 2 image over 3 codes (CFG 3) against AR's exact law, Pearson's χ² over the
  pooled cells at α = 10⁻³, its power stated as the total-variation distance it detects with probability 0.9
  (``algorithm.laws``). Tiers: ``quick`` N = 2000 (TV ≈ 0.09; seconds for a batched loop), ``full`` N = 6500
  (TV ≤ 0.05, simulated, the headline tier of ``tests/test_laws.py``; under a minute). The method's ``law_keys``
  (e.g. a window of 3) apply where the command line leaves a key unset;
- ``device``: the simulated CUDA device (``accel.simulate``: CUDA's placement rules enforced) with the target's and
  drafter's verifies captured as graphs (``engine.compile``'s path): greedy equals AR there too, and the run replays
  graphs.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf

from adtbench import accel
from adtbench.algorithm.policies.base import LoopPolicy, Method, Policy, TreePolicy, method_of
from adtbench.algorithm.verify import EXACT
from adtbench.errors import ConfigError
from adtbench.sampling_params import SamplingParams

__all__ = ["TIERS", "Verdict", "law_table", "main", "run_checks", "tiny_models"]

TIERS: dict[str, int] = {"quick": 2000, "full": 6500}
"""``check.tier`` → images of the law test."""
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)
T1 = SamplingParams(temperature=1.0, cfg_scale=3.0)
PROMPT = "a red circle"
EOL_LAYOUT = {"num_codes": 60, "grid_h": 3, "grid_w": 4, "eol_token": 61, "eoi_token": 62}  # 3 rows of 4 + EOL, EOI
LAW_GRID = {"arch.vocab_size": 3, "arch.block_size": 16, "vq.kind": "none"}
SLOTS, BATCH_CHECKED = 16, 25  # the law test's batch (``sample_images``)
MIN_ACCEPTED = 0.3  # drafts accepted per image below which a law test saw too little to mean anything


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One check's outcome: ``status`` PASS / FAIL / SKIP, the check's name and what it saw."""

    status: str
    check: str
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.check}: {self.detail}"


def tiny_models(name: str = "tiny_llamagen", dtype: str = "float64", **over: Any) -> tuple[Any, Any]:
    """A tiny target (``conf/model/<name>.yaml``, random weights, ``over``: dotted model keys) and a random EAGLE
    drafter for it (float64 by default: exactness checks). ``tests/conftest.py``'s ``tiny`` is this."""
    from adtbench import resources
    from adtbench.harness.config import register_resolvers
    from adtbench.harness.drafters import build_drafter
    from adtbench.models.registry import build_target

    register_resolvers()
    cfg = OmegaConf.load(resources.conf_dir() / "model" / f"{name}.yaml")
    for k, v in {"dtype": dtype, **over}.items():
        OmegaConf.update(cfg, k, v, merge=True)
    target = build_target(cfg)
    dcfg = OmegaConf.create({"kind": "eagle", "path": None, "seed": 1, "num_layers": 1, "input_norm": False})
    return target, build_drafter(dcfg, target)


def flat_cost_model() -> Any:
    """A stand-in cost model for ``budget: cost`` policies on the tiny models: verify cost 1 ms + 0.02 ms per node,
    cheap drafter levels (the check needs trees of several sizes, not this machine's figures)."""
    from adtbench.algorithm.cost import CostModel

    sizes = [1, 2, 4, 8, 16, 32, 64]
    return CostModel(sizes, [1.0 + 0.02 * n for n in sizes], [1, 4, 16], [0.02, 0.03, 0.04], 0.05)


# ---------------------------------------------------------------------------------------------------------
# the policy under check
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Subject:
    """The method under check: its ``Method``, the composed policy node (yaml + the command line's keys) and the keys
    the command line set."""

    method: Method
    node: dict[str, Any]
    given: set[str]

    def build(self, **keys: Any) -> Policy:
        """The policy of ``node`` with ``keys`` set where the command line left them unset."""
        node = {**self.node, **{k: v for k, v in keys.items() if k not in self.given}}
        policy = self.method(node)
        policy.bind(lambda *_: flat_cost_model())
        return policy


def compose_subject(overrides: list[str]) -> Subject:
    """Compose ``policy=<name>`` and its ``policy.<key>=`` overrides (a ``ConfigError`` on a bad one)."""
    from adtbench.harness.config import compose_config

    name = next((o.partition("=")[2] for o in overrides if o.startswith("policy=")), None)
    if not name:
        raise ConfigError("policy", "adtbench check needs policy=<name>")
    method = method_of(name)
    smoke = [o for o in method.smoke if o.startswith("policy.")]
    cfg = compose_config("config", ["model=tiny_llamagen", *smoke, *overrides])
    node = OmegaConf.to_container(cfg.policy, resolve=True)
    assert isinstance(node, dict)
    keys = [o.lstrip("+~").partition("=")[0] for o in overrides]
    given = {k.removeprefix("policy.") for k in keys if k.startswith("policy.")}
    return Subject(method, node, given)


def tiny_refusal(subject: Subject) -> str | None:
    """Why the method cannot run on the tiny models alone (None: it can): ``Method.tiny`` False (MuLo-SD's
    low-resolution model), or its loop's models need the harness (``LoopPolicy.models_for``: ``window: cost``)."""
    if not subject.method.tiny:
        return f"policy={subject.method.name} needs models beyond the tiny target (Method.tiny = False)"
    policy = subject.build()
    try:
        aux_of(policy, None)
    except ValueError as e:
        return f"the tiny models cannot run it: {e}"
    return None


def aux_of(policy: Policy, drafter: Any) -> Any:
    """What ``engine.generate`` hands the policy besides the target: the drafter (a tree policy) or the loop's models
    on the tiny target (``LoopPolicy.models_for``)."""
    return drafter if isinstance(policy, TreePolicy) else policy.models_for(drafter)


def generate_with(
    policy: Policy, target: Any, drafter: Any, sp: SamplingParams, g: Any, where: str = "auto", inputs: Any = None
) -> Any:
    """One image of ``PROMPT`` (``inputs``: its encoding, else encoded here)."""
    from adtbench.algorithm.engine import generate

    inputs = target.encode_prompt(PROMPT, cfg=True) if inputs is None else inputs
    return generate(target, aux_of(policy, drafter), policy, inputs, sp, g, EXACT, where)


# ---------------------------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------------------------


def check_config(subject: Subject) -> Verdict:
    """``config`` (module docstring): the node builds; wrong values and an unknown key are ``ConfigError``s naming
    the key; ``engine.graphs.step=graph`` builds or names ``engine.graphs.step``."""
    from adtbench.harness.config import build_policy

    method, node = subject.method, subject.node
    try:
        subject.build()
    except ConfigError as e:
        return Verdict("FAIL", "config", f"the composed keys do not build: {e}")
    fields = {f.name: f for f in dataclasses.fields(method.schema_type)}
    probes: list[tuple[str, Any]] = [("no_such_key", 1)]
    for name, f in fields.items():
        rule = f.metadata
        if rule.get("choices") is not None:
            probes.append((name, "no_such_choice"))
        elif isinstance(f.default, bool):
            probes.append((name, "maybe"))
        elif isinstance(f.default, int | float):
            probes.append((name, "not a number"))
    for key, bad in probes:
        full = f"policy.{key}"
        try:  # the harness's path: the schema, then the builder (config.build_policy), before any weights load
            build_policy(OmegaConf.create({"policy": {**node, key: bad}}))
        except ConfigError as e:
            if e.key != full:
                return Verdict("FAIL", "config", f"{full}={bad!r}: the error names {e.key}, not {full}")
            continue
        except Exception as e:
            return Verdict("FAIL", "config", f"{full}={bad!r}: raised {type(e).__name__}: {e}")
        return Verdict("FAIL", "config", f"{full}={bad!r}: accepted")
    key = "engine.graphs.step"
    try:
        build_policy(OmegaConf.create({"policy": node, "engine": {"graphs": {"step": "graph"}}}))
    except ConfigError as e:
        if e.key != key:
            return Verdict("FAIL", "config", f"{key}=graph: names {e.key}, not {key}")
    except Exception as e:
        return Verdict("FAIL", "config", f"{key}=graph: raised {type(e).__name__}: {e}")
    return Verdict("PASS", "config", f"{len(probes)} wrong values refused naming their key; the composed keys build")


def check_greedy(subject: Subject) -> Verdict:
    """``greedy`` (module docstring)."""
    from adtbench.algorithm.engine import decode_ar

    target, drafter = tiny_models()
    eol_layout = dataclasses.replace(target.layout, **EOL_LAYOUT)
    cases = 0
    for layout_name, layout in (("raster", target.layout), ("end-of-line", eol_layout)):
        target.layout = layout
        ar = decode_ar(target, target.encode_prompt(PROMPT, cfg=True), GREEDY, None)
        for where in ("device", "host"):
            policy = subject.build()
            res = generate_with(policy, target, drafter, GREEDY, torch.Generator().manual_seed(1), where)
            if res.tokens != ar.tokens:
                first = next(i for i, (a, b) in enumerate(zip(res.tokens, ar.tokens, strict=False)) if a != b)
                what = (f"{layout_name} layout, acceptance on the {where}: token {first} is {res.tokens[first]}, "
                        f"AR's is {ar.tokens[first]}")  # fmt: skip
                if not subject.method.claims_lossless(policy):  # a lossy method may differ even greedily (ZipAR)
                    return Verdict("SKIP", "greedy", f"{what} (policy={subject.method.name} declares itself lossy)")
                return Verdict("FAIL", "greedy", what)
            cases += 1
    return Verdict("PASS", "greedy", f"= AR token for token ({cases} runs: raster and end-of-line layouts, acceptance "
                   "on the device and the host, CFG's two rows)")  # fmt: skip


def check_law(subject: Subject, n: int, seed: int = 7) -> Verdict:
    """``law`` (module docstring): N images at T = 1 against AR's exact law."""
    from adtbench.algorithm import laws

    policy = subject.build(**subject.method.law_keys)
    if not subject.method.claims_lossless(policy):
        return Verdict("SKIP", "law", f"policy={subject.method.name} declares itself lossy (Method.lossless "
                       f"{subject.method.lossless}, policy.lossless {getattr(policy, 'lossless', None)})")  # fmt: skip
    target, drafter = tiny_models(**LAW_GRID)
    target.layout = dataclasses.replace(target.layout, grid_h=2, grid_w=2)
    law = laws.exact_law(target, target.encode_prompt(PROMPT, cfg=True), T1)
    t0 = time.perf_counter()
    counts, accepted, how = sample_images(policy, target, drafter, n, seed)
    r = laws.chi2_law(f"policy={subject.method.name}", counts, law, n)
    what = (f"T = 1 law test (2×2 image, 3 codes, CFG 3): N = {n}, {r.k} cells, TV detected at 90 % power "
            f"{r.tv90:.4f}, p = {r.pvalue:.3g} (α = {laws.ALPHA:g}), {accepted / n:.2f} drafts accepted per image, "
            f"{how}, {time.perf_counter() - t0:.0f} s")  # fmt: skip
    if r.pvalue < laws.ALPHA:
        return Verdict("FAIL", "law", f"{what}: the output law is not AR's")
    drafts = isinstance(policy, LoopPolicy) or policy.uses_drafter  # AR drafts nothing: its law test stands alone
    if drafts and accepted / n < MIN_ACCEPTED:
        return Verdict("FAIL", "law", f"{what}: too few drafts accepted for the test to see the acceptance path")
    return Verdict("PASS", "law", what)


def sample_images(policy: Policy, target: Any, drafter: Any, n: int, seed: int) -> tuple[Counter, int, str]:
    """``n`` images of ``policy`` at T = 1 (image i drawn with its own generator, seeded ``seed``·1 000 003 + i):
    their token tuples counted, the drafts accepted in all, and how they were drawn. A policy that decodes batches
    (a batchable loop's ``generate_batch``; a drafting tree policy: ``batch.generate_batch``) draws through
    ``SLOTS`` slots, and its first ``BATCH_CHECKED`` images must equal one-at-a-time decodes with the same
    generators (so the law tested is the B = 1 loop's too; a difference in a fraction f ≥ 0.09 of the images is seen
    with probability ≥ 0.9); otherwise one image at a time. The prompt's prefill runs once, restored for every
    further image (``StaticGPTTarget.reuse_prefill``: the same tokens, untimed)."""
    inputs = target.encode_prompt(PROMPT, cfg=True)
    with target.reuse_prefill(inputs):
        return draw_images(policy, target, drafter, inputs, n, seed)


def draw_images(policy: Policy, target: Any, drafter: Any, inputs: Any, n: int, seed: int) -> tuple[Counter, int, str]:
    """``sample_images`` of ``inputs``."""
    from adtbench.algorithm.batch import generate_batch
    from adtbench.models.batch import BatchTarget

    counts: Counter = Counter()
    accepted = 0

    def gen(i: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed * 1_000_003 + i)

    def alone(i: int) -> list[int]:
        return generate_with(policy, target, drafter, T1, gen(i), inputs=inputs).tokens

    tree = isinstance(policy, TreePolicy) and policy.uses_drafter
    if not (tree or (isinstance(policy, LoopPolicy) and policy.batchable)):
        for i in range(n):
            res = generate_with(policy, target, drafter, T1, gen(i), inputs=inputs)
            counts[tuple(res.tokens)] += 1
            accepted += sum(c.accepted for c in res.cycles)
        return counts, accepted, "one image at a time"
    first: dict[int, list[int]] = {}

    def done(key: int, res: Any) -> None:
        nonlocal accepted
        counts[tuple(res.tokens)] += 1
        accepted += sum(c.accepted for c in res.cycles)
        if key < BATCH_CHECKED:
            first[key] = res.tokens

    bt = BatchTarget(target, SLOTS, True, 64 + target.layout.num_gen_tokens)
    items = [(i, inputs, gen(i)) for i in range(n)]
    if tree:
        generate_batch(bt, drafter, policy, items, T1, done, EXACT, "auto")  # type: ignore[arg-type]
    else:
        policy.generate_batch(bt, aux_of(policy, drafter), items, T1, done, EXACT, "auto")  # type: ignore[union-attr]
    for i in range(min(n, BATCH_CHECKED)):
        if alone(i) != first[i]:
            raise AssertionError(f"image {i}: the batched loop's tokens differ from a one-at-a-time decode's")
    return counts, accepted, f"{SLOTS} slots (the first {BATCH_CHECKED} = one-at-a-time decodes)"


def check_device(subject: Subject) -> Verdict:
    """``device`` (module docstring): greedy = AR on the simulated CUDA device with graphs."""
    from adtbench.algorithm.engine import decode_ar

    with accel.simulate() as sim:
        target, drafter = tiny_models(dtype="float32", device="cuda")
        target.request_static(graphs=True)
        drafter.request_static(graphs=True)
        ar = decode_ar(target, target.encode_prompt(PROMPT, cfg=True), GREEDY, accel.generator(target.device, 0))
        policy = subject.build()
        res = generate_with(policy, target, drafter, GREEDY, accel.generator(target.device, 0))
        replays, reads = sim.counts["graph_replays"], sim.counts.get("device_reads", 0)
    if res.tokens != ar.tokens:
        return Verdict("FAIL", "device", "greedy differs from AR on the simulated CUDA device")
    if replays == 0 and subject.method.graphs:
        return Verdict("FAIL", "device", f"declares graph paths {subject.method.graphs} but replayed no graph")
    return Verdict("PASS", "device", f"simulated CUDA device with graphs: greedy = AR, {replays} graph replays, "
                   f"{reads} host reads")  # fmt: skip


def run_checks(overrides: list[str], tier: str = "quick", seed: int = 7, out: Callable[[str], None] = print) -> bool:
    """Every check of the module docstring for ``overrides`` (``policy=<name>``, ``policy.<key>=…``); prints one
    line each through ``out``; True when none failed."""
    subject = compose_subject(overrides)
    verdicts: list[Verdict] = []

    def emit(verdict: Verdict) -> None:
        verdicts.append(verdict)
        out(verdict.line())

    emit(check_config(subject))
    if verdicts[0].status == "PASS":  # the other checks build the policy from the same keys
        why = tiny_refusal(subject)
        checks: list[tuple[str, Callable[[], Verdict]]] = [
            ("greedy", lambda: check_greedy(subject)),
            ("law", lambda: check_law(subject, TIERS[tier], seed)),
            ("device", lambda: check_device(subject)),
        ]
        for name, run in checks:
            if why is not None:
                emit(Verdict("SKIP", name, why))
                continue
            try:
                emit(run())
            except Exception as e:  # a crash fails its check; the others still run
                emit(Verdict("FAIL", name, f"raised {type(e).__name__}: {e}"))
    failed = [v.check for v in verdicts if v.status == "FAIL"]
    out(f"{'FAIL' if failed else 'PASS'} policy={subject.method.name}: " + (f"failed {', '.join(failed)}" if failed
        else f"{sum(v.status == 'PASS' for v in verdicts)} checks passed"))  # fmt: skip
    return not failed


def law_table() -> str:
    """What each registered method declares, as the markdown table of docs/development.md ("What each method
    declares"; ``adtbench check --law-table`` prints it): derived from the registry, so a method appears by
    registering and the doc's copy is checked against this (``tests/test_methods.py``)."""
    from adtbench.algorithm.policies import methods

    rows = [
        "| policy | lossless under | graph paths | tiny models | `adtbench check` law test (quick tier) |",
        "|---|---|---|---|---|",
    ]
    for m in methods():
        lossless = ", ".join(f"{r} acceptance" for r in m.lossless) or "— (lossy)"
        graphs = ", ".join(m.graphs) or "—"
        if not m.lossless:
            law = "— (declares itself lossy)"
        elif not m.tiny:
            law = "— (needs models beyond the tiny target: its own tests)"
        else:
            keys = ", ".join(f"{k}={v}" for k, v in m.law_keys.items())
            law = f"T = 1, 2×2 image, 3 codes, N = {TIERS['quick']}" + (f" ({keys})" if keys else "")
        rows.append(f"| `{m.name}` | {lossless} | {graphs} | {'yes' if m.tiny else 'no'} | {law} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """``adtbench check``'s command line (module docstring)."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(__doc__)
        return 0
    if argv == ["--law-table"]:
        print(law_table())
        return 0
    tier, seed, overrides = "quick", 7, []
    for word in argv:
        key, eq, value = word.partition("=")
        if not eq:
            print(f"adtbench check: expected key=value, got {word!r}", file=sys.stderr)
            return 2
        if key == "check.tier":
            if value not in TIERS:
                print(f"adtbench check: check.tier must be one of {sorted(TIERS)}, got {value!r}", file=sys.stderr)
                return 2
            tier = value
        elif key == "check.seed":
            seed = int(value)
        elif key == "policy" or key.lstrip("+~").startswith("policy."):
            overrides.append(word)
        else:
            print(
                f"adtbench check: unknown argument {word!r} (policy=…, policy.<key>=…, check.tier=…)", file=sys.stderr
            )
            return 2
    torch.set_num_threads(1)  # tiny models: more threads only add overhead (and contend on a shared machine)
    try:
        return 0 if run_checks(overrides, tier, seed) else 1
    except ConfigError as e:
        print(f"adtbench: config error: {e}", file=sys.stderr)
        return 2
