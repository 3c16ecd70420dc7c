"""cluster=ssh end to end against a throw-away sshd on 127.0.0.1 and 127.0.0.2 (two "machines").

Needs root and openssh-server (`apt-get install openssh-server`); skipped otherwise. The client
authenticates through an ssh-agent started here, so nothing in ~/.ssh is touched. Remote commands
run `python3` from sshd's default PATH (no venv), which is enough for the fake entry (stdlib only).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fake_entry
from timing import budget

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or SSHD is None or shutil.which("ssh-agent") is None
    or shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") is None,
    reason="needs root, openssh-server (sshd), ssh-agent and a system python3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    for name in ("hostkey", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                       check=True)
    shutil.copy(d / "client.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\n"
        f"HostKey {d / 'hostkey'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "StrictModes no\nUsePAM no\n")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    server = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                              stderr=open(d / "sshd.log", "w"))
    agent = subprocess.run(["ssh-agent", "-s", "-a", str(d / "agent.sock")], check=True,
                           capture_output=True, text=True).stdout
    agent_pid = int(agent.split("SSH_AGENT_PID=")[1].split(";")[0])
    env = {**os.environ, "SSH_AUTH_SOCK": str(d / "agent.sock")}
    try:
        subprocess.run(["ssh-add", "-q", str(d / "client")], env=env, check=True)
        for _ in range(50):
            r = subprocess.run(["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
                                "-o", "UserKnownHostsFile=/dev/null", "-p", str(port),
                                "127.0.0.2", "true"], env=env, capture_output=True)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        else:
            pytest.skip(f"sshd did not come up: {(d / 'sshd.log').read_text()[-500:]}")
        yield {"port": port, "env": env, "dir": d}
    finally:
        server.terminate()
        server.wait()
        os.kill(agent_pid, 15)


@pytest.fixture(scope="module")
def part2(tmp_path_factory):
    return fake_entry.make_partition(str(tmp_path_factory.mktemp("parts") / "p2"), 2)


def run_ssh(sshd, tmp_path, part, *extra, env=None, timeout=90):
    ipc = tmp_path / "machines.txt"
    server_port = _free_port()
    ipc.write_text(f"127.0.0.1 {server_port}\n127.0.0.2 {server_port}\n")
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    try:
        r = subprocess.run([PY, "-c", fake_entry.RUNNER, str(run_dir), part, "cluster=ssh",
                            f"cluster.ip_config={ipc}", f"cluster.ssh_port={sshd['port']}",
                            f"cluster.workspace={REPO}", "cluster.trainers_per_machine=2", *extra],
                           cwd=REPO, env={**sshd["env"], **(env or {})}, capture_output=True,
                           text=True, timeout=budget(timeout))
    finally:
        time.sleep(0.5)  # the remote pkill may still be landing
        fake_entry.remove_shm_markers(str(run_dir))  # both "machines" are this host
    return r, run_dir, server_port, time.monotonic() - t0


def test_ssh_cluster_runs(sshd, part2, tmp_path):
    r, run_dir, port, _ = run_ssh(sshd, tmp_path, part2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "result: pipeline=fake dataset=tiny machines=2" in r.stdout
    for rank in range(4):
        res = json.loads((run_dir / f"fake_rank{rank}.json").read_text())
        assert res["reached"] == {f"127.0.0.1:{port}": 0, f"127.0.0.2:{port}": 1}
        assert res["env"]["RANK"] == str(rank) and res["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert not fake_entry.processes_mentioning(str(run_dir))


def test_ssh_fault_kills_remote_processes(sshd, part2, tmp_path):
    r, run_dir, _, took = run_ssh(sshd, tmp_path, part2, "cluster.stop_grace_s=5",
                                  env={"DEGNN_FAKE_FAIL_RANK": "2"})
    assert r.returncode != 0
    assert "trainer rank 2 (machine 1)" in r.stderr and "exited with code 1" in r.stderr
    assert took < budget(40)
    # ssh does not forward the stop: the launcher's remote pkill did it
    deadline = time.monotonic() + 5
    while fake_entry.processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not fake_entry.processes_mentioning(str(run_dir))
