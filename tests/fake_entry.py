"""A stand-in for `python -m degnn.train`, started by the launcher in tests (DEGNN_ENTRY / entry=).

Servers (DGL_ROLE=server) listen on their ip_config address, publish a marker in /dev/shm and
answer "<machine>" to every connection until rank 0 sends "shutdown" (as DGL's rank 0 client
shuts the servers down). Trainers check what the launcher promises and record it in
<run dir>/fake_rank<R>.json:
  - the marker of their own machine's server is visible in /dev/shm (shared per machine) and no
    other machine's marker nor the host's marker is (private per machine, netns only);
  - every server is reachable at its ip_config address and says which machine it is on;
  - FAKE_GLOO=1: a gloo all_reduce over RANK/WORLD_SIZE/MASTER_*/GLOO_SOCKET_IFNAME works
    (degnn.runtime.store's process group: a connect failure is degnn.train's one line);
  - FAKE_DGL=1: instead of all of the above, a real DGL DistGraph on DGL_CONF_PATH (the trainer
    attaches to its server's shared-memory partition) and a feature pull.
Every FAKE_X may also be given as DEGNN_FAKE_X (the launcher exports DEGNN_* over ssh).
Faults: FAKE_FAIL_RANK=r / FAKE_FAIL_SERVER=s exit 1 after FAKE_FAIL_AFTER seconds (default 2)
(FAKE_FAIL_IN=<text>: only in a run whose directory names <text>),
while everyone else then hangs (like trainers blocked in RPC) until stopped. The failing trainer
first: FAKE_FAIL_TRACEBACK=1 prints a Python traceback and then LIBXSMM's exit banner;
FAKE_FILL_DISK=1 fills the run directory's file system; FAKE_EAT_MB=n allocates n MB (for the
kernel's OOM killer). FAKE_IGNORE_TERM=1: every process ignores SIGTERM (stopping then takes
the grace period); FAKE_NOISE=1: rank 0 answers SIGTERM with DGL's noise, as a stopped peer does.
Rank 0 writes summary.json with `batches` like the real entry.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time

class _Knobs(dict):
    """os.environ where FAKE_X may also be given as DEGNN_FAKE_X (forwarded over ssh)."""

    def get(self, key, default=None):
        if key in ("FAKE_FAIL_RANK", "FAKE_FAIL_SERVER") and not self._fails_here():
            return default
        if key.startswith("FAKE_") and key not in os.environ:
            return os.environ.get("DEGNN_" + key, default)
        return os.environ.get(key, default)

    def _fails_here(self) -> bool:
        """FAKE_FAIL_IN=<text>: the faults are only those of a run whose directory names <text>
        (one job of a sweep)."""
        only = os.environ.get("FAKE_FAIL_IN", os.environ.get("DEGNN_FAKE_FAIL_IN"))
        return not only or only in arg("hydra.run.dir")


E = _Knobs(os.environ)


def arg(name: str) -> str:
    for a in sys.argv[1:]:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    raise SystemExit(f"fake_entry: no {name}= argument")


def ip_config():
    return [(l.split()[0], int(l.split()[1])) for l in open(E["DGL_IP_CONFIG"]) if l.strip()]


def shm_prefix(run_dir: str) -> str:
    """Marker files in /dev/shm are named per run: runs on the host's /dev/shm (local, ssh to
    loopback) must not see each other's leftovers."""
    return "degnn_fake_" + hashlib.sha1(os.path.abspath(run_dir).encode()).hexdigest()[:8] + "_m"


def remove_shm_markers(run_dir: str) -> None:
    prefix = shm_prefix(run_dir)
    for f in os.listdir("/dev/shm"):
        if f.startswith(prefix):
            os.unlink(os.path.join("/dev/shm", f))


def hang_if_someone_fails():
    if E.get("FAKE_FAIL_RANK") or E.get("FAKE_FAIL_SERVER"):
        time.sleep(600)


