"""A process's start-up without Python's cyclic garbage collector.

Importing torch and DGL, and then torch._dynamo (torch.optim's first optimizer imports it) and
ogb's evaluator (it imports scikit-learn), leaves over 400,000 objects the collector tracks, and
nearly none of them is garbage; yet every few hundred allocations the collector walks the young
ones, and every so often all of them. On this project's 2-core host that walking was about a third
of a trainer's start-up CPU (docs/design.md, "Processes and roles", has the numbers). So the
process entries pause the collector before their first import, and resume it once start-up is
over: one full collection frees whatever cyclic garbage start-up left (a set-up's temporary graphs
may hold large tensors), what remains goes to the permanent generation (gc.freeze), which no
collection walks again, and collection then goes on as usual.
"""
from __future__ import annotations

import gc


def pause_collector() -> None:
    """First thing in a process entry (degnn.train, degnn.launch)."""
    gc.disable()


def resume_collector() -> None:
    """Once start-up is over: a trainer's set-up done, a server about to serve, the launcher's
    imports done. Idempotent; a no-op where pause_collector was not called."""
    if not gc.isenabled():
        gc.collect()
        gc.freeze()
        gc.enable()
