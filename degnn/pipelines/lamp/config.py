"""pipeline=lamp's config schema (Pipeline.config_schema of LAMPPipeline)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from degnn.config import PipelineConfig


@dataclass
class LAMPConfig(PipelineConfig):
    """The keys of pipeline=lamp (conf/pipeline/lamp.yaml): a mistyped key or a wrong type is
    refused before anything starts (degnn.pipelines.typed_config)."""

    name: str = "lamp"
    # how hidden-state rows (historical embeddings, the owners' answers, pushed gradient rows) and
    # the halo features are encoded (degnn/pipelines/lamp/codec.py): minmax (per-row min-max codes,
    # float16 scale and offset) | absmax (symmetric per-row codes, a float16 scale)
    codec: str = "minmax"
    # their precision: 32 (float32) | 16 (float16) | 8 | 4 | 2 (codes of that many bits)
    bits: int = 8
    # halo history rows are refreshed from their owners every this many steps
    halo_sync_steps: int = 10
    # rows a halo sync may move, as a share of the LAMP answer rows this trainer received since the
    # last sync; the oldest halo rows go first (round robin over layers and nodes). null: every
    # halo row written since the last sync (bytes then grow with the layers: one table per layer)
    sync_budget: Optional[float] = 0.25
    # the model's lower layers are shipped to the machine's owner every this many steps (its graph
    # servers with engine=server; with engine=trainer an in-process copy the trainer's rounds load)
    weight_sync_steps: int = 1
    # stop: owner answers and history rows are constants for the backward pass (GAS semantics)
    grad: str = "stop"
    # the asynchronous pipeline: the requests of batch i+prefetch are in flight while batch i
    # trains (0 = synchronous); history pushes, weights and halo sync then run in the background
    prefetch: int = 1
    # two-level computation-graph fusion: each (node, layer) computed once per computation graph,
    # and owners merge the LAMP requests queued for them into one graph (false: every path of
    # every request computed on its own, for the ablation)
    fusion: bool = True
    # where the owners' preparation runs: trainer (each machine's trainer process, over
    # torch.distributed; one trainer per machine; measured a little faster here, bench=lamp's
    # ablation-engine) or server (DGL's graph servers, over DGL RPC; any number of trainers)
    engine: str = "trainer"
    # where the remote top-hop roots' h^(L-1) come from: owners (prepared fresh by the machines that
    # own them, LAMP) or histories (read from this machine's quantized histories, which then keep
    # h^(L-1) too, refreshed by the halo sync: no owner round trip; the ablation of what the
    # owners' fresh answers add)
    roots: str = "owners"
    # the set-up reads the halo nodes' features and fills the histories in pieces of this many
    # MB (no whole halo or partition copy in flight beside what the machine keeps)
    setup_chunk_mb: float = 32.0
    # where the halo nodes' features live: memory (the trainer's RAM; with engine=server a /dev/shm
    # file the machine's graph servers map: one copy a machine) or disk (a file in the machine's
    # temporary directory, $TMPDIR or /tmp, memory-mapped by the trainer and its servers: the
    # kernel keeps the rows it reads in the page cache and may drop them when the machine is short
    # of memory, re-reading them from disk; for machines smaller than what LAMP keeps)
    halo_store: str = "memory"
    # where the owner's history tables live (memory or disk, as halo_store): on disk, files in the
    # machine's temporary directory that the kernel writes back and drops when it is short of memory
    history_store: str = "memory"
    # the halo nodes' features as stored (by pipeline.codec): 32 (float32, exact), 16 (float16) or
    # 8 (per-row 8-bit codes, stochastically rounded like the histories: about a quarter of the
    # bytes, for machines short of memory; only the bottom layer's halo leaves read them)
    halo_bits: int = 32