def server(run_dir: str) -> None:
    sid, nserv = int(E["DGL_SERVER_ID"]), int(E["DGL_NUM_SERVER"])
    machine = sid // nserv
    ip, port = ip_config()[machine]
    marker = f"/dev/shm/{shm_prefix(run_dir)}{machine}"
    with open(marker, "w") as f:
        f.write(str(machine))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port + sid % nserv))
    s.listen(64)
    s.settimeout(0.2)
    print(f"server {sid} on {ip}:{port + sid % nserv} pid {os.getpid()}", flush=True)
    fail_at = (time.monotonic() + float(E.get("FAKE_FAIL_AFTER", "2"))
               if E.get("FAKE_FAIL_SERVER") == str(sid) else None)
    while True:
        if fail_at and time.monotonic() > fail_at:
            print("server failing on purpose", flush=True)
            sys.exit(1)
        try:
            c, _ = s.accept()
        except socket.timeout:
            continue
        with c:
            msg = c.recv(64)
            if msg.startswith(b"shutdown"):
                print("shutdown", flush=True)
                if os.path.exists(marker):
                    os.unlink(marker)
                return
            c.sendall(str(machine).encode())


def ask(ip: str, port: int, msg: bytes, tries: int = 100) -> bytes:
    for _ in range(tries):
        try:
            with socket.create_connection((ip, port), timeout=5) as c:
                c.sendall(msg)
                return c.recv(64)
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"cannot reach {ip}:{port}")


