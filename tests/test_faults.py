"""Faults at the edges (docs/design.md, "Fault policy"): an unusable run directory, a full disk
(also mid-checkpoint), SIGHUP, Ctrl-C pressed again while stopping, a launcher killed while
writing a partition, the failed process's real error as the last line, a kernel OOM kill, bad keys
and inputs refused before partitioning, the random partitioner's own stream, a diverged TMA round, a
/dev/shm too small for the parts, damaged partitions (cached, or made elsewhere), a sweep whose
job fails, resume= with the run's own config."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from degnn.config import CONF_DIR, register_configs
from degnn.launch import LaunchError
from degnn.launch.cleanup import remove_dead_partition_temps
from degnn.launch.faults import first_error, oom_note
from degnn.launch.launcher import free_port
from degnn.launch.preflight import check_config, check_run_dir

import fake_entry
from netns_support import needs_netns
from timing import budget

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
register_configs()


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _cli(tmp_path, *overrides, run_dir=None):
    flags = [o for o in overrides if o.startswith("-")]  # Hydra's (-m) before the overrides
    return subprocess.run([PY, "-m", "degnn.launch", *flags, f"partition.root={tmp_path / 'parts'}",
                           f"dataset.root={tmp_path / 'data'}", f"hydra.run.dir={run_dir or tmp_path / 'run'}",
                           *[o for o in overrides if not o.startswith("-")]],
                          cwd=REPO, capture_output=True, text=True, timeout=budget(120))


def _one_error_line(r) -> str:
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("degnn.launch: error: ") and "Traceback" not in r.stderr
    return lines[0]


# ---- refused before anything starts ------------------------------------------------------------
def _tmpfs(path: Path, options: str):
    """A small tmpfs mounted at `path` for the test (skipped without root), unmounted after."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip(f"mounting a tmpfs ({options}) needs root")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def readonly_dir(tmp_path):
    yield from _tmpfs(tmp_path / "ro", "ro,size=64k")


def test_unusable_run_directories_are_one_line(tmp_path, readonly_dir):
    (tmp_path / "file").write_text("x")
    for path, expect in [("/proc/degnn-run", "cannot create or write the run directory"),
                         (str(tmp_path / "file"), "is an existing file"),
                         (str(readonly_dir / "run"), "read-only file system")]:
        with pytest.raises(LaunchError) as e:
            check_run_dir(path)
        assert str(e.value).startswith(f"hydra.run.dir={path}: ") and expect in str(e.value)
    check_run_dir(str(tmp_path / "new" / "run"))  # a writable one is made, nothing left in it
    assert os.listdir(tmp_path / "new" / "run") == []
    # from the command line: one line, no Hydra traceback, nothing partitioned
    line = _one_error_line(_cli(tmp_path, run_dir=readonly_dir / "run"))
    assert "read-only file system" in line and not (tmp_path / "parts").exists()


@pytest.mark.parametrize("overrides,expect", [
    (["+train.epochz=3"], "+train.epochz: the config has no such key"),
    (["pipeline=tma", "+pipeline.sync_evry=3s"], "pipeline.sync_evry: pipeline=tma has no such key"),
    (["model.fanouts=[-2,10]"], "each fan-out must be an integer >= 1 (or -1: every neighbour), got -2"),
    (["model.fanouts=[0,10]"], "got 0"),
    (["model.layers=0"], "model.layers=0: must be an integer >= 1"),
    (["model.layers=3"], "e.g. model.fanouts=[10,10,10]"),
    (["cluster=netns", "cluster.machines=2", "cluster.subnet=notasubnet"], "cluster.subnet=notasubnet: must be"),
    # bad model sizes: DGL's C++ code (hidden=0) or a traceback (hidden<0, heads=0) once started
    (["model.hidden=0"], "model.hidden=0: must be an integer >= 1 (the width of the hidden layers)"),
    (["model.hidden=-4"], "model.hidden=-4: must be an integer >= 1"),
    (["model=gat", "model.heads=0"], "model.heads=0: must be an integer >= 1 (the attention heads"),
    (["model=gat", "model.hidden=130"], "model.hidden=130: model=gat splits it over model.heads=4 heads, "
                                        "so it must be a multiple of them, e.g. model.hidden=128"),
    (["model.layers=-1"], "model.layers=-1: must be an integer >= 1"),
    (["model.dropout=1"], "model.dropout=1.0: must be in [0, 1)"),
    (["model.dropout=-0.1"], "model.dropout=-0.1: must be in [0, 1)"),
    (["model.fanouts=[10,-3]"], "got -3"),
    (["model.backend=cuda"], "model.backend=cuda: choose dgl (DGL's layers), torch"),
    (["train.batch_size=0"], "train.batch_size=0: must be an integer >= 1"),
    (["train.lr=0"], "train.lr=0.0: must be a finite number > 0"),
    (["train.lr=-0.1"], "train.lr=-0.1: must be a finite number > 0"),
    (["train.eval_fanouts=[10]"], "train.eval_fanouts=[10]: give one fan-out per layer (model.layers=2)"),
    (["train.eval_fanouts=[10,0]"], "each >= 1 or -1"),
    (["train.eval_hidden_dtype=int8"], "train.eval_hidden_dtype=int8: choose float32 or float16"),
    (["train.eval_max_nodes=100"], "only a sampled evaluation (train.eval_fanouts) takes a subset"),
    (["train.eval_fanouts=[5,5]", "train.eval_max_nodes=-1"], "train.eval_max_nodes=-1: must be an integer >= 0"),
    (["pipeline=tma", "train.eval_fanouts=[10,10]"], "pipeline=tma evaluates its averaged model over every node"),
    (["dataset=synthetic-tiny-link", "train.eval_fanouts=[10,10]"], "scores node tasks only"),
    (["cluster.server_edges=out"], "cluster.server_edges=out: must be inner"),
])
def test_bad_keys_fanouts_and_subnet_are_refused(overrides, expect):
    from degnn.models import check_model_config
    cfg = cfg_of(*overrides)
    with pytest.raises((LaunchError, ValueError)) as e:
        check_config(cfg)  # what the launcher checks first, then the model's own
        check_model_config(cfg.model)
    assert expect in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("overrides,expect", [
    (["train.epochz=3"], "train.epochz: the config has no such key; fix its spelling (train has epochs, batch_size, "),
    (["pipeline=lamp", "pipeline.bitz=3"], "pipeline.bitz: the config has no such key; fix its spelling "
                                           "(pipeline has name, services, codec, bits, "),
    (["trainz.x=3"], "trainz: the config has no such key; fix its spelling (the top level has dataset, model, "),
    (["train.epochs=abc"], "train.epochs=abc: not an int (e.g. train.epochs=20)"),
    (["train.batch_size=1.5"], "train.batch_size=1.5: not an int (e.g. train.batch_size=1024)"),
    (["train.lr=fast"], "train.lr=fast: not a float (e.g. train.lr=0.003)"),
    (["train.profile=maybe"], "train.profile=maybe: not a bool (true or false) (e.g. train.profile=false)"),
    (["model.fanouts=[a,b]"], "model.fanouts=[a,b]: model.fanouts[0]=a is not an int"),
    (["cluster.machines=null"], "cluster.machines=null: cluster.machines cannot be null"),
    (["model=gcnn"], "model=gcnn: there is no such model config (the choices: gat, gcn, sage)"),
    (["train.lr=[1,"], "train.lr=[1,: cannot parse this override"),
])
def test_mistyped_keys_and_values_are_one_line(overrides, expect):
    from degnn.launch.preflight import config_error_line
    with pytest.raises(Exception) as e:  # what Hydra raises while it composes the command line
        cfg_of(*overrides)
    line = config_error_line(e.value)
    assert line.startswith(expect) and "\n" not in line, line


