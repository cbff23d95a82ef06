"""Flatten dump.json entries into one row per tensor (or argument), msprobe's naming.

Row names are the entry name plus ``.input.{i}`` / ``.input.{kwarg}`` /
``.output.{i}`` / ``.parameters.{name}``, nested lists adding ``.{j}``; parameter
gradients (``...parameters_grad[.N]``) add ``.{param name}``.  Within an entry the rows
come inputs, parameters, outputs: msprobe's order, so its users read the same table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from probe.python_compat import SLOTS
from probe.vocabulary import ENTRY_KEYS, IO_PARTS, PARAMETERS_GRAD, STAT_KEYS, parse_entry_name
from probe.vocabulary import direction  # noqa: F401  (engine reads it from here)

_ORDER = {io: k for k, io in enumerate(IO_PARTS)}
_NAN = float("nan")


@dataclass(**SLOTS)
class Row:
    """One comparable item of one side."""
    name: str
    entry: str
    io: str                 # input / parameters / output / parameters_grad
    kind: str               # tensor / value / none
    dtype: str | None = None
    shape: tuple | None = None
    stats: tuple = (_NAN,) * len(STAT_KEYS)   # vocabulary.STAT_KEYS: Max, Min, Mean, Norm
    requires_grad: bool | None = None
    md5: str | None = None
    data_name: str | None = None
    value: object = None

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


def _leaf(name, entry, io, data) -> Row:
    kind_type = data.get("type")
    get = data.get
    if kind_type in _TENSOR_TYPES or "dtype" in data and "shape" in data:
        stats = tuple([v if type(v) is float else _num(v) for v in map(get, STAT_KEYS)])
        dtype = get("dtype")
        dtype = _dtypes.setdefault(dtype, dtype) if type(dtype) is str else str(dtype)
        shape = tuple(get("shape") or ())
        try:
            shape = _shapes.setdefault(shape, shape)
        except TypeError:       # a malformed (nested) shape: not shared
            pass
        return Row(name, entry, io, "tensor", dtype, shape,
                   stats, get("requires_grad"), get("md5"), get("data_name") or None)
    value = get("value")
    if kind_type in _PLAIN_TYPES or kind_type is None:
        dtype = f"<class '{type(value).__name__}'>"
    else:
        dtype = str(kind_type)
    v = _num(value)
    return Row(name, entry, io, "value", dtype, (), (v,) * len(STAT_KEYS), None, None, None, value)


def _walk(name, entry, io, data, out, index_lists=True):
    if data is None:
        out.append(Row(name, entry, io, "none"))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            item_name = f"{name}.{i}" if index_lists else name
            if type(item) is dict and type(item.get("type")) is str:    # the common leaf
                out.append(_leaf(item_name, entry, io, item))
            else:
                _walk(item_name, entry, io, item, out, index_lists)
    elif isinstance(data, dict):
        if isinstance(data.get("type"), str):
            out.append(_leaf(name, entry, io, data))
        else:
            for key, item in data.items():
                _walk(f"{name}.{key}", entry, io, item, out, index_lists)


def flatten(entry_name: str, entry) -> list[Row]:
    """All rows of one dump.json entry, in msprobe's row order."""
    out: list[Row] = []
    if not isinstance(entry, dict):
        return out
    if PARAMETERS_GRAD in entry_name:
        parsed = parse_entry_name(entry_name)
        if parsed is not None and parsed.direction == PARAMETERS_GRAD and not parsed.io:
            for key, item in entry.items():
                _walk(f"{entry_name}.{key}", entry_name, PARAMETERS_GRAD, item, out, index_lists=False)
            return out
    for key, io in ENTRY_KEYS:
        if key in entry:
            _walk(f"{entry_name}.{io}", entry_name, io, entry[key], out)
    if "parameters" in entry and any(r.io == "parameters" for r in out):
        out.sort(key=lambda r: _ORDER[r.io])   # stable: keeps order within each group
    return out
