"""cluster=local without sharing: one private machine on this host, or a refusal.

DGL 1.1.3 names its shared-memory tensors without the graph or the run (`node~_N~feat-kvdata-`):
two clusters on one /dev/shm corrupt each other silently (SIGBUS, or training on the other run's
labels). So a `cluster=local` run either
  - as root, with `unshare` and `ip`: gets a private machine. A holder process (`sleep infinity`)
    in its own network namespace (loopback only: every socket of the run is reachable from this
    run only, and ports never collide with other runs), mount namespace (a fresh tmpfs on
    /dev/shm, gone with the holder) and IPC namespace; every process enters it with `nsenter`.
  - otherwise: registers itself in the host's /dev/shm (`degnn-local-<launcher pid>`, with its
    run directory and graph name) and refuses to start while another live launcher is registered.
    Entries of launchers that are gone are removed, with the DGL shared-memory files they left
    (degnn/launch/cleanup.py).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

from degnn.proc import die_with_parent, pid_alive

from .plan import LaunchError
from .registry import HOLDER_ENV, REGISTRY_PREFIX, SHM, registered, registry_path
from .shm import PRIVATE_SHM_SIZE


def can_isolate() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("unshare", "nsenter", "ip"))


def start_holder(argv_prefix: List[str], script: str, what: str) -> subprocess.Popen:
    """A `sleep infinity` in fresh namespaces: `<argv_prefix> sh -c <script>; echo ready`.

    It dies with the launcher (parent-death signal, kept across the exec chain), so a SIGKILLed
    launcher leaves no holder and no tmpfs behind."""
    p = subprocess.Popen([*argv_prefix, "sh", "-c", f"{script} && echo ready && exec sleep infinity"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         start_new_session=True, preexec_fn=die_with_parent,
                         env={**os.environ, HOLDER_ENV: str(os.getpid())})
    ready, _, _ = select.select([p.stdout], [], [], 10)
    line = p.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        p.kill()
        p.wait()
        err = p.stderr.read().decode(errors="replace").strip()
        raise LaunchError(f"could not start the holder of {what}: {err or 'timeout'}")
    p.stdout.close()
    p.stderr.close()
    return p


class PrivateMachine:
    """`with PrivateMachine() as m:` one local machine in private net/mount/IPC namespaces."""

    def __init__(self, shm_size: str = PRIVATE_SHM_SIZE):
        self.shm_size = shm_size
        self.holder: Optional[subprocess.Popen] = None

    def __enter__(self) -> "PrivateMachine":
        script = (f"ip link set lo up && mount -t tmpfs -o size={self.shm_size} tmpfs /dev/shm")
        self.holder = start_holder(["unshare", "--net", "--mount", "--ipc", "--propagation",
                                    "private"], script, "the private local machine "
                                   "(unshare --net --mount --ipc + tmpfs on /dev/shm)")
        return self

    def __exit__(self, *exc) -> None:
        if self.holder is not None:
            if self.holder.poll() is None:
                self.holder.kill()
            self.holder.wait()
            self.holder = None

    def prefix(self, cwd: str) -> List[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-n", "-m", "-i", f"--wd={cwd}", "--"]


# ---- without isolation: one local run per host /dev/shm ------------------------------------------
class SharedShmLock:
    """Registration of a non-isolated local run; refuses while another live one is registered."""

    def __init__(self, run_dir: str, graph_name: Optional[str]):
        self.run_dir, self.graph_name = run_dir, graph_name
        self.path = registry_path(os.getpid())

    def __enter__(self) -> "SharedShmLock":
        from .cleanup import remove_dead_local_runs

        import fcntl

        remove_dead_local_runs()
        with open(Path(SHM, f"{REGISTRY_PREFIX}lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two launchers starting at once: one wins
            others = [r for r in registered() if r["pid"] != os.getpid() and pid_alive(r["pid"])]
            if not others:
                self.path.write_text(json.dumps({"run_dir": self.run_dir,
                                                 "graph_name": self.graph_name}))
        if others:
            o = others[0]
            raise LaunchError(
                f"another degnn run uses this host's /dev/shm (launcher pid {o['pid']}, run dir "
                f"{o.get('run_dir')}): DGL's shared-memory names would collide; wait for it, or "
                f"run as root (cluster=local then gets a private /dev/shm), or use cluster=netns")
        return self

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)
