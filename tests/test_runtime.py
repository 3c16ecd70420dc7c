"""The per-process entry, started exactly the way DGL's tools/launch.py starts it (no ssh).

One machine (127.0.0.1), one graph server, two trainers: DGL_* variables as launch.py sets them,
trainers wrapped by `torch.distributed.launch` (DGL 1.1.x: appends --local-rank=N). DGL 2.x's
`torch.distributed.run` sets LOCAL_RANK in the environment, the way degnn's own launcher starts
every process of the cluster tests, so it gets no run of its own here.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from degnn.compat import strip_local_rank
from timing import budget

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv,expected,rank", [
    (["--local-rank=1", "train.epochs=2"], ["train.epochs=2"], 1),
    (["train.epochs=2", "--local_rank=3"], ["train.epochs=2"], 3),
    (["--local-rank", "2", "a=b"], ["a=b"], 2),
    (["a=b", "model.layers=3"], ["a=b", "model.layers=3"], None),
])
def test_strip_local_rank(argv, expected, rank):
    assert strip_local_rank(argv) == (expected, rank)


@pytest.fixture(scope="module")
def tiny_partition(tmp_path_factory):
    """A one-part partition of a small learnable graph, in DGL's format."""
    import dgl
    import torch

    torch.manual_seed(0)
    n, classes = 600, 4
    label = torch.randint(0, classes, (n,))
    src = torch.randint(0, n, (4000,))
    # mostly same-class edges, so the graph carries signal
    same = torch.nonzero(label.unsqueeze(0) == label.unsqueeze(1))
    pick = same[torch.randint(0, len(same), (3000,))]
    g = dgl.to_bidirected(dgl.graph((torch.cat([src, pick[:, 0]]), torch.cat([torch.randint(0, n, (4000,)), pick[:, 1]])), num_nodes=n))
    g.ndata["label"] = label
    g.ndata["feat"] = torch.nn.functional.one_hot(label, classes).float() + 1.5 * torch.randn(n, classes)
    perm = torch.randperm(n)
    for name, (a, b) in {"train_mask": (0, 360), "val_mask": (360, 480), "test_mask": (480, 600)}.items():
        m = torch.zeros(n, dtype=torch.bool)
        m[perm[a:b]] = True
        g.ndata[name] = m
    out = tmp_path_factory.mktemp("part")
    dgl.distributed.partition_graph(g, "tinyg", 1, str(out), part_method="random")
    return out / "tinyg.json"