def trainer_checks(rank: int, machine: int, run_dir: str) -> dict:
    res = {"rank": rank, "machine": machine, "pid": os.getpid(), "hostname": socket.gethostname(),
           "python": sys.executable}
    try:
        res["resolved"] = socket.gethostbyname(res["hostname"])
    except OSError:
        res["resolved"] = None
    prefix = shm_prefix(run_dir)
    own = f"/dev/shm/{prefix}{machine}"
    for _ in range(100):
        if os.path.exists(own):
            break
        time.sleep(0.2)
    res["shm_shared"] = os.path.exists(own) and open(own).read() == str(machine)
    res["shm_foreign"] = sorted(f for f in os.listdir("/dev/shm")
                                if f.startswith(prefix) and f != os.path.basename(own))
    marker = E.get("FAKE_HOST_SHM_MARKER")
    res["host_shm_visible"] = bool(marker) and os.path.exists(f"/dev/shm/{marker}")
    nserv = int(E["DGL_NUM_SERVER"])
    res["reached"] = {}
    for m, (ip, port) in enumerate(ip_config()):
        for j in range(nserv):
            res["reached"][f"{ip}:{port + j}"] = int(ask(ip, port + j, b"hello"))
    if E.get("FAKE_GLOO") == "1":
        import datetime
        import torch
        import torch.distributed as dist
        from degnn.runtime.store import ProcessGroupError, init_process_group
        try:
            init_process_group(rank, int(E["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=60))
        except ProcessGroupError as e:  # as degnn.train reports it
            print(f"error: {e}", file=sys.stderr, flush=True)
            os._exit(2)
        t = torch.ones(1)
        dist.all_reduce(t)
        res["allreduce"] = float(t.item())
        dist.destroy_process_group()
    return res


def dgl_trainer(rank: int) -> dict:
    import dgl
    import torch
    from degnn.runtime.rendezvous import wait_for_servers
    wait_for_servers()  # as degnn.train starts
    dgl.distributed.initialize(E["DGL_IP_CONFIG"])
    meta = json.load(open(E["DGL_CONF_PATH"]))
    g = dgl.distributed.DistGraph(meta["graph_name"], part_config=E["DGL_CONF_PATH"])
    local = g.local_partition
    feat = g.ndata["feat"][torch.arange(g.num_nodes())]
    res = {"rank": rank, "num_nodes": g.num_nodes(), "local_nodes": local.num_nodes(),
           "feat_sum": float(feat.sum()), "pid": os.getpid()}
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    return res


def fail_like_a_real_process(run_dir: str) -> None:
    if E.get("FAKE_FILL_DISK") == "1":
        try:
            with open(os.path.join(run_dir, "fill"), "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
    if E.get("FAKE_EAT_MB"):
        hog = []
        for _ in range(int(E["FAKE_EAT_MB"])):
            hog.append(bytearray(1 << 20))  # touched: the pages are really used
    if E.get("FAKE_FAIL_TRACEBACK") == "1":
        print("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
              "ValueError: fan-out -2 is not a number of neighbours", flush=True)
        print("\nLIBXSMM_VERSION: main_stable-1.17-3651 (25693763)\nLIBXSMM_TARGET: clx\n"
              "Registry and code: 13 MB\nCommand: python3 -m degnn.train\nUptime: 5.24 s", flush=True)


def main() -> None:
    run_dir = arg("hydra.run.dir")
    role = E.get("DGL_ROLE")
    import signal
    if E.get("FAKE_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif E.get("FAKE_NOISE") == "1" and role != "server" and E.get("RANK") == "0":
        def noise(signum, frame):
            print("User pressed Ctrl+C, Exiting\nterminate called without an active exception",
                  flush=True)
            os._exit(1)
        signal.signal(signal.SIGTERM, noise)
    if E.get("FAKE_DGL") == "1":
        if role == "server":
            import dgl
            from degnn.runtime.rendezvous import shorten_connect_back_wait
            shorten_connect_back_wait()  # as degnn.train's servers start
            dgl.distributed.initialize(E["DGL_IP_CONFIG"])  # never returns in a server
            return
    elif role == "server":
        return server(run_dir)
    rank, machine = int(E["RANK"]), int(E["GROUP_RANK"])
    print(f"trainer rank {rank} machine {machine} pid {os.getpid()} argv {sys.argv[1:]}", flush=True)
    if E.get("FAKE_FAIL_RANK") == str(rank):
        fail_like_a_real_process(run_dir)
    res = dgl_trainer(rank) if E.get("FAKE_DGL") == "1" else trainer_checks(rank, machine, run_dir)
    res["env"] = {k: v for k, v in E.items() if k.startswith(("DGL_", "MASTER_", "GLOO_"))
                  or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "DEGNN_LAUNCHED")}
    with open(os.path.join(run_dir, f"fake_rank{rank}.json"), "w") as f:
        json.dump(res, f)
    if E.get("FAKE_FAIL_RANK") == str(rank):
        time.sleep(float(E.get("FAKE_FAIL_AFTER", "2")))
        print("trainer failing on purpose", flush=True)
        sys.exit(1)
    hang_if_someone_fails()
    if rank == 0:
        world = int(E["WORLD_SIZE"])
        for _ in range(300):
            if all(os.path.exists(os.path.join(run_dir, f"fake_rank{r}.json")) for r in range(world)):
                break
            time.sleep(0.1)
        for i in range(10):
            print(f"\rfake epoch: {i + 1}/10", end="", flush=True)
        print(flush=True)
        summary = {"pipeline": "fake", "dataset": "tiny", "machines": len(ip_config()),
                   "trainers": world, "best_val": 0.5, "test": 0.25, "train_time_s": 1.0,
                   "batches": 10, "net_bytes_total": None, "status": "ok"}
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f)
        if E.get("FAKE_DGL") != "1":
            nserv = int(E["DGL_NUM_SERVER"])
            for ip, port in ip_config():
                for j in range(nserv):
                    ask(ip, port + j, b"shutdown")


if __name__ == "__main__":
    from degnn.startup import pause_collector

    pause_collector()  # as degnn.train does; a short-lived process, never resumed
    main()


# ---- helpers for tests/test_launch*.py (not used by the fake processes) --------------------------

# runs one cluster job outside Hydra's CLI: `python -c RUNNER <run_dir> <part_config> <overrides>`
RUNNER = r"""
import os, sys
from hydra import compose, initialize_config_dir
from degnn.config import CONF_DIR, register_configs
from degnn.launch import launch, LaunchError
register_configs()
run_dir, part, *ov = sys.argv[1:]
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = compose("config", overrides=ov)
try:
    rc = launch(cfg, run_dir, part, ov, entry=os.environ.get("DEGNN_ENTRY", "tests.fake_entry"))
except LaunchError as e:
    print(f"degnn.launch: error: {e}", file=sys.stderr)
    rc = 2
sys.exit(rc)
"""


def make_partition(out: str, num_parts: int) -> str:
    """A DGL partition of a tiny random graph (node feature `feat`); returns the JSON path."""
    import dgl
    import torch
    torch.manual_seed(0)
    g = dgl.rand_graph(200, 1000)
    g.ndata["feat"] = torch.arange(200, dtype=torch.float32).unsqueeze(1).repeat(1, 4)
    dgl.distributed.partition_graph(g, "tiny", num_parts, out, part_method="random")
    return os.path.join(out, "tiny.json")


def processes_mentioning(text: str) -> list:
    """pids of live processes whose command line contains `text` (e.g. a run directory)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out.append(int(pid))
    return out
