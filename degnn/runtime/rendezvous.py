"""The trainers' first connection to the graph servers, without DGL's fixed waits.

DGL's socket RPC has two waits that every run paid at start (about 6 s of a trainer's "up in"):
- a client connects to each server once and, where the server does not listen yet, sleeps 3 s
  before it tries again (its C++ sender). Servers and trainers start together, and a server loads
  its partition before it listens, so the first try usually failed. A trainer here first waits,
  polling, until the servers listen. It cannot ask with a connection (a server takes every
  connection it accepts as one of its clients), so it reads the kernel's tables of listening
  sockets (/proc/.../net/tcp and tcp6): of every server's own network namespace where the launcher
  started the servers on this host (cluster=local and netns pass their pids in
  DEGNN_SERVER_PIDS), else of its own namespace, for the servers of its own machine (DGL's
  launch.py, ssh, Slurm: the other machines' servers started at the same moment; where one is
  still late, DGL's retry covers it as before).
- a server, once every client registered, sleeps 3 s "for the clients' receivers" before it
  connects back to them (dgl/distributed/rpc_server.py). A client listens right after it
  registers, and where it does not yet, the server's connection retries as above, so the server
  here waits `CONNECT_BACK_WAIT_S` instead (`shorten_connect_back_wait`).
"""
from __future__ import annotations

import os
import time
from typing import List, Optional, Sequence, Set, Tuple

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
CONNECT_BACK_WAIT_S = 0.2
PIDS_ENV = "DEGNN_SERVER_PIDS"  # the servers' pids in server-id order, set by the launcher


def listening_ports(tables: Sequence[str] = ("/proc/net/tcp", "/proc/net/tcp6")) -> Optional[Set[int]]:
    """The TCP ports something listens on in the network namespace of `tables`; None where no
    table can be read (the process is gone, or this is not Linux)."""
    ports: Optional[Set[int]] = None
    for table in tables:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:  # no IPv6, or no such process
            continue
        ports = ports or set()
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def servers_to_wait_for(ip_config: str, num_servers: int,
                        pids: Optional[str] = None) -> List[Tuple[int, Tuple[str, ...]]]:
    """(port, tables to find it listening in) per server a trainer waits for: every server, in
    its own namespace, where `pids` names one pid per server; else the servers on this host's
    addresses, in this process's namespace. Read with DGL's own ip_config parser and its own list
    of the host's addresses."""
    from dgl.distributed.rpc import read_ip_config
    from dgl.distributed.rpc_client import local_ip4_addr_list

    book = read_ip_config(ip_config, num_servers)
    ids = sorted(book)
    pid_list = [p for p in (pids or "").split(",") if p.strip()]
    if len(pid_list) == len(ids):
        return [(book[i][2], (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6")) for i, pid in zip(ids, pid_list)]
    here = set(local_ip4_addr_list())
    return [(book[i][2], ("/proc/net/tcp", "/proc/net/tcp6")) for i in ids if book[i][1] in here]


def wait_for_servers(ip_config: Optional[str] = None, num_servers: Optional[int] = None,
                     timeout_s: float = 60.0, poll_s: float = 0.05) -> float:
    """Wait until the servers listen (`servers_to_wait_for`), at most `timeout_s`; the seconds
    waited. The ip_config file and servers per machine default to what `dgl.distributed.initialize`
    reads (DGL_IP_CONFIG, DGL_NUM_SERVER). A server whose table cannot be read is not waited for,
    and past the timeout DGL's own retry takes over: nothing is raised here (a server that never
    comes up is the launcher's to report)."""
    t0 = time.monotonic()
    ip_config = ip_config or os.environ["DGL_IP_CONFIG"]
    num_servers = num_servers or int(os.environ.get("DGL_NUM_SERVER", "1"))
    pending = servers_to_wait_for(ip_config, num_servers, os.environ.get(PIDS_ENV))
    while pending and time.monotonic() - t0 < timeout_s:
        left = []
        for port, tables in pending:
            ports = listening_ports(tables)
            if ports is not None and port not in ports:
                left.append((port, tables))
        pending = left
        if pending:
            time.sleep(poll_s)
    return time.monotonic() - t0


class _ShortConnectBackWait:
    """`time` for dgl.distributed.rpc_server: its one 3-second sleep (before connecting back to
    the clients) becomes CONNECT_BACK_WAIT_S; every other attribute is the real module's."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(CONNECT_BACK_WAIT_S if seconds == 3 else seconds)


def shorten_connect_back_wait() -> bool:
    """Install the shorter wait in DGL's server loop; False where this DGL has no such wait."""
    import dgl.distributed.rpc_server as rpc_server

    if getattr(rpc_server, "time", None) is not time:
        return False
    rpc_server.time = _ShortConnectBackWait()
    return True
