"""jobs/train_mini.sh — the script that retrains the shipped mini chain — composes: every stage command it runs is
a valid ``adtbench train`` config (unknown keys fail Hydra's compose), and the stages are wired to each other (every
stage codes with the tokenizer the chain trains; the drafter serves the GPT the chain trains). No training here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from adtbench.tools.train.common import compose_stage

SCRIPT = Path(__file__).resolve().parents[1] / "jobs" / "train_mini.sh"
ENV = {"OUT": "outputs/train/v2", "AR16_STEPS": "5000"}


def stage_commands() -> list[tuple[str, list[str]]]:
    """(stage, overrides) of every ``$T <stage> …`` line of the script, continuations joined, variables expanded."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    env = dict(ENV)
    for m in re.finditer(r"^(\w+)=\$\{\1:-([^}]*)\}", text, re.M):  # X=${X:-default}
        env.setdefault(m.group(1), m.group(2))
    env["VQ"] = re.search(r"^VQ=(\S+)", text, re.M).group(1).replace("$OUT", env["OUT"])
    cmds = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("$T "):
            continue
        line = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), line)
        words = shlex.split(line.split(">")[0].rstrip("& "))[1:]
        cmds.append((words[0], words[1:]))
    return cmds


def test_every_stage_of_the_chain_composes_and_is_wired():
    cmds = stage_commands()
    assert [s for s, _ in cmds] == ["vq", "ar", "drafter", "ar", "upsampler", "ar", "drafter"]
    cfgs = []
    for stage, words in cmds:
        names = [w.split("=", 1)[1] for w in words if w.startswith("config=")]
        cfgs.append(compose_stage(names[-1] if names else stage, [w for w in words if not w.startswith("config=")]))
    vq, ar16, drafter, ar8, up, ar16_40k, drafter_40k = cfgs
    assert vq.arch.encoder == "local"
    vq_final = f"{vq.out_dir}/final"
    assert ar16.vq_path == ar8.vq_path == up.vq_path == drafter.model.vq_path == vq_final
    assert drafter.model.path == f"{ar16.out_dir}/final" and ar16.steps == int(ENV["AR16_STEPS"])
    assert ar8.data.size == 32 and ar16.data.size == 64
    # the third generation: the GPT fine-tuned from step 2's on more scenes, its drafter warm-started from step 3's
    assert ar16_40k.init_from == f"{ar16.out_dir}/final" and ar16_40k.data.count > ar16.data.count
    assert ar16_40k.vq_path == drafter_40k.model.vq_path == vq_final and ar16_40k.data.size == 64
    assert drafter_40k.model.path == f"{ar16_40k.out_dir}/final" and drafter_40k.init_from == f"{drafter.out_dir}/final"
    assert len({c.out_dir for c in cfgs}) == 7  # no two stages share a checkpoint directory
