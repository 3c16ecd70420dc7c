"""cluster=netns: several machines on this host as network namespaces (needs root and `ip netns`).

With the fake entry (tests/fake_entry.py): reachability by IP, gloo, /dev/shm private per machine
and shared within one, wire counters, faults (trainer or server exits 1, launcher interrupted or
killed) and cleanup. With real DGL: a trainer attaches to its server's shared-memory partition.
With the real entry (degnn.train): a distdgl run and a SIGKILLed trainer.
"""
from __future__ import annotations

import importlib.util
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
from netns_support import REASON
from timing import budget
from degnn.launch.netns import list_links, list_namespaces
from degnn.proc import environ_of, pids_with_env

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))


@pytest.fixture(scope="module")
def part2(tmp_path_factory):
    return fake_entry.make_partition(str(tmp_path_factory.mktemp("parts") / "p2"), 2)


def start_launcher(run_dir, part, *overrides, env=None, entry="tests.fake_entry"):
    return subprocess.Popen([PY, "-c", fake_entry.RUNNER, str(run_dir), part, *overrides],
                            cwd=REPO, env={**os.environ, "DEGNN_ENTRY": entry, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p, timeout=100):
    out, err = p.communicate(timeout=budget(timeout))
    return p.returncode, out, err


def assert_nothing_left(launcher_pid: int, run_dir) -> None:
    tag = f"degnn{launcher_pid}"
    assert not [n for n in list_namespaces() if n.startswith(tag)]
    assert not [l for l in list_links() if l.startswith(tag)]
    assert not fake_entry.processes_mentioning(str(run_dir))


def test_two_machines_reach_each_other_with_private_shm(part2, tmp_path):
    marker = f"degnn-test-host-{uuid.uuid4().hex[:8]}"
    Path("/dev/shm", marker).write_text("host")
    run_dir = tmp_path / "run"
    try:
        t0 = time.monotonic()
        p = start_launcher(run_dir, part2, "cluster=netns", "cluster.machines=2",
                           "cluster.trainers_per_machine=2", "cluster.bandwidth=1gbit",
                           env={"FAKE_GLOO": "1", "FAKE_HOST_SHM_MARKER": marker})
        rc, out, err = finish(p)
        took = time.monotonic() - t0
    finally:
        Path("/dev/shm", marker).unlink()
    assert rc == 0, err
    assert "netns cluster of 2 machines up" in err and "1gbit per link" in err
    assert "fake epoch: 10/10" in out and "result: pipeline=fake" in out
    for rank in range(4):
        r = json.loads((run_dir / f"fake_rank{rank}.json").read_text())
        assert r["machine"] == rank // 2
        assert r["shm_shared"], r  # the server of its own machine is visible in /dev/shm
        assert r["shm_foreign"] == [] and not r["host_shm_visible"], r  # and nothing else
        assert r["reached"] == {"10.77.0.1:30050": 0, "10.77.0.2:30050": 1}
        assert r["allreduce"] == 4.0
        assert r["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
        assert r["env"]["MASTER_ADDR"] == "10.77.0.1"
        # its own hostname, resolving to its own address like on a real cluster
        assert r["hostname"] == f"degnn-m{rank // 2}" and r["resolved"] == f"10.77.0.{rank // 2 + 1}"
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["net_bytes_total"] > 0 and s["net_bytes_per_batch"] == s["net_bytes_total"] / 10
    assert len(s["net_tx_bytes_per_machine"]) == 2 and min(s["net_tx_bytes_per_machine"]) > 0
    assert (run_dir / "ip_config.txt").read_text() == "10.77.0.1 30050\n10.77.0.2 30050\n"
    assert took < budget(60)
    assert_nothing_left(p.pid, run_dir)


def test_bandwidth_cap_applies(tmp_path):
    from degnn.launch import NetnsCluster
    recv = ("import socket,time; s=socket.socket(); s.bind(('10.77.0.2',5001)); s.listen(); "
            "c,_=s.accept(); n=0; t=None\n"
            "while True:\n b=c.recv(1<<16)\n if t is None: t=time.monotonic()\n"
            " if not b: break\n n+=len(b)\n"
            "print(n, time.monotonic()-t)")
    send = ("import socket,time\nfor _ in range(50):\n try: c=socket.create_connection(("
            "'10.77.0.2',5001)); break\n except OSError: time.sleep(0.1)\n"
            "c.sendall(b'x'*4000000); c.close()")
    with NetnsCluster(2, bandwidth="40mbit") as net:
        r = subprocess.Popen([*net.prefix(1, str(REPO)), PY, "-c", recv], stdout=subprocess.PIPE,
                             text=True)
        subprocess.run([*net.prefix(0, str(REPO)), PY, "-c", send], check=True, timeout=30)
        n, secs = r.communicate(timeout=30)[0].split()
        names = [net.ns, net.veth, net.bridge]
    assert int(n) == 4000000
    mbit = int(n) * 8 / float(secs) / 1e6
    assert 20 < mbit < 48, mbit  # 40 mbit/s cap (tbf burst lets a little more through)
    assert not [x for x in list_namespaces() + list_links() if x in str(names)]


@pytest.mark.parametrize("who", ["trainer", "server"])
def test_a_dead_process_stops_the_cluster(part2, tmp_path, who):
    run_dir = tmp_path / "run"
    env = {"FAKE_FAIL_RANK": "3"} if who == "trainer" else {"FAKE_FAIL_SERVER": "1"}
    t0 = time.monotonic()
    p = start_launcher(run_dir, part2, "cluster=netns", "cluster.trainers_per_machine=2",
                       "cluster.stop_grace_s=5", env={**env, "FAKE_FAIL_AFTER": "3"})
    rc, out, err = finish(p, timeout=60)
    took = time.monotonic() - t0
    assert rc != 0
    name = "trainer rank 3 (machine 1)" if who == "trainer" else "server 1 (machine 1)"
    log = run_dir / ("rank3.log" if who == "trainer" else "server1.log")
    assert f"{name} pid " in err and "exited with code 1" in err and f"log: {log}" in err, err
    assert "failing on purpose" in err  # the tail of its log
    assert took < budget(30)
    assert_nothing_left(p.pid, run_dir)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_removes_everything(part2, tmp_path, sig):
    run_dir = tmp_path / "run"
    # everyone hangs (a fault that never comes): only the interrupt ends it
    p = start_launcher(run_dir, part2, "cluster=netns", env={"FAKE_FAIL_RANK": "99"})
    deadline = time.monotonic() + budget(30)
    while not (run_dir / "fake_rank1.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list_namespaces()
    p.send_signal(sig)
    rc, out, err = finish(p, timeout=30)
    assert rc == 128 + sig and f"interrupted by {sig.name}" in err
    assert_nothing_left(p.pid, run_dir)


def test_leftovers_of_a_killed_launcher_are_cleaned(part2, tmp_path):
    run_dir = tmp_path / "run"
    p = start_launcher(run_dir, part2, "cluster=netns", "cluster.memory_per_machine=1G",
                       env={"FAKE_FAIL_RANK": "99"})
    deadline = time.monotonic() + budget(30)
    while not (run_dir / "fake_rank1.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    p.kill()  # no handler runs: the namespaces, links and the machines' cgroups stay
    p.communicate()
    tag = f"degnn{p.pid}"
    assert [n for n in list_namespaces() if n.startswith(tag)]
    cgroups = _cgroups_of(p.pid)
    assert len(cgroups) == 2, cgroups
    # processes and holders die with the launcher (parent-death signal)
    deadline = time.monotonic() + budget(10)
    while time.monotonic() < deadline and (fake_entry.processes_mentioning(str(run_dir))
                                           or _holders_of(p.pid)):
        time.sleep(0.1)
    assert not fake_entry.processes_mentioning(str(run_dir)) and not _holders_of(p.pid)
    # what the next launch does first, and `make cleanup` (which prints these lines). In process:
    # any other launcher starting on this host meanwhile removes them too
    from degnn.launch.cleanup import cleanup_all
    # (a veth goes with its namespace, so only namespaces and the bridge are named for sure)
    left = [n for n in list_namespaces() + list_links() if n.startswith(tag) and n[len(tag)] in "mb"]
    cgroups = _cgroups_of(p.pid)
    removed = cleanup_all()
    assert all(f"netns/link {n}" in removed for n in left), (left, removed)
    assert all(f"cgroup {d}" in removed for d in cgroups), (cgroups, removed)
    assert_nothing_left(p.pid, run_dir)
    assert not _cgroups_of(p.pid)


def _cgroups_of(pid=None) -> list:
    """Machine cgroups (degnn/launch/limits.py) of launcher `pid`, or of any."""
    from degnn.launch.limits import ROOT, _ours_under
    return [d for c in ("memory", "cpu") for d in _ours_under(os.path.join(ROOT, c))
            if pid is None or os.path.basename(d).startswith(f"degnn{pid}m")]


def test_a_machine_over_its_memory_is_named(part2, tmp_path):
    # rank 1 (machine 1) allocates 400 MB on a machine limited to 160 MiB: the kernel kills it,
    # the launcher names the machine and what each of its processes held, nothing is left
    run_dir = tmp_path / "run"
    p = start_launcher(run_dir, part2, "cluster=netns", "cluster.memory_per_machine=160M",
                       "cluster.cpus_per_machine=1", "cluster.stop_grace_s=2",
                       env={"FAKE_FAIL_RANK": "1", "FAKE_EAT_MB": "400"})
    rc, out, err = finish(p, timeout=60)
    last = err.strip().splitlines()[-1]
    assert rc != 0 and last.startswith("degnn.launch: run failed: machine 1 ran out of its 160 MiB"), err[-3000:]
    assert "server 1 held " in last and "trainer rank 1 held " in last and "OOM killer killed trainer rank 1" in last, last
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("machine 1 ran out of its 160 MiB")
    assert s["memory_per_machine_mb"] == 160 and s["cpus_per_machine"] == 1
    assert s["machine_peak_memory_mb"][1] >= 150 and s["peak_rss_mb_per_process"]["trainer1"] > 100, s
    assert_nothing_left(p.pid, run_dir)
    assert not _cgroups_of(p.pid)


def test_a_machine_gets_its_share_of_cpu():
    # a busy loop of 2 s on a machine limited to 0.2 CPUs gets about 0.4 s of CPU time (0.45 s
    # measured), less on a loaded host
    from degnn.launch.limits import MachineLimits
    busy = "import resource, time\nt = time.time()\nwhile time.time() - t < 2: pass\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_utime)"
    with MachineLimits(1, cpus=0.2) as lim:
        r = subprocess.run([PY, "-c", busy], preexec_fn=lambda: lim.enter(0), capture_output=True, text=True)
        keys = lim.summary()
    assert 0.05 < float(r.stdout) < 0.7, r.stdout  # unlimited: up to 2 s on an idle core
    # the busy loop ran out of its quota in nearly every 100 ms period it ran in
    assert keys["cpus_per_machine"] == 0.2 and keys["cpu_throttled_share"] > 0.8, keys
    assert not _cgroups_of(os.getpid())


def _holders_of(pid: int) -> list:
    from degnn.launch.isolate import HOLDER_ENV
    return pids_with_env(HOLDER_ENV, str(pid))


def test_dgl_trainers_attach_to_their_servers_shared_memory(part2, tmp_path):
    run_dir = tmp_path / "run"
    # two servers per machine: the backup server attaches to the main server's shared memory too
    p = start_launcher(run_dir, part2, "cluster=netns", "cluster.trainers_per_machine=2",
                       "cluster.servers_per_machine=2", env={"FAKE_DGL": "1"})
    rc, out, err = finish(p, timeout=budget(110))
    assert rc == 0, err[-3000:]
    for rank in range(4):
        r = json.loads((run_dir / f"fake_rank{rank}.json").read_text())
        # DistGraph's local partition comes from the server's shared memory on the same machine
        assert r["num_nodes"] == 200 and r["local_nodes"] >= 100
        assert r["feat_sum"] == float(sum(range(200)) * 4)
    assert "10.77.0.2:30051" in (run_dir / "server3.log").read_text()
    assert_nothing_left(p.pid, run_dir)


# ---- the real entry ------------------------------------------------------------------------------
REAL = ["-m", "degnn.launch", "cluster=netns", "cluster.machines=2", "pipeline=distdgl",
        "dataset=synthetic-tiny", "train.epochs=1"]


def test_real_distdgl_run(tmp_path):
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    # batches of 48: 12 a trainer and epoch, so that the trainers' wire windows (one per epoch)
    # line up with the batches they count, and prefetch_auto's halves of the first epoch are
    # long enough to choose from (6 batches each)
    # machines limited to 2 GiB and one CPU each (measured: about 550 MiB a machine here); the
    # evaluation's hidden layer in float16 tables (the learned-better-than-chance bar below is
    # scored through them)
    r = subprocess.run([PY, *REAL, "train.epochs=3", "train.batch_size=48", f"hydra.run.dir={run_dir}",
                        "cluster.memory_per_machine=2G", "cluster.cpus_per_machine=1",
                        "train.eval_hidden_dtype=float16", "pipeline.prefetch_auto=true"],
                       cwd=REPO, capture_output=True, text=True, timeout=budget(110))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "ok" and s["machines"] == 2 and s["batches"] > 0
    # every process's peak RSS, servers included; each machine's peak within its limit; set-up
    peaks = s["peak_rss_mb_per_process"]
    assert sorted(peaks) == ["server0", "server1", "trainer0", "trainer1"] and min(peaks.values()) > 50, s
    assert s["peak_rss_mb_server"] == max(peaks["server0"], peaks["server1"])
    assert s["memory_per_machine_mb"] == 2048 and s["cpus_per_machine"] == 1
    assert 0 <= s["cpu_throttled_share"] <= 1, s  # the machines have a CPU quota
    assert all(100 < m <= 2048 for m in s["machine_peak_memory_mb"]), s
    # honest memory (degnn/launch/memory.py): each machine's memory split by kind at its highest
    # sampled usage; the parts add up to that sample, which is at most the kernel's peak (1 MiB:
    # rounding, and memory.stat is read a moment after the usage)
    split, part = s["machine_memory_split_mb"], s["machine_partition_mb"]
    assert len(split) == len(part) == 2, s
    for m in range(2):
        sp = split[m]
        assert sp["peak"] == s["machine_peak_memory_mb"][m], s
        assert sp["process"] + sp["shmem"] + sp["page_cache"] + sp["kernel"] <= sp["sampled"] + 1, s
        # sampled while the machine was up, near its peak (measured: within 1 MiB of it)
        assert 0.8 * sp["peak"] <= sp["sampled"] <= sp["peak"] + 1 and sp["process"] > 100, s
        # the machine's servers copy its part's node data into its /dev/shm, charged to it
        # (at some sample: the highest usage can come before they do)
        assert sp["shmem_max"] >= part[m]["features"] > 0, s
    share = s["graph_mb"] / 2
    assert s["graph_mb"] == pytest.approx(sum(p["structure"] + p["features"] for p in part), abs=0.2), s
    assert s["graph_share_mb"] == pytest.approx(share, abs=0.1), s
    for m in range(2):
        peak = s["machine_peak_memory_mb"][m]
        assert s["machine_peak_per_share"][m] == pytest.approx(peak / share, rel=0.02), s
        assert s["machine_fixed_mb"][m] == pytest.approx(peak - part[m]["structure"] - part[m]["features"], abs=0.2), s
    # per process: USS <= PSS <= RSS; a trainer maps its server's shared partition and the
    # libraries every process maps, so its PSS is well below its RSS (measured: 0.78-0.79 of it;
    # its RSS sampled in place of PSS would be near its peak RSS)
    pss, uss = s["peak_pss_mb_per_process"], s["peak_uss_mb_per_process"]
    assert sorted(pss) == sorted(uss) == sorted(peaks), s
    for name in peaks:
        assert 0 < uss[name] <= pss[name] <= peaks[name], (name, s)
    assert all(pss[t] < 0.9 * peaks[t] for t in ("trainer0", "trainer1")), s
    assert s["setup_s"] > 0 and s["setup_net_bytes"] > 0 and s["setup_bytes"] >= 0, s
    assert 50 < s["setup_peak_rss_mb"] <= s["peak_rss_mb_trainer"], s
    # DDP's mechanism: every trainer stepped on the same averaged gradients, so both end with
    # bit-identical parameters; and it learned (8 classes: chance is 0.125)
    assert s["params_agree"] is True and s["test"] > 0.125 + 0.2, s
    # the default loader: a thread samples ahead, the trainer pulls (its owner_wait); with
    # prefetch_auto each trainer timed both loops in its first epoch and the cluster chose one
    # (every trainer the same loop)
    assert s["prefetch"] == 1 and s["prefetch_pull"] is False and s["prefetch_pull_s_per_batch"] is None, s
    assert s["prefetch_sampling_s_per_batch"] > 0 and s["time_per_batch_s"]["owner_wait"] > 0, s
    assert s["prefetch_auto"] is True and s["prefetch_kept"] in (0, 2), s
    # the halves were long enough, so the trainers chose together (one all-reduce)
    for log in ("rank0.log", "rank1.log"):
        text = (run_dir / log).read_text()
        assert "the cluster's sum: prefetching" in text or "the cluster's sum: synchronous" in text, text[-2000:]
    assert all(v > 0 for v in s["prefetch_probe_s_per_batch"].values()), s
    assert s["net_bytes_total"] > 0 and s["net_bytes_per_batch"] > 0
    # The application's own byte count agrees with the veth counters of the training phase.
    # Measured here (3 runs): app 1.1% below wire; sampling is ~6.5% of the app bytes, features
    # ~65%, all-reduce ~29%. 3% tolerance: sampling counted as zero is 7.5% off and fails.
    cats = s["app_bytes_by_category"]
    assert cats.get("sampling", 0) > 0 and cats.get("features", 0) > 0 and cats.get("allreduce", 0) > 0
    app, wire = s["app_bytes_per_batch"], s["net_bytes_per_batch"]
    assert abs(app - wire) <= 0.03 * wire, (app, wire, cats)
    # the reported test metric is the one at the best validation point of the curve
    curve = [json.loads(l) for l in (run_dir / "curve.jsonl").read_text().splitlines()]
    assert [c["epoch"] for c in curve] == [1, 2, 3]
    best = max(curve, key=lambda c: c["val"])  # max() keeps the first of equal values
    assert (s["best_val"], s["test"], s["best_epoch"]) == (best["val"], best["test"], best["epoch"])
    if importlib.util.find_spec("tensorboard") is not None:  # rank 0's event file, with its bytes
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run_dir))
        acc.Reload()
        assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3]
        assert all(e.value > 0 for e in acc.Scalars("bytes_per_batch/features"))
        assert all(e.value > 0 for e in acc.Scalars("time_per_batch_s/compute"))
    assert "result: pipeline=distdgl" in r.stdout
    assert time.monotonic() - t0 < 110
    assert not fake_entry.processes_mentioning(str(run_dir))
    assert not [n for n in list_namespaces() if _owner_gone(n)]
    assert not [d for d in _cgroups_of() if _owner_gone(os.path.basename(d))]


def _owner_gone(name: str) -> bool:
    from degnn.launch.netns import _ours
    from degnn.proc import pid_alive
    owner = _ours(name)
    return owner is not None and not pid_alive(owner)


def test_real_trainer_stopped_is_reported_within_seconds(tmp_path):
    """kill -STOP one trainer (a netns process: a host pid): with the default
    cluster.hang_timeout_s (300 s) the launcher names it as stopped within seconds
    (hang.STOPPED_LIMIT_S), stops the run with status=failed and leaves nothing behind: the real
    DGL servers, still waiting for that client, are stopped too. (A trainer that dies instead is
    named by its exit: test_a_dead_process_stops_the_cluster, and the TMA tests' real trainers.)"""
    run_dir = tmp_path / "run"
    p = subprocess.Popen([PY, *REAL, "train.epochs=500", f"hydra.run.dir={run_dir}"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + budget(90)
        victim = None
        while time.monotonic() < deadline and p.poll() is None and victim is None:
            log = run_dir / "rank0.log"
            if log.exists() and "epoch 1:" in log.read_text(errors="replace"):
                victim = [pid for pid in fake_entry.processes_mentioning(str(run_dir))
                          if environ_of(pid).get("RANK") == "1" and environ_of(pid).get("DGL_ROLE") == "client"]
            time.sleep(0.3)
        assert victim, "training never started"
        os.kill(victim[0], signal.SIGSTOP)
        t_stop = time.monotonic()
        out, err = p.communicate(timeout=budget(60))
        took = time.monotonic() - t_stop
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode != 0
    assert (f"trainer rank 1 (machine 1) pid {victim[0]} is stopped by a signal (SIGSTOP" in err
            and f"kill -CONT {victim[0]}" in err and str(run_dir / "rank1.log") in err), err[-3000:]
    assert took < budget(20), took
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and "is stopped by a signal" in s["error"]
    assert s["failed_process"]["index"] == 1 and s["epochs"] >= 1  # the epochs done stay
    assert_nothing_left(p.pid, run_dir)


def test_two_netns_clusters_at_once(part2, tmp_path):
    """Two launchers on one host, same subnet and ports: each cluster only sees its own machines."""
    runs = [tmp_path / "a", tmp_path / "b"]
    ps = [start_launcher(r, part2, "cluster=netns", "cluster.trainers_per_machine=2",
                         env={"FAKE_GLOO": "1"}) for r in runs]
    results = [finish(p, timeout=150) for p in ps]
    for p, run_dir, (rc, out, err) in zip(ps, runs, results):
        assert rc == 0, err[-3000:]
        for rank in range(4):
            r = json.loads((run_dir / f"fake_rank{rank}.json").read_text())
            assert r["shm_shared"] and r["shm_foreign"] == [] and r["allreduce"] == 4.0, r
            assert r["reached"] == {"10.77.0.1:30050": 0, "10.77.0.2:30050": 1}
        assert_nothing_left(p.pid, run_dir)
