"""What to start where: the pure part of the launcher.

A `Plan` lists every process of a cluster (servers and trainers on every machine) with the exact
command line and the environment variables the launcher adds. It starts nothing, so the unit
tests, `cluster.dry_run=true` and the ssh mode all read the same plan.

The environment follows DGL's tools/launch.py (docs/background.md, "DGL, OGB and Hydra facts"), except
that trainers get torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...) directly from the
launcher: there is no torchrun process in between, and no `--local-rank` argument for Hydra to reject.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from degnn.runtime.cluster import LaunchError  # noqa: F401  (launch code imports it from here)

# the per-process entry (`python3 -m degnn.train <overrides>`)
DEFAULT_ENTRY = "degnn.train"

# variables we set ourselves; stripped from the inherited environment so that a launcher started
# from inside another launched process does not leak its own rank or role into its children
MANAGED_PREFIXES = ("DGL_",)
MANAGED_KEYS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "DEGNN_LAUNCHED",
    "DEGNN_LAUNCHER_PID", "DEGNN_HOLDER_OF",
)

# the repository root (parent of the degnn package): on PYTHONPATH so `-m degnn.train` resolves
REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class Proc:
    role: str  # "server" | "trainer"
    machine: int
    # DGL_SERVER_ID for a server, RANK for a trainer
    index: int
    argv: List[str]
    # only the variables the launcher sets; the process also inherits the launcher's environment
    env: Dict[str, str]
    log: str

    @property
    def name(self) -> str:
        return f"server{self.index}" if self.role == "server" else f"rank{self.index}"

    @property
    def heartbeat(self) -> str:
        """The file the process touches while it makes progress (degnn/runtime/heartbeat.py)."""
        return os.path.join(os.path.dirname(self.log), "heartbeat", self.name)

    def describe(self) -> str:
        what = f"server {self.index}" if self.role == "server" else f"trainer rank {self.index}"
        return f"{what} (machine {self.machine})"

    def shell(self, extra_env: Optional[Dict[str, str]] = None) -> str:
        """The process as one shell line: `export K=V ...; cmd` (dry run, ssh)."""
        env = {**(extra_env or {}), **self.env}
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"export {exports}; {shlex.join(self.argv)}"


@dataclass
class Plan:
    # (ip, first server port) per machine
    machines: List[Tuple[str, int]]
    ip_config: str  # path of the ip_config file the processes read
    procs: List[Proc] = field(default_factory=list)

    @property
    def ip_config_text(self) -> str:
        return "".join(f"{ip} {port}\n" for ip, port in self.machines)

    def servers(self) -> List[Proc]:
        return [p for p in self.procs if p.role == "server"]

    def trainers(self) -> List[Proc]:
        return [p for p in self.procs if p.role == "trainer"]

    def write_ip_config(self) -> None:
        Path(self.ip_config).parent.mkdir(parents=True, exist_ok=True)
        Path(self.ip_config).write_text(self.ip_config_text)

    def render(self) -> str:
        """Human-readable listing of every process (cluster.dry_run=true)."""
        lines = [f"ip_config {self.ip_config}:"]
        lines += ["  " + l for l in self.ip_config_text.splitlines()]
        for m, (ip, _) in enumerate(self.machines):
            lines.append(f"machine {m} ({ip}):")
            for p in self.procs:
                if p.machine != m:
                    continue
                lines.append(f"  {p.name} [{p.role}] log {p.log}")
                for k, v in p.env.items():
                    lines.append(f"    {k}={v}")
                lines.append(f"    $ {shlex.join(p.argv)}")
        return "\n".join(lines)


def absolute_overrides(task_overrides: Sequence[str], run_dir: str, dataset_root: str,
                       partition_root: str) -> List[str]:
    """The user's task overrides plus the absolute paths every process must agree on.

    A user's own `dataset.root=`/`partition.root=`/`hydra.run.dir=` is replaced by its absolute
    form (processes may start in another directory, e.g. over ssh)."""
    pinned = {"hydra.run.dir": run_dir, "dataset.root": dataset_root,
              "partition.root": partition_root}
    # the launcher's own switch; without it a dry run prints exactly what a real run starts
    dropped = {*pinned, "cluster.dry_run"}
    out = [o for o in task_overrides if o.split("=", 1)[0].lstrip("+~") not in dropped]
    out += [f"{k}={os.path.abspath(v)}" for k, v in pinned.items()]
    return out


def entry_argv(overrides: Sequence[str], entry: str = DEFAULT_ENTRY,
               python: Optional[str] = None) -> List[str]:
    return [python or sys.executable, "-m", entry, *overrides]


def read_part_config(part_config: str) -> int:
    """Number of partitions in a DGL partition JSON; every listed part file must exist."""
    path = Path(part_config)
    if not path.is_file():
        raise LaunchError(f"partition config {part_config} does not exist")
    try:
        meta = json.loads(path.read_text())
        num_parts = int(meta["num_parts"])
    except (ValueError, KeyError, TypeError) as e:
        raise LaunchError(f"partition config {part_config} is not a DGL partition JSON ({e!r})")
    for i in range(num_parts):
        part = meta.get(f"part-{i}")
        if not isinstance(part, dict):
            raise LaunchError(f"partition config {part_config} lists no part-{i}")
        for key, rel in part.items():
            f = path.parent / rel
            if not f.exists():
                raise LaunchError(f"partition file {f} ({key} of part-{i}) is missing; "
                                  f"rebuild the partitions of {part_config}")
    return num_parts


def default_omp_threads(trainers_per_machine: int) -> int:
    # launch.py's default: half the cores, shared by the trainers of one machine
    return max(1, (os.cpu_count() or 2) // 2 // max(1, trainers_per_machine))


# A graph server's heap is its runtime and the buffers of the requests it answers (sampled edges,
# pulled rows: megabytes each). glibc keeps freed buffers in per-thread arenas and raises its
# mmap threshold after each large free, so a busy server's heap stays at its largest: 419 MiB of
# anonymous memory at bench=scale's 8M rung, 205 MiB with these (two arenas, buffers of 1 MiB and
# more mapped and handed back when freed). A user's own settings in the environment win.
SERVER_MALLOC = {k: os.environ.get(k, v) for k, v in (("MALLOC_ARENA_MAX", "2"),
                                                      ("MALLOC_MMAP_THRESHOLD_", str(1 << 20)))}


def build_plan(machines: Sequence[Tuple[str, int]], *, trainers_per_machine: int,
               servers_per_machine: int, part_config: str, ip_config: str, run_dir: str,
               argv: Sequence[str], master_port: int, ifname: Optional[str] = None,
               omp_threads: Optional[int] = None, pythonpath: Optional[str] = None,
               graph_format: str = "csc") -> Plan:
    """Every server and trainer of the cluster, servers first (as launch.py starts them)."""
    if trainers_per_machine < 1 or servers_per_machine < 1:
        raise LaunchError("cluster.trainers_per_machine and cluster.servers_per_machine must be >= 1")
    n = len(machines)
    world = n * trainers_per_machine
    if pythonpath is None:
        pythonpath = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    omp = str(omp_threads or default_omp_threads(trainers_per_machine))
    common = {
        # no DGL sampler processes: they only sample (DGL 1.1.3), distdgl prefetches sampling and
        # feature pulls in a thread instead (pipeline.prefetch, docs/pipelines.md)
        "DGL_NUM_SAMPLER": "0",
        "DGL_NUM_CLIENT": str(world),  # trainers x (1 + samplers) x machines
        "DGL_CONF_PATH": os.path.abspath(part_config),
        "DGL_IP_CONFIG": os.path.abspath(ip_config),
        "DGL_NUM_SERVER": str(servers_per_machine),
        "DGL_GRAPH_FORMAT": graph_format,
    }
    plan = Plan(machines=list(machines), ip_config=os.path.abspath(ip_config))
    for m in range(n):
        for j in range(servers_per_machine):
            sid = m * servers_per_machine + j
            env = {"DGL_ROLE": "server", **common, "OMP_NUM_THREADS": "1", **SERVER_MALLOC,
                   "DGL_SERVER_ID": str(sid), "PYTHONPATH": pythonpath, "DEGNN_LAUNCHED": "1"}
            plan.procs.append(Proc("server", m, sid, list(argv), env,
                                   os.path.join(run_dir, f"server{sid}.log")))
    for m in range(n):
        for lr in range(trainers_per_machine):
            rank = m * trainers_per_machine + lr
            env = {"DGL_DIST_MODE": "distributed", "DGL_ROLE": "client", **common,
                   "DGL_GROUP_ID": "0", "OMP_NUM_THREADS": omp, "PYTHONPATH": pythonpath,
                   "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(lr),
                   "LOCAL_WORLD_SIZE": str(trainers_per_machine), "GROUP_RANK": str(m),
                   "MASTER_ADDR": machines[0][0], "MASTER_PORT": str(master_port),
                   "DEGNN_LAUNCHED": "1"}
            if ifname:
                env["GLOO_SOCKET_IFNAME"] = ifname
            plan.procs.append(Proc("trainer", m, rank, list(argv), env,
                                   os.path.join(run_dir, f"rank{rank}.log")))
    return plan


def child_env(extra: Dict[str, str], base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The launcher's environment without managed variables, plus a process's own."""
    base = dict(os.environ if base is None else base)
    for k in list(base):
        if k.startswith(MANAGED_PREFIXES) or k in MANAGED_KEYS:
            del base[k]
    base.update(extra)
    return base
