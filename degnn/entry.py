"""The per-process entry (`python -m degnn.train`): every process of a run (graph servers and
trainers) runs this. It sits above the pipelines: it picks the configured one and runs it.

DGL's contract (docs/design.md, "Processes and roles"): all processes run the same command line;
the role comes from the environment. Servers register the RPC services the configured pipeline
lists (`pipeline.services`) and serve their partition (never returning); trainers register the
same services, initialise DGL, then torch.distributed (gloo), then run the pipeline.

The config is composed with Hydra's compose API rather than `@hydra.main`, because a server or a
non-zero rank must not create its own output folder or job log: the launcher (a real Hydra app)
picks one run directory and passes it as `hydra.run.dir`.
"""
from __future__ import annotations

import atexit
import datetime
import hashlib
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import List

from degnn.config import CONF_DIR, register_configs
from degnn.runtime.checkpoint import CheckpointError
from degnn.startup import resume_collector
from degnn.compat import strip_local_rank
from degnn.runtime.console import TqdmLogHandler
from degnn.runtime.heartbeat import Heartbeat, heartbeat_path, write_peak
from degnn.runtime.mapped_feats import PartitionFileError
from degnn.runtime.store import ProcessGroupError

log = logging.getLogger("degnn")


class EntryError(RuntimeError):
    """A problem with how the process was started; the message says how to fix it."""


class PartitionDataError(RuntimeError):
    """The partition lacks node data the task reads (found once DGL is initialised)."""


