"""``adtbench train <stage> [config=NAME] [hydra overrides]`` — stages ``vq``, ``ar``, ``drafter``, ``evaluator``.

Each stage composes ``conf/train/<stage>.yaml`` (or ``conf/train/NAME.yaml``) with the overrides, trains
(seeded, resumable, tqdm progress), writes ``out_dir/final/`` (safetensors + json) and copies it to ``export`` when set.
"""

from __future__ import annotations

import importlib
import json
import sys

STAGES = {
    "vq": "adtbench.train.vq",
    "ar": "adtbench.train.ar",
    "drafter": "adtbench.train.drafter",
    "evaluator": "adtbench.train.evaluator",
}

USAGE = "usage: adtbench train {vq|ar|drafter|evaluator} [config=NAME] [key=value ...]   (conf/train/*.yaml)"


def main(args: list[str]) -> int:
    """Entry point (``adtbench.cli`` dispatches ``adtbench train ...`` here). Returns the exit code."""
    if not args or args[0] not in STAGES:
        print(USAGE, file=sys.stderr)
        return 2
    from adtbench.train.common import compose_stage

    names = [a.split("=", 1)[1] for a in args[1:] if a.startswith("config=")]
    overrides = [a for a in args[1:] if not a.startswith("config=")]
    cfg = compose_stage(names[-1] if names else args[0], overrides)
    info = importlib.import_module(STAGES[args[0]]).run(cfg)
    keys = [k for k in ("wall_s", "steps") if k in info]
    print(json.dumps({"stage": args[0], **{k: info[k] for k in keys}, "final": info.get("final", {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
