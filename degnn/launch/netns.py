"""Several machines on one host: a network namespace per machine (cluster=netns, needs root).

Machine i is
  - network namespace `degnn<pid>m<i>` with a veth `eth0` at <subnet>.<i+1>/24 and `lo` up,
    whose other end `degnn<pid>v<i>` sits on the bridge `degnn<pid>b` in the root namespace
    (the bridge carries no address: the machines only see each other);
  - a holder process (`sleep infinity`) in its own mount+IPC+UTS namespace with a fresh tmpfs on
    /dev/shm, hostname degnn-m<i> and an /etc/hosts naming every machine. DGL servers publish partitions in shared memory named by graph name, so two
    machines on one host must not share /dev/shm, while the servers and trainers of ONE machine
    must. Every process of machine i is started with `nsenter -t <holder> -n -m -i -u`.

Names carry the launcher's pid (decimal, so `degnn<pid>[mvb]<i>` parses back and stays within
15 characters for interfaces): leftovers of a launcher that no longer runs are removed on the next
start, live clusters of other launchers are left alone.
"""
from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import tempfile
import time
from typing import List, Optional, Tuple

from degnn.proc import die_with_parent, pid_alive

from .registry import HOLDER_ENV
from .shm import PRIVATE_SHM_SIZE
from .plan import LaunchError

PREFIX = "degnn"
IFNAME = "eth0"  # the veth end inside every namespace (GLOO_SOCKET_IFNAME)
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)([mvb])(\d*)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise LaunchError(f"`ip {' '.join(args)}` failed: {r.stderr.strip() or r.returncode}")
    return r


def _ours(name: str) -> Optional[int]:
    m = _NAME_RE.match(name)
    return int(m.group(1)) if m else None


def list_namespaces() -> List[str]:
    r = _ip("netns", "list", check=False)
    return [l.split()[0] for l in r.stdout.splitlines() if l.strip().startswith(PREFIX)]


def list_links() -> List[str]:
    r = _ip("-o", "link", "show", check=False)
    out = []
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                out.append(name)
    return out


def _kill_ns_pids(ns: str) -> None:
    r = _ip("netns", "pids", ns, check=False)
    for tok in r.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def cleanup_stale(keep_owner: Optional[int] = None) -> List[str]:
    """Remove namespaces/links of launchers that are gone (or of `os.getpid()`'s earlier cluster)."""
    removed = []
    me = os.getpid()
    for ns in list_namespaces():
        owner = _ours(ns)
        if owner is None or owner == keep_owner or (owner != me and pid_alive(owner)):
            continue
        _kill_ns_pids(ns)
        _ip("netns", "del", ns, check=False)
        removed.append(ns)
    for link in list_links():
        owner = _ours(link)
        if owner is None or owner == keep_owner or (owner != me and pid_alive(owner)):
            continue
        _ip("link", "del", link, check=False)
        removed.append(link)
    return removed


