"""The methods: each one module or package, built on the engine core of ``adtbench.algorithm`` (engine, tree, verify,
sampling, records, slot, batch, the drafters) and registered with ``adtbench.algorithm.policies``.

- ``jacobi/``: the training-free Jacobi family (SJD, SCD, GSD): ``loop`` (params, state, the host loop), ``draws``
  (tables, redraws, inits), ``windows`` (the window-rule registry), ``calibration`` (``window: cost``), ``drafter``
  (``init: drafter``), ``batch`` (the batched loop), ``step`` (the fixed-shape device step);
- ``sjd_pac``: SJD-PAC's multi-draft Jacobi trees; ``mulo``: MuLo-SD; ``zipar``: ZipAR;
- relaxations of the acceptance rule: ``lantern`` (LANTERN), ``gsd`` (GSD's grouped rule); ``gate``: draft gating.
"""
