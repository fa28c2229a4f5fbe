"""Drafter checkpoints: adtbench's layout and the public EAGLE-1/2 / LANTERN layouts, mapped onto one drafter.

State dicts and configs in, state dicts and ``EagleConfig`` out — no file IO here: ``harness.drafters`` reads the
folders (``read_drafter``) and ``tools.convert_drafter`` writes them. Two layouts, told apart by ``config.json``:

- **adtbench** (``build_drafter``'s own, what ``tools.convert_drafter`` and ``tools.train`` write):
  ``model.safetensors`` in ``EagleDrafter``'s key names + ``config.json`` of ``EagleConfig`` fields (``num_heads``);
  a folder without ``config.json`` or a bare ``.safetensors`` file is a drafter sized like one target layer.
- **public** (SafeAILab EAGLE ``cnets1``, LANTERN ``cnets_{anole,lumina_mgpt,llamagen}``): ``config.json`` is a
  Hugging Face config (``num_attention_heads``; LANTERN's Chameleon drafters: a ``ChameleonConfig`` with
  ``num_hidden_layers`` 1) and the weights ``pytorch_model.bin`` (torch, read weights-only) or ``model.safetensors``.
  Keys: ``embed_tokens.weight [V, H]`` (a frozen copy of the base model's embedding, which the drafter embeds its
  inputs with), ``fc.{weight,bias}`` over ``cat[e(x_{t+1}); f_t]`` (embedding first),
  ``layers.i.self_attn.{q,k,v,o}_proj.*``, ``layers.i.self_attn.{q,k}_norm.{weight,bias}`` (Chameleon's per-head
  LayerNorm, statistics over head_dim, eps 1e-5: Anole ``[heads, head_dim]``; Lumina-mGPT
  ``[model_parallel_size, head_dim]`` = ``[1, 128]``, each row shared by ``heads / model_parallel_size`` consecutive
  heads, expanded here to ``[heads, head_dim]``), ``layers.i.mlp.{gate,up,down}_proj.weight``,
  ``layers.i.{input,post_attention}_layernorm.weight`` (LANTERN's Chameleon drafters keep layer 0's input norm,
  EAGLE drops it). No final norm and no LM head: the target's.

``convert_state_dict`` maps a public state dict onto ``EagleDrafter``'s keys (a rename-free mapping apart from the
q/k-norm expansion: the names already agree) and its ``EagleConfig``; ``check_state`` compares a state dict with the
modules an ``EagleConfig`` builds (names and shapes, on the meta device). Every reader's error is one line naming
the offending key or shape (``ValueError``); ``harness.drafters.read_drafter`` raises them as
``ConfigError("drafter.path", …)``.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from adtbench.algorithm.drafters.eagle import EagleConfig, EagleDrafter
from adtbench.models.rope import Rope1D

EMBED = "embed_tokens.weight"
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAYER_KEYS = {
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",
    "self_attn.q_norm.weight",
    "self_attn.q_norm.bias",
    "self_attn.k_norm.weight",
    "self_attn.k_norm.bias",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
}


def is_public_config(config: dict[str, Any]) -> bool:
    """A Hugging Face model config (EAGLE's ``LlamaConfig``, LANTERN's ``ChameleonConfig``), not ``EagleConfig``."""
    return "num_attention_heads" in config and "num_heads" not in config


def convert_state_dict(
    sd: dict[str, torch.Tensor], config: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[str]]:
    """Public drafter keys → ``(our state dict, EagleConfig kwargs, dropped keys)`` (module docstring). Nothing is
    dropped (the list stays for the conversion record): the stored embedding too is kept (``vocab_size`` = its rows),
    since the drafter embeds its inputs with it, as LANTERN's does.
    Raises ``ValueError`` on unknown keys, missing tensors, shapes that disagree with the config or with each other.
    """
    out: dict[str, torch.Tensor] = {}
    layers: set[int] = set()
    for key, t in sd.items():
        if key in (EMBED, "fc.weight", "fc.bias"):
            out[key] = t
            continue
        m = _LAYER.match(key)
        if m is None or m.group(2) not in _LAYER_KEYS:
            raise ValueError(f"unexpected drafter key {key!r} (EAGLE-3 / Medusa checkpoints are not supported)")
        layers.add(int(m.group(1)))
        out[key] = t
    if "fc.weight" not in out:
        raise ValueError("no fc.weight: not an EAGLE-1/2 drafter")
    n_layers = max(layers) + 1 if layers else 0
    if sorted(layers) != list(range(n_layers)) or n_layers == 0:
        raise ValueError(f"decoder layers {sorted(layers)} are not 0..n-1")
    if "num_hidden_layers" in config and int(config["num_hidden_layers"]) != n_layers:
        raise ValueError(f"config.json num_hidden_layers={config['num_hidden_layers']} but {n_layers} layer(s) stored")
    hidden = int(out["fc.weight"].shape[0])
    if tuple(out["fc.weight"].shape) != (hidden, 2 * hidden):
        raise ValueError(f"fc.weight has shape {tuple(out['fc.weight'].shape)}, expected (H, 2H)")
    if "hidden_size" in config and int(config["hidden_size"]) != hidden:
        raise ValueError(
            f"config.json hidden_size={config['hidden_size']} but fc.weight is {tuple(out['fc.weight'].shape)}"
        )
    heads = int(config.get("num_attention_heads", 0))
    if heads <= 0 or hidden % heads:
        raise ValueError(f"config.json num_attention_heads={heads} does not divide hidden size {hidden}")
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = hidden // heads
    if "bias" in config and bool(config["bias"]) != ("fc.bias" in out):  # LANTERN's ``Model(bias=config["bias"])``
        raise ValueError(f"config.json bias={config['bias']} but fc.bias is {'' if 'fc.bias' in out else 'not '}stored")
    for i in range(n_layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if f"layers.{i}.self_attn.{name}.weight" not in out:
                raise ValueError(f"missing layers.{i}.self_attn.{name}.weight")
        for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm"):
            if f"layers.{i}.{name}.weight" not in out:
                raise ValueError(f"missing layers.{i}.{name}.weight")
        if i > 0 and f"layers.{i}.input_layernorm.weight" not in out:
            raise ValueError(f"layer {i} > 0 without input_layernorm")
        if tuple(out[f"layers.{i}.self_attn.k_proj.weight"].shape) != (kv_heads * head_dim, hidden):
            raise ValueError(f"layer {i}: k_proj shape does not match {kv_heads} kv heads of {head_dim}")
    ecfg: dict[str, Any] = {
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": int(out["layers.0.mlp.gate_proj.weight"].shape[0]),
        "rms_norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "fc_bias": "fc.bias" in out,
        "attention_bias": "layers.0.self_attn.q_proj.bias" in out,
        "input_norm": "layers.0.input_layernorm.weight" in out,
        "num_layers": n_layers,
    }
    if EMBED in out:
        emb = out[EMBED]
        if emb.dim() != 2 or emb.shape[1] != hidden:
            raise ValueError(f"{EMBED} has shape {tuple(emb.shape)}, expected (vocab, {hidden})")
        if "vocab_size" in config and int(config["vocab_size"]) != emb.shape[0]:
            raise ValueError(f"config.json vocab_size={config['vocab_size']} but {EMBED} has {emb.shape[0]} rows")
        ecfg["vocab_size"] = int(emb.shape[0])
    if config.get("rope_theta") is not None:
        ecfg["rope_theta"] = float(config["rope_theta"])
    if any(".q_norm." in k or ".k_norm." in k for k in out):
        ecfg["qk_norm"] = True
        for k in [k for k in out if ".q_norm." in k or ".k_norm." in k]:
            rows = heads if ".q_norm." in k else kv_heads
            t = out[k].reshape(1, -1) if out[k].dim() == 1 else out[k]
            shards = t.shape[0]
            if t.dim() != 2 or t.shape[1] != head_dim or shards < 1 or rows % shards:
                raise ValueError(f"{k}: shape {tuple(out[k].shape)} is not (heads or a divisor of them, {head_dim})")
            # Lumina-mGPT: row j serves heads j·rows/shards … (j+1)·rows/shards − 1 (``repeat_param``)
            out[k] = t.repeat_interleave(rows // shards, dim=0) if shards != rows else t
    if ecfg["attention_bias"]:
        for i in range(n_layers):
            for name in ("q_proj", "k_proj", "v_proj"):
                if f"layers.{i}.self_attn.{name}.bias" not in out:
                    raise ValueError(f"layers.{i}.self_attn.{name}: bias missing while q_proj has one")
    check_state(EagleConfig(**ecfg), out)
    return out, ecfg, []


def check_state(config: EagleConfig, sd: dict[str, torch.Tensor]) -> None:
    """``sd`` holds exactly the tensors an ``EagleDrafter`` of ``config`` has, at their shapes (``ValueError``
    naming the first missing / unexpected key or wrong shape; floating dtypes only)."""
    with torch.device("meta"):
        own = EagleDrafter(config, Rope1D(config.head_dim)).state_dict()
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    if missing or unexpected:
        raise ValueError(f"missing keys {missing}, unexpected keys {unexpected}")
    for k, ref in own.items():
        t = sd[k]
        if tuple(t.shape) != tuple(ref.shape):
            raise ValueError(f"{k} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{k} has dtype {t.dtype}, expected a floating-point tensor")


__all__ = ["EMBED", "check_state", "convert_state_dict", "is_public_config"]
