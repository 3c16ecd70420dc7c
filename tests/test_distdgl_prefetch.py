"""distdgl's prefetching loader (degnn/pipelines/distdgl/prefetch.py) on a fake batch source in
this process: order, depth, overlap, an exception in the source, and a clean stop; prefetch_auto's
choice on one trainer and across two (a gloo group of two processes)."""
from __future__ import annotations

import threading
import time

import pytest

from degnn.pipelines.distdgl.prefetch import Prefetcher, cluster_prefetch_is_faster, prefetch_is_faster


class Source:
    """Items 0..n-1; each next() takes `delay` seconds; records how far ahead of the item the
    consumer holds (the last taken) each item is when its making starts."""

    def __init__(self, n: int, delay: float = 0.0, fail_at: int = -1):
        self.n, self.delay, self.fail_at = n, delay, fail_at
        self.made, self.taken, self.ahead, self.threads = 0, 0, [], set()

    def __iter__(self):
        return self

    def __next__(self):
        self.threads.add(threading.current_thread().name)
        if self.made == self.n:
            raise StopIteration
        self.ahead.append(self.made - (self.taken - 1))
        time.sleep(self.delay)
        if self.made == self.fail_at:
            raise KeyError(f"item {self.made}")
        self.made += 1
        return self.made - 1


def consume(pre: Prefetcher, src: Source, work: float = 0.0) -> list:
    out = []
    for item in pre:
        src.taken += 1
        time.sleep(work)
        out.append(item)
    return out


@pytest.mark.parametrize("depth", [1, 3])
def test_items_in_order_at_most_depth_ahead(depth):
    src = Source(20)
    pre = Prefetcher(src, depth)
    assert consume(pre, src, work=0.002) == list(range(20))
    # the item being made is at most `depth` ahead of the last one taken (and reaches it)
    assert max(src.ahead) == depth and min(src.ahead) >= 1
    assert src.threads == {"distdgl-prefetch"}  # the source runs in the thread only
    assert pre.close() and next(pre, None) is None


def test_overlaps_the_source_with_the_consumer():
    """Ten items of 50 ms each, consumed with 50 ms of work each: about 0.55 s with the overlap,
    1.0 s without it."""
    src = Source(10, delay=0.05)
    t0 = time.perf_counter()
    assert consume(Prefetcher(src, 1), src, work=0.05) == list(range(10))
    assert time.perf_counter() - t0 < 0.85


def test_an_exception_in_the_source_reaches_the_consumer_after_the_items_before_it():
    src = Source(10, fail_at=4)
    pre = Prefetcher(src, 2)
    got = []
    with pytest.raises(KeyError, match="item 4"):
        for item in pre:
            got.append(item)
    assert got == [0, 1, 2, 3]
    assert pre.close()  # the thread has ended
    assert next(pre, None) is None


def test_close_stops_the_thread_early_without_making_more():
    src = Source(1000, delay=0.01)
    pre = Prefetcher(src, 2)
    assert next(pre) == 0
    t0 = time.perf_counter()
    assert pre.close()  # waits for the item under way only
    assert time.perf_counter() - t0 < 0.5
    made = src.made
    time.sleep(0.05)
    assert src.made == made <= 3  # nothing made after the stop


def test_a_thread_stuck_in_the_source_is_left_behind_after_join_s():
    gate = threading.Event()

    def stuck():
        gate.wait(10)
        yield 1

    pre = Prefetcher(stuck(), 1, join_s=0.1)
    t0 = time.perf_counter()
    assert pre.close() is False and time.perf_counter() - t0 < 1.0  # no hang; a daemon thread
    gate.set()


def test_without_release_on_take_the_thread_waits_for_the_callers_release():
    """prefetch_pull=false: the thread samples the next batch only once the trainer has pulled
    this one (one RPC client). Between a take and its release nothing new is made."""
    src = Source(6)
    pre = Prefetcher(src, 1, release_on_take=False)
    got = []
    for item in pre:
        src.taken += 1
        time.sleep(0.02)  # the caller's pull: the thread must not start the next item meanwhile
        assert src.made == item + 1, (src.made, item)
        got.append(item)
        pre.release()
    assert got == list(range(6)) and max(src.ahead) == 1
    assert pre.close()


def test_close_wakes_a_thread_waiting_for_a_release():
    src = Source(100)
    pre = Prefetcher(src, 1, release_on_take=False)
    assert next(pre) == 0
    assert pre.close() and src.made == 1  # it returned without making another


def test_prefetch_auto_keeps_the_loop_whose_median_batch_was_faster():
    # each half's first batch is left out (warm-up; the loader's first batch had no lead)
    assert prefetch_is_faster([9.0, 1.0, 1.1, 0.9, 1.0], [0.1, 1.2, 1.1, 1.3, 1.2]) is False
    assert prefetch_is_faster([0.1, 1.0, 1.1, 0.9, 1.0], [9.0, 0.8, 0.9, 3.0, 0.8]) is True  # a median, not a mean
    assert prefetch_is_faster([1.0] * 5, [1.0] * 5) is False  # a tie keeps the simpler loop
    assert prefetch_is_faster([1.0] * 4, [0.5] * 9) is None  # too few synchronous batches to tell


def _choose(rank: int, port: int, cases, out) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out.put((rank, [cluster_prefetch_is_faster(medians[rank]) for medians in cases]))
    finally:
        dist.destroy_process_group()


def test_prefetch_auto_is_one_choice_for_the_whole_cluster():
    import multiprocessing as mp
    import socket
    # alone: its own medians decide
    assert cluster_prefetch_is_faster({"sync": 1.0, "prefetch": 0.9}) is True
    assert cluster_prefetch_is_faster({"sync": 1.0, "prefetch": 1.0}) is False
    assert cluster_prefetch_is_faster(None) is None
    # two trainers (processes in one gloo group), each case a pair of their medians
    cases = [
        # they disagree: trainer 0 saw the loader faster by 0.05 s, trainer 1 slower by 0.2 s
        [{"sync": 1.0, "prefetch": 0.95}, {"sync": 1.0, "prefetch": 1.2}],
        [{"sync": 1.0, "prefetch": 0.7}, {"sync": 1.0, "prefetch": 1.1}],
        # one trainer could not tell: none chooses (all keep the loader, as a lone trainer would)
        [None, {"sync": 1.0, "prefetch": 1.2}],
    ]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_choose, args=(r, port, cases, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    # the sums decide, and both trainers get the same answer
    assert got[0] == got[1] == [False, True, None], got


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Prefetcher(iter([]), 0)


def test_a_negative_prefetch_is_refused_before_anything_starts():
    from degnn.entry import compose_config
    from degnn.pipelines import pipeline_class

    cfg = compose_config(["pipeline=distdgl", "pipeline.prefetch=-1"])
    with pytest.raises(ValueError, match=r"pipeline.prefetch must be >= 0 .* got -1"):
        pipeline_class(cfg).prepare_launch(cfg, [])
    default = compose_config(["pipeline=distdgl"]).pipeline
    assert default.prefetch == 1 and default.prefetch_pull is False  # one batch sampled ahead
