"""benchmarks.link_probe: the netns links' delivered rate, measured on a real netns cluster, and how
the projection uses it (a netns run's bytes at its rate times the efficiency)."""
from __future__ import annotations

import json

import pytest

from benchmarks import link_probe as L
from benchmarks import projection as P
from tests.netns_support import needs_netns
from tests.test_projection import MB, MBIT100, summary


def test_efficiencies_interpolate_in_log_size_and_hold_the_ends():
    runs = [{"pipeline": "network", "bandwidth": "100mbit", "bytes_per_peer": size, "efficiency": eff}
            for size, eff in ((1e5, 0.9), (1e6, 0.7), (1e6, 0.8), (1e6, 0.75))]
    links = L.Efficiencies.from_runs(runs)
    assert links.at(MBIT100, 1e6) == pytest.approx(0.75)  # the median of the repeats
    assert links.at(MBIT100, 10 ** 5.5) == pytest.approx(0.825)  # halfway in log size
    assert links.at(MBIT100, 1e3) == pytest.approx(0.9) and links.at(MBIT100, 1e9) == pytest.approx(0.75)
    assert links.at(1e9 / 8, 1e6) == 1.0  # a rate never probed is nominal
    assert not L.Efficiencies.from_runs([]) and links


def test_a_netns_run_s_bytes_take_its_rate_times_the_measured_efficiency():
    links = L.Efficiencies({MBIT100: [(1.0, 0.5)]})
    s = summary(bandwidth="100mbit", phases={"sampling": 0.1, "owner_wait": 0.3, "compute": 0.2,
                                             "allreduce": 0.05, "history": 0.0, "other": 0.0})
    nominal, halved = P.calibrate(s), P.calibrate(s, links=links)
    # 1.25 MB of features: 0.1 s at the nominal 100 mbit, 0.2 s at half of it
    assert nominal.cpu_s["owner_wait"] == pytest.approx(0.2)
    assert halved.cpu_s["owner_wait"] == pytest.approx(0.1)
    # both reproduce their own run, and the efficiency follows the bytes to the prediction
    assert P.batch_time(halved, MBIT100, 0.5, links=links) == pytest.approx(0.65)
    assert P.batch_time(halved, MBIT100, 0.5) == pytest.approx(0.65 - 1.5 * MB / MBIT100)


def test_a_prefetching_run_calibrates_on_its_loader_thread_s_own_times():
    # exposed: 30 ms waiting for the loader, 0.2 s step, 0.12 s all-reduce; the loader thread took
    # 0.1 s sampling and 0.2 s pulling: 0.3 s loader + 0.05 s all-reduce of its own
    phases = {"sampling": 0.03, "owner_wait": 0.0, "compute": 0.2, "allreduce": 0.12, "history": 0.0, "other": 0.0}
    s = summary(bandwidth="100mbit", phases=phases, prefetch=1, prefetch_sampling_s_per_batch=0.1,
                prefetch_pull_s_per_batch=0.2)
    c = P.calibrate(s)
    assert c.exposed and c.prefetch == 1
    assert c.cpu_s["owner_wait"] == pytest.approx(0.2 - 1.25 * MB / MBIT100)
    assert c.cpu_s["allreduce"] == pytest.approx(0.05 - 0.25 * MB / MBIT100)
    assert P.batch_time(c, MBIT100, 0.5) == pytest.approx(0.35)  # its own batch back
    # at 1 gbit the pull's bytes take 10 ms: a 0.21 s loader, then the all-reduce
    assert P.batch_time(c, 1e9 / 8, 0.5) == pytest.approx(0.21 + 0.03 + 0.002)
    # a run without the loader's times: its phases as they are, its pull hidden
    old = P.calibrate(summary(bandwidth="100mbit", phases=phases, prefetch=1))
    assert old.prefetch == 0 and "owner_wait" in old.hidden_bytes
    assert P.batch_time(old, MBIT100, 0.5) == pytest.approx(0.35)


