"""Time limits for tests that start processes, scaled to how busy this machine is.

The suite runs on 2-core machines that other runs share: a limit that holds on an idle machine
fails under load without anything being wrong. `budget(s)` is `s` seconds on an idle machine,
stretched by the load per core (the higher of the load when the test session started and the load
when the limit is asked for, at least 1x) and by DEGNN_TEST_SLOWDOWN (a factor, default 1) for
machines known to be slow. Limits that are part of a promise (a fault reported within N seconds)
use it too: the promise is about the launcher's reaction, not about how fast a loaded machine
starts Python.
"""
from __future__ import annotations

import os

_CORES = os.cpu_count() or 1


def _load_per_core() -> float:
    try:
        return os.getloadavg()[0] / _CORES
    except OSError:  # not available on every platform
        return 0.0


_START_LOAD = _load_per_core()
_SLOWDOWN = max(1.0, float(os.environ.get("DEGNN_TEST_SLOWDOWN", "1") or 1))


def scale() -> float:
    return max(1.0, _START_LOAD, _load_per_core()) * _SLOWDOWN


def budget(seconds: float) -> float:
    return seconds * scale()


def interrupt_when(p, ready, wait_s: float = 60.0, settle_s: float = 0.0):
    """SIGINT to the process `p` once `ready()` holds (or it exited, or `wait_s` passed), then
    its (stdout, stderr); `p` is killed if it outlives the test."""
    import signal
    import time

    try:
        deadline = time.monotonic() + budget(wait_s)
        while time.monotonic() < deadline and p.poll() is None and not ready():
            time.sleep(0.01)
        time.sleep(settle_s)
        p.send_signal(signal.SIGINT)
        return p.communicate(timeout=budget(60))
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
