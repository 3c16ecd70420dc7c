"""bench=scale: the size ladder's config (every job a valid run, the largest rung limited below the
whole graph) and the report's growth section (fitted exponents from known summaries)."""
from __future__ import annotations

import itertools
import json

import pytest
from omegaconf import OmegaConf

from benchmarks.scale import growth, log_slope
from degnn.launch.limits import parse_size
from degnn.launch.preflight import check_config
from degnn.pipelines.tma import TMAPipeline

RUNGS = {"synthetic-scale-250k": 250_000, "synthetic-scale-1m": 1_000_000, "synthetic-scale-4m": 4_000_000}
# the 8-machine rungs: the streaming generator's graphs (20 directed edges a node, as stored)
WIDE = {"synthetic-chunked-4m": 4_000_000, "synthetic-chunked-8m": 8_000_000}


def _jobs(suite):
    sweeps = [[o] if "[" in o else [f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")]
              for o in suite.overrides]
    return [list(job) for job in itertools.product(*sweeps)]


def whole_graph_bytes(ds) -> int:
    """Features (float32) and both endpoints (int64) of every directed edge (synthetic-scale: each
    of the avg_degree edges a node is stored both ways, 79.9M on the 4M rung; a chunked graph's
    avg_degree counts its directed edges): the graph in one process."""
    directed = ds.avg_degree if ds.name in WIDE else ds.avg_degree * 2
    return int(ds.num_nodes * ds.feat_dim * 4 + ds.num_nodes * directed * 2 * 8)


def test_bench_scale_composes_and_every_job_is_a_valid_run():
    from hydra import compose, initialize_config_dir

    from benchmarks.config import compose_bench
    from degnn.config import CONF_DIR, register_configs

    register_configs()
    seen = set()
    bench = compose_bench(["bench=scale"])
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        for suite in bench.bench.suites:
            assert suite.module == "degnn.launch", suite.name
            for job in _jobs(suite):
                cfg = compose("config", overrides=job)
                check_config(cfg)  # the launcher's own checks of the keys and numbers
                if cfg.pipeline.name == "tma":
                    OmegaConf.set_struct(cfg, True)
                    TMAPipeline.prepare_launch(cfg, job)
                ds = cfg.dataset
                # 4 machines; chunked 4M and 8M graphs on 8, random parts made in passes, 2 GiB each
                wide = suite.name.endswith("-8machines")
                assert cfg.cluster.kind == "netns" and cfg.cluster.machines == (8 if wide else 4), suite.name
                rungs, degree = (WIDE, 20) if wide else (RUNGS, 10)
                assert ds.num_nodes == rungs[ds.name] and ds.feat_dim == 128 and ds.avg_degree == degree
                assert not wide or (cfg.partition.method == "random" and cfg.cluster.memory_per_machine == "2G")
                limit = cfg.cluster.memory_per_machine
                if ds.num_nodes >= 4_000_000:  # the largest rungs: each machine below the graph
                    assert limit is not None and parse_size(limit) < whole_graph_bytes(ds), suite.name
                    # the 8M graph: each machine less than a third of it
                    assert ds.num_nodes < 8_000_000 or 3 * parse_size(limit) < whole_graph_bytes(ds), suite.name
                else:
                    assert limit is None, suite.name
                seen.add((ds.name, cfg.pipeline.name, cfg.pipeline.get("variant"), cfg.model.layers))
    want = {(r, "distdgl", "default", 2) for r in RUNGS} | {(r, "distdgl", "default", 3) for r in RUNGS}
    want |= {(r, "lamp", "default", layers) for r in RUNGS for layers in (2, 3)}
    want |= {(r, "tma", v, 2) for r in RUNGS for v in ("random", "supernode")}
    want |= {("synthetic-chunked-4m", "distdgl", "default", 2), ("synthetic-chunked-4m", "tma", "random", 2),
             ("synthetic-chunked-8m", "distdgl", "default", 2), ("synthetic-chunked-8m", "tma", "random", 2)}
    want |= {("synthetic-chunked-8m", "lamp", "default", layers) for layers in (2, 3)}
    assert seen == want


def _fake(root, name, n, curve=(), **summary):
    d = root / name
    d.mkdir(parents=True)
    base = {"status": "ok", "dataset": f"synthetic-scale-{n}", "machines": 4, "layers": 2, "model": "sage",
            "metric": "acc", "pipeline": "distdgl", "variant": "default"}
    (d / "summary.json").write_text(json.dumps({**base, **summary}))
    (d / "config.yaml").write_text(f"dataset:\n  num_nodes: {n}\n")
    (d / "curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))


def test_log_slope_is_the_power_law_exponent():
    assert log_slope([(1e5, 3 * 1e5 ** 0.7), (1e6, 3 * 1e6 ** 0.7), (4e6, 3 * 4e6 ** 0.7)]) == pytest.approx(0.7)
    assert log_slope([(1e5, 5.0), (1e5, 6.0)]) is None  # one size: nothing to fit
    assert log_slope([(1e5, 5.0), (1e6, None)]) is None


def test_scale_section_renders_the_ladder_and_the_fitted_exponents(tmp_path):
    from benchmarks.report import collect, plot_note, write_report

    sizes = (250_000, 1_000_000, 4_000_000)
    for i, n in enumerate(sizes):
        # trainer peak ~ n^0.5, set-up bytes linear, evaluation ~ n^1.2 (the curve's median)
        _fake(tmp_path, f"d/{i}", n, curve=[{"epoch": 1, "eval_s": 1e-5 * n ** 1.2}, {"epoch": 2, "eval_s": 1e9},
                                              {"epoch": 3, "eval_s": 1e-5 * n ** 1.2}, {"epoch": 4}],
              peak_rss_mb_trainer=0.5 * n ** 0.5, setup_bytes=64 * n, setup_s=2.0, peak_rss_mb_server=100.0,
              epoch_time_s=7.0, net_bytes_per_batch=1e6, partition_s=1e-4 * n)
        _fake(tmp_path, f"l/{i}", n, pipeline="lamp", layers=3, peak_rss_mb_trainer=1e-3 * n,
              status="ok" if i < 2 else "failed", error=None if i < 2 else "machine 2 ran out of its 2 GiB")
    _fake(tmp_path, "other/0", 1000, dataset="wordnet", peak_rss_mb_trainer=1.0)  # not on the ladder
    fits = growth(collect(tmp_path))
    assert set(fits) == {"distdgl L2", "lamp L3"}
    assert fits["distdgl L2"]["trainer peak"] == pytest.approx(0.5)
    assert fits["distdgl L2"]["set-up bytes"] == pytest.approx(1.0)
    assert fits["distdgl L2"]["partition"] == pytest.approx(1.0)
    assert fits["distdgl L2"]["set-up"] == pytest.approx(0.0, abs=1e-9)
    assert fits["lamp L3"]["trainer peak"] == pytest.approx(1.0)  # the failed 4M run is not fitted
    assert fits["distdgl L2"]["machine peak"] is None  # no limit, no cgroup peaks
    text = write_report(tmp_path).read_text()
    section = text.split("## Growth with graph size", 1)[1]
    assert "| 4,000,000 | lamp L3 | failed: machine 2 ran out of its 2 GiB |" in section
    assert "| 250,000 | distdgl L2 | ok |" in section
    row = next(line for line in section.splitlines() if line.startswith("| distdgl L2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = next(line for line in section.splitlines() if line.startswith("| series |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    got = dict(zip(names, cells))
    assert got["trainer peak"] == "0.50" and got["set-up bytes"] == "1.00" and got["evaluation"] == "1.20"
    assert got["machine peak"] == "–"
    assert "wordnet" not in section
    if plot_note() is None:
        assert (tmp_path / "scale_growth.png").is_file() and "scale_growth.png" in section


def test_the_partitioner_records_its_load_time_and_peak_and_the_launcher_copies_them(tmp_path):
    from types import SimpleNamespace

    from degnn.config import DatasetConfig, PartitionConfig
    from degnn.launch.launcher import partition_keys
    from degnn.partition_cache import ensure_partitions

    ds = OmegaConf.merge(OmegaConf.structured(DatasetConfig),
                         {"name": "synthetic-tiny", "kind": "synthetic", "num_nodes": 2000, "num_classes": 8,
                          "root": str(tmp_path / "data")})
    pc = OmegaConf.merge(OmegaConf.structured(PartitionConfig),
                         {"method": "random", "num_parts": 2, "root": str(tmp_path / "parts")})
    part_config = ensure_partitions(ds, pc)
    stats = json.loads((part_config.parent / "stats.json").read_text())
    assert stats["load_time_s"] > 0 and stats["peak_rss_mb"] > 50  # a Python process with DGL loaded
    plan = SimpleNamespace(procs=[SimpleNamespace(env={"DGL_CONF_PATH": str(part_config)})])
    assert partition_keys(plan) == {"partition_s": stats["wall_time_s"], "partition_load_s": stats["load_time_s"],
                                    "partition_peak_rss_mb": stats["peak_rss_mb"],
                                    "partition_edge_cut_fraction": stats["edge_cut_fraction"],
                                    "graph_digest": stats["graph_digest"], "partition_digest": stats["assignment_digest"],
                                    "partition_streamed": None}
    assert len(stats["graph_digest"]) == len(stats["assignment_digest"]) == 16
    (part_config.parent / "stats.json").unlink()  # a partition made elsewhere: nothing to copy
    assert set(partition_keys(plan).values()) == {None}


def test_the_ladder_shows_the_largest_machines_split_its_ratio_and_fixed_part():
    from benchmarks.scale import QUANTITIES

    s = {"machine_peak_memory_mb": [900.0, 1000.0],
         "machine_memory_split_mb": [{"peak": 900.0, "sampled": 890.0, "process": 500.0, "shmem": 300.0,
                                      "page_cache": 80.0, "kernel": 10.0},
                                     {"peak": 1000.0, "sampled": 990.0, "process": 550.0, "shmem": 350.0,
                                      "page_cache": 70.0, "kernel": 20.0}],
         "machine_peak_per_share": [2.25, 2.5], "machine_fixed_mb": [500.0, 580.0]}
    got = {q: f(s) for q, _, f in QUANTITIES}
    # the split is the one of the machine with the highest peak (machine 1)
    assert (got["machine peak"], got["its process"], got["its shmem"], got["its page cache"]) == (1000, 550, 350, 70)
    assert got["peak / share"] == 2.5 and got["fixed part"] == 580
    assert all(f({}) is None for q, _, f in QUANTITIES if q.startswith("its "))  # no limit, no split
