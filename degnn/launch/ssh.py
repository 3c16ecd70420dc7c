"""cluster=ssh: real machines listed in an ip_config file, processes started over ssh.

Like DGL's tools/launch.py: `ssh -o StrictHostKeyChecking=no -p <port> [user@]ip
'cd <workspace>; (export K=V ...; <cmd>)'`, one ssh per process. The run directory, partitions and
dataset are passed as absolute paths, so the machines must see them at the same paths (a shared
file system, as with launch.py's workspace). ssh does not forward signals to the remote command, so
stopping a process means `pkill -f` on its host for a pattern unique to this run (the run
directory, which is on every command line).

DEGNN_* variables of the launcher's environment are exported to every remote process too.

Tested against a local sshd on 127.0.0.1/127.0.0.2 (tests/test_launch_ssh.py), not real hosts (no sshd); the command construction is unit-tested.
"""
from __future__ import annotations

import os
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

from .plan import LaunchError, Proc


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


def ssh_base(host: str, port: int = 22, user: Optional[str] = None) -> List[str]:
    target = f"{user}@{host}" if user else host
    # BatchMode: fail instead of prompting for a password (the launcher has no terminal to give)
    return ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes", "-p", str(port), target]


def forwarded_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """DEGNN_* variables of the launcher's environment: locally every process inherits them
    (e.g. DEGNN_DATA, DEGNN_PARTITIONS), so over ssh they are exported explicitly."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith("DEGNN_") and k != "DEGNN_LAUNCHED"}


def remote_command(proc: Proc, workspace: Optional[str],
                   extra_env: Optional[Dict[str, str]] = None) -> str:
    cd = f"cd {shlex.quote(workspace)}; " if workspace else ""
    return f"{cd}({proc.shell(extra_env)})"


def ssh_argv(proc: Proc, host: str, *, workspace: Optional[str], port: int = 22,
             user: Optional[str] = None, extra_env: Optional[Dict[str, str]] = None) -> List[str]:
    return [*ssh_base(host, port, user), remote_command(proc, workspace, extra_env)]


def run_pattern(run_dir: str) -> str:
    """pkill -f regex for the processes of one run: every command line has hydra.run.dir=<dir>.

    The bracket keeps the pattern from matching the remote shell that runs pkill itself."""
    esc = "".join("\\" + c if c in ".[]()*+?{}|^$\\" else c for c in run_dir)
    return f"[h]ydra\\.run\\.dir={esc}( |$)"


def kill_argv(host: str, run_dir: str, *, port: int = 22, user: Optional[str] = None,
              sig: str = "TERM") -> List[str]:
    return [*ssh_base(host, port, user), f"pkill -{sig} -f -- {shlex.quote(run_pattern(run_dir))}"]


def hosts_of(machines: Sequence[Tuple[str, int]]) -> List[str]:
    return [ip for ip, _ in machines]
