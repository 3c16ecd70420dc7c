"""Launcher: the plan (env, commands, ip_config), dry run, preflight errors, ssh commands, and
cluster=local runs with the fake entry (tests/fake_entry.py; no root needed)."""
from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from degnn.config import CONF_DIR, register_configs
from degnn.launch import LaunchError, finalize_summary, launch, make_plan, result_line
from degnn.launch import ssh
from degnn.launch.netns import parse_rate

import fake_entry
from timing import budget, interrupt_when

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
register_configs()

# what DGL's tools/launch.py exports (docs/background.md, "DGL, OGB and Hydra facts"), plus our own
SERVER_KEYS = {"DGL_ROLE", "DGL_NUM_SAMPLER", "OMP_NUM_THREADS", "DGL_NUM_CLIENT", "DGL_CONF_PATH",
               "DGL_IP_CONFIG", "DGL_NUM_SERVER", "DGL_GRAPH_FORMAT", "DGL_SERVER_ID", "PYTHONPATH",
               "DEGNN_LAUNCHED", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"}
TRAINER_KEYS = {"DGL_DIST_MODE", "DGL_ROLE", "DGL_NUM_SAMPLER", "DGL_NUM_CLIENT", "DGL_CONF_PATH",
                "DGL_IP_CONFIG", "DGL_NUM_SERVER", "DGL_GRAPH_FORMAT", "DGL_GROUP_ID",
                "OMP_NUM_THREADS", "PYTHONPATH",
                # torchrun's, set by the launcher itself
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                "MASTER_PORT", "DEGNN_LAUNCHED"}


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    return {k: fake_entry.make_partition(str(root / f"p{k}"), k) for k in (1, 2)}


def free_port() -> int:
    # local runs get their own port: other runs on this host may hold the default 30050
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_launcher(run_dir, part, *overrides, env=None, timeout=None):
    """The launcher in a subprocess (its own signal handlers, stdout); returns (rc, out, err, s)."""
    t0 = time.monotonic()
    try:
        r = subprocess.run([PY, "-c", fake_entry.RUNNER, str(run_dir), part, *overrides],
                           cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True,
                           text=True, timeout=timeout or budget(90))
    finally:
        fake_entry.remove_shm_markers(str(run_dir))  # the host's /dev/shm (cluster=local)
    return r.returncode, r.stdout, r.stderr, time.monotonic() - t0


# ---- the plan ---------------------------------------------------------------------------------
def test_plan_two_machines_two_trainers_one_server(parts, tmp_path):
    ov = ["cluster=netns", "cluster.machines=2", "cluster.trainers_per_machine=2", "model.layers=3"]
    cfg = cfg_of(*ov)
    plan = make_plan(cfg, str(tmp_path), parts[2], ov, entry="degnn.train", master_port=1234)
    assert plan.ip_config_text == "10.77.0.1 30050\n10.77.0.2 30050\n"
    assert plan.ip_config == str(tmp_path / "ip_config.txt")
    servers, trainers = plan.servers(), plan.trainers()
    assert [(p.machine, p.index) for p in servers] == [(0, 0), (1, 1)]
    assert [(p.machine, p.index) for p in trainers] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    common = {"DGL_NUM_SAMPLER": "0", "DGL_NUM_CLIENT": "4", "DGL_CONF_PATH": parts[2],
              "DGL_IP_CONFIG": plan.ip_config, "DGL_NUM_SERVER": "1", "DGL_GRAPH_FORMAT": "csc",
              "DEGNN_LAUNCHED": "1"}
    for s in servers:
        assert set(s.env) == SERVER_KEYS
        assert s.env == {**s.env, **common, "DGL_ROLE": "server", "OMP_NUM_THREADS": "1",
                         "DGL_SERVER_ID": str(s.index)}
        assert s.log == str(tmp_path / f"server{s.index}.log")
    for t in trainers:
        assert set(t.env) == TRAINER_KEYS | {"GLOO_SOCKET_IFNAME"}
        assert t.env == {**t.env, **common, "DGL_DIST_MODE": "distributed", "DGL_ROLE": "client",
                         "DGL_GROUP_ID": "0", "RANK": str(t.index), "WORLD_SIZE": "4",
                         "LOCAL_RANK": str(t.index % 2), "LOCAL_WORLD_SIZE": "2",
                         "GROUP_RANK": str(t.machine), "MASTER_ADDR": "10.77.0.1",
                         "MASTER_PORT": "1234", "GLOO_SOCKET_IFNAME": "eth0"}
        assert t.log == str(tmp_path / f"rank{t.index}.log")
    assert str(REPO) in trainers[0].env["PYTHONPATH"].split(os.pathsep)
    # every process runs the same command line: the user's overrides plus absolute paths
    argv = [PY, "-m", "degnn.train", *ov, f"hydra.run.dir={tmp_path}",
            f"dataset.root={os.path.abspath('data')}",
            f"partition.root={os.path.abspath('partitions')}"]
    assert all(p.argv == argv for p in plan.procs)


def test_local_plan_has_no_gloo_ifname(parts, tmp_path):
    plan = make_plan(cfg_of("cluster=local"), str(tmp_path), parts[1], [])
    assert plan.ip_config_text == "127.0.0.1 30050\n"
    (t,) = plan.trainers()
    assert set(t.env) == TRAINER_KEYS and t.env["MASTER_ADDR"] == "127.0.0.1"


def test_user_paths_are_made_absolute(parts, tmp_path):
    ov = ["dataset.root=mydata", "partition.root=/abs/parts", "train.epochs=1"]
    plan = make_plan(cfg_of(*ov), "rel/run", parts[1], ov)
    argv = plan.procs[0].argv
    assert argv[3:] == ["train.epochs=1", f"hydra.run.dir={os.path.abspath('rel/run')}",
                        f"dataset.root={os.path.abspath('mydata')}", "partition.root=/abs/parts"]


def test_dry_run_prints_and_starts_nothing(parts, tmp_path):
    ov = ["cluster=netns", "cluster.trainers_per_machine=2", "cluster.dry_run=true"]
    out = io.StringIO()
    run_dir = tmp_path / "run"
    assert launch(cfg_of(*ov), str(run_dir), parts[2], ov, out=out) == 0
    text = out.getvalue()
    for name in ("server0", "server1", "rank0", "rank1", "rank2", "rank3"):
        assert f"  {name} [" in text
    assert "DGL_ROLE=server" in text and "GLOO_SOCKET_IFNAME=eth0" in text
    assert "10.77.0.2 30050" in text and "-m degnn.train" in text
    assert not run_dir.exists()  # nothing written, nothing started


# ---- preflight: one line, before anything starts ------------------------------------------------
def one_line_error(fn) -> str:
    with pytest.raises(LaunchError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def test_local_refuses_several_machines(parts, tmp_path):
    cfg = cfg_of("cluster=local", "cluster.machines=2")
    msg = one_line_error(lambda: launch(cfg, str(tmp_path), parts[2], []))
    assert "cluster=netns" in msg


def test_machines_must_match_partitions(parts, tmp_path):
    cfg = cfg_of("cluster=netns", "cluster.machines=3")
    msg = one_line_error(lambda: launch(cfg, str(tmp_path), parts[2], []))
    assert "3 machines" in msg and "2 partitions" in msg


def test_ssh_ip_config_lines_must_match_partitions(parts, tmp_path):
    ipc = tmp_path / "ips.txt"
    ipc.write_text("10.0.0.1\n10.0.0.2 4000\n10.0.0.3\n")
    cfg = cfg_of("cluster=ssh", f"cluster.ip_config={ipc}")
    msg = one_line_error(lambda: launch(cfg, str(tmp_path / "run"), parts[2], []))
    assert str(ipc) in msg and "2 partitions" in msg


def test_missing_partition_file(parts, tmp_path):
    copy = tmp_path / "p2"
    shutil.copytree(Path(parts[2]).parent, copy)
    (copy / "part1" / "graph.dgl").unlink()
    cfg = cfg_of("cluster=netns")
    msg = one_line_error(lambda: launch(cfg, str(tmp_path / "run"), str(copy / "tiny.json"), []))
    assert "part1/graph.dgl" in msg and "missing" in msg
    msg = one_line_error(lambda: launch(cfg, str(tmp_path / "run"), str(tmp_path / "no.json"), []))
    assert "does not exist" in msg


def test_port_in_use(parts, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # (a private local machine has ports of its own: only a shared one checks the host's)
        cfg = cfg_of("cluster=local", f"cluster.port={port}", "cluster.isolate=false")
        msg = one_line_error(lambda: launch(cfg, str(tmp_path / "run"), parts[1], []))
    assert f"port {port}" in msg and "in use" in msg
    assert not (tmp_path / "run").exists()


def test_preflight_error_from_the_command_line(parts, tmp_path):
    rc, out, err, _ = run_launcher(tmp_path / "run", parts[2], "cluster=local", "cluster.machines=2")
    assert rc != 0
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("degnn.launch: error:"), err


# ---- ssh commands (no sshd here: construction only) ----------------------------------------------
def test_ssh_machine_count_is_ip_configs_lines(tmp_path):
    from degnn.runtime.cluster import count_ip_config
    ipc = tmp_path / "ipc"
    ipc.write_text("10.0.0.1\n10.0.0.2\n10.0.0.3\n")
    cl = cfg_of("cluster=ssh", f"cluster.ip_config={ipc}").cluster
    assert count_ip_config(cl, [], 3) == ["cluster.machines=3"] and cl.machines == 3
    assert count_ip_config(cl, ["cluster.machines=3"], 3) == []
    msg = one_line_error(lambda: count_ip_config(cl, ["cluster.machines=2"], 3))
    assert msg.startswith(f"cluster.machines=2 but cluster.ip_config {ipc} lists 3 machines")
    msg = one_line_error(lambda: make_plan(cfg_of("cluster=netns", "cluster.ifname=eth1"),
                                           str(tmp_path / "run"), "unused.json", []))
    assert msg.startswith("cluster.ifname=eth1 is for cluster=ssh")


def test_ssh_ip_config_and_commands(parts, tmp_path):
    ipc = tmp_path / "ips.txt"
    ipc.write_text("# two hosts\n10.0.0.1\n\n10.0.0.2 4000  # custom port\n")
    assert ssh.read_ip_config(str(ipc), 30050) == [("10.0.0.1", 30050), ("10.0.0.2", 4000)]
    ov = ["cluster=ssh", f"cluster.ip_config={ipc}", "cluster.workspace=/ws dir",
          "model.name=gat"]
    cfg = cfg_of(*ov)
    plan = make_plan(cfg, str(tmp_path / "run"), parts[2], ov)
    assert plan.ip_config_text == "10.0.0.1 30050\n10.0.0.2 4000\n"
    t = plan.trainers()[1]
    argv = ssh.ssh_argv(t, "10.0.0.2", workspace="/ws dir", port=2222, user="me")
    assert argv[:-1] == ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
                         "-p", "2222", "me@10.0.0.2"]
    remote = argv[-1]
    # the launcher's umask (077 under the CLI: the run directory private) reaches the remote host
    pre = f"cd '/ws dir'; umask {ssh.current_umask():03o}; ("
    assert remote.startswith(pre + "export ") and remote.endswith(")")
    assert "RANK=1 " in remote and "GROUP_RANK=1 " in remote and "MASTER_ADDR=10.0.0.1 " in remote
    # the launcher's own interpreter, not whatever `python3` comes first on the remote PATH
    assert f"{shlex.quote(PY)} -m degnn.train " in remote and "'cluster.workspace=/ws dir'" in remote
    ov2 = [*ov, "cluster.python=/opt/py/bin/python"]
    assert make_plan(cfg_of(*ov2), str(tmp_path / "run"), parts[2], ov2).procs[0].argv[0] == "/opt/py/bin/python"
    # the remote shell gets back exactly the argv
    inner = remote[len(pre):-1].split("; ", 1)[1]
    assert subprocess.run(["sh", "-c", f"printf '%s\\n' {inner}"], capture_output=True,
                          text=True).stdout.splitlines() == t.argv
    run = str(tmp_path / "run")
    kill = ssh.kill_argv("10.0.0.2", run, port=2222)
    assert kill[-1].startswith("pkill -TERM -f -- '-m degnn\\.train (.* )?[h]ydra")
    # the pattern matches this run's processes only (pgrep -f uses the same regex flavour), not
    # another run's nor a launcher given the same hydra.run.dir on one of the hosts
    nap = [PY, "-c", "import time; time.sleep(30)"]
    probe = subprocess.Popen([*nap, "-m", "degnn.train", "x=1", f"hydra.run.dir={run}", "y=2"])
    others = [subprocess.Popen([*nap, "-m", "degnn.train", f"hydra.run.dir={run}2"]),
              subprocess.Popen([*nap, "-m", "degnn.launch", "cluster=ssh", f"hydra.run.dir={run}"])]
    try:
        found = subprocess.run(["pgrep", "-f", "--", ssh.run_pattern(run)], capture_output=True,
                               text=True).stdout.split()
        assert found == [str(probe.pid)]
    finally:
        for p in (probe, *others):
            p.kill(), p.wait()
    with pytest.raises(LaunchError):
        ssh.read_ip_config(str(tmp_path / "missing.txt"), 1)
    msg = one_line_error(lambda: make_plan(cfg_of("cluster=ssh"), str(tmp_path), parts[2], []))
    assert "cluster.ip_config" in msg


def test_parse_size():
    from degnn.launch.limits import fmt_size, parse_size
    assert parse_size("4G") == 4 << 30 and parse_size("512M") == 512 << 20
    assert parse_size("3GiB") == 3 << 30 and parse_size("1.5g") == 3 << 29 and parse_size("1000") == 1000
    assert fmt_size(3 << 30) == "3 GiB" and fmt_size(160 << 20) == "160 MiB" and fmt_size(1.5 * 2**30) == "1.5 GiB"
    with pytest.raises(LaunchError):
        parse_size("4 gigs")


def test_parse_rate():
    assert parse_rate("1gbit") == 1e9 / 8
    assert parse_rate("100mbit") == 100e6 / 8
    assert parse_rate("10mbps") == 10e6
    with pytest.raises(LaunchError):
        parse_rate("fast")


def test_finalize_summary_adds_wire_counters(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"pipeline": "distdgl", "dataset": "d", "machines": 2, "best_val": 0.5, "test": 0.4,
         "train_time_s": 3.0, "batches": 10}))
    s = finalize_summary(str(tmp_path), [(100, 50), (10, 5)], [(1100, 550), (2010, 1005)])
    assert s["net_bytes_total"] == 3000 and s["net_bytes_per_batch"] == 300.0
    assert s["net_tx_bytes_per_machine"] == [1000, 2000]
    assert json.loads((tmp_path / "summary.json").read_text()) == s
    line = result_line(s)
    assert line.startswith("result: pipeline=distdgl") and "net_bytes_per_batch=300" in line
    s = finalize_summary(str(tmp_path), None, None)
    assert finalize_summary(str(tmp_path / "none"), None, None) is None


