"""torch.distributed for the trainers, with no socket on an address outside the cluster's.

torch's `env://` rendezvous starts rank 0's TCPStore on every interface (`*:MASTER_PORT`); here
rank 0 binds MASTER_ADDR only (the cluster's address: 127.0.0.1 for cluster=local) and hands the
listening socket to the store (`master_listen_fd`). Gloo's own sockets bind the interface it uses
(GLOO_SOCKET_IFNAME, or the address the host name resolves to). Where MASTER_ADDR cannot be bound
here (a name of another host given by mistake), torch's own rendezvous decides, as before.
See docs/design.md, "Security model".
"""
from __future__ import annotations

import datetime
import os
import socket
from typing import Optional

import torch.distributed as dist

_listening: Optional[socket.socket] = None  # kept open for the store's whole life


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


def init_process_group(rank: int, world: int, timeout: datetime.timedelta) -> None:
    global _listening
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # started by torchrun / torch.distributed.launch (DGL's launch.py): its agent hosts the store
        dist.init_process_group("gloo", timeout=timeout)
        return
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        _listening = _bind(addr, port)
        if _listening is None:
            dist.init_process_group("gloo", timeout=timeout)
            return
        store = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout,
                              master_listen_fd=_listening.fileno())
    else:
        store = dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
