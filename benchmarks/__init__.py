"""degnn's benchmark harness: `make bench` (python -m benchmarks), the report, RESULTS.md.

It runs from a checkout and is not part of the wheel (it reads git and starts the checkout's own
code); its folders are the checkout's wherever it is started from.
"""
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent  # the folder holding degnn/ and benchmarks/
RECORDS_DIR = CHECKOUT / "benchmarks" / "records"  # the committed run records (<bench>.jsonl)
RESULTS_DIR = CHECKOUT / "benchmarks" / "results"  # every bench invocation's results (not committed)
