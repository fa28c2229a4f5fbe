"""Training pipeline: ``adtbench train vq|ar|drafter|evaluator`` (Hydra configs under ``conf/train/``).

Every stage is seeded and resumable: the batch and all randomness of step ``i`` are functions of
``(seed, i)`` only, and the checkpoint holds the model, the optimiser and the step, so an interrupted run
resumed from its last checkpoint reproduces the uninterrupted one.
"""
