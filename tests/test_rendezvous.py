"""degnn/runtime/rendezvous.py: the trainers wait for the servers to listen (read from the
kernel's socket tables, never by connecting) and the servers' fixed wait before they connect back
is shortened. The cluster tests run through both on every start."""
from __future__ import annotations

import inspect
import os
import socket
import threading
import time

import pytest

from degnn.runtime import rendezvous
from degnn.runtime.rendezvous import listening_ports, servers_to_wait_for, wait_for_servers


def _listener(port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listening_ports_reads_this_namespace_and_a_process_of_it():
    s = _listener()
    port = s.getsockname()[1]
    try:
        assert port in listening_ports()
        # the same table through a pid (how a trainer looks into a server's namespace)
        assert port in listening_ports((f"/proc/{os.getpid()}/net/tcp",))
        # a connected socket is not a listening one
        c = socket.create_connection(("127.0.0.1", port))
        peer, _ = s.accept()
        assert c.getsockname()[1] not in listening_ports()
        c.close()
        peer.close()
    finally:
        s.close()
    assert port not in listening_ports()
    assert listening_ports(("/proc/0/net/tcp", "/no/such/table")) is None


def test_which_servers_a_trainer_waits_for(tmp_path):
    ipc = tmp_path / "ip_config.txt"
    ipc.write_text("127.0.0.1 30050\n192.0.2.7 30050\n")  # this host, and a documentation address
    # DGL's launch.py, ssh, Slurm: the servers on this host's addresses, in its own namespace
    assert servers_to_wait_for(str(ipc), 1) == [(30050, ("/proc/net/tcp", "/proc/net/tcp6"))]
    assert [p for p, _ in servers_to_wait_for(str(ipc), 2)] == [30050, 30051]  # two servers a machine
    # the launcher on this host: every server, each in its own process's namespace
    assert servers_to_wait_for(str(ipc), 1, "11,12") == [
        (30050, ("/proc/11/net/tcp", "/proc/11/net/tcp6")), (30050, ("/proc/12/net/tcp", "/proc/12/net/tcp6"))]
    # a pid list that does not match the servers is not used
    assert servers_to_wait_for(str(ipc), 2, "11,12") == servers_to_wait_for(str(ipc), 2)


def test_a_trainer_waits_until_the_servers_listen_and_not_for_a_gone_one(tmp_path, monkeypatch):
    port = _free_port()
    ipc = tmp_path / "ip_config.txt"
    ipc.write_text(f"127.0.0.1 {port}\n")
    opened = []
    timer = threading.Timer(0.5, lambda: opened.append(_listener(port)))
    timer.start()
    try:
        waited = wait_for_servers(str(ipc), 1, timeout_s=30)
        assert opened and 0.4 < waited < 30
    finally:
        timer.join()
        for s in opened:
            s.close()
    # a server whose process is gone: nothing to wait for (the launcher reports the dead server)
    monkeypatch.setenv(rendezvous.PIDS_ENV, "0")
    assert wait_for_servers(str(ipc), 1, timeout_s=30) < 1
    # one that never listens: the wait ends at its timeout, and DGL's own retry goes on from there
    monkeypatch.delenv(rendezvous.PIDS_ENV)
    assert 0.2 <= wait_for_servers(str(ipc), 1, timeout_s=0.2) < 5


def test_the_servers_wait_before_connecting_back_is_the_short_one(monkeypatch):
    import dgl.distributed.rpc_server as rpc_server

    # the wait shortened is there in this DGL: its server loop sleeps 3 s before it connects back
    assert "time.sleep(3)" in inspect.getsource(rpc_server.start_server)
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr(rpc_server, "time", time)
    assert rendezvous.shorten_connect_back_wait() is True
    rpc_server.time.sleep(3)
    rpc_server.time.sleep(1)  # the tensorpipe retry's pace is kept
    assert slept == [rendezvous.CONNECT_BACK_WAIT_S, 1]
    assert rpc_server.time.monotonic is time.monotonic
    assert rendezvous.shorten_connect_back_wait() is False  # installed once
