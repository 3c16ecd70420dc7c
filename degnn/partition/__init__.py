"""Graph partitioners: random, metis, supernode -> DGL's distributed partition format + stats.

Public API:
    partition_graph(graph, method, num_parts, out, graph_name, seed=0, num_supernodes=15000,
                    balance_edges=True, force=False) -> Path      # the partition JSON
    ensure_partitions(dataset_cfg, partition_cfg) -> Path          # cached; the partition JSON
    planned_partitions(dataset_cfg, partition_cfg) -> (Path, bool) # that JSON, and whether it is built
    existing_partition(path, machines, method=None) -> Path        # a DGL partition made elsewhere, checked
    compute_assignment(graph, method, num_parts, ...) -> np.ndarray
    partition_stats(graph, part, num_parts) -> dict
CLI: ``python -m degnn.partition dataset=<name> partition=<method> partition.num_parts=K out=<dir>``.
"""
from .assign import METHODS, PartitionError, compute_assignment, effective_num_supernodes
from .existing import existing_partition
from .api import cache_dir, ensure_partitions, is_complete, partition_graph, planned_partitions
from .stats import format_table, partition_stats

__all__ = [
    "METHODS",
    "PartitionError",
    "cache_dir",
    "compute_assignment",
    "effective_num_supernodes",
    "ensure_partitions",
    "existing_partition",
    "format_table",
    "is_complete",
    "partition_graph",
    "partition_stats",
    "planned_partitions",
]
