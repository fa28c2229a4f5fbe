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

import numpy as np
import torch

from adtbench.algorithm.drafters.eagle import EagleDrafter
from adtbench.algorithm.sampling import SamplingParams, process_logits
from adtbench.models.base import Target


class DraftSession:
    """Per-cycle drafting state: node bookkeeping in numpy (no per-node Python objects, no small torch ops).

    ``depth [nodes]`` (root 0), ``outputs [R, nodes, H]`` (the drafter output at each node; the root's came from
    ``extend``) and ``slot_anc [nodes, slots]``: which scratch slots node i's own slot attends (its ancestors'
    slots and its own; the root has no slot). Node i ≥ 1 occupies scratch slot i − 1.
    """

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
        self.depth = np.zeros(1, dtype=np.int64)
        self.outputs = root_out[:, None]
        self.slot_anc = np.zeros((1, 0), dtype=bool)
        self.forwards = 0  # drafter forward passes this cycle (root's came from ``extend``)

    @property
    def greedy(self) -> bool:
        return self.sp.greedy

    @property
    def num_nodes(self) -> int:
        return self.depth.size

    def _logprobs(self, outputs: torch.Tensor, depths: np.ndarray) -> torch.Tensor:
        raw = self.target.lm_head(outputs)  # [R, m, V]
        gen_idx = torch.from_numpy(depths + (self.root_gen + 1))
        return process_logits(raw, gen_idx, self.layout, self.sp).log_softmax(-1)

    @torch.no_grad()
    def root_logprobs(self) -> torch.Tensor:
        """Drafter log-probs ``[V]`` over the root's children."""
        return self._logprobs(self.outputs[:, :1], self.depth[:1])[0]

    @torch.no_grad()
    def expand(
        self, parents: np.ndarray | torch.Tensor | list[int], tokens: torch.Tensor | list[int]
    ) -> tuple[list[int], torch.Tensor]:
        """Add node ``i`` = child ``tokens[i]`` of ``parents[i]``; return the new ids and log-probs ``[m, V]``."""
        par = parents.cpu().numpy() if isinstance(parents, torch.Tensor) else np.asarray(parents, dtype=np.int64)
        m, n0, base = par.size, self.num_nodes, self.slot_anc.shape[1]
        tok = torch.as_tensor(tokens, dtype=torch.long).view(-1)
        if tok.numel() != m or m == 0:
            raise ValueError("expand needs one token per parent and at least one node")
        if base != self.drafter.scratch:
            raise RuntimeError(f"drafter scratch ({self.drafter.scratch}) out of step with the session ({base})")
        anc = np.zeros((n0 + m, base + m), dtype=bool)  # a new node's slot sees its parent's slots and itself
        anc[:n0, :base] = self.slot_anc
        anc[n0:, :base] = self.slot_anc[par]
        anc[np.arange(n0, n0 + m), np.arange(base, base + m)] = True
        self.slot_anc = anc
        depth = self.depth[par] + 1
        self.depth = np.concatenate([self.depth, depth])
        dev = self.outputs.device
        feats = self.outputs[:, torch.from_numpy(par).to(dev)]  # [R, m, H]
        embeds = self.target.embed_tokens(tok)[None].expand(feats.shape[0], -1, -1).to(feats.dtype)
        pos = self.root_pos[:, None] + torch.from_numpy(depth - 1).to(self.root_pos.device)
        slots = torch.from_numpy(np.where(anc[n0:], 0.0, -np.inf).astype(np.float32))  # additive: one op fewer
        out = self.drafter.expand(feats, embeds, pos, slots)
        self.forwards += 1
        self.outputs = torch.cat([self.outputs, out], 1)
        return list(range(n0, n0 + m)), self._logprobs(out, depth)
