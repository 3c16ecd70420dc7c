"""Hang detection: heartbeat files (degnn/runtime/heartbeat.py) and the launcher's watch
(degnn/launch/hang.py); the end-to-end check (a trainer stopped with SIGSTOP) is in
tests/test_launch_netns.py."""
from __future__ import annotations

import time
from types import SimpleNamespace

from degnn.launch.hang import HangWatch, StopWatch, process_state
from degnn.runtime.heartbeat import Heartbeat


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def proc(tmp_path, name, rc=None):
    return SimpleNamespace(rc=rc, proc=SimpleNamespace(name=name, heartbeat=str(tmp_path / name)))


def test_watch_names_the_process_whose_progress_stopped_first(tmp_path):
    clock = Clock()
    w = HangWatch(10, clock=clock, state_of=lambda r: None)
    a, b = proc(tmp_path, "rank0"), proc(tmp_path, "rank1")
    (tmp_path / "rank0").write_text("1 100.0")
    (tmp_path / "rank1").write_text("1 100.0")
    assert w.check([a, b]) is None
    for t in range(1, 6):  # rank0 keeps beating; rank1 stops at t=0
        clock.t = t
        (tmp_path / "rank0").write_text(f"{t + 1} {100 + t}")
        assert w.check([a, b]) is None
    clock.t = 10.5
    hung, age = w.check([a, b])
    assert hung is b and age == 10.5
    # rank0 stops too (blocked waiting for rank1): still rank1 is named
    clock.t = 30
    assert w.check([a, b])[0] is b
    # an exited process is not hung (the supervisor reports its exit)
    assert w.check([a, proc(tmp_path, "rank1", rc=0)])[0] is a


def test_a_process_is_watched_from_its_first_heartbeat(tmp_path):
    clock = Clock()
    w = HangWatch(5, clock=clock, state_of=lambda r: None)
    s = proc(tmp_path, "server0")
    assert w.check([s]) is None
    clock.t = 100  # an entry without heartbeats (plain DGL, a user's own) is never called hung
    assert w.check([s]) is None
    (tmp_path / "server0").write_text("1 5.0")
    assert w.check([s]) is None
    clock.t = 106
    assert w.check([s])[0] is s
    (tmp_path / "server0").unlink()  # a heartbeat that vanishes is no progress either
    clock.t = 112
    assert w.check([s])[0] is s


def test_a_stopped_process_is_named_before_the_peer_that_waits_for_it(tmp_path):
    # rank0 waits at a barrier (silent from t=0) for rank1, which is busy until it is stopped at t=4
    clock = Clock()
    a, b = proc(tmp_path, "rank0"), proc(tmp_path, "rank1")
    w = HangWatch(10, clock=clock, state_of=lambda r: "stopped" if r is b else None)
    (tmp_path / "rank0").write_text("1 100.0")
    (tmp_path / "rank1").write_text("1 100.0")
    w.check([a, b])
    for t in range(1, 5):
        clock.t = t
        (tmp_path / "rank1").write_text(f"{t + 1} {100 + t}")
        assert w.check([a, b]) is None
    clock.t = 10.5  # rank0 is past the timeout first, but rank1 is the stopped one
    hung, age = w.check([a, b])
    assert hung is b and age == 6.5


def test_heartbeat_writes_only_on_progress_in_progress_mode(tmp_path):
    hb = Heartbeat(tmp_path / "hb" / "rank0", interval_s=0.05).start()
    time.sleep(0.3)
    first = (tmp_path / "hb" / "rank0").read_text()
    time.sleep(0.3)
    assert (tmp_path / "hb" / "rank0").read_text() != first  # liveness: beats by itself
    hb.progress_mode()
    time.sleep(0.3)
    frozen = (tmp_path / "hb" / "rank0").read_text()
    time.sleep(0.3)
    assert (tmp_path / "hb" / "rank0").read_text() == frozen  # no beat() -> no change
    hb.beat()
    time.sleep(0.3)
    assert (tmp_path / "hb" / "rank0").read_text() != frozen
    hb.stop()


def test_process_state_sees_sigstop():
    import signal
    import subprocess
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert process_state(p.pid) is None
        p.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        assert process_state(p.pid) == "stopped"
    finally:
        p.kill()
        p.wait()


def _wait_state(pid, want):
    for _ in range(50):
        if process_state(pid) == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never {want}")


def test_a_process_stopped_by_a_signal_is_named_once_it_stays_stopped():
    import signal
    import subprocess
    p = subprocess.Popen(["sleep", "30"])
    r = SimpleNamespace(rc=None, popen=p, proc=SimpleNamespace(name="rank1"))
    clock = Clock()
    w = StopWatch(5, clock=clock)
    try:
        assert w.check([r]) is None
        p.send_signal(signal.SIGSTOP)
        _wait_state(p.pid, "stopped")
        clock.t = 10
        assert w.check([r]) is None  # first seen stopped now
        clock.t = 14
        assert w.check([r]) is None
        clock.t = 15.5
        assert w.check([r]) == (r, 5.5, "stopped")
        p.send_signal(signal.SIGCONT)  # resumed: forgotten; stopped again: counted afresh
        _wait_state(p.pid, None)
        clock.t = 16
        assert w.check([r]) is None
        p.send_signal(signal.SIGSTOP)
        _wait_state(p.pid, "stopped")
        clock.t = 17
        assert w.check([r]) is None
        clock.t = 22
        assert w.check([r]) == (r, 5, "stopped")
    finally:
        p.kill()
        p.wait()