# ---- cluster=local with the fake entry ----------------------------------------------------------
def test_local_run(parts, tmp_path):
    run_dir = tmp_path / "run"
    port = free_port()
    rc, out, err, _ = run_launcher(run_dir, parts[1], "cluster=local", f"cluster.port={port}",
                                   "cluster.trainers_per_machine=2", "train.epochs=1")
    assert rc == 0, err
    assert "fake epoch: 10/10" in out  # rank 0 teed to the console
    assert "result: pipeline=fake dataset=tiny machines=1" in out
    for name in ("server0.log", "rank0.log", "rank1.log", "ip_config.txt"):
        assert (run_dir / name).is_file()
    assert "fake epoch" in (run_dir / "rank0.log").read_text()
    r1 = json.loads((run_dir / "fake_rank1.json").read_text())
    assert r1["shm_shared"] and r1["reached"] == {f"127.0.0.1:{port}": 0}
    assert r1["env"]["DGL_IP_CONFIG"] == str(run_dir / "ip_config.txt")
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["net_bytes_total"] is None and s["net_bytes_per_batch"] is None
    assert not fake_entry.processes_mentioning(str(run_dir))


def test_local_trainer_fault_stops_everything(parts, tmp_path):
    run_dir = tmp_path / "run"
    rc, out, err, took = run_launcher(run_dir, parts[1], "cluster=local", f"cluster.port={free_port()}",
                                      "cluster.trainers_per_machine=2",
                                      "cluster.stop_grace_s=5", env={"FAKE_FAIL_RANK": "1"})
    assert rc != 0
    assert "trainer rank 1 (machine 0) pid" in err and "exited with code 1" in err
    assert str(run_dir / "rank1.log") in err
    assert took < budget(20)
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and "trainer rank 1" in s["error"]
    assert s["failed_process"] == {"role": "trainer", "index": 1, "machine": 0,
                                   "log": str(run_dir / "rank1.log")}
    assert "trainer rank 1 (machine 0)" in (run_dir / "launch.log").read_text()
    assert not fake_entry.processes_mentioning(str(run_dir))


