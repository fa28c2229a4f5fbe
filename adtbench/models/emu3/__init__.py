"""Emu3-Gen (BAAI, the transformers-converted ``BAAI/Emu3-Gen-hf``): lean LM, targets, tiny checkpoints."""
