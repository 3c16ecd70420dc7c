"""Start a plan's processes, tee rank 0, watch them all, stop them all.

Every process gets its own session (process group), so one killpg reaches whatever it forked.
Stdout+stderr of each go to its log file; rank 0's also to the launcher's console (raw chunks,
not lines: tqdm redraws with carriage returns).

The loop polls every process every `poll_s`. Trainers all exiting 0 means success: DGL servers shut
down by themselves once rank 0 says so, and get `server_grace_s` to do it. Anything else that
exits non-zero (or dies by a signal) is a fault: it is named, and everything else is stopped,
because the rest would hang (servers wait for their clients forever, trainers block in RPC).

The fault policy is the pipeline's (`Pipeline.tolerates_trainer_faults`). With
`tolerate_trainer_faults` (TMA) a trainer that dies is named and the others go on; the run
succeeds when every trainer has exited and at least one exited 0, and the servers are then
stopped at once (they never shut down by themselves: DGL's shutdown needs every client). A
trainer that makes no progress for `hang_timeout_s`, or still runs that long after another one
finished, is hung: it is stopped and the others go on without it.
A dead server, or every trainer dead, is still a fault.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, IO, List, Optional

from degnn.proc import die_with_parent

from .hang import HangWatch, process_state
from .plan import Plan, Proc, child_env


class Interrupted(Exception):
    """SIGINT/SIGTERM to the launcher."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Running:
    proc: Proc
    popen: subprocess.Popen
    log: IO[bytes]
    tee: Optional[threading.Thread] = None

    @property
    def rc(self) -> Optional[int]:
        return self.popen.poll()


@dataclass
class Outcome:
    ok: bool
    # the first process that failed, its exit code, a one-line message
    failed: Optional[Proc] = None
    returncode: Optional[int] = None
    message: str = ""
    started_s: float = 0.0  # time to start every process
    stop_s: float = 0.0  # time from the fault (or end) to nothing left running
    # trainers that died while the others went on (tolerate_trainer_faults only)
    dead_trainers: List[Proc] = field(default_factory=list)


def describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def _tail(path: str, n: int = 3) -> List[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode(errors="replace").replace("\r", "\n")
    except OSError:
        return []
    return [l for l in text.splitlines() if l.strip()][-n:]


def _copy(src: IO[bytes], log: IO[bytes], console: IO[bytes]) -> None:
    fd = src.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        log.write(chunk)
        log.flush()
        try:
            console.write(chunk)
            console.flush()
        except (OSError, ValueError):
            pass


class Supervisor:
    def __init__(self, plan: Plan, command: Callable[[Proc], List[str]] = lambda p: p.argv,
                 on_stop: Optional[Callable[[], None]] = None, cwd: Optional[str] = None,
                 stop_grace_s: float = 5.0, poll_s: float = 0.5, hang_timeout_s: float = 0,
                 server_grace_s: float = 30, console: Optional[IO[bytes]] = None,
                 tee_rank: Optional[int] = 0, say: Callable[[str], None] = None,
                 tolerate_trainer_faults: bool = False):
        self.plan = plan
        self.tolerate_trainer_faults = tolerate_trainer_faults
        # how a process is started on its machine (nsenter/ssh wrapped around proc.argv)
        self.command = command
        # extra stopping work (ssh: kill the remote processes, which ssh does not forward to)
        self.on_stop = on_stop
        self.cwd = cwd or os.getcwd()
        # SIGTERM -> SIGKILL grace when stopping; no progress for hang_timeout_s = hung (0: off)
        self.stop_grace_s = stop_grace_s
        self.hang_timeout_s = hang_timeout_s
        self.poll_s = poll_s
        self.server_grace_s = server_grace_s
        self.console = console if console is not None else sys.stdout.buffer
        self.tee_rank = tee_rank
        self.say = say or (lambda msg: print(f"degnn.launch: {msg}", file=sys.stderr, flush=True))
        self.running: List[Running] = []

    # ---- starting ---------------------------------------------------------------------------
    def _start(self, proc: Proc) -> Running:
        os.makedirs(os.path.dirname(proc.log), exist_ok=True)
        log = open(proc.log, "ab")
        tee = proc.role == "trainer" and proc.index == self.tee_rank
        popen = subprocess.Popen(
            self.command(proc), env=child_env({**proc.env, "DEGNN_LAUNCHER_PID": str(os.getpid())}),
            cwd=self.cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if tee else log,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
        r = Running(proc, popen, log)
        if tee:
            # started by run() once every process is forked (no fork while a thread runs)
            r.tee = threading.Thread(target=_copy, args=(popen.stdout, log, self.console),
                                     daemon=True)
        return r

    # ---- stopping ---------------------------------------------------------------------------
    def _signal_all(self, sig: int) -> None:
        for r in self.running:
            if r.popen.poll() is None:
                try:
                    os.killpg(r.popen.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM everything still running, SIGKILL what is left after `grace_s`, reap all."""
        self._signal_all(signal.SIGTERM)
        if self.on_stop is not None:
            self.on_stop()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(r.popen.poll() is None for r in self.running):
            time.sleep(0.1)
        self._signal_all(signal.SIGKILL)
        for r in self.running:
            try:
                r.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            # the process group may outlive its leader (a forked child): kill it too
            try:
                os.killpg(r.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if r.tee is not None and r.tee.is_alive():
                r.tee.join(timeout=5)
            r.log.close()

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> Outcome:
        """Start the plan, supervise it, and return with nothing of it running."""
        handlers = {}

        def on_signal(signum, frame):
            raise Interrupted(signum)

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                handlers[s] = signal.signal(s, on_signal)
        t0 = time.monotonic()
        out = Outcome(ok=False)
        grace = self.stop_grace_s
        try:
            # servers first, as launch.py does; DGL clients retry their connection anyway
            for proc in self.plan.servers() + self.plan.trainers():
                self.running.append(self._start(proc))
            for r in self.running:
                if r.tee is not None:
                    r.tee.start()
            out.started_s = time.monotonic() - t0
            out = self._watch(out)
        except Interrupted as e:
            out.message = f"interrupted by {e}; stopping every process"
            out.returncode = 128 + e.signum
            self.say(out.message)
        finally:
            t_stop = time.monotonic()
            # a second Ctrl-C must not cut the clean-up short (it is bounded: grace + SIGKILL)
            for s in handlers:
                signal.signal(s, signal.SIG_IGN)
            try:
                self.stop_all(grace)
            finally:
                for s, h in handlers.items():
                    signal.signal(s, h)
            out.stop_s += time.monotonic() - t_stop
        return out

    def _watch(self, out: Outcome) -> Outcome:
        trainers = [r for r in self.running if r.proc.role == "trainer"]
        servers = [r for r in self.running if r.proc.role == "server"]
        done_at: Optional[float] = None
        warned = set()
        hang = HangWatch(self.hang_timeout_s) if self.hang_timeout_s else None
        while True:
            failed = []
            for r in self.running:
                rc = r.rc
                if rc is not None and rc != 0:
                    if done_at is not None and r.proc.role == "server":
                        # training is complete; a server failing on its way out loses nothing
                        if r.proc.name not in warned:
                            warned.add(r.proc.name)
                            self.say(f"{r.proc.describe()} {describe_rc(rc)} after the trainers "
                                     f"finished; log: {r.proc.log}")
                        continue
                    if self.tolerate_trainer_faults and r.proc.role == "trainer":
                        if r.proc not in out.dead_trainers:
                            out.dead_trainers.append(r.proc)
                            self.say(f"{r.proc.describe()} pid {r.popen.pid} {describe_rc(rc)}; "
                                     f"log: {r.proc.log}; the other trainers go on without it "
                                     f"(this pipeline tolerates trainer faults)")
                        if len(out.dead_trainers) < len(trainers):
                            continue
                    failed.append((r, rc))
            if failed:
                # A process killed by a signal is the cause; peers that saw it die (a gloo
                # "connection closed" error) exit with an error code within the same poll.
                r, rc = min(failed, key=lambda f: f[1] >= 0)
                return self._fault(out, r, rc)
            if self.tolerate_trainer_faults:
                if all(r.rc is not None for r in trainers):
                    # the servers wait for the dead trainers forever: stop them now (run() does)
                    out.ok = True
                    return out
                hung = hang.check(self.running) if hang is not None else None
                if hung is not None and hung[0].proc.role == "server":
                    return self._hung(out, *hung)
                if hung is not None:  # a hung trainer is left behind like a dead one
                    self._drop_trainer(out, hung[0], f"made no progress for {hung[1]:.0f}s")
                # a trainer still running `hang_timeout_s` after another one finished its run is
                # hung too (e.g. blocked): the others left it behind; stop it with the servers
                if done_at is None and any(r.rc == 0 for r in trainers):
                    done_at = time.monotonic()
                if (done_at is not None and self.hang_timeout_s
                        and time.monotonic() - done_at > self.hang_timeout_s):
                    for r in trainers:
                        if r.rc is None:
                            self._drop_trainer(out, r, f"still runs {self.hang_timeout_s:.0f}s after "
                                                       f"the others finished")
                    out.ok = True
                    return out
                time.sleep(self.poll_s)
                continue
            if done_at is None and all(r.rc == 0 for r in trainers):
                done_at = time.monotonic()
            if done_at is not None:
                if all(r.rc is not None for r in servers):
                    out.ok = True
                    return out
                if time.monotonic() - done_at > self.server_grace_s:
                    left = [r.proc.name for r in servers if r.rc is None]
                    self.say(f"trainers finished; servers {', '.join(left)} did not exit within "
                             f"{self.server_grace_s:.0f}s, terminating them")
                    out.ok = True
                    return out
            hung = hang.check(self.running) if hang is not None and done_at is None else None
            if hung is not None:
                return self._hung(out, *hung)
            time.sleep(self.poll_s)

    def _drop_trainer(self, out: Outcome, r: Running, why: str) -> None:
        """Tolerant policy: stop one hung trainer and go on without it."""
        try:
            os.killpg(r.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if r.proc not in out.dead_trainers:
            out.dead_trainers.append(r.proc)
        self.say(f"{r.proc.describe()} pid {r.popen.pid} {why}; stopped; log: {r.proc.log}; "
                 f"the other trainers go on without it")

    def _hung(self, out: Outcome, r: Running, age: float) -> Outcome:
        p = r.proc
        state = process_state(r.popen.pid)
        out.failed, out.returncode = p, None
        out.message = (f"{p.describe()} pid {r.popen.pid} made no progress for {age:.0f}s "
                       f"(cluster.hang_timeout_s={self.hang_timeout_s:g}"
                       f"{', process ' + state if state else ''}); log: {p.log}; "
                       f"stopping every process")
        self.say(out.message)
        for line in _tail(p.log):
            self.say(f"  {p.name}| {line}")
        return out

    def _fault(self, out: Outcome, r: Running, rc: int) -> Outcome:
        p = r.proc
        out.failed, out.returncode = p, rc
        out.message = (f"{p.describe()} pid {r.popen.pid} {describe_rc(rc)}; "
                       f"log: {p.log}; stopping every other process")
        self.say(out.message)
        for line in _tail(p.log):
            self.say(f"  {p.name}| {line}")
        return out
