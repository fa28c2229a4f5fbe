"""``adtbench train <stage> [config=NAME] [hydra overrides]`` — stages ``vq``, ``ar``, ``drafter``, ``evaluator``,
``upsampler``.

Each stage composes ``conf/train/<stage>.yaml`` (or ``conf/train/<NAME>.yaml``) with the overrides, trains
(seeded, resumable, tqdm progress), writes ``out_dir/final/`` (safetensors + json) and copies it to ``export`` when set.
"""

from __future__ import annotations

import importlib
import json
import sys

STAGES = {
    "vq": "adtbench.tools.train.vq",
    "ar": "adtbench.tools.train.ar",
    "drafter": "adtbench.tools.train.drafter",
    "evaluator": "adtbench.tools.train.evaluator",
    "upsampler": "adtbench.tools.train.upsampler",
}

USAGE = "usage: adtbench train {vq|ar|drafter|evaluator|upsampler} [config=NAME] [key=value ...]   (conf/train/*.yaml)"


def main(args: list[str]) -> int:
    """Entry point (``adtbench.cli`` dispatches ``adtbench train ...`` here). Returns the exit code."""
    if not args or args[0] not in STAGES:
        print(USAGE, file=sys.stderr)
        return 2
    from adtbench.errors import ConfigError
    from adtbench.tools.train.common import compose_stage

    names = [a.split("=", 1)[1] for a in args[1:] if a.startswith("config=")]
    overrides = [a for a in args[1:] if not a.startswith("config=")]
    try:
        cfg = compose_stage(names[-1] if names else args[0], overrides)
        info = importlib.import_module(STAGES[args[0]]).run(cfg)
    except ConfigError as e:
        print(f"adtbench train {args[0]}: config error: {e}", file=sys.stderr)
        return 2
    keys = [k for k in ("wall_s", "steps") if k in info]
    print(json.dumps({"stage": args[0], **{k: info[k] for k in keys}, "final": info.get("final", {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
