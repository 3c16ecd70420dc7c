"""The machines of a cluster config (`cluster=`), read alike by the launcher and by a pipeline's
launch-time checks: one (ip, first server port) per machine, one partition per machine
(cluster=ssh: the ip_config file's lines; cluster=slurm: the nodes of the allocation, from
scontrol).

`LaunchError` is the one-line error of a launch that cannot start; the launcher (degnn/launch)
raises and reports it, and a pipeline's checks may raise it too, so it lives here, below both.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from typing import Dict, List, Optional, Sequence, Tuple


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
    if kind == "slurm":
        return [(addr, cluster.port) for _, addr in slurm_nodes()]
    raise LaunchError(f"cluster.kind={kind!r}: expected local, netns, ssh or slurm")


def _scontrol(*args: str) -> str:
    try:
        r = subprocess.run(["scontrol", *args], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60)
    except FileNotFoundError:
        raise LaunchError("cluster=slurm needs Slurm's scontrol on the PATH (it runs inside a "
                          "Slurm allocation)") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"`scontrol {' '.join(args)}` gave no answer within 60s; is "
                          f"slurmctld up?") from None
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        raise LaunchError(f"`scontrol {' '.join(args)}` failed "
                          f"({why[-1] if why else f'exit code {r.returncode}'})")
    return r.stdout


def _ipv4(host: str) -> str:
    try:
        ipaddress.IPv4Address(host)
        return host
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except (socket.gaierror, IndexError):
        raise LaunchError(f"Slurm node address {host} does not resolve to an IPv4 address "
                          f"here; set NodeAddr of the node in slurm.conf") from None


_slurm_cache: Dict[Tuple[str, str], List[Tuple[str, str]]] = {}


def slurm_nodes(environ: Optional[Dict[str, str]] = None) -> List[Tuple[str, str]]:
    """(node name, IPv4 address) of every node of the Slurm allocation the launcher runs in:
    SLURM_JOB_NODELIST expanded by `scontrol show hostnames`, each node's NodeAddr (as Slurm
    reaches it) from `scontrol show node`, resolved here where it is a name."""
    environ = os.environ if environ is None else environ
    job, nodelist = environ.get("SLURM_JOB_ID"), environ.get("SLURM_JOB_NODELIST")
    if not job or not nodelist:
        raise LaunchError("cluster=slurm runs inside a Slurm allocation and SLURM_JOB_ID is not "
                          "set; submit it with `sbatch -N <machines> job.sh` or run it under "
                          "`salloc -N <machines>` (docs/clusters.md)")
    key = (job, nodelist)
    if key not in _slurm_cache:
        names = _scontrol("show", "hostnames", nodelist).split()
        if not names:
            raise LaunchError(f"SLURM_JOB_NODELIST={nodelist} names no node")
        addrs = {}
        for line in _scontrol("show", "node", "--oneliner", ",".join(names)).splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "NodeName" in fields:
                addrs[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
        _slurm_cache[key] = [(n, _ipv4(addrs.get(n, n))) for n in names]
    return _slurm_cache[key]


def count_ip_config(cluster, overrides: Sequence[str], machines: int) -> List[str]:
    """cluster=ssh: the machine count is the number of ip_config lines (as DGL's launch.py counts
    them); cluster=slurm: the number of nodes of the allocation. Sets `cluster.machines` (so
    partition.num_parts follows) and returns the override every process gets for it; a
    `cluster.machines=` given that disagrees is a LaunchError."""
    given = [o.split("=", 1)[1] for o in overrides
             if o.split("=", 1)[0].lstrip("+~") == "cluster.machines"]
    if given and given[-1].strip() != str(machines) and cluster.kind == "slurm":
        raise LaunchError(f"cluster.machines={given[-1]} but the Slurm allocation has {machines} "
                          f"nodes; drop cluster.machines (cluster=slurm runs on every node of "
                          f"the allocation) or allocate {given[-1]} nodes (sbatch -N {given[-1]})")
    if given and given[-1].strip() != str(machines):
        raise LaunchError(f"cluster.machines={given[-1]} but cluster.ip_config {cluster.ip_config} "
                          f"lists {machines} machines; drop cluster.machines (cluster=ssh counts "
                          f"ip_config's lines)")
    cluster.machines = machines
    return [] if given else [f"cluster.machines={machines}"]
