"""Distinct values as small integer codes: the page's repeated texts (names' suffixes,
dtypes, shapes, groups) and the keys the diagnosis matches tensors by."""
from __future__ import annotations

from typing import Iterable

import numpy as np


def codes(values: Iterable, count: int = -1) -> tuple[list, np.ndarray]:
    """(the distinct values in order of first appearance, per value its index as int32).

    ``values`` is read once, so a generator serves (no list of them is held: a Python
    step per value); a list is coded in C (``dict.fromkeys``, ``map``: a third of the
    time on the page's 350k-row columns). ``count``: how many there are, where known (the
    array is then made at its size)."""
    if type(values) is not list:
        index: dict = {}
        ids = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int32, count)
        return list(index), ids
    distinct = list(dict.fromkeys(values))
    where = dict(zip(distinct, range(len(distinct))))
    return distinct, np.fromiter(map(where.__getitem__, values), np.int32, len(values))
