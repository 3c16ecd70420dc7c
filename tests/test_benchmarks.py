"""The benchmark report from run directories, and the bench configs compose."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from benchmarks.report import write_report
from benchmarks.config import compose_bench
from degnn.config import CONF_DIR, register_configs

REPO = Path(__file__).resolve().parent.parent


def fake_run(root, name, **summary):
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": "ok", "model": "sage", "metric": "acc", **summary}))
    (d / "curve.jsonl").write_text("".join(json.dumps({"epoch": e, "train_time_s": e * 1.5, "val": 0.5 + e / 10})
                                           + "\n" for e in (1, 2, 3)))


def test_report_compares_with_the_reference_and_across_layers(tmp_path):
    common = {"dataset": "wordnet", "machines": 4, "epochs": 3, "train_time_s": 4.5, "epoch_time_s": 1.5}
    fake_run(tmp_path, "dist2/0", pipeline="distdgl", layers=2, test=0.52, best_val=0.53,
             net_bytes_per_batch=1000.0, app_bytes_per_batch=990.0, **common)
    fake_run(tmp_path, "dist3/0", pipeline="distdgl", layers=3, test=0.40, best_val=0.41,
             net_bytes_per_batch=3000.0, app_bytes_per_batch=2970.0, **common)
    fake_run(tmp_path, "single/0", pipeline="single", layers=2, test=0.51, best_val=0.52, **common)
    (tmp_path / "broken" / "0").mkdir(parents=True)
    (tmp_path / "broken" / "0" / "launch.log").write_text("trainer rank 1 died\n")
    text = write_report(tmp_path).read_text()
    assert "| distdgl | wordnet | 2 | 0.5200 | 0.5100 | +1.00 |" in text
    assert "| distdgl | wordnet | net_bytes_per_batch | 2 -> 3 | 1.0 | 2.9 | 3.00x |" in text
    assert "`broken/0`" in text and "failed" in text
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert (tmp_path / "bytes_per_batch.png").stat().st_size > 1000


def test_bytes_across_layers_pair_only_runs_of_one_batch_size(tmp_path):
    common = {"dataset": "wordnet", "machines": 4, "epochs": 1, "train_time_s": 4.5, "test": 0.5}
    for name, layers, batch, nbytes in (("dist2", 2, 1024, 1000.0), ("dist3", 3, 512, 1500.0)):
        fake_run(tmp_path, f"{name}/0", pipeline="distdgl", layers=layers, net_bytes_per_batch=nbytes, **common)
        (tmp_path / name / "0" / "config.yaml").write_text(f"train:\n  batch_size: {batch}\n")
    text = write_report(tmp_path).read_text()
    assert "Bytes per batch as layers grow" not in text  # half the batch is not a layer's growth
    (tmp_path / "dist3" / "0" / "config.yaml").write_text("train:\n  batch_size: 1024\n")
    assert "| distdgl | wordnet | net_bytes_per_batch | 2 -> 3 | 1.0 | 1.5 | 1.50x |" in write_report(tmp_path).read_text()


def test_report_writes_every_runs_summary_as_one_csv(tmp_path):
    import csv

    fake_run(tmp_path, "dist/0", pipeline="distdgl", layers=2, test=0.52, best_val=0.53, dataset="wordnet",
             epoch_times_s=[1.0, 2.0], time_per_batch_s={"compute": 0.25, "sampling": 0.5})
    fake_run(tmp_path, "tma/0", pipeline="tma", variant="random", layers=2, test=0.5, rounds=4,
             dataset="wordnet", trainers_dead_ranks=[])
    (tmp_path / "broken" / "0").mkdir(parents=True)
    (tmp_path / "broken" / "0" / "launch.log").write_text("trainer rank 1 died\n")
    write_report(tmp_path)
    with open(tmp_path / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["broken/0", "dist/0", "tma/0"]
    assert rows[0]["status"] == "failed" and rows[1]["status"] == rows[2]["status"] == "ok"
    assert list(rows[0])[:4] == ["run", "status", "pipeline", "variant"]
    dist, tma = rows[1], rows[2]
    assert float(dist["test"]) == 0.52 and dist["time_per_batch_s.sampling"] == "0.5"
    assert tma["rounds"] == "4" and dist["rounds"] == "" and tma["variant"] == "random"
    assert "epoch_times_s" not in dist and "trainers_dead_ranks" not in tma  # lists stay in summary.json


@pytest.mark.parametrize("bench", ["default", "quick", "ogb", "parity", "target"])
def test_bench_configs_compose(bench):
    register_configs()
    cfg = compose_bench([f"bench={bench}"])
    assert cfg.bench.suites and all(s.overrides for s in cfg.bench.suites)
    # every suite's jobs compose as training configs (fan-outs match layers, keys exist)
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        for suite in cfg.bench.suites:
            first = [o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0] if "[" not in o else o
                     for o in suite.overrides]
            job = compose("config", overrides=first)
            assert len(job.model.fanouts) == job.model.layers, suite.name


def test_a_time_to_target_suite_runs_per_dataset_at_its_converged_baselines_target(tmp_path):
    from omegaconf import OmegaConf

    from benchmarks.__main__ import TargetError, jobs
    from benchmarks.records import setting
    from benchmarks.config import BenchConfig, SuiteConfig

    conv = SuiteConfig(name="conv", overrides=["dataset=wordnet,debian", "train.epochs=40", "train.patience=3"])
    fast = SuiteConfig(name="fast", target_from="conv", overrides=["dataset=wordnet,debian", "pipeline=lamp"])
    bench = OmegaConf.structured(BenchConfig(name="b", suites=[conv, fast], cpus_per_machine=None))
    fast = bench.suites[1]
    with pytest.raises(TargetError, match="suite conv, which has no finished run"):
        jobs(tmp_path, bench, fast)
    for i, (ds, best, epochs) in enumerate([("wordnet", 0.70, 21), ("wordnet", 0.72, 25), ("debian", 0.80, 17)]):
        (tmp_path / "conv" / f"r{i}" / "0").mkdir(parents=True)
        (tmp_path / "conv" / f"r{i}" / "0" / "summary.json").write_text(json.dumps(
            {"status": "ok", "dataset": ds, "best_val": best, "epochs": epochs}))
    runs = jobs(tmp_path, bench, fast)
    assert [sub for _, sub in runs] == ["wordnet-${hydra.job.num}", "debian-${hydra.job.num}"]
    assert runs[0][0] == ["dataset=wordnet", "pipeline=lamp", "train.target_val=0.7", "train.epochs=25"]
    assert runs[1][0][-2:] == ["train.target_val=0.79", "train.epochs=17"]
    assert jobs(tmp_path, bench, bench.suites[0]) == [(list(conv.overrides), "${hydra.job.num}")]
    # a later invocation's other target is the same setting (it supersedes the older records)
    rec = {"bench": "b", "suite": "fast", "overrides": runs[0][0]}
    other = dict(rec, overrides=runs[0][0][:2] + ["train.target_val=0.71", "train.epochs=30"])
    assert setting(rec) == setting(other) != setting(dict(rec, overrides=["dataset=debian", "pipeline=lamp"]))
    fast.overrides = ["dataset=wordnet,cora", "pipeline=lamp"]
    with pytest.raises(TargetError, match="no converged run of cora"):
        jobs(tmp_path, bench, fast)


def test_a_time_to_target_suite_run_alone_takes_the_committed_converged_runs_target(tmp_path, capsys):
    """bench.only naming the compared suites only: the target comes from the newest committed
    invocation of the converged suite (the one the report reads too), not an older one."""
    from omegaconf import OmegaConf

    from benchmarks.__main__ import TargetError, jobs
    from benchmarks.records import append
    from benchmarks.config import BenchConfig, SuiteConfig

    conv = SuiteConfig(name="conv", overrides=["dataset=wordnet", "train.epochs=40"])
    fast = SuiteConfig(name="fast", target_from="conv", overrides=["dataset=wordnet", "pipeline=lamp"])
    bench = OmegaConf.structured(BenchConfig(name="b", suites=[conv, fast], cpus_per_machine=None))
    records, out = tmp_path / "records", tmp_path / "out"
    with pytest.raises(TargetError, match="nor in the committed records"):
        jobs(out, bench, bench.suites[1], records)

    def record(invocation, best, epochs, rep):
        return {"bench": "b", "suite": "conv", "run": f"conv/r{rep}/0", "repeat": rep, "order": 0, "commit": "abc1234",
                "invocation": invocation, "summary": {"status": "ok", "dataset": "wordnet", "best_val": best, "epochs": epochs}}

    append(records / "b.jsonl", [record("2026-01-01T00:00:00Z", 0.60, 9, 0),
                                 record("2026-02-01T00:00:00Z", 0.70, 20, 0), record("2026-02-01T00:00:00Z", 0.74, 22, 1)])
    (job, _), = jobs(out, bench, bench.suites[1], records)
    assert job[-2:] == ["train.target_val=0.71", "train.epochs=22"]
    assert "committed records of suite conv (commit abc1234, run 2026-02-01T00:00:00Z)" in capsys.readouterr().out
    # this invocation's own converged runs come first
    (out / "conv" / "0").mkdir(parents=True)
    (out / "conv" / "0" / "summary.json").write_text(json.dumps({"status": "ok", "dataset": "wordnet", "best_val": 0.8, "epochs": 5}))
    (job, _), = jobs(out, bench, bench.suites[1], records)
    assert job[-2:] == ["train.target_val=0.79", "train.epochs=5"]


def test_ogb_suites_run_only_when_the_data_is_on_disk(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from benchmarks.__main__ import missing_datasets
    from benchmarks.config import SuiteConfig

    monkeypatch.setenv("DEGNN_DATA", str(tmp_path))
    suite = OmegaConf.structured(SuiteConfig(name="s", overrides=["dataset=ogbn-arxiv,synthetic-tiny"]))
    assert missing_datasets(suite) == ["ogbn-arxiv"]
    raw = tmp_path / "ogbn_arxiv" / "raw"
    raw.mkdir(parents=True)
    (raw / "edge.csv.gz").write_bytes(b"")
    assert missing_datasets(suite) == []


def test_parity_report_pools_both_orders_of_distdgl_and_the_plain_trainer(tmp_path):
    common = {"dataset": "wordnet", "machines": 4, "layers": 2, "epochs": 3, "train_time_s": 6.0}
    fake_run(tmp_path, "parity-2layers/0", pipeline="distdgl", test_final=0.50, epoch_times_s=[3.0, 2.0, 2.2],
             net_bytes_per_batch=1000.0, fanouts=[25, 10], **common)
    fake_run(tmp_path, "parity-2layers/1", pipeline="plain-dgl", test_final=0.49, epoch_times_s=[2.5, 2.0, 2.0],
             net_bytes_per_batch=1010.0, fanouts=[25, 10], **common)
    # the same pair in the other order: plain first, then distdgl
    fake_run(tmp_path, "parity-2layers-reversed/0", pipeline="plain-dgl", test_final=0.47,
             epoch_times_s=[2.4, 2.3, 2.2], net_bytes_per_batch=1010.0, fanouts=[25, 10], **common)
    fake_run(tmp_path, "parity-2layers-reversed/1", pipeline="distdgl", test_final=0.52,
             epoch_times_s=[2.1, 1.9, 1.8], net_bytes_per_batch=1000.0, fanouts=[25, 10], **common)
    text = write_report(tmp_path).read_text()
    # pooled medians: distdgl [1.8,1.9,2.0,2.1,2.2,3.0] -> 2.05, plain [2.0,2.0,2.2,2.3,2.4,2.5] -> 2.25;
    # bytes 1000 / 1010; test means 0.51 / 0.48
    assert ("| wordnet | 2 | [25, 10] | 3 | 2 / 2 | 2.05 / 2.25 | **0.91x** | 1.0 / 1.0 | 0.990x | "
            "0.5100 / 0.4800 | +3.00 |") in text


def test_parity_report_sets_distdgl_prefetch_against_the_synchronous_loop(tmp_path):
    """The prefetch-* suites make their own table (both repeats' orders pooled) and stay out of the
    parity one."""
    common = {"pipeline": "distdgl", "dataset": "wordnet", "machines": 4, "layers": 3, "epochs": 2,
              "bandwidth": "1gbit", "fanouts": [15, 10, 5]}
    fake_run(tmp_path, "prefetch-L3-sync/r0/0", prefetch=0, epoch_times_s=[10.0, 9.0], app_bytes_per_batch=2048.0,
             time_per_batch_s={"sampling": 0.2, "owner_wait": 0.1}, cpu_throttled_share=0.5, **common)
    fake_run(tmp_path, "prefetch-L3-overlap/r0/0", prefetch=1, epoch_times_s=[8.0, 7.0], app_bytes_per_batch=2048.0,
             time_per_batch_s={"sampling": 0.05, "owner_wait": 0.0}, cpu_throttled_share=0.7, **common)
    fake_run(tmp_path, "prefetch-L3-overlap/r1/0", prefetch=1, epoch_times_s=[7.5, 9.5], app_bytes_per_batch=1024.0,
             time_per_batch_s={"sampling": 0.05, "owner_wait": 0.0}, **common)
    fake_run(tmp_path, "prefetch-L3-sync/r1/0", prefetch=0, epoch_times_s=[9.5, 11.0], app_bytes_per_batch=1024.0,
             time_per_batch_s={"sampling": 0.2, "owner_wait": 0.1}, **common)
    # a loader that samples only (pipeline.prefetch_pull=false): the trainer waits for the pull
    fake_run(tmp_path, "prefetch-L3-sample/r0/0", prefetch=1, prefetch_pull=False, epoch_times_s=[8.5, 8.5],
             app_bytes_per_batch=2048.0, time_per_batch_s={"sampling": 0.01, "owner_wait": 0.1}, **common)
    # prefetch_auto against a synchronous run of its own family (auto-*), never prefetch-*'s
    fake_run(tmp_path, "auto-L3-sync/r0/0", prefetch=0, epoch_times_s=[6.0, 6.0], app_bytes_per_batch=2048.0,
             time_per_batch_s={"sampling": 0.2, "owner_wait": 0.1}, **common)
    fake_run(tmp_path, "auto-L3-auto/r0/0", prefetch=1, prefetch_pull=False, prefetch_auto=True, prefetch_kept=1,
             trainers=4, epoch_times_s=[6.6, 6.0], app_bytes_per_batch=2048.0,
             time_per_batch_s={"sampling": 0.1, "owner_wait": 0.1}, **common)
    fake_run(tmp_path, "parity-3layers/1", pipeline="plain-dgl", dataset="wordnet", layers=3, epochs=2,
             epoch_times_s=[9.0, 9.0])
    text = write_report(tmp_path).read_text()
    assert "| wordnet | 3 | 1gbit | auto (kept 1 of 4) | 1 / 1 | 6.30 (6.00-6.60) / 6.00 (6.00-6.00) | **1.05x** |" in text
    # pooled: prefetch 1 [7.0,7.5,8.0,9.5] -> 7.75, prefetch 0 [9.0,9.5,10.0,11.0] -> 9.75;
    # per repeat: 7.5 / 9.5 and 8.5 / 10.25, both faster; the CPU-bound share of the runs that have it
    pulls = ("| wordnet | 3 | 1gbit | sampling and pull | 2 / 2 | 7.75 (7.00-9.50) / 9.75 (9.00-11.00) | **0.79x** | "
             "1.5 / 1.5 | 50 / 300 | 70% / 50% | 0.81x (0.79–0.83), 5% | 2 of 2 | yes (ranges overlap) |")
    samples = "| wordnet | 3 | 1gbit | sampling | 1 / 2 | 8.50 (8.50-8.50) / 9.75 (9.00-11.00) | **0.87x** |"
    assert pulls in text and samples in text and text.index(pulls) < text.index(samples)
    assert "## Parity with a plain DGL trainer" not in text  # no distdgl run of a parity suite


def test_quick_report_has_lamp_beside_distdgl_and_the_killed_tma_runs_beside_distdgl(tmp_path):
    """bench=quick: the lamp pairs at 1 gbit, and at 100 mbit distdgl against TMA runs that all lost
    a trainer; the 1 gbit distdgl runs get no TMA table of their own."""
    common = {"dataset": "synthetic-small", "machines": 2, "epochs": 1, "best_val": 0.6,
              "allreduce_bytes_per_batch": 100.0}
    for layers, d_net, l_net in ((2, 1100.0, 200.0), (3, 4100.0, 300.0)):
        fake_run(tmp_path, f"bytes-L{layers}-distdgl/0", pipeline="distdgl", layers=layers, test=0.6,
                 net_bytes_per_batch=d_net, epoch_times_s=[2.0], bandwidth="1gbit", **common)
        fake_run(tmp_path, f"bytes-L{layers}-lamp/0", pipeline="lamp", layers=layers, bits=8, test=0.59,
                 net_bytes_per_batch=l_net, epoch_times_s=[1.0], bandwidth="1gbit", **common)
    slow = {"dataset": "synthetic-small", "machines": 2, "layers": 2, "bandwidth": "100mbit", "trainers": 2}
    fake_run(tmp_path, "tma-distdgl/0", pipeline="distdgl", variant="default", best_val=0.80, test=0.79,
             train_time_s=12.0, batches=100, **slow)
    for i, variant in enumerate(("random", "supernode")):
        fake_run(tmp_path, f"tma-killed/{i}", pipeline="tma", variant=variant, best_val=0.79, test=0.78,
                 kill_rank=1, kill_at_s=5.0, trainers_alive=1, rounds=4, train_time_s=12.5, **slow)
    text = write_report(tmp_path).read_text()
    assert "| bytes-L3 | synthetic-small | 3 | 8 | 1 | 4.0 / 0.3 | **13.7x** |" in text
    assert "### synthetic-small, 2 machines, 100mbit links, 2 layers, sage" in text
    assert "1gbit links" not in text
    # no run of these methods without the failure: the killed runs stand in the main TMA table
    assert "| tma/random (rank 1 killed at 5s) | – |" in text
    assert "| tma/supernode (rank 1 killed at 5s) | – |" in text
    assert "| synthetic-small 100mbit | tma/supernode | rank 1 killed at 5s | 1 | 0.7800 | – |" in text
    assert (tmp_path / "tma-curves-synthetic-small-100mbit-sage.png").stat().st_size > 1000
    assert (tmp_path / "lamp_bytes_vs_layers.png").stat().st_size > 1000


def figures_of(tmp_path, monkeypatch):
    """write_report's figures as saved (their artists outlive the closing): {file name: figure}."""
    from benchmarks.report import plots

    kept = {}
    real = plots._save

    def keep(fig, path):
        kept[Path(path).name] = fig
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    write_report(tmp_path)
    return kept


def test_plots_one_colour_per_method_whole_layers_a_title_and_readable_names(tmp_path, monkeypatch):
    common = {"dataset": "synthetic-small", "machines": 2, "epochs": 3, "best_val": 0.6, "test": 0.6,
              "bandwidth": "1gbit", "allreduce_bytes_per_batch": 100.0, "app_bytes_per_batch": 90.0}
    phases = {"sampling": 0.01, "owner_wait": 0.02, "compute": 0.03}
    for layers in (2, 3):
        fake_run(tmp_path, f"bytes-L{layers}-distdgl/0", pipeline="distdgl", layers=layers,
                 net_bytes_per_batch=1000.0 * layers, time_per_batch_s=phases, **common)
        fake_run(tmp_path, f"bytes-L{layers}-lamp/0", pipeline="lamp", layers=layers, bits=8, prefetch=1,
                 fusion=True, engine="trainer", net_bytes_per_batch=300.0, time_per_batch_s=phases, **common)
    fake_run(tmp_path, "ablation-fusion-lamp/0", pipeline="lamp", layers=3, bits=8, prefetch=1, fusion=False,
             engine="trainer", net_bytes_per_batch=300.0, time_per_batch_s=phases, **common)
    figs = figures_of(tmp_path, monkeypatch)
    assert {"curves.png", "bytes_per_batch.png", "lamp_bytes_vs_layers.png", "time_breakdown.png"} <= set(figs)
    colours = {}  # method -> every colour it is drawn in, over every figure
    for name, fig in figs.items():
        for ax in fig.axes:
            assert "synthetic-small" in ax.get_title() and "2 machines" in ax.get_title() \
                and "1gbit" in ax.get_title(), (name, ax.get_title())
            for line in ax.get_lines():
                who = "lamp" if "lamp" in line.get_label() else "distdgl"
                colours.setdefault(who, set()).add(line.get_color())
            for tick in (ax.get_yticklabels() if name in ("bytes_per_batch.png", "time_breakdown.png") else []):
                colours.setdefault("lamp" if "lamp" in tick.get_text() else "distdgl", set()).add(tick.get_color())
    assert len(colours["lamp"]) == 1 and len(colours["distdgl"]) == 1 and colours["lamp"] != colours["distdgl"]
    layers_ax = figs["lamp_bytes_vs_layers.png"].axes[0]
    assert [t.get_text() for t in layers_ax.get_xticklabels()] == ["2", "3"]  # whole layers only
    breakdown = figs["time_breakdown.png"].axes[0]
    names = [t.get_text() for t in breakdown.get_yticklabels()]
    assert names == ["2 layers: distdgl", "2 layers: lamp", "3 layers: distdgl", "3 layers: lamp, no fusion",
                     "3 layers: lamp"]
    assert all(t.get_rotation() == 0 for t in breakdown.get_yticklabels())
    assert "lamp unless named: 8-bit, prefetch 1, fusion, owners on the trainers" in breakdown.get_title()


def test_report_without_matplotlib_has_its_tables_and_says_how_to_get_the_plots(tmp_path, monkeypatch):
    from benchmarks.report import mpl as plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails as if not installed
    monkeypatch.setattr(plots, "_PYPLOT", [])
    fake_run(tmp_path, "dist/0", pipeline="distdgl", layers=2, test=0.52, best_val=0.53, dataset="wordnet",
             net_bytes_per_batch=1000.0, time_per_batch_s={"compute": 0.25})
    text = write_report(tmp_path).read_text()
    assert "pip install 'degnn[bench]'" in text and "| distdgl | wordnet | sage | 2 |" in text
    assert not list(tmp_path.glob("*.png")) and (tmp_path / "runs.csv").is_file()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="cluster=netns needs root and iproute2")
