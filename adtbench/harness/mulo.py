"""What ``policy=mulo`` (MuLo-SD, ``adtbench.algorithm.methods.mulo``) needs from the harness: the pairing check before
any model loads, and its models besides the target (registered in ``adtbench.harness.loops``).

The drafter's model node is ``conf/model/<policy.drafter_model>.yaml`` merged with ``policy.drafter_overrides``
(a mapping, e.g. ``{path: <dir>, detok: {file: ar_dtok_lp_256px.pth}}`` for Tar), with the target's ``dtype``
and ``device``. ``check_mulo_config`` (no weights read; every error a ``ConfigError`` naming the key and the path):

- the ``policy.*`` values (``algorithm.mulo.mulo_params``: tau ≥ 0, k ≥ 0, l ≥ 0 integers, the choices, block_rows
  an integer ≥ 1 or ``all``, island_window null or ≥ 1), the resampler kinds;
- the drafter model exists, has the target's ``family`` and codebook (the same VQ, or one of the same size and
  dimension read from the VQ ``config.json`` files), and r = target grid / drafter grid is an integer (grids read
  from the checkpoints' ``config.json``; ``arch.block_size`` of random-init models; for Tar the ``…_<px>px.pth``
  de-tokenizer file names);
- Tar: the target is the de-tokenizer stage (``model.stage=detok``);
- learned resamplers: ``policy.upsampler_path`` holds ``config.json`` and ``model.safetensors``.

``build_mulo_models(cfg, conf, target)`` → ``MuloModels``: the drafter ``Target`` (Tar: only the AR-DTok de-tokenizer of
``detok.file``; the Tar LM runs once, in the target's prompt encoding, and its TA-Tok features condition both),
the resampler (``adtbench.models.resample.build_resampler`` on the target's VQ), LANTERN's codebook-neighbour
table for kNN_k (``caches.load_or_build_table``, cached under ``<paths.cache_dir>/lantern``) and r, re-checked
on the loaded models (grids, codebook values).
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from adtbench.algorithm.methods.mulo import MuloModels, mulo_params
from adtbench.errors import ConfigError, check_choice
from adtbench.harness.schema import AppConf
from adtbench.resources import conf_dir

log = logging.getLogger("adtbench")

RESAMPLER_KINDS = ("learned", "bicubic", "nearest")
TAR_PX = re.compile(r"_(\d+)px\.pth$")
TIMING_SCOPE_TAR = "AR-DTok only: the Tar LM runs in the (untimed) prompt encoding, shared by drafter and target"


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def drafter_node(cfg: DictConfig) -> DictConfig:
    """``conf/model/<policy.drafter_model>.yaml`` ⊕ ``policy.drafter_overrides``, with the target's dtype and device;
    relative ``path`` / ``*_path`` values are taken against ``paths.root_dir`` when they exist there
    (``config.resolve_weight_paths``, as for the target's node)."""
    from adtbench.harness.config import paths_root, register_resolvers, resolve_weight_paths

    register_resolvers()
    name = cfg.policy.get("drafter_model")
    models = conf_dir() / "model"
    path = models / f"{name}.yaml"
    if not isinstance(name, str) or not name or not path.is_file():
        known = sorted(p.stem for p in models.glob("*.yaml"))
        raise ConfigError("policy.drafter_model", f"no model config {path}; known: {known}")
    node = OmegaConf.load(path)
    over = cfg.policy.get("drafter_overrides")
    if over is not None and not isinstance(over, DictConfig):
        raise ConfigError("policy.drafter_overrides", f"must be a mapping of model keys, got {over!r}")
    if over:
        node = OmegaConf.merge(node, over)
    assert isinstance(node, DictConfig)
    node.dtype, node.device = cfg.model.get("dtype", "auto"), cfg.model.get("device", "auto")
    root = paths_root(cfg)
    if root is not None:
        resolve_weight_paths(node, root)
    return node


def _json(key: str, path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError) as e:
        raise ConfigError(key, f"cannot read {path}: {e}") from e


def _resolution(node: DictConfig, key: str) -> int | None:
    """A number proportional to the model's grid side (None: only known once loaded; ``build`` checks then)."""
    family = str(node.get("family"))
    if family == "mini":
        side = math.isqrt(int(_json(key, Path(str(node.path)) / "config.json")["gpt"]["block_size"]))
        return side
    if family == "tar":
        hit = TAR_PX.search(str(OmegaConf.select(node, "detok.file", default="")))
        return int(hit.group(1)) if hit else None
    block = OmegaConf.select(node, "arch.block_size", default=None)
    if block is not None:
        return math.isqrt(int(block))
    size = node.get("image_size")
    return None if size is None else int(size) // 16


def _codebook(node: DictConfig, key: str) -> tuple[Any, Any]:
    """(where the VQ comes from, (codes, dim) when readable without weights) of a model node."""
    if str(node.get("family")) == "mini":
        vq = Path(str(node.vq_path))
        c = _json(key, vq / "config.json")
        return str(vq.resolve()), (c.get("codebook_size"), c.get("codebook_embed_dim"))
    codes = OmegaConf.select(node, "arch.vocab_size", default=None)
    return _plain(node.get("vq")), (codes, None)


def _upsampler_path(cfg: DictConfig) -> Path | None:
    """``policy.upsampler_path`` (relative values were resolved against ``paths.root_dir`` by ``resolve_paths``)."""
    v = cfg.policy.get("upsampler_path")
    return None if v is None else Path(str(v)).expanduser()


def check_mulo_config(cfg: DictConfig, policy: Any = None) -> None:
    """Every ``policy=mulo`` rule that needs no weights (module docstring); ConfigError naming the key and path."""
    mulo_params(_plain(cfg.policy))  # the values (ConfigError naming policy.<key>)
    kinds = {
        k: check_choice(str(cfg.policy.get(k, "learned")), f"policy.{k}", RESAMPLER_KINDS)
        for k in ("upsampler", "downsampler")
    }
    node = drafter_node(cfg)
    fam_t, fam_d = str(cfg.model.get("family")), str(node.get("family"))
    name = cfg.policy.drafter_model
    if fam_t != fam_d:
        raise ConfigError(
            "policy.drafter_model",
            f"{name} is of family {fam_d}, but model.family is {fam_t}: the low-resolution "
            "drafter must be the same family (same tokenizer and codebook)",
        )
    if fam_t == "tar" and str(cfg.model.get("stage", "lm")) != "detok":
        raise ConfigError("model.stage", "policy=mulo speculates Tar's AR de-tokenizer: use model.stage=detok")
    src_t, shape_t = _codebook(cfg.model, "model.vq_path")
    src_d, shape_d = _codebook(node, "policy.drafter_model")
    if src_t != src_d and (None in shape_t or shape_t != shape_d):
        raise ConfigError(
            "policy.drafter_model",
            f"{name} uses the VQ {src_d} {shape_d}, the target {src_t} {shape_t}: MuLo-SD "
            "needs one codebook (codes are up-sampled and compared as the same ids)",
        )
    res_t, res_d = _resolution(cfg.model, "model.path"), _resolution(node, "policy.drafter_model")
    if res_t is not None and res_d is not None and (res_d <= 0 or res_t % res_d):
        raise ConfigError(
            "policy.drafter_model",
            f"r = target / drafter resolution = {res_t}/{res_d} is not an integer "
            f"({node.get('path')} vs {cfg.model.get('path')})",
        )
    if "learned" in kinds.values():
        p = _upsampler_path(cfg)
        if p is None:
            raise ConfigError("policy.upsampler_path", "the learned resampler needs its weights folder")
        for f in ("config.json", "model.safetensors"):
            if not (p / f).is_file():
                raise ConfigError(
                    "policy.upsampler_path",
                    f"expected {p / f} (train with `adtbench train upsampler`, or use "
                    "policy.upsampler=bicubic policy.downsampler=bicubic)",
                )


def _tar_drafter(node: DictConfig, target: Any) -> Any:
    """The AR-DTok of the drafter node's ``detok.file`` as a ``Target`` on the target's VQ, device and dtype."""
    from adtbench.models.registry import get, resolve_dir, resolve_file
    from adtbench.models.tar.ardtok import ARDTokTarget, load_ardtok

    try:
        base = resolve_dir("model.path", get(node, "path"), ["config.json"])
        file = str(get(node, "detok.file", "ar_dtok_lp_256px.pth"))
        path = resolve_file("model.detok.path", get(node, "detok.path", file), file, base, file)
        net = load_ardtok(path)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        raise ConfigError("policy.drafter_model", f"Tar drafter ({node.get('path')}): {e}") from e
    cls = target.net.cfg.cls_token_num  # the LM grid, as tar.build_target sets it for the target
    if net.cfg.cond_dim != target.net.cfg.cond_dim or net.abs_pe.shape[1] < cls + net.cfg.max_seq_len - 1:
        raise ConfigError("policy.drafter_model", f"{path}: AR-DTok does not fit the target's {cls}-token condition")
    net.cfg.cls_token_num = cls
    return ARDTokTarget(net, target.vq, None, device=target.device, dtype=target.dtype)


def _same_codebook(target: Any, drafter: Any) -> bool:
    try:
        a, b = target.codebook(), drafter.codebook()
    except RuntimeError:
        return True  # no VQ to compare (random-init vehicles without one): the layouts were compared
    return a.shape == b.shape and torch.allclose(a.detach().double().cpu(), b.detach().double().cpu())


def build_mulo_models(cfg: DictConfig, conf: AppConf, target: Any) -> MuloModels:
    """``aux`` of ``policy=mulo`` (module docstring); ConfigError naming ``policy.*`` keys on a bad pairing."""
    from adtbench.algorithm.methods.mulo import grids
    from adtbench.harness.caches import load_or_build_table
    from adtbench.models.registry import build_target
    from adtbench.models.resample import build_resampler

    params = mulo_params(_plain(cfg.policy))
    node, name = drafter_node(cfg), str(cfg.policy.drafter_model)
    tar = str(node.get("family")) == "tar"
    drafter: Any = _tar_drafter(node, target) if tar else build_target(node)
    lt, ld = target.layout, drafter.layout
    r = lt.grid_h // ld.grid_h
    try:
        grids(target, drafter, r)
    except ValueError as e:
        raise ConfigError("policy.drafter_model", f"{name} ({node.get('path')}): {e}") from e
    if not _same_codebook(target, drafter):
        raise ConfigError(
            "policy.drafter_model", f"{name} ({node.get('path')}): its VQ codebook differs from the target's"
        )
    up, down = str(cfg.policy.get("upsampler", "learned")), str(cfg.policy.get("downsampler", "learned"))
    path = _upsampler_path(cfg)
    resampler = build_resampler(up, down, target.vq, r, None if path is None else str(path))
    neighbours = None
    if params.k > 0:
        k = min(params.k, lt.num_codes - 1)
        if k < params.k:
            log.warning("policy.k=%d > %d other codes: pooling every other code", params.k, k)
        cache = conf.cache_dir
        try:
            codebook = target.codebook()
        except RuntimeError as e:
            raise ConfigError("policy.k", f"kNN_k pooling needs the model's VQ codebook ({e}); use policy.k=0") from e
        folder = None if cache is None else cache / "lantern"
        table, file, hit = load_or_build_table(codebook, k, False, folder)
        log.info("MuLo-SD kNN_%d table %s (%s)", k, file, "cache hit" if hit else "computed")
        neighbours = table.to(target.device)

    def encode(inputs: Any) -> Any:
        if tar:  # the TA-Tok features the target's encoding computed (one LM run for both)
            return drafter.encode_features(inputs.text, inputs.data["features"], inputs.cfg)
        return drafter.encode_prompt(inputs.text, inputs.cfg)

    info = {"upsampler": up, "downsampler": down, "drafter_model": name}
    if tar:
        info["timing_scope"] = TIMING_SCOPE_TAR
    log.info(
        "MuLo-SD: drafter %s (%d×%d) → target %d×%d, r=%d, U_r=%s, D_r=%s",
        name,
        ld.grid_h,
        ld.grid_w,
        lt.grid_h,
        lt.grid_w,
        r,
        up,
        down,
    )
    return MuloModels(drafter, resampler, neighbours, r, encode, info)