def parse_rate(rate: str) -> float:
    """tc rate string -> bytes per second ("1gbit", "100mbit", "10mbps", "1000")."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|bps)?\s*", rate.lower())
    if not m:
        raise LaunchError(f"cluster.bandwidth={rate!r} is not a tc rate (e.g. 1gbit, 100mbit)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    # tc: "bps" is bytes per second; "bit" or a bare number is bits per second
    return value if m.group(3) == "bps" else value / 8


class NetnsCluster:
    """`with NetnsCluster(k, subnet, bandwidth) as c:` builds k machines, removes them on exit."""

    def __init__(self, machines: int, subnet: str = "10.77.0", bandwidth: Optional[str] = None,
                 shm_size: str = PRIVATE_SHM_SIZE):
        if not 1 <= machines <= 99:
            raise LaunchError(f"cluster.machines={machines}: netns supports 1..99 machines")
        if bandwidth:
            parse_rate(bandwidth)
        self.k = machines
        self.subnet = subnet
        self.bandwidth = bandwidth
        self.shm_size = shm_size
        tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{tag}b"
        self.ns = [f"{tag}m{i}" for i in range(machines)]
        self.veth = [f"{tag}v{i}" for i in range(machines)]
        self.ips = [f"{subnet}.{i + 1}" for i in range(machines)]
        self.holders: List[subprocess.Popen] = []
        self.ifname = IFNAME
        self.setup_s = self.teardown_s = 0.0

    # ---- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> "NetnsCluster":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        t0 = time.monotonic()
        if os.geteuid() != 0:
            raise LaunchError("cluster=netns needs root (network namespaces); use cluster=local")
        cleanup_stale()
        r = _ip("netns", "add", self.ns[0], check=False)
        if r.returncode != 0:
            raise LaunchError(f"network namespaces are not permitted here ({r.stderr.strip()}); "
                              "use cluster=local")
        for ns in self.ns[1:]:
            _ip("netns", "add", ns)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth, ip) in enumerate(zip(self.ns, self.veth, self.ips)):
            _ip("link", "add", veth, "type", "veth", "peer", "name", IFNAME, "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", IFNAME)
            _ip("-n", ns, "link", "set", IFNAME, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if self.bandwidth:
                # cap both directions of the machine's link: egress inside, egress of the bridge side
                self._tbf(["ip", "netns", "exec", ns, "tc"], IFNAME)
                self._tbf(["tc"], veth)
        hosts = self._hosts_file()
        try:
            for i, ns in enumerate(self.ns):
                self.holders.append(self._holder(ns, i, hosts))
        finally:
            os.unlink(hosts)  # the bind mounts keep the file's content
        self.setup_s = time.monotonic() - t0

    def _tbf(self, tc: List[str], dev: str) -> None:
        bps = parse_rate(self.bandwidth)
        burst = max(32 * 1024, int(bps / 100))  # 10 ms worth of bytes, at least 32 KiB
        cmd = [*tc, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.bandwidth,
               "burst", str(burst), "latency", "50ms"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise LaunchError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")

    def hostname(self, machine: int) -> str:
        return f"{PREFIX}-m{machine}"

    def _hosts_file(self) -> str:
        # every machine resolves every machine's name (and its own) like a real cluster would
        fd, path = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-hosts-")
        with os.fdopen(fd, "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.writelines(f"{ip} {self.hostname(i)}\n" for i, ip in enumerate(self.ips))
        os.chmod(path, 0o644)
        return path

    def _holder(self, ns: str, machine: int, hosts: str) -> subprocess.Popen:
        # ip netns exec -> unshare -> sh -> sleep all exec in place: the Popen pid is the holder.
        # Own mount (private /dev/shm, /etc/hosts), IPC and UTS (hostname) namespaces.
        script = (f"mount -t tmpfs -o size={self.shm_size} tmpfs /dev/shm "
                  f"&& mount --bind {shlex.quote(hosts)} /etc/hosts "
                  f"&& hostname {self.hostname(machine)} && echo ready && exec sleep infinity")
        # dies with the launcher (parent-death signal survives the exec chain), so a SIGKILLed
        # launcher leaves no holder (the namespaces and links stay until degnn/launch/cleanup.py)
        p = subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--mount", "--ipc", "--uts",
                              "--propagation", "private", "sh", "-c", script],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=die_with_parent, env={**os.environ, HOLDER_ENV: str(os.getpid())})
        ready, _, _ = select.select([p.stdout], [], [], 10)
        line = p.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            p.kill()
            err = p.stderr.read().decode(errors="replace").strip() if p.poll() is not None else ""
            raise LaunchError(f"could not start the holder of {ns} "
                              f"(unshare --mount --ipc + tmpfs on /dev/shm): {err or 'timeout'}")
        p.stdout.close()
        p.stderr.close()
        return p

    def down(self) -> None:
        t0 = time.monotonic()
        for p in self.holders:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.holders = []
        for ns, veth in zip(self.ns, self.veth):
            _kill_ns_pids(ns)  # anything still inside (a process that escaped the supervisor)
            _ip("link", "del", veth, check=False)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.teardown_s = time.monotonic() - t0

    # ---- use --------------------------------------------------------------------------------
    def prefix(self, machine: int, cwd: str) -> List[str]:
        """Command prefix that runs a program on `machine` (its net, mount and IPC namespaces)."""
        holder = self.holders[machine].pid
        return ["nsenter", "-t", str(holder), "-n", "-m", "-i", "-u", f"--wd={cwd}", "--"]

    def counters(self) -> List[Tuple[int, int]]:
        """(tx_bytes, rx_bytes) of every machine's eth0, read inside its namespace."""
        out = []
        for ns in self.ns:
            stats = f"/sys/class/net/{IFNAME}/statistics"
            r = subprocess.run(["ip", "netns", "exec", ns, "cat", f"{stats}/tx_bytes",
                                f"{stats}/rx_bytes"], capture_output=True, text=True)
            vals = r.stdout.split()
            out.append((int(vals[0]), int(vals[1])) if r.returncode == 0 and len(vals) == 2
                       else (0, 0))
        return out
