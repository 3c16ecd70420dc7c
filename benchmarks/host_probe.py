"""The host's own CPU speed, timed before every suite of a bench (`host_probe_s` in its records).

A fixed single-threaded loop of pure Python arithmetic, timed three times back to back; the median
is the probe. It measures nothing of degnn: how fast the host delivers one core at that moment. On
a shared virtual machine that speed moves by itself (on the 2-core development host, six 5-second
runs of one loop on the idle host took 4.64 to 5.31 s, a 14% min–max; six probes back to back
0.206 to 0.218 s), and no per-machine CPU budget inside the host can make repeats agree more
closely than the host's own speed does. The report gives the probe's spread over a setting's
repeats beside the spread of their epoch times.
"""
from __future__ import annotations

import statistics
import time

LOOP = 5_000_000  # about 0.2 s on one core of the development host


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def probe_s(times: int = 3, n: int = LOOP) -> float:
    """The median seconds of `times` runs of the fixed loop (rounded to the millisecond)."""
    runs = []
    for _ in range(times):
        t = time.perf_counter()
        _loop(n)
        runs.append(time.perf_counter() - t)
    return round(statistics.median(runs), 4)
