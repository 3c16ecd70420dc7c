"""Machines with their own memory and CPU: `cluster.memory_per_machine`, `cluster.cpus_per_machine`
(cluster=netns; docs/design.md, "Machine limits"); `cluster.memory_accounting` gives every machine a
memory cgroup without a limit, for its peak and split only.

Machine i gets one cgroup `degnn<launcher pid>m<i>` in the cgroup v1 `memory` and `cpu`
hierarchies, created under the launcher's own cgroup (so the host's limits on the launcher still
hold): `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap is accounted, so the
limit cannot be dodged into swap) and `cpu.cfs_quota_us` = cpus x `cpu.cfs_period_us`. Every
server and trainer of the machine is moved into its cgroups between fork and exec (`enter`), so
what it allocates, the DGL shared memory it fills included, is charged to its machine. The kernel
enforces the limit: a machine over its memory has one of its processes killed by the OOM killer,
counted in the cgroup's `memory.oom_control` (`oom_kill`); `memory.max_usage_in_bytes` is the
machine's peak. The kernel keeps no record of what the peak was made of, so the supervisor's poll
samples each machine's `memory.usage_in_bytes` and `memory.stat` (`sample_memory`) and the split
at the highest sample is reported (degnn/launch/memory.py). The cgroups are removed with the
cluster, and those of launchers that are gone by the next launch and `--cleanup` (`cleanup_stale`).
"""
from __future__ import annotations

import os
import re
import signal
import time
from typing import Dict, List, Optional

from degnn.proc import pid_alive

