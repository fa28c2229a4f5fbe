"""Law tests of every lossless path at T > 0, with stated power (the harness: ``adtbench/algorithm/laws.py``).

Each test draws N images of a tiny float64 target, compares their law with AR's exact law (χ² over the pooled
cells, α = 10⁻³) and prints / records the total-variation distance it detects with probability 0.9
(``laws.chi2_law``: the larger of the noncentral approximation and the simulated power against the least visible
alternatives, ``laws.simulated_tv``), asserting it is at most the bound its tier states. A headline test also
asserts which paths its images ran (``PathWatch``, ``required_paths``: each in ≥ 30 % of the images). The setups
(one prompt, CFG 3):

- ``t1``: a 2 × 2 image over 3 codes at T = 1 (81 images; N = 6500 keeps 52 cells, pooled mass < 0.01);
- ``t3``: a 1 × 3 image over 3 codes at T = 1 (27 images; N = 4500: 21 cells) — the chain's headline (a depth-2
  tree from the first token covers the image; a third fewer forwards per image than ``t1``);
- ``q3``: the 1 × 3 image over 4 codes at T = 1, top-k 3 (27 images; N = 5000: 27 cells) — the tree policies'
  headline: with two children per node below the 3 codes a position allows, every child can be refused and the
  bonus drawn from the final residual (on ``t3`` three children covered the codes and that path never ran);
- ``long``: a 2 × 3 image over 3 codes at T = 1, top-k 2 (64 images): six tokens, so a Jacobi draft is redrawn
  (coupled) several times and an adaptive window holds drafts past a shrunken chain;
- ``warped``: a 2 × 2 image over 4 codes at T = 0.7, top-k 3, top-p 0.9 (the warper is not the identity);
- ``eol``: Lumina's layout on the tiny target, 2 rows of 2 codes (3 codes) + end-of-line, then end-of-image: 7
  generation indices, 3 forced; T = 1;
- ``pac``: a 1 × 5 image over 4 codes at T = 1, top-k 3 (243 images; N = 13 000: 243 cells) — SJD-PAC's headline:
  with K = 2 < 3 codes per position the candidates are not the whole support, so a second candidate is tested
  against the reduced q, every live candidate can be refused (the bonus from the final residual), and five tokens
  give the main chain and the adaptive continuation room to run;
- ``k2w4-cycle-graphed``: a 1 × 4 image over 3 codes at T = 1, top-k 2 (16 images; N = 720: 16 cells), a one-layer
  target on the simulated CUDA device with ``engine.compile``'s graphs — the whole graphed tree cycle.

Tiers (``TIERS``): *headline*, one test per lossless policy, TV ≤ 0.05; *setting* (longer images, the warper,
the end-of-line layout), *variant* (the other inits, acceptance paths, proposals and windows) and *cycle* (the whole
graphed tree cycle), cheaper, at the weaker bound each states (CI time: docs/development.md, "Law tests with stated
power"). The negative controls are the real failure modes, each planted into the library's path and each rejected
(p < 10⁻³) by the same test that the exact code passes at the same N: the SCD authors' stored proposal for a kept
draft, a residual re-processed by the warper (planted into the exact fast path EAGLE-2 takes), a bonus after a full
accept drawn from the wrong row, SJD-PAC's q not reduced after a refused candidate. A direct test checks that the
coupled redraw's output is distributed as p (``jacobi.redraw`` on x ~ q_old).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
import torch
from conftest import synthetic_cost_model, tiny

import adtbench.algorithm.methods.jacobi.loop as J
import adtbench.algorithm.tree_step as TS
import adtbench.algorithm.verify as V
from adtbench import accel
from adtbench.algorithm import laws as L
from adtbench.algorithm.batch import generate_batch
from adtbench.algorithm.cost import TreeBudget
from adtbench.algorithm.drafters.catch_up import catch_up_replays
from adtbench.algorithm.engine import generate
from adtbench.algorithm.methods.jacobi.loop import JacobiParams
from adtbench.algorithm.methods.lantern import LanternRule
from adtbench.algorithm.policies import POLICIES
from adtbench.algorithm.policies.adt import ADTPolicy
from adtbench.algorithm.policies.eagle2 import Eagle2Policy
from adtbench.algorithm.policies.jacobi import JacobiModels
from adtbench.algorithm.policies.static import ChainPolicy, StaticTreePolicy
from adtbench.algorithm.sampling import sample, sample_rows_cdf
from adtbench.algorithm.verify import EXACT, AcceptanceRule
from adtbench.graph_modes import GraphModes
from adtbench.models.batch import BatchTarget
from adtbench.sampling_params import SamplingParams

BATCH_CHECKED = 100
"""A batched case's (``slots > 1``) first images decoded again by the B = 1 loop with the same generators: equal, so
a difference in a fraction f ≥ 0.023 of the images (moving the B = 1 law from the batched one by up to f) is seen
with probability ≥ 0.9, and the law the case tests at its N is the B = 1 loop's too."""
HEADLINE_N, HEADLINE_TV = {"t1": 6500, "t3": 4500, "q3": 5000, "long": 7000, "pac": 13000}, 0.05
SETTING_N, SETTING_TV = 2200, 0.095
VARIANT_N, VARIANT_TV = 1000, 0.12
CYCLE_N = 720
"""Images per test and the TV it detects from AR's law over its cells with probability ≥ 0.9 at α = 10⁻³, per tier
(``TIERS``; each test prints its own, smaller or equal)."""


@dataclasses.dataclass
class Setup:
    """A tiny target with its drafter, the sampling parameters, the prompt, and AR's exact law of the image."""

    name: str
    target: Any
    drafter: Any
    sp: SamplingParams
    inputs: Any
    law: dict


