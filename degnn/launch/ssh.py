"""cluster=ssh: real machines listed in an ip_config file, processes started over ssh.

Like DGL's tools/launch.py: `ssh -o StrictHostKeyChecking=no -p <port> [user@]ip
'cd <workspace>; (export K=V ...; <cmd>)'`, one ssh per process. The run directory, partitions and
dataset are passed as absolute paths, so the machines must see them at the same paths (a shared
file system, as with launch.py's workspace). ssh does not forward signals to the remote command, so
stopping a process means `pkill -f` on its host for a pattern unique to this run (the entry
module and the run directory, which are on every command line).

DEGNN_* variables of the launcher's environment are exported to every remote process too, and
GLOO_SOCKET_IFNAME to every trainer: `cluster.ifname`, or per host the interface that routes to
the first ip_config address (found on that host by `check_hosts`). DGL's socket RPC needs none: a
client takes its address from the route to the servers (TP_SOCKET_IFNAME is read by DGL's
tensorpipe transport only, which degnn does not use).

Every process runs the launcher's own interpreter (`sys.executable`; `cluster.python` overrides),
and before anything starts `check_hosts` makes sure every host can import degnn, dgl and hydra
with it, read the partition and ip_config files, and names that interface.

Tested against a local sshd on 127.0.0.1/127.0.0.2 (tests/test_launch_ssh.py) when openssh-server is
installed, not against real hosts; the command construction is unit-tested.
"""
from __future__ import annotations

import os
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

from degnn.runtime.cluster import read_ip_config  # noqa: F401  (ssh.read_ip_config)

from .plan import DEFAULT_ENTRY, LaunchError, Proc


def ssh_base(host: str, port: int = 22, user: Optional[str] = None) -> List[str]:
    target = f"{user}@{host}" if user else host
    # BatchMode: fail instead of prompting for a password (the launcher has no terminal to give)
    return ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes", "-p", str(port), target]


def forwarded_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """DEGNN_* variables of the launcher's environment: locally every process inherits them
    (e.g. DEGNN_DATA, DEGNN_PARTITIONS), so over ssh they are exported explicitly."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith("DEGNN_") and k != "DEGNN_LAUNCHED"}


def current_umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def remote_command(proc: Proc, workspace: Optional[str],
                   extra_env: Optional[Dict[str, str]] = None) -> str:
    cd = f"cd {shlex.quote(workspace)}; " if workspace else ""
    # the launcher's umask (private run directories unless cluster.share_run_dir): a local child
    # inherits it, a process started over ssh gets the remote login's own
    return f"{cd}umask {current_umask():03o}; ({proc.shell(extra_env)})"


def ssh_argv(proc: Proc, host: str, *, workspace: Optional[str], port: int = 22,
             user: Optional[str] = None, extra_env: Optional[Dict[str, str]] = None) -> List[str]:
    return [*ssh_base(host, port, user), remote_command(proc, workspace, extra_env)]


# run on every host before anything starts: the interpreter imports what the processes need, the
# files they read are there (a shared file system at the same paths), and it names the network
# interface gloo is to bind there. argv: <probe address> <interface or ""> <file>...; the interface
# given is checked to exist; none given, it is the one holding the address this host sends from
# towards the probe address (the first machine of ip_config, MASTER_ADDR), as DGL's RPC client
# picks its own address. Last line of stdout: `ifname <name>` (empty where none is found).
CHECK = r"""
import importlib, os, sys
for m in ('degnn', 'dgl', 'hydra'):
    try: importlib.import_module(m)
    except Exception as e: sys.exit(f'cannot import {m} ({type(e).__name__}: {e})')
probe, given, files = sys.argv[1], sys.argv[2], sys.argv[3:]
for f in files:
    if not os.access(f, os.R_OK): sys.exit(f'cannot read {f}')
from degnn.runtime.netif import interface_towards, interfaces
if given and given not in interfaces():
    sys.exit(f'no network interface {given} (it has {", ".join(interfaces())})')
