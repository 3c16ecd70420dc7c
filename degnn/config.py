"""Structured config (Hydra schemas).

Every YAML file under ``conf/`` is merged onto one of these dataclasses, so a wrong type or an
unknown key fails at compose time (the launcher turns Hydra's message into one line naming the
key: degnn.launch.preflight.config_error_line); a pipeline's file is merged onto its class's own
schema (a PipelineConfig subclass) once the class is known (degnn.pipelines.typed_config).
``register_configs()`` must run
before ``@hydra.main`` (the entry points call it at import).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Tuple

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING



def _conf_dir() -> Path:
    """The product's Hydra configs: the checkout's top-level conf/, which a wheel carries as
    conf (pyproject.toml maps it), so an installed degnn composes the same files."""
    here = Path(__file__).resolve().parent
    packaged = here / "conf"
    return packaged if (packaged / "config.yaml").is_file() else here.parent / "conf"


CONF_DIR = str(_conf_dir())


@dataclass
class DatasetConfig:
    name: str = MISSING
    # synthetic | ogb | wordnet | debian | custom | chunked | synthetic_chunked
    kind: str = MISSING
    # node | link
    task: str = "node"
    # where datasets live (OGB's `root`); real OGB data is read from here when present
    root: str = "${oc.env:DEGNN_DATA,data}"
    # custom: a dgl.save_graphs file or an OGB-layout folder; debian: a saved `apt-cache dumpavail`
    # (unset: this machine's APT index); chunked: the folder of a chunked graph (its metadata.json)
    path: Optional[str] = None
    # synthetic generator knobs
    num_nodes: int = 0
    # synthetic: the planted classes; debian: the classes, the most common sections and one
    # "other" for the rest (0: 25)
    num_classes: int = 0
    feat_dim: int = 128
    avg_degree: float = 7.0
    homophily: float = 0.5
    feat_noise: float = 1.0
    # wordnet: folder with data.noun/data.verb/data.adj/data.adv
    wordnet_dir: str = "/usr/share/wordnet"
    # add reverse edges so messages flow both ways (the graph the pipelines see)
    to_bidirected: bool = True
    seed: int = 0


@dataclass
class ModelConfig:
    # sage | gcn | gat
    name: str = MISSING
    layers: int = 2
    hidden: int = 128
    # one fan-out per layer, input layer first; must have `layers` entries
    fanouts: List[int] = field(default_factory=lambda: [10, 25])
    dropout: float = 0.5
    heads: int = 4  # gat only
    # what runs message passing: dgl (dgl.nn), torch (plain-torch layers, any device), auto (torch
    # on a GPU that this DGL build cannot use, else dgl); same parameters either way
    backend: str = "auto"


@dataclass
class TrainConfig:
    epochs: int = 20
    batch_size: int = 1024
    lr: float = 0.003
    weight_decay: float = 0.0
    seed: int = 0
    # evaluate validation/test every N epochs (full-neighbour, whole graph); pipeline=tma: every N
    # averaging rounds, and the last
    eval_every: int = 1
    # 0 = an epoch is one pass over the training nodes/edges; N = an epoch is N batches
    # (evaluation, checkpoints and the time limit then come every N batches: link prediction's
    # epochs are long, bench=scale's 8M rung is bounded): pipeline=distdgl's next epoch continues
    # where the last stopped, pipeline=lamp's trains the first N batches of a fresh shuffle
    batches_per_epoch: int = 0
    eval_batch_size: int = 4096
    # the dtype of the evaluation's hidden-layer tables (every node's output of every layer below
    # the top, DistTensors on the servers): float32, or float16 to halve the shared memory an
    # evaluation adds to a machine (computation stays float32; the top layer's outputs too);
    # distdgl's, LAMP's and TMA's evaluation, LAMP's history fill and degnn.infer
    eval_hidden_dtype: str = "float32"
    # null: the evaluation is full-neighbour and layer-wise over every node (DistDGL's, above); a
    # list (one fan-out per layer, e.g. [25,10]): the validation and test nodes only, in batches of
    # eval_batch_size, each by a computation graph sampled with these fan-outs as in training (a
    # sampled estimate; no whole-graph table on the servers: for machines short of memory; node
    # task, distdgl and LAMP)
    eval_fanouts: Optional[List[int]] = None
    # with eval_fanouts: at most this many validation nodes and as many test nodes, each trainer
    # its share drawn uniformly from its own once (train.seed); 0 = every one
    eval_max_nodes: int = 0
    # stop after this many evaluations without a better validation metric (0 = never)
    patience: int = 0
    # an evaluation resets the patience count only when it beats the last one that did by more
    # than this (0 = any better one): with a slow climb (a tenth of a point an epoch for tens of
    # epochs) patience alone runs to the epoch cap
    min_delta: float = 0.0
    # keep a resumable checkpoint every N epochs
    checkpoint_every: int = 1
    # rank 0 trains its epochs under cProfile and writes <run dir>/profile_rank0.txt
    profile: bool = False
    # the writer's TensorBoard event files next to curve.jsonl (needs the tensorboard package;
    # without it one info line says there are none)
    tensorboard: bool = True
    # stop after the epoch during which training time (evaluation excluded) reached this many
    # seconds (0 = no limit): a wall-time budget like pipeline=tma's time_limit_s, for benchmarks
    time_limit_s: float = 0.0
    # stop after the first evaluation whose validation metric reaches this value (null = never):
    # time-to-accuracy runs; the benches set it from a converged baseline (bench=target). Like
    # patience, read by the epoch loop (distdgl, lamp); pipeline=tma ends at its time budget
    target_val: Optional[float] = None
    # where the trainers' models and batches live: cpu (tested), or cuda[:N] (needs a CUDA build
    # of PyTorch; with DGL's CPU build model.backend=auto runs the torch layers; untested on a GPU)
    device: str = "cpu"


@dataclass
class PipelineConfig:
    # distdgl | lamp | tma, or a pipeline of your own (degnn/pipelines/__init__.py)
    name: str = MISSING
    # the pipeline class (package.module.Class): how the launcher and every process find it
    _target_: str = MISSING
    variant: str = "default"
    # modules whose SERVICES lists (DGL RPC services) every server and trainer registers
    services: List[str] = field(default_factory=list)


@dataclass
class PartitionConfig:
    # random | metis | supernode
    method: str = MISSING
    num_parts: int = 1
    seed: int = 0
    # supernode: METIS clusters dealt to parts (scaled down on small graphs)
    num_supernodes: int = 15000
    balance_edges: bool = True
    # random parts of a chunked dataset are written in passes over its chunks within this many MiB
    # (per-node state and one part's graph included; partitioners/stream_random.py)
    stream_budget_mb: int = 2048
    # partitions are cached here, keyed by dataset, method, K and seed
    root: str = "${oc.env:DEGNN_PARTITIONS,partitions}"
    # a partition made elsewhere (its DGL partition config JSON: DGL's partition_graph or its
    # distributed partitioning pipeline): trained as it is, never rebuilt; `dataset=` still names
    # the task and its evaluation
    path: Optional[str] = None
    # check every cached part file's sha256 against the one written (a run always checks their
    # sizes); a damaged cached partition is partitioned again
    verify: bool = False


@dataclass
class ClusterConfig:
    # local | netns | ssh | slurm
    kind: str = MISSING
    machines: int = 1
    trainers_per_machine: int = 1
    servers_per_machine: int = 1
    # what a graph server keeps of its part: "inner" = the in-edges of the part's own nodes (every
    # sampler of degnn walks in-edges; a random part's other half are its nodes' out-edges to other
    # parts), "all" = the whole part, for code of your own that asks out-edges (docs/design.md)
    server_edges: str = "inner"
    # e.g. "1gbit": a tc tbf cap on every machine's link (netns only)
    bandwidth: Optional[str] = None
    # first DGL server port; servers on one machine use port, port+1, ...
    port: int = 30050
    # netns: private subnet (x.y.z.0/24) for the namespaces and the bridge
    subnet: str = "10.77.0"
    # ssh: file with one `IP [port]` line per machine; workspace to cd into
    ip_config: Optional[str] = None
    workspace: Optional[str] = None
    ssh_port: int = 22
    ssh_user: Optional[str] = None
    # netns: every machine's memory (e.g. "4G", "512M") and CPUs (e.g. 0.5) for its servers and
    # trainers together, through cgroups (docs/design.md, "Machine limits"); null = the host's
    memory_per_machine: Optional[str] = None
    cpus_per_machine: Optional[float] = None
    # netns: a memory cgroup per machine even without memory_per_machine, no limit: the machines'
    # peaks and what they were made of in the summary (docs/design.md, "Honest memory")
    memory_accounting: bool = False
    # seconds between SIGTERM and SIGKILL when the cluster is stopped (fault, Ctrl-C, the end)
    stop_grace_s: float = 5.0
    # a trainer or server without progress (its heartbeat) for this long is named and the run
    # stopped with status=failed (one stopped by a signal, SIGSTOP or a debugger, is named after
    # 5 s); 0 turns hang detection off, the check for stopped processes with it
    hang_timeout_s: float = 300.0
    # renamed to stop_grace_s (it was always a SIGTERM grace period); setting it is an error
    fault_timeout_s: Optional[float] = None
    # local: a private machine (own network, /dev/shm and IPC namespaces; needs root, unshare,
    # nsenter, ip); null = whenever possible, else refuse to share /dev/shm with another run
    isolate: Optional[bool] = None
    # ssh, slurm: the interpreter to run on every host (default: the launcher's own, sys.executable)
    python: Optional[str] = None
    # ssh, slurm: the network interface gloo binds on every host (GLOO_SOCKET_IFNAME of every
    # trainer); null = per host, the interface that routes to the first machine
    ifname: Optional[str] = None
    dry_run: bool = False
    # false: the run directory is private to the user who runs it (folders 0700, files 0600: the
    # launcher and every process it starts run with umask 077; checkpoints, logs and configs
    # included); true: the user's own umask decides (e.g. 0755/0644, readable by every local user)
    share_run_dir: bool = False
    # the module every process runs (`python -m <entry> <overrides>`); the bench's plain DGL
    # reference trainer (benchmarks/plain_dgl.py, from a checkout) is another
    entry: str = "degnn.train"


@dataclass
class Config:
    dataset: DatasetConfig = MISSING
    model: ModelConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    # open at compose time: the pipeline class's own schema (Pipeline.config_schema, a subclass of
    # PipelineConfig in its folder) types it once the class is known (degnn.pipelines.typed_config)
    pipeline: Any = MISSING
    partition: PartitionConfig = MISSING
    cluster: ClusterConfig = MISSING
    # a previous run directory to continue from (its last checkpoint)
    resume: Optional[str] = None


@dataclass
class PartitionJob:
    """Config of the partitioner CLI (`python -m partitioners`)."""

    dataset: DatasetConfig = MISSING
    partition: PartitionConfig = MISSING
    # output folder of the DGL partition (JSON + part<i>/ + stats.json)
    out: str = MISSING
    # overwrite an existing partition of the same graph in `out`
    force: bool = False


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(name="partition_schema", node=PartitionJob)


def unknown_keys(cfg, prefix: str = "") -> List[Tuple[str, List[str]]]:
    """Keys of a composed config that its schema does not have: (dotted key, the schema's keys).

    Hydra's `+key=value` adds a key even to a structured config (it opens the node for the
    override), so the closed schema alone does not refuse `+train.epochz=3`; this walk does."""
    from omegaconf import DictConfig, OmegaConf

    out: List[Tuple[str, List[str]]] = []
    schema = OmegaConf.get_type(cfg)
    known = ([f.name for f in dataclasses.fields(schema)]
             if schema is not None and dataclasses.is_dataclass(schema) else None)
    for key in cfg.keys():
        dotted = f"{prefix}{key}"
        if known is not None and key not in known:
            out.append((dotted, known))
            continue
        node = cfg._get_node(key)
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
            out += unknown_keys(node, dotted + ".")
    return out
