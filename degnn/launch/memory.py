"""Honest memory: a machine's memory by kind, each process's own share, and the machine's share
of the graph (docs/design.md, "Machine limits").

RSS counts a shared page once in every process that maps it: a graph server copies its part's
structure and features into the machine's /dev/shm and the trainers map them, so the processes'
peak RSS add up to more than the machine holds. What is reported instead:

- a machine's memory cgroup split by kind (`memory.stat`): `process` (anonymous memory: heaps,
  tensors), `shmem` (tmpfs: DGL's shared-memory partition), `page_cache` (file pages: a mapped
  partition file, logs, libraries) and `kernel` (the rest of the usage: page tables, slab, socket
  buffers). The kernel keeps only the peak's total, not its make-up, so the launcher samples the
  split at every poll and keeps the sample with the highest usage (`MachineSplit`).
- a process's USS (pages only it maps) and PSS (every page divided by the processes that map it)
  from /proc/<pid>/smaps_rollup, peaks over the same samples: a machine's processes' PSS add up
  to what they map, each shared page once.
- the graph as partitioned (`part_bytes`): each part's structure (graph.dgl, its halo included)
  and features (node and edge data files), what a machine's servers load.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

MIB = 2 ** 20


def parse_stat(text: str) -> Dict[str, int]:
    """`memory.stat` (one `key value` a line) -> {key: int}; other lines are skipped."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def split(stat: Dict[str, int], usage: int) -> Dict[str, int]:
    """A cgroup's usage (bytes) by kind, from its memory.stat: cgroup v1 (`rss`, `cache`, which
    includes `shmem`; the hierarchical `total_*` where present) or cgroup2 (`anon`, `file`,
    which includes `shmem`). `kernel` is what the usage holds beyond them (v1 and v2 both charge
    kernel memory to it), so the four parts add up to `usage`."""
    if "anon" in stat:  # cgroup2
        process, file, shmem = stat["anon"], stat.get("file", 0), stat.get("shmem", 0)
    else:  # v1: a machine's cgroup has no children, so total_x == x; total_x covers one that has
        get = lambda k: stat.get(f"total_{k}", stat.get(k, 0))
        process, file, shmem = get("rss"), get("cache"), get("shmem")
    return {"usage": usage, "process": process, "shmem": shmem, "page_cache": max(0, file - shmem),
            "kernel": max(0, usage - process - file)}


class MachineSplit:
    """The split at the sampled moment of highest usage."""

    def __init__(self):
        self.best: Optional[Dict[str, int]] = None
        # the most shared memory any sample saw: the highest usage can come before the servers
        # fill /dev/shm (a trainer's imports beside a server's), and then its split shows none
        self.shmem_max = 0

    def observe(self, usage: Optional[int], stat_text: Optional[str]) -> None:
        if usage is None or stat_text is None:
            return
        s = split(parse_stat(stat_text), usage)
        self.shmem_max = max(self.shmem_max, s["shmem"])
        if self.best is None or usage > self.best["usage"]:
            self.best = s

    def mb(self, peak: Optional[int]) -> Optional[Dict[str, float]]:
        """The summary's entry (MiB): `peak` (the kernel's own peak), `sampled` (the usage at the
        kept sample), and that sample's `process`, `shmem`, `page_cache` and `kernel`; `shmem_max`
        the most shared memory of any sample."""
        if self.best is None:
            return None
        b = self.best
        return {"peak": _mb(peak), "sampled": _mb(b["usage"]), "process": _mb(b["process"]),
                "shmem": _mb(b["shmem"]), "page_cache": _mb(b["page_cache"]),
                "kernel": _mb(b["kernel"]), "shmem_max": _mb(self.shmem_max)}


def parse_smaps_rollup(text: str) -> Optional[Tuple[int, int, int]]:
    """/proc/<pid>/smaps_rollup -> (RSS, PSS, USS) in KiB; USS = Private_Clean + Private_Dirty
    (pages no other process maps)."""
    kb = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            kb[parts[0][:-1]] = int(parts[1])
    if "Rss" not in kb or "Pss" not in kb:
        return None
    return kb["Rss"], kb["Pss"], kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)


def sets_kb(pid: int) -> Optional[Tuple[int, int, int]]:
    """(RSS, PSS, USS) of a running process in KiB; None if it is gone or unreadable. The kernel
    walks the process's page tables for it (measured: 1.3 ms for 2 GiB resident)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return parse_smaps_rollup(f.read())
    except (OSError, ValueError):
        return None


def part_bytes(part_config: str) -> Optional[List[Dict[str, int]]]:
    """Per part of a DGL partition JSON, the bytes of its files: `structure` (part_graph) and
    `features` (node_feats and edge_feats: every node and edge data tensor); None if unreadable."""
    path = Path(part_config)
    try:
        meta = json.loads(path.read_text())
        out = []
        for i in range(int(meta["num_parts"])):
            part = meta[f"part-{i}"]
            size = lambda key: os.path.getsize(path.parent / part[key]) if key in part else 0
            out.append({"structure": size("part_graph"),
                        "features": size("node_feats") + size("edge_feats")})
        return out
    except (OSError, ValueError, KeyError, TypeError):
        return None


def graph_keys(parts: Optional[List[Dict[str, int]]], peaks: Optional[List[Optional[int]]]) -> dict:
    """The summary's keys of the graph's share (MiB; docs/design.md, "Machine limits"):
    `graph_mb` (every part's files), `graph_share_mb` (that / machines), `machine_partition_mb`
    (machine i's part i: structure and features), and with the machines' peaks (bytes, their
    cgroups') `machine_peak_per_share` (peak / share) and `machine_fixed_mb` (peak minus the
    machine's own part: what it holds besides its partition data)."""
    if not parts:
        return {"graph_mb": None, "graph_share_mb": None, "machine_partition_mb": None,
                "machine_peak_per_share": None, "machine_fixed_mb": None}
    total = sum(p["structure"] + p["features"] for p in parts)
    share = total / len(parts)
    out = {"graph_mb": _mb(total), "graph_share_mb": _mb(share),
           "machine_partition_mb": [{k: _mb(v) for k, v in p.items()} for p in parts]}
    have = peaks is not None and len(peaks) == len(parts)
    out["machine_peak_per_share"] = ([None if p is None else round(p / share, 2) for p in peaks]
                                     if have and share else None)
    out["machine_fixed_mb"] = ([None if p is None else _mb(p - q["structure"] - q["features"])
                                for p, q in zip(peaks, parts)] if have else None)
    return out


def _mb(n: Optional[float]) -> Optional[float]:
    return None if n is None else round(n / MIB, 1)