def test_a_loader_that_only_samples_leaves_the_pull_before_the_step():
    """pipeline.prefetch_pull=false: the trainer pulls, then steps while the loader samples the
    next batch: pull + max(sampling, step with its all-reduce)."""
    sync = P.calibrate(summary())  # sampling 0.1, pull 0.05, compute 0.2, all-reduce 0.02
    assert P.batch_time(sync, 1e9 / 8, 0.5, prefetch=1, pull=False, shared_cpu=False) == pytest.approx(0.27)
    # on a shared CPU at least every CPU part together; the loader that pulls too is faster here
    assert P.batch_time(sync, 1e9 / 8, 0.5, prefetch=1, pull=False) == pytest.approx(0.358)
    assert P.batch_time(sync, 1e9 / 8, 0.5, prefetch=1, shared_cpu=False) == pytest.approx(0.22)
    # a run of that loop calibrates on the loader thread's sampling time, the rest as measured
    phases = {"sampling": 0.005, "owner_wait": 0.05, "compute": 0.25, "allreduce": 0.02, "history": 0.0, "other": 0.0}
    run = summary(phases=phases, prefetch=1, prefetch_pull=False, prefetch_sampling_s_per_batch=0.1,
                  prefetch_pull_s_per_batch=None)
    c = P.calibrate(run)
    assert c.exposed and not c.prefetch_pull and c.cpu_s["sampling"] == pytest.approx(0.1)
    assert P.batch_time(c, 1e9 / 8, 0.5) == pytest.approx(0.05 + 0.27)
    assert "prefetch 1 (sampling)" in P._setting(run)


def test_the_check_predicts_a_prefetching_run_from_the_synchronous_ones_of_its_setting():
    cfg = {"model": {"layers": 3}, "cluster": {"bandwidth": "1gbit"}, "pipeline": {"name": "distdgl", "prefetch": 0}}
    sync = summary(_config=cfg)
    overlap = summary(prefetch=1, prefetch_sampling_s_per_batch=0.1, prefetch_pull_s_per_batch=0.05,
                      _config={**cfg, "pipeline": {"name": "distdgl", "prefetch": 1}}, epoch=2.5)
    rows = P.checks([sync, overlap])
    # the prefetching run calibrates nothing here: only it is predicted, from the synchronous one
    assert [(r["source"] is sync, r["target"] is overlap) for r in rows] == [(True, True)]
    row = rows[0]
    assert row["kind"] == "same link and CPU" and row["predicted_delivered"] is None
    # loader 0.15 s beside a 0.2 s step, then the all-reduce: 0.22 s; but the CPU is shared, so
    # at least every CPU part together: 0.358 s
    assert row["predicted"] == pytest.approx(10 * 0.358)


def test_the_probe_s_records_make_a_table():
    runs = [{"pipeline": "network", "bandwidth": bw, "machines": 4, "bytes_per_peer": 1_000_000, "nominal_s": nom,
             "pull_s_median": nom / eff, "efficiency": eff} for bw, nom, eff in
            (("1gbit", 0.024, 1.2), ("100mbit", 0.24, 0.8), ("100mbit", 0.24, 0.9))]
    text = "\n".join(L.network_section(runs))
    assert "| 100mbit | 4 | 1.00 | 240.0 | 283.3 (266.7–300.0) | 0.85 (0.80–0.90) | 2 |" in text
    assert text.index("| 100mbit") < text.index("| 1gbit")
    assert L.network_section([]) == []


@needs_netns
def test_the_probe_measures_a_two_machine_netns_link_and_records_it(tmp_path, capsys):
    assert L.main(["--bandwidths", "100mbit", "--machines", "2", "--sizes", "300000", "--rounds", "2",
                   "--repeats", "1", "--records", str(tmp_path)]) == 0
    assert "efficiency" in capsys.readouterr().out
    (rec,) = [json.loads(line) for line in (tmp_path / "network.jsonl").read_text().splitlines()]
    s = rec["summary"]
    assert rec["bench"] == "network" and rec["suite"] == "100mbit-2m-300kB"
    # 300 kB at 100 mbit is 24 ms; TCP through tbf delivers somewhere near that, never 10x off
    assert s["nominal_s"] == pytest.approx(0.024) and 0.3 < s["efficiency"] < 3.0
    links = L.Efficiencies.committed(tmp_path)
    assert links.at(MBIT100, 300_000) == pytest.approx(s["efficiency"])
    with pytest.raises(SystemExit):
        L.main(["--machines", "1", "--records", ""])