@pytest.mark.parametrize("overrides,expect", [
    (["train.epochz=3"], "degnn.launch: error: train.epochz: the config has no such key"),
    (["-m", "train.epochs=1,abc"], "degnn.launch: error: train.epochs=abc: not an int"),
    (["model.hidden=0"], "degnn.launch: error: model.hidden=0: must be an integer >= 1"),
])
def test_the_launcher_refuses_bad_keys_and_sizes_in_one_line_leaving_nothing(tmp_path, overrides, expect):
    # Hydra's own message is several lines with exit status 1; a bad size died in DGL's C++ code
    run_dir = tmp_path / "new" / "run"
    r = _cli(tmp_path, *overrides, f"hydra.sweep.dir={run_dir}", run_dir=run_dir)
    assert _one_error_line(r).startswith(expect)
    assert not (tmp_path / "new").exists() and not (tmp_path / "parts").exists()


def test_a_used_or_busy_run_directory_is_refused(tmp_path):
    from degnn.launch.preflight import check_run_dir_unused, lock_run_dir
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("old run\n")
    check_run_dir_unused(str(run))  # Hydra's files alone (a run refused before it started): reusable
    (run / "curve.jsonl").write_text('{"epoch": 1}\n')
    with pytest.raises(LaunchError) as e:
        check_run_dir_unused(str(run))
    assert str(e.value) == (f"hydra.run.dir={run}: holds another run's results (curve.jsonl); pick a new "
                            f"hydra.run.dir (or remove that run's directory), or continue that run with "
                            f"resume={run}")
    check_run_dir_unused(str(run), resume=str(run))  # resuming it in place
    # a fresh run into it (it appended epochs 1-3 to the old run's 1-8): one line, the old run untouched
    line = _one_error_line(_cli(tmp_path, "cluster.dry_run=true", run_dir=run))
    assert line == f"degnn.launch: error: {e.value}"
    assert (run / ".hydra" / "config.yaml").read_text() == "old run\n"
    assert (run / "curve.jsonl").read_text() == '{"epoch": 1}\n'
    # two runs at once in one directory (both said "ok"): the second is refused while the first holds it
    busy = tmp_path / "busy"
    busy.mkdir()
    fd = lock_run_dir(str(busy))
    try:
        with pytest.raises(LaunchError, match=f"another launcher \\(pid {os.getpid()}\\) is running in this"):
            lock_run_dir(str(busy))
        line = _one_error_line(_cli(tmp_path, "cluster.dry_run=true", run_dir=busy))
        assert line == (f"degnn.launch: error: hydra.run.dir={busy}: another launcher (pid {os.getpid()}) is "
                        f"running in this directory now; wait until it ends, or pick another hydra.run.dir")
        assert sorted(os.listdir(busy)) == [".degnn.lock"]  # Hydra wrote nothing there
    finally:
        os.close(fd)
    os.close(lock_run_dir(str(busy)))  # free again once the first launcher is gone
    # a run refused before it starts leaves an existing directory as it found it (no lock file)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "train.epochz: the config has no such key" in _one_error_line(_cli(tmp_path, "train.epochz=3",
                                                                              run_dir=empty))
    assert os.listdir(empty) == []


