"""Shared memory for the graph servers, checked before they start.

A DGL graph server copies its part's structure and node and edge features into shared memory
(/dev/shm, a tmpfs) and the trainers of its machine map them from there. A tmpfs too small for
them (Docker's default /dev/shm is 64 MB) does not fail the write: the server dies of a bare
SIGBUS when it touches a page the tmpfs cannot give. So the launcher compares, per /dev/shm, what
the servers there will put in it (the size of their part's files: `graph.dgl`, `node_feat.dgl`,
`edge_feat.dgl`, and SHM_PER_FILE_BYTE more) with what it can hold, and refuses the run in one line naming the fix.

Which /dev/shm: a netns machine and an isolated local machine each mount a fresh tmpfs of
PRIVATE_SHM_SIZE (half the host's memory) that holds only their own part; a local machine that is
not isolated shares the host's /dev/shm, whose free space is what counts. Hosts reached by ssh or
Slurm are not checked (docs/limitations.md).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

from .plan import LaunchError
from .registry import SHM

# the size of the tmpfs a private machine (netns, isolated local) mounts on its /dev/shm
PRIVATE_SHM_SIZE = "50%"
# the part files a server copies into shared memory (DGL partition JSON keys)
SERVED_FILES = ("part_graph", "node_feats", "edge_feats")
# shared memory over the files' bytes: a synthetic-tiny server's /dev/shm peaked 1.7% above its
# part's files (DGL's own names and index arrays); 5% leaves room
SHM_PER_FILE_BYTE = 1.05


def part_bytes(part_config: str) -> List[int]:
    """The bytes each part's server puts in shared memory (its files' bytes and DGL's extra)."""
    path = Path(part_config)
    meta = json.loads(path.read_text())
    out = []
    for i in range(int(meta["num_parts"])):
        files = meta.get(f"part-{i}", {})
        size = sum(os.path.getsize(path.parent / files[k]) for k in SERVED_FILES
                   if k in files and (path.parent / files[k]).is_file())
        out.append(int(size * SHM_PER_FILE_BYTE))
    return out


def free_shm(path: str = SHM) -> Optional[int]:
    """Bytes that may still be written to the tmpfs at `path` (None: it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def private_shm_bytes() -> Optional[int]:
    """The size of a private machine's fresh tmpfs (PRIVATE_SHM_SIZE of the host's memory)."""
    try:
        with open("/proc/meminfo") as f:
            total_kb = next(int(l.split()[1]) for l in f if l.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return None
    return total_kb * 1024 * int(PRIVATE_SHM_SIZE.rstrip("%")) // 100


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_shm(kind: str, private: bool, part_config: str, machine_parts: List[List[int]]) -> None:
    """LaunchError where a machine's /dev/shm cannot hold its servers' parts. `machine_parts`:
    the parts each machine of this host serves; `private`: each machine has a fresh tmpfs."""
    if kind not in ("local", "netns"):
        return  # the hosts' own /dev/shm are not read from here
    sizes = part_bytes(part_config)
    for machine, parts in enumerate(machine_parts):
        need = sum(sizes[p] for p in parts)
        room = private_shm_bytes() if private else free_shm()
        if room is None or need <= room:
            continue
        which = (f"machine {machine}'s private {SHM} (a tmpfs of {PRIVATE_SHM_SIZE} of this host's "
                 f"memory)" if private else SHM)
        fix = ("give the host more memory or use more machines (smaller parts)" if private else
               f"give it more room (docker run --shm-size={-(-need * 5 // 4 // (1 << 20))}m or more; "
               f"on a host: mount -o remount,size=... {SHM}) or use more machines (fewer parts per "
               f"host, cluster=netns/ssh)")
        raise LaunchError(f"{which} has {room} bytes ({_mib(room)}) free, but the graph server of "
                          f"machine {machine} puts {need} bytes ({_mib(need)}) there (part "
                          f"{', '.join(map(str, parts))} of {part_config}: structure and features); "
                          f"it would die of SIGBUS: {fix}")
