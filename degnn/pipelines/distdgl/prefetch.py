"""distdgl's prefetching loader (`pipeline.prefetch=k`): a background thread builds the next k
batches (DGL's sampling through the graph servers, and with `prefetch_pull` the feature and label
pulls) while the trainer's main thread trains on the current one.

DGL's RPC client serves one thread at a time: the pipeline holds one lock around every use of it
(the thread's sampling and pulls, the trainer's pulls), and every epoch's thread has ended before
`close()` returns, so evaluation and the next epoch never share the client with it. DGL's calls
into its C++ library release the GIL, so the thread's waits on other machines leave the CPU to
the main thread's forward and backward.
"""
from __future__ import annotations

import queue
import statistics
import threading
from typing import Iterator, List, Optional

_END = object()


class Prefetcher:
    """The items of `source` in order, each produced (``next(source)``, which may wait on other
    machines) by a daemon thread at most `depth` items ahead of the last one the caller took: while
    the caller works on item i, items i+1 .. i+depth are being made or wait in line.

    With `release_on_take=False` the thread may start the next item only when the caller calls
    `release()` (not when it takes one): the caller decides when the thread's work may start, e.g.
    after its own use of something the two share.

    An exception raised by `source` is raised by the caller's next() (after the items before it);
    `close()` stops the thread after the item it is making (it never starts another) and waits
    for it up to `join_s` seconds (a thread stuck on a dead machine is left behind: it is a
    daemon, so the process still exits); it returns whether the thread has ended. The caller closes it
    when it stops early (an exception, a shortened epoch); exhausting it closes it too."""

    def __init__(self, source: Iterator, depth: int, name: str = "distdgl-prefetch", join_s: float = 10.0,
                 release_on_take: bool = True):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._source = source
        self._slots = threading.Semaphore(depth)  # items the thread may make before the caller takes one
        self._items: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._join_s = join_s
        self._release_on_take = release_on_take
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                self._slots.acquire()
                if self._stop.is_set():
                    return
                item = next(self._source, _END)
                self._items.put((item, None))
                if item is _END:
                    return
        except BaseException as e:  # noqa: B902 - handed to the caller, which raises it
            self._items.put((None, e))

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item, err = self._take()
        if err is not None or item is _END:
            self._done = True
            self.close()
            if err is not None:
                raise err
            raise StopIteration
        if self._release_on_take:
            self._slots.release()  # the thread may start the next item
        return item

    def release(self) -> None:
        """Let the thread start its next item (with release_on_take=False; once per item taken)."""
        self._slots.release()

    def _take(self):
        while True:
            try:
                return self._items.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive() and self._items.empty():
                    return None, RuntimeError("distdgl prefetch: the background thread ended without "
                                              "a batch; rerun with pipeline.prefetch=0 to see the error")

    def close(self) -> bool:
        self._stop.set()
        self._slots.release()  # wake a thread waiting for a slot: it sees the stop and returns
        if self._thread is not threading.current_thread():
            self._thread.join(self._join_s)
        return not self._thread.is_alive()


PROBE_MIN_BATCHES = 4  # timed batches a half of the first epoch needs (after its first) to choose


def prefetch_is_faster(sync_s: List[float], prefetch_s: List[float]) -> Optional[bool]:
    """`pipeline.prefetch_auto`'s choice from the first epoch's batch times (seconds from one
    batch to the next) of its synchronous half and its loader's half. Each half's first batch is
    left out (the loader's had no lead and the loop's warm-up; the synchronous half's first
    follows the loader's end) and the medians compared; None
    when a half has fewer than PROBE_MIN_BATCHES others (too few to tell)."""
    if min(len(sync_s), len(prefetch_s)) - 1 < PROBE_MIN_BATCHES:
        return None
    return probe_median(prefetch_s) < probe_median(sync_s)


def cluster_prefetch_is_faster(mine: Optional[dict]) -> Optional[bool]:
    """prefetch_auto's one choice for the whole cluster: every trainer's two medians (`mine`,
    {"sync": s, "prefetch": s}, None where its halves were too short to tell) are summed over the
    trainers by one all-reduce, and the loader is kept where its sum is smaller (a tie keeps the
    synchronous loop; None when any trainer could not tell). Every trainer gets the same answer.

    Why not each trainer on its own: under DDP every step waits for the slowest trainer, so a
    cluster whose trainers chose differently runs each step at the pace of the slower loop of the
    two; and where the two loops are within a few percent of each other (CPU-bound machines) one
    trainer's 10 batches a half are a coin flip, the sum over all trainers less so. Every trainer
    must call it at the same point (they take the same number of batches an epoch)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([mine["sync"], mine["prefetch"], 1.0] if mine else [0.0, 0.0, 0.0], dtype=torch.float64)
    world = 1
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
        world = dist.get_world_size()
    sync, prefetch, told = t.tolist()
    if told < world:
        return None
    return prefetch < sync


def probe_median(times: List[float]) -> Optional[float]:
    """The median batch of one half, its first batch left out (None: no other batch)."""
    return statistics.median(times[1:]) if len(times) > 1 else None
