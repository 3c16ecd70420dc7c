"""cluster=slurm end to end against a real Slurm started here.

Three network namespaces (degnn/launch/netns.py): slurmctld on the third (the head node), one
slurmd on each of the other two (the compute nodes m0 and m1, NodeAddr their namespace address),
the clients (sbatch, squeue, scancel) in the test's own namespace over the bridge. The
configuration is written to a temporary folder (SLURM_CONF) with every state folder there:
AuthType=auth/none (no munge), ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, no
accounting. slurmd initializes Slurm's cgroup v1 code even so, and `ip netns exec` gave each
namespace a fresh /sys without /sys/fs/cgroup: each compute node gets a tmpfs there with the
named `systemd` hierarchy mounted in it, which is all slurmd checks for. Everything is
torn down by the fixture (the namespaces' processes are killed with them).

Needs root, network namespaces and Debian's slurmctld, slurmd and slurm-client
(`apt-get install slurmctld slurmd slurm-client`); skipped otherwise.
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
from hydra import compose, initialize_config_dir

import fake_entry
from netns_support import REASON as NETNS_REASON
from timing import budget

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
NEEDED = ("slurmctld", "slurmd", "sbatch", "salloc", "squeue", "scancel", "sinfo", "scontrol")
SLURM = {t: shutil.which(t) or shutil.which(t, path="/usr/sbin:/usr/bin") for t in NEEDED}
MISSING = [t for t, p in SLURM.items() if p is None]

needs_slurm = pytest.mark.skipif(
    NETNS_REASON is not None or bool(MISSING),
    reason=str(NETNS_REASON) if NETNS_REASON else
    f"needs Slurm ({', '.join(MISSING)} missing: apt-get install slurmctld slurmd slurm-client)")

SUBNET = "10.79.5"


# ---- without Slurm: the allocation is read with scontrol, the commands are srun steps ----------
def cfg_of(*overrides):
    from degnn.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def one_line_error(fn) -> str:
    from degnn.launch import LaunchError

    with pytest.raises(LaunchError) as e:
        fn()
    assert "\n" not in str(e.value) and str(e.value)
    return str(e.value)


FAKE_SCONTROL = """#!/bin/sh
# `scontrol show hostnames n[1-2]` and `scontrol show node --oneliner n1,n2` of a 2-node job
case "$2" in
  hostnames) echo n1; echo n2 ;;
  node) echo "NodeName=n1 Arch=x86_64 NodeAddr=10.0.0.1 NodeHostName=n1 State=ALLOCATED"
        echo "NodeName=n2 Arch=x86_64 NodeAddr=localhost NodeHostName=n2 State=ALLOCATED" ;;
  *) echo "scontrol: error: unexpected $*" >&2; exit 1 ;;
