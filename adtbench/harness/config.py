"""Config validation and component builders. Everything here runs before any model is built.

Every error is a ``ConfigError`` naming the offending key (and the path, for files).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from adtbench import accel, resources
from adtbench.algorithm.policies import POLICIES, LoopPolicy, Policy
from adtbench.algorithm.verify import EXACT, AcceptanceRule
from adtbench.errors import ConfigError, check_flag, check_number
from adtbench.graph_modes import GraphModes, graph_modes, moved_key
from adtbench.harness import schema
from adtbench.harness.rundir import PLUMBING_KEYS
from adtbench.sampling_params import SamplingParams, build_sampling

PACKAGE_DIR = resources.PACKAGE_DIR
PROJECT_ROOT = resources.project_root()  # the checkout holding conf/ (an installed wheel: the working directory)


def register_resolvers() -> None:
    """``${pkg:relative/path}`` → a file shipped inside the adtbench package; ``${project_root:}`` → the checkout
    root (the folder holding ``conf/``), the default of ``paths.root_dir``."""
    if not OmegaConf.has_resolver("pkg"):
        OmegaConf.register_new_resolver("pkg", lambda rel: str(PACKAGE_DIR / rel))
    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))


def config_error(e: Exception, overrides: list[str]) -> ConfigError:
    """A Hydra / OmegaConf composition error as a ``ConfigError`` naming the override's key: the key or group a
    quoted name in the message matches (``'policy.bogus'``, ``'policy/foo'``), else the override whose value the
    message quotes, else an override key the message mentions, else ``overrides``. The message is Hydra's, on one
    line, without its search-path listing, followed by the overrides."""
    text = " ".join(str(e).split()).split(" Config search path")[0]
    quoted = re.findall(r"'([^']+)'", text)
    keys = {o.split("=", 1)[0].lstrip("+~"): o for o in overrides}
    key = next((q.replace("/", ".") for q in quoted if q.replace("/", ".") in keys), None)  # a key or group
    key = key or next((k for q in quoted for k, o in keys.items() if q in o.split("=", 1)[-1]), None)  # a value
    key = key or next((k for k in keys if k and k in text), "overrides")
    return ConfigError(key, f"{text} (overrides: {' '.join(overrides) or '-'})")


def compose_config(config_name: str, overrides: list[str], config_dir: str | None = None) -> DictConfig:
    """Hydra ``compose`` for the command-line tools (``adtbench bench|train|eval``; the app's command line is
    checked by ``harness.precheck``, which composes as Hydra does): a bad override — an unknown key, a missing
    group option, a malformed value — is a ``ConfigError`` naming its key (:func:`config_error`) instead of a
    Hydra traceback. ``config_dir`` defaults to the project's ``conf/``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=config_dir or str(resources.conf_dir())):
        try:
            return compose(config_name, overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as e:
            raise config_error(e, list(overrides)) from None


def paths_root(cfg: DictConfig) -> Path | None:
    """``paths.root_dir`` (``~`` expanded), or None when the config has none."""
    value = cfg.get("paths", {}).get("root_dir") if isinstance(cfg.get("paths"), DictConfig) else None
    return None if value is None else Path(str(value)).expanduser()


def _relative(v: Any) -> bool:
    return isinstance(v, str) and v not in ("", "???") and not v.startswith(("/", "~"))


def resolve_weight_paths(node: Any, root: Path) -> None:
    """In place: every string leaf named ``path`` or ``*_path`` under ``node`` that is relative and exists under
    ``root`` becomes ``root/<value>``; anything else (absolute, ``~``, a hub repo id, a file not under the root) is
    left for the loaders. Used for the config's groups and for model nodes composed later (MuLo-SD's drafter)."""
    if not isinstance(node, DictConfig):
        return
    for k in node:
        if OmegaConf.is_missing(node, k):
            continue
        if isinstance(node._get_node(k), DictConfig):
            resolve_weight_paths(node[k], root)
        elif (k == "path" or str(k).endswith("_path")) and _relative(node[k]) and (root / node[k]).exists():
            node[k] = str(root / node[k])


def resolve_paths(cfg: DictConfig) -> None:
    """Resolve relative file paths against ``paths.root_dir`` in place, so commands work from any working dir.

    ``dataset.path`` is always taken relative to the root (a prompt file is always local). Weight paths
    (``path`` / ``*_path`` keys under ``model``, ``drafter``, ``eval`` and ``policy``) become ``root_dir/<value>``
    only when that exists (``resolve_weight_paths``); otherwise they are left for the loaders, which also look
    inside the model folder and on the Hugging Face hub (a repo id such as ``leloy/Anole-7b-v0.1-hf`` stays a repo
    id). Absolute and ``~`` paths are kept. Invariant: an existing path never changes meaning when run from the
    root itself.
    """
    root = paths_root(cfg)
    if root is None:
        return
    d = cfg.get("dataset")
    if isinstance(d, DictConfig) and not OmegaConf.is_missing(d, "path") and _relative(d.get("path")):
        d.path = str(root / str(d.path))
    for group in ("model", "drafter", "eval", "policy"):
        resolve_weight_paths(cfg.get(group), root)


def _get(cfg: DictConfig, key: str) -> Any:
    """``cfg[key]`` with a ConfigError (naming the key) for missing values."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            raise ConfigError(key, "missing")
        if OmegaConf.is_missing(node, part):
            raise ConfigError(key, f"is required (value ???) — set it on the command line, e.g. {key}=...")
        node = node[part]
    return node


def _number(cfg: DictConfig, key: str, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    return check_number(_get(cfg, key), key, kind, lo, hi)


def build_policy(cfg: DictConfig) -> Policy:
    """``POLICIES.build(policy.name, cfg.policy)``: the node is checked against its schema first
    (``adtbench.harness.schema``); each policy's builder (in its own module) and constructor check values. The policy
    carries ``engine.graphs`` (``policy.graphs``: graph or eager for each part); ``engine.graphs.step=graph`` where the
    policy's keys cannot run the fixed-shape step (``LoopPolicy.step_refusal``) is a ``ConfigError`` naming
    ``engine.graphs.step`` — before any weights load."""
    name = str(_get(cfg, "policy.name"))
    builder = POLICIES.get(name)  # unknown names: ConfigError naming ``policy`` and the known ones
    schema.check_group(cfg, "policy")
    node = OmegaConf.to_container(cfg.policy, resolve=True)
    assert isinstance(node, dict)
    policy = builder(node)
    policy.graphs = engine_graphs(cfg)
    why = policy.step_refusal() if isinstance(policy, LoopPolicy) and policy.graphs.step == "graph" else None
    if why is not None:
        raise ConfigError("engine.graphs.step", f"graph needs {why}")
    return policy


def engine_graphs(cfg: DictConfig) -> GraphModes:
    """``engine.graphs`` typed (``graph_modes.GraphModes``; every part ``auto`` without the node)."""
    engine = cfg.get("engine")
    node = engine.get("graphs") if isinstance(engine, DictConfig) else None
    return graph_modes(OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node)


def validate_model(cfg: DictConfig) -> None:
    from adtbench.models.registry import FAMILIES, resolve_device, resolve_dtype

    family = str(_get(cfg, "model.family"))
    if family not in FAMILIES:  # checked without importing the family's adapter
        FAMILIES.get(family)  # raises the registry's ConfigError naming model.family and the known families

    dev = resolve_device(_get(cfg, "model.device"))  # accepts auto (cuda if available)
    resolve_dtype(_get(cfg, "model.dtype"), dev)  # accepts auto (bf16 on GPU, fp32 on CPU)
    if family == "mini":  # shipped-layout weights: check their headers and sizes before anything is read
        from adtbench.io import check_weights

        for key, files in (
            ("model.path", ("gpt.safetensors", "text_encoder.safetensors")),
            ("model.vq_path", ("model.safetensors",)),
        ):
            base = Path(str(_get(cfg, key)))
            for f in files:
                check_weights(key, base / f)


def loads_checkpoint(cfg: DictConfig) -> bool:
    """Whether the target's weights are read from a checkpoint without a drafter of its own: ``model.random_init``
    off (a released model or a ``make-tiny`` folder in its layout) and no ``model.drafter_path`` (the shipped mini
    model's trained drafter, which ``drafter=eagle`` loads)."""
    m = cfg.get("model")
    if not isinstance(m, DictConfig):
        return False
    return not check_flag(m.get("random_init", False), "model.random_init") and m.get("drafter_path") is None


def missing_drafter(cfg: DictConfig, policy: Policy) -> ConfigError:
    """The one-line error of a drafting policy on a real checkpoint without ``drafter.path``: it names the key, the
    drafters published for the model (``model.published_drafters``), or how to train one, and the smoke-test key."""
    model = str(cfg.model.get("name", cfg.model.get("family")))
    published = schema.published_drafters(cfg)
    if published:
        where = "published for model=" + model + ": " + "; ".join(f"{d.path} ({d.by})" for d in published)
    else:
        none = "no public EAGLE drafter for" if published == [] else "no published drafter is listed for"
        where = (
            f"{none} model={model}: train one (adtbench train drafter model={model} model.path=<dir> "
            "teacher.source=generated teacher.prompts=<prompt file> export=<drafter dir>)"
        )
    return ConfigError(
        "drafter.path",
        f"policy={policy.name} drafts with the EAGLE drafter and none is set, so it would be randomly initialised "
        f"(τ ≈ 1, a speedup that means nothing); set drafter.path=<folder or hub id> — {where} — or "
        "drafter.random=true for a smoke test",
    )


def validate_drafter(cfg: DictConfig, policy: Policy) -> None:
    """``drafter.kind`` (eagle | none); a tree policy needs a drafter; ``drafter.path`` exists and its weights are
    sound when they will be read; ``drafter.random`` (a flag, exclusive with a path). A policy that drafts with the
    EAGLE drafter (``policy.drafts_with_eagle``) on a real checkpoint (:func:`loads_checkpoint`) without
    ``drafter.path`` is refused (:func:`missing_drafter`) unless ``drafter.random=true`` asks for a random one."""
    kind = str(_get(cfg, "drafter.kind"))
    if kind not in ("eagle", "none"):
        raise ConfigError("drafter.kind", f"unknown drafter {kind!r}; choose eagle or none")
    if policy.uses_drafter and kind == "none":
        raise ConfigError("drafter", f"policy={policy.name} drafts a tree and needs a drafter (drafter=eagle)")
    if kind == "eagle":
        path = cfg.drafter.get("path")
        random = check_flag(cfg.drafter.get("random", False), "drafter.random")
        if random and path is not None:
            raise ConfigError(
                "drafter.random",
                f"true asks for a randomly initialised drafter, but drafter.path={path} is set; "
                "drop one (drafter.path=null drafter.random=true for a smoke test)",
            )
        if path is None and not random and policy.drafts_with_eagle and loads_checkpoint(cfg):
            raise missing_drafter(cfg, policy)
        if path is not None and not Path(str(path)).exists():
            from adtbench.models.registry import looks_like_repo_id

            if not looks_like_repo_id(str(path)):  # a hub id is fetched by the loader
                raise ConfigError("drafter.path", f"no drafter checkpoint at {path}")
        if path is not None and policy.uses_drafter:  # its weights are read: check them first
            from adtbench.harness.drafters import check_path

            check_path(path)


def check_writable_dir(key: str, value: Any) -> None:
    """``value`` is (or can be created as) a directory this process can write a file into; else ConfigError.

    Creates the directory (it is a cache the run would create anyway) and writes and removes a probe file, so a
    read-only mount, a missing permission or a path under a regular file all fail here, before any model loads.
    """
    p = Path(str(value)).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        blocker = next((q for q in [p, *p.parents] if q.exists() and not q.is_dir()), None)
        why = f"{blocker} is a file" if blocker is not None else (e.strerror or str(e))
        raise ConfigError(key, f"cannot write into {p.absolute()} ({why}); set {key}=<a writable dir>") from e


def validate_cache_dirs(cfg: DictConfig, policy: Policy | None = None) -> None:
    """The caches this run will write: ``lantern.cache_dir`` (with LANTERN on) and ``paths.cache_dir`` (cost
    models, with a ``budget: cost`` policy or a loop whose window rule declares ``calibrated``: ``window: cost``)."""
    lantern = cfg.get("lantern")
    if isinstance(lantern, DictConfig) and bool(lantern.get("enabled", False)) and lantern.get("cache_dir"):
        check_writable_dir("lantern.cache_dir", lantern.cache_dir)
    paths = cfg.get("paths")
    node = cfg.get("policy")
    budget = node.get("budget") if isinstance(node, DictConfig) else None
    calibrated = bool(getattr(policy, "calibrated_window", False))  # a Jacobi loop's window: cost
    if (str(budget) == "cost" or calibrated) and isinstance(paths, DictConfig) and paths.get("cache_dir"):
        check_writable_dir("paths.cache_dir", paths.cache_dir)


C2I_PROMPT = re.compile(r"\s*(\d+)")


def check_prompts(cfg: DictConfig, prompts: list[Any]) -> None:
    """Prompts the model cannot take, checked with the dataset (before any weights): a class-conditional LlamaGen
    (``model.arch.model_type: c2i``) takes ImageNet class ids (``"207"`` or ``"207 golden retriever"``) in
    ``0 .. num_classes − 1``. ``ConfigError("dataset", ...)`` names the first bad prompt id."""
    m = cfg.get("model")
    arch = m.get("arch") if isinstance(m, DictConfig) else None
    if not isinstance(arch, DictConfig) or str(arch.get("model_type", "")) != "c2i":
        return
    n = int(arch.get("num_classes", 1000))
    for p in prompts:
        hit = C2I_PROMPT.match(p.text)
        if hit is None or not 0 <= int(hit.group(1)) < n:
            raise ConfigError(
                "dataset",
                f"prompt {p.prompt_id} ({p.text[:60]!r}) is not an ImageNet class id in 0..{n - 1}; "
                f"model={m.get('name', 'c2i')} takes prompts like '207' or '207 golden retriever' "
                "(e.g. dataset=inline dataset.text=207, or a text file of class ids)",
            )


def build_rule(cfg: DictConfig, conf: schema.AppConf, target: Any) -> AcceptanceRule:
    """The acceptance rule: exact unless ``lantern.enabled`` (relaxed
    acceptance, ``adtbench.algorithm.methods.lantern``, from the ``lantern`` node of ``cfg``)."""
    if conf.lantern is None or not conf.lantern.enabled:
        return EXACT
    from adtbench.harness.caches import build_lantern_rule

    return build_lantern_rule(cfg.lantern, target)


@dataclasses.dataclass(frozen=True)
class Checked:
    """A config that passed every check that needs no weights (:func:`validate`), typed.

    ``conf``: the schema's typed values (``schema.check``), which the ranges and cross-key rules of :func:`validate`
    held for; ``conf.sampling`` is ``build_sampling``'s value. A builder reads a key the schema types here, never
    from the ``DictConfig`` again. ``policy``: built from ``policy.*``, not yet bound. The open nodes (``model``,
    ``eval``, ``bench``) and the nodes the loaders take whole (``drafter``, ``lantern``, ``policy``) stay in the
    ``DictConfig``."""

    conf: schema.AppConf
    policy: Policy

    @property
    def sp(self) -> SamplingParams:
        """The sampling parameters (``sampling``; checked by ``build_sampling``)."""
        assert self.conf.sampling is not None, "validate requires a sampling node"
        return self.conf.sampling


def validate(cfg: DictConfig) -> Checked:
    """Check everything that can be checked without weights. Returns the config typed and the policy (:class:`Checked`).

    First the whole config against its typed schema (``adtbench.harness.schema.check``: unknown keys, types), then the
    ranges and the cross-key rules below, on the composed values (a key removed, or a string OmegaConf would coerce,
    is an error here, not its schema default); every error is a ConfigError naming the key."""
    conf = schema.check(cfg)
    _number(cfg, "seed", int)
    _number(cfg, "warmup", int, lo=0)
    _number(cfg, "max_tree_nodes", int, lo=1)
    if cfg.get("threads") is not None:
        _number(cfg, "threads", int, lo=1)
    check_timing(cfg)
    check_engine(cfg)
    sp = build_sampling(_get(cfg, "sampling"))
    policy = build_policy(cfg)
    if conf.lantern is not None and conf.lantern.enabled:
        from adtbench.harness.caches import lantern_params

        lantern_params(cfg.lantern)
    validate_model(cfg)
    check_reference(cfg, conf)
    check_aa(conf)
    validate_drafter(cfg, policy)
    validate_cache_dirs(cfg, policy)
    from adtbench.harness.loops import check_loop_config

    check_loop_config(cfg, policy)
    conf = dataclasses.replace(conf, sampling=sp)
    check_decode(cfg, conf, policy)
    return Checked(conf, policy)


# static-cache targets (``models.batch``)
BATCHED_FAMILIES = ("mini", "llamagen", "chameleon", "lumina", "emu3", "janus")


def check_decode(cfg: DictConfig, conf: schema.AppConf, policy: Policy) -> None:
    """``decode.batch_size`` (prompts per target forward, an integer ≥ 1) and ``decode.window`` (with B > 1: prompts
    are decoded B × window at a time, each side timed over the window; ≥ 1). B > 1 needs a tree policy on a
    static-cache target, one timing repeat and no ``engine.compile`` off a CUDA device (the CPU's compiled stacks are
    single-prompt). ``conf``: the typed values, ``timing`` and ``engine`` checked already."""
    node = cfg.get("decode")
    if node is None:
        return
    if not isinstance(node, DictConfig):
        raise ConfigError("decode", f"must be a mapping (decode.batch_size=...), got {node!r}")
    check_number(node.get("batch_size", 1), "decode.batch_size", int, lo=1)
    check_number(node.get("window", 4), "decode.window", int, lo=1)
    if conf.decode.batch_size == 1:
        return
    if isinstance(policy, LoopPolicy) and not policy.batchable:
        if policy.one_prompt is not None:  # a key's value makes a batchable loop one-prompt (Jacobi init=drafter)
            key, why = policy.one_prompt
            raise ConfigError(key, f"policy={policy.name} with {why}; use decode.batch_size=1, or another {key}")
        raise ConfigError(
            "decode.batch_size",
            f"policy={policy.name} runs its own loop, one prompt at a time; use decode.batch_size=1 with it",
        )
    family = str(_get(cfg, "model.family"))
    impl = str(cfg.model.get("impl", "lean"))
    if family not in BATCHED_FAMILIES or impl == "hf":
        raise ConfigError(
            "decode.batch_size",
            f"model family {family} (model.impl={impl}) has no batched target; "
            f"batched: {', '.join(BATCHED_FAMILIES)} with model.impl=lean",
        )
    if conf.timing.repeats > 1:
        raise ConfigError("timing.repeats", "with decode.batch_size > 1 each window is timed once; use 1")
    if conf.engine.compile and not _on_cuda(cfg):
        raise ConfigError(
            "engine.compile",
            "with decode.batch_size > 1 it runs the batch's CUDA graphs, and the "
            "model is not on a CUDA device (model.device); the CPU's compiled stacks are single-prompt: "
            "use engine.compile=false with decode.batch_size > 1 there",
        )
    if engine_graphs(cfg).verify == "graph" and not conf.engine.compile and not isinstance(policy, LoopPolicy):
        raise ConfigError(
            "engine.graphs.verify",
            "graph with decode.batch_size > 1 runs the batched verify step over the batch's captured buckets: needs "
            "engine.compile=true and model.device=cuda (a GPU or the simulated device); use auto or eager",
        )


def _on_cuda(cfg: DictConfig) -> bool:
    """Will ``model.device`` be a CUDA device (a real one or the simulated one)?"""
    try:
        return accel.is_cuda(accel.resolve(str(cfg.model.get("device", "auto"))))
    except (ValueError, RuntimeError):
        return False


def check_timing(cfg: DictConfig) -> None:
    """``timing.repeats``: timed repetitions of each prompt, an integer ≥ 1 (1 without a ``timing`` node);
    ``timing.reference_baseline`` and ``timing.aa``: flags (their cross-key rules: :func:`check_reference`,
    :func:`check_aa`)."""
    if cfg.get("timing") is None:
        return
    if not isinstance(cfg.timing, DictConfig):
        raise ConfigError("timing", f"must be a mapping (timing.repeats=...), got {cfg.timing!r}")
    _number(cfg, "timing.repeats", int, lo=1)
    check_flag(cfg.timing.get("reference_baseline", False), "timing.reference_baseline")
    check_flag(cfg.timing.get("aa", False), "timing.aa")


def reference_impl(cfg: DictConfig) -> str:
    """The ``model.impl`` that ``timing.reference_baseline`` times the AR baseline through: the family's reference
    implementation (``models.registry.REFERENCE_IMPLS``). A ``ConfigError`` naming ``timing.reference_baseline`` when
    the family has none (``models.registry.NO_REFERENCE`` says why) or the run's own baseline already is it."""
    from adtbench.models.registry import NO_REFERENCE, REFERENCE_IMPLS

    key = "timing.reference_baseline"
    family = str(_get(cfg, "model.family"))
    impl = str(cfg.model.get("impl", "lean"))
    if family not in REFERENCE_IMPLS:
        why = NO_REFERENCE.get(family, f"model family {family} declares no reference implementation")
        raise ConfigError(key, f"model={cfg.model.get('name', family)}: {why}; use {key}=false")
    ref = REFERENCE_IMPLS[family]
    if impl == ref:
        raise ConfigError(
            key, f"model.impl={impl} already is the reference implementation: speedup is against it; use {key}=false"
        )
    return ref


def check_reference(cfg: DictConfig, conf: schema.AppConf) -> None:
    """``timing.reference_baseline=true`` (``conf``: the typed values): the family has a reference implementation
    other than the run's (:func:`reference_impl`); it rides with the AR baseline (``baseline=true``) one prompt at a
    time (``decode.batch_size=1``: the reference target has no batched form)."""
    if not conf.timing.reference_baseline:
        return
    key = "timing.reference_baseline"
    if not conf.baseline:
        raise ConfigError(key, "times the AR baseline a second time, through the reference; it needs baseline=true")
    if conf.decode.batch_size > 1:
        raise ConfigError(key, "the reference implementation decodes one prompt at a time; use decode.batch_size=1")
    reference_impl(cfg)


def check_aa(conf: schema.AppConf) -> None:
    """``timing.aa=true`` (the A/A control: the AR baseline timed against itself, ``aa_ratio``): it times the baseline
    a second time, so it needs ``baseline=true``, one prompt at a time (``decode.batch_size=1``: a batched window
    times each side once)."""
    if not conf.timing.aa:
        return
    if not conf.baseline:
        raise ConfigError("timing.aa", "times the AR baseline against itself; it needs baseline=true")
    if conf.decode.batch_size > 1:
        raise ConfigError("timing.aa", "the A/A control times one prompt at a time; use decode.batch_size=1")


def refuse_reference_in_bench(cfg: DictConfig, tool: str) -> None:
    """The ``adtbench bench`` tools that build their models themselves (``overhead``, ``cost``, ``probe``,
    ``versus``, ``batch``, ``count``) time the lean AR step only: ``timing.reference_baseline=true`` there is a
    ``ConfigError`` naming the key, not a flag silently ignored (``bench speed`` runs the app per row: it applies).
    ``timing.aa=true`` likewise, except in ``versus``, which times its AR side against itself with it."""
    timing = cfg.get("timing")
    if isinstance(timing, DictConfig) and timing.get("reference_baseline", False) is True:
        raise ConfigError(
            "timing.reference_baseline",
            f"adtbench bench {tool} times the lean AR step only; time the reference through the app "
            "(python run.py ... timing.reference_baseline=true) or adtbench bench speed",
        )
    if tool != "versus" and isinstance(timing, DictConfig) and timing.get("aa", False) is True:
        raise ConfigError(
            "timing.aa",
            f"adtbench bench {tool} times no speedup to control; the A/A control runs in the app "
            "(python run.py ... timing.aa=true), adtbench bench speed and adtbench bench versus",
        )


def check_engine(cfg: DictConfig) -> None:
    """``engine.compile`` (a flag: compile the target's, and drafter's, forward before the warm-up, which then needs
    ``warmup ≥ 1``, and ``model.device=cuda`` under the simulated device, ``accel``; false without the node) and
    ``engine.acceptance`` (where tree acceptance runs: ``auto`` — the float64 host walk when the target is on the CPU,
    on the device otherwise —, ``device`` or ``host``: ``algorithm.verify.verify_cycle``) and ``engine.graphs`` (graph
    or eager for each part: ``step``, ``verify``, ``levels``, each ``auto`` | ``graph`` | ``eager``; ``graph`` where a
    part can never run as graphs is refused here: ``adtbench.graph_modes``)."""
    from adtbench.algorithm.verify import ACCEPTANCE

    node = cfg.get("engine")
    if node is None:
        return
    if not isinstance(node, DictConfig):
        raise ConfigError("engine", f"must be a mapping (engine.compile=...), got {node!r}")
    value = node.get("acceptance", "auto")
    if value not in ACCEPTANCE:
        raise ConfigError("engine.acceptance", f"must be one of {list(ACCEPTANCE)}, got {value!r}")
    if "verify_step" in node:  # (the schema refuses it first on the app's path)
        raise moved_key("engine.verify_step", node.get("verify_step"))
    graphs = engine_graphs(cfg)
    compile = check_flag(node.get("compile", False), "engine.compile")
    if graphs.verify == "graph" and value == "host":
        raise ConfigError("engine.graphs.verify", "graph accepts on the device: needs engine.acceptance=auto or device")
    if graphs.levels == "graph" and (not compile or value == "host" or not _on_cuda(cfg)):
        raise ConfigError(
            "engine.graphs.levels",
            "graph needs the drafter's forwards captured (engine.compile=true, model.device=cuda — a GPU or the "
            "simulated device) and acceptance on the device (engine.acceptance=auto or device); use auto or eager",
        )
    if compile and int(cfg.warmup) < 1:
        raise ConfigError("warmup", "must be ≥ 1 with engine.compile=true (compilation happens in the warm-up)")
    if compile and accel.simulation() is not None and not _on_cuda(cfg):
        raise ConfigError(
            "model.device",
            f"engine.compile=true under {accel.SIMULATE_ENV}=cuda needs model.device=cuda (got "
            f"{cfg.model.get('device', 'auto')}): the simulated device runs the CUDA graphs through their stand-in, "
            "and torch.compile cannot trace the host model under the simulation",
        )


def prompt_seed(base: int, prompt_id: str) -> int:
    """Per-prompt seed: the first 60 bits of sha256(f"{base}:{prompt_id}") (stable under sharding/resume)."""
    return int(hashlib.sha256(f"{base}:{prompt_id}".encode()).hexdigest()[:15], 16)


RESUME_IGNORED = PLUMBING_KEYS  # keys a resume may change: the run directory's one list (adtbench.harness.rundir)


def config_diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys (sorted) whose values differ between two plain config dicts; nested dicts are compared key by key."""
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += config_diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            keys.append(f"{prefix}{k}")
    return keys


def config_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config minus keys that may change between a run and its resume."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    for key in RESUME_IGNORED:
        head, _, tail = key.partition(".")
        if tail and isinstance(data.get(head), dict):
            data[head].pop(tail, None)
        elif not tail:
            data.pop(head, None)
    return json.loads(json.dumps(data, sort_keys=True, default=str))
