"""Tar: the LM stage and the builder (``target``), the AR de-tokenizer target (``ardtok``), TA-Tok decode (``tatok``)
and the tiny checkpoint writer (``tiny``). This package imports none of them."""
