"""Plain autoregressive decoding over the ``Target`` interface, gpt-fast style: small functions the AR baseline
(``engine.decode_ar``), the speculative loops' gated steps and every other loop start from.

- ``prefill_token``: the prompt through the target, the first image token chosen (``first_token``);
- ``ar_step``: one token forwarded alone (a one-node tree), committed, the next token chosen;
- ``ar_tokens``: the whole image, one ``ar_step`` per token, one host read at the end. It is also the
  ``models.base.PlainDecode`` a target that runs a stage of its own plainly (Tar) is built with.

The models import nothing from this layer: a target forwards, commits and decodes images; the choice of tokens —
the sampling law (``algorithm.sampling``) — is the algorithm's.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch

from adtbench.algorithm.sampling import next_token_tensor, process_logits
from adtbench.layout import TokenLayout
from adtbench.models.base import PrefillResult, PromptInputs, Target
from adtbench.sampling_params import SamplingParams


def prefill_token(
    target: Target, inputs: PromptInputs, sp: SamplingParams, max_tree_nodes: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, PrefillResult]:
    """Run the prompt and choose the first image token; returns (that token ``[]`` on the device, ``PrefillResult``)."""
    res = target.start(inputs, max_tree_nodes)
    return first_token(res, target.layout, sp, generator), res


def first_token(
    res: PrefillResult, layout: TokenLayout, sp: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """The first image token (``[]`` on the device) from a prompt's prefill: its logits processed at generation
    index 0, then argmax or one draw."""
    processed = process_logits(res.logits[:, None], 0, layout, sp)[0]
    return next_token_tensor(processed, sp, generator)


@lru_cache(maxsize=16)
def one_node(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ancestor mask ``[1, 1]``, depth ``[1]``) of a one-node tree on ``device``; its depth is also the node ``commit``
    keeps. Cached, never written."""
    return torch.ones(1, 1, dtype=torch.bool, device=device), torch.zeros(1, dtype=torch.long, device=device)


def ar_step(
    target: Target, token: torch.Tensor, gen_idx: int, sp: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One plain AR step: forward ``token`` (``[]`` or ``[1]`` on the device) alone (a one-node tree), commit it,
    choose the token at generation index ``gen_idx``. Returns (that token ``[]`` on the device, the processed logits
    ``[V]`` it was chosen from, the features ``[R, 1, H]``); nothing is read. The AR baseline's step and the
    speculative loop's gated step (``engine.generate``) alike."""
    mask, first = one_node(target.valid.device)
    raw, feats = target.verify_forward(token.view(1), mask, first)
    processed = process_logits(raw, gen_idx, target.layout, sp)[0]
    target.commit(first, in_place=True)
    return next_token_tensor(processed, sp, generator), processed, feats


@torch.no_grad()
def ar_tokens(
    target: Target,
    inputs: PromptInputs,
    sp: SamplingParams,
    generator: torch.Generator | None,
    on_prefill: Callable[[], None] | None = None,
) -> list[int]:
    """Plain AR decoding over the ``Target`` interface: ``layout.num_gen_tokens`` generated token ids.

    The prefill samples token 0; each further step is an ``ar_step``. The tokens stay on the device until the image
    is complete (one host read per image, gpt-fast's loop). Invariant: the same calls and random draws as
    ``engine.decode_ar``, so a seeded ``generator`` gives the same tokens. ``on_prefill`` is called once, right after
    the first token is sampled (a timing hook). A target's own plain passes (Tar's other stage) run through
    this: it is the ``PlainDecode`` a builder hands the target (``models.registry.build_target``).
    """
    token, _ = prefill_token(target, inputs, sp, 1, generator)
    if on_prefill is not None:
        on_prefill()
    tokens = [token]
    for g in range(1, target.layout.num_gen_tokens):
        token = ar_step(target, token, g, sp, generator)[0]
        tokens.append(token)
    return [int(t) for t in torch.stack(tokens).tolist()]
