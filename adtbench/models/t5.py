"""FLAN-T5 caption features for LlamaGen text-to-image (``language/t5.py`` ``T5Embedder`` of LlamaGen).

The official pipeline tokenises to ``max_length = 120`` with ``padding="max_length"`` and truncation, runs
``T5EncoderModel`` (google/flan-t5-xl, d_model 2048) with the attention mask and takes ``last_hidden_state``.
``sample_t2i`` then left-pads: the ``n`` valid rows are moved to the end, pad rows are zeroed and masked.
``T5CaptionEncoder(text)`` returns only the ``n`` valid rows ``[n, d_model]`` (float32, CPU);
``LlamaGenTarget.encode_prompt`` right-aligns them into the 120 condition slots and builds the mask — the
same tensor ``sample_t2i`` builds. (Padded keys are masked inside T5 and its relative position bias depends
only on offsets, so the valid rows equal an unpadded pass.)

Not reproduced: ``clean_caption`` (ftfy/bs4 text cleaning, on by default in the reference); pass cleaned
captions if exact parity with the reference matters. The tokenizer must be loadable without
``sentencepiece`` (the flan-t5 repos ship ``tokenizer.json``).
"""

from __future__ import annotations

from pathlib import Path

import torch


class T5CaptionEncoder:
    """``text → [n_valid, d_model]`` FLAN-T5 encoder features (see module docstring)."""

    def __init__(
        self,
        path: str | Path,
        max_length: int = 120,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoTokenizer, T5EncoderModel

        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = T5EncoderModel.from_pretrained(str(path), dtype=dtype).to(device).eval()
        self.max_length, self.device = int(max_length), torch.device(device)
        self.dim = int(self.model.config.d_model)

    @torch.no_grad()
    def __call__(self, text: str) -> torch.Tensor:
        tok = self.tokenizer(
            [text],
            max_length=self.max_length,
            padding="max_length",
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        ids, mask = tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state[0]
        n = max(1, int(mask[0].sum()))
        return hidden[:n].float().cpu()


__all__ = ["T5CaptionEncoder"]