def compose_config(overrides: List[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_configs()
    with initialize_config_dir(CONF_DIR, version_base="1.3", job_name="degnn"):
        # hydra.searchpath finds config groups outside conf/ (a pipeline of one's own)
        cfg = compose("config", overrides=[o for o in overrides
                                           if not o.startswith("hydra.") or o.startswith("hydra.searchpath=")])
    from degnn.runtime.run_config import resumed_config

    cfg = resumed_config(cfg, overrides)  # resume=DIR: that run's config under these overrides
    OmegaConf.resolve(cfg)
    from degnn.pipelines import typed_config

    typed_config(cfg)
    return cfg


def run_dir_from(overrides: List[str]) -> Path:
    for o in overrides:
        if o.startswith("hydra.run.dir="):
            return Path(o.split("=", 1)[1]).resolve()
    # Started without our launcher (e.g. by DGL's launch.py with no hydra.run.dir): derive one
    # directory that every process of this cluster computes alike.
    key = "|".join(os.environ.get(k, "") for k in ("DGL_CONF_PATH", "DGL_IP_CONFIG"))
    ip_config = os.environ.get("DGL_IP_CONFIG")
    if ip_config and os.path.exists(ip_config):
        key += f"|{os.path.getmtime(ip_config)}"
    return Path("runs", "dgl-launch-" + hashlib.sha1(key.encode()).hexdigest()[:10]).resolve()


def setup_logging(run_dir: Path, name: str, to_console: bool) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s {name} %(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    if os.environ.get("DEGNN_LAUNCHED") or to_console:
        # our launcher already writes this process's stdout/stderr to <run_dir>/<name>.log
        h = TqdmLogHandler(sys.stderr)  # lines around rank 0's progress bars, not over them
        h.setFormatter(fmt)
        root.addHandler(h)
    if not os.environ.get("DEGNN_LAUNCHED"):
        fh = logging.FileHandler(run_dir / f"{name}.log")
        fh.setFormatter(fmt)
        root.addHandler(fh)


def require_env(*names: str) -> None:
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        raise EntryError(
            f"environment variable(s) {', '.join(missing)} not set: start degnn.train through "
            f"`python -m degnn.launch` or DGL's tools/launch.py, not directly"
        )
    for n in ("DGL_CONF_PATH", "DGL_IP_CONFIG"):
        if n in names and not os.path.exists(os.environ[n]):
            raise EntryError(f"{n}={os.environ[n]} does not exist on this machine: copy it there or fix the path")


def run_server(cfg, run_dir: Path) -> None:
    import dgl

    require_env("DGL_SERVER_ID", "DGL_NUM_SERVER", "DGL_NUM_CLIENT", "DGL_CONF_PATH", "DGL_IP_CONFIG")
    setup_logging(run_dir, f"server{os.environ['DGL_SERVER_ID']}", to_console=False)
    # liveness only: the server loop runs inside DGL's C++ code
    Heartbeat(heartbeat_path(run_dir, f"server{os.environ['DGL_SERVER_ID']}")).start()
    # DGL's server leaves through sys.exit once rank 0 shuts it down
    atexit.register(write_peak, run_dir, f"server{os.environ['DGL_SERVER_ID']}")
    from degnn.runtime import services

    services.register(cfg.pipeline.services)
    # structure and node features straight from the partition files into shared memory, not via a
    # heap copy; structure cut to what the samplers walk (cluster.server_edges)
    from degnn.runtime import mapped_feats

    mapped_feats.install(inner_only=cfg.cluster.get("server_edges", "inner") == "inner")
    log.info("serving %s as server %s", os.environ["DGL_CONF_PATH"], os.environ["DGL_SERVER_ID"])
    from degnn.runtime.rendezvous import shorten_connect_back_wait

    shorten_connect_back_wait()  # not DGL's fixed 3 s before it connects back to the trainers
    resume_collector()  # start-up is over: the server loads its part and serves (degnn/startup.py)
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])  # never returns in a server


def check_partition_data(task, graph, part_config) -> None:
    """PartitionDataError naming the node data the task reads that the partition lacks (a
    partition made elsewhere, partition.path)."""
    have = set(graph.ndata.keys())
    missing = [k for k in task.partition_fields() if k not in have]
    if missing:
        raise PartitionDataError(f"the partition {part_config} has no node data {', '.join(missing)} (it has "
                                 f"{', '.join(sorted(have)) or 'none'}); partition a graph whose ndata "
                                 f"holds {', '.join(task.partition_fields())}")


def run_trainer(cfg, run_dir: Path, local_rank_arg) -> int:
    import dgl
    import torch
    import torch.distributed as dist

    from degnn.metrics import WireCounter, result_line
    from degnn.pipelines import pipeline_class
    from degnn.runtime.device import device_of
    from degnn.tasks import task_of
    from degnn.runtime import services
    from degnn.runtime.context import RunContext
    from degnn.runtime.partition_info import read_partition_json
    from degnn.runtime.rendezvous import wait_for_servers
    from degnn.runtime.store import init_process_group

    require_env("DGL_CONF_PATH", "DGL_IP_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = local_rank_arg if local_rank_arg is not None else int(os.environ.get("LOCAL_RANK", 0))
    setup_logging(run_dir, f"rank{rank}", to_console=rank == 0)
    # liveness until the epoch loop starts, then progress (EpochLoop.run switches it)
    heartbeat = Heartbeat(heartbeat_path(run_dir, f"rank{rank}")).start()
    atexit.register(write_peak, run_dir, f"rank{rank}")
    part_config = Path(os.environ["DGL_CONF_PATH"])
    meta = read_partition_json(part_config)
    machines = meta["num_parts"]

    pipeline_cls = pipeline_class(cfg)
    task = task_of(cfg)
    device = device_of(cfg.train.device)
    # a pipeline that outlives a dead trainer never touches gloo (Pipeline.tolerates_trainer_faults)
    gloo = not pipeline_cls.tolerates_trainer_faults
    services.register(cfg.pipeline.services)
    t0 = time.time()
    wire0 = WireCounter.from_env().read() if local_rank == 0 else None
    # connect once the servers listen: a first try before that costs DGL's 3 s retry (rendezvous.py)
    waited = wait_for_servers()
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    if gloo:
        # rank 0's store listens on MASTER_ADDR only, not on every interface
        init_process_group(rank, world, timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(cfg.train.seed + rank)
    graph = dgl.distributed.DistGraph(meta["graph_name"], part_config=str(part_config))
    check_partition_data(task, graph, part_config)
    log.info("rank %d/%d (local %d) up in %.1fs (%.1fs of it waiting for the servers to listen); graph %s: "
             "%d nodes, %d edges, %d machines", rank, world, local_rank, time.time() - t0, waited,
             meta["graph_name"], graph.num_nodes(), graph.num_edges(), machines)
    ctx = RunContext(cfg=cfg, run_dir=run_dir, rank=rank, world_size=world, local_rank=local_rank,
                     machines=machines, part_config=part_config, graph=graph, log=log,
                     heartbeat=heartbeat, device=device, started=t0,
                     started_wire=wire0)
    pipeline = pipeline_cls(ctx, task)
    driver = pipeline_cls.driver()(pipeline)
    summary = driver.run()
    rc = 0 if summary.get("status") == "ok" else 1
    if driver.record.wrote_summary and not os.environ.get("DEGNN_LAUNCHED"):
        # (degnn.launch prints it itself, once it has added the wire counters)
        print(result_line(summary), flush=True)
    if not gloo and (os.environ.get("DEGNN_LAUNCHED") or not getattr(driver, "all_trainers_alive", True)):
        # DGL's exit handler (exit_client) starts with a barrier of all clients on server 0, which
        # never completes when a trainer is dead: leave without it; degnn's launcher stops the
        # servers. (Started by DGL's launch.py with every trainer alive, the normal exit below
        # lets DGL shut its servers down, as launch.py expects.)
        log.info("trainer done; leaving without DGL's client barrier")
        write_peak(run_dir, f"rank{rank}")  # os._exit runs no atexit handler
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    if gloo:
        dist.barrier()
        dist.destroy_process_group()
    return rc


def main(argv: List[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, local_rank = strip_local_rank(argv)
    role = os.environ.get("DGL_ROLE", "client")
    try:
        cfg = compose_config(overrides)
        run_dir = run_dir_from(overrides)
        if role == "server":
            run_server(cfg, run_dir)
            return 0
        return run_trainer(cfg, run_dir, local_rank)
    except EntryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, ProcessGroupError, PartitionDataError, PartitionFileError) as e:
        # after DGL's initialisation: leave without its exit barrier (see below), one line
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    except Exception:  # noqa: BLE001
        # DGL's atexit handler would wait for the other clients forever: log and leave now, and
        # let the launcher stop the rest of the cluster.
        traceback.print_exc()
        print(f"error: {role} process failed (traceback above)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
