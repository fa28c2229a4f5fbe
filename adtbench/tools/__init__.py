"""Tools: benchmarks (``bench``), tiny real-layout checkpoints (``make_tiny``) and the mini-model training pipeline
(``train``)."""
