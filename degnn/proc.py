"""Small process helpers shared by the launcher and the partitioners."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import List


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (stale-leftover checks use the owner's pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def die_with_parent() -> None:
    """`preexec_fn` of a child the launcher starts: runs between fork and exec, so that a launcher
    that is SIGKILLed (no handler runs) takes the child with it (PR_SET_PDEATHSIG). Kept across
    exec for non-setuid programs (nsenter, ssh, unshare)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass


def environ_of(pid) -> dict:
    """A process's environment from /proc ({} when it is gone or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def pids_with_env(key: str, value: str) -> List[int]:
    """Live processes whose environment has key=value (how holders and orphans are found)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and environ_of(d).get(key) == value]


def anon_rss_bytes() -> int:
    """This process's resident anonymous memory (RssAnon of /proc/self/status; 0 where unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def trim_heap() -> int:
    """Hand the C heap's free pages back to the kernel (glibc's `malloc_trim`) and return how many
    bytes of anonymous memory that gave back. A set-up or an epoch leaves freed blocks in the
    allocator's arenas, which still count against a machine's memory limit while the next phase
    (an evaluation) allocates anew. 0 where the C library has no malloc_trim."""
    import ctypes

    before = anon_rss_bytes()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        return 0
    return max(0, before - anon_rss_bytes())
