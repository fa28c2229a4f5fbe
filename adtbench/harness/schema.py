"""The typed schema of the app's config: one dataclass per config group whose keys are fixed.

Invariants:

- Every key a yaml in ``conf/`` sets for these groups is a field here, with the yaml's default value and type;
  a key the schema does not know, or a value OmegaConf cannot convert to the field's type, is a
  ``ConfigError`` naming the full key (``policy.foo``, ``sampling.top_k``), raised by :func:`check` before any
  model or file is touched.
- Checking never changes the config: the composed ``DictConfig`` is resolved into a copy and merged into the
  schema (``OmegaConf.structured`` + ``merge``); :func:`check` returns the merge as plain dataclasses
  (:class:`AppConf`, its groups typed) and leaves the ``DictConfig`` as composed, so run fingerprints,
  ``summary.json`` and resume checks see exactly the values the user composed. Range checks (``top_p`` in
  (0, 1], ``policy.depth ≥ 1`` …) stay with the builders (``config.validate``, ``sampling_params.build_sampling``, the
  policy constructors), which also reject the strings OmegaConf would coerce (``"yes"`` → ``True``); the typed
  values are what the builders read once those checks passed (``config.Checked``).
- Open groups: ``model`` (each family has its own keys: ``arch``, ``vq``, ``text_encoder`` …; checked by the
  family's loader, except the shared ``model.impl``: :func:`check_model`), ``eval`` (metric-specific nodes;
  checked by ``adtbench.harness.eval.validate``), and the
  ``hydra`` / ``bench`` nodes of the bench tools. ``policy`` is checked against the schema of its ``name``.

Why one structured validation and not Hydra's ConfigStore schema matching: the app's contract for bad input
is one line ``adtbench: config error: <key>: ...`` with exit 2 (tests/test_app.py, tests/test_user_faults.py);
a ConfigStore schema fails inside Hydra's compose with a multi-line message and exit 1, every yaml in
``conf/<group>/`` would need a ``defaults: [<schema>]`` entry, and the training stages compose other primary
configs (``conf/train/*``, ``@package _global_``) that this schema does not describe.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, make_dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from adtbench.errors import ConfigError
from adtbench.graph_modes import MOVED_KEYS, GraphModes, moved_key
from adtbench.sampling_params import SamplingParams

__all__ = [
    "POLICY_SCHEMAS",
    "AdtConf",
    "AppConf",
    "ArConf",
    "ChainConf",
    "DatasetConf",
    "DecodeConf",
    "DrafterConf",
    "DraftingConf",
    "Eagle2Conf",
    "EngineConf",
    "LanternConf",
    "LoggerConf",
    "MapsConf",
    "PathsConf",
    "PublishedDrafter",
    "StaticConf",
    "TimingConf",
    "check",
    "check_group",
    "check_model",
    "published_drafters",
]


@dataclass
class ArConf:
    name: str = "ar"


@dataclass
class DraftingConf:
    """The keys every drafting tree policy shares (``chain``, ``static``, ``eagle2``, ``adt``): how drafts are
    picked (``draft_sampling``: ``topk`` or ``sample``) and the draft gate (``policies.base.with_gate``). Whether its
    levels run as graph replays is ``engine.graphs.levels`` (``graph_modes``), not a policy key."""

    draft_sampling: str = "topk"
    gate_tokens: float | None = None  # draft gating (algorithm.gate): a drafted cycle's cost in AR steps
    gate_explore: int = 8


@dataclass
class ChainConf(DraftingConf):
    name: str = "chain"
    depth: int = 5


@dataclass
class StaticConf(DraftingConf):
    name: str = "static"
    tree: Any = "mc_sim_7b_63"  # a shape name or a list of child-rank paths


@dataclass
class Eagle2Conf(DraftingConf):
    name: str = "eagle2"
    depth: int = 4
    top_k: int = 10
    total_tokens: int = 59
    budget: str = "fixed"
    calibrate: bool = True
    rounds: str = "auto"  # budget: cost: when the level rule decides a round (auto | live | planned)


@dataclass
class AdtConf(DraftingConf):
    name: str = "adt"
    init: str = "horizontal"
    read: str = "updated"
    adapt: bool = True
    alpha: str = "drafted"
    beta: float = 0.5
    l_d: int = 1
    l_k: int = 2
    halve_on_flip: bool = False
    D0: int = 5
    K0: int = 10
    D_min: int = 2
    D_max: int = 8
    K_min: int = 4
    K_max: int = 16
    N_max: int = 58
    budget: str = "cost"
    calibrate: bool = True
    rounds: str = "auto"  # budget: cost: when the level rule decides a round (auto | live | planned)


@dataclass
class ZiparConf:
    """``policy=zipar``: ZipAR (spatially parallel decoding; no drafter, lossy unless ``window`` ≥ the row length)."""

    name: str = "zipar"
    window: int = 4  # w: row r + 1 starts once row r has w tokens (≥ row length: plain AR)


@dataclass
class MuloConf:
    """``policy=mulo``: MuLo-SD (low-resolution drafter + up-sampler, pooled threshold, local resampling)."""

    name: str = "mulo"
    drafter_model: str = "mini_lowres"  # a conf/model/<name>.yaml of the same family and codebook
    drafter_overrides: Any = field(default_factory=dict)  # merged over that yaml (Tar: {detok: {file: …_256px.pth}})
    upsampler: str = "learned"  # learned | bicubic | nearest
    upsampler_path: str | None = "${pkg:weights/mini/upsampler}"  # learned U_r / D_r (config.json + safetensors)
    downsampler: str = "learned"  # learned | bicubic | nearest (D_r of the committed prefix, block_rows < all)
    block_rows: Any = "all"  # low-res rows drafted per cycle, or all
    draft: str = "ar"  # ar | zipar: how the low-res drafter samples its rows
    draft_window: int = 2  # ZipAR window of the drafter (draft=zipar)
    rule: str = "pooled"  # pooled (MuLo-SD eq. 5, lossy) | exact (lossless control arm, raster rule)
    tau: float = 0.3  # pooled threshold: accept iff p(x̃) + p(kNN_k(x̃)) ≥ tau
    k: int = 10  # codebook neighbours pooled with the draft (LANTERN's table)
    l: int = 1  # local expansion radius (eq. 6-7): (2l+1)² squares around rejections
    resample: str = "sequential"  # sequential | islands
    island_window: int | None = None  # ZipAR window inside an island (islands; None: raster order)


class PolicySchemas(Mapping[str, type]):
    """``policy.name`` → the dataclass its node is merged into, derived from the registry (``Method.schema``, with a
    ``name`` field added where the method's params class has none, e.g. ``jacobi.JacobiParams``). Read lazily: the
    policy modules, a plugin's included, register themselves on ``import adtbench.algorithm.policies``."""

    def __getitem__(self, name: str) -> type:
        from adtbench.algorithm.policies import POLICIES
        from adtbench.algorithm.policies.base import method_of

        if name not in POLICIES:
            raise KeyError(name)
        return _named(method_of(name).schema_type, name)

    def __iter__(self) -> Iterator[str]:
        from adtbench.algorithm.policies import POLICIES

        return iter(POLICIES.names())

    def __len__(self) -> int:
        from adtbench.algorithm.policies import POLICIES

        return len(POLICIES.names())


@cache
def _named(schema: type, name: str) -> type:
    """``schema`` with a ``name`` field (default ``name``) when it has none: the node's ``name`` selects the policy."""
    if any(f.name == "name" for f in fields(schema)):
        return schema
    frozen = schema.__dataclass_params__.frozen  # type: ignore[attr-defined]
    extra = [("name", str, field(default=name))]
    return make_dataclass(f"{schema.__name__}Node", extra, bases=(schema,), frozen=frozen)


POLICY_SCHEMAS: Mapping[str, type] = PolicySchemas()


@dataclass
class LanternConf:
    """``conf/lantern/{off,on}``: ``off`` sets only ``enabled``."""

    enabled: bool = False
    k: int = 1000
    delta: float | None = 0.1
    lam: float | None = None
    normalize: bool = False
    reference_residual: bool = False
    cache_dir: str | None = None


@dataclass
class DatasetConf:
    kind: str = "text"
    path: str | None = None
    text: str | None = None
    limit: int | None = None
    shard: str | None = None
    caption: str = "first"


@dataclass
class DrafterConf:
    """``conf/drafter/*``: ``none`` sets only ``kind``."""

    kind: str = "eagle"
    path: str | None = None
    random: bool = False  # True: no drafter.path, a seeded random drafter (smoke tests; recorded: drafter_random)
    seed: int = 1
    num_layers: int = 1
    input_norm: bool = False
    fc_bias: bool = True
    init_std: float | None = None


@dataclass
class LoggerConf:
    """``conf/logger/{none,wandb}``: ``none`` sets only ``kind``."""

    kind: str = "none"
    mode: str = "offline"
    project: str = "adtbench"
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)
    log_images: bool = True
    max_images: int = 16
    system_stats: bool = True
    console: str = "off"
    silent: bool = True
    init_timeout: float = 60


