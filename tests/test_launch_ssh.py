"""cluster=ssh end to end against a throw-away sshd on 127.0.0.1 and 127.0.0.2 (two "machines").

Needs root and openssh-server (`apt-get install openssh-server`); skipped otherwise. The client
authenticates through an ssh-agent started here, so nothing in ~/.ssh is touched. Remote commands
run the launcher's own interpreter (the venv). The last test puts an sshd in each of two network
namespaces whose host names resolve to loopback, so the two machines are not this host's loopback
and gloo must be told their interface.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fake_entry
from timing import budget

from degnn.launch.launcher import free_port

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or SSHD is None or shutil.which("ssh-agent") is None
    or shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") is None,
    reason="needs root, openssh-server (sshd), ssh-agent and a system python3")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    for name in ("hostkey", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                       check=True)
    shutil.copy(d / "client.pub", d / "authorized_keys")
    port = free_port()
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
    server_port = free_port()
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


def test_ssh_cluster_on_two_network_namespaces(sshd, part2, tmp_path):
    """Two machines that are not this host's loopback: an sshd in each of two network namespaces
    (degnn/launch/netns.py), the launcher reaching them over a bridge, and each machine's host
    name resolving to 127.0.0.1 (as Debian's installer writes /etc/hosts), where gloo binds
    loopback unless told its interface. With nothing set but the ip_config file, every process
    runs the launcher's interpreter, passes the ssh preflight, gets the interface that routes to
    the first machine, and serves/trains on its own machine; a wrong cluster.ifname is one line
    naming host, address and key; and the real entry trains there, the machine count taken from
    the ip_config file."""
    from degnn.launch import NetnsCluster
    if os.geteuid() != 0 or not shutil.which("nsenter"):
        pytest.skip("needs root and nsenter (network namespaces)")
    d = sshd["dir"]
    port = free_port()
    subnet = "10.78.9"
    run_dir = tmp_path / "run"
    with NetnsCluster(2, subnet=subnet) as net:
        # the launcher's side of the bridge gets an address, like an admin host on the cluster LAN
        subprocess.run(["ip", "addr", "add", f"{subnet}.254/24", "dev", net.bridge], check=True)
        daemons = []
        try:
            for m, ip in enumerate(net.ips):
                # every machine's name is loopback in its /etc/hosts (one file the namespaces share)
                names = " ".join(net.hostname(i) for i in range(len(net.ips)))
                subprocess.run([*net.prefix(m, str(REPO)), "sh", "-c",
                                f"echo '127.0.0.1 localhost {names}' > /etc/hosts"], check=True)
                cfg = d / f"sshd_m{m}"
                cfg.write_text((d / "sshd_config").read_text()
                               .replace("ListenAddress 127.0.0.1\nListenAddress 127.0.0.2\n",
                                        f"ListenAddress {ip}\n")
                               .replace(f"PidFile {d / 'sshd.pid'}", f"PidFile {d / f'sshd_m{m}.pid'}")
                               .replace("Port ", "#Port ") + f"Port {port}\n")
                daemons.append(subprocess.Popen([*net.prefix(m, str(REPO)), SSHD, "-D", "-e", "-f", str(cfg)],
                                                stderr=open(d / f"sshd_m{m}.log", "w")))
            for ip in net.ips:
                for _ in range(100):
                    r = subprocess.run(["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
                                        "-o", "UserKnownHostsFile=/dev/null", "-p", str(port), ip, "true"],
                                       env=sshd["env"], capture_output=True)
                    if r.returncode == 0:
                        break
                    time.sleep(0.2)
                else:
                    pytest.fail(f"sshd on {ip} did not come up: {r.stderr[-500:]}")
            ipc = tmp_path / "machines.txt"
            ipc.write_text("".join(f"{ip} {free_port()}\n" for ip in net.ips))

            def fake_run(rd, *extra):
                return subprocess.run([PY, "-c", fake_entry.RUNNER, str(rd), part2, "cluster=ssh",
                                       f"cluster.ip_config={ipc}", f"cluster.ssh_port={port}",
                                       f"cluster.workspace={REPO}", "cluster.trainers_per_machine=2",
                                       *extra],
                                      cwd=REPO, env={**sshd["env"], "DEGNN_FAKE_GLOO": "1"},
                                      capture_output=True, text=True, timeout=budget(180))
            r = fake_run(run_dir)
            assert r.returncode == 0, r.stderr[-3000:]
            assert "gloo interfaces: 10.78.9.1=eth0, 10.78.9.2=eth0" in r.stderr
            ports = [int(l.split()[1]) for l in ipc.read_text().splitlines()]
            for rank in range(4):
                res = json.loads((run_dir / f"fake_rank{rank}.json").read_text())
                assert res["reached"] == {f"{net.ips[0]}:{ports[0]}": 0, f"{net.ips[1]}:{ports[1]}": 1}
                assert res["allreduce"] == 4.0  # gloo across the two machines
                assert res["hostname"] == f"degnn-m{rank // 2}"  # each process on its own machine
                assert res["resolved"] == "127.0.0.1", res  # where gloo binds without the interface
                assert res["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
                assert res["python"] == PY  # the launcher's interpreter, not `python3` on the PATH
            assert not fake_entry.processes_mentioning(str(run_dir))

            # the interface of loopback: the trainers of the other machine cannot connect
            bad = tmp_path / "bad"
            t0 = time.monotonic()
            r = fake_run(bad, "cluster.ifname=lo")
            took_bad = time.monotonic() - t0
            assert r.returncode != 0
            last = r.stderr.strip().splitlines()[-1]  # the launcher's fault line
            assert "error: gloo on host degnn-m" in last, r.stderr[-3000:]
            assert "bound 127.0.0.1 (GLOO_SOCKET_IFNAME=lo)" in last and "set cluster.ifname=" in last
            assert "Traceback" not in r.stderr
            assert not fake_entry.processes_mentioning(str(bad))

            # the real entry, nothing set but the ip_config file (and the test sshd's port)
            real = tmp_path / "real"
            t0 = time.monotonic()
            r = subprocess.run([PY, "-m", "degnn.launch", "cluster=ssh", f"cluster.ip_config={ipc}",
                                f"cluster.ssh_port={port}", "dataset=synthetic-tiny",
                                "train.epochs=3", "train.batch_size=128", f"hydra.run.dir={real}"],
                               cwd=REPO, env=sshd["env"], capture_output=True, text=True,
                               timeout=budget(180))
            took_real = time.monotonic() - t0
            assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
            s = json.loads((real / "summary.json").read_text())
            assert s["status"] == "ok" and s["machines"] == 2 and s["trainers"] == 2, s
            assert s["test"] > 0.125 + 0.2, s  # it learned (8 classes: chance is 0.125)
            print(f"wrong interface failed in {took_bad:.1f}s; real run {took_real:.1f}s")
        finally:
            for p in daemons:
                p.terminate()
                p.wait()
    assert not fake_entry.processes_mentioning(str(run_dir))
    assert not fake_entry.processes_mentioning(str(real))
