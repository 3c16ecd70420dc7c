"""`python -m benchmarks.report <results folder>`: rewrite that folder's report.md, runs.csv and plots."""
import sys
from pathlib import Path

from . import plot_note, write_report

print(write_report(Path(sys.argv[1])))
if plot_note():
    print(plot_note())
