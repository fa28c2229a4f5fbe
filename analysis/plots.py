"""The figures of a results tree: :mod:`adtbench.reporting.plots` (moved into the package so that ``adtbench
report`` draws them from an installed wheel too). ``python -m analysis.plots <results dir> [--out DIR] ...`` and
``from analysis.plots import ...`` keep working: this module is that one.
"""

from __future__ import annotations

import sys

from adtbench.reporting import plots as _plots

if __name__ == "__main__":
    sys.exit(_plots.main())
sys.modules[__name__] = _plots