esac
"""


def test_allocation_nodes_and_srun_commands(tmp_path, monkeypatch):
    from degnn.launch import make_plan
    from degnn.launch import slurm
    from degnn.runtime.cluster import count_ip_config, machines_of

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    msg = one_line_error(lambda: machines_of(cfg_of("cluster=slurm").cluster))
    assert msg.startswith("cluster=slurm runs inside a Slurm allocation") and "sbatch -N" in msg

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    cfg = cfg_of("cluster=slurm", "cluster.trainers_per_machine=2")
    # a node's NodeAddr as Slurm reaches it; a name is resolved here
    assert machines_of(cfg.cluster) == [("10.0.0.1", 30050), ("127.0.0.1", 30050)]
    assert slurm.slurm_nodes() == [("n1", "10.0.0.1"), ("n2", "127.0.0.1")]
    # the machine count is the allocation's (like ip_config's lines for cluster=ssh)
    assert count_ip_config(cfg.cluster, [], 2) == ["cluster.machines=2"]
    msg = one_line_error(lambda: count_ip_config(cfg.cluster, ["cluster.machines=3"], 2))
    assert msg.startswith("cluster.machines=3 but the Slurm allocation has 2 nodes")

    # a dry run plans the partitions a real run builds (none needed here)
    plan = make_plan(cfg_of("cluster=slurm", "cluster.trainers_per_machine=2", "cluster.dry_run=true",
                            "partition.num_parts=2"),
                     str(tmp_path / "run"), str(tmp_path / "no.json"), ["cluster=slurm"])
    assert [p.machine for p in plan.procs] == [0, 1, 0, 0, 1, 1]
    rank3 = plan.trainers()[3]
    assert rank3.env["MASTER_ADDR"] == "10.0.0.1" and rank3.env["MASTER_PORT"] == "30049"
    assert rank3.argv[0] == PY  # the launcher's interpreter on every node
    argv = slurm.srun_argv(rank3, "n2", env={"GLOO_SOCKET_IFNAME": "eth0"}, pid=42)
    assert argv[:9] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--overlap",
                        "--job-name=degnn-42-rank3", "--export=ALL", "--quiet", "--unbuffered"]
    assert argv[9:] == ["env", "GLOO_SOCKET_IFNAME=eth0", *rank3.argv]
    assert slurm.srun_argv(plan.servers()[1], "n2", pid=42)[9:] == plan.servers()[1].argv
    msg = one_line_error(lambda: make_plan(cfg_of("cluster=slurm", "cluster.dry_run=true",
                                                  "partition.num_parts=3"),
                                           str(tmp_path / "run"), str(tmp_path / "no.json"), []))
    assert msg.startswith("2 machines (the Slurm allocation's nodes) but 3 partitions")


def slurm_conf(d: Path, net) -> str:
    nodes = "".join(f"NodeName=m{m} NodeHostname={net.hostname(m)} NodeAddr={net.ips[m]} CPUs=2 "
                    f"State=UNKNOWN\n" for m in range(2))
    return (f"ClusterName=degnntest\nSlurmctldHost={net.hostname(2)}({net.ips[2]})\n"
            "AuthType=auth/none\nCredType=cred/none\nSlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n"
            f"SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.%n.pid\n"
            f"SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.%n.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "JobCompType=jobcomp/none\nMpiDefault=none\nSwitchType=switch/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "SlurmdParameters=config_overrides\nReturnToService=2\nKillWait=10\nMinJobAge=30\n"
            f"{nodes}PartitionName=test Nodes=m0,m1 Default=YES MaxTime=INFINITE State=UP\n")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from degnn.launch import NetnsCluster

    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool/m0", "spool/m1"):
        (d / sub).mkdir(parents=True)
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    daemons = []
    with NetnsCluster(3, subnet=SUBNET) as net:
        try:
            # this namespace reaches the head node over the bridge, like a login host
            subprocess.run(["ip", "addr", "add", f"{SUBNET}.254/24", "dev", net.bridge], check=True)
            (d / "slurm.conf").write_text(slurm_conf(d, net))
            for m in range(2):
                subprocess.run([*net.prefix(m, "/"), "sh", "-c",
                                "mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd"
                                " && mount -t cgroup -o none,name=systemd cgroup "
                                "/sys/fs/cgroup/systemd"], check=True)
            t0 = time.monotonic()
            daemons.append(subprocess.Popen([*net.prefix(2, "/"), SLURM["slurmctld"], "-D", "-i"],
                                            env=env, stdout=open(d / "slurmctld.out", "w"),
                                            stderr=subprocess.STDOUT))
            for m in range(2):
                daemons.append(subprocess.Popen(
                    [*net.prefix(m, "/"), SLURM["slurmd"], "-D", "-N", f"m{m}"], env=env,
                    stdout=open(d / f"slurmd.m{m}.out", "w"), stderr=subprocess.STDOUT))
            deadline = time.monotonic() + budget(60)
            while True:
                r = subprocess.run([SLURM["sinfo"], "--noheader", "--format=%n %T"], env=env,
                                   capture_output=True, text=True)
                if r.stdout.split().count("idle") == 2:
                    break
                dead = [p for p in daemons if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    logs = "; ".join(f.name + ": " + f.read_text()[-300:] for f in sorted(d.glob("*.out")))
                    pytest.fail(f"Slurm did not come up (sinfo: {r.stdout.strip()!r}): {logs}")
                time.sleep(0.3)
            print(f"Slurm up in {time.monotonic() - t0:.1f}s")
            yield {"env": env, "dir": d, "net": net}
        finally:
            # every job ended first (its steps report to slurmctld on their way out), then the
            # daemons; the namespaces take whatever is left with them
            subprocess.run([SLURM["scancel"], "--quiet", "--partition=test"], env=env,
                           capture_output=True)
            deadline = time.monotonic() + 15
            while daemons and daemons[0].poll() is None and time.monotonic() < deadline:
                r = subprocess.run([SLURM["squeue"], "--noheader", "--states=all", "--format=%T"],
                                   env=env, capture_output=True, text=True)
                if not set(r.stdout.split()) - {"COMPLETED", "CANCELLED", "FAILED"}:
                    break
                time.sleep(0.3)
            for p in daemons:
                p.terminate()
            for p in daemons:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    # the namespaces are gone, and every process that ran in them
    assert not fake_entry.processes_mentioning(str(d))


def job_state(slurm, job: str) -> dict:
    r = subprocess.run([SLURM["scontrol"], "show", "job", "--oneliner", job], env=slurm["env"],
                       capture_output=True, text=True)
    return dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)


def sbatch(slurm, script: str, out: Path, *, wait: bool, env=None, timeout=240):
    """Submit `script` on 2 nodes; returns the job id, and with `wait` its exit code once it
    ended (polled here: `sbatch --wait` looks only every few seconds)."""
    job = out.with_suffix(".sh")
    job.write_text(f"#!/bin/sh\ncd {REPO}\n{script}\n")
    r = subprocess.run([SLURM["sbatch"], "--parsable", "--nodes=2", f"--output={out}", str(job)],
                       env={**slurm["env"], **(env or {})}, capture_output=True, text=True,
                       check=True)
    job_id = r.stdout.strip().split(";")[0]
    if not wait:
        return job_id, None
    deadline = time.monotonic() + budget(timeout)
    while True:
        state = job_state(slurm, job_id)
        if state.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return job_id, int(state["ExitCode"].split(":")[0])
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {state.get('JobState')} after {timeout}s")
        time.sleep(0.3)


def netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@needs_slurm
def test_slurm_job_trains_on_two_nodes(slurm, tmp_path):
    """The real entry, submitted with sbatch -N 2: the machines are the allocation's nodes, every
    process is an srun step on its node, and it trains (a margin over chance)."""
    run = tmp_path / "real"
    t0 = time.monotonic()
    _, rc = sbatch(slurm, f"exec {PY} -m degnn.launch cluster=slurm dataset=synthetic-tiny "
                          f"train.epochs=3 train.batch_size=128 hydra.run.dir={run}",
                   tmp_path / "job.out", wait=True)
    took = time.monotonic() - t0
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert rc == 0, out[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "ok" and s["machines"] == 2 and s["trainers"] == 2, s
    assert s["test"] > 0.125 + 0.2, s  # it learned (8 classes: chance is 0.125)
    assert f"nodes m0={SUBNET}.1, m1={SUBNET}.2; gloo interfaces: m0=eth0, m1=eth0" in out, out
    assert "result: pipeline=distdgl" in out
    assert not fake_entry.processes_mentioning(str(run))
    print(f"real run under sbatch: {took:.1f}s")


def wait_for(what, check, timeout):
    deadline = time.monotonic() + budget(timeout)
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def fake_job(slurm, tmp_path, *args, env=None, wait=False):
    """A launcher under sbatch whose processes are tests/fake_entry.py (the full command line:
    partitions of synthetic-tiny, one per node); `args` first (-m before the overrides)."""
    return sbatch(slurm, f"exec {PY} -m degnn.launch {' '.join(args)} cluster=slurm "
                         f"dataset=synthetic-tiny "
                         "cluster.trainers_per_machine=2",
                  tmp_path / "job.out", wait=wait,
                  env={"DEGNN_ENTRY": "tests.fake_entry", **(env or {})})


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


@needs_slurm
@pytest.mark.parametrize("how", ["scancel", "launcher killed"])
def test_scancel_stops_every_process_on_every_node(slurm, tmp_path, how):
    """`scancel` of a batch job: Slurm signals every step, the launcher's too. A launcher
    SIGKILLed under salloc, in a shell that keeps the allocation: its srun steps die with it,
    Slurm ends their processes on every node."""
    run = tmp_path / "run"
    # every process waits (as peers of a failing one do) until it is stopped
    env = {"DEGNN_ENTRY": "tests.fake_entry", "DEGNN_FAKE_FAIL_RANK": "99"}
    launch = (f"{PY} -m degnn.launch cluster=slurm dataset=synthetic-tiny "
              f"cluster.trainers_per_machine=2 hydra.run.dir={run}")
    if how == "scancel":
        job, _ = sbatch(slurm, f"exec {launch}", tmp_path / "job.out", wait=False, env=env)
    else:
        shell = subprocess.Popen([SLURM["salloc"], "--nodes=2", "sh", "-c", f"{launch}; exec sleep 60"],
                                 cwd=REPO, env={**slurm["env"], **env},
                                 stdout=open(tmp_path / "job.out", "w"), stderr=subprocess.STDOUT)
    try:
        wait_for("every trainer to start", lambda: all(
            (run / f"fake_rank{k}.json").exists() for k in range(4)), 120)
        # the run's processes (not salloc and its shell, whose command line names the run too)
        ours = lambda: [p for p in fake_entry.processes_mentioning(str(run))
                        if cmdline(p).startswith((PY, "srun"))]
        pids = ours()
        ns = {netns_of(p) for p in pids}
        nodes = {netns_of(slurm["net"].holders[m].pid) for m in range(2)}
        assert nodes <= ns, (ns, nodes)  # processes on both compute nodes
        for k in range(4):  # each trainer on its own node: ranks 0, 1 on m0, ranks 2, 3 on m1
            res = json.loads((run / f"fake_rank{k}.json").read_text())
            assert res["hostname"] == slurm["net"].hostname(k // 2), res
        t0 = time.monotonic()
        if how == "scancel":
            subprocess.run([SLURM["scancel"], job], env=slurm["env"], check=True)
        else:
            launcher = [p for p in pids if cmdline(p).startswith(f"{PY} -m degnn.launch")]
            assert len(launcher) == 1, launcher
            os.kill(launcher[0], 9)
        wait_for("every process of the run to end", lambda: not ours(), 60)
        took = time.monotonic() - t0
        assert took < 30, took
        print(f"{how}: every process gone in {took:.1f}s")
        if how == "scancel":  # the launcher's last line says why
            last = (tmp_path / "job.out").read_text().strip().splitlines()[-1]
            assert last.startswith(f"degnn.launch: run failed: Slurm job {job} is "), last
            assert "interrupted by SIGTERM; stopping every process" in last, last
    finally:
        if how != "scancel":  # salloc's shell (by now `sleep`), then salloc: the allocation ends
            children = Path(f"/proc/{shell.pid}/task/{shell.pid}/children")
            for pid in (children.read_text().split() if children.exists() else []):
                os.kill(int(pid), 9)
            shell.kill()
            shell.wait()


@needs_slurm
def test_a_sweep_inside_one_allocation_and_a_dead_process(slurm, tmp_path):
    """A sweep of two runs, one after the other in one allocation. In the second a trainer on m1
    fails: the usual fault line, and every other process is stopped, also those that ignore
    SIGTERM (srun answers the launcher's SIGTERM by killing its step)."""
    sweep = tmp_path / "sweep"
    _, rc = fake_job(slurm, tmp_path, "-m", f"hydra.sweep.dir={sweep}", "train.seed=0,1",
                     "cluster.stop_grace_s=1", wait=True,
                     env={"DEGNN_FAKE_FAIL_RANK": "3", "DEGNN_FAKE_FAIL_IN": f"{sweep}/1",
                          "DEGNN_FAKE_IGNORE_TERM": "1"})
    out = (tmp_path / "job.out").read_text()
    assert rc == 1, out[-3000:]
    s = json.loads((sweep / "0" / "summary.json").read_text())
    assert s["status"] == "ok" and s["machines"] == 2, s
    assert out.count("result: pipeline=fake") == 1, out[-3000:]
    # the second run's fault line is the launcher's last, then the sweep's table of both jobs
    lines = out.strip().splitlines()
    last = [line for line in lines if line.startswith("degnn.launch:")][-1]
    assert last.startswith("degnn.launch: run failed: trainer rank 3 (machine 1)"), out[-3000:]
    assert "exited with code 1" in last
    assert f"sweep of 2 jobs in {sweep}: 1 ok, 1 failed" in out, out[-3000:]
    assert lines[-1].split()[:3] == ["1", "train.seed=1", "failed"], out[-3000:]
    s = json.loads((sweep / "1" / "summary.json").read_text())
    assert s["status"] == "failed" and s["failed_process"]["machine"] == 1, s
    assert not fake_entry.processes_mentioning(str(sweep))