# ---- the Hydra entry: python -m degnn.launch ----------------------------------------------------
def test_cli_multirun_runs_one_cluster_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    # job 0's trainer fails once started: the sweep still runs job 1, then says which failed
    r = subprocess.run([PY, "-m", "degnn.launch", "-m", "train.seed=0,1", "cluster=local",
                        f"cluster.port={free_port()}", "dataset=synthetic-tiny",
                        "partition=random", f"hydra.sweep.dir={sweep}"], cwd=REPO,
                       env={**os.environ, "DEGNN_ENTRY": "tests.fake_entry", "FAKE_FAIL_RANK": "0",
                            "FAKE_FAIL_AFTER": "0", "FAKE_FAIL_IN": f"{sweep}/0"},
                       capture_output=True, text=True, timeout=budget(110))
    for job in ("0", "1"):
        fake_entry.remove_shm_markers(str(sweep / job))
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stdout.count("result: pipeline=fake") == 1  # job 1's
    statuses = {job: json.loads((sweep / job / "summary.json").read_text())["status"] for job in "01"}
    assert statuses == {"0": "failed", "1": "ok"}
    table = r.stdout[r.stdout.index(f"sweep of 2 jobs in {sweep}: 1 ok, 1 failed"):].splitlines()
    assert table[1].split() == ["job", "overrides", "status", "error"]
    assert table[2].startswith("0    train.seed=0  failed  trainer rank 0 (machine 0) pid"), table
    assert table[3].split() == ["1", "train.seed=1", "ok"] and len(table) == 4, table
    assert [j["status"] for j in json.loads((sweep / "sweep.json").read_text())] == ["failed", "ok"]
    for job, seed in (("0", "0"), ("1", "1")):
        rank0 = json.loads((sweep / job / "fake_rank0.json").read_text())
        assert rank0["env"]["DGL_IP_CONFIG"] == str(sweep / job / "ip_config.txt")
        assert (sweep / job / "summary.json").is_file() and (sweep / job / "launch.log").exists()
        argv = (sweep / job / "rank0.log").read_text()
        assert f"'train.seed={seed}'" in argv and f"'hydra.run.dir={sweep / job}'" in argv
        assert "'-m'" not in argv and "'--multirun'" not in argv  # processes never sweep
    # private by default (cluster.share_run_dir=false): logs, configs, the summary, every folder
    modes = {str(p.relative_to(sweep)): stat.S_IMODE(p.stat().st_mode) for p in [sweep, *sweep.rglob("*")]}
    assert {"0/summary.json", "0/rank0.log", "0/.hydra/config.yaml", "1/launch.log", "multirun.yaml",
            "sweep.json"} <= set(modes)
    wrong = {p: oct(m) for p, m in modes.items() if m != (0o700 if (sweep / p).is_dir() else 0o600)}
    assert not wrong, wrong