@dataclass
class MapsConf:
    per_image: bool = False
    per_run: bool = True


@dataclass
class PathsConf:
    root_dir: str = "."
    output_dir: str = "outputs"
    cache_dir: str | None = None


@dataclass
class TimingConf:
    repeats: int = 1
    reference_baseline: bool = False  # also time AR through the reference implementation (config.check_reference)
    aa: bool = False  # also time AR against itself, the A/A control: aa_ratio (config.check_aa)


@dataclass
class EngineConf:
    compile: bool = False
    acceptance: str = "auto"
    graphs: GraphModes = field(default_factory=GraphModes)  # graph or eager for each part (``graph_modes``)


@dataclass
class DecodeConf:
    batch_size: int = 1
    window: int = 4


@dataclass
class AppConf:
    """The top level of ``conf/config.yaml``, and what :func:`check` returns: the top-level keys, and each group with
    a fixed schema (:data:`GROUPS`, checked by its own schema) as that schema's instance — ``timing``, ``engine`` and
    ``decode`` their defaults when the config has no such node (what an absent node has always meant), the other
    groups None when absent; ``policy`` the instance of its name's schema (None for a name without one). The open
    nodes (:data:`OPEN` but ``policy``: ``model``, ``eval``, ``hydra``, ``bench``) are not typed: read them from the
    ``DictConfig``."""

    seed: int = 0
    warmup: int = 1
    baseline: bool = True
    save_images: bool = True
    progress: bool = True
    max_tree_nodes: int = 256
    threads: int | None = 1
    timing: TimingConf = field(default_factory=TimingConf)
    engine: EngineConf = field(default_factory=EngineConf)
    decode: DecodeConf = field(default_factory=DecodeConf)
    sampling: SamplingParams | None = None
    lantern: LanternConf | None = None
    dataset: DatasetConf | None = None
    drafter: DrafterConf | None = None
    logger: LoggerConf | None = None
    maps: MapsConf | None = None
    paths: PathsConf | None = None
    policy: Any = None  # an instance of POLICY_SCHEMAS[policy.name]

    @property
    def cache_dir(self) -> Path | None:
        """``paths.cache_dir`` (cost models, calibrated windows, MuLo-SD's neighbour tables), or None."""
        return Path(self.paths.cache_dir) if self.paths is not None and self.paths.cache_dir else None


