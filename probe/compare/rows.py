"""Flatten dump.json entries into one row per tensor (or argument), msprobe's naming.

Row names are the entry name plus ``.input.{i}`` / ``.input.{kwarg}`` /
``.output.{i}`` / ``.parameters.{name}``, nested lists adding ``.{j}``; parameter
gradients (``...parameters_grad[.N]``) add ``.{param name}``.  Within an entry the rows
come inputs, parameters, outputs: msprobe's order, so its users read the same table.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import msgspec

from .reader import Entry, Leaf
from probe.vocabulary import ENTRY_KEYS, IO_PARTS, PARAMETERS, PARAMETERS_GRAD, STAT_KEYS, parse_entry_name
from probe.vocabulary import direction  # noqa: F401  (engine reads it from here)

_ORDER = {io: k for k, io in enumerate(IO_PARTS)}
STAT_FIELDS = ("max", "min", "mean", "norm")      # Row's fields of vocabulary.STAT_KEYS, in order
_NAN = float("nan")


class Row(msgspec.Struct, gc=False):
    """One comparable item of one side.

    A struct the cyclic garbage collector does not track, its statistics fields rather
    than a tuple (a tuple is tracked): a 100k-entry compare makes 600k rows, and tracking
    them and their statistics cost a 0.5 s collection once the compare let the collector
    run again.  Rows hold strings, numbers and shared shape tuples: no cycles."""
    name: str
    entry: str
    io: str                 # input / parameters / output / parameters_grad
    kind: str               # tensor / value / none
    dtype: Optional[str] = None
    shape: Optional[tuple] = None
    max: float = _NAN       # the statistics, vocabulary.STAT_KEYS (``stats``)
    min: float = _NAN
    mean: float = _NAN
    norm: float = _NAN
    requires_grad: Optional[bool] = None
    md5: Optional[str] = None
    data_name: Optional[str] = None
    value: Any = None

    @property
    def stats(self) -> tuple:
        """Max, Min, Mean, Norm (vocabulary.STAT_KEYS)."""
        return (self.max, self.min, self.mean, self.norm)

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0


def _num(x) -> float:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return float(x)
    return _NAN


_TENSOR_TYPES = ("torch.Tensor", "numpy.ndarray")
_PLAIN_TYPES = ("int", "float", "bool", "str")
_shapes: dict = {}          # one tuple per distinct shape, shared by all rows that have it
_dtypes: dict = {}          # one string per distinct dtype (smaller to pickle and to hold)


def _leaf(name, entry, io, leaf: Leaf) -> Row:
    kind_type = leaf.type
    if kind_type in _TENSOR_TYPES or leaf.dtype is not None and leaf.shape is not None:
        mx, mn, mean, norm = leaf.Max, leaf.Min, leaf.Mean, leaf.Norm
        if type(mx) is not float or type(mn) is not float or type(mean) is not float or type(norm) is not float:
            mx, mn, mean, norm = map(_num, (mx, mn, mean, norm))
        dtype = leaf.dtype
        dtype = _dtypes.setdefault(dtype, dtype) if type(dtype) is str else str(dtype)
        shape = tuple(leaf.shape or ())
        try:
            shape = _shapes.setdefault(shape, shape)
        except TypeError:       # a malformed (nested) shape: not shared
            pass
        return Row(name, entry, io, "tensor", dtype, shape, mx, mn, mean, norm,
                   leaf.requires_grad, leaf.md5, leaf.data_name or None)
    value = leaf.value
    if kind_type in _PLAIN_TYPES:
        dtype = f"<class '{type(value).__name__}'>"
    else:
        dtype = str(kind_type)
    v = _num(value)
    return Row(name, entry, io, "value", dtype, (), v, v, v, v, None, None, None, value)


def _walk(name, entry, io, data, out, index_lists=True):
    if data is None:
        out.append(Row(name, entry, io, "none"))
    elif type(data) is Leaf:
        out.append(_leaf(name, entry, io, data))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            item_name = f"{name}.{i}" if index_lists else name
            if type(item) is Leaf:          # the common leaf
                out.append(_leaf(item_name, entry, io, item))
            else:
                _walk(item_name, entry, io, item, out, index_lists)
    elif isinstance(data, dict):
        if isinstance(data.get("type"), str):
            out.append(_leaf(name, entry, io, msgspec.convert(data, Leaf)))
        else:
            for key, item in data.items():
                _walk(f"{name}.{key}", entry, io, item, out, index_lists)


def _parts(entry: Entry | dict) -> list:
    """(io, part) of each ENTRY_KEYS part the entry holds, in that order."""
    if isinstance(entry, Entry):
        parts = [(io, getattr(entry, key)) for key, io in ENTRY_KEYS]
        return [(io, part) for io, part in parts if part is not None]
    return [(io, entry[key]) for key, io in ENTRY_KEYS if key in entry]


def flatten(entry_name: str, entry: Entry | dict) -> list[Row]:
    """All rows of one dump.json entry (a struct or, where it did not fit one, a dict), in
    msprobe's row order."""
    out: list[Row] = []
    if type(entry) is dict and PARAMETERS_GRAD in entry_name:
        parsed = parse_entry_name(entry_name)
        if parsed is not None and parsed.direction == PARAMETERS_GRAD and not parsed.io:
            for key, item in entry.items():
                _walk(f"{entry_name}.{key}", entry_name, PARAMETERS_GRAD, item, out, index_lists=False)
            return out
    if type(entry) is not Entry and not isinstance(entry, dict):
        return out
    parts = _parts(entry)
    for io, part in parts:
        _walk(f"{entry_name}.{io}", entry_name, io, part, out)
    if any(io == PARAMETERS for io, _ in parts) and any(r.io == PARAMETERS for r in out):
        out.sort(key=lambda r: _ORDER[r.io])   # stable: keeps order within each group
    return out
