"""The diagnosis's calls as columns, each field read once for the whole report.

The Diagnosis sheet and the page both show each call's names, direction, errors and
threshold; on the 100k-entry pair, reading 100k calls' fields twice (and their threshold,
a property, twice) was ~0.1 s of the report's single thread.
"""
from __future__ import annotations

from operator import attrgetter


class CallFields:
    """Per field name, the list of that field over ``calls`` (``attrgetter`` mapped in C),
    read at the first ask and kept while this object lives (the page is the report's
    peak of memory: what only the sheet reads is not kept for it)."""

    def __init__(self, calls: list):
        self.calls = calls
        self.read: dict = {}

    def __call__(self, name: str, keep: bool = True) -> list:
        """The field's list; ``keep``: whether to keep it for a later ask (another part of
        the report reads it too)."""
        column = self.read.get(name)
        if column is None:
            column = list(map(attrgetter(name), self.calls))
            if keep:
                self.read[name] = column
        return column

    def judged_thresholds(self) -> list:
        """Each call's threshold where it was judged (it has an output error), else None."""
        column = self.read.get(" judged thresholds")
        if column is None:
            column = self.read[" judged thresholds"] = [
                u.threshold if e is not None else None for u, e in zip(self.calls, self("output_error"))]
        return column
