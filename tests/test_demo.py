"""`make demo`'s table and closing line from hand-made summaries, its arguments, and the trainer's
console (log lines beside a progress bar). No cluster."""
import io
import logging

from degnn.demo import args_for, bytes_per_batch, format_table, what_it_shows
from degnn.runtime import console

DISTDGL = {"pipeline": "distdgl", "variant": "default", "status": "ok", "test": 0.8107, "layers": 3, "machines": 2,
           "net_bytes_per_batch": 900 * 1024.0, "app_bytes_per_batch": 880 * 1024.0,
           "allreduce_bytes_per_batch": 265 * 1024.0, "train_time_s": 3.43, "batches": 200}
LAMP = {"pipeline": "lamp", "variant": "default", "status": "ok", "test": 0.7732, "layers": 3, "machines": 2,
        "net_bytes_per_batch": 300 * 1024.0, "app_bytes_per_batch": 290 * 1024.0,
        "allreduce_bytes_per_batch": 280 * 1024.0, "train_time_s": 3.1, "batches": 200}
TMA = {"pipeline": "tma", "variant": "random", "status": "ok", "test": 0.7786, "layers": 3, "machines": 2,
       "net_bytes_per_batch": 2.0, "app_bytes_per_batch": 2300.0, "averaging_bytes": 1024 * 4000 - 2 * 4000,
       "correction_bytes": 0, "batches": 4000, "train_time_s": 12.02, "rounds": 4, "trainers_alive": 2}


def test_table_has_one_aligned_row_per_run_with_the_bytes_each_trainer_sent():
    lines = format_table([("distdgl", DISTDGL), ("lamp", LAMP), ("tma", TMA)])
    assert lines == [
        "pipeline    status  test acc  KB sent/batch  train time (s)",
        "distdgl     ok        0.8107          900.0             3.4",
        "lamp        ok        0.7732          300.0             3.1",
        "tma/random  ok        0.7786            1.0            12.0",
    ]


def test_a_run_without_a_summary_is_a_failed_row_and_the_closing_line_says_where_to_look():
    runs = [("distdgl", DISTDGL), ("lamp", {}), ("tma", TMA)]
    assert format_table(runs)[2].split() == ["lamp", "failed", "-", "-", "-"]
    assert what_it_shows(runs).startswith("not ok: lamp;")


def test_closing_line_gives_lamps_byte_ratio_in_all_and_beyond_the_allreduce():
    line = what_it_shows([("distdgl", DISTDGL), ("lamp", LAMP), ("tma", TMA)])
    # 900 / 300 = 3.0x; beyond the all-reduce (900 - 265) / (300 - 280) = 31.75
    assert line.startswith("LAMP sent 3.0x fewer bytes per batch than distdgl at 3 layers "
                           "(32x fewer beyond the gradient all-reduce both pay alike); ")
    assert "RandomTMA" in line and "12s" in line and "averaged 4 times" in line


def test_on_one_machine_the_closing_line_claims_no_byte_saving():
    local = [(n, {**s, "machines": 1, "net_bytes_per_batch": None}) for n, s in
             (("distdgl", DISTDGL), ("lamp", LAMP))]
    assert "fewer bytes per batch" not in what_it_shows(local)
    assert "cluster=local" in what_it_shows(local)
    # no wire counters: degnn's own application counters
    assert bytes_per_batch(local[0][1]) == 880 * 1024.0


def test_tma_bytes_are_its_wire_bytes_in_training_plus_the_model_averaging():
    assert bytes_per_batch(TMA) == 2.0 + (1024 * 4000 - 2 * 4000) / 4000
    assert bytes_per_batch({**TMA, "net_bytes_per_batch": None}) == 2300.0


def test_arguments_reach_every_run_and_pipeline_keys_only_their_pipeline():
    args = ["train.epochs=5", "pipeline.bits=4", "pipeline.time_limit_s=20", "cluster.bandwidth=100mbit"]
    assert args_for("distdgl", args) == ["train.epochs=5", "cluster.bandwidth=100mbit"]
    assert args_for("lamp", args) == ["train.epochs=5", "pipeline.bits=4", "cluster.bandwidth=100mbit"]
    assert args_for("tma", args) == ["train.epochs=5", "pipeline.time_limit_s=20", "cluster.bandwidth=100mbit"]


def test_a_log_line_during_an_epoch_clears_the_bar_and_starts_on_its_own_line(monkeypatch):
    monkeypatch.setenv(console.PROGRESS_ENV, "1")
    stream = io.StringIO()
    monkeypatch.setattr(console.sys, "stderr", stream)
    log = logging.getLogger("degnn-console-test")
    log.propagate = False
    handler = console.TqdmLogHandler(stream)
    log.addHandler(handler)
    try:
        bar = console.progress_bar(4, "epoch 1/1")
        bar.update(1)
        log.warning("halfway")
        bar.close()
        log.warning("epoch 1 done")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert "epoch 1/1" in text  # the bar was drawn
    for msg in ("halfway", "epoch 1 done"):
        # what precedes the line on screen: a carriage return after blanks (the bar cleared)
        before = text[: text.index(msg)].rsplit("\n", 1)[-1]
        assert before.endswith("\r") and before.rsplit("\r", 2)[-2].strip() == "", repr(before)


def test_bars_are_off_where_no_terminal_watches(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(console.sys, "stderr", stream)
    monkeypatch.setenv(console.PROGRESS_ENV, "0")
    bar = console.progress_bar(4, "epoch 1/1")
    bar.update(4)
    bar.close()
    monkeypatch.delenv(console.PROGRESS_ENV)
    monkeypatch.delenv("DEGNN_LAUNCHED", raising=False)
    assert not console.bars_enabled()  # a StringIO is no terminal
    monkeypatch.setenv("DEGNN_LAUNCHED", "1")
    assert console.bars_enabled()  # the launcher's console may be one
    assert stream.getvalue() == ""


def test_the_trainers_console_handler_is_the_bar_aware_one(tmp_path, monkeypatch):
    from degnn.entry import setup_logging

    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    monkeypatch.setenv("DEGNN_LAUNCHED", "1")
    try:
        setup_logging(tmp_path, "rank0", to_console=True)
        assert [type(h) for h in root.handlers] == [console.TqdmLogHandler]
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
