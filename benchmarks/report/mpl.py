"""matplotlib for the report's figures, where it is installed: every figure (report/plots.py,
the projection's grid) gets pyplot from here, and the report says in one line how to get it."""
from __future__ import annotations

from typing import Optional

PLOT_HINT = "no plots: matplotlib is not installed (pip install 'degnn[bench]'); every table is here"

_PYPLOT: list = []


def pyplot():
    """matplotlib's pyplot on the Agg backend (no screen on the benchmark machines), or None where
    matplotlib is not installed."""
    if not _PYPLOT:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            plt = None
        _PYPLOT.append(plt)
    return _PYPLOT[0]


def plot_note() -> Optional[str]:
    """One line saying how to get the plots, where matplotlib is missing; None where it is there."""
    return None if pyplot() is not None else PLOT_HINT