def _setup(
    name: str,
    vocab: int,
    sp: SamplingParams,
    layout: dict | None = None,
    graphed: bool = False,
    step: bool = False,
    layers: int = 2,
) -> Setup:
    """``graphed``: the models on the simulated CUDA device (``accel.simulate``, entered by the caller) with
    ``engine.compile``'s graphs — the drafter's levels graphed (``drafters.graphed``) — and the law computed there.
    ``step``: the target's verifies on static CPU buckets (``request_static``, not captured), where
    ``engine.graphs.verify=graph`` runs the graphed tree verify's fixed-shape step eagerly (``algorithm.tree_step``);
    with ``graphed`` too, the target's verifies captured: the whole cycle as ``engine.compile`` runs it on a GPU — the
    draft phase, the tree step with its KV commit, the drafter's catch-up, one replay each. ``layers``: the target's.
    """
    device = {"device": "cuda"} if graphed else {}
    over = {"arch.vocab_size": vocab, "arch.block_size": 16, "arch.n_layer": layers, "vq.kind": "none", **device}
    target, drafter = tiny("tiny_llamagen", **over)
    target.layout = dataclasses.replace(target.layout, **{"grid_h": 2, "grid_w": 2, **(layout or {})})
    if graphed:
        drafter.request_static(graphs=True)
    if step:
        target.request_static(graphs=graphed)
    inputs = target.encode_prompt("a red circle", cfg=True)
    return Setup(name, target, drafter, sp, inputs, L.exact_law(target, inputs, sp))


SETUPS: dict[str, Callable[[], Setup]] = {
    "pac": lambda: _setup(
        "pac", 4, SamplingParams(temperature=1.0, top_k=3, cfg_scale=3.0), {"grid_h": 1, "grid_w": 5}
    ),
    "t1": lambda: _setup("t1", 3, SamplingParams(temperature=1.0, cfg_scale=3.0)),
    "t3": lambda: _setup("t3", 3, SamplingParams(temperature=1.0, cfg_scale=3.0), {"grid_h": 1, "grid_w": 3}),
    "long": lambda: _setup("long", 3, SamplingParams(temperature=1.0, top_k=2, cfg_scale=3.0), {"grid_w": 3}),
    "warped": lambda: _setup("warped", 4, SamplingParams(temperature=0.7, top_k=3, top_p=0.9, cfg_scale=3.0)),
    "eol": lambda: _setup(
        "eol", 5, SamplingParams(temperature=1.0, cfg_scale=3.0), {"num_codes": 3, "eol_token": 3, "eoi_token": 4}
    ),
    "q3": lambda: _setup("q3", 4, SamplingParams(temperature=1.0, top_k=3, cfg_scale=3.0), {"grid_h": 1, "grid_w": 3}),
    "q3-graphed": lambda: _setup(
        "q3-graphed",
        4,
        SamplingParams(temperature=1.0, top_k=3, cfg_scale=3.0),
        {"grid_h": 1, "grid_w": 3},
        graphed=True,
    ),
    "t3-step": lambda: _setup(
        "t3-step", 3, SamplingParams(temperature=1.0, cfg_scale=3.0), {"grid_h": 1, "grid_w": 3}, step=True
    ),
    "k2w4-cycle-graphed": lambda: _setup(  # 16 images; a one-layer target, whose top 2 the drafter's often misses: a
        "k2w4-cycle-graphed",  # two-child tree is refused, and a second drafted cycle (the catch-up) follows
        3,
        SamplingParams(temperature=1.0, top_k=2, cfg_scale=3.0),
        {"grid_h": 1, "grid_w": 4},
        graphed=True,
        step=True,
        layers=1,
    ),
}
_CACHE: dict[str, Setup] = {}


def setup_of(name: str) -> Setup:
    if name not in _CACHE:
        with accel.simulate() if name.endswith("-graphed") else contextlib.nullcontext():
            _CACHE[name] = SETUPS[name]()
    return _CACHE[name]


def with_cost(policy):
    """A synthetic cost model (steep verify cost: trees of every size occur) instead of a measured one."""
    policy.cost.tree = TreeBudget(synthetic_cost_model(), calibrate=True)
    return policy


def lantern_zero(s: Setup) -> AcceptanceRule:
    """LANTERN at δ = 0 with a fixed neighbour table over the codes (each code's two others)."""
    c = s.target.layout.num_codes
    table = torch.tensor([[(i + j) % c for j in range(1, c)] for i in range(c)])
    return LanternRule(table, s.target.layout.image_token_offset, delta=0.0)


# name → (setup, policy factory, aux: "drafter" / "jacobi" / None, rule factory, acceptance, batch slots)
Case = tuple[str, Callable[[], Any], str, Callable[[Setup], AcceptanceRule], str, int]


def jac(name: str, **node: Any) -> Callable[[], Any]:
    return lambda: POLICIES.build(name, node)


def exact(s: Setup) -> AcceptanceRule:
    return EXACT


HEADLINE: dict[str, Case] = {
    "chain-t3": ("t3", lambda: ChainPolicy(3), "drafter", exact, "device", 16),
    "static-sampled-q3": ("q3", lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1]], "sample"), "drafter", exact,
                          "device", 16),
    "eagle2-K2-q3": ("q3", lambda: Eagle2Policy(depth=2, top_k=2, total_tokens=7), "drafter", exact, "device", 1),
    "adt-sampled-K2-q3": ("q3", lambda: with_cost(ADTPolicy(D0=3, K0=2, K_min=2, K_max=2, N_max=8, budget="cost",
                                                            draft_sampling="sample")), "drafter", exact, "host", 1),
    "sjd-random-long": ("long", jac("sjd", init="random", window=4), "jacobi", exact, "host", 16),
    "scd-up-t1": ("t1", jac("scd", init="up", window=3), "jacobi", exact, "device", 16),
    "sjd_pac-K2D2-pac": ("pac", jac("sjd_pac", window=5, branch=2, tree_depth=2, init="random"), "jacobi", exact,
                         "host", 16),
}  # fmt: skip
"""One test per lossless policy at T = 1, ``HEADLINE_N`` images: TV ≤ 0.05 detected at 90 % power. The chain, the
static sampled tree and the Jacobi policies draw through 16 slots (``generate_batch``: half to three quarters of the
B = 1 loop's cost), their first ``BATCH_CHECKED`` images checked against B = 1 decodes with the same generators
(``sample_images``), so the law they test is the B = 1 loop's too; EAGLE-2 (whose B = 1 images the graphed levels
are checked against) and ADT-Tree (no faster through slots) draw one at a time."""

SETTING: dict[str, Case] = {
    "scd-adaptive-long": ("long", jac("scd", init="up", window="adaptive", window_min=2, window_max=5), "jacobi",
                          exact, "device", 16),
    "scd-window5-long": ("long", jac("scd", init="random", window=5), "jacobi", exact, "host", 16),
    "scd-up-warped": ("warped", jac("scd", init="up", window=3), "jacobi", exact, "host", 16),
    "eagle2-warped": ("warped", lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9), "drafter", exact, "host", 1),
    "scd-up-eol": ("eol", jac("scd", init="up", window=4), "jacobi", exact, "device", 16),
    "sjd-random-eol": ("eol", jac("sjd", init="random", window=4), "jacobi", exact, "host", 16),
}  # fmt: skip
"""Longer images (repeated couplings, held drafts), T ≠ 1 / top-k / top-p, the end-of-line layout: ``SETTING_N``."""

