"""What a trainer asks of the owners, whichever engine answers (`pipeline.engine`): the `Owners`
interface, the `Ticket` of a batch's asks in flight, the `Answers` that come back, and
`LampServiceError`. Its two implementations, owners.TrainerOwners (engine=trainer) and
service.ServerOwners (engine=server), import it; owners.make_owners picks one. Imports torch only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from degnn.pipelines.lamp.compute import Grads, GradRows, HistoryPull, HistoryRows, Roots, Rows, Weights


@dataclass
class Ticket:
    """One batch's asks in flight, from `ask` to `answers`: (answerer, Roots) per owner machine,
    the transport's handle, and the history rows of this machine that the batch's middle
    blocks read (`ask_local`: the request, and its answer when it is read in-process)."""
    asks: List[Tuple[int, Roots]]
    pending: object
    pull: Optional[HistoryPull] = None
    pull_rows: Optional[Rows] = None


class Answers(NamedTuple):
    lamp: List[Rows]                 # one per ask, in order
    pull: Optional[Rows]             # the middle blocks' history rows
    halo: Optional[Dict[int, Rows]]  # halo-sync answers that came back with them, by answerer


class Owners:
    """What a trainer asks of the owners. Methods send without waiting unless they say so; what
    they leave in flight is collected by `answers`, `halo_answers`, `owner_grads` and `drain`."""

    def __init__(self, counter):
        self.counter = counter
        self.local_bytes: Dict[str, int] = {}  # loopback traffic by category (never on the wire)
        self.rounds = 0  # round trips to other machines

    def answerers(self, machine: int) -> List[int]:
        """Who answers for `machine` (its graph servers, or its trainer)."""
        raise NotImplementedError

    def pick(self, machine: int) -> int:
        """The answerer of a LAMP ask to `machine`, drawn at random."""
        ids = self.answerers(machine)
        return ids[torch.randint(len(ids), (1,)).item()]

    def init_history(self, rows: List[HistoryRows]) -> None:
        """This machine's histories at setup (waits)."""
        raise NotImplementedError

    def release(self) -> None:
        """Training is over: free the histories and halo features held in this process (the
        graph servers' owners, engine=server, keep theirs until they stop)."""

    def ship_weights(self, w: Weights, wait: bool) -> None:
        """The weights this machine's owners compute with from now on."""
        raise NotImplementedError

    def ask(self, asks: List[Tuple[int, Roots]]) -> Ticket:
        """Send a batch's roots, one ask per owner machine."""
        raise NotImplementedError

    def ask_local(self, ticket: Ticket, pull: HistoryPull) -> None:
        """Add this machine's history rows for the batch's middle blocks to `ticket`."""
        raise NotImplementedError

    def answers(self, ticket: Ticket) -> Answers:
        """Wait for a batch's answers."""
        raise NotImplementedError

    def push_history(self, rows: List[HistoryRows]) -> None:
        """Fresh rows of this machine's own nodes into its histories."""
        raise NotImplementedError

    def sync_halo(self, asks: List[Tuple[int, HistoryPull]]) -> None:
        """Ask owners for halo rows: (answerer, pull) each (answered by `halo_answers`, or with a
        later batch's `answers`)."""
        raise NotImplementedError

    def halo_answers(self) -> Optional[Dict[int, Rows]]:
        """The halo sync's answers when they come apart from the batches' (waits), else None."""
        return None

    def store_halo(self, rows: List[HistoryRows]) -> None:
        """Synced halo rows into this machine's histories."""
        raise NotImplementedError

    def push_grads(self, pushes: List[Tuple[int, GradRows]]) -> None:
        """grad=push: gradient rows of answers, to their answerers."""
        raise NotImplementedError

    def ask_owner_grads(self) -> None:
        """grad=push: ask for the parameter gradients this machine's owners computed from pushed rows."""

    def owner_grads(self) -> List[Grads]:
        """Those gradients (waits for what `ask_owner_grads` asked)."""
        raise NotImplementedError

    def drain(self) -> None:
        """Wait for every acknowledgement still in flight."""


class LampServiceError(RuntimeError):
    """An owner failed to answer (the owner keeps running)."""