def _custom_graph(path, graph=None, label=None, **empty):
    import dgl
    g = dgl.rand_graph(60, 300) if graph is None else graph
    n = g.num_nodes()
    g.ndata["feat"] = torch.randn(n, 4)
    g.ndata["label"] = torch.arange(n) % 3 if label is None else label
    for i, key in enumerate(("train_mask", "val_mask", "test_mask")):
        m = (torch.arange(n) % 3 == i) if n >= 3 else torch.ones(n, dtype=torch.bool)
        g.ndata[key] = torch.zeros(n, dtype=torch.bool) if empty.get(key) else m
    dgl.save_graphs(str(path), [g])
    return str(path)


def _load_custom(path, *overrides):
    from degnn.data import load_dataset
    return load_dataset(cfg_of("dataset=custom", f"dataset.path={path}", *overrides).dataset)


def test_a_stray_label_is_refused_when_the_dataset_loads(tmp_path):
    from degnn.data import DatasetError
    # one label 200000 among 0..2: a model of 200,001 classes, out of memory once the cluster ran
    label = torch.arange(60) % 3
    label[7] = 200000
    with pytest.raises(DatasetError) as e:
        _load_custom(_custom_graph(tmp_path / "stray.bin", label=label))
    assert str(e.value) == (f"dataset custom: 200001 classes (the model would have an output per class) "
                            f"but the labels use only 4; the largest label is 200000, at node 7; fix that "
                            f"stray label, or set dataset.num_classes to the real count")
    # declared far beyond the labels present
    with pytest.raises(DatasetError) as e:
        _load_custom(_custom_graph(tmp_path / "ok.bin"), "dataset.num_classes=5000")
    assert "5000 classes (the model would have an output per class) but the labels use only 3" in str(e.value)
    assert _load_custom(tmp_path / "ok.bin", "dataset.num_classes=8").num_classes == 8  # a few unused: fine


@pytest.mark.parametrize("mask,what", [("train_mask", "training"), ("val_mask", "validation"),
                                       ("test_mask", "test")])
def test_a_label_outside_the_declared_classes_is_refused(mask, what):
    import dgl
    from degnn.data import DatasetError, GraphData, finalize
    g = dgl.rand_graph(30, 120)
    g.ndata["feat"] = torch.randn(30, 4)
    g.ndata["label"] = torch.arange(30) % 3
    for i, key in enumerate(("train_mask", "val_mask", "test_mask")):
        g.ndata[key] = torch.arange(30) % 3 == i
    node = {"train_mask": 9, "val_mask": 10, "test_mask": 11}[mask]
    g.ndata["label"][node] = 3  # the source declares 3 classes (ogb's meta, a generator's knob)
    data = GraphData(name="d", task="node", graph=g, num_classes=3, metric="acc", evaluate=None)
    with pytest.raises(DatasetError) as e:
        finalize(data, True)
    assert str(e.value) == (f"dataset d: 1 {what} node(s) have a label outside 0..2 (the dataset's 3 "
                            f"classes), e.g. node {node} has 3; fix those labels (or the dataset's class "
                            f"count, dataset.num_classes)")


def test_degenerate_graphs_are_refused_when_the_dataset_loads(tmp_path):
    import dgl
    from degnn.data import DatasetError
    loops = dgl.graph((torch.arange(30), torch.arange(30)), num_nodes=30)  # failed: "NoneType has no len()"
    for graph, expect in [(dgl.graph(([], []), num_nodes=30), "the graph has 30 nodes and no edges"),
                          (loops, "the graph's 30 edges are all self-loops (a node to itself)"),
                          (dgl.graph(([0], [0]), num_nodes=1), "the graph has 1 node; a GNN needs a graph "
                                                               "of two nodes or more")]:
        with pytest.raises(DatasetError) as e:
            _load_custom(_custom_graph(tmp_path / "g.bin", graph=graph))
        assert str(e.value).startswith(f"dataset custom: {expect}"), str(e.value)


@pytest.mark.parametrize("key", ["train_mask", "val_mask", "test_mask"])
def test_a_custom_graph_with_an_empty_split_is_refused(tmp_path, key):
    from degnn.data import DatasetError, load_dataset
    path = _custom_graph(tmp_path / "g.bin", **{key: True})
    with pytest.raises(DatasetError) as e:
        load_dataset(cfg_of("dataset=custom", f"dataset.path={path}").dataset)
    assert f"node data '{key}' selects no node" in str(e.value)
    ok = load_dataset(cfg_of("dataset=custom", f"dataset.path={_custom_graph(tmp_path / 'ok.bin')}").dataset)
    assert int(ok.graph.ndata["val_mask"].sum()) == 20


# ---- the random partitioner's stream ---------------------------------------------------------------
def test_random_parts_do_not_follow_labels_drawn_from_the_same_seed():
    from degnn.partition_cache import partition_settings
    from partitioners.assign import random_assignment
    from partitioners.stats import total_variation

    n, k, c = 40000, 4, 10
    labels = np.random.default_rng(0).integers(0, c, size=n)

    def tv_mean(part):
        overall = np.bincount(labels, minlength=c) / n
        return np.mean([total_variation(np.bincount(labels[part == p], minlength=c) / (part == p).sum(),
                                        overall) for p in range(k)])

    assert tv_mean(random_assignment(n, k, 0)) < 0.05
    # what drawing from the user's own stream gives (the partitioner's old behaviour)
    assert tv_mean(np.random.default_rng(0).integers(0, k, size=n)) > 0.05
    # a new stream is a new cache folder
    assert "stream" in partition_settings(cfg_of().dataset, cfg_of("partition=random").partition)


