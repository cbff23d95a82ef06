"""Sets of non-negative integers kept as sorted, disjoint ``(lo, hi)`` intervals.

config.json's ``step`` and ``rank`` lists may name ranges (``"0-1000000000000"``): kept
as one interval, not as its members. Building the members as a set grew a process to
24 GB until the OOM killer stopped it; an interval costs the same for any width, and a
membership test is a binary search over the intervals.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterable, Tuple


@dataclass(frozen=True)
class IntRanges:
    """``spans``: sorted, disjoint, non-adjacent ``(lo, hi)`` pairs, both ends included."""
    spans: Tuple[Tuple[int, int], ...] = ()

    @classmethod
    def of(cls, pairs: Iterable[Tuple[int, int]]) -> "IntRanges":
        """The union of ``pairs`` (``lo <= hi`` each, in any order, overlapping or not)."""
        merged: list = []
        for lo, hi in sorted(pairs):
            if merged and lo <= merged[-1][1] + 1:
                if hi > merged[-1][1]:
                    merged[-1][1] = hi
            else:
                merged.append([lo, hi])
        return cls(tuple((lo, hi) for lo, hi in merged))

    def __contains__(self, n) -> bool:
        # the first span starting after n is at i; n is in the span before it, if anywhere
        i = bisect_right(self.spans, (n, math.inf))
        return i > 0 and n <= self.spans[i - 1][1]

    def __bool__(self) -> bool:
        return bool(self.spans)

    @property
    def first(self) -> int:
        """The smallest member (the set must not be empty)."""
        return self.spans[0][0]

    def __str__(self) -> str:
        return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.spans)
