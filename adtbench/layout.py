"""Token layouts: where the image lives in a model's vocabulary and sequence.

A generated image is a sequence of ``num_gen_tokens`` tokens indexed by the *generation index* g
(0 = the first token after the prompt). For a plain raster layout (Anole, LlamaGen) g runs over the
``grid_h × grid_w`` codes. Lumina-mGPT ends every row with an end-of-line token and the image with an
end-of-image token; both are *forced* (the logits constraint allows exactly one token there).

Invariants
- image token id = VQ code + ``image_token_offset``; codes are ``0 .. num_codes-1``.
- ``row_len = grid_w + (1 if eol_token is not None else 0)``.
- ``num_gen_tokens = grid_h · row_len + (1 if eoi_token is not None else 0)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TokenLayout:
    """Image-token id range, grid and forced tokens of one model (see module docstring)."""

    vocab_size: int
    image_token_offset: int
    num_codes: int
    grid_h: int
    grid_w: int
    eol_token: int | None = None
    eoi_token: int | None = None
    special: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.image_token_offset < 0 or self.image_token_offset + self.num_codes > self.vocab_size:
            raise ValueError(
                f"image ids {self.image_token_offset}..{self.image_token_offset + self.num_codes - 1} "
                f"do not fit a vocabulary of {self.vocab_size}"
            )
        if self.grid_h < 1 or self.grid_w < 1:
            raise ValueError(f"grid must be positive, got {self.grid_h}×{self.grid_w}")

    @property
    def row_len(self) -> int:
        return self.grid_w + (1 if self.eol_token is not None else 0)

    @property
    def num_gen_tokens(self) -> int:
        return self.grid_h * self.row_len + (1 if self.eoi_token is not None else 0)

    @property
    def forces(self) -> bool:
        """Does some generation index force a token (an end-of-line or end-of-image slot)?"""
        return self.eol_token is not None or self.eoi_token is not None

    @property
    def masks_logits(self) -> bool:
        """Does the logits constraint mask anything (``sampling.constrain``): a vocabulary token that is no image
        token, or a forced slot? False: every token is allowed at every index (LlamaGen, the mini model)."""
        return self.forces or self.image_token_offset != 0 or self.num_codes != self.vocab_size

    @property
    def image_ids(self) -> range:
        return range(self.image_token_offset, self.image_token_offset + self.num_codes)

    def grid_position(self, gen_idx: int) -> tuple[int, int] | None:
        """(row, col) of generation index ``gen_idx`` in the image grid; None for EOL/EOI slots."""
        if gen_idx >= self.grid_h * self.row_len:
            return None
        row, col = divmod(gen_idx, self.row_len)
        return (row, col) if col < self.grid_w else None

    def forced_tokens(self, gen_idx: torch.Tensor) -> torch.Tensor:
        """Forced token per generation index (``-1`` where the position is a free image token)."""
        out = torch.full_like(gen_idx, -1)
        if self.eol_token is not None:
            out = torch.where(gen_idx % self.row_len == self.grid_w, self.eol_token, out)
        if self.eoi_token is not None:
            out = torch.where(gen_idx == self.grid_h * self.row_len, self.eoi_token, out)
        return out

    def forced_token(self, gen_idx: int) -> int:
        """The forced token at one generation index (``-1``: a free image token), on the host."""
        if self.eoi_token is not None and gen_idx == self.grid_h * self.row_len:
            return self.eoi_token
        if self.eol_token is not None and gen_idx % self.row_len == self.grid_w:
            return self.eol_token
        return -1

    def forced_kind(self, gen_idx: torch.Tensor) -> torch.Tensor:
        """Per generation index: 0 free image token, 1 the first forced token of ``(eol, eoi)`` the layout has, 2 the
        second (the row of ``sampling.constrain``'s table), computed on ``gen_idx``'s device."""
        kind = torch.zeros_like(gen_idx)
        nxt = 1
        if self.eol_token is not None:
            kind = torch.where(gen_idx % self.row_len == self.grid_w, nxt, kind)
            nxt += 1
        if self.eoi_token is not None:
            kind = torch.where(gen_idx == self.grid_h * self.row_len, nxt, kind)
        return kind

    def image_token_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Bool ``[vocab_size]``: True on image-token ids."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=device)
        mask[self.image_token_offset : self.image_token_offset + self.num_codes] = True
        return mask

    def tokens_to_codes(self, tokens: list[int] | torch.Tensor) -> torch.Tensor:
        """Generated tokens (``num_gen_tokens``) → VQ code grid ``[grid_h, grid_w]`` (EOL/EOI dropped)."""
        t = torch.as_tensor(tokens, dtype=torch.long)
        if t.numel() != self.num_gen_tokens:
            raise ValueError(f"expected {self.num_gen_tokens} tokens, got {t.numel()}")
        grid = t[: self.grid_h * self.row_len].view(self.grid_h, self.row_len)[:, : self.grid_w]
        codes = grid - self.image_token_offset
        if (codes < 0).any() or (codes >= self.num_codes).any():
            raise ValueError("generated sequence holds non-image tokens at image positions")
        return codes
