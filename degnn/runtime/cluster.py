"""The machines of a cluster config (`cluster=`), read alike by the launcher and by a pipeline's
launch-time checks: one (ip, first server port) per machine, one partition per machine.

`LaunchError` is the one-line error of a launch that cannot start; the launcher (degnn/launch)
raises and reports it, and a pipeline's checks may raise it too, so it lives here, below both.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple


class LaunchError(RuntimeError):
    """Something that stops a launch before or while it runs; the message is one line."""


def read_ip_config(path: Optional[str], default_port: int) -> List[Tuple[str, int]]:
    """`IP [port]` per line (blank lines and # comments skipped) -> [(ip, port)]."""
    if not path:
        raise LaunchError("cluster=ssh needs cluster.ip_config=<file with one `IP [port]` line "
                          "per machine>")
    try:
        text = open(path).read()
    except OSError as e:
        raise LaunchError(f"cannot read cluster.ip_config {path}: {e.strerror}")
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise LaunchError(f"{path}:{n}: expected `IP [port]`, got {line!r}")
        out.append((parts[0], int(parts[1]) if len(parts) == 2 else default_port))
    if not out:
        raise LaunchError(f"cluster.ip_config {path} lists no machine")
    return out


def machines_of(cluster) -> List[Tuple[str, int]]:
    """(ip, first server port) of every machine."""
    kind = cluster.kind
    if kind == "local":
        if cluster.machines != 1:
            raise LaunchError(f"cluster=local runs one machine, got cluster.machines="
                              f"{cluster.machines}; use cluster=netns for several machines")
        return [("127.0.0.1", cluster.port)]
    if kind == "netns":
        return [(f"{cluster.subnet}.{i + 1}", cluster.port) for i in range(cluster.machines)]
    if kind == "ssh":
        return read_ip_config(cluster.ip_config, cluster.port)
    raise LaunchError(f"cluster.kind={kind!r}: expected local, netns or ssh")


def count_ip_config(cluster, overrides: Sequence[str], machines: int) -> List[str]:
    """cluster=ssh: the machine count is the number of ip_config lines (as DGL's launch.py counts
    them). Sets `cluster.machines` (so partition.num_parts follows) and returns the override
    every process gets for it; a `cluster.machines=` given that disagrees is a LaunchError."""
    given = [o.split("=", 1)[1] for o in overrides
             if o.split("=", 1)[0].lstrip("+~") == "cluster.machines"]
    if given and given[-1].strip() != str(machines):
        raise LaunchError(f"cluster.machines={given[-1]} but cluster.ip_config {cluster.ip_config} "
                          f"lists {machines} machines; drop cluster.machines (cluster=ssh counts "
                          f"ip_config's lines)")
    cluster.machines = machines
    return [] if given else [f"cluster.machines={machines}"]