def launch_like_dgl(tmp_path, part_json, wrapper: str, trainers: int = 2, extra=()):
    """Start 1 server + `trainers` trainers with launch.py's environment and argument shapes."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    ip_config = tmp_path / "ip_config.txt"
    ip_config.write_text(f"127.0.0.1 {free_port()}\n")
    run_dir = tmp_path / "run"
    user_cmd = ["-m", "degnn.train", f"hydra.run.dir={run_dir}", "train.epochs=2", "train.batch_size=32", "train.lr=0.02",
                "model.hidden=16", "model.fanouts=[5,5]", "dataset.name=tinyg", *extra]
    common = {
        **os.environ, "DGL_NUM_SAMPLER": "0", "DGL_NUM_CLIENT": str(trainers), "DGL_CONF_PATH": str(part_json),
        "DGL_IP_CONFIG": str(ip_config), "DGL_NUM_SERVER": "1", "DGL_GRAPH_FORMAT": "csc",
        "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
    }
    server = subprocess.Popen([sys.executable, *user_cmd], cwd=REPO,
                              env={**common, "DGL_ROLE": "server", "DGL_SERVER_ID": "0"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    launcher = [sys.executable, "-m", wrapper, f"--nproc_per_node={trainers}", "--nnodes=1", "--node_rank=0",
                "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    try:
        trainer = subprocess.run([*launcher, *user_cmd], cwd=REPO, timeout=budget(240), text=True,
                                 env={**common, "DGL_DIST_MODE": "distributed", "DGL_ROLE": "client",
                                      "DGL_GROUP_ID": "0"},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        server_out, _ = server.communicate(timeout=budget(60))
    finally:
        server.kill()
    return trainer, server, server_out, run_dir


def test_started_like_dgl_launch_py(tmp_path, tiny_partition):
    """Started as DGL's tools/launch.py starts a job, through torch.distributed.launch, which hands
    each trainer `--local-rank=N` on its command line (compat.strip_local_rank). torch.distributed.run
    sets LOCAL_RANK in the environment instead, as degnn's own launcher does in every cluster test."""
    trainer, server, server_out, run_dir = launch_like_dgl(tmp_path, tiny_partition, "torch.distributed.launch")
    assert trainer.returncode == 0, trainer.stdout[-4000:]
    assert server.returncode == 0, server_out[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["trainers"] == 2 and summary["epochs"] == 2
    assert summary["batches"] > 0 and summary["allreduce_bytes_per_batch"] > 0
    # the graph carries the labels: better than chance (0.25) after two epochs
    assert summary["best_val"] > 0.4
    curve = [json.loads(line) for line in (run_dir / "curve.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in curve] == [1, 2]
    assert "result: pipeline=distdgl" in trainer.stdout
    # every process logged into the one run directory
    assert {"rank0.log", "rank1.log", "server0.log"} <= {p.name for p in run_dir.iterdir()}


def read_curve(run_dir: Path) -> list:
    path = run_dir / "curve.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    """A launched run is interrupted mid-training; `resume=` continues it without repeating or
    losing finished epochs, and the loss goes on from where it was."""
    import signal
    import time

    import torch

    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    common = ["-m", "degnn.launch", "cluster=local", "dataset=synthetic-tiny",
              "model.hidden=16", "model.fanouts=[5,5]", "train.batch_size=128", "train.lr=0.01",
              f"dataset.root={tmp_path / 'data'}", f"partition.root={tmp_path / 'parts'}"]
    p = subprocess.Popen([sys.executable, *common, f"cluster.port={free_port()}", "train.epochs=500",
                          f"hydra.run.dir={run1}"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + budget(180)
        while time.monotonic() < deadline and p.poll() is None and len(read_curve(run1)) < 3:
            time.sleep(0.1)
        assert len(read_curve(run1)) >= 3, "the first run never finished 3 epochs"
        p.send_signal(signal.SIGINT)  # Ctrl-C: the launcher stops every process
        out, _ = p.communicate(timeout=budget(60))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, out[-3000:]
    done = torch.load(run1 / "checkpoint.pt", weights_only=False)["state"]["epoch"]
    assert 1 <= done < 500
    target = done + 2
    # resume=DIR without the first run's overrides: it runs with that run's own config.yaml
    second = subprocess.run([sys.executable, "-m", "degnn.launch", f"cluster.port={free_port()}",
                             f"train.epochs={target}", f"resume={run1}", f"hydra.run.dir={run2}"],
                            cwd=REPO, capture_output=True, text=True, timeout=budget(240))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = OmegaConf.load(run2 / "config.yaml")
    assert (resumed.model.hidden, list(resumed.model.fanouts), resumed.train.batch_size,
            resumed.train.lr, resumed.train.epochs) == (16, [5, 5], 128, 0.01, target)
    c1, c2 = read_curve(run1), read_curve(run2)
    # every epoch exactly once; the checkpointed ones carried over unchanged
    assert [r["epoch"] for r in c2] == list(range(1, target + 1))
    assert c2[:done] == c1[:done]
    assert c2[done]["train_time_s"] > c1[done - 1]["train_time_s"]
    # the loss continues from the restored model instead of starting over
    assert c2[done]["loss"] < c1[0]["loss"]
    assert json.loads((run2 / "summary.json").read_text())["epochs"] == target


def test_diverging_run_stops_failed_with_valid_curve(tmp_path):
    """A learning rate that blows the loss up: status=failed, error=diverged at epoch N, exit != 0,
    curve.jsonl without a bare NaN, nothing left running."""
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "degnn.launch", "cluster=local", f"cluster.port={free_port()}",
                        "dataset=synthetic-tiny", "model.hidden=16", "model.fanouts=[5,5]", "train.lr=1e30",
                        "train.epochs=6", f"dataset.root={tmp_path / 'data'}", f"partition.root={tmp_path / 'parts'}",
                        f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True, text=True,
                       timeout=budget(240))
    assert r.returncode != 0
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("diverged at epoch "), s
    n = int(s["error"].split()[3].rstrip(":"))
    assert 1 <= n <= 6 and s["epochs"] == n - 1
    assert f"run failed: diverged at epoch {n}" in r.stderr

    def no_constants(name):
        raise ValueError(name)
    curve = [json.loads(l, parse_constant=no_constants) for l in (run_dir / "curve.jsonl").read_text().splitlines()]
    assert [c["epoch"] for c in curve] == list(range(1, n + 1)) and curve[-1]["loss"] is None


def test_entry_without_launcher_says_how_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DGL_", "RANK", "WORLD_SIZE", "MASTER_"))}
    p = subprocess.run([sys.executable, "-m", "degnn.train", f"hydra.run.dir={tmp_path}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=budget(120))
    assert p.returncode == 2
    assert "degnn.launch" in p.stderr and p.stderr.strip().count("\n") == 0


def test_model_config_errors_come_before_anything_starts(tmp_path):
    p = subprocess.run([sys.executable, "-m", "degnn.launch", "model.layers=3", f"hydra.run.dir={tmp_path}"],
                       cwd=REPO, capture_output=True, text=True, timeout=budget(120))
    assert p.returncode == 2
    assert "model.fanouts has 2 entries but model.layers=3" in p.stderr
    assert p.stderr.strip().count("\n") == 0


def test_gloo_connect_failure_is_one_line_naming_host_address_and_key(monkeypatch):
    import socket as _socket
    from degnn.runtime.store import connect_error
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    gloo = RuntimeError("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: "
                        "SO_ERROR: Connection refused, remote=[127.0.0.1]:23973")
    msg = connect_error(gloo)
    assert msg.startswith(f"gloo on host {_socket.gethostname()} bound 127.0.0.1 (GLOO_SOCKET_IFNAME=lo)")
    assert "set cluster.ifname=<this host's interface that reaches 10.0.0.1>" in msg and "\n" not in msg
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert "bound 10.9.9.9 (no GLOO_SOCKET_IFNAME" in connect_error(
        RuntimeError("failed to connect, local=[10.9.9.9]:1, remote=[10.0.0.1]:2"))
    assert connect_error(RuntimeError("CUDA out of memory")) is None


class _Book:
    """A partition book whose machine 0 owns global ids `owned`, local id = position."""
    partid = 0

    def __init__(self, owned):
        self.local = {int(g): i for i, g in enumerate(owned)}

    def nid2localnid(self, gids, part):
        import torch

        return torch.tensor([self.local[int(g)] for g in gids])


class _Tensor:
    def __init__(self, rows):
        self.local_partition = rows


def test_own_rows_are_the_stores_rows_only_in_its_order():
    import torch

    from degnn.runtime.own_rows import own_rows

    rows = torch.arange(12.0).reshape(4, 3)
    pb = _Book([7, 3, 9, 5])  # the store's row i is global id owned[i]
    same = own_rows(_Tensor(rows), pb, torch.tensor([7, 3, 9, 5]))
    assert same is rows  # the shared rows themselves, no copy
    assert own_rows(_Tensor(rows), pb, torch.tensor([3, 7, 9, 5])) is None  # another order
    assert own_rows(_Tensor(rows), pb, torch.tensor([7, 3, 9])) is None  # not every row
    assert own_rows(object(), pb, torch.tensor([7, 3, 9, 5])) is None  # no local store