# ---- what the launcher says --------------------------------------------------------------------------
def test_first_error_is_the_real_error_not_a_library_banner():
    banner = ["LIBXSMM_VERSION: main_stable-1.17-3651", "Registry and code: 13 MB",
              "Command: python3 -m degnn.train", "Uptime: 5.24 s"]
    cpp = ["starting", "terminate called after throwing an instance of 'std::bad_alloc'",
           "  what():  std::bad_alloc", *banner]
    assert first_error(cpp) == "what():  std::bad_alloc"
    py = ["x", "Traceback (most recent call last):", '  File "a.py", line 1', "    f()",
          "ValueError: bad", "error: trainer process failed (traceback above)", *banner]
    assert first_error(py) == "ValueError: bad"
    assert first_error(banner) is None
    # a library's error lines, then degnn's own one line that sums them up: that line
    gloo = ["[debug_logger.cc:9] ERROR failed to connect, local=[127.0.0.1]:1",
            "error: gloo on host m1 bound 127.0.0.1 (...): set cluster.ifname=<...>"]
    assert first_error(gloo) == gloo[1]


def test_a_sigkill_names_the_oom_killer_or_hints_at_it(monkeypatch):
    from degnn.launch import faults
    monkeypatch.setattr(faults, "_dmesg_oom", lambda pid: None)  # the kernel log unreadable
    monkeypatch.setattr(faults, "oom_counts", lambda: {"/cg/memory.events": 3})
    assert oom_note(1, {"/cg/memory.events": 2}).startswith("out of memory: the kernel's OOM killer")
    # outside any cgroup it can read, the host's own count (/proc/vmstat oom_kill) rose
    monkeypatch.setattr(faults, "oom_counts", lambda: {faults.VMSTAT: 5})
    assert "killed 1 process(es) on this host" in oom_note(1, {faults.VMSTAT: 4})
    monkeypatch.setattr(faults, "oom_counts", lambda: {})
    assert oom_note(1, {}) == "out of memory? the kernel's record could not be read"
    monkeypatch.setattr(faults, "_dmesg_oom", lambda pid: "Killed process 1 (python) total-vm:1kB")
    assert "dmesg: Killed process 1" in oom_note(1, {})


