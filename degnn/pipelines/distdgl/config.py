"""pipeline=distdgl's config schema (Pipeline.config_schema of DistDGLPipeline)."""
from __future__ import annotations

from dataclasses import dataclass

from degnn.config import PipelineConfig


@dataclass
class DistDGLConfig(PipelineConfig):
    """The keys of pipeline=distdgl (conf/pipeline/distdgl.yaml): a mistyped key or a wrong
    type is refused before anything starts (degnn.pipelines.typed_config)."""

    name: str = "distdgl"
    # batches a background thread builds ahead (DGL's sampling through the servers, and with
    # prefetch_pull the feature and label pulls) while the main thread trains: 1 = one batch ahead,
    # like LAMP's pipeline.prefetch; 0 = synchronous (sample, pull, train, one after the other)
    prefetch: int = 1
    # whether that thread also pulls the batch's features and labels (true), or only samples, the
    # main thread pulling them before its step (false, the default: DGL's own sampler-process
    # layout). One RPC client serves both threads, so with false the thread samples the next batch
    # once this batch's pull is done: the pull never shares the link with the all-reduce. On a
    # machine whose CPU is the bottleneck the thread's work slows the step as much as it hides
    # (bench=parity measures both loaders against the synchronous loop)
    prefetch_pull: bool = False
    # with prefetch >= 1: each trainer trains the first half of its first epoch with the loader and
    # the second half synchronously, then the whole cluster keeps the loop whose median batch,
    # summed over the trainers, was faster for the rest of the run (summary: prefetch_kept,
    # prefetch_probe_s_per_batch). For machines whose bottleneck is not known in advance; a
    # one-epoch run never uses the choice
    prefetch_auto: bool = False
    # read the features of the machine's 1-hop halo nodes (the partition's halo, as LAMP's trainer
    # does) from a local copy made once at setup (setup_bytes); sampling still goes through the
    # graph servers and only the other remote rows are pulled (bench=lamp's ablation-owners: what
    # caching alone gives, without LAMP's computation)
    halo_cache: bool = False
