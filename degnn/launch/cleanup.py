"""Leftovers of launchers that are gone: `python -m degnn.launch --cleanup` (`make cleanup`), and
what every launch removes first.

A launcher killed with SIGKILL runs no clean-up of its own. Its processes and holders die with it
(parent-death signal), but some state outlives every process:
  - netns clusters: the namespaces (bind mounts under /run/netns), the bridge and veths
    (`degnn<pid>[mvb]<i>`, degnn/launch/netns.py), and with machine limits each machine's
    cgroups (`degnn<pid>m<i>` in the memory and cpu hierarchies, degnn/launch/limits.py);
  - non-isolated cluster=local runs: the registration `/dev/shm/degnn-local-<pid>` and DGL's
    shared-memory files in the host's /dev/shm (degnn/launch/isolate.py);
  - any process that still carries a dead launcher's pid (DEGNN_LAUNCHER_PID for servers and
    trainers, DEGNN_HOLDER_OF for holders), e.g. one whose parent-death signal was lost;
  - partition folders a killed writer left half-written:
    `<partition.root>/<dataset>/.<name>.tmp-<pid>-<hex>` (and `.<name>.old-<pid>-<hex>`,
    partitioners/folder.py), whose writing process `<pid>` is gone.
Only state of launchers whose pid no longer exists is touched; live runs are left alone.
`--cleanup` looks in `partition.root=DIR` when given, else `$DEGNN_PARTITIONS` or `./partitions`
(the default partition.root).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import List, Sequence

from degnn.proc import environ_of, pid_alive

from .registry import HOLDER_ENV, SHM, registered

LAUNCHER_ENV = "DEGNN_LAUNCHER_PID"


def _mapped_shm() -> set:
    """/dev/shm files some live process has mapped (DGL maps its shared tensors)."""
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(SHM + "/")
                    if i >= 0:
                        used.add(line[i:].strip().removesuffix(" (deleted)"))
        except OSError:
            continue
    return used


def _remove_dgl_shm(reg: dict) -> List[str]:
    """DGL's files of a dead run: named after its graph, or KVStore tensors (`...-kvdata-`)
    created while it ran; never one that a live process has mapped (someone else's run)."""
    out = []
    graph = reg.get("graph_name")
    try:
        names = os.listdir(SHM)
    except OSError:
        return out
    used = _mapped_shm()
    for name in names:
        path = Path(SHM, name)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if str(path) in used:
            continue
        if (graph and name.startswith(graph)) or (name.endswith("-kvdata-")
                                                  and mtime >= reg["started"] - 1):
            try:
                path.unlink()
                out.append(str(path))
            except OSError:
                pass
    return out


def remove_dead_local_runs() -> List[str]:
    """Registrations of dead non-isolated local launchers, and their DGL shared memory when no
    live local run shares the host's /dev/shm any more."""
    regs = registered()
    live = [r for r in regs if pid_alive(r["pid"])]
    removed = []
    for r in regs:
        if r in live:
            continue
        if not live:
            removed += _remove_dgl_shm(r)
        Path(r["path"]).unlink(missing_ok=True)
        removed.append(r["path"])
    return removed


def kill_orphans() -> List[str]:
    """Processes that belong to a launcher that is gone (SIGKILL)."""
    out = []
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        env = environ_of(pid)
        owner = env.get(LAUNCHER_ENV) or env.get(HOLDER_ENV)
        if not owner or not owner.isdigit() or pid_alive(int(owner)):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
            os.kill(int(pid), signal.SIGKILL)
            out.append(f"process {pid} of launcher {owner} ({cmd[:80]})")
        except (OSError, ValueError):
            pass
    return out


_PART_TEMP = re.compile(r"^\..+\.(tmp|old)-(\d+)-[0-9a-f]+$")


def default_partition_root() -> str:
    return os.environ.get("DEGNN_PARTITIONS") or "partitions"


def remove_dead_partition_temps(roots: Sequence[str]) -> List[str]:
    """Half-written partition folders (`<root>/<dataset>/.<name>.tmp-<pid>-<hex>`) whose writer
    is gone; a live writer's are left alone."""
    removed = []
    for root in roots:
        try:
            datasets = [d for d in Path(str(root)).expanduser().iterdir() if d.is_dir()]
        except OSError:
            continue
        for d in datasets:
            try:
                entries = list(d.iterdir())
            except OSError:
                continue
            for p in entries:
                m = _PART_TEMP.match(p.name)
                if not m or not p.is_dir() or pid_alive(int(m.group(2))):
                    continue
                shutil.rmtree(p, ignore_errors=True)
                if not p.exists():
                    removed.append(f"partition folder {p} (half written by process {m.group(2)}, "
                                   f"which is gone)")
    return removed


def cleanup_all(partition_roots: Sequence[str] = ()) -> List[str]:
    """Everything of dead launchers, netns first (its processes die with the namespaces)."""
    removed: List[str] = []
    if os.geteuid() == 0 and shutil.which("ip"):
        from .netns import cleanup_stale

        removed += [f"netns/link {n}" for n in cleanup_stale()]
        from .limits import cleanup_stale as stale_cgroups

        removed += [f"cgroup {d}" for d in stale_cgroups()]
    removed += kill_orphans()
    removed += [f"file {f}" for f in remove_dead_local_runs()]
    removed += remove_dead_partition_temps(partition_roots)
    return removed


def main(argv: Sequence[str] = ()) -> int:
    roots = [a.split("=", 1)[1] for a in argv if a.startswith("partition.root=")]
    other = [a for a in argv if not a.startswith("partition.root=")]
    if other:
        print(f"degnn.launch: error: --cleanup takes only partition.root=DIR, got {' '.join(other)}",
              file=sys.stderr, flush=True)
        return 2
    removed = cleanup_all(partition_roots=roots or [default_partition_root()])
    for r in removed:
        print(f"degnn.launch: removed {r}", flush=True)
    if not removed:
        print("degnn.launch: nothing to clean up (no leftovers of launchers that are gone)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