VARIANT: dict[str, Case] = {
    "sjd-left-device-t1": ("t1", jac("sjd", init="left", window=3), "jacobi", exact, "device", 1),
    "sjd-up-adaptive-t1": ("t1", jac("sjd", init="up", window="adaptive", window_min=2, window_max=4), "jacobi",
                           exact, "host", 1),
    "sjd-drafter-t1": ("t1", jac("sjd", init="drafter", window=3), "jacobi", exact, "host", 1),
    "scd-random-device-t1": ("t1", jac("scd", init="random", window=3), "jacobi", exact, "device", 1),
    "scd-left-t1": ("t1", jac("scd", init="left", window=3), "jacobi", exact, "host", 1),
    "scd-drafter-device-t1": ("t1", jac("scd", init="drafter", window=3), "jacobi", exact, "device", 1),
    "scd-random-point-t1": ("t1", jac("scd", init="random", proposal="point", window=3), "jacobi", exact, "host", 1),
    "scd-gumbel-point-t1": ("t1", jac("scd", init="random", redraw="gumbel", proposal="point", window=3), "jacobi",
                            exact, "device", 16),
    "scd-up-gumbel-t1": ("t1", jac("scd", init="up", redraw="gumbel", window=3), "jacobi", exact, "host", 1),
    "sjd_pac-K3D3-t1": ("t1", jac("sjd_pac", window=16, branch=3, tree_depth=3), "jacobi", exact, "host", 16),
    "sjd_pac-left-device-t1": ("t1", jac("sjd_pac", window=16, branch=3, tree_depth=3, init="left"), "jacobi",
                               exact, "device", 1),
    "sjd_pac-K2L5-device-t1": ("t1", jac("sjd_pac", window=5, branch=2), "jacobi", exact, "device", 1),
    "chain-host-t3": ("t3", lambda: ChainPolicy(3), "drafter", exact, "host", 1),
    "eagle2-host-t3": ("t3", lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9), "drafter", exact, "host", 1),
    "adt-sampled-device-t3": ("t3", lambda: with_cost(ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8,
                              budget="cost", draft_sampling="sample")), "drafter", exact, "device", 1),
    "static-sampled-step-t3": ("t3-step", lambda: StaticTreePolicy([[0], [1], [0, 0], [0, 1]], "sample"), "drafter",
                               exact, "device", 1),
    "eagle2-step-t3": ("t3-step", lambda: Eagle2Policy(depth=2, top_k=3, total_tokens=9), "drafter", exact, "device",
                       1),
    "adt-sampled-step-t3": ("t3-step", lambda: with_cost(ADTPolicy(D0=3, K0=3, K_min=2, K_max=3, N_max=8,
                            budget="cost", draft_sampling="sample")), "drafter", exact, "device", 1),
}  # fmt: skip
"""The other inits, acceptance paths, proposals and windows of each policy: ``VARIANT_N``."""

CYCLE: dict[str, Case] = {
    "static-sampled-cycle-graphed-k2w4": ("k2w4-cycle-graphed", lambda: StaticTreePolicy([[0], [1]], "sample"),
                                          "drafter", exact, "device", 1),
    "eagle2-cycle-graphed-k2w4": ("k2w4-cycle-graphed", lambda: Eagle2Policy(depth=1, top_k=2, total_tokens=4),
                                  "drafter", exact, "device", 1),
    "eagle2-cycle-graphed-k2w4-b2": ("k2w4-cycle-graphed", lambda: Eagle2Policy(depth=1, top_k=2, total_tokens=4),
                                     "drafter", exact, "device", 2),
}  # fmt: skip
"""The whole graphed tree cycle on the simulated device (``engine.compile``: the draft phase, the tree step with its KV
commit, the drafter's catch-up — one replay each; ``tests/test_draft_phase.py``), one policy for every image (its
graphs captured once): ``CYCLE_N`` images of 4 tokens, 16 cells, at the variant tier's bound. ``…-b2``: two slots
(``generate_batch``: the batched verify step, ``tests/test_batch_step.py``)."""

TIERS: dict[str, tuple[dict[str, Case], int | dict[str, int], float]] = {
    "headline": (HEADLINE, HEADLINE_N, HEADLINE_TV),
    "setting": (SETTING, SETTING_N, SETTING_TV),
    "variant": (VARIANT, VARIANT_N, VARIANT_TV),
    "cycle": (CYCLE, CYCLE_N, VARIANT_TV),
}
"""tier → (cases, images per test (per setup), the TV each test states it detects at 90 % power)."""
ALL: dict[str, tuple[Case, int, float]] = {
    name: (case, n if isinstance(n, int) else n[case[0]], tv)
    for cases, n, tv in TIERS.values()
    for name, case in cases.items()
}


# ---------------------------------------------------------------------------------------------------------
# which paths an image ran (asserted per headline case, not assumed)
# ---------------------------------------------------------------------------------------------------------

PATHS_MIN = 0.3
"""Every headline case's rejection, redraw / alternative and bonus paths each run in ≥ 30 % of its images."""


