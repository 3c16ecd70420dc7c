"""Honest memory (degnn/launch/memory.py): a cgroup's memory.stat split by kind (v1 and cgroup2),
the split kept at the highest sample, smaps_rollup's PSS and USS, and the graph's share of a
machine; on fixed text, no cluster (the 2-machine run in tests/test_launch_netns.py checks them
on a real one)."""
from __future__ import annotations

import json
import os

import pytest

from degnn.launch.memory import (MachineSplit, graph_keys, parse_smaps_rollup, parse_stat, part_bytes,
                                 sets_kb, split)

MIB = 2 ** 20

# cgroup v1 memory.stat (abridged; a machine's cgroup: total_x == x)
V1 = """cache 314572800
rss 524288000
rss_huge 0
shmem 209715200
mapped_file 230686720
dirty 0
hierarchical_memory_limit 2147483648
total_cache 314572800
total_rss 524288000
total_shmem 209715200
total_mapped_file 230686720
"""

# cgroup2 memory.stat (abridged)
V2 = """anon 524288000
file 314572800
kernel 20971520
shmem 209715200
file_mapped 230686720
"""


def test_a_v1_stat_splits_into_process_shmem_page_cache_and_kernel():
    stat = parse_stat(V1)
    assert stat["total_rss"] == 500 * MIB and stat["hierarchical_memory_limit"] == 2 * 1024 * MIB
    got = split(stat, usage=850 * MIB)
    # cache holds shmem: page cache is the rest of it; kernel the usage beyond rss + cache
    assert got == {"usage": 850 * MIB, "process": 500 * MIB, "shmem": 200 * MIB,
                   "page_cache": 100 * MIB, "kernel": 50 * MIB}
    assert got["process"] + got["shmem"] + got["page_cache"] + got["kernel"] == got["usage"]
    # a cgroup with children: the hierarchical totals, not its own pages only
    parent = parse_stat(V1.replace("\nrss 524288000", "\nrss 0").replace("\nshmem 209715200", "\nshmem 0"))
    assert split(parent, usage=850 * MIB)["process"] == 500 * MIB


def test_a_cgroup2_stat_splits_the_same_way():
    got = split(parse_stat(V2), usage=850 * MIB)
    assert got == {"usage": 850 * MIB, "process": 500 * MIB, "shmem": 200 * MIB,
                   "page_cache": 100 * MIB, "kernel": 50 * MIB}


def test_the_split_is_kept_at_the_sample_of_highest_usage():
    kept = MachineSplit()
    assert kept.mb(None) is None  # never sampled
    kept.observe(850 * MIB, V1)
    kept.observe(900 * MIB, V1.replace("total_rss 524288000", "total_rss 576716800"))  # 550 MiB
    # lower: its split ignored, its shared memory (more than at the highest sample) kept as shmem_max
    kept.observe(600 * MIB, V1.replace("total_rss 524288000", "total_rss 0").replace("total_shmem 209715200",
                                                                                      "total_shmem 314572800"))
    kept.observe(None, V1)  # an unreadable sample: ignored
    assert kept.mb(950 * MIB) == {"peak": 950.0, "sampled": 900.0, "process": 550.0, "shmem": 200.0,
                                  "page_cache": 100.0, "kernel": 50.0, "shmem_max": 300.0}


ROLLUP = """559d67c93000-7ffd4f400000 ---p 00000000 00:00 0                          [rollup]
Rss:              614400 kB
Pss:              358400 kB
Pss_Dirty:        112 kB
Pss_Anon:         204800 kB
Pss_Shmem:        102400 kB
Shared_Clean:     204800 kB
Shared_Dirty:     204800 kB
Private_Clean:    4096 kB
Private_Dirty:    200704 kB
Swap:             0 kB
"""


def test_smaps_rollup_gives_rss_pss_and_uss():
    assert parse_smaps_rollup(ROLLUP) == (614400, 358400, 4096 + 200704)
    assert parse_smaps_rollup("Rss: 10 kB\n") is None  # no Pss: not a rollup


def test_a_live_process_has_uss_at_most_pss_at_most_rss():
    rss, pss, uss = sets_kb(os.getpid())
    assert 0 < uss <= pss < rss  # the interpreter's libraries are mapped by others too
    assert sets_kb(2 ** 22 + 12345) is None  # no such process


def _partition(root, sizes):
    meta = {"graph_name": "g", "num_parts": len(sizes)}
    for i, (graph, node, edge) in enumerate(sizes):
        d = root / f"part{i}"
        d.mkdir()
        for name, n in (("graph.dgl", graph), ("node_feat.dgl", node), ("edge_feat.dgl", edge)):
            (d / name).write_bytes(b"\0" * n)
        meta[f"part-{i}"] = {"node_feats": f"part{i}/node_feat.dgl", "edge_feats": f"part{i}/edge_feat.dgl",
                             "part_graph": f"part{i}/graph.dgl"}
    (root / "g.json").write_text(json.dumps(meta))
    return str(root / "g.json")


def test_the_graphs_share_and_each_machines_ratio_and_fixed_part(tmp_path):
    conf = _partition(tmp_path, [(3 * MIB, 5 * MIB, 24), (2 * MIB, 6 * MIB, 24)])
    parts = part_bytes(conf)
    assert parts == [{"structure": 3 * MIB, "features": 5 * MIB + 24},
                     {"structure": 2 * MIB, "features": 6 * MIB + 24}]
    got = graph_keys(parts, [40 * MIB, None])
    assert got["graph_mb"] == 16.0 and got["graph_share_mb"] == 8.0
    assert got["machine_partition_mb"] == [{"structure": 3.0, "features": 5.0}, {"structure": 2.0, "features": 6.0}]
    assert got["machine_peak_per_share"] == [5.0, None]  # 40 MiB over a share of 8
    assert got["machine_fixed_mb"] == [32.0, None]  # 40 MiB less its 8 MiB part
    # no memory limit: no peaks, no ratio; no partition JSON: nothing
    assert graph_keys(parts, None)["machine_peak_per_share"] is None
    assert part_bytes(str(tmp_path / "missing.json")) is None
    assert set(graph_keys(None, None).values()) == {None}


def test_memory_accounting_is_netns_only_and_makes_cgroups_without_a_limit():
    from omegaconf import OmegaConf

    from degnn.launch.limits import MachineLimits, check_limits
    from degnn.launch.plan import LaunchError

    check_limits(OmegaConf.create({"kind": "netns", "memory_accounting": True}))
    with pytest.raises(LaunchError, match="cluster.memory_accounting: only cluster=netns"):
        check_limits(OmegaConf.create({"kind": "local", "memory_accounting": True}))
    lim = MachineLimits(2, accounting=True)
    assert lim.active and lim.controllers() == ["memory"] and lim.memory is None
    assert lim.describe() == "memory accounted, not limited per machine (cgroups)"
    assert MachineLimits(2).controllers() == [] and not MachineLimits(2).active
