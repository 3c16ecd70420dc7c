"""torch.distributed for the trainers, with no socket on an address outside the cluster's.

torch's `env://` rendezvous starts rank 0's TCPStore on every interface (`*:MASTER_PORT`); here
rank 0 binds MASTER_ADDR only (the cluster's address: 127.0.0.1 for cluster=local) and hands the
listening socket to the store (`master_listen_fd`). Gloo's own sockets bind the interface it uses
(GLOO_SOCKET_IFNAME, or the address the host name resolves to). Where MASTER_ADDR cannot be bound
here (a name of another host given by mistake), torch's own rendezvous decides, as before.
See docs/design.md, "Security model".

Where gloo cannot connect its peers (it bound an address the others cannot reach: a host name
that resolves to loopback, the wrong one of several interfaces), `ProcessGroupError` says in one
line which host, which address and which key to set.
"""
from __future__ import annotations

import datetime
import os
import re
import socket
from typing import Optional


class ProcessGroupError(RuntimeError):
    """torch.distributed could not connect the trainers; the message is one line."""


def bound_address(error: str) -> str:
    """The address gloo bound: from its error (`local=[ADDR]:PORT`), else what it binds
    (GLOO_SOCKET_IFNAME's interface, or the address of the host name)."""
    m = re.search(r"local=\[([^\]]+)\]", error)
    if m:
        return m.group(1)
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    if ifname:
        from degnn.runtime.netif import address_of

        return address_of(ifname) or f"the address of {ifname}"
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "an address of its host name"


def connect_error(error: BaseException) -> Optional[str]:
    """The one-line message for gloo failing to connect its peers; None for any other error."""
    text = str(error)
    if "local=[" not in text and not ("gloo" in text.lower() and "connect" in text.lower()):
        return None
    host = socket.gethostname()
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    how = (f"GLOO_SOCKET_IFNAME={ifname}" if ifname
           else f"no GLOO_SOCKET_IFNAME, so the address host name {host} resolves to")
    master = os.environ.get("MASTER_ADDR", "MASTER_ADDR")
    return (f"gloo on host {host} bound {bound_address(text)} ({how}) and the other trainers "
            f"cannot connect to it: set cluster.ifname=<this host's interface that reaches "
            f"{master}> (under DGL's launch.py: --extra_envs GLOO_SOCKET_IFNAME=<it>)")


def init_process_group(rank: int, world: int, timeout: datetime.timedelta) -> None:
    """`_init_process_group`, with gloo's connect failures as one line (ProcessGroupError)."""
    try:
        _init_process_group(rank, world, timeout)
    except RuntimeError as e:  # gloo's errors (DistBackendError) are RuntimeErrors
        msg = connect_error(e)
        if msg is None:
            raise
        raise ProcessGroupError(msg) from None


def _bind(addr: str, port: int) -> Optional[socket.socket]:
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        s = socket.socket(family, kind, proto)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(sockaddr)
        s.listen(1024)
        return s
    except OSError:
        return None


def _init_process_group(rank: int, world: int, timeout: datetime.timedelta) -> None:
    import torch.distributed as dist  # here: the entry imports this module before torch

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # started by torchrun / torch.distributed.launch (DGL's launch.py): its agent hosts the store
        dist.init_process_group("gloo", timeout=timeout)
        return
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        listening = _bind(addr, port)
        if listening is None:
            dist.init_process_group("gloo", timeout=timeout)
            return
        # the store owns the descriptor it is given and closes it when it goes (every torch
        # version): it gets its own, so that the Python socket's close does not shut the store's
        # listening socket under it (torch < 2.4 aborts: "Unexpected poll revent on the master's
        # listening socket") or, after the store, close a descriptor since reused for something else
        with listening:
            fd = os.dup(listening.fileno())
        store = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, master_listen_fd=fd)
    else:
        store = dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
