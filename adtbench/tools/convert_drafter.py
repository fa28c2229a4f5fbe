"""Convert public EAGLE-1/2 and LANTERN drafter checkpoints to adtbench's drafter layout.

    python -m adtbench.tools.convert_drafter SRC DST [--check-embeddings TARGET_EMBED.safetensors]

Optional: ``drafter.path`` reads the public layouts directly (``harness.drafters.read_drafter``, e.g.
``drafter.path=jadohu/anole_drafter``), through the same mapping this tool writes out, so a converted folder and the
original load the same drafter, bit for bit. Converting gives a safetensors copy (no pickle) and a record of the
source.

Source layouts (a folder with ``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``; or a hub repo id
when online):

- LANTERN ``cnets_anole`` / ``cnets_lumina_mgpt`` (``jadohu/anole_drafter``): ``embed_tokens.weight``, ``fc.{weight,
  bias}``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.self_attn.{q,k}_norm.{weight,bias}`` (Chameleon
  per-head LayerNorm, eps 1e-5: Anole ``(heads, head_dim)``; Lumina-mGPT ``(1, head_dim)``, one row shared by every
  head, written out expanded to ``(heads, head_dim)``), ``layers.0.mlp.{gate,up,down}_proj.weight``,
  ``layers.0.{input,post_attention}_layernorm.weight``; config = a ``ChameleonConfig`` (``rms_norm_eps`` 1e-5,
  ``rope_theta`` 1e4, optional ``bias`` for ``fc``).
- LANTERN ``cnets_llamagen`` (``jadohu/llamagen_drafter``, ``llamagen2_drafter``) and SafeAILab EAGLE-1/2
  (``cnets1``): the same without q/k-norms and without layer 0's ``input_layernorm``; q/k/v biases when the config
  has ``qkv_bias``; config = a ``LlamaConfig`` (+ LANTERN's ``input_type``).

Both compute ``fc(cat[e(x_{t+1}), f_t])`` (embedding first) → one decoder layer, with slot t at the position of
``f_t`` — our ``EagleDrafter`` convention. Output: ``DST/model.safetensors`` in our key layout (``fc.*``,
``layers.i.self_attn.*``, ``layers.i.mlp.*``, ``layers.i.post_attention_layernorm``, optional
``layers.i.input_layernorm``, q/k-norms and ``embed_tokens.weight``), ``DST/config.json`` (``EagleConfig`` fields,
what ``build_drafter`` reads) and ``DST/conversion.json`` (source, dropped keys — none —, notes). ``embed_tokens`` is
kept (``EagleConfig.vocab_size``): these drafters embed their inputs with their own frozen copy of the base model's
embedding (LANTERN's LlamaGen drafters may hold the LM head's rows instead), so dropping it would change the drafter
whenever the copy differs from the target's table; ``--check-embeddings`` reports the largest difference.

Positions: LANTERN's LlamaGen drafters apply LlamaGen's 2-D RoPE shifted by one slot (the grid cell of the
input token); load them with ``model.drafter_rope=lantern`` (the default in ``conf/model/llamagen_*.yaml``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from adtbench.algorithm.drafters.checkpoint import EMBED, convert_state_dict
from adtbench.harness.drafters import read_source
from adtbench.io import atomic_write_json


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
    if EMBED in ours:
        record["embedding_rows"] = int(ours[EMBED].shape[0])
    if "input_type" in config:  # LANTERN LlamaGen drafter
        record["notes"].append("LANTERN LlamaGen drafter: run the target with model.drafter_rope=lantern")
    if check_embeddings is not None and EMBED in sd:
        emb = sd[EMBED].float()
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
    from adtbench.harness.drafters import resolve_path

    return resolve_path(value, "SRC")


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
    kept = "with its own embedding" if "embedding_rows" in rec else "without an embedding of its own"
    print(f"wrote {a.dst} ({kept}; dropped {rec['dropped']}); use drafter.path={a.dst}")
    for note in rec["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["convert", "main", "read_source"]
