"""What the launcher says about a fault: the failed process's real error, a kernel OOM kill, a
full disk (docs/design.md, "Fault policy").

- `first_error(lines)`: the first error of a log: a Python traceback's exception line, else
  degnn's own `error: ...` line, else the first line with `Error` or C++'s `what():`. A library's exit banner (LIBXSMM prints
  `Registry and code`, `Command`, `Uptime` when a process that used it exits, also after an
  abort) is never the error and is left out of the log tail the launcher shows (`is_banner`).
- `oom_counts()` / `oom_note(pid, before)`: whether the kernel killed a process for memory, from
  the kernel log (`dmesg`: the pid itself), the launcher's memory cgroup (`memory.events`
  oom_kill on cgroup v2, `memory.oom_control` oom_kill on v1: its processes run in the
  launcher's cgroup) or the host's count (`/proc/vmstat` oom_kill), else a hint that it may have
  been. A machine's own memory limit is limits.py's.
- `disk_note(path)`: a clause naming a full file system.
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Dict, Iterable, List, Optional

# LIBXSMM's statistics at exit (libxsmm_finalize): never the error
BANNER = re.compile(r"^\s*(LIBXSMM_VERSION|LIBXSMM_TARGET|LIBXSMM_[A-Z_]+:|Registry and code|Command"
                    r"( \(PID=\d+\))?:|Uptime:|Scratch:|Registry:|Memory:|Threads:)")
_ERROR = re.compile(r"Error|\bERROR\b|what\(\):|Exception|Killed|Aborted|Segmentation fault|^error:")


def is_banner(line: str) -> bool:
    return bool(BANNER.match(line))


def first_error(lines: Iterable[str]) -> Optional[str]:
    """The first error in `lines`: a traceback's exception line (the first unindented line after
    `Traceback (most recent call last):`), else degnn's own one-line `error: ...` (a library's
    error lines logged before it are what it sums up), else the first line naming an error;
    stripped, at most 300 characters."""
    lines = [l for l in lines if l.strip() and not is_banner(l)]
    if not any(l.startswith("Traceback (most recent call last)") for l in lines):
        own = [l for l in lines if l.startswith("error: ")]
        if own:
            return own[-1].strip()[:300]
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            for later in lines[i + 1:]:
                if not later[:1].isspace():
                    return later.strip()[:300]
            return line.strip()[:300]
        if _ERROR.search(line):
            return line.strip()[:300]
    return None


# ---- out of memory -----------------------------------------------------------------------------
def _cgroup_files(pid: str = "self") -> List[str]:
    """The oom-kill counter files of `pid`'s memory cgroup (v2 memory.events, v1 oom_control);
    inside a container the cgroup path may be longer than what is mounted: its tails are tried."""
    out = []
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            entries = [l.rstrip("\n").split(":", 2) for l in f]
    except OSError:
        return out
    for _, controllers, path in entries:
        if controllers == "":
            base, name = "/sys/fs/cgroup", "memory.events"
            if not os.path.exists(os.path.join(base, "cgroup.controllers")):
                base = "/sys/fs/cgroup/unified"
        elif "memory" in controllers.split(","):
            base, name = "/sys/fs/cgroup/memory", "memory.oom_control"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts) + 1):
            f = os.path.join(base, *parts[i:], name)
            if os.path.isfile(f):
                out.append(f)
                break
    return out


VMSTAT = "/proc/vmstat"  # the host's own count of OOM kills (oom_kill, Linux 4.13+)


def oom_counts() -> Dict[str, int]:
    """oom_kill of each of the launcher's memory cgroup files and of the host (/proc/vmstat),
    read when the run starts."""
    counts = {}
    for f in _cgroup_files() + [VMSTAT]:
        try:
            with open(f) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        counts[f] = int(value)
        except (OSError, ValueError):
            continue
    return counts


def _dmesg_oom(pid: int) -> Optional[str]:
    try:
        r = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    pat = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid}\b)")
    for line in reversed(r.stdout.splitlines()):
        if pat.search(line):
            return line.split("]", 1)[-1].strip()[:200]
    return ""


def killed_rss_kb(pid: int) -> Optional[int]:
    """The resident set (KiB) the kernel's OOM killer recorded when it killed `pid` (dmesg:
    anon-rss + file-rss + shmem-rss), or None."""
    rec = _dmesg_oom(pid)
    m = re.search(r"anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB", rec or "")
    return sum(int(x) for x in m.groups()) if m else None


def oom_note(pid: int, before: Dict[str, int]) -> str:
    """Why a process died of SIGKILL that the launcher did not send: the kernel's OOM killer if its
    record says so, else a hint."""
    rec = _dmesg_oom(pid)
    if rec:
        return f"out of memory: the kernel's OOM killer, dmesg: {rec}"
    now = oom_counts()
    rose = {f: v - before[f] for f, v in now.items() if f in before and v > before[f]}
    cgroups = sorted(f for f in rose if f != VMSTAT)
    if cgroups:
        return (f"out of memory: the kernel's OOM killer, {sum(rose[f] for f in cgroups)} kill(s) "
                f"in the launcher's memory cgroup ({', '.join(cgroups)})")
    if VMSTAT in rose:
        return (f"out of memory: the kernel's OOM killer killed {rose[VMSTAT]} process(es) on "
                f"this host while the run ran ({VMSTAT} oom_kill)")
    if now and rec is not None:
        return "not by the kernel's OOM killer: its records show none"
    return "out of memory? the kernel's record could not be read"


# ---- a full disk -------------------------------------------------------------------------------
FULL_BELOW = 1 << 20  # bytes free under which a file system counts as full


def free_bytes(path: str) -> Optional[int]:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or ".")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_note(path: str) -> str:
    """`; the file system of <path> is full (...)` when it has under 1 MiB free, else ''."""
    free = free_bytes(path)
    if free is None or free >= FULL_BELOW:
        return ""
    return (f"; the file system of {path} is full ({free // 1024} KiB free): free space or pick "
            f"another hydra.run.dir")
