"""Distinct values as small integer codes: the page's repeated texts (names' suffixes,
dtypes, shapes, groups) and the keys the diagnosis matches tensors by."""
from __future__ import annotations

from typing import Iterable

import numpy as np


def codes(values: Iterable, count: int = -1) -> tuple[list, np.ndarray]:
    """(the distinct values in order of first appearance, per value its index as int32).

    ``values`` is read once, so a generator serves (no list of them is held: a Python
    step per value); a list is coded in C (``_cflat.codes``: each object hashed once, the
    repeats found by address; else ``dict.fromkeys`` and ``map``). ``count``: how many
    there are, where known (the array is then made at its size)."""
    if type(values) is not list:
        index: dict = {}
        ids = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int32, count)
        return list(index), ids
    if _cflat is not None:              # each object hashed once, not once per value
        distinct, raw = _cflat.codes(values, False)
        return distinct, np.frombuffer(raw, np.int32)
    distinct = list(dict.fromkeys(values))
    where = dict(zip(distinct, range(len(distinct))))
    return distinct, np.fromiter(map(where.__getitem__, values), np.int32, len(values))


def object_codes(values: list) -> tuple[list, np.ndarray]:
    """``codes`` by identity: only the same object shares a code (values that need not be
    hashable; a side's rows share one shape tuple per distinct shape)."""
    if _cflat is not None:
        distinct, raw = _cflat.codes(values, True)
        return distinct, np.frombuffer(raw, np.int32)
    by_id = dict(zip(map(id, values), values))
    where = dict(zip(by_id, range(len(by_id))))
    return list(by_id.values()), np.fromiter(map(where.__getitem__, map(id, values)), np.int32, len(values))


try:
    from . import _cflat
except ImportError:         # built without a C compiler: the same codes, in Python
    _cflat = None           # type: ignore[assignment]
