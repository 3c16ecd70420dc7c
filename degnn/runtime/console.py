"""The trainer's console: log lines and tqdm progress bars on one stream, neither overwriting the other.

`TqdmLogHandler` writes every log record through `tqdm.write`: the bars drawn on that stream are
cleared, the line is written, the bars are drawn again below it. `progress_bar` is the epoch bar
that goes with it: cleared when it closes (the epoch's log line follows on a clean line), and not
drawn at all where nobody watches a terminal (`bars_enabled`), so a captured console or log file
holds log lines only. (tqdm's `delay=` is not used: `tqdm.write` redraws a bar still inside its
delay, and its `close` then leaves that bar on screen.)
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from tqdm import tqdm

# DEGNN_PROGRESS=0 turns the bars off, =1 on; unset: on under degnn's launcher (it tees rank 0 to
# its own console, which this process cannot see), else only when stderr is a terminal
PROGRESS_ENV = "DEGNN_PROGRESS"


class TqdmLogHandler(logging.StreamHandler):
    """A StreamHandler whose lines go through `tqdm.write`, around the bars on the same stream."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging's own policy: report, never raise
            self.handleError(record)


def bars_enabled() -> bool:
    value = os.environ.get(PROGRESS_ENV)
    if value is not None:
        return value.strip() not in ("0", "false", "no", "")
    if os.environ.get("DEGNN_LAUNCHED"):
        return True
    return sys.stderr.isatty()


def progress_bar(total: Optional[int], desc: str, enabled: bool = True) -> tqdm:
    """An epoch's bar (batches) on stderr, where the log lines go: `enabled=False` (e.g. not rank 0)
    or `bars_enabled()` false gives a disabled bar that can be updated and closed all the same."""
    return tqdm(total=total, desc=desc, unit="batch", file=sys.stderr, leave=False, mininterval=1.0,
                disable=not (enabled and bars_enabled()))
