"""`python -m partitioners dataset=<name> partition=<random|metis|supernode> partition.num_parts=K out=<dir>`

Loads the dataset through `degnn.data.load_dataset`, partitions it (random parts of a chunked
dataset: in passes over its chunks, partitioners/stream_random.py) into `out` (DGL's partition
format, `stats.json`, `COMPLETE`) and prints the statistics as a table. Hydra multirun works,
e.g. ``-m partition=random,metis,supernode out=/tmp/p/\\${partition.method}``.
Bad input: ``error: ...`` on stderr, exit status 2, nothing left at `out`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from degnn.config import CONF_DIR, register_configs

from .folder import check_out, partition_graph, validate
from .assign import PartitionError
from .stats import format_table

register_configs()


def run(cfg: DictConfig) -> Path:
    pc = cfg.partition
    try:
        # cheap checks before importing DGL and loading the dataset
        validate(str(pc.method), pc.num_parts, None, str(cfg.dataset.name))
        check_out(Path(str(cfg.out)).absolute(), str(cfg.dataset.name), str(pc.method), int(pc.num_parts), bool(cfg.force))
    except PartitionError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from degnn.data import CHUNKED_KINDS, DatasetError, load_dataset
    from degnn.partition_cache import partition_settings

    try:
        if str(pc.method) == "random" and str(cfg.dataset.kind) in CHUNKED_KINDS:
            # a chunked graph is cut in passes over its chunks, never loaded whole
            from degnn.data.chunked_dataset import chunked_folder

            from .stream_random import partition_chunked

            jpath = partition_chunked(chunked_folder(cfg.dataset), int(pc.num_parts), str(cfg.out),
                                      str(cfg.dataset.name), int(pc.seed), int(pc.stream_budget_mb) << 20,
                                      partition_settings(cfg.dataset, pc), bool(cfg.force))
            print(format_table(json.loads((jpath.parent / "stats.json").read_text())))
            print(f"partition config: {jpath}")
            return jpath
        data = load_dataset(cfg.dataset)
        jpath = partition_graph(
            data.graph,
            str(pc.method),
            int(pc.num_parts),
            str(cfg.out),
            str(cfg.dataset.name),
            seed=int(pc.seed),
            num_supernodes=int(pc.num_supernodes),
            balance_edges=bool(pc.balance_edges),
            force=bool(cfg.force),
            settings=partition_settings(cfg.dataset, pc),
            link_split=getattr(data, "link_split", None),  # None for a node task
        )
    except (PartitionError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    with open(jpath.parent / "stats.json") as f:
        stats = json.load(f)
    print(format_table(stats))
    print(f"partition config: {jpath}")
    return jpath


@hydra.main(config_path=CONF_DIR, config_name="partition", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