class PathWatch:
    """Which acceptance paths each image ran, from the trees its verifies saw and from its records.

    While entered, the tree-level walks of ``verify`` are wrapped (``verify_sampling``: the host's, every tree and
    chain policy's; ``accept_tree`` / ``accept_chain``: the device's; the module's own calls go through these
    names), and each verdict — the accepted path in its tree — is classified and filed under the generator that drew
    it (one per image in a batched case; the B = 1 loop files under its one generator and takes the flags after each
    image). Per verify: ``rejected`` (a live child of an accepted node was tested and refused), ``alternative`` (a
    later sibling accepted after an earlier one was refused; ``alternative tried``: that, or a branch residual),
    ``residual bonus`` (every live child of the last node refused: the bonus from the final residual), ``branch
    residual`` (the same where that node had ≥ 2 live children), ``leaf bonus`` (the path reached a node without
    live children: the bonus from its p). The fixed-shape Jacobi step's chain verdict is not wrapped: :meth:`image`
    reads chains from the records (a chain's cycle rejected iff it accepted fewer than its drafts, and then its
    bonus is the residual's). A root alone (no draft) is not filed."""

    def __init__(self) -> None:
        self.events: dict[int, set[str]] = {}
        self.images = 0
        self.ran: Counter = Counter()
        self._saved: list[tuple[str, Any]] = []
        self.on = True

    def __enter__(self) -> PathWatch:
        def host(tree, logits, generator, rule=EXACT):  # type: ignore[no-untyped-def]
            acc = walk(tree, logits, generator, rule)
            self.file(generator, tree, acc.path)
            return acc

        def device_tree(tree, processed, greedy, draws, rule=EXACT):  # type: ignore[no-untyped-def]
            verdict = tree_walk(tree, processed, greedy, draws, rule)
            self.file(draws.generator, tree, torch.nonzero(verdict.on_path)[:, 0].tolist())
            return verdict

        def device_chain(tree, processed, greedy, generator=None, rule=EXACT):  # type: ignore[no-untyped-def]
            verdict = chain_walk(tree, processed, greedy, generator, rule)
            self.file(generator, tree, torch.nonzero(verdict.on_path)[:, 0].tolist())
            return verdict

        walk, tree_walk, chain_walk = V.verify_sampling, V.accept_tree, V.accept_chain
        self._saved = [("verify_sampling", walk), ("accept_tree", tree_walk), ("accept_chain", chain_walk)]
        V.verify_sampling, V.accept_tree, V.accept_chain = host, device_tree, device_chain  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._saved:
            setattr(V, name, fn)

    def file(self, generator: torch.Generator | None, tree: Any, path: list[int]) -> None:
        if not self.on or tree.size == 1:  # a root alone: no draft, the bonus from its row
            return
        alive = [True] * tree.size if tree.alive is None else tree.alive.tolist()
        kids = [[c for c in cs if alive[c]] for cs in tree.children]
        flags = self.events.setdefault(id(generator), set())
        if any(kids[p][0] != c for p, c in pairwise(path)):
            flags |= {"alternative", "alternative tried", "rejected"}
        if kids[path[-1]]:
            flags |= {"residual bonus", "rejected"}
            if len(kids[path[-1]]) > 1:
                flags |= {"branch residual", "alternative tried"}
        else:
            flags.add("leaf bonus")

    def image(self, generator: torch.Generator | None, res: Any, chain: bool, depth: int = 0) -> None:
        """File one finished image: its verifies' flags, and from its records ``redraw`` (a Jacobi draft past the
        bonus redrawn: a chain cycle that refused a draft with another after it, or SJD-PAC's coupled continuation),
        ``off main`` (SJD-PAC committed off the main path) and ``chain`` (an accepted path past the tree's ``depth``
        branched levels, into the main chain); a chain policy's rejections and bonuses from its records."""
        flags = self.events.pop(id(generator), set()) | self.events.pop(id(None), set())
        for c in res.cycles:
            if chain and c.nodes > 1:
                flags.add("leaf bonus" if c.accepted == c.nodes - 1 else "rejected")
                flags |= {"residual bonus"} if c.accepted < c.nodes - 1 else set()
                flags |= {"redraw"} if c.accepted < c.nodes - 2 else set()
            if c.extra.get("off_main"):
                flags.add("off main")
            if depth and c.accepted > depth:
                flags.add("chain")
        if res.stats.get("coupled"):
            flags.add("redraw")
        self.images += 1
        self.ran.update(flags)

    def fractions(self) -> dict[str, float]:
        return {k: round(v / self.images, 3) for k, v in sorted(self.ran.items())}


def _chain_and_depth(make: Callable[[], Any]) -> tuple[bool, int]:
    """(is the policy a Jacobi chain — its rejections read from its records —, the branched levels t = D − 1 of an
    SJD-PAC tree, 0 otherwise)."""
    params = getattr(make(), "params", None)
    if not isinstance(params, JacobiParams):
        return False, 0
    branch, depth = getattr(params, "branch", 1), getattr(params, "tree_depth", 1)
    return branch <= 1, max(depth - 1, 0) if branch > 1 else 0