print('ifname', given or interface_towards(probe) or '')
"""


def check_argv(host: str, python: str, files: Sequence[str], *, probe: str = "127.0.0.1",
               ifname: Optional[str] = None, workspace: Optional[str] = None,
               port: int = 22, user: Optional[str] = None,
               env: Optional[Dict[str, str]] = None) -> List[str]:
    cd = f"cd {shlex.quote(workspace)} && " if workspace else ""
    exports = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    args = " ".join(shlex.quote(a) for a in (probe, ifname or "", *files))
    cmd = f"{cd}{exports}{shlex.quote(python)} -c {shlex.quote(CHECK)} {args}"
    return [*ssh_base(host, port, user), cmd]


def check_hosts(hosts: Sequence[str], python: str, files: Sequence[str], *,
                probe: str = "127.0.0.1", ifname: Optional[str] = None,
                workspace: Optional[str] = None, port: int = 22, user: Optional[str] = None,
                env: Optional[Dict[str, str]] = None, timeout: float = 120) -> Dict[str, str]:
    """Every host can run `python` with degnn, dgl and hydra and read `files`; else one line
    naming the host and the fix (LaunchError). Returns the network interface for gloo on every
    host: `ifname` where given (it exists there), else the one that routes to `probe` ("" where
    none is found)."""
    import subprocess

    found: Dict[str, str] = {}
    for host in dict.fromkeys(hosts):
        argv = check_argv(host, python, files, probe=probe, ifname=ifname, workspace=workspace,
                          port=port, user=user, env=env)
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"host {host}: no answer over ssh within {timeout:.0f}s; check that "
                              f"it is up and reachable on port {port}")
        if r.returncode == 0:
            said = [l.split(" ", 1) for l in r.stdout.splitlines() if l.startswith("ifname")]
            found[host] = said[-1][1].strip() if said and len(said[-1]) == 2 else ""
            continue
        lines = [l for l in (r.stderr or r.stdout).strip().splitlines() if l.strip()]
        why = lines[-1] if lines else f"exit code {r.returncode}"
        if r.returncode == 255:  # ssh itself failed
            raise LaunchError(f"host {host}: ssh failed ({why}); check cluster.ssh_port, "
                              f"cluster.ssh_user and that key-based login works (BatchMode)")
        if why.startswith("cannot read"):
            raise LaunchError(f"host {host}: {why}; the run directory and partitions must be on "
                              f"a file system every host sees at the same path")
        if why.startswith("no network interface"):
            raise LaunchError(f"host {host}: {why}; set cluster.ifname to an interface every "
                              f"host has, or leave it unset (per host: the one that routes to "
                              f"{probe})")
        raise LaunchError(f"host {host}: {python}: {why}; install degnn there (same path) or set "
                          f"cluster.python=<an interpreter that has degnn, dgl and hydra>")
    return found


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in ".[]()*+?{}|^$\\" else c for c in text)


def run_pattern(run_dir: str, entry: str = DEFAULT_ENTRY) -> str:
    """pkill -f regex for the processes of one run: every command line is `... -m <entry> ...
    hydra.run.dir=<dir>`. The entry keeps a launcher started with hydra.run.dir=<dir> on one of
    the hosts from matching; the bracket keeps the pattern from matching the remote shell that
    runs pkill itself."""
    return f"-m {_regex_escape(entry)} (.* )?[h]ydra\\.run\\.dir={_regex_escape(run_dir)}( |$)"


def kill_argv(host: str, run_dir: str, *, entry: str = DEFAULT_ENTRY, port: int = 22,
              user: Optional[str] = None, sig: str = "TERM") -> List[str]:
    return [*ssh_base(host, port, user),
            f"pkill -{sig} -f -- {shlex.quote(run_pattern(run_dir, entry))}"]


def hosts_of(machines: Sequence[Tuple[str, int]]) -> List[str]:
    return [ip for ip, _ in machines]
