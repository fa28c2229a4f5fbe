"""The typed config schema (adtbench.harness.schema), the one SamplingParams builder and the registries it feeds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from adtbench.errors import ConfigError
from adtbench.harness import schema
from adtbench.harness.config import build_policy, config_fingerprint, register_resolvers, validate
from adtbench.sampling_params import SamplingParams, build_sampling

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def config(*overrides: str):
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("group", [*schema.GROUPS, "policy"])
def test_every_shipped_yaml_fits_its_schema(group):
    """Each option file of a fixed-key group sets only schema fields, with values of the fields' types."""
    files = sorted((CONF / group).glob("*.yaml")) if (CONF / group).is_dir() else []
    if not (CONF / group).is_dir():  # top-level nodes of config.yaml (timing, engine, decode)
        files, nodes = [], [OmegaConf.load(CONF / "config.yaml")[group]]
    else:
        nodes = [OmegaConf.load(f) for f in files]
    assert nodes
    for node in nodes:
        s = schema.POLICY_SCHEMAS[str(node.name)] if group == "policy" else schema.GROUPS[group]
        OmegaConf.merge(OmegaConf.structured(s), node)  # raises on an unknown key or a wrong type


@pytest.mark.parametrize("name", ["ar", "chain", "static", "eagle2", "adt", "zipar", "mulo"])
def test_policy_schema_defaults_are_the_yaml_defaults(name):
    node = OmegaConf.to_container(OmegaConf.load(CONF / "policy" / f"{name}.yaml"))
    assert dataclasses.asdict(schema.POLICY_SCHEMAS[name]()) == node


def _constructor_defaults(name: str) -> dict:
    """The keyword defaults of the class a ``policy.name`` builds (MuLo-SD: its ``MuloParams``)."""
    import inspect

    from adtbench.algorithm.methods.mulo import MuloParams
    from adtbench.algorithm.policies.adt import ADTPolicy
    from adtbench.algorithm.policies.ar import ArPolicy
    from adtbench.algorithm.policies.eagle2 import Eagle2Policy
    from adtbench.algorithm.policies.static import ChainPolicy, StaticTreePolicy
    from adtbench.algorithm.policies.zipar import ZipARPolicy

    cls = {"ar": ArPolicy, "chain": ChainPolicy, "static": StaticTreePolicy, "eagle2": Eagle2Policy,
           "adt": ADTPolicy, "zipar": ZipARPolicy, "mulo": MuloParams}[name]  # fmt: skip
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("name", ["ar", "chain", "static", "eagle2", "adt", "zipar", "mulo"])
def test_one_default_per_knob_yaml_schema_and_constructor(name):
    """Every key a policy's constructor takes has one default: the constructor's equals the schema's and the yaml's
    (the schema's block_rows "all" is MuLo-SD's None)."""
    schema_defaults = dataclasses.asdict(schema.POLICY_SCHEMAS[name]())
    yaml = OmegaConf.to_container(OmegaConf.load(CONF / "policy" / f"{name}.yaml"))
    ctor = _constructor_defaults(name)
    shared = set(ctor) & set(schema_defaults)
    assert shared or name == "ar"
    for key in shared:
        want = None if (name, key) == ("mulo", "block_rows") and schema_defaults[key] == "all" else schema_defaults[key]
        assert ctor[key] == want and schema_defaults[key] == yaml[key], (name, key)


def test_sampling_schema_default_is_the_default_group():
    node = OmegaConf.to_container(OmegaConf.load(CONF / "sampling" / "default.yaml"))
    assert schema.GROUPS["sampling"] is SamplingParams  # one dataclass: the algorithm's own parameters
    assert set(dataclasses.asdict(SamplingParams())) == set(node)
    assert build_sampling(config().sampling) == SamplingParams(temperature=1.0, top_k=0, top_p=1.0, cfg_scale=3.0)


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["+foo=1"], "foo"),
        (["warmup=many"], "warmup"),
        (["threads=two"], "threads"),
        (["+sampling.min_p=0.1"], "sampling.min_p"),
        (["sampling.top_k=2.5"], "sampling.top_k"),
        (["policy=eagle2", "+policy.width=3"], "policy.width"),
        (["policy=chain", "policy.depth=x"], "policy.depth"),
        (["policy=adt", "policy.beta=high"], "policy.beta"),
        (["lantern=on", "lantern.k=many"], "lantern.k"),
        (["+lantern.radius=2"], "lantern.radius"),
        (["+dataset.split=val"], "dataset.split"),
        (["dataset.limit=some"], "dataset.limit"),
        (["drafter.num_layers=one"], "drafter.num_layers"),
        (["+drafter.heads=2"], "drafter.heads"),
        (["logger=wandb", "logger.max_images=all"], "logger.max_images"),
        (["maps.per_run=maybe"], "maps.per_run"),
        (["+paths.tmp_dir=/tmp"], "paths.tmp_dir"),
        (["timing=5"], "timing"),
        (["+engine.mode=max"], "engine.mode"),
    ],
)
def test_unknown_keys_and_wrong_types_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        validate(config(*overrides))
    assert e.value.key == key


