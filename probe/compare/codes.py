"""Distinct values as small integer codes: the page's repeated texts (names' suffixes,
dtypes, shapes, groups) and the keys the diagnosis matches tensors by."""
from __future__ import annotations

from typing import Iterable

import numpy as np


def codes(values: Iterable, count: int = -1) -> tuple[list, np.ndarray]:
    """(the distinct values in order of first appearance, per value its index as int32).

    ``values`` is read once, so a generator serves; ``count``: how many there are, where
    known (the array is then made at its size). The values are held as a list while their
    codes are looked up: the distinct ones and each one's code are found in C
    (``dict.fromkeys``, ``map``), where a Python step per value took ~3x as long on the
    page's 350k-row columns."""
    items = values if type(values) is list else list(values)
    distinct = list(dict.fromkeys(items))
    index = dict(zip(distinct, range(len(distinct))))
    return distinct, np.fromiter(map(index.__getitem__, items), np.int32, len(items) if count < 0 else count)
