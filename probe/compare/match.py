"""Pair NPU rows with bench rows: rows in, pairs out.

``pair_rows`` chooses: exact names when both sides made the same calls, sequence
alignment (align.py) when they differ, or what the caller asked for.

- exact: same row name.
- fuzzy: the call counter is ignored; the k-th call of an API on one side pairs with
  the k-th call of the same API (same direction, same argument path) on the other.
  One extra call on one side then shifts only that API's pairs, not every counter.

Rows present on one side only are kept as pairs with the other side ``None``; bench-only
rows are placed right after the NPU row that precedes them in bench order.
"""
from __future__ import annotations

from itertools import repeat
from operator import attrgetter
from typing import Optional

import msgspec

from .align import align_calls, build_calls, rows_from_ops
from .rows import Row
from probe.vocabulary import entry_key


class Pair(msgspec.Struct, gc=False):
    """An NPU row and the bench row it is compared with (untracked by the cyclic collector,
    as ``Row``: a big compare makes hundreds of thousands)."""
    npu: Optional[Row]
    bench: Optional[Row]
    align: str = ""          # how the pair was made: exact / fuzzy / anchor / aligned / group .. / unmatched


_NAME = attrgetter("name")


def _fuzzy_keys(rows: list[Row]) -> list[tuple]:
    """(api without counter, occurrence index of that api, argument path) per row."""
    seen: dict[str, int] = {}
    current: dict[str, int] = {}
    keys = []
    for row in rows:
        if row.entry not in current:
            k = entry_key(row.entry)
            current[row.entry] = seen.get(k, 0)
            seen[k] = current[row.entry] + 1
        suffix = row.name[len(row.entry):]
        keys.append((entry_key(row.entry), current[row.entry], suffix))
    return keys


def match(npu: list[Row], bench: list[Row], fuzzy: bool = False) -> list[Pair]:
    """Pair the two sides' rows; every row of either side appears in exactly one pair."""
    npu_keys: list
    bench_keys: list
    if fuzzy:
        npu_keys, bench_keys = _fuzzy_keys(npu), _fuzzy_keys(bench)
    else:
        npu_keys = [r.name for r in npu]
        bench_keys = [r.name for r in bench]
    bench_index: dict = {}
    for i, k in enumerate(bench_keys):
        bench_index.setdefault(k, i)
    used = [False] * len(bench)
    npu_to_bench = []
    for k in npu_keys:
        j = bench_index.get(k)
        if j is not None and not used[j]:
            used[j] = True
            npu_to_bench.append(j)
        else:
            npu_to_bench.append(None)
    # bench-only rows go after the NPU pair whose bench row precedes them
    after: dict[int, list[int]] = {}
    last_matched = -1
    bench_to_npu = {j: i for i, j in enumerate(npu_to_bench) if j is not None}
    for j in range(len(bench)):
        if used[j]:
            last_matched = bench_to_npu[j]
        else:
            after.setdefault(last_matched, []).append(j)
    how = "fuzzy" if fuzzy else "exact"
    pairs = [Pair(None, bench[j], "unmatched") for j in after.get(-1, ())]
    for i, row in enumerate(npu):
        j = npu_to_bench[i]
        pairs.append(Pair(row, bench[j], how) if j is not None else Pair(row, None, "unmatched"))
        for jj in after.get(i, ()):
            pairs.append(Pair(None, bench[jj], "unmatched"))
    return pairs


def pair_rows(npu_rows: list[Row], bench_rows: list[Row], fuzzy: bool = False,
              align: bool | None = None, npu_modules: dict | None = None,
              bench_modules: dict | None = None, notes: list | None = None):
    """Row pairs and the method used ("exact", "fuzzy" or "aligned").

    ``align``: None aligns only when the two call sequences differ (same entry names in
    the same order pair exactly either way); True always aligns; False keeps exact names.
    """
    if fuzzy:
        return match(npu_rows, bench_rows, fuzzy=True), "fuzzy"
    if align is False:
        return match(npu_rows, bench_rows), "exact"
    if align is None and len(npu_rows) == len(bench_rows):
        names = list(map(_NAME, npu_rows))          # (the names read in C: 350k rows a side)
        if names == list(map(_NAME, bench_rows)):
            if len(set(names)) == len(names):        # unique names: k-th with k-th
                return list(map(Pair, npu_rows, bench_rows, repeat("exact"))), "exact"
            return match(npu_rows, bench_rows), "exact"     # the common case, decided cheaply
    A, B = build_calls(npu_rows, npu_modules), build_calls(bench_rows, bench_modules)
    if align is None and len(A) == len(B) and all(a.entry == b.entry for a, b in zip(A, B)):
        return match(npu_rows, bench_rows), "exact"
    ops = align_calls(A, B, notes)
    return rows_from_ops(ops, A, B, npu_rows, bench_rows, Pair), "aligned"