def sample_images(
    case: Case,
    n: int,
    seed: int = 7,
    rule: AcceptanceRule | None = None,
    stat: str | None = None,
    paths: PathWatch | None = None,
    reuse: bool = True,
) -> tuple[Counter, float, float]:
    """``n`` images of ``case`` (their token tuples counted), the drafts accepted per image and the mean of
    ``res.stats[stat]`` (0 without ``stat``); ``paths``: each image's paths filed there (:class:`PathWatch`,
    entered by the caller). One slot: the engine's B = 1 loop with one generator; more: ``generate_batch`` (the
    policy's, Jacobi; ``batch.generate_batch``, a tree policy) with a generator per image, the first
    ``BATCH_CHECKED`` images equal to B = 1 decodes with the same generators.
    ``reuse``: the prompt's prefill run once and restored for every further image (``StaticGPTTarget.reuse_prefill``:
    the same tokens per seed, ``tests/test_prefill_reuse.py``)."""
    setup_name, make, aux, rule_of, where, slots = case
    s = setup_of(setup_name)
    with s.target.reuse_prefill(s.inputs) if reuse else contextlib.nullcontext():
        rule = rule_of(s) if rule is None else rule
        counts: Counter = Counter()
        accepted = extra = 0.0
        chain, depth = _chain_and_depth(make)
        if slots > 1 and setup_name.endswith("-graphed"):  # the batched cycle's graphed verify (``batch_step``)
            return _graphed_batch(s, make, n, seed, rule, where, slots, paths, chain, depth)
        if slots > 1:
            pol = make()
            bt = BatchTarget(s.target, slots, True, 64 + s.target.layout.num_gen_tokens)

            def gen(i: int) -> torch.Generator:
                return torch.Generator().manual_seed(seed * 1_000_003 + i)

            items = [(i, s.inputs, gen(i)) for i in range(n)]
            first: dict[int, list[int]] = {}

            def done(key: Any, res: Any) -> None:
                nonlocal accepted, extra
                counts[tuple(res.tokens)] += 1
                accepted += sum(c.accepted for c in res.cycles)
                extra += res.stats[stat] if stat else 0
                if paths is not None:
                    paths.image(items[key][2], res, chain, depth)
                if key < BATCH_CHECKED:
                    first[key] = res.tokens

            if aux == "drafter":
                generate_batch(bt, s.drafter, pol, items, s.sp, done, rule, where)
            else:
                pol.generate_batch(bt, None, items, s.sp, done, rule, where)
            if paths is not None:  # the B = 1 check below is not counted
                paths.on = False
            models = JacobiModels(s.drafter) if aux == "jacobi" else s.drafter
            alone = [generate(s.target, models, pol if aux == "jacobi" else make(), s.inputs, s.sp, gen(i), rule,
                              where).tokens for i in range(min(n, BATCH_CHECKED))]  # fmt: skip
            assert [first[i] for i in range(len(alone))] == alone, "the batched draws differ from B = 1's"
            if paths is not None:
                paths.events.clear()
                paths.on = True
            return counts, accepted / n, extra / n
        graphed = setup_name.endswith("-graphed")  # the simulated CUDA device, the drafter's levels graphed
        step = "graph" if setup_name.endswith("-step") else "auto"  # the graphed tree verify's step, run eagerly
        whole_cycle = setup_name.endswith(
            "cycle-graphed"
        )  # one policy: its graphs captured once, replayed by every image
        launches, caught_up = sum(x.launches for x in TS.steps_of(s.target)), catch_up_replays(s.drafter)
        with accel.simulate() if graphed else contextlib.nullcontext():
            g = torch.Generator(device="cuda" if graphed else "cpu").manual_seed(seed)
            models = JacobiModels(s.drafter) if aux == "jacobi" else s.drafter
            pol = make()
            for _ in range(n):
                p = pol if aux == "jacobi" or whole_cycle else make()
                p.graphs = GraphModes(verify=step)  # engine.graphs.verify
                res = generate(s.target, models, p, s.inputs, s.sp, g, rule, where)
                counts[tuple(res.tokens)] += 1
                accepted += sum(c.accepted for c in res.cycles)
                extra += res.stats[stat] if stat else 0
                if paths is not None:
                    paths.image(g, res, chain, depth)
        if graphed:  # every level of every drafted cycle was a graph replay (one per level, or the draft phase's)
            assert s.drafter.level_graphs is not None and s.drafter.level_graphs.replays > 0
        if step == "graph" or whole_cycle:  # the drafted cycles were verified by the tree step
            assert sum(x.launches for x in TS.steps_of(s.target)) - launches >= n
        if whole_cycle:  # and the drafter caught up by its graph after a verify, in a quarter of the images at least
            assert catch_up_replays(s.drafter) - caught_up >= n // 4
        return counts, accepted / n, extra / n


def _graphed_batch(
    s: Any, make: Any, n: int, seed: int, rule: Any, where: str, slots: int, paths: Any, chain: bool, depth: int
) -> tuple[Counter, float, float]:
    """``n`` images through ``generate_batch`` on the simulated device with the batch's buckets captured: every
    batched cycle one replay of the batched verify step (asserted). Its draws are its own (``b + 1`` uniforms per
    slot at the batch's bucket), so no image is compared with a B = 1 decode: greedy equality is
    ``tests/test_batch_step.py``'s."""
    from adtbench.algorithm.batch_step import batch_steps_of

    counts: Counter = Counter()
    accepted = 0.0
    with accel.simulate():
        bt = BatchTarget(s.target, slots, True, 64 + s.target.layout.num_gen_tokens)
        bt.request_static(graphs=True)
        pol = make()
        pol.graphs = GraphModes(verify="auto")
        items = [(i, s.inputs, accel.generator(bt.device, seed * 1_000_003 + i)) for i in range(n)]

        def done(key: Any, res: Any) -> None:
            nonlocal accepted
            counts[tuple(res.tokens)] += 1
            accepted += sum(c.accepted for c in res.cycles)
            if paths is not None:
                paths.image(items[key][2], res, chain, depth)

        generate_batch(bt, s.drafter, pol, items, s.sp, done, rule, where)
        assert sum(x.launches for x in batch_steps_of(bt)) == bt.forwards >= n
    return counts, accepted / n, 0.0


def required_paths(case: Case) -> tuple[str, ...]:
    """The paths a headline case must run in ≥ ``PATHS_MIN`` of its images (:class:`PathWatch`): a draft refused,
    the bonus from a residual and from a leaf's p; a Jacobi draft redrawn past the bonus; a tree's later sibling
    tried after a refusal (SJD-PAC: an alternative drawn from the stored q), and SJD-PAC's path into the main chain."""
    chain, depth = _chain_and_depth(case[1])
    pol = case[1]()
    base = ("rejected", "residual bonus", "leaf bonus")
    if chain:
        return (*base, "redraw")
    if depth:
        return (*base, "alternative tried", "redraw", "chain")
    return base if isinstance(pol, ChainPolicy) else (*base, "alternative tried")


def law_test(
    name: str, case: Case, n: int, record: Any, rule: AcceptanceRule | None = None, paths: bool = False
) -> L.LawResult:
    """χ² of ``n`` images of ``case`` against AR's law; ``paths``: each of :func:`required_paths` ran in
    ≥ ``PATHS_MIN`` of the images (printed and recorded with the law line)."""
    with PathWatch() as watch:
        counts, accepted, _ = sample_images(case, n, rule=rule, paths=watch)
    result = L.report(L.chi2_law(name, counts, setup_of(case[0]).law, n), record)
    print(f"  drafts accepted per image: {accepted:.2f}; paths per image: {watch.fractions()}")
    record("paths", f"{name}: {watch.fractions()}")
    if rule is None:
        assert accepted > 0.3, accepted  # the acceptance, rejection and redraw paths all ran
    if paths:
        short = {k: watch.ran[k] / n for k in required_paths(case) if watch.ran[k] < PATHS_MIN * n}
        assert not short, (name, short, watch.fractions())
    return result


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALL))
def test_law(name: str, record_property) -> None:
    """The law of ``name``'s images is AR's (p > 10⁻³) at its tier's N, and the test detects its tier's TV."""
    case, n, tv = ALL[name]
    r = law_test(name, case, n, record_property, paths=name in HEADLINE)
    assert r.tv90 <= tv, r.line()
    assert r.pvalue > L.ALPHA, r.line()


