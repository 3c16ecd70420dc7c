"""benchmarks.projection on synthetic summaries with known phases and bytes (no cluster)."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import projection as P

MB = 1e6
GBIT = 1e9 / 8  # bytes per second
MBIT100 = 1e8 / 8


def summary(pipeline="distdgl", bandwidth="1gbit", cpus=0.5, phases=None, cats=None, epoch=None, **extra):
    """4 machines, 1 trainer each, 10 batches a trainer in one epoch; bytes per batch in `cats`."""
    batches = 40
    cats = cats if cats is not None else {"features": 1.25 * MB, "allreduce": 0.25 * MB}
    phases = phases or {"sampling": 0.1, "owner_wait": 0.05, "compute": 0.2, "allreduce": 0.02,
                        "history": 0.0, "other": 0.0}
    per_batch = sum(cats.values())
    s = {"pipeline": pipeline, "variant": "default", "dataset": "toy", "layers": 3, "fanouts": [15, 10, 5],
         "machines": 4, "trainers": 4, "epochs": 1, "batches": batches, "status": "ok",
         "time_per_batch_s": phases, "app_bytes_by_category": {k: v * batches for k, v in cats.items()},
         "app_bytes_per_batch": per_batch, "net_bytes_per_batch": per_batch, "cpus_per_machine": cpus,
         "allreduce_bytes_per_batch": cats.get("allreduce", 0.0),
         "bandwidth": bandwidth, "_rel": f"{pipeline}-{bandwidth}-{cpus}"}
    s["epoch_times_s"] = [epoch if epoch is not None else 10 * sum(phases.values())]
    s.update(extra)
    return s


def test_calibration_takes_the_link_out_of_each_phase():
    c = P.calibrate(summary())
    # features: 1.25 MB at 1 gbit = 10 ms of the 50 ms owner wait; all-reduce 0.25 MB = 2 ms of 20
    assert c.cpu_s["owner_wait"] == pytest.approx(0.04)
    assert c.cpu_s["allreduce"] == pytest.approx(0.018)
    assert c.cpu_s["sampling"] == pytest.approx(0.1)
    assert c.bytes == {"owner_wait": pytest.approx(1.25 * MB), "allreduce": pytest.approx(0.25 * MB)}
    assert c.round_trips == {"allreduce": 6.0, "sampling": 3.0, "owner_wait": 1.0}
    assert c.batches_per_epoch == 10 and c.speed == 0.5


def test_epoch_arithmetic_bandwidth_speed_and_latency():
    c = P.calibrate(summary())
    # the calibration point is reproduced
    assert P.epoch_time(c, GBIT, 0.5) == pytest.approx(10 * 0.37)
    # 100 mbit: bytes take 10x as long (1.5 MB: 0.12 s instead of 0.012)
    cpu = 0.1 + 0.04 + 0.2 + 0.018
    assert P.epoch_time(c, MBIT100, 0.5) == pytest.approx(10 * (cpu + 1.5 * MB / MBIT100))
    # twice the CPU halves every CPU part, the bytes stay
    assert P.epoch_time(c, MBIT100, 1.0) == pytest.approx(10 * (cpu / 2 + 0.12))
    # latency: 3 sampling + 1 pull + 6 ring round trips a batch
    assert P.epoch_time(c, GBIT, 0.5, latency_s=0.001) == pytest.approx(10 * (0.37 + 0.010))
    # an overlapped batch never beats the link carrying every byte (1.25 s of loader, 1.5 s of link)
    assert P.epoch_time(c, 1 * MB, 1e6, prefetch=1, shared_cpu=False) == pytest.approx(10 * 1.5)
    # a GPU: the model's step (0.2 s of compute at 0.5 CPU) 40x faster than one core, the rest at one core
    assert P.epoch_time(c, MBIT100, 1.0, model_speed=40.0) == pytest.approx(10 * ((cpu - 0.2) / 2 + 0.2 / 80 + 0.12))


def test_busiest_machine_and_wire_overhead_scale_the_bytes():
    s = summary(net_tx_bytes_per_machine=[300, 100, 100, 100], net_rx_bytes_per_machine=[150, 150, 150, 150])
    s["net_bytes_per_batch"] = 1.1 * s["app_bytes_per_batch"]
    c = P.calibrate(s)
    assert P.busiest_share(s) == pytest.approx(300 / 150)
    # the mean trainer's pull in its phase, the busiest's extra waited for in the (balanced) ring
    assert c.bytes["owner_wait"] == pytest.approx(1.25 * MB * 1.1)
    assert c.bytes["allreduce"] == pytest.approx(0.25 * MB * 1.1 + 1.25 * MB * 1.1 * (300 / 150 - 1))


def test_lamp_prefetch_hides_the_owners_round_until_it_is_longer_than_the_batch():
    phases = {"sampling": 0.05, "owner_wait": 0.005, "compute": 0.2, "allreduce": 0.02, "history": 0.01, "other": 0.0}
    s = summary("lamp", phases=phases, cats={"lamp_response": 2.5 * MB, "allreduce": 0.25 * MB},
                prefetch=1, rpc_round_trips_per_batch=1.0)
    c = P.calibrate(s)
    assert c.cpu_s["owner_wait"] == pytest.approx(0.005)  # the 20 ms of bytes were hidden
    rest = 0.05 + 0.2 + 0.018 + 0.01 + 0.25 * MB / MBIT100
    # at 100 mbit the round takes 0.2 s, less than the rest of the batch: still hidden
    assert P.batch_time(c, MBIT100, 0.5) == pytest.approx(rest + 0.005)
    # without prefetch it adds up
    assert P.batch_time(c, MBIT100, 0.5, prefetch=0) == pytest.approx(rest + 0.005 + 0.2)
    # at 10 mbit it shows: wait = round - rest
    slow = 1e7 / 8
    rest_slow = rest - 0.25 * MB / MBIT100 + 0.25 * MB / slow
    assert P.batch_time(c, slow, 0.5) == pytest.approx(max(rest_slow + 0.005 + max(0, 2.5 * MB / slow - rest_slow),
                                                           2.75 * MB / slow))


def test_distdgl_prefetch_overlaps_the_loader_with_the_step_then_the_all_reduce_waits_for_the_link():
    c = P.calibrate(summary())
    loader = 0.1 + 0.04 + 1.25 * MB / MBIT100
    allreduce = 0.018 + 0.25 * MB / MBIT100
    # the loader (0.24 s) is longer than the step (0.2 s); the all-reduce queues behind its pull
    assert P.batch_time(c, MBIT100, 0.5, prefetch=1, shared_cpu=False) == pytest.approx(loader + allreduce)
    # at 1 gbit the step is the longer: the pull is hidden, the all-reduce follows the step
    assert P.batch_time(c, GBIT, 0.5, prefetch=1, shared_cpu=False) == pytest.approx(0.2 + 0.02)
    # sharing the CPU: at least every CPU part together
    assert P.batch_time(c, 10 * GBIT, 0.5, prefetch=1) == pytest.approx(0.1 + 0.04 + 0.2 + 0.018, rel=1e-3)


def test_tma_epoch_is_local_training_plus_averaging_rounds():
    phases = {"sampling": 0.01, "owner_wait": 0.0, "compute": 0.19, "allreduce": 0.0, "history": 0.0, "other": 0.0}
    s = summary("tma", phases=phases, cats={"averaging": 1.0}, param_bytes=1 * MB, sync_every_s=1.0, variant="random")
    c = P.calibrate(s)
    # 10 batches of 0.2 s = 2 s: two rounds of 3 parameter copies each way on machine 0's link
    assert P.epoch_time(c, GBIT, 0.5) == pytest.approx(2.0 + 2 * 3 * MB / GBIT)
    d = P.tma_from_distdgl(P.calibrate(summary()), 1 * MB, 1.0)
    assert P.batch_time(d, MBIT100, 0.5) == pytest.approx(0.2)


def test_crossing_and_grid():
    assert P.crossing([1, 10, 100], [2.0, 1.5, 0.5]) == pytest.approx(10 ** 1.5)
    assert P.crossing([1, 10, 100], [2.0, 1.5, 1.2]) is None
    assert P.crossing([1, 10], [0.5, 1.5]) == pytest.approx(math.sqrt(10))
    g = P.log_grid(1, 100, 3)
    assert g == pytest.approx([1, 10, 100])
    # lamp moves fewer bytes than distdgl: its ratio falls with less bandwidth, crosses 1 once
    d = P.calibrate(summary(phases={"sampling": 0.01, "owner_wait": 0.01, "compute": 0.01, "allreduce": 0.0,
                                    "history": 0.0, "other": 0.0}, cats={"features": 1.25 * MB}))
    lamp = P.calibrate(summary("lamp", phases={"sampling": 0.0, "owner_wait": 0.0, "compute": 0.1, "allreduce": 0.0,
                                                "history": 0.0, "other": 0.0}, cats={"lamp_response": 0.0}))
    bws = P.log_grid(1e6, 1e10, 41)
    ratios = P.ratio_grid(lamp, d, bws, [0.5], latency_s=0.0)[0]
    x = P.crossing(bws, ratios)
    # lamp: 0.1 s; distdgl: 0.02 s of CPU (the pull's 10 ms at 1 gbit were bytes) + 1.25 MB / b
    assert x == pytest.approx(1.25 * MB / 0.08, rel=0.02)


def test_section_labels_predictions_within_and_over_the_bar(tmp_path):
    # two runs of one group; the 100 mbit one measured at what the model predicts, then 30% off
    fast = summary()
    c = P.calibrate(fast)
    right = P.epoch_time(c, MBIT100, 0.5)
    slow = summary(bandwidth="100mbit", epoch=right)
    rows = P.checks([fast, slow])
    assert {r["kind"] for r in rows} == {"bandwidth"}
    assert abs(next(r for r in rows if r["target"] is slow)["error"]) < 1e-9
    text = "\n".join(P.projection_section([fast, slow]))
    assert "within 20%" in text
    off = summary(bandwidth="100mbit", epoch=right / 1.3)
    text = "\n".join(P.projection_section([fast, off]))
    assert "| distdgl toy L3 100mbit 0.5 CPUs | 1 | " in text and "+30% / +30% | 30% (30%) | over 20% |" in text
    text = "\n".join(P.projection_section([fast, off], detail=True))
    assert "| +30% | over 20% |" in text
    # a record's settings leave the dataset out: runs of another graph are not in the group
    cfg = {"model": {"layers": 3}, "cluster": {"bandwidth": "1gbit"}}
    other = summary(bandwidth="100mbit", dataset="toy2", _config=cfg)
    assert P.checks([{**fast, "_config": cfg}, other]) == []
    assert P.verdict(0.19) == "within 20%" and P.verdict(-0.21) == "over 20%"


def test_section_projects_ratios_with_crossovers_and_the_cli(tmp_path, capsys, monkeypatch):
    from benchmarks.report import mpl as plots

    monkeypatch.setattr(plots, "_PYPLOT", [None])  # the tables only (the plot: bench=projection)
    lamp = summary("lamp", cats={"lamp_response": 0.05 * MB, "allreduce": 0.25 * MB}, prefetch=1,
                   rpc_round_trips_per_batch=1.0)
    lines = P.projection_section([summary(), lamp])
    text = "\n".join(lines)
    assert "lamp/distdgl:" in text and "tma/distdgl:" in text
    assert sum(line.startswith("| 1x |") for line in lines) == 3
    assert "ratio = 1 at" in text
    for i, s in enumerate([summary(), lamp]):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(s))
    assert P.main([str(tmp_path)]) == 0
    assert (tmp_path / "projection.md").read_text().startswith("# degnn: projection to real clusters")
    assert not (tmp_path / "projection.png").exists()
    assert P.main([str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_the_grid_calibrates_on_defaults_of_one_dataset_with_the_most_compute_per_cpu():
    base = summary()
    # a run whose machines got less of their budget: its compute took more CPU-seconds
    slow = summary(bandwidth="100mbit", phases={"sampling": 0.1, "owner_wait": 0.5, "compute": 0.3,
                                                "allreduce": 0.05, "history": 0.0, "other": 0.0})
    other = summary("lamp", dataset="other", prefetch=1, bits=8, fusion=True)
    ablation = summary("lamp", prefetch=0, bits=8, fusion=True)
    default = summary("lamp", bandwidth="100mbit", prefetch=1, bits=8, fusion=True)
    cals = P.calibrations([slow, base, other, ablation, default])
    assert cals["distdgl"].source == base["_rel"]
    assert cals["lamp"].prefetch == 1 and cals["lamp"].source == default["_rel"]
    assert cals["tma"].source.endswith("(distdgl's compute)")
    # the parameters from the ring's bytes: 2 (W - 1) / W of one copy
    assert cals["tma"].param_bytes == pytest.approx(0.25 * MB / 1.5)
    with pytest.raises(ValueError, match="cannot calibrate"):
        P.calibrate(summary(batches=0))


def test_tma_without_phases_calibrates_on_its_steps_per_second():
    s = summary("tma", cats={"averaging": 1.0}, param_bytes=1 * MB, sync_every_s=5.0, variant="random",
                steps_per_s_per_trainer={"0": 4.0, "1": 6.0}, time_per_batch_s=None)
    c = P.calibrate(s)
    assert c.cpu_s == {"compute": pytest.approx(0.2), **{p: 0.0 for p in P.PHASES if p != "compute"}}
    cals = P.calibrations([summary(), s])
    assert cals["tma"].source == s["_rel"]


def test_bench_projection_composes():
    from hydra import compose, initialize_config_dir

    from benchmarks.config import compose_bench
    from degnn.config import CONF_DIR, register_configs

    register_configs()
    cfg = compose_bench(["bench=projection"])
    names = [s.name for s in cfg.bench.suites]
    assert names == ["distdgl", "lamp", "tma"]
    sweep = " ".join(cfg.bench.suites[0].overrides)
    assert "cluster.bandwidth=1gbit,100mbit" in sweep and "cluster.cpus_per_machine=0.25,0.45" in sweep
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        for suite in cfg.bench.suites:
            first = [o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0] if "[" not in o else o
                     for o in suite.overrides]
            job = compose("config", overrides=first)
            assert len(job.model.fanouts) == job.model.layers and job.cluster.cpus_per_machine in (0.25, 0.45)


def test_a_prefetching_distdgl_run_is_projected_as_measured():
    c = P.calibrate(summary(prefetch=1))
    assert c.exposed and c.prefetch == 0
    # its sampling and pull are what its overlap left: no second overlap on top
    assert P.batch_time(c, GBIT, 0.5, prefetch=1) == pytest.approx(0.37)
    lamp = summary("lamp", cats={"lamp_response": 0.05 * MB, "allreduce": 0.25 * MB}, prefetch=1)
    text = "\n".join(P.projection_section([summary(prefetch=1), lamp]))
    assert "lamp/distdgl:" in text and "prefetching loader (modelled)" not in text