def test_open_groups_are_not_checked_by_the_schema():
    cfg = config("model=tiny_llamagen", "+model.extra_note=hi", "eval=mini")  # model keys differ per family
    schema.check(cfg)


def test_check_leaves_the_config_unchanged():
    cfg = config("policy=eagle2", "sampling.cfg_scale=3")  # an int where the schema has a float
    before = config_fingerprint(cfg)
    sp = validate(cfg).sp
    assert config_fingerprint(cfg) == before and cfg.sampling.cfg_scale == 3 and sp.cfg_scale == 3.0


def test_check_returns_the_config_typed():
    """``schema.check`` returns the merge as the schemas' dataclasses (coerced to the field types); absent ``timing`` /
    ``engine`` / ``decode`` nodes are their defaults, absent other groups None; ``validate`` hands it on with the
    checked sampling parameters."""
    cfg = config("policy=eagle2", "sampling.cfg_scale=3", "timing.repeats=3", "engine.acceptance=host", "~maps")
    conf = schema.check(cfg)
    assert conf.timing == schema.TimingConf(repeats=3) and conf.engine == schema.EngineConf(acceptance="host")
    assert isinstance(conf.sampling, SamplingParams) and conf.sampling.cfg_scale == 3.0
    assert isinstance(conf.sampling.cfg_scale, float) and cfg.sampling.cfg_scale == 3  # the DictConfig as composed
    assert isinstance(conf.policy, schema.Eagle2Conf) and conf.policy.total_tokens == 59 and conf.maps is None
    assert conf.cache_dir is not None and conf.cache_dir.name == ".cache"
    for node in ("timing", "engine", "decode"):
        cfg = config()
        with open_dict(cfg):
            del cfg[node]
        assert getattr(schema.check(cfg), node) == schema.GROUPS[node]()
    checked = validate(config("sampling=greedy"))
    assert checked.sp == checked.conf.sampling == SamplingParams(0.0, cfg_scale=3.0) and checked.policy.name == "scd"


def test_build_sampling_is_the_one_checked_constructor():
    assert build_sampling({"temperature": 0.0}) == SamplingParams(temperature=0.0)  # absent keys: defaults
    node = OmegaConf.create({"temperature": 1.0, "top_k": 1200, "top_p": 0.95})
    assert build_sampling(node, "model.lm_sampling") == SamplingParams(1.0, 1200, 0.95, 1.0)
    for bad, key in (
        ({"top_k": True}, "teacher.sampling.top_k"),
        ({"top_k": 1.5}, "teacher.sampling.top_k"),
        ({"temperature": -0.1}, "teacher.sampling.temperature"),
        ({"top_p": 0.0}, "teacher.sampling.top_p"),
        ({"cfg_scale": "big"}, "teacher.sampling.cfg_scale"),
    ):
        with pytest.raises(ConfigError) as e:
            build_sampling(bad, "teacher.sampling")
        assert e.value.key == key
    with pytest.raises(ConfigError) as e:
        build_sampling({"cfg_scale": "big"}, key="")
    assert e.value.key == "cfg_scale"
    with pytest.raises(ConfigError) as e:
        build_sampling(OmegaConf.create({"temperature": "???"}))
    assert e.value.key == "sampling.temperature"


def test_one_registry_style_for_policies_families_and_metrics():
    from adtbench.algorithm.policies import POLICIES
    from adtbench.harness.eval import METRICS
    from adtbench.models.registry import FAMILIES
    from adtbench.registry import Registry

    assert all(isinstance(r, Registry) for r in (POLICIES, FAMILIES, METRICS))
    # one yaml per policy, named after it; other yamls in the group are presets of a registered policy
    named = {p.stem: str(OmegaConf.load(p).name) for p in (CONF / "policy").glob("*.yaml")}
    assert POLICIES.names() == sorted(s for s, n in named.items() if s == n) == sorted(schema.POLICY_SCHEMAS)
    assert set(named.values()) <= set(POLICIES.names())
    families = {str(OmegaConf.load(f).family) for f in (CONF / "model").glob("*.yaml")}
    assert families <= set(FAMILIES)
    metrics = {str(m) for f in (CONF / "eval").glob("*.yaml") for m in OmegaConf.load(f).get("metrics", [])}
    assert metrics <= set(METRICS)
    with pytest.raises(ConfigError) as e:
        build_policy(config("policy=eagle2", "policy.name=beam"))
    assert e.value.key == "policy" and "eagle2" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate(config("model.family=gpt5"))
    assert e.value.key == "model.family" and "llamagen" in str(e.value)