def test_cli_partitioner_error_is_one_line(tmp_path):
    r = subprocess.run([PY, "-m", "degnn.launch", "dataset=ogbn-products",
                        f"dataset.root={tmp_path / 'empty'}", f"partition.root={tmp_path / 'p'}",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                       text=True, timeout=budget(60))
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("degnn.launch: error:"), r.stderr


def test_killed_launcher_takes_its_processes_along(parts, tmp_path):
    run_dir = tmp_path / "run"
    p = subprocess.Popen([PY, "-c", fake_entry.RUNNER, str(run_dir), parts[1], "cluster=local",
                          f"cluster.port={free_port()}", "cluster.trainers_per_machine=2"],
                         cwd=REPO, env={**os.environ, "FAKE_FAIL_RANK": "99"},  # all hang
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + budget(30)
    while not (run_dir / "fake_rank1.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fake_entry.processes_mentioning(str(run_dir))
    p.kill()  # SIGKILL: no handler, no finally; the kernel's parent-death signal does it
    p.wait()
    deadline = time.monotonic() + 5
    while fake_entry.processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    fake_entry.remove_shm_markers(str(run_dir))
    assert not fake_entry.processes_mentioning(str(run_dir))


def test_netns_without_permission_is_one_line(monkeypatch):
    from degnn.launch import NetnsCluster
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    msg = one_line_error(lambda: NetnsCluster(2).__enter__())
    assert "root" in msg and "cluster=local" in msg


# ---- numbers and resume= checked before anything is partitioned or started ------------------
@pytest.mark.parametrize("overrides,expect", [
    (["train.batch_size=-1"], "train.batch_size=-1: must be an integer >= 1"),
    (["train.batch_size=0"], "train.batch_size=0: must be an integer >= 1"),
    (["train.epochs=0"], "train.epochs=0: must be an integer >= 1"),
    (["train.lr=0"], "train.lr=0"),
    (["train.lr=nan"], "train.lr=nan"),
    (["train.eval_every=0"], "train.eval_every=0"),
    (["model.dropout=1.5"], "model.dropout=1.5"),
    (["cluster=netns", "cluster.machines=0"], "cluster.machines=0: must be an integer >= 1"),
    (["cluster=netns", "cluster.machines=100"], "cluster.machines=100: cluster=netns supports 1..99"),
    (["cluster=netns", "cluster.trainers_per_machine=0"], "cluster.trainers_per_machine=0"),
    (["cluster=netns", "cluster.servers_per_machine=-2"], "cluster.servers_per_machine=-2"),
    (["cluster=netns", "cluster.bandwidth=fast"], "cluster.bandwidth='fast' is not a tc rate"),
    (["cluster=local", "cluster.bandwidth=1gbit"], "cluster.bandwidth=1gbit: only cluster=netns"),
    (["cluster.port=70000"], "cluster.port=70000"),
    (["cluster.hang_timeout_s=-1"], "cluster.hang_timeout_s=-1"),
    (["cluster.fault_timeout_s=30"], "cluster.stop_grace_s"),
    (["cluster=local", "cluster.memory_per_machine=4G"], "cluster.memory_per_machine: only cluster=netns"),
    (["cluster=netns", "cluster.memory_per_machine=lots"], "cluster.memory_per_machine='lots' is not a size"),
    (["cluster=netns", "cluster.memory_per_machine=1M"], "cluster.memory_per_machine=1M: must be at least 16 MiB"),
    (["cluster=netns", "cluster.cpus_per_machine=0"], "cluster.cpus_per_machine=0.0: must be a number of CPUs"),
])
def test_bad_numbers_are_one_line_naming_the_key(parts, tmp_path, overrides, expect):
    from degnn.launch.preflight import check_config
    msg = one_line_error(lambda: check_config(cfg_of(*overrides)))
    assert expect in msg, msg
    # make_plan (and so launch) checks them too
    one_line_error(lambda: make_plan(cfg_of(*overrides), str(tmp_path), parts[1], []))


def _cli(tmp_path, *overrides, umask=None):
    return subprocess.run([PY, "-m", "degnn.launch", f"partition.root={tmp_path / 'parts'}",
                           f"dataset.root={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}",
                           *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=budget(120), preexec_fn=None if umask is None else lambda: os.umask(umask))


@pytest.mark.parametrize("overrides,expect", [
    (["train.batch_size=-1"], "train.batch_size=-1"),
    (["cluster=netns", "cluster.machines=100", "cluster.bandwidth=1gbit"], "cluster.machines=100"),
    (["resume=/nonexistent/run"], "resume=/nonexistent/run: no such directory"),
])
def test_cli_refuses_before_partitioning(tmp_path, overrides, expect):
    r = _cli(tmp_path, *overrides)
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("degnn.launch: error:") and expect in lines[0], r.stderr
    assert not (tmp_path / "parts").exists() and not (tmp_path / "data").exists()


def test_cli_dry_run_prints_the_plan_before_building_anything(tmp_path):
    from degnn.partition_cache import ensure_partitions, planned_partitions

    r = _cli(tmp_path, "cluster=netns", "cluster.machines=2", "cluster.dry_run=true",
             "cluster.share_run_dir=true", umask=0o027)
    assert r.returncode == 0, r.stderr[-2000:]
    # cluster.share_run_dir=true: the user's own umask (the run directory is private by default)
    run = tmp_path / "run"
    modes = {str(p.relative_to(run)): stat.S_IMODE(p.stat().st_mode) for p in [run, *run.rglob("*")]}
    assert {".", ".hydra", ".hydra/config.yaml", "launch.log"} <= set(modes)
    assert all(m == (0o750 if (run / p).is_dir() else 0o640) for p, m in modes.items()), modes
    assert "  rank1 [trainer]" in r.stdout and "  server1 [server]" in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("partitions: ") and last.endswith(" (not built yet: a real run builds it first)")
    assert not (tmp_path / "parts").exists() and not (tmp_path / "data").exists()
    # the partition the plan names is the one a real run builds (and then finds)
    cfg = cfg_of("cluster=netns", "cluster.machines=2", f"partition.root={tmp_path / 'parts'}",
                 f"dataset.root={tmp_path / 'data'}")
    planned = last.split()[1]
    assert f"DGL_CONF_PATH={planned}" in r.stdout
    assert str(ensure_partitions(cfg.dataset, cfg.partition)) == planned
    assert planned_partitions(cfg.dataset, cfg.partition) == (Path(planned), True)


def test_help_describes_the_app_and_lists_the_groups_a_user_picks(tmp_path):
    r = subprocess.run([PY, "-m", "degnn.launch", "--help"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=budget(60))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "powered by Hydra" not in text and "--cleanup" in text and "cluster.dry_run=true" in text
    groups = text.split("== Groups (GROUP=OPTION) ==\n", 1)[1].split("\n\n", 1)[0]
    listed, group = {}, None
    for line in groups.splitlines():
        if not line.startswith(" "):
            group, line = line.split(":", 1)
        listed.setdefault(group, set()).update(o.strip() for o in line.split(",") if o.strip())
    conf = Path(CONF_DIR)
    on_disk = {d.name: {f.stem for f in d.glob("*.yaml")} for d in conf.iterdir()
               if d.is_dir() and d.name != "bench"}  # bench: `python -m benchmarks`'s own group
    assert listed == on_disk
    assert "tma_schema" not in text and "\nbench:" not in text


def test_cleanup_is_taken_anywhere_on_the_command_line():
    r = subprocess.run([PY, "-m", "degnn.launch", "train.epochs=1", "--cleanup"], cwd=REPO,
                       capture_output=True, text=True, timeout=budget(60))
    # the clean-up's own argument check answered: no run was composed or started
    assert r.returncode == 2 and "--cleanup takes only partition.root=DIR, got train.epochs=1" in r.stderr


def test_cli_resume_with_another_model_is_refused_before_partitioning(tmp_path):
    import torch
    prev = tmp_path / "prev"
    prev.mkdir()
    torch.save({"model": {}, "optimizer": {}, "state": {"epoch": 1}, "rng": [{}],
                "config": {"model.hidden": 16, "dataset.name": "synthetic-tiny"}},
               prev / "checkpoint.pt")
    r = _cli(tmp_path, f"resume={prev}", "model.hidden=32")
    assert r.returncode == 2, r.stderr
    assert (f"{prev / 'checkpoint.pt'} was written with model.hidden=16, this run has "
            f"model.hidden=32" in r.stderr), r.stderr
    assert r.stderr.strip().count("\n") == 0 and not (tmp_path / "parts").exists()
    (prev / "checkpoint.pt").write_bytes(b"\x00garbage")
    r = _cli(tmp_path, f"resume={prev}")
    assert r.returncode == 2 and str(prev / "checkpoint.pt") in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_failure_summary_keeps_the_epochs_done(tmp_path):
    from degnn.launch.launcher import write_failure
    from degnn.launch.plan import Proc
    curve = [{"epoch": 1, "train_time_s": 1.0, "wall_s": 1.5, "loss": 2.0, "val": 0.4, "test": 0.3},
             {"epoch": 2, "train_time_s": 2.0, "wall_s": 3.0, "loss": 1.5, "val": 0.6, "test": 0.5},
             {"epoch": 3, "train_time_s": 3.0, "wall_s": 4.5, "loss": 1.2, "val": 0.5, "test": 0.45}]
    (tmp_path / "curve.jsonl").write_text("".join(json.dumps(c) + "\n" for c in curve))
    dead = Proc("trainer", 1, 1, [], {}, str(tmp_path / "rank1.log"))
    s = write_failure(str(tmp_path), cfg_of(), "trainer rank 1 was killed", dead, 2, 2)
    assert s["status"] == "failed" and s["error"] == "trainer rank 1 was killed"
    assert (s["epochs"], s["best_val"], s["test"], s["best_epoch"], s["test_final"]) == (3, 0.6, 0.5, 2, 0.45)
    assert s["train_time_s"] == 3.0 and s["wall_s"] == 4.5
    # rank 0 never wrote its config.yaml: the launcher's composed one stands in for the reports
    from omegaconf import OmegaConf
    assert OmegaConf.load(tmp_path / "config.yaml").pipeline.name == cfg_of().pipeline.name
    # a pipeline that stopped itself keeps its own reason
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "error": "diverged at epoch 4",
                                                       "epochs": 3}))
    s = write_failure(str(tmp_path), cfg_of(), "trainer rank 0 exited with code 1", None, 2, 2)
    assert s["error"] == "diverged at epoch 4" and s["stopped_by"] == "trainer rank 0 exited with code 1"


def test_ssh_preflight_names_the_host_and_the_fix(parts, tmp_path, monkeypatch):
    # the check command, run by `sh -c` instead of ssh (what the remote shell would run)
    monkeypatch.setattr(ssh, "ssh_base", lambda host, port=22, user=None: ["sh", "-c"])
    env = {"PYTHONPATH": str(REPO)}
    # and names gloo's interface there: the one towards the first machine, or the one given
    assert ssh.check_hosts(["10.0.0.1", "10.0.0.2"], PY, [parts[2]], probe="127.0.0.1",
                           workspace=str(REPO), env=env) == {"10.0.0.1": "lo", "10.0.0.2": "lo"}
    assert ssh.check_hosts(["10.0.0.1"], PY, [parts[2]], ifname="lo", env=env) == {"10.0.0.1": "lo"}
    msg = one_line_error(lambda: ssh.check_hosts(["10.0.0.1"], PY, [parts[2]], ifname="nosuch0",
                                                 env=env))
    assert msg.startswith("host 10.0.0.1: no network interface nosuch0 (it has lo") and \
        "cluster.ifname" in msg
    msg = one_line_error(lambda: ssh.check_hosts(["10.0.0.1"], PY, [str(tmp_path / "nope.json")],
                                                 env=env))
    assert msg.startswith("host 10.0.0.1: cannot read") and "same path" in msg
    bare = tmp_path / "bare"  # an interpreter without hydra/dgl: what `python3` on a PATH often is
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    msg = one_line_error(lambda: ssh.check_hosts(["10.0.0.2"], str(bare / "bin" / "python"), [parts[2]]))
    assert msg.startswith("host 10.0.0.2: ") and "cannot import" in msg and "cluster.python=" in msg
    monkeypatch.setattr(ssh, "ssh_base", lambda host, port=22, user=None: ["sh", "-c", "exit 255", "-"])
    msg = one_line_error(lambda: ssh.check_hosts(["10.0.0.3"], PY, [parts[2]]))
    assert msg.startswith("host 10.0.0.3: ssh failed")


def test_ctrl_c_while_the_dataset_builds_is_one_line(tmp_path):
    data = tmp_path / "data"
    p = subprocess.Popen([PY, "-m", "degnn.launch", "dataset=synthetic-small", f"dataset.root={data}",
                          f"partition.root={tmp_path / 'parts'}", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = interrupt_when(p, data.exists, wait_s=120, settle_s=0.5)
    lines = [l for l in err.splitlines() if l.strip()]
    assert p.returncode == 130 and len(lines) == 1, err[-3000:]
    assert lines[0] == ("degnn.launch: error: interrupted while preparing the dataset and partitions; "
                        "nothing was started")
