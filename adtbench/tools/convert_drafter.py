"""Convert public EAGLE-1/2 and LANTERN drafter checkpoints to adtbench's drafter layout.

    python -m adtbench.tools.convert_drafter SRC DST [--check-embeddings TARGET_EMBED.safetensors]

Source layouts (a folder with ``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``; or a hub repo id
when online):

- LANTERN ``cnets_anole`` / ``cnets_lumina_mgpt`` (``jadohu/anole_drafter``): ``embed_tokens.weight``, ``fc.{weight,
  bias}``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.self_attn.{q,k}_norm.{weight,bias}`` (Chameleon
  per-head LayerNorm, shape ``(heads, head_dim)``, eps 1e-5), ``layers.0.mlp.{gate,up,down}_proj.weight``,
  ``layers.0.{input,post_attention}_layernorm.weight``; config = a ``ChameleonConfig`` (``rms_norm_eps`` 1e-5).
- LANTERN ``cnets_llamagen`` (``jadohu/llamagen_drafter``, ``llamagen2_drafter``) and SafeAILab EAGLE-1/2
  (``cnets1``): the same without q/k-norms and without layer 0's ``input_layernorm``; q/k/v biases when the config
  has ``qkv_bias``; config = a ``LlamaConfig`` (+ LANTERN's ``input_type``).

Both compute ``fc(cat[e(x_{t+1}), f_t])`` (embedding first) → one decoder layer, with slot t at the position of
``f_t`` — our ``EagleDrafter`` convention. Output: ``DST/model.safetensors`` in our key layout (``fc.*``,
``layers.i.self_attn.*``, ``layers.i.mlp.*``, ``layers.i.post_attention_layernorm``, optional
``layers.i.input_layernorm`` and q/k-norms), ``DST/config.json`` (``EagleConfig`` fields, what ``build_drafter``
reads) and ``DST/conversion.json`` (source, dropped keys, notes). ``embed_tokens`` is dropped: our drafters share
the target's (frozen) embedding; ``--check-embeddings`` compares the two.

Positions: LANTERN's LlamaGen drafters apply LlamaGen's 2-D RoPE shifted by one slot (the grid cell of the
input token); load them with ``model.drafter_rope=lantern`` (the default in ``conf/model/llamagen_*.yaml``).
LANTERN's Chameleon drafters need q/k-norm support in ``EagleConfig`` (``qk_norm``); without it the conversion
refuses rather than silently dropping them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from adtbench.algorithm.drafters.eagle import EagleConfig
from adtbench.io import atomic_write_json

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_ALLOWED = {
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
DROPPED = ("embed_tokens.weight",)


def read_source(src: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(state_dict, config.json)`` of a drafter folder (safetensors preferred; ``.bin`` via weights_only)."""
    cfg_file = src / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{src}: no config.json (expected an EAGLE/LANTERN drafter folder)")
    config = json.loads(cfg_file.read_text())
    st = src / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return dict(load_file(str(st))), config
    bin_file = src / "pytorch_model.bin"
    if bin_file.is_file():
        return dict(torch.load(bin_file, map_location="cpu", weights_only=True)), config
    raise FileNotFoundError(f"{src}: no model.safetensors or pytorch_model.bin")


