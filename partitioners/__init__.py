"""Graph partitioners: random, metis, supernode -> DGL's distributed partition format + stats.

They take a graph and know nothing of datasets, configs or the launcher; only the command line
(``python -m partitioners``, the ``degnn-partition`` script) loads a dataset. The cached
partitions a run trains on are degnn.partition_cache's.

Public API:
    partition_graph(graph, method, num_parts, out, graph_name, seed=0, num_supernodes=15000,
                    balance_edges=True, force=False, link_split=None, settings=None) -> Path
    existing_partition(path, machines, method=None) -> Path        # a DGL partition made elsewhere, checked
    stream_random.partition_chunked(chunked_dir, num_parts, out, graph_name, seed=0,
                    budget_bytes=2 GiB) -> Path                    # random parts of a chunked graph, in passes
    is_complete(out) -> bool                                       # a finished partition folder
    compute_assignment(graph, method, num_parts, ...) -> np.ndarray
    partition_stats(graph, part, num_parts) -> dict
CLI: ``python -m partitioners dataset=<name> partition=<method> partition.num_parts=K out=<dir>``.
"""
from .assign import METHODS, PartitionError, compute_assignment, effective_num_supernodes
from .existing import existing_partition
from .folder import is_complete, partition_graph
from .stats import format_table, partition_stats

__all__ = [
    "METHODS",
    "PartitionError",
    "compute_assignment",
    "effective_num_supernodes",
    "existing_partition",
    "format_table",
    "is_complete",
    "partition_graph",
    "partition_stats",
]
