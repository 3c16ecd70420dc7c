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
A dead server, or every trainer dead, is still a fault; its line names every trainer that died.

A process stopped by a signal (SIGSTOP, SIGTSTP; a tracer's stop) for `stopped_limit_s`
(hang.STOPPED_LIMIT_S) is a fault like a dead one, named within seconds instead of after
`hang_timeout_s`: the run is stopped or, under the tolerant policy, the stopped trainer is
killed and the others go on without it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, IO, List, Optional, Tuple

from degnn.proc import die_with_parent
from degnn.runtime.rendezvous import PIDS_ENV

from .faults import disk_note, first_error, is_banner, killed_rss_kb, oom_counts, oom_note
from .hang import STOPPED_LIMIT_S, HangWatch, StopWatch, process_state
from .memory import sets_kb
from .plan import Plan, Proc, child_env


# what stops a run: Ctrl-C, `kill`, and a closed terminal or ssh session
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP to the launcher (a KeyboardInterrupt, so every `finally` runs)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """How the launcher answers SIGINT, SIGTERM and SIGHUP (docs/design.md, "Fault policy").

    The first one stops the run: `Interrupted` is raised wherever the launcher is, so every
    clean-up runs, and from then on (as during any stop) the launcher is `stopping`: a second
    signal is answered with a line and otherwise ignored, so the clean-up finishes; a third leaves
    at once (exit 128 + the first signal), saying what it leaves behind (the processes die with
    the launcher; namespaces and files are removed by the next launch or `--cleanup`).
    `leftovers` are callables that describe what is still up."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.count = 0
        self.first: Optional[int] = None
        self.stopping = False
        self.leftovers: List[Callable[[], List[str]]] = []
        self._old: dict = {}

    @property
    def returncode(self) -> Optional[int]:
        return None if self.first is None else 128 + self.first

    def install(self) -> "Signals":
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._on_signal)
        return self

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def _on_signal(self, signum, frame):
        self.count += 1
        name = signal.Signals(signum).name
        if self.first is None:
            self.first = signum
        if not self.stopping:
            self.stopping = True
            raise Interrupted(signum)
        if self.count < 3:
            more = "twice more" if self.count == 1 else "once more"
            self.say(f"{name} received while stopping: the clean-up goes on (it is bounded by "
                     f"cluster.stop_grace_s); send it {more} to leave at once without it")
            return
        left = []
        for describe in self.leftovers:
            try:
                left += describe()
            except Exception:  # noqa: BLE001 - leaving must not fail
                pass
        self.say(f"{name} received {self.count} times: leaving without finishing the clean-up; "
                 f"left: {'; '.join(left) or 'nothing known'}; the processes die with the launcher, "
                 f"`python -m degnn.launch --cleanup` (or the next launch) removes the rest")
        try:
            sys.stderr.flush()
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os._exit(128 + self.first)


@dataclass
class Running:
    proc: Proc
    popen: subprocess.Popen
    log: IO[bytes]
    tee: Optional[threading.Thread] = None
    # peak resident set (KiB): /proc VmHWM sampled while it runs, and wait4's ru_maxrss once
    # reaped where that says more. ru_maxrss also covers the forked launcher before the exec,
    # so it counts only above `floor_kb` (the launcher's own VmHWM when it forked): max(before,
    # own) > before means it is the process's own peak.
    peak_kb: Optional[int] = None
    floor_kb: int = 0
    final: bool = False  # the peak it left at exit has been read
    # peak proportional and unique set sizes (KiB), sampled while it runs (memory.py)
    peak_pss_kb: Optional[int] = None
    peak_uss_kb: Optional[int] = None

    @property
    def rc(self) -> Optional[int]:
        """The exit status, once reaped here with wait4 (which also gives the peak RSS)."""
        p = self.popen
        if p.returncode is None:
            try:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                return p.poll()
            if pid == p.pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                if usage.ru_maxrss > self.floor_kb:
                    self.peak_kb = max(self.peak_kb or 0, usage.ru_maxrss)
        return p.returncode

    def sample_peak(self) -> Optional[int]:
        """The peak RSS so far (KiB): /proc/<pid>/status VmHWM while it runs; once it is gone,
        what it left as it exited (`<heartbeat>.peak`, degnn/runtime/heartbeat.py) or, killed
        by the OOM killer, the kernel's record of it."""
        if self.popen.returncode is None:
            hwm = vm_hwm_kb(self.popen.pid)
            if hwm is not None:
                self.peak_kb = max(self.peak_kb or 0, hwm)
        elif not self.final:
            self.final = True
            left = None
            try:
                with open(self.proc.heartbeat + ".peak") as f:
                    left = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                if self.popen.returncode == -signal.SIGKILL:
                    left = killed_rss_kb(self.popen.pid)
            if left:
                self.peak_kb = max(self.peak_kb or 0, left)
        return self.peak_kb


    def sample_sets(self) -> None:
        """PSS and USS now, from /proc/<pid>/smaps_rollup (while it runs); their peaks kept."""
        if self.popen.returncode is None:
            got = sets_kb(self.popen.pid)
            if got is not None:
                self.peak_pss_kb = max(self.peak_pss_kb or 0, got[1])
                self.peak_uss_kb = max(self.peak_uss_kb or 0, got[2])


def vm_hwm_kb(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


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


def describe_rc(rc: int, oom: Optional[str] = None) -> str:
    """`oom`: what the kernel's record says about an out-of-memory kill (faults.oom_note)."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"was killed by {name}{f' ({oom})' if oom and -rc == signal.SIGKILL else ''}"
    return f"exited with code {rc}"


def _log_lines(path: str, tail_bytes: Optional[int] = None) -> List[str]:
    try:
        with open(path, "rb") as f:
            if tail_bytes is not None:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - tail_bytes))
            text = f.read(4 << 20).decode(errors="replace").replace("\r", "\n")
    except OSError:
        return []
    return [l for l in text.splitlines() if l.strip()]


def _tail(path: str, n: int = 3) -> List[str]:
    """The last lines of a log, without a library's exit banner (faults.is_banner)."""
    return [l for l in _log_lines(path, 4096) if not is_banner(l)][-n:]


def _copy(src: IO[bytes], log: IO[bytes], console: IO[bytes], muted: threading.Event) -> None:
    """Rank 0's output to its log and, until the run is being stopped, to the console (what the
    stopped peers say after a fault would bury the launcher's fault line)."""
    fd = src.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        try:
            log.write(chunk)
            log.flush()
        except OSError:  # a full disk: the console still gets it
            pass
        if muted.is_set():
            continue
        try:
            console.write(chunk)
            console.flush()
        except (OSError, ValueError):
            pass


class Supervisor:
    def __init__(self, plan: Plan, command: Callable[[Proc], List[str]] = lambda p: p.argv,
                 on_stop: Optional[Callable[[], None]] = None,
                 on_kill: Optional[Callable[[], None]] = None, cwd: Optional[str] = None,
                 stop_grace_s: float = 5.0, poll_s: float = 0.5, hang_timeout_s: float = 0,
                 server_grace_s: float = 30, console: Optional[IO[bytes]] = None,
                 tee_rank: Optional[int] = 0, say: Callable[[str], None] = None,
                 tolerate_trainer_faults: bool = False, signals: Optional[Signals] = None,
                 enter: Optional[Callable[[Proc], None]] = None, limits=None,
                 local_pids: bool = True, tell_server_pids: bool = False,
                 stopped_limit_s: float = STOPPED_LIMIT_S, sample_sets: bool = False):
        self.plan = plan
        # whether each poll reads every process's PSS and USS (its pid is the process on this
        # host: local, netns; not an ssh client's or srun's)
        self.sample_sets = sample_sets and local_pids
        # stopped by a signal this long = a fault (0: off; only where the pids are the processes)
        self.stopped_limit_s = stopped_limit_s
        # whether the trainers get the servers' pids (DEGNN_SERVER_PIDS), to find them listening
        # in their namespaces before DGL connects (degnn/runtime/rendezvous.py): on this host only
        self.tell_server_pids = tell_server_pids
        # run in each child between fork and exec (the machine's cgroups: limits.MachineLimits)
        self.enter = enter
        # the machines' limits (limits.MachineLimits): who ran out of memory
        self.limits = limits
        # whether a started pid is the process itself (local, netns: nsenter execs it), so its
        # peak RSS can be read (not an ssh client's)
        self.local_pids = local_pids
        # the launcher's signal policy (installed by it); None: run() installs one of its own
        self.signals = signals
        self.muted = threading.Event()  # set once the run is being stopped (see _copy)
        self.tolerate_trainer_faults = tolerate_trainer_faults
        # how a process is started on its machine (nsenter/ssh wrapped around proc.argv)
        self.command = command
        # extra stopping work (ssh: kill the remote processes, which ssh does not forward to)
        self.on_stop = on_stop
        # extra killing work once the grace period is over (slurm: scancel of what is left)
        self.on_kill = on_kill
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
    def _start(self, proc: Proc, extra_env: Optional[Dict[str, str]] = None) -> Running:
        os.makedirs(os.path.dirname(proc.log), exist_ok=True)
        log = open(proc.log, "ab")
        tee = proc.role == "trainer" and proc.index == self.tee_rank
        enter = self.enter

        def preexec():
            die_with_parent()
            if enter is not None:
                enter(proc)

        popen = subprocess.Popen(
            self.command(proc),
            env=child_env({**proc.env, **(extra_env or {}), "DEGNN_LAUNCHER_PID": str(os.getpid())}),
            cwd=self.cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if tee else log,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec)
        r = Running(proc, popen, log, floor_kb=vm_hwm_kb(os.getpid()) or 1 << 40)
        if tee:
            # started by run() once every process is forked (no fork while a thread runs)
            r.tee = threading.Thread(target=_copy, args=(popen.stdout, log, self.console,
                                                         self.muted), daemon=True)
        return r

    # ---- stopping ---------------------------------------------------------------------------
    def _signal_all(self, sig: int) -> None:
        for r in self.running:
            if r.rc is None:
                try:
                    os.killpg(r.popen.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM everything still running, SIGKILL what is left after `grace_s`, reap all."""
        self._sample()
        self._signal_all(signal.SIGTERM)
        # a process stopped by a signal acts on SIGTERM only once resumed (else it waits for SIGKILL)
        self._signal_all(signal.SIGCONT)
        if self.on_stop is not None:
            self.on_stop()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(r.rc is None for r in self.running):
            time.sleep(0.1)
        if self.on_kill is not None:
            self.on_kill()
        self._signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(r.rc is None for r in self.running):
            time.sleep(0.05)
        for r in self.running:
            # the process group may outlive its leader (a forked child): kill it too
            try:
                os.killpg(r.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if r.tee is not None and r.tee.is_alive():
                r.tee.join(timeout=5)
            try:
                r.log.close()
            except OSError:  # what is buffered for a log on a full disk is lost, nothing else
                pass

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> Outcome:
        """Start the plan, supervise it, and return with nothing of it running."""
        own = self.signals is None
        signals = Signals(self.say).install() if own else self.signals
        self._oom0 = oom_counts()
        t0 = time.monotonic()
        out = Outcome(ok=False)
        grace = self.stop_grace_s
        try:
            # servers first, as launch.py does; DGL clients retry their connection anyway
            servers = [self._start(proc) for proc in self.plan.servers()]
            self.running += servers
            pids = ({PIDS_ENV: ",".join(str(r.popen.pid) for r in sorted(servers, key=lambda r: r.proc.index))}
                    if self.tell_server_pids else None)
            for proc in self.plan.trainers():
                self.running.append(self._start(proc, pids))
            for r in self.running:
                if r.tee is not None:
                    r.tee.start()
            out.started_s = time.monotonic() - t0
            out = self._watch(out)
        except Interrupted as e:
            self.muted.set()
            out.message = f"interrupted by {e}; stopping every process"
            out.returncode = 128 + e.signum
            self.say(out.message)
        finally:
            # from here on a signal does not cut the clean-up short (Signals; it is bounded:
            # grace + SIGKILL)
            signals.stopping = True
            self.muted.set()
            t_stop = time.monotonic()
            try:
                self.stop_all(grace)
            finally:
                if own:
                    signals.restore()
            out.stop_s += time.monotonic() - t_stop
        return out

    def describe(self, r: Running, rc: int) -> str:
        """How a process ended, with the kernel's word where it killed it for memory (its
        machine's limit, else the host's record: faults.oom_note)."""
        if rc == -signal.SIGKILL and self.limits is not None and self.limits.oom_kills(r.proc.machine):
            from .limits import fmt_size

            return (f"ran out of its machine's memory (machine {r.proc.machine}: "
                    f"cluster.memory_per_machine={fmt_size(self.limits.memory)}; killed by the "
                    f"kernel's OOM killer)")
        oom = oom_note(r.popen.pid, self._oom0) if rc == -signal.SIGKILL else None
        return describe_rc(rc, oom)

    def _sample(self) -> None:
        """One poll's memory samples: every process's peak RSS (and PSS, USS), every machine's
        memory split (limits.MachineLimits.sample_memory)."""
        if self.local_pids:
            for r in self.running:
                r.sample_peak()
                if self.sample_sets:
                    r.sample_sets()
        if self.limits is not None:
            self.limits.sample_memory()

    def sets_mb(self) -> dict:
        """{"pss": {name: MiB}, "uss": {name: MiB}}: every process's peak PSS and USS; {} where
        they were not sampled."""
        if not self.sample_sets:
            return {}
        name = lambda r: f"trainer{r.proc.index}" if r.proc.role == "trainer" else f"server{r.proc.index}"
        mb = lambda kb: round(kb / 1024, 1) if kb else None
        return {"pss": {name(r): mb(r.peak_pss_kb) for r in self.running},
                "uss": {name(r): mb(r.peak_uss_kb) for r in self.running}}

    def left_running(self) -> List[str]:
        return [f"{r.proc.name} pid {r.popen.pid}" for r in self.running if r.rc is None]

    def peaks_mb(self) -> dict:
        """Every process's peak RSS in MiB (`trainer<R>`, `server<S>`); {} where the pids are not
        the processes (ssh)."""
        if not self.local_pids:
            return {}
        out = {}
        for r in self.running:
            kb = r.sample_peak()
            name = f"trainer{r.proc.index}" if r.proc.role == "trainer" else f"server{r.proc.index}"
            out[name] = round(kb / 1024, 1) if kb else None
        return out

    def memory_fault(self) -> Optional[Tuple[str, Optional[Running]]]:
        """The one line of a machine that ran out of its memory limit and the process the
        kernel killed there, or None."""
        if self.limits is None:
            return None
        machines = self.limits.out_of_memory()
        if not machines:
            return None
        from .limits import fmt_size

        m = machines[0]
        held = [f"{r.proc.describe().split(' (')[0]} held {fmt_size((r.sample_peak() or 0) * 1024)}"
                for r in self.running if r.proc.machine == m]
        killed = [r for r in self.running if r.proc.machine == m and r.rc == -signal.SIGKILL]
        names = [f"{r.proc.describe().split(' (')[0]} pid {r.popen.pid}" for r in killed]
        return (f"machine {m} ran out of its {fmt_size(self.limits.memory)} "
                f"(cluster.memory_per_machine): {', '.join(held)} at their peak RSS; the kernel's "
                f"OOM killer killed {', '.join(names) or 'one of its processes'}; raise "
                f"cluster.memory_per_machine or use more machines", killed[0] if killed else None)

    def _watch(self, out: Outcome) -> Outcome:
        trainers = [r for r in self.running if r.proc.role == "trainer"]
        servers = [r for r in self.running if r.proc.role == "server"]
        done_at: Optional[float] = None
        warned = set()
        hang = HangWatch(self.hang_timeout_s) if self.hang_timeout_s else None
        stops = StopWatch(self.stopped_limit_s) if self.stopped_limit_s and self.local_pids else None
        self._why: Dict[str, str] = {}  # trainer name -> how it died (tolerant policy)
        while True:
            self._sample()
            failed = []
            for r in self.running:
                rc = r.rc
                if rc is not None and rc != 0:
                    if done_at is not None and r.proc.role == "server":
                        # training is complete; a server failing on its way out loses nothing
                        if r.proc.name not in warned:
                            warned.add(r.proc.name)
                            self.say(f"{r.proc.describe()} {self.describe(r, rc)} after the trainers "
                                     f"finished; log: {r.proc.log}")
                        continue
                    if self.tolerate_trainer_faults and r.proc.role == "trainer":
                        if r.proc not in out.dead_trainers:
                            out.dead_trainers.append(r.proc)
                            why = f"{self.describe(r, rc)}{_error_of(r.proc.log)}"
                            self._why[r.proc.name] = f"pid {r.popen.pid} {why}"
                            self.say(f"{r.proc.describe()} pid {r.popen.pid} {why}; log: "
                                     f"{r.proc.log}; {self._going_on(out, trainers, r)}")
                        if len(out.dead_trainers) < len(trainers):
                            continue
                    failed.append((r, rc))
            if failed:
                # A process killed by a signal is the cause; peers that saw it die (a gloo
                # "connection closed" error) exit with an error code within the same poll.
                r, rc = min(failed, key=lambda f: f[1] >= 0)
                return self._fault(out, r, rc)
            # a trainer already left behind (killed, not yet reaped) is not named twice
            live = [r for r in self.running if r.proc not in out.dead_trainers]
            stopped = stops.check(live) if stops is not None else None
            if stopped is not None and not self.tolerate_trainer_faults and done_at is None:
                return self._stopped(out, *stopped)
            if self.tolerate_trainer_faults:
                if stopped is not None and stopped[0].proc.role == "server":
                    return self._stopped(out, *stopped)
                if stopped is not None:  # a stopped trainer is left behind like a dead one
                    self._drop_trainer(out, stopped[0], self._stop_note(*stopped),
                                      self._stop_fix(stopped[0]))
                    live.remove(stopped[0])
                if all(r.rc is not None for r in trainers):
                    # the servers wait for the dead trainers forever: stop them now (run() does)
                    out.ok = True
                    return out
                hung = hang.check(live) if hang is not None else None
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

    def _going_on(self, out: Outcome, trainers: List[Running], r: Running) -> str:
        """What the tolerant policy does after trainer `r` died: go on with the others, or not."""
        if any(t is not r and t.proc not in out.dead_trainers and t.rc is None for t in trainers):
            return "the other trainers go on without it (this pipeline tolerates trainer faults)"
        if any(t.rc == 0 for t in trainers):
            return "the other trainers finished"
        return "no trainer is left: stopping every process"

    def _drop_trainer(self, out: Outcome, r: Running, why: str, fix: str = "") -> None:
        """Tolerant policy: kill one hung or stopped trainer and go on without it."""
        try:
            os.killpg(r.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if r.proc not in out.dead_trainers:
            out.dead_trainers.append(r.proc)
        self._why[r.proc.name] = f"pid {r.popen.pid} {why}"
        trainers = [t for t in self.running if t.proc.role == "trainer"]
        self.say(f"{r.proc.describe()} pid {r.popen.pid} {why}; killed; log: {r.proc.log}; "
                 f"{self._going_on(out, trainers, r)}{'; ' + fix if fix else ''}")

    def _stop_note(self, r: Running, age: float, state: str) -> str:
        how = ("by a signal (SIGSTOP, SIGTSTP, SIGTTIN or SIGTTOU: /proc state T)" if state == "stopped"
               else "by a tracer (a debugger at a breakpoint, SIGSTOP under ptrace: /proc state t)")
        return f"is stopped {how} for {age:.0f}s"

    def _stop_fix(self, r: Running) -> str:
        return (f"a process stopped on purpose must be resumed within {self.stopped_limit_s:g}s "
                f"(kill -CONT {r.popen.pid}, `fg` for Ctrl-Z, continue in the debugger); "
                f"cluster.hang_timeout_s=0 turns this check off with the hang timeout")

    def _stopped(self, out: Outcome, r: Running, age: float, state: str) -> Outcome:
        p = r.proc
        return self._report(out, r, None, (
            f"{p.describe()} pid {r.popen.pid} {self._stop_note(r, age, state)}; log: {p.log}; "
            f"stopping every other process; {self._stop_fix(r)}"))

    def _report(self, out: Outcome, r: Running, returncode, message: str) -> Outcome:
        """The fault line of a failed process, then the tail of its log."""
        self.muted.set()
        p = r.proc
        out.failed, out.returncode, out.message = p, returncode, message
        self.say(message)
        for line in _tail(p.log):
            self.say(f"  {p.name}| {line}")
        return out

    def _hung(self, out: Outcome, r: Running, age: float) -> Outcome:
        p, state = r.proc, process_state(r.popen.pid)
        return self._report(out, r, None, (
            f"{p.describe()} pid {r.popen.pid} made no progress for {age:.0f}s "
            f"(cluster.hang_timeout_s={self.hang_timeout_s:g}{', process ' + state if state else ''}); "
            f"log: {p.log}{disk_note(os.path.dirname(p.log))}; stopping every process"))

    def _fault(self, out: Outcome, r: Running, rc: int) -> Outcome:
        p = r.proc
        oom = self.memory_fault()
        if oom is not None:
            line, killed = oom
            r = killed or r
            return self._report(out, r, r.rc, f"{line}; log: {r.proc.log}; stopping every other process")
        if self.tolerate_trainer_faults and p.role == "trainer":
            return self._report(out, r, rc, all_died_line(out.dead_trainers, self._why))
        return self._report(out, r, rc, (
            f"{p.describe()} pid {r.popen.pid} {self.describe(r, rc)}{_error_of(p.log)}; log: {p.log}"
            f"{disk_note(os.path.dirname(p.log))}; stopping every other process"))


def all_died_line(dead: List[Proc], why: Dict[str, str]) -> str:
    """The fault line of a tolerant run whose trainers all died: every one of them, how, and
    where their logs are."""
    each = [f"{p.describe()} {why.get(p.name, 'died')}" for p in sorted(dead, key=lambda p: p.index)]
    logs = sorted({os.path.dirname(p.log) for p in dead})
    return (f"every trainer died, no trainer is left: {'; '.join(each)}; logs in {', '.join(logs)}; "
            f"stopping every other process")


def _error_of(log: str) -> str:
    """`: <the log's first error line>` (faults.first_error), or nothing."""
    err = first_error(_log_lines(log))
    return f": {err}" if err else ""
