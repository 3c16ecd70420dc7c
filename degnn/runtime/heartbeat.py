"""Heartbeats: how the launcher tells a hung process from a slow one (stdlib only).

Every process of a run writes `<run_dir>/heartbeat/<name>` (name = `rank<R>` or `server<S>`, as
its log). A small daemon thread rewrites the file every `interval_s` seconds, in one of two modes:
  - liveness: unconditionally. Servers (their loop runs inside DGL's C++ code, which Python cannot
    observe) and trainers until their training loop starts. Catches a stopped (SIGSTOP) or frozen
    process, not one that waits forever on a peer.
  - progress: only if the main code called `beat()` since the last write. Trainers switch to it
    when the epoch loop starts and beat per batch (training and evaluation) and per epoch, so a
    trainer blocked in RPC or a collective stops beating too.
The file holds "<beats> <unix time of the last beat>". The launcher (degnn/launch/hang.py) watches
for the content to change and measures time on its own clock, so the hosts' clocks need not agree.
As it exits, a process leaves its peak RSS beside it (`<name>.peak`, `write_peak`): the launcher
samples every process's peak while it runs, and this covers its last moments.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Optional

HEARTBEAT_DIR = "heartbeat"


def heartbeat_path(run_dir, name: str) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR / name


class Heartbeat:
    def __init__(self, path: Optional[os.PathLike] = None, interval_s: Optional[float] = None,
                 progress: bool = False):
        self.path = Path(path) if path is not None else None
        self.interval_s = interval_s if interval_s is not None else float(
            os.environ.get("DEGNN_HEARTBEAT_S", "2"))
        self.progress = progress
        self.count = 0
        self.last_beat = time.time()
        self._written = -1
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ---- the main code ------------------------------------------------------------------------
    def beat(self) -> None:
        """Progress was made (cheap: no system call; the thread writes the file)."""
        self.count += 1
        self.last_beat = time.time()

    def progress_mode(self) -> None:
        """From now on only beats count (the training loop has started)."""
        self.progress = True
        self.beat()

    # ---- the thread ---------------------------------------------------------------------------
    def start(self) -> "Heartbeat":
        if self.path is None or self._thread is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._loop, name="degnn-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.progress:
                self.beat()
            if self.count != self._written:
                self._write()

    def _write(self) -> None:
        count = self.count
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(f"{count} {self.last_beat:.3f}\n")
            os.replace(tmp, self.path)
            self._written = count
        except OSError:
            pass  # a full or vanished run directory must not kill training


def peak_rss_kb() -> int:
    """This process's peak resident set in KiB: /proc's VmHWM (the peak of its own memory since
    its exec), else getrusage's ru_maxrss (which also counts the parent it was forked from)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_path(run_dir, name: str) -> Path:
    """Where a process leaves its peak RSS as it exits (`<name>.peak`, KiB), for the launcher."""
    return Path(run_dir) / HEARTBEAT_DIR / f"{name}.peak"


def write_peak(run_dir, name: str) -> None:
    try:
        path = peak_path(run_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{peak_rss_kb()}\n")
    except OSError:
        pass


# what a context without a launcher-visible heartbeat uses (tests, single-process tools)
NULL = Heartbeat(None)