from .memory import MachineSplit
from .plan import LaunchError

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "cpu")
PREFIX = "degnn"
_NAME = re.compile(rf"^{PREFIX}(\d+)m(\d+)$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MIN_MEMORY = 16 << 20  # below this not even an interpreter starts


def parse_size(text) -> int:
    """`4G`, `512M`, `3GiB`, `1.5g`, `1000000` (bytes) -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise LaunchError(f"cluster.memory_per_machine={text!r} is not a size (e.g. 4G, 512M)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def fmt_size(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def check_limits(cl) -> None:
    """The preflight of the machine limit keys (one LaunchError naming the key)."""
    mem, cpus = cl.get("memory_per_machine"), cl.get("cpus_per_machine")
    if mem is None and cpus is None and not cl.get("memory_accounting"):
        return
    key = ("cluster.memory_per_machine" if mem is not None else "cluster.cpus_per_machine"
           if cpus is not None else "cluster.memory_accounting")
    if cl.kind != "netns":
        raise LaunchError(f"{key}: only cluster=netns machines can be limited (cgroups per "
                          f"machine); remove it for cluster={cl.kind}")
    if mem is not None and parse_size(mem) < MIN_MEMORY:
        raise LaunchError(f"cluster.memory_per_machine={mem}: must be at least "
                          f"{fmt_size(MIN_MEMORY)}")
    if cpus is not None and not (isinstance(cpus, (int, float)) and 0.01 <= cpus <= 1000):
        raise LaunchError(f"cluster.cpus_per_machine={cpus}: must be a number of CPUs >= 0.01 "
                          f"(0.5 = half a core)")


def _own_dir(controller: str) -> str:
    """The launcher's own cgroup directory in a v1 hierarchy (inside a container the path in
    /proc/self/cgroup may be longer than what is mounted: its tails are tried), else the root."""
    base = os.path.join(ROOT, controller)
    try:
        with open("/proc/self/cgroup") as f:
            entries = [l.rstrip("\n").split(":", 2) for l in f]
    except OSError:
        entries = []
    for _, names, path in entries:
        if controller in names.split(","):
            parts = [p for p in path.split("/") if p]
            for i in range(len(parts) + 1):
                d = os.path.join(base, *parts[i:])
                if os.path.isdir(d):
                    return d
    return base


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _oom_kills(d: str) -> int:
    try:
        with open(os.path.join(d, "memory.oom_control")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _remove(d: str, wait_s: float = 5.0) -> bool:
    """Kill what is still in cgroup `d`, then remove it (rmdir fails while a task is in it)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids = [int(t) for t in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(d)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _ours_under(base: str, depth: int = 4) -> List[str]:
    """cgroups named `degnn<pid>m<i>` under `base` (a few levels deep)."""
    out = []
    for root, dirs, _ in os.walk(base):
        level = root[len(base):].count(os.sep)
        for d in list(dirs):
            if _NAME.match(d):
                out.append(os.path.join(root, d))
                dirs.remove(d)
        if level >= depth:
            dirs[:] = []
    return out


def cleanup_stale() -> List[str]:
    """Machine cgroups of launchers that are gone."""
    removed = []
    for controller in CONTROLLERS:
        base = os.path.join(ROOT, controller)
        if not os.path.isdir(base):
            continue
        for d in _ours_under(base):
            owner = int(_NAME.match(os.path.basename(d)).group(1))
            if owner != os.getpid() and pid_alive(owner):
                continue
            if _remove(d):
                removed.append(d)
    return removed


class MachineLimits:
    """`with MachineLimits(k, memory="4G", cpus=0.5) as lim:` k machines' cgroups, removed on exit."""

    def __init__(self, machines: int, memory: Optional[str] = None, cpus: Optional[float] = None,
                 accounting: bool = False):
        self.k = machines
        self.memory = parse_size(memory) if memory is not None else None
        self.cpus = float(cpus) if cpus is not None else None
        # a memory cgroup per machine without a limit: its peak and split only
        self.accounting = accounting
        self.dirs: Dict[str, List[str]] = {}  # controller -> one directory per machine
        self._procs: List[str] = []  # per machine, the cgroup.procs files to write a pid into
        self.splits: List[MachineSplit] = []  # per machine, its memory at its highest sample

    @property
    def active(self) -> bool:
        return self.memory is not None or self.cpus is not None or self.accounting

    def controllers(self) -> List[str]:
        return [c for c, on in (("memory", self.memory is not None or self.accounting),
                                ("cpu", self.cpus is not None)) if on]

    def __enter__(self) -> "MachineLimits":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        for c in self.controllers():
            probe = {"memory": "memory.limit_in_bytes", "cpu": "cpu.cfs_quota_us"}[c]
            if not os.path.isfile(os.path.join(ROOT, c, probe)):
                key = ("memory_per_machine" if self.memory is not None else "memory_accounting"
                       ) if c == "memory" else "cpus_per_machine"
                raise LaunchError(f"cluster.{key} needs "
                                  f"the cgroup v1 {c} controller mounted at {ROOT}/{c} (not found); "
                                  f"remove the key or mount it")
        cleanup_stale()
        tag = f"{PREFIX}{os.getpid()}"
        for c in self.controllers():
            parent = _own_dir(c)
            self.dirs[c] = []
            for i in range(self.k):
                d = os.path.join(parent, f"{tag}m{i}")
                try:
                    os.makedirs(d, exist_ok=True)
                except OSError as e:
                    raise LaunchError(f"cannot create the cgroup {d} for machine {i} "
                                      f"({e.strerror}): machine limits need root and a writable "
                                      f"cgroup v1 {c} hierarchy") from None
                self.dirs[c].append(d)
                if c == "memory" and self.memory is None:
                    pass  # accounting only: the cgroup's default, no limit
                elif c == "memory":
                    _write(os.path.join(d, "memory.limit_in_bytes"), self.memory)
                    try:  # swap accounting, where the kernel has it
                        _write(os.path.join(d, "memory.memsw.limit_in_bytes"), self.memory)
                    except OSError:
                        pass
                else:
                    period = _read_int(os.path.join(d, "cpu.cfs_period_us")) or 100000
                    _write(os.path.join(d, "cpu.cfs_quota_us"), max(1000, int(self.cpus * period)))
        self._procs = [[os.path.join(self.dirs[c][i], "cgroup.procs") for c in self.dirs]
                       for i in range(self.k)]
        self.splits = [MachineSplit() for _ in range(self.k)]

    def down(self) -> None:
        for dirs in self.dirs.values():
            for d in dirs:
                _remove(d)
        self.dirs = {}

    # ---- use --------------------------------------------------------------------------------
    def enter(self, machine: int) -> None:
        """Move the calling process into `machine`'s cgroups (run between fork and exec)."""
        pid = str(os.getpid())
        for path in self._procs[machine] if self._procs else []:
            with open(path, "w") as f:
                f.write(pid)

    def cpu_periods(self, machine: int) -> Optional[tuple]:
        """(CFS periods, periods in which the machine used up its CPU quota) so far, from its
        cgroup's cpu.stat; None without a CPU limit."""
        if "cpu" not in self.dirs:
            return None
        try:
            with open(os.path.join(self.dirs["cpu"][machine], "cpu.stat")) as f:
                st = dict(line.split() for line in f if line.strip())
            return int(st["nr_periods"]), int(st["nr_throttled"])
        except (OSError, KeyError, ValueError):
            return None

    def peak_bytes(self, machine: int) -> Optional[int]:
        if "memory" not in self.dirs:
            return None
        return _read_int(os.path.join(self.dirs["memory"][machine], "memory.max_usage_in_bytes"))

    def sample_memory(self) -> None:
        """One sample of every machine's usage and its make-up (the supervisor calls it at every
        poll); each machine keeps the sample of its highest usage."""
        for d, kept in zip(self.dirs.get("memory", ()), self.splits):
            kept.observe(_read_int(os.path.join(d, "memory.usage_in_bytes")),
                         _read_text(os.path.join(d, "memory.stat")))

    def oom_kills(self, machine: int) -> int:
        return _oom_kills(self.dirs["memory"][machine]) if "memory" in self.dirs else 0

    def out_of_memory(self) -> List[int]:
        """The machines whose processes the kernel killed for exceeding the machine's memory."""
        return [i for i in range(self.k) if self.oom_kills(i) > 0]

    def describe(self) -> str:
        parts = []
        if self.memory is not None:
            parts.append(f"{fmt_size(self.memory)} of memory")
        elif self.accounting:
            parts.append("memory accounted, not limited")
        if self.cpus is not None:
            parts.append(f"{self.cpus:g} CPUs")
        return " and ".join(parts) + " per machine (cgroups)"

    def summary(self) -> dict:
        """The launcher's summary keys of the limits: the limits and every machine's peak."""
        out = {"memory_per_machine_mb": round(self.memory / 2**20, 1) if self.memory else None,
               "cpus_per_machine": self.cpus}
        peaks = [self.peak_bytes(i) for i in range(self.k)]
        out["machine_peak_memory_mb"] = ([round(p / 2**20, 1) if p is not None else None for p in peaks]
                                         if "memory" in self.dirs else None)
        # what each peak was made of, at the poll that saw the machine's highest usage
        out["machine_memory_split_mb"] = ([kept.mb(p) for kept, p in zip(self.splits, peaks)]
                                          if "memory" in self.dirs else None)
        # how CPU-bound the machines were, over the whole run (set-up and evaluation included):
        # the share of CFS periods in which a machine used up its quota (a trainer cannot read its
        # cgroup: `ip netns exec` gives it a /sys without the cgroup mounts)
        got = [c for c in (self.cpu_periods(i) for i in range(self.k)) if c is not None]
        periods = sum(c[0] for c in got)
        out["cpu_throttled_share"] = round(sum(c[1] for c in got) / periods, 4) if periods else None
        return out