OPEN = ("model", "policy", "eval", "hydra", "bench")  # top-level nodes the top-level merge leaves out

GROUPS: dict[str, type] = {
    "sampling": SamplingParams, "lantern": LanternConf, "dataset": DatasetConf, "drafter": DrafterConf,
    "logger": LoggerConf, "maps": MapsConf, "paths": PathsConf, "timing": TimingConf, "engine": EngineConf,
    "decode": DecodeConf,
}  # fmt: skip


def _message(e: OmegaConfBaseException, schema: type) -> str:
    if isinstance(e, ConfigKeyError):
        return f"unknown key; known: {sorted(f.name for f in fields(schema))}"
    return str(getattr(e, "msg", e)).splitlines()[0]


def _merge(data: Any, schema: type, prefix: str) -> Any:
    """``data`` (plain containers) merged into ``schema``, as an instance of it; any failure is a ConfigError naming
    the full key."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), data))
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        full = f"{prefix}.{key}" if prefix and key else (prefix or key or "config")
        raise ConfigError(full, _message(e, schema)) from None


def _plain(node: Any, key: str) -> Any:
    """``node`` resolved into plain containers (an interpolation that cannot resolve names ``key``)."""
    if not OmegaConf.is_config(node):
        return node
    try:
        return OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as e:
        sub = str(getattr(e, "full_key", "") or "")  # relative to ``node``, or to the root for a node of ``cfg``
        full = sub if sub == key or sub.startswith(f"{key}.") else f"{key}.{sub}" if sub else key
        raise ConfigError(full, str(getattr(e, "msg", e)).splitlines()[0]) from None


def check_group(cfg: DictConfig, group: str) -> Any:
    """Check one group node of ``cfg`` against its schema (``policy``: the schema of ``policy.name``; a name
    without a schema is left to the policy registry's error) and return it typed, an instance of that schema.
    Absent groups are not checked (None)."""
    node = cfg.get(group)
    if node is None:
        return None
    if not isinstance(node, DictConfig):
        raise ConfigError(group, f"must be a mapping ({group}.<key>=...), got {node!r}")
    data = _plain(node, group)
    if group == "policy":
        schema = POLICY_SCHEMAS.get(str(data.get("name")))
        if schema is None:
            return None
    else:
        schema = GROUPS[group]
    _refuse_moved(data, schema, group)
    return _merge(data, schema, group)


def _refuse_moved(data: dict[str, Any], schema: type, group: str) -> None:
    """A key that moved (``graph_modes.MOVED_KEYS``: ``policy.step``, ``engine.verify_step``,
    ``policy.graph_levels``) and that the group's schema does not declare itself: a ``ConfigError`` naming it and
    its new key, not an alias."""
    known = {f.name for f in fields(schema)}
    for k, value in data.items():
        if f"{group}.{k}" in MOVED_KEYS and k not in known:
            raise moved_key(f"{group}.{k}", value)


def _top_value(cfg: DictConfig, key: str) -> Any:
    if OmegaConf.is_missing(cfg, key):
        return "???"
    try:
        value = cfg[key]
    except OmegaConfBaseException as e:
        raise ConfigError(key, str(getattr(e, "msg", e)).splitlines()[0]) from None
    return _plain(value, key)


@dataclass
class PublishedDrafter:
    """One entry of ``model.published_drafters``: an EAGLE drafter trained for the model and published."""

    path: str  # what ``drafter.path`` takes: a folder or a Hugging Face repo id (``owner/name``)
    by: str  # who trained it and for which checkpoint / setting


def published_drafters(cfg: DictConfig) -> list[PublishedDrafter] | None:
    """``model.published_drafters`` typed (a list of ``{path, by}``; ``[]``: none is public), or None when the model
    node has none; anything else is a ``ConfigError`` naming ``model.published_drafters``."""
    node = cfg.get("model")
    if not isinstance(node, DictConfig) or node.get("published_drafters") is None:
        return None
    key = "model.published_drafters"
    data = _plain(node.published_drafters, key)
    if not isinstance(data, list):
        raise ConfigError(key, f"must be a list of {{path, by}} mappings, got {data!r}")
    out = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise ConfigError(f"{key}[{i}]", f"must be a mapping {{path: <folder or repo id>, by: <text>}}: {entry!r}")
        item = _merge(entry, PublishedDrafter, f"{key}[{i}]")
        if not item.path.strip() or not item.by.strip():
            raise ConfigError(f"{key}[{i}]", f"path and by must be non-empty, got {entry!r}")
        out.append(item)
    return out


def check_model(cfg: DictConfig) -> None:
    """The ``model`` keys the families share that can be checked before a loader runs: ``model.impl`` (``lean`` |
    ``hf``, ``models.registry.IMPLS``; absent = ``lean``) and ``model.published_drafters``
    (:func:`published_drafters`). The rest of the open ``model`` node is the loader's."""
    published_drafters(cfg)
    node = cfg.get("model")
    if not isinstance(node, DictConfig) or "impl" not in node:
        return
    from adtbench.models.registry import model_impl

    model_impl({"impl": _plain(node.get("impl"), "model.impl")})


def check(cfg: DictConfig) -> AppConf:
    """Check the composed app config: the top-level keys, then every group with a fixed schema (:data:`GROUPS`
    and ``policy``), then :func:`check_model`. Raises ``ConfigError`` naming the first bad key; returns the config
    typed (:class:`AppConf`; ``cfg`` itself is left as composed)."""
    top = {k: _top_value(cfg, str(k)) for k in cfg if k not in GROUPS and k not in OPEN}
    conf: AppConf = _merge(top, AppConf, "")
    groups: dict[str, Any] = {group: check_group(cfg, group) for group in (*GROUPS, "policy")}
    check_model(cfg)
    defaults: dict[str, Any] = {"timing": TimingConf(), "engine": EngineConf(), "decode": DecodeConf()}  # absent: these
    return replace(conf, **{g: defaults[g] if v is None and g in defaults else v for g, v in groups.items()})