EAGLE = "eagle2-K2-q3"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["device", "host"])
def test_lantern_delta_zero_replays_exact_acceptance(where: str) -> None:
    """LANTERN at δ = 0 against exact acceptance: on the headline case ``eagle2-K2-q3`` (its law test detects TV ≤ 0.05
    from AR's), 400 seeds give the same images and the same accepted lengths with the LANTERN rule as with EXACT,
    on either acceptance path. The two samplers are then one function of the seed, so δ = 0 has EAGLE-2's law.
    Stronger than a second χ² test at the same N, and a tenth of its cost."""
    s = setup_of(HEADLINE[EAGLE][0])
    zero = lantern_zero(s)
    with s.target.reuse_prefill(s.inputs):  # the prompt's prefill run once (tests/test_prefill_reuse.py)
        for seed in range(400):
            runs = [
                generate(s.target, s.drafter, HEADLINE[EAGLE][1](), s.inputs, s.sp,
                         torch.Generator().manual_seed(seed), rule, acceptance=where)
                for rule in (zero, EXACT)
            ]  # fmt: skip
            assert runs[0].tokens == runs[1].tokens, seed
            assert [c.accepted for c in runs[0].cycles] == [c.accepted for c in runs[1].cycles], seed


GRAPHED_SEEDS = 150


@pytest.mark.slow
def test_graphed_levels_draw_the_headline_images_draw_for_draw() -> None:
    """EAGLE-2 with ``engine.compile``'s graphed drafting levels on the simulated CUDA device (``q3-graphed``: float64,
    acceptance on the device) draws the images of the headline case ``eagle2-K2-q3`` (the CPU, eager levels), draw for
    draw: ``GRAPHED_SEEDS`` images from one generator seeded as that law test's, the same tokens and accepted lengths
    each, every drafted level a graph replay; and the two setups' exact laws agree (1e-12). The graphed path's law is
    then ``eagle2-K2-q3``'s (TV ≤ 0.05 at 90 % power). Stronger than a χ² test of its own at 1000 images (TV 0.12, what
    the ``eagle2-graphed-t3`` variant was): a difference in a fraction f of the images moves the law by at most f,
    and 150 images see one with f ≥ 0.016 with probability ≥ 0.9; about a seventh of its cost."""
    graphed, eager = setup_of(f"{HEADLINE[EAGLE][0]}-graphed"), setup_of(HEADLINE[EAGLE][0])
    assert graphed.law.keys() == eager.law.keys()
    assert max(abs(graphed.law[k] - eager.law[k]) for k in eager.law) < 1e-12
    make, where = HEADLINE[EAGLE][1], HEADLINE[EAGLE][4]
    runs = []
    for s in (graphed, eager):
        with accel.simulate() if s is graphed else contextlib.nullcontext():
            g = torch.Generator(device="cuda" if s is graphed else "cpu").manual_seed(7)  # sample_images' seed
            runs.append([generate(s.target, s.drafter, make(), s.inputs, s.sp, g, EXACT, where)
                         for _ in range(GRAPHED_SEEDS)])  # fmt: skip
    levels = graphed.drafter.level_graphs
    assert levels is not None and levels.replays >= GRAPHED_SEEDS  # every image drafts through a graph
    for i, (a, b) in enumerate(zip(*runs, strict=True)):
        assert a.tokens == b.tokens and [c.accepted for c in a.cycles] == [c.accepted for c in b.cycles], i
    assert len({tuple(r.tokens) for r in runs[0]}) >= 10  # many of the 27 images drawn
    assert sum(c.accepted for r in runs[0] for c in r.cycles) > 0.3 * GRAPHED_SEEDS  # as ``law_test`` asks


# ---------------------------------------------------------------------------------------------------------
# negative controls: the real failure modes, planted, fail the same tests
# ---------------------------------------------------------------------------------------------------------


_REDRAW = J.redraw
_CHAIN = V._chain_proposal


def authors_redraw(kind, probs, old, q_old, has_old, generator, noise=None):
    """The SCD authors' lumina / janus rule (``..._SCDMC.py`` ≈ 293): a draft the coupling *kept* stays with its old
    proposal q_old (only a replaced one gets q := p)."""
    tok, q, keep = _REDRAW(kind, probs, old, q_old, has_old, generator, noise)
    return tok, torch.where(keep[:, None], q_old, q), keep


def wrong_row_bonus(tree, probs, proposal, generator, rule=None):
    """A lost bonus draw: after a full accept of the chain the bonus comes from the last draft's row p_{m−1} (an
    off-by-one), not from p_m (``verify._chain_proposal``, the host's chain walk)."""
    acc = _CHAIN(tree, probs, proposal, generator, rule)
    if len(acc.path) == tree.size:
        return dataclasses.replace(acc, bonus=sample(probs[-2], generator))
    return acc


def draws_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A random draw captured with the graph: each tree step's draw buffer filled at its first launch only, then
    replayed unchanged (what a ``uniform_`` inside a captured graph does; ``accel.capture`` refuses one unless its
    generator is registered)."""
    filled: set[int] = set()

    def once(buf: torch.Tensor, fill: str, generator: torch.Generator | None) -> None:
        if id(buf) not in filled:
            filled.add(id(buf))
            _DRAW_INTO(buf, fill, generator)

    monkeypatch.setattr(TS, "draw_into", once)


def bonus_reuses_the_root_uniform(monkeypatch: pytest.MonkeyPatch) -> None:
    """An off-by-one in the step's draw buffer: the bonus drawn by inverse CDF from the root's node uniform (slot 0)
    instead of its own last slot, so the bonus is coupled to the root's acceptance decision."""

    def bonus(self: V.Draws, row: torch.Tensor) -> torch.Tensor:
        if self.buffer is None:
            return _BONUS(self, row)
        return sample_rows_cdf(row.view(1, -1), None, self.buffer[:1])[0]

    monkeypatch.setattr(V.Draws, "bonus", bonus)


_DRAW_INTO = TS.draw_into
_BONUS = V.Draws.bonus
STEP_PLANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "draws replayed": draws_replayed,
    "bonus from the root's uniform": bonus_reuses_the_root_uniform,
}