def convert_state_dict(
    sd: dict[str, torch.Tensor], config: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[str]]:
    """Public drafter keys → ``(our state dict, EagleConfig kwargs, dropped keys)``.

    Raises ``ValueError`` on unknown keys, missing required tensors, or q/k-norms this ``EagleConfig`` cannot hold.
    """
    out: dict[str, torch.Tensor] = {}
    dropped: list[str] = []
    layers: set[int] = set()
    for key, t in sd.items():
        if key in DROPPED:
            dropped.append(key)
            continue
        if key in ("fc.weight", "fc.bias"):
            out[key] = t
            continue
        m = _LAYER.match(key)
        if m is None or m.group(2) not in _ALLOWED:
            raise ValueError(f"unexpected drafter key {key!r} (EAGLE-3 / Medusa checkpoints are not supported)")
        layers.add(int(m.group(1)))
        out[key] = t
    if "fc.weight" not in out:
        raise ValueError("no fc.weight: not an EAGLE-1/2 drafter")
    n_layers = max(layers) + 1 if layers else 0
    if sorted(layers) != list(range(n_layers)) or n_layers == 0:
        raise ValueError(f"decoder layers {sorted(layers)} are not 0..n-1")
    hidden = int(out["fc.weight"].shape[0])
    if tuple(out["fc.weight"].shape) != (hidden, 2 * hidden):
        raise ValueError(f"fc.weight has shape {tuple(out['fc.weight'].shape)}, expected (H, 2H)")
    heads = int(config.get("num_attention_heads", 0))
    if heads <= 0 or hidden % heads:
        raise ValueError(f"config.json num_attention_heads={heads} does not divide hidden size {hidden}")
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = hidden // heads
    for i in range(n_layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if f"layers.{i}.self_attn.{name}.weight" not in out:
                raise ValueError(f"missing layers.{i}.self_attn.{name}.weight")
        if f"layers.{i}.post_attention_layernorm.weight" not in out:
            raise ValueError(f"missing layers.{i}.post_attention_layernorm.weight")
        if i > 0 and f"layers.{i}.input_layernorm.weight" not in out:
            raise ValueError(f"layer {i} > 0 without input_layernorm")
        if tuple(out[f"layers.{i}.self_attn.k_proj.weight"].shape) != (kv_heads * head_dim, hidden):
            raise ValueError(f"layer {i}: k_proj shape does not match {kv_heads} kv heads of {head_dim}")
    qk_norm = any(".q_norm." in k for k in out)
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
    if qk_norm:
        known = {f.name for f in fields(EagleConfig)}
        if "qk_norm" not in known:
            raise ValueError(
                "this drafter uses Chameleon per-head q/k LayerNorms (LANTERN Anole/Lumina); the installed "
                "adtbench EagleConfig has no `qk_norm` field to hold them, and dropping them would change the drafter"
            )
        ecfg["qk_norm"] = True
        for k in [k for k in out if ".q_norm." in k or ".k_norm." in k]:
            rows = heads if ".q_norm." in k else kv_heads
            t = out[k]
            if t.dim() == 1 or t.shape[0] == 1:  # one vector shared by all heads (Lumina-style storage)
                out[k] = t.reshape(1, -1).expand(rows, -1).clone()
            if tuple(out[k].shape) != (rows, head_dim):
                raise ValueError(f"{k}: shape {tuple(t.shape)} is not ({rows}, {head_dim})")
    if ecfg.get("attention_bias"):
        for i in range(n_layers):
            for name in ("q_proj", "k_proj", "v_proj"):
                if f"layers.{i}.self_attn.{name}.bias" not in out:
                    raise ValueError(f"layers.{i}.self_attn.{name}: bias missing while q_proj has one")
    return out, ecfg, dropped


def convert(src: str | Path, dst: str | Path, check_embeddings: torch.Tensor | None = None) -> dict[str, Any]:
    """Convert the drafter folder ``src`` into ``dst`` (see module docstring); returns the conversion record."""
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    sd, config = read_source(src)
    ours, ecfg, dropped = convert_state_dict(sd, config)
    record: dict[str, Any] = {
        "source": str(src),
        "source_config": {k: config[k] for k in sorted(config) if k != "vocabulary_map"},
        "dropped": dropped,
        "notes": [],
    }
    if "input_type" in config:  # LANTERN LlamaGen drafter
        record["notes"].append("LANTERN LlamaGen drafter: run the target with model.drafter_rope=lantern")
    if check_embeddings is not None and "embed_tokens.weight" in sd:
        emb = sd["embed_tokens.weight"].float()
        ref = check_embeddings.float()
        if emb.shape != ref.shape:
            raise ValueError(f"drafter embedding {tuple(emb.shape)} vs target {tuple(ref.shape)}: wrong target?")
        record["embedding_max_abs_diff"] = float((emb - ref).abs().max())
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in ours.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_json(dst / "config.json", ecfg)
    atomic_write_json(dst / "conversion.json", record, default=str)
    return record


def _resolve_src(value: str) -> Path:
    from adtbench.models.registry import resolve_dir

    return resolve_dir("SRC", value, ["config.json"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adtbench.tools.convert_drafter", description=__doc__.splitlines()[0])
    p.add_argument("src", help="drafter folder (config.json + pytorch_model.bin | model.safetensors) or hub repo id")
    p.add_argument("dst", help="output folder (model.safetensors + config.json for drafter.path)")
    p.add_argument("--check-embeddings", help="safetensors file holding the target's embedding as 'weight'")
    a = p.parse_args(argv)
    from adtbench.errors import ConfigError

    try:
        ref = None
        if a.check_embeddings:
            from safetensors.torch import load_file

            ref = load_file(a.check_embeddings)["weight"]
        rec = convert(_resolve_src(a.src), a.dst, ref)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"adtbench: cannot convert {a.src}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.dst} (dropped {rec['dropped']}); use drafter.path={a.dst}")
    for note in rec["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["convert", "convert_state_dict", "main", "read_source"]
