"""The algorithm layer: trees, sampling, verification, the decode loops, tree policies, drafters, LANTERN and the
cost model. Plain Python + torch: no Hydra, no OmegaConf, no file IO (docs/architecture.md; enforced by
tests/test_architecture.py)."""