@pytest.mark.slow
@pytest.mark.parametrize("plant", list(STEP_PLANTS))
def test_a_tree_step_with_planted_draws_fails(plant: str, monkeypatch: pytest.MonkeyPatch, record_property) -> None:
    """The graphed tree verify's own failure modes — its draws, filled outside the graph, replayed unchanged, or the
    bonus's uniform shared with a node's — fail the law test that ``static-sampled-step-t3`` (the padded step, the
    rank loop with proposals) passes, at its N."""
    STEP_PLANTS[plant](monkeypatch)
    case, n, _ = ALL["static-sampled-step-t3"]
    r = law_test(f"static-sampled-step-t3 + {plant}", case, n, record_property, EXACT)
    assert r.pvalue < L.ALPHA, r.line()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["scd-left-t1", "scd-adaptive-long"])
def test_the_scd_authors_stored_proposal_fails(name: str, monkeypatch: pytest.MonkeyPatch, record_property) -> None:
    """The SCD authors' rule (q_old kept for a kept draft) fails the law test that ``scd`` passes, at its N: the
    2 × 2 image (left init, 1000 images) and the 6-token image under an adaptive window (repeated couplings)."""
    case, n, _ = ALL[name]
    monkeypatch.setattr(J, "redraw", authors_redraw)
    r = law_test(f"{name} + the SCD authors' stored proposal", case, n, record_property, EXACT)
    assert r.pvalue < L.ALPHA, r.line()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle2-warped"])
def test_a_residual_reprocessed_by_the_warper_fails(name: str, record_property) -> None:
    """SJD's / GSD's / SCD-janus's residual: top-k, top-p and the temperature applied again to norm(max(p − q, 0))
    — planted into the exact fast path EAGLE-2's host walk takes (``verify._point_mass_children``, not the generic
    rule loop an ``AcceptanceRule`` subclass such as ``laws.WarpedResidual`` is sent down) — fails the test
    EAGLE-2 passes at T = 0.7, top-k 3, top-p 0.9. (On the Jacobi chain the same plant moves the
    law by less than this tier detects — ``scd-up-warped``: p = 0.50 at 2000 — since the residual there has one or
    two entries and is used only after a rejection; docs/development.md.)"""
    case, n, _ = ALL[name]
    sp = setup_of(case[0]).sp
    fast, calls = V._point_mass_children, [0]

    def warped(p_row, kids, tokens, draws):  # type: ignore[no-untyped-def]
        """``verify._point_mass_children`` (the exact fast path EAGLE-2's host walk takes) with the residual after
        each refusal, and the one the bonus is drawn from, re-processed by the warper."""
        calls[0] += 1
        c, p = fast(p_row, kids[:1], tokens, draws)
        for k in kids[1:]:
            if c is not None:
                return c, p
            c, p = fast(L.warp(torch.from_numpy(p)[None], sp)[0], [k], tokens, draws)
        return c, (p if c is not None else L.warp(torch.from_numpy(p)[None], sp)[0].numpy())

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(V, "_point_mass_children", warped)
        r = law_test(f"{name} + the residual re-warped in the exact fast path", case, n, record_property, EXACT)
    assert calls[0] > n, calls  # the plant ran: every drafted cycle's walk went through it
    assert r.pvalue < L.ALPHA, r.line()


@pytest.mark.slow
def test_q_not_reduced_fails_the_sjd_pac_headline(monkeypatch: pytest.MonkeyPatch, record_property) -> None:
    """The with-replacement rule applied to SJD-PAC's alternatives, drawn without replacement (``q_not_reduced``
    planted into ``verify._proposal_children``: q keeps a refused candidate's mass) fails the headline test that
    the exact variant passes, at its N (``sjd_pac-K2D2-pac``: 4 codes, top-k 3, K = 2: a second candidate is tested
    against the reduced q)."""
    name = "sjd_pac-K2D2-pac"
    case, n, _ = ALL[name]
    monkeypatch.setattr(V, "_proposal_children", q_not_reduced)
    r = law_test(f"{name} + q not reduced after a refusal", case, n, record_property, EXACT)
    assert r.pvalue < L.ALPHA, r.line()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["scd-left-t1"])
def test_a_bonus_from_the_wrong_row_fails(name: str, monkeypatch: pytest.MonkeyPatch, record_property) -> None:
    """A lost bonus draw — after a full accept the bonus drawn from the last draft's row instead of the row after
    it — fails the test that ``scd`` (host acceptance) passes."""
    monkeypatch.setattr(V, "_chain_proposal", wrong_row_bonus)
    case, n, _ = ALL[name]
    r = law_test(f"{name} + the bonus from the wrong row", case, n, record_property, EXACT)
    assert r.pvalue < L.ALPHA, r.line()


# ---------------------------------------------------------------------------------------------------------
# the coupled redraw's marginal, directly
# ---------------------------------------------------------------------------------------------------------

REDRAW_N = 200_000


@pytest.mark.parametrize("q_kind", ["softmax", "point", "uniform", "disjoint"])
def test_coupled_redraw_outputs_p(q_kind: str, record_property) -> None:
    """``jacobi.redraw('coupled', p, x, q_old)`` with x ~ q_old: the output y is distributed as p, and (x, y) is the
    maximal coupling — P(y = x) = Σ min(p, q_old). χ² of y over V = 6 tokens and of the pair (x, y) over its
    positive cells, ``REDRAW_N`` rows in one call (TV detected at 90 % power printed: ≈ 0.006 for y). The SCD
    authors' stored proposal does not change y (their bug is in the q a kept draft carries into its *next* test:
    the law tests above reject it)."""
    g = torch.Generator().manual_seed(11)
    Vn = 6
    p = torch.softmax(torch.randn(Vn, generator=g, dtype=torch.float64) * 1.5, -1)
    q = {
        "softmax": torch.softmax(torch.randn(Vn, generator=g, dtype=torch.float64) * 1.5, -1),
        "point": torch.nn.functional.one_hot(torch.tensor(int(p.argmin())), Vn).to(torch.float64),
        "uniform": torch.full((Vn,), 1.0 / Vn, dtype=torch.float64),
        "disjoint": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5], dtype=torch.float64),
    }[q_kind]
    if q_kind == "disjoint":
        p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0, 0.0], dtype=torch.float64)
    n = REDRAW_N
    x = torch.multinomial(q, n, replacement=True, generator=g)
    y, q_new, kept = J.redraw("coupled", p.expand(n, Vn), x, q.expand(n, Vn), torch.ones(n, dtype=torch.bool), g)
    assert torch.equal(q_new[0], p) and bool((y[kept] == x[kept]).all())
    r = L.report(L.chi2_law(f"redraw coupled, q_old {q_kind}: y", Counter(y.tolist()), L.categorical_law(p), n),
                 record_property)  # fmt: skip
    assert r.pvalue > L.ALPHA and r.tv90 < 0.01, r.line()
    overlap = torch.minimum(p, q)
    joint = torch.diag(overlap) + torch.outer(q - overlap, (p - overlap) / max(float((p - overlap).sum()), 1e-300))
    pairs = Counter(zip(x.tolist(), y.tolist()))
    r2 = L.report(L.chi2_law(f"redraw coupled, q_old {q_kind}: (x, y)", pairs, L.pairs_law(joint), n),
                  record_property)  # fmt: skip
    assert r2.pvalue > L.ALPHA, r2.line()
    # the negative control of this test: a redraw that ignores q_old (y ~ p fresh, the coupling lost) keeps the
    # marginal but not the coupling — unless q_old is a point mass or disjoint from p, where the two coincide
    if q_kind in ("softmax", "uniform"):
        fresh = torch.multinomial(p, n, replacement=True, generator=g)
        lost = L.chi2_law("fresh", Counter(zip(x.tolist(), fresh.tolist())), L.pairs_law(joint), n)
        assert lost.pvalue < L.ALPHA, lost.line()