def _run(run_dir, part, *overrides, env=None, signals=(), ready=None, timeout=90):
    """The launcher (fake entry, cluster=local) in a subprocess; `signals`: (signal, delay after
    the previous one) sent once `ready(run_dir)` holds. Returns (rc, out, err, seconds)."""
    p = subprocess.Popen([PY, "-c", fake_entry.RUNNER, str(run_dir), part, "cluster=local",
                          f"cluster.port={free_port()}", *overrides], cwd=REPO,
                         env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    try:
        if signals:
            deadline = time.monotonic() + budget(60)
            while not ready(run_dir) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert p.poll() is None, p.communicate()[1][-3000:]
            t0 = time.monotonic()
            for sig, delay in signals:
                time.sleep(delay)
                p.send_signal(sig)
        out, err = p.communicate(timeout=budget(timeout))
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        fake_entry.remove_shm_markers(str(run_dir))
    return p.returncode, out, err, time.monotonic() - t0


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    return fake_entry.make_partition(str(tmp_path_factory.mktemp("parts") / "p1"), 1)


def _all_started(run_dir) -> bool:
    return all((Path(run_dir) / f"fake_rank{r}.json").exists() for r in (0, 1))


def _nothing_left(run_dir) -> None:
    deadline = time.monotonic() + budget(5)
    while fake_entry.processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not fake_entry.processes_mentioning(str(run_dir))


def test_the_fault_line_is_last_and_names_the_real_error(part, tmp_path):
    run_dir = tmp_path / "run"
    rc, out, err, _ = _run(run_dir, part, "cluster.trainers_per_machine=2", "cluster.stop_grace_s=5",
                           env={"FAKE_FAIL_RANK": "1", "FAKE_FAIL_AFTER": "1", "FAKE_FAIL_TRACEBACK": "1",
                                "FAKE_NOISE": "1"})
    assert rc == 1, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("degnn.launch: run failed: trainer rank 1 (machine 0) pid"), err[-3000:]
    assert "exited with code 1: ValueError: fan-out -2 is not a number of neighbours" in lines[-1]
    assert not any(b in err for b in ("Registry and code", "Uptime"))  # LIBXSMM's banner
    # rank 0 (on the console) answered the stop with DGL's noise: in its log, not after the fault
    assert "User pressed Ctrl+C" in (run_dir / "rank0.log").read_text()
    assert "User pressed Ctrl+C" not in out and "terminate called" not in out
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and "ValueError: fan-out -2" in s["error"]


def test_sighup_stops_a_run_like_sigterm(part, tmp_path):
    run_dir = tmp_path / "run"
    rc, out, err, _ = _run(run_dir, part, "cluster.trainers_per_machine=2", env={"FAKE_FAIL_RANK": "9"},
                           signals=[(signal.SIGHUP, 0.2)], ready=_all_started)
    assert rc == 128 + signal.SIGHUP, err[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("interrupted by SIGHUP")
    assert err.strip().splitlines()[-1] == f"degnn.launch: run failed: {s['error']}"
    _nothing_left(run_dir)


def test_a_second_ctrl_c_does_not_cut_the_clean_up_short(part, tmp_path):
    run_dir = tmp_path / "run"
    # the processes ignore SIGTERM: stopping takes the whole grace period, then SIGKILL
    rc, out, err, took = _run(run_dir, part, "cluster.trainers_per_machine=2", "cluster.stop_grace_s=2",
                              env={"FAKE_FAIL_RANK": "9", "FAKE_IGNORE_TERM": "1"},
                              signals=[(signal.SIGINT, 0.2), (signal.SIGINT, 0.5)], ready=_all_started)
    assert rc == 130, err[-3000:]
    assert "SIGINT received while stopping: the clean-up goes on" in err
    assert took >= 2, (took, err)  # the grace period was not cut
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("interrupted by SIGINT")
    _nothing_left(run_dir)


def test_a_third_ctrl_c_leaves_and_says_what_it_left(part, tmp_path):
    run_dir = tmp_path / "run"
    rc, out, err, took = _run(run_dir, part, "cluster.trainers_per_machine=2", "cluster.stop_grace_s=20",
                              env={"FAKE_FAIL_RANK": "9", "FAKE_IGNORE_TERM": "1"},
                              signals=[(signal.SIGINT, 0.2), (signal.SIGINT, 0.3), (signal.SIGINT, 0.3)],
                              ready=_all_started)
    assert rc == 130 and took < 10, (took, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert "SIGINT received 3 times: leaving without finishing the clean-up; left: processes server0 pid" in last
    assert "rank0 pid" in last and "rank1 pid" in last
    assert "--cleanup" in last
    _nothing_left(run_dir)  # they die with the launcher (parent-death signal)


@pytest.fixture
def tiny_disk(tmp_path):
    yield from _tmpfs(tmp_path / "disk", "size=64k")


def test_a_full_disk_leaves_no_broken_summary_and_says_so(part, tiny_disk):
    run_dir = tiny_disk / "run"
    rc, out, err, _ = _run(run_dir, part, "cluster.trainers_per_machine=2",
                           env={"FAKE_FAIL_RANK": "1", "FAKE_FAIL_AFTER": "0.5", "FAKE_FILL_DISK": "1"})
    assert rc == 1 and "Traceback" not in err, err[-3000:]
    assert not (run_dir / "summary.json").exists()  # absent, with the reason on the console:
    assert f"{run_dir / 'summary.json'} not written (No space left on device); the file system of " in err
    assert "is full" in err
    last = err.strip().splitlines()[-1]
    # rank 1 filled the disk; another process may die of it first (a write of its own fails, a
    # server's log included): whichever it is, it is named and the line says the disk is full
    assert last.startswith(("degnn.launch: run failed: trainer rank ", "degnn.launch: run failed: server ")), last
    assert "is full" in last
    assert not [f for f in os.listdir(run_dir) if f.startswith(".summary.json")]
    _nothing_left(run_dir)


def test_a_kernel_oom_kill_says_so(part, tmp_path):
    cg = Path(f"/sys/fs/cgroup/memory/degnn-test-{uuid.uuid4().hex[:8]}")
    try:
        cg.mkdir()
    except OSError:
        pytest.skip("no cgroup v1 memory controller to limit here")
    try:
        join = f"import os, sys; open('{cg}/cgroup.procs', 'w').write(str(os.getpid())); "
        # what one process of this environment takes once it imported torch and DGL (about 180 MiB
        # with CI's CPU build of torch, 265 with PyPI's CUDA build): the limit leaves the launcher,
        # one server and two trainers that much each, plus room, and rank 1 eats past it
        subprocess.run([PY, "-c", join + "import torch, dgl, degnn.launch"], cwd=REPO, check=True)
        each = int((cg / "memory.max_usage_in_bytes").read_text()) >> 20
        limit = 4 * each + 300
        (cg / "memory.limit_in_bytes").write_text(str(limit << 20))
        swap = cg / "memory.memsw.limit_in_bytes"
        if swap.exists():
            try:
                swap.write_text(str(limit << 20))
            except OSError:
                pass
        run_dir = tmp_path / "run"
        # the launcher and its processes run in the limited cgroup; rank 1 eats more than it allows
        r = subprocess.run([PY, "-c", join + "exec(sys.argv.pop(1))", fake_entry.RUNNER, str(run_dir), part,
                            "cluster=local", f"cluster.port={free_port()}", "cluster.trainers_per_machine=2"],
                           cwd=REPO, env={**os.environ, "FAKE_FAIL_RANK": "1", "FAKE_EAT_MB": str(limit + 1000)},
                           capture_output=True, text=True, timeout=budget(90))
        fake_entry.remove_shm_markers(str(run_dir))
        assert r.returncode != 0 and "trainer rank 1 (machine 0) pid" in r.stderr, r.stderr[-3000:]
        assert "was killed by SIGKILL (out of memory: the kernel's OOM killer" in r.stderr, r.stderr[-3000:]
        _nothing_left(run_dir)
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


# ---- a launcher killed while it writes a partition --------------------------------------------------------
WRITE_AND_HANG = r"""
import sys, time
from pathlib import Path
import partitioners.folder as folder
from degnn.partition_cache import ensure_partitions
from hydra import compose, initialize_config_dir
from degnn.config import CONF_DIR, register_configs
register_configs()
def stuck(graph, part, num_parts, out, *a, **k):
    Path(out).mkdir(parents=True)
    (Path(out) / "part0").mkdir()
    (Path(out) / "part0" / "graph.dgl").write_bytes(b"\0" * 4096)
    time.sleep(600)
folder.write_partitions = stuck
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = compose("config", overrides=sys.argv[1:])
ensure_partitions(cfg.dataset, cfg.partition)
"""


def test_cleanup_removes_a_partition_half_written_by_a_killed_launcher(tmp_path):
    root = tmp_path / "parts"
    p = subprocess.Popen([PY, "-c", WRITE_AND_HANG, f"partition.root={root}", f"dataset.root={tmp_path / 'data'}"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + budget(60)
        temps = []
        while not temps and time.monotonic() < deadline and p.poll() is None:
            temps = list(root.glob("*/.*.tmp-*/part0/graph.dgl"))
            time.sleep(0.05)
        assert temps, p.communicate()[1][-3000:] if p.poll() is not None else "no temporary folder"
        # a live writer's folder is left alone
        assert remove_dead_partition_temps([str(root)]) == [] and temps[0].exists()
        p.kill()  # SIGKILL: no clean-up of its own
        p.communicate()
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    tmp = temps[0].parents[1]
    assert tmp.exists()
    r = subprocess.run([PY, "-m", "degnn.launch", "--cleanup", f"partition.root={root}"], cwd=REPO,
                       capture_output=True, text=True, timeout=budget(60))
    assert r.returncode == 0 and f"removed partition folder {tmp} (half written by process {p.pid}" in r.stdout
    assert not tmp.exists()


# ---- Ctrl-C while the launcher still imports torch -------------------------------------------------------
def test_ctrl_c_while_torch_imports_is_one_line(tmp_path):
    # Ctrl-C once torch has begun to load (the launcher's memory map shows libtorch). A signal that
    # lands at some points of the import is lost to the library being imported (seen in the full
    # suite: the run then went on), so this presses Ctrl-C again every 0.2 s, as a user would,
    # until the launcher is gone: it must still end in one line, exit 130, no traceback.
    p = subprocess.Popen([PY, "-m", "degnn.launch", f"hydra.run.dir={tmp_path / 'run'}", f"dataset.root={tmp_path / 'data'}",
                          f"partition.root={tmp_path / 'parts'}"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def torch_loading():
        try:
            return "libtorch" in Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            return False

    try:
        deadline = time.monotonic() + budget(60)
        while time.monotonic() < deadline and p.poll() is None and not torch_loading():
            time.sleep(0.01)
        assert p.poll() is None, "the launcher was gone before torch loaded"
        presses, until = 0, time.monotonic() + budget(20)  # a loaded host imports torch for longer
        while p.poll() is None and time.monotonic() < until:
            p.send_signal(signal.SIGINT)
            presses += 1
            time.sleep(0.2)
        out, err = p.communicate(timeout=budget(60))
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    lines = [l for l in err.splitlines() if l.strip()]
    assert p.returncode == 130 and len(lines) == 1 and "Traceback" not in err, (presses, err[-3000:])
    assert lines[0].startswith("degnn.launch: error: interrupted")


# ---- TMA: a diverged run, and its failure summary in rounds -------------------------------------------
# (the diverged run end to end: tests/test_tma_rounds.py drives the real RoundLoop, coordinator and
# RunRecord over fake pipelines; the launcher's last line for a diverged run: tests/test_runtime.py)
def test_the_coordinator_calls_a_round_diverged_when_every_trained_loss_is_not_finite():
    from degnn.pipelines.tma.coordinator import Coordinator
    c = Coordinator([0, 1], round_timeout_s=5, start_timeout_s=60, evaluator_timeout_s=10)
    for r, losses in ((1, (0.5, float("nan"))), (2, (float("inf"), float("nan")))):
        for rank, loss in enumerate(losses):
            c.submit(r, rank, torch.ones(2), {"stats": {"loss": loss, "round_steps": 3}}, now=float(r))
        meta = c.poll_mean(r, 0, float(r))[2]
        assert ("diverged" in meta) == (r == 2), meta
    assert meta["diverged"].startswith("diverged at round 2: the training loss of every live trainer (ranks 0, 1)")
    # a trainer that did not train (no training nodes) has no say
    c.submit(3, 0, torch.ones(2), {"stats": {"loss": float("nan"), "round_steps": 0}}, now=3.0)
    c.submit(3, 1, torch.ones(2), {"stats": {"loss": 0.7, "round_steps": 3}}, now=3.0)
    assert "diverged" not in c.poll_mean(3, 0, 3.0)[2]


def test_a_failed_tma_runs_summary_counts_rounds(tmp_path):
    from degnn.launch.launcher import write_failure
    curve = [{"round": r, "epoch": 57.0 * r, "train_time_s": 2.0 * r, "wall_s": 3.0 * r, "val": v, "test": t}
             for r, v, t in ((1, 0.5, 0.4), (2, 0.7, 0.6), (3, 0.6, 0.55))]
    (tmp_path / "curve.jsonl").write_text("".join(json.dumps(c) + "\n" for c in curve))
    s = write_failure(str(tmp_path), cfg_of("pipeline=tma"), "trainer rank 0 was killed", None, 2, 2)
    assert (s["epochs"], s["best_epoch"], s["best_val"], s["test_final"]) == (3, 2, 0.7, 0.55)
    assert json.loads((tmp_path / "summary.json").read_text())["epochs"] == 3
    assert "trainers_died" not in s
    # every trainer died: the failure summary records them, as a finished run's does
    s = write_failure(str(tmp_path), cfg_of("pipeline=tma"), "every trainer died", None, 2, 2,
                      dead_trainers=[1, 0])
    assert s["trainers_died"] == [0, 1]


def test_a_full_disk_mid_checkpoint_keeps_the_old_checkpoint_and_says_so(tiny_disk):
    from degnn.runtime.checkpoint import CheckpointError, load_checkpoint, save_atomic

    path = tiny_disk / "checkpoint.pt"
    old = {"model": {"w": torch.arange(100.0)}, "optimizer": {}, "state": {"epoch": 1}, "rng": []}
    save_atomic(path, old)  # fits the 64 KiB disk
    new = {"model": {"w": torch.ones(40_000)}, "optimizer": {}, "state": {"epoch": 2}, "rng": []}
    with pytest.raises(CheckpointError) as e:
        save_atomic(path, new)  # 160 KB: does not
    line = str(e.value)
    assert "\n" not in line and "basic_ios" not in line
    assert line.startswith(f"{path} not written: the disk is full (it needs 16") and " bytes, " in line
    assert "the previous checkpoint.pt is kept" in line
    assert os.listdir(tiny_disk) == ["checkpoint.pt"]  # no temporary file left
    assert load_checkpoint(path)["state"]["epoch"] == 1 and torch.equal(
        load_checkpoint(path)["model"]["w"], old["model"]["w"])
    (tiny_disk / "checkpoint.pt").unlink()
    with pytest.raises(CheckpointError, match="no checkpoint.pt was written"):
        save_atomic(path, new)
    assert os.listdir(tiny_disk) == []


def test_a_dev_shm_too_small_for_the_parts_is_refused_before_start(part, tmp_path):
    """The launcher in a private mount namespace whose /dev/shm is a 4 KiB tmpfs (Docker gives 64 MB)."""
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace with a small /dev/shm needs root")
    run_dir = tmp_path / "run"
    runner = [PY, "-c", fake_entry.RUNNER, str(run_dir), part, "cluster=local",
              "cluster.isolate=false", f"cluster.port={free_port()}"]
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs -o size=4k tmpfs /dev/shm && exec "$@"', "sh", *runner],
                       cwd=REPO, capture_output=True, text=True, timeout=budget(120))
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    sizes = int(1.05 * sum(os.path.getsize(os.path.join(os.path.dirname(part), "part0", f))
                           for f in ("graph.dgl", "node_feat.dgl", "edge_feat.dgl")))
    assert lines[0].startswith("degnn.launch: error: /dev/shm has 4096 bytes (0.0 MiB) free, but the "
                               f"graph server of machine 0 puts {sizes} bytes"), lines[0]
    assert "docker run --shm-size=" in lines[0] and "use more machines" in lines[0]
    assert not run_dir.exists() or not os.listdir(run_dir)  # nothing started, nothing written


def test_a_private_dev_shm_too_small_for_its_part_is_refused(part, monkeypatch):
    from degnn.launch import shm

    monkeypatch.setattr(shm, "private_shm_bytes", lambda: 1000)  # half of a 2000-byte host
    with pytest.raises(LaunchError, match=r"^machine 0's private /dev/shm \(a tmpfs of 50% of this "
                                          r"host's memory\) has 1000 bytes .* use more machines"):
        shm.check_shm("netns", True, part, [[0]])
    shm.check_shm("ssh", False, part, [[0]])  # a remote host's /dev/shm is not read from here
    monkeypatch.setattr(shm, "private_shm_bytes", lambda: 1 << 30)
    shm.check_shm("netns", True, part, [[0]])


def test_a_damaged_cached_partition_is_partitioned_again(tmp_path, monkeypatch, capsys):
    import dgl

    import degnn.data
    from degnn.config import DatasetConfig, PartitionConfig
    from degnn.partition_cache import ensure_partitions

    g = dgl.rand_graph(300, 2000)
    g.ndata["feat"] = torch.randn(300, 16)
    calls = []
    monkeypatch.setattr(degnn.data, "load_dataset", lambda cfg: calls.append(1) or
                        type("Data", (), {"graph": g})())
    ds = DatasetConfig(name="toy", kind="synthetic")
    pc = PartitionConfig(method="random", num_parts=2, root=str(tmp_path / "parts"))
    j = ensure_partitions(ds, pc)
    sums = json.loads((j.parent / "checksums.json").read_text())
    assert {"toy.json", "part0/graph.dgl", "part0/node_feat.dgl", "part1/edge_feat.dgl"} <= set(sums)
    feats = j.parent / "part0" / "node_feat.dgl"
    whole = feats.read_bytes()
    assert sums["part0/node_feat.dgl"]["bytes"] == len(whole)
    os.truncate(feats, len(whole) // 2)  # a disk that filled up, a copy cut short
    assert ensure_partitions(ds, pc) == j and len(calls) == 2
    assert feats.read_bytes() == whole  # the same seed writes the same part
    err = capsys.readouterr().err
    assert (f"degnn: the cached partition {j.parent} is damaged (part0/node_feat.dgl is "
            f"{len(whole) // 2} bytes, {len(whole)} when written): partitioning it again") in err
    flipped = bytearray(whole)
    flipped[-1] ^= 0xFF  # same size: only the full hash sees it
    feats.write_bytes(bytes(flipped))
    assert ensure_partitions(ds, pc) == j and len(calls) == 2
    pc.verify = True
    assert ensure_partitions(ds, pc) == j and len(calls) == 3 and feats.read_bytes() == whole
    assert "part0/node_feat.dgl has another sha256 than when written" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["graph.dgl", "node_feat.dgl"])
def test_a_truncated_foreign_part_file_is_named_by_its_path(tmp_path, monkeypatch, name):
    """What a graph server runs (DGL's load_partition, with degnn's readers installed) on a
    partition made by DGL (partition.path=) whose file was cut short."""
    from dgl.distributed import partition

    from degnn.runtime import mapped_feats

    monkeypatch.setattr(partition, "load_tensors", partition.load_tensors)  # put back after
    monkeypatch.setattr(partition, "load_graphs", partition.load_graphs)
    mapped_feats.install()
    j = fake_entry.make_partition(str(tmp_path / "p"), 1)
    f = tmp_path / "p" / "part0" / name
    os.truncate(f, f.stat().st_size - 100)
    with pytest.raises(mapped_feats.PartitionFileError) as e:
        partition.load_partition(j, 0, load_feats=True)
    assert str(e.value).startswith(f"the partition file {f} is ")
    assert "\n" not in str(e.value) and "copy it again or partition again" in str(e.value)


def test_a_sweep_runs_every_job_and_ends_with_their_table(tmp_path):
    """Job 0 is refused before it starts, jobs 1 and 2 run (dry runs: nothing is started)."""
    sweep = tmp_path / "sweep"
    r = _cli(tmp_path, "-m", "model.hidden=0,16,8", "cluster.dry_run=true", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "degnn.launch: error: model.hidden=0: must be an integer >= 1" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout.count("ip_config ") == 2  # both plans printed
    s = json.loads((sweep / "0" / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("model.hidden=0: must be an integer")
    table = r.stdout[r.stdout.index(f"sweep of 3 jobs in {sweep}: 2 ok, 1 failed"):].splitlines()[1:]
    assert [l.split()[:3] for l in table] == [["job", "overrides", "status"],
                                             ["0", "model.hidden=0", "failed"],
                                             ["1", "model.hidden=16", "ok"], ["2", "model.hidden=8", "ok"]]
    assert "must be an integer >= 1" in table[1]


@pytest.fixture
def lamp_run(tmp_path):
    """The directory of a non-default run (lamp, gat, 3 layers, 2 netns machines) with its
    config.yaml and a checkpoint, as rank 0 leaves them."""
    from omegaconf import OmegaConf

    from degnn.entry import compose_config
    from degnn.runtime.checkpoint import config_identity, save_atomic

    run = tmp_path / "old"
    run.mkdir()
    cfg = compose_config(["pipeline=lamp", "model=gat", "model.layers=3", "model.fanouts=[5,5,5]",
                 "model.hidden=64", "train.lr=0.01", "cluster=netns", "cluster.machines=2",
                 f"dataset.root={tmp_path / 'data'}", f"partition.root={tmp_path / 'parts'}"])
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    save_atomic(run / "checkpoint.pt", {"model": {}, "optimizer": {}, "state": {"epoch": 1},
                                        "rng": [{}, {}], "config": config_identity(cfg)})
    return run


def test_resume_composes_the_runs_own_config_under_the_overrides_given(lamp_run, tmp_path):
    from degnn.entry import compose_config
    from degnn.runtime.run_config import resume_group_overrides

    # what README shows: resume=DIR alone (a dry run: checked and planned, nothing started)
    r = _cli(tmp_path, f"resume={lamp_run}", "train.epochs=7", "cluster.dry_run=true")
    assert r.returncode == 0 and "error" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.count("[trainer]") == 2 and " model=gat pipeline=lamp " in r.stdout, r.stdout[-3000:]
    # every process composes the same config from the overrides it is given
    given = [f"resume={lamp_run}", "train.epochs=7", "train.lr=0.02"]
    cfg = compose_config(given + resume_group_overrides(lamp_run, given))
    assert (cfg.pipeline.name, cfg.model.name, cfg.model.layers, cfg.model.hidden) == ("lamp", "gat", 3, 64)
    assert list(cfg.model.fanouts) == [5, 5, 5] and cfg.cluster.kind == "netns" and cfg.cluster.machines == 2
    assert cfg.train.epochs == 7 and cfg.train.lr == 0.02  # the overrides given win
    assert cfg.dataset.root == str(tmp_path / "data")  # the run's own


def test_resume_refuses_an_override_that_changes_the_model_data_or_trainers(lamp_run, tmp_path):
    from degnn.entry import compose_config
    from degnn.runtime.run_config import resume_conflict, resume_group_overrides

    def line(override, was):
        return (f"resume={lamp_run}: that run was trained with {was} ({lamp_run}/config.yaml), this "
                f"command gives {override}; resume without {override.split('=')[0]}= (the run's own "
                f"value is used), or start a new run (without resume=)")

    r = _cli(tmp_path, f"resume={lamp_run}", "model.hidden=128", "cluster.dry_run=true")
    assert _one_error_line(r) == "degnn.launch: error: " + line("model.hidden=128", "model.hidden=64")
    for override, was in [("dataset=wordnet", "dataset=synthetic-tiny"), ("pipeline=tma", "pipeline=lamp"),
                          ("cluster.machines=3", "cluster.machines=2"),
                          ("model.fanouts=[5,5]", "model.fanouts=[5,5,5]")]:
        given = [f"resume={lamp_run}", override]
        given += resume_group_overrides(lamp_run, given)  # as the launcher adds them
        assert resume_conflict(compose_config(given), given) == line(override, was)
    for fine in ("train.epochs=9", "cluster=local", "dataset.root=/elsewhere", "model.hidden=64"):
        given = [f"resume={lamp_run}", fine]
        given += resume_group_overrides(lamp_run, given)
        assert resume_conflict(compose_config(given), given) is None