def test_plain_dgl_trainer_runs_on_the_same_cluster_and_moves_the_same_bytes(tmp_path):
    """bench=parity's reference trainer starts through the launcher (cluster.entry) and does the
    same work as pipeline=distdgl: its bytes on the wire per batch match within a few percent."""
    common = [sys.executable, "-m", "degnn.launch", "dataset=synthetic-tiny", "model.fanouts=[10,10]",
              "train.batch_size=100", "train.epochs=2", "train.eval_every=2", "cluster=netns",
              "cluster.machines=2", f"dataset.root={tmp_path / 'data'}", f"partition.root={tmp_path / 'parts'}"]
    for name, entry in (("degnn", "degnn.train"), ("plain", "benchmarks.plain_dgl")):
        p = subprocess.run([*common, f"cluster.entry={entry}", f"hydra.run.dir={tmp_path / 'runs' / name}"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ours = json.loads((tmp_path / "runs" / "degnn" / "summary.json").read_text())
    plain = json.loads((tmp_path / "runs" / "plain" / "summary.json").read_text())
    assert plain["pipeline"] == "plain-dgl" and plain["status"] == "ok"
    assert plain["batches"] == ours["batches"] > 0
    assert len(plain["epoch_times_s"]) == 2 and 0.0 < plain["test_final"] <= 1.0
    assert abs(ours["net_bytes_per_batch"] / plain["net_bytes_per_batch"] - 1) < 0.05


def test_the_breakdown_says_how_cpu_bound_each_machine_was_where_it_was_measured():
    from benchmarks.report.breakdown import breakdown_section

    phases = {"sampling": 0.01, "owner_wait": 0.02, "compute": 0.03}
    run = {"status": "ok", "pipeline": "distdgl", "dataset": "wordnet", "layers": 3, "time_per_batch_s": phases,
           "bandwidth": "1gbit"}
    assert "CPU-bound" not in "\n".join(breakdown_section([{**run, "_rel": "a/0"}]))  # older runs: no column
    text = "\n".join(breakdown_section([{**run, "_rel": "a/0", "cpu_throttled_share": 0.62},
                                        {**run, "_rel": "b/0"}]))
    assert "| a wordnet 1gbit | 10.0 | 20.0 | 30.0 | 0.0 | 0.0 | 0.0 | 60.0 | 62% |" in text
    assert "| b wordnet 1gbit | 10.0 | 20.0 | 30.0 | 0.0 | 0.0 | 0.0 | 60.0 | – |" in text