def test_power_arithmetic() -> None:
    """``detectable_tv`` against closed forms: one degree of freedom at α = 10⁻³, power 0.9 needs
    λ = (z_{1−α/2} + z_{0.9})² ≈ 20.9 (the normal approximation, exact for df = 1 up to the far tail), so 2 091
    draws for TV 0.05; more cells need more draws; the bound w ≥ 2 TV is attained by a two-cell alternative."""
    from scipy.stats import norm

    lam = (norm.isf(L.ALPHA / 2) + norm.isf(1 - L.POWER)) ** 2
    assert L.draws_for(0.05, 1) == pytest.approx(lam / 0.01, rel=2e-3)
    assert L.detectable_tv(L.draws_for(0.05, 30), 30) <= 0.05 < L.detectable_tv(L.draws_for(0.05, 30) - 50, 30)
    assert L.draws_for(0.05, 1) < L.draws_for(0.05, 15) < L.draws_for(0.05, 60)
    # a law at TV d = 0.05 from a uniform two-cell law: w = 2d exactly, and the χ² test at draws_for's N rejects it
    # in ≥ 90 % of 400 simulated runs
    from scipy.stats import chisquare

    n = L.draws_for(0.05, 1)
    g = torch.Generator().manual_seed(0)
    heads = torch.binomial(torch.full((400,), float(n)), torch.full((400,), 0.55), generator=g)
    rejected = sum(chisquare([h, n - h], [n / 2, n / 2]).pvalue < L.ALPHA for h in heads.tolist())
    assert rejected >= 0.86 * 400, rejected


@pytest.mark.parametrize("setup,k", [("warped", 3), ("eol", 2), ("long", 3)])
def test_exact_law_is_teacher_forced_ar(setup: str, k: int) -> None:
    """The harness's enumeration (one tree forward per level) against ``test_engine``'s teacher-forced one (one
    sequential forward per token of every sequence): the law of the first k tokens agrees to 1e-12, under top-k /
    top-p / T ≠ 1 and the end-of-line layout; the whole law sums to 1 and forced positions hold their token."""
    from test_engine import _exact_joint

    s = setup_of(setup)
    want = {key: p for key, p in _exact_joint(s.target, s.inputs, s.sp, k).items() if p > 0}
    got = L.marginal(s.law, tuple(range(k)))
    assert got.keys() == want.keys()
    assert max(abs(got[key] - want[key]) for key in want) < 1e-12
    assert abs(sum(s.law.values()) - 1) < 1e-12
    lay = s.target.layout
    forced = {g: f for g in range(lay.num_gen_tokens) if (f := lay.forced_token(g)) >= 0}
    assert all(img[g] == f for img in s.law for g, f in forced.items())
    assert (setup != "eol") or len(forced) == 3


def q_not_reduced(
    p_row: Any,
    q_row: torch.Tensor,
    kids: list[int],
    tokens: list[int],
    draws: Any,
    extra: Any = None,
) -> tuple[int | None, Any]:
    """``verify._proposal_children`` with the with-replacement rule applied to drafts drawn without replacement: after
    a refused child, p ← norm(max(p − q, 0)) as before, but q is never reduced (the refused token keeps its mass)."""
    p, q = V._host_row(p_row), V._host_row(q_row)
    for c in kids:
        x = tokens[c]
        px = p[x] if extra is None else p[x] + extra(p, x)
        if next(draws) < (1.0 if q[x] <= 0.0 else min(1.0, px / q[x])):
            return c, p
        residual = (p - q).clip(min=0.0)
        if residual.sum() > 0:
            p = residual / residual.sum()
    return None, p


def test_simulated_power_checks_the_noncentral_approximation() -> None:
    """``laws.simulated_tv`` against ``laws.detectable_tv`` on ``t1``'s cells at N = 6000 (51 cells): the noncentral
    approximation's 90 % TV (0.0498) is slightly optimistic — 20 000 simulated tests of the least visible alternative
    (mass moved into the heaviest cells) reject it in ≈ 87 % — and the simulated TV (≈ 0.051) is above it by at most
    5 %, and at it a fresh seed of 10 000 runs rejects in ≥ 89 %. On two equal cells (df = 1) the two agree to 2 %."""
    import numpy as np

    s, n = setup_of("t1"), 6000
    keys, rest = L.cells(s.law, n)
    probs = np.array([s.law[k] for k in keys] + [sum(s.law[k] for k in rest)])
    approx, sim = L.detectable_tv(n, len(probs) - 1), L.simulated_tv(probs, n)
    assert L.simulated_power(probs, n, approx, runs=20_000, seed=3) < 0.89
    assert approx < sim <= 1.05 * approx, (approx, sim)
    assert L.simulated_power(probs, n, sim, runs=10_000, seed=4) >= 0.89
    r = L.chi2_law("t1 at its own law", Counter({k: round(s.law[k] * n) for k in keys}), s.law, sum(
        round(s.law[k] * n) for k in keys))  # fmt: skip
    assert r.tv90 >= L.detectable_tv(r.n, r.k - 1)  # chi2_law states the larger of the two
    two = np.array([0.5, 0.5])
    assert L.simulated_tv(two, 2091) == pytest.approx(L.detectable_tv(2091, 1), rel=0.02)
