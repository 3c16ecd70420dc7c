"""Runs on one host never share state, and nothing outlives a launcher: cluster=local as a private
machine (root) or a refusal next to another run, `python -m degnn.launch --cleanup`, and what a
local run exposes (listening sockets)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import fake_entry
from degnn.launch.isolate import HOLDER_ENV, can_isolate
from degnn.proc import pids_with_env
from timing import budget

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
needs_isolation = pytest.mark.skipif(not can_isolate(), reason="needs root, unshare, nsenter, ip")


@pytest.fixture(scope="module")
def part1(tmp_path_factory):
    return fake_entry.make_partition(str(tmp_path_factory.mktemp("parts") / "p1"), 1)


def start(run_dir, part, *overrides, env=None):
    return subprocess.Popen([PY, "-c", fake_entry.RUNNER, str(run_dir), part, "cluster=local",
                             "cluster.trainers_per_machine=2", *overrides], cwd=REPO,
                            env={**os.environ, "FAKE_FAIL_RANK": "99", **(env or {})},  # all hang
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_up(p, run_dir, ranks=2):
    deadline = time.monotonic() + budget(30)
    while time.monotonic() < deadline and p.poll() is None:
        if all((run_dir / f"fake_rank{r}.json").exists() for r in range(ranks)):
            return
        time.sleep(0.2)
    raise AssertionError(f"run never came up: {p.poll()} {p.stderr.read() if p.poll() is not None else ''}")


def holders_of(pid: int) -> list:
    return pids_with_env(HOLDER_ENV, str(pid))


def listening(netns_of_pid=None) -> str:
    pre = ["nsenter", "-t", str(netns_of_pid), "-n"] if netns_of_pid else []
    return subprocess.run([*pre, "ss", "-ltnpH"], capture_output=True, text=True).stdout


@needs_isolation
def test_local_run_is_a_private_machine_that_exposes_nothing(part1, tmp_path):
    run_dir = tmp_path / "run"
    p = start(run_dir, part1)
    try:
        wait_up(p, run_dir)
        pids = [x for x in fake_entry.processes_mentioning(str(run_dir)) if x != p.pid]
        assert len(pids) == 3  # a server, two trainers
        host_net = os.readlink("/proc/self/ns/net")
        nets = {os.readlink(f"/proc/{pid}/ns/net") for pid in pids}
        assert len(nets) == 1 and host_net not in nets  # one machine, not the host's network
        addrs = subprocess.run(["nsenter", "-t", str(pids[0]), "-n", "ip", "-o", "addr"],
                               capture_output=True, text=True).stdout
        assert [l.split()[1] for l in addrs.splitlines()] == ["lo"] * len(addrs.splitlines())
        # the server's and trainers' listening sockets are there, and none on the host
        inside = listening(pids[0])
        assert any(f"pid={pid}," in inside for pid in pids), inside
        host = listening()
        assert not any(f"pid={pid}," in host for pid in pids), host
        shm = {os.readlink(f"/proc/{pid}/ns/mnt") for pid in pids}
        assert len(shm) == 1 and os.readlink("/proc/self/ns/mnt") not in shm
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=budget(30))
    assert p.returncode == 128 + signal.SIGTERM
    assert not fake_entry.processes_mentioning(str(run_dir)) and not holders_of(p.pid)
    # the run's shared memory lived in its own tmpfs: nothing of it in the host's /dev/shm
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(fake_entry.shm_prefix(str(run_dir)))]


@needs_isolation
def test_sigkilled_local_launcher_leaves_nothing(part1, tmp_path):
    run_dir = tmp_path / "run"
    p = start(run_dir, part1)
    wait_up(p, run_dir)
    assert holders_of(p.pid)
    p.kill()
    p.communicate()
    deadline = time.monotonic() + budget(10)
    while time.monotonic() < deadline and (fake_entry.processes_mentioning(str(run_dir)) or holders_of(p.pid)):
        time.sleep(0.1)
    assert not fake_entry.processes_mentioning(str(run_dir)) and not holders_of(p.pid)


def test_shared_shm_refuses_a_second_run_and_cleanup_removes_the_first(part1, tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = start(a_dir, part1, "cluster.isolate=false", f"cluster.port={fake_free_port()}")
    try:
        wait_up(a, a_dir)
        b = subprocess.run([PY, "-c", fake_entry.RUNNER, str(b_dir), part1, "cluster=local",
                            "cluster.isolate=false", f"cluster.port={fake_free_port()}"], cwd=REPO,
                           capture_output=True, text=True, timeout=budget(60))
        assert b.returncode == 2
        assert (f"another degnn run uses this host's /dev/shm (launcher pid {a.pid}, run dir {a_dir})"
                in b.stderr), b.stderr
        assert not (b_dir / "server0.log").exists()  # nothing started
        a.kill()  # SIGKILL: its registration stays; DGL would leave its shared memory too
        a.communicate()
        reg = Path(f"/dev/shm/degnn-local-{a.pid}")
        assert reg.exists()
        leftover = Path(f"/dev/shm/tiny-degnn-test-{uuid.uuid4().hex[:8]}")  # named like its graph
        leftover.write_text("x")
        r = subprocess.run([PY, "-m", "degnn.launch", "--cleanup"], cwd=REPO, capture_output=True,
                           text=True, timeout=budget(60))
        assert r.returncode == 0
        assert f"removed file {reg}" in r.stdout and f"removed file {leftover}" in r.stdout, r.stdout
        assert not reg.exists() and not leftover.exists()
    finally:
        if a.poll() is None:
            a.kill()
            a.communicate()
        fake_entry.remove_shm_markers(str(a_dir))
        for f in Path("/dev/shm").glob("tiny-degnn-test-*"):
            f.unlink()


def fake_free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_isolation
def test_two_local_runs_at_once_keep_their_own_data(tmp_path):
    """The issue's failure: two concurrent local runs crashed (SIGBUS) or one trained on the other's
    labels. Same port, different datasets, started together: each trains on its own."""
    before = set(os.listdir("/dev/shm"))
    common = [PY, "-m", "degnn.launch", "cluster=local", "dataset=synthetic-tiny", "model.hidden=16",
              "model.fanouts=[5,5]", "train.epochs=2", f"dataset.root={tmp_path / 'data'}",
              f"partition.root={tmp_path / 'parts'}"]
    # the partitions first (one builder at a time writes the shared cache)
    from degnn.entry import compose_config
    from degnn.partition_cache import ensure_partitions

    for classes in (8, 4):
        cfg = compose_config([*common[3:], f"dataset.num_classes={classes}"])
        ensure_partitions(cfg.dataset, cfg.partition)
    runs = {c: subprocess.Popen([*common, f"dataset.num_classes={c}", f"hydra.run.dir={tmp_path / str(c)}"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in (8, 4)}
    outs = {c: p.communicate(timeout=budget(300)) for c, p in runs.items()}
    for c, p in runs.items():
        assert p.returncode == 0, outs[c][1][-3000:]
        s = json.loads((tmp_path / str(c) / "summary.json").read_text())
        assert s["status"] == "ok" and s["num_classes"] == c and s["epochs"] == 2
    assert set(os.listdir("/dev/shm")) <= before  # nothing of either run left on the host


def test_rank0_store_listens_on_the_cluster_address_only():
    """torch's env:// rendezvous would listen on every interface (*:MASTER_PORT). The store owns the
    listening descriptor it is handed and closes it itself: no Python socket of degnn may hold the
    same one (its close would pull the socket from under the store: torch < 2.4 aborts)."""
    code = ("import gc, os, datetime, socket, subprocess, torch, torch.distributed as dist\n"
            "from degnn.runtime.store import init_process_group\n"
            "init_process_group(0, 1, datetime.timedelta(seconds=60))\n"
            "t = torch.ones(1); dist.all_reduce(t); assert t.item() == 1\n"
            "ss = subprocess.run(['ss', '-ltnpH'], capture_output=True, text=True).stdout\n"
            "print('\\n'.join(l for l in ss.splitlines() if f'pid={os.getpid()},' in l))\n"
            "gc.collect()\n"
            "held = [s for s in gc.get_objects() if isinstance(s, socket.socket) and s.fileno() != -1\n"
            "        and s.getsockname()[1] == int(os.environ['MASTER_PORT'])]\n"
            "print('python sockets on the store port:', len(held))\n")
    port = fake_free_port()
    r = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=budget(120),
                       env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [l.split() for l in r.stdout.splitlines() if l.startswith("LISTEN")]
    assert any(l[3] == f"127.0.0.1:{port}" for l in lines), r.stdout  # the store
    assert all(l[3].startswith("127.0.0.1:") for l in lines), r.stdout  # and nothing else anywhere
    assert "python sockets on the store port: 0" in r.stdout, r.stdout
