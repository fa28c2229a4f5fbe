"""The harness layer: Hydra app, typed config schema, the run directory (``rundir``), tracking, prompt data and
image metrics. Builds algorithm objects from configs and owns every file a run writes."""
