"""One cycle's drafting interface: what a ``TreePolicy`` sees of the drafter (and nothing of the model).

Nodes are numbered in creation order, node 0 being the root (the token the target chose last cycle).
``root_logprobs()`` is the drafter's distribution over the root's children; ``expand(parents, tokens)``
adds children to existing nodes, runs the drafter on them in one forward and returns the distribution
over *their* children. Distributions are log-probabilities after the target's own processing
(CFG mix → constraint → temperature → top-k → top-p; greedy: CFG mix → constraint), so drafter ranks
and sampled proposals ``q`` are on the same footing as the verifier's ``p``.

Position bookkeeping: the root sits at target position ``root_pos`` (per CFG row) and generation index
``root_gen``. A node at depth d ≥ 1 occupies drafter slot position ``root_pos + d − 1`` (the position of the
feature it is paired with) and its children are tokens at generation index ``root_gen + d + 1``.
"""

from __future__ import annotations

import torch

from adtbench.drafters.eagle import EagleDrafter
from adtbench.models.base import Target
from adtbench.sampling import SamplingParams, process_logits


class DraftSession:
    def __init__(
        self,
        drafter: EagleDrafter,
        target: Target,
        sp: SamplingParams,
        root_token: int,
        root_gen: int,
        root_pos: torch.Tensor,
        root_out: torch.Tensor,
        generator: torch.Generator | None,
    ) -> None:
        self.drafter, self.target, self.sp = drafter, target, sp
        self.layout = target.layout
        self.root_token, self.root_gen, self.root_pos = root_token, root_gen, root_pos
        self.generator = generator
        self.depth: list[int] = [0]
        self.outputs: list[torch.Tensor] = [root_out]  # [R, H] drafter output per node
        self.slot: list[int] = [-1]
        self.slot_ancestors: list[set[int]] = [set()]  # scratch slots each node's slot may attend
        self.forwards = 0  # drafter forward passes this cycle (root's came from ``extend``)

    @property
    def greedy(self) -> bool:
        return self.sp.greedy

    def _logprobs(self, outputs: torch.Tensor, depths: list[int]) -> torch.Tensor:
        raw = self.target.lm_head(outputs)  # [R, m, V]
        gen_idx = torch.tensor([self.root_gen + d + 1 for d in depths], device=raw.device)
        return process_logits(raw, gen_idx, self.layout, self.sp).log_softmax(-1)

    @torch.no_grad()
    def root_logprobs(self) -> torch.Tensor:
        """Drafter log-probs ``[V]`` over the root's children."""
        return self._logprobs(self.outputs[0][:, None], [0])[0]

    @torch.no_grad()
    def expand(self, parents: list[int], tokens: torch.Tensor | list[int]) -> tuple[list[int], torch.Tensor]:
        """Add node ``i`` = child ``tokens[i]`` of ``parents[i]``; return the new ids and log-probs ``[m, V]``."""
        tok = torch.as_tensor(tokens, dtype=torch.long, device=self.drafter.valid.device).view(-1)
        m = len(parents)
        if tok.numel() != m or m == 0:
            raise ValueError("expand needs one token per parent and at least one node")
        base = self.drafter.scratch
        ids, depths, rows = [], [], []
        for i, par in enumerate(parents):
            node = len(self.depth)
            ids.append(node)
            self.depth.append(self.depth[par] + 1)
            self.slot.append(base + i)
            anc = self.slot_ancestors[par] | {base + i}
            self.slot_ancestors.append(anc)
            depths.append(self.depth[-1])
            rows.append(sorted(anc))
        slot_mask = torch.zeros(m, base + m, dtype=torch.bool)
        slot_mask[[i for i, r in enumerate(rows) for _ in r], [c for r in rows for c in r]] = True
        feats = torch.stack([self.outputs[p] for p in parents], dim=1)  # [R, m, H]
        embeds = self.target.embed_tokens(tok)[None].expand(feats.shape[0], -1, -1).to(feats.dtype)
        pos = self.root_pos[:, None] + torch.tensor([d - 1 for d in depths], device=self.root_pos.device)[None]
        out = self.drafter.expand(feats, embeds, pos, slot_mask)
        self.forwards += 1
        for i in range(m):
            self.outputs.append(out[:, i])
        return ids, self._logprobs(out, depths)
