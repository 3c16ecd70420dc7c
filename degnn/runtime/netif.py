"""Network interfaces of this host, for gloo (GLOO_SOCKET_IFNAME) on machines with several.

`interface_towards(addr)` is the interface holding the address this host sends from towards
`addr` (as DGL's RPC client picks its own address: a UDP socket connected to the server, no
packet sent). On the machine that holds `addr` itself that is the interface with `addr`, not `lo`
(which `ip route get` would name). Linux only (SIOCGIFADDR); IPv4.
"""
from __future__ import annotations

import socket
import struct
from typing import List, Optional

_SIOCGIFADDR = 0x8915


def interfaces() -> List[str]:
    return [name for _, name in socket.if_nameindex()]


def source_address(addr: str) -> Optional[str]:
    """The local address a connection to `addr` leaves from; None where there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 1))
            return s.getsockname()[0]
    except OSError:
        return None


def address_of(name: str) -> Optional[str]:
    """The (first) IPv4 address of interface `name`; None where it has none."""
    import fcntl

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            got = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(got[20:24])
    except OSError:
        return None


def interface_towards(addr: str) -> Optional[str]:
    local = source_address(addr)
    if local is None:
        return None
    return next((n for n in interfaces() if address_of(n) == local), None)
