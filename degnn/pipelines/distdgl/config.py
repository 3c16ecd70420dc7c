"""pipeline=distdgl's config schema (Pipeline.config_schema of DistDGLPipeline)."""
from __future__ import annotations

from dataclasses import dataclass

from degnn.config import PipelineConfig


@dataclass
class DistDGLConfig(PipelineConfig):
    """The keys of pipeline=distdgl (degnn/conf/pipeline/distdgl.yaml): a mistyped key or a wrong
    type is refused before anything starts (degnn.pipelines.typed_config)."""

    name: str = "distdgl"
    # batches a background thread builds ahead (DGL's sampling through the servers, then the
    # feature and label pulls) while the main thread trains: 1 = one batch ahead, like LAMP's
    # pipeline.prefetch; 0 = synchronous (sample, pull, train, one after the other)
    prefetch: int = 1
    # read the features of the machine's 1-hop halo nodes (the partition's halo, as LAMP's trainer
    # does) from a local copy made once at setup (setup_bytes); sampling still goes through the
    # graph servers and only the other remote rows are pulled (bench=lamp's ablation-owners: what
    # caching alone gives, without LAMP's computation)
    halo_cache: bool = False
