"""LlamaGen: the adapter (``target``: t2i, c2i, ``tiny_llamagen``), the in-project GPT (``gpt``), the VQ-16 decoder
(``vq``; Tar decodes through it too) and the tiny checkpoint writers (``tiny``). This package imports none of them."""
