"""Median and min–max of a quantity over a setting's repeats, and whether two sides' ranges overlap.

bench.repeats runs every suite several times (both orders); a table gives each side's median with
its min–max, and a ratio of two medians whose ranges overlap is marked so: the repeats do not
separate the two sides. The two sides of one repeat run back to back, so the ratio within each
repeat (`paired`) cancels what moves the host's speed between repeats: its spread says how far
the repeats agree on the comparison itself.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional

from .records import repeat_of

OVERLAP = "ranges overlap"


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float
    n: int

    def cell(self, spec: str = ".2f") -> str:
        """`median (min–max)`, or the value alone for one repeat."""
        if self.n == 1 or self.lo == self.hi:
            return format(self.median, spec)
        return f"{format(self.median, spec)} ({format(self.lo, spec)}–{format(self.hi, spec)})"

    def rel_range(self) -> Optional[float]:
        """(max − min) / median; None for a zero median."""
        return (self.hi - self.lo) / self.median if self.median else None


def median(values: Iterable[float]) -> Optional[float]:
    """statistics.median, None for no values."""
    v = list(values)
    return statistics.median(v) if v else None


def spread(values: Iterable[Optional[float]]) -> Optional[Spread]:
    """The spread of the values that are there (None left out); None when none is."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return Spread(median(v), v[0], v[-1], len(v))


def overlap(a: Optional[Spread], b: Optional[Spread]) -> bool:
    """Whether two sides' min–max ranges overlap (false when both sides are single values: one
    repeat each says nothing about the spread)."""
    if a is None or b is None or (a.n < 2 and b.n < 2):
        return False
    return a.lo <= b.hi and b.lo <= a.hi


def share(s: Optional[Spread]) -> str:
    """(max − min) / median as a percentage, `–` where there is none."""
    return "–" if s is None or s.rel_range() is None else format(100 * s.rel_range(), ".0f") + "%"


def cell(s: Optional[Spread], spec: str = ".2f") -> str:
    return "–" if s is None else s.cell(spec)


def ratio_cell(num: Optional[Spread], den: Optional[Spread], bold: bool = True, spec: str = ".2f") -> str:
    """num.median / den.median as `1.23x`, with the overlap mark when the ranges overlap."""
    if num is None or den is None or not den.median or not num.median:
        return "–"
    text = f"{format(num.median / den.median, spec)}x"
    text = f"**{text}**" if bold else text
    return text + (f" ({OVERLAP})" if overlap(num, den) else "")


def paired_ratios(num: List[dict], den: List[dict], value: Callable[[dict], Optional[float]]) -> List[float]:
    """value(num run) / value(den run) within each repeat both sides ran (one run a side and
    repeat, of one bench invocation: runs of two invocations did not run back to back), in repeat
    order."""
    a = {_repeat(r): value(r) for r in num}
    b = {_repeat(r): value(r) for r in den}
    return [a[k] / b[k] for k in sorted(a.keys() & b.keys()) if a[k] and b[k]]


def _repeat(run: dict) -> tuple:
    return (run.get("_record") or {}).get("invocation") or "", repeat_of(run["_rel"])


def paired(num: List[dict], den: List[dict], value: Callable[[dict], Optional[float]]) -> Optional[Spread]:
    """The spread of `paired_ratios`; None when no repeat has both sides."""
    return spread(paired_ratios(num, den, value))


def paired_cell(s: Optional[Spread]) -> str:
    """`1.45x (1.34–1.47), 9%`: the within-repeat ratios' median, min–max and spread."""
    if s is None:
        return "–"
    if s.n < 2:
        return f"{s.median:.2f}x"
    return f"{s.median:.2f}x ({s.lo:.2f}–{s.hi:.2f}), {share(s)}"
