"""The reporting layer: paper tables and merges over finished run directories (read through ``harness.rundir``)."""
