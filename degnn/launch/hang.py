"""Hang detection on the launcher's side: read every running process's heartbeat file
(degnn/runtime/heartbeat.py) and name the one that made no progress for `timeout_s`.

Time is the launcher's own monotonic clock: a file's content changing is progress, whenever the
host that wrote it thinks it is. A process is watched from its first heartbeat on: an entry that
writes none (e.g. the plain DGL trainer of bench=parity, or a user's own) is never called hung;
degnn's entry writes its first one before it initialises DGL.
When several processes stopped making progress (one trainer stopped, the others blocked waiting
for it), the culprit is, among those silent for at least half the timeout: one that /proc says is
stopped (SIGSTOP) or in uninterruptible I/O, else the one whose progress stopped first (ties: the
earliest last beat written in the files). Going silent first alone is not enough: a trainer that
waits at a barrier for a slower peer goes silent before the peer is stopped.

A process that /proc says is stopped by a signal (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU: state T;
a tracer's stop, e.g. a debugger at a breakpoint: state t) for `STOPPED_LIMIT_S` is named at once
(`StopWatch`): it cannot make progress until it is resumed, so waiting for the hang timeout
would only delay the same end by minutes.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Iterable, Optional, Tuple


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _last_beat(content: Optional[str]) -> float:
    try:
        return float(content.split()[1])
    except (AttributeError, IndexError, ValueError):
        return 0.0


def process_state(pid: int) -> Optional[str]:
    """'stopped' (SIGSTOP), 'zombie', ... of a local pid from /proc; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return {"T": "stopped", "t": "stopped by a tracer", "Z": "zombie", "D": "in uninterruptible I/O"}.get(state)


# How long a process may stay stopped by a signal before the launcher calls it a fault: long
# enough for a `kill -STOP` ... `kill -CONT` pair typed on purpose (or a poll that catches a
# process between the two), short enough that a stopped run is named within seconds instead of
# after cluster.hang_timeout_s (which stays for processes that run but make no progress).
STOPPED_LIMIT_S = 5.0

STOPPED = ("stopped", "stopped by a tracer")


class StopWatch:
    """Which live process has been stopped by a signal (/proc state T or t) for `limit_s`."""

    def __init__(self, limit_s: float = STOPPED_LIMIT_S, clock: Callable[[], float] = time.monotonic,
                 state_of: Optional[Callable[[object], Optional[str]]] = None):
        self.limit_s = limit_s
        self.clock = clock
        self.state_of = state_of or (lambda r: process_state(r.popen.pid))
        # name -> when it was first seen stopped (on our clock); resumed: forgotten
        self.since: Dict[str, float] = {}

    def check(self, running: Iterable) -> Optional[Tuple[object, float, str]]:
        """(the stopped Running, seconds seen stopped, its state), or None."""
        now = self.clock()
        found = []
        for r in running:
            name = r.proc.name
            state = self.state_of(r) if r.rc is None else None
            if state not in STOPPED:
                self.since.pop(name, None)
                continue
            since = self.since.setdefault(name, now)
            if now - since >= self.limit_s:
                found.append((since, r, now - since, state))
        if not found:
            return None
        _, r, age, state = min(found, key=lambda f: f[0])
        return r, age, state


class HangWatch:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 state_of: Optional[Callable[[object], Optional[str]]] = None):
        self.timeout_s = timeout_s
        self.clock = clock
        # /proc state of a Running's process ("stopped", ...; None for a remote one over ssh)
        self.state_of = state_of or (lambda r: process_state(r.popen.pid))
        # name -> (file content, when it last changed on our clock)
        self.seen: Dict[str, Tuple[Optional[str], float]] = {}

    def check(self, running: Iterable) -> Optional[Tuple[object, float]]:
        """(the hung Running, seconds without progress), or None. Only live processes count."""
        now = self.clock()
        silent = []
        for r in running:
            if r.rc is not None:
                continue
            name = r.proc.name
            content = _read(r.proc.heartbeat)
            prev = self.seen.get(name)
            if content is None:
                if prev is None:
                    continue  # no heartbeat yet (or never): not watched
                content = prev[0]  # a file that vanished is no progress
            if prev is None or prev[0] != content:
                self.seen[name] = (content, now)
                continue
            age = now - prev[1]
            if age >= self.timeout_s / 2:
                silent.append((prev[1], _last_beat(content), r, age))
        if not any(age > self.timeout_s for *_, age in silent):
            return None
        stuck = [s for s in silent if self.state_of(s[2]) in ("stopped", "in uninterruptible I/O")]
        _, _, r, age = min(stuck or silent, key=lambda x: (x[0], x[1]))
        return r, age
