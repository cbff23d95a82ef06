"""Flatten dump.json entries into one row per tensor (or argument), msprobe's naming.

Row names are the entry name plus ``.input.{i}`` / ``.input.{kwarg}`` /
``.output.{i}`` / ``.parameters.{name}``, nested lists adding ``.{j}``; parameter
gradients (``...parameters_grad[.N]``) add ``.{param name}``.  Within an entry the rows
come inputs, parameters, outputs: msprobe's order, so its users read the same table.
"""
from __future__ import annotations

import math
import sys
from array import array
from itertools import repeat
from operator import attrgetter, is_
from typing import Any, Optional

import msgspec
import numpy as np
from msgspec import UNSET

from .codes import object_codes
from .reader import Entry, Leaf, RawEntries
from probe.errors import DumpError
from probe.vocabulary import ENTRY_KEYS, IO_PARTS, PARAMETERS, PARAMETERS_GRAD, STAT_KEYS, parse_entry_name
from probe.vocabulary import direction  # noqa: F401  (engine reads it from here)

_ORDER = {io: k for k, io in enumerate(IO_PARTS)}
_NAN = float("nan")
_WIDTH = len(STAT_KEYS)               # statistics a row has, in the order of STAT_KEYS
_NO_STATS = (_NAN,) * _WIDTH
_stats_of_leaf = attrgetter(*STAT_KEYS)


class Row(msgspec.Struct, gc=False, eq=False):
    """One comparable item of one side.

    Its statistics live in its side's ``store`` (``len(STAT_KEYS)`` float64 per row, from
    ``k`` times that): 32 bytes a row where four Python floats were 128, and read for many rows at once as an
    array (``stats_of``).  A struct the cyclic garbage collector does not track: a
    100k-entry compare makes 600k rows, and tracking them cost a 0.5 s collection once
    the compare let the collector run again (rows hold strings, numbers, shared shape
    tuples and the store: no cycles)."""
    name: str
    entry: str
    io: str                 # input / parameters / output / parameters_grad
    kind: str               # tensor / value / none
    dtype: Optional[str] = None
    shape: Optional[tuple] = None
    store: Optional[array] = None   # the side's statistics; None: the row has none
    k: int = -1                     # this row's place in ``store``
    requires_grad: Optional[bool] = None
    md5: Optional[str] = None
    data_name: Optional[str] = None
    value: Any = None
    unread: bool = False            # an uninitialised buffer (torch.empty, out=), a handle: not data, never compared

    @property
    def stats(self) -> tuple:
        """Max, Min, Mean, Norm (vocabulary.STAT_KEYS); NaN where the row has none."""
        s = self.store
        if s is None:
            return _NO_STATS
        i = _WIDTH * self.k
        return tuple(s[i:i + _WIDTH])

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0

    def __eq__(self, other) -> bool:
        """The same item: its fields and statistics (NaN the same as NaN), wherever they are stored."""
        if type(other) is not Row:
            return NotImplemented
        if (self.name, self.entry, self.io, self.kind, self.dtype, self.shape, self.requires_grad,
                self.md5, self.data_name, self.value) != \
                (other.name, other.entry, other.io, other.kind, other.dtype, other.shape,
                 other.requires_grad, other.md5, other.data_name, other.value):
            return False
        return all(x == y or (x != x and y != y) for x, y in zip(self.stats, other.stats))

    # mutable: not a dict key
    __hash__ = None         # type: ignore[assignment]


def stats_of(rows: list) -> np.ndarray:
    """``len(rows)`` x ``len(STAT_KEYS)`` statistics, NaN for a None row or a row without
    statistics; the rows of one side are read from its store at once."""
    return stats_in(*fields_of(rows, ("store", "k")))


def numels(shapes) -> list:
    """``Row.numel`` of each shape, worked out once per distinct shape."""
    memo: dict = {}
    out = []
    for s in shapes:
        try:
            n = memo.get(s)
        except TypeError:           # a malformed (nested) shape
            out.append(_numel(s))
            continue
        if n is None:
            n = memo[s] = _numel(s)
        out.append(n)
    return out


_FLOAT_MAX = sys.float_info.max      # a larger element count reads as inf (a garbage shape)


def numel_array(shapes: list) -> np.ndarray:
    """``numels`` of ``shapes`` as float64, inf past float64's range; each distinct shape
    object worked out once (a side's rows share one tuple per distinct shape)."""
    distinct, ids = object_codes(shapes)
    return np.array([n if n <= _FLOAT_MAX else math.inf for n in numels(distinct)] or [0.0], np.float64)[ids]


def _numel(shape) -> int:
    """Elements of ``shape``; 0 for none, or for one with a size not known (null)."""
    if shape is None:
        return 0
    try:
        return math.prod(shape)
    except TypeError:
        return 0


def field_of(rows: list, name: str) -> list:
    """One field of each row, None where a side has no row (read in C while every row is
    there, as in most pairs)."""
    get = attrgetter(name)
    try:
        return list(map(get, rows))
    except AttributeError:          # a None among them
        return [get(r) if r is not None else None for r in rows]


def fields_of(rows: list, names: tuple) -> tuple:
    """``field_of`` of several fields, in one pass over the rows where the C extension
    was built (a row's memory visited once: 350k rows a side)."""
    if _cflat is not None:
        return _cflat.fields(rows, names)
    return tuple(field_of(rows, name) for name in names)


def stats_in(stores: list, ks: list) -> np.ndarray:
    """``stats_of`` of rows given by their ``store`` and ``k`` (``fields_of``'s lists);
    the rows of each store (a side has one) read from it at once."""
    n = len(ks)
    out = np.full((n, _WIDTH), np.nan)
    distinct, which = object_codes(stores)       # (by identity: equal stores are not the same)
    if len(distinct) == 1 and distinct[0] is not None:     # the usual case: every row in one store
        out[:] = _table(distinct[0])[np.fromiter(ks, np.int64, n)]
        return out
    k = np.array(ks, dtype=object)                # (None: no row)
    for c, store in enumerate(distinct):
        if store is not None:
            mine = np.flatnonzero(which == c)
            out[mine] = _table(store)[k[mine].astype(np.int64)]
    return out


def _table(store: array) -> np.ndarray:
    """A store's statistics as rows x ``len(STAT_KEYS)`` (its memory, not a copy)."""
    return np.frombuffer(store, dtype=np.float64).reshape(-1, _WIDTH)


def _num(x) -> float:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        try:
            return float(x)
        except OverflowError:           # an integer beyond float64: infinite, as 1e400 reads
            return math.inf if x > 0 else -math.inf
    return _NAN


_TENSOR_TYPES = ("torch.Tensor", "numpy.ndarray")
_PLAIN_TYPES = ("int", "float", "bool", "str")
_shapes: dict = {}          # one tuple per distinct shape, shared by all rows that have it
_dtypes: dict = {}          # one string per distinct dtype (smaller to pickle and to hold)


def _leaf(name, entry, io, leaf, store: array) -> Row:
    """The row of one ``reader.Leaf``."""
    kind_type = leaf.type
    k = len(store) // _WIDTH
    if kind_type in _TENSOR_TYPES or leaf.dtype is not UNSET and leaf.shape is not UNSET:   # both keys there
        try:
            store.fromlist(list(_stats_of_leaf(leaf)))     # all or none of them
        except (TypeError, OverflowError):                 # None, text: NaN; 10**400: inf
            store.extend(map(_num, _stats_of_leaf(leaf)))
        dtype = leaf.dtype if leaf.dtype is not UNSET else None
        dtype = _dtypes.setdefault(dtype, dtype) if type(dtype) is str else str(dtype)
        shape = tuple((leaf.shape if leaf.shape is not UNSET else None) or ())
        try:
            shape = _shapes.setdefault(shape, shape)
        except TypeError:       # a malformed (nested) shape: not shared
            pass
        return Row(name, entry, io, "tensor", dtype, shape, store, k,
                   leaf.requires_grad, leaf.md5, leaf.data_name or None,
                   unread=leaf.uninitialized is True or leaf.opaque is True)
    value = leaf.value
    if kind_type in _PLAIN_TYPES:
        dtype = f"<class '{type(value).__name__}'>"
    else:
        dtype = str(kind_type)
    v = _num(value)
    store.extend((v,) * _WIDTH)
    return Row(name, entry, io, "value", dtype, (), store, k, None, None, None, value)


def _walk(name, entry, io, data, out, store, index_lists=True):
    if data is None:
        out.append(Row(name, entry, io, "none"))
    elif type(data) is Leaf:
        out.append(_leaf(name, entry, io, data, store))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            item_name = f"{name}.{i}" if index_lists else name
            if type(item) is Leaf:          # the common leaf
                out.append(_leaf(item_name, entry, io, item, store))
            else:
                _walk(item_name, entry, io, item, out, store, index_lists)
    elif isinstance(data, dict):
        if isinstance(data.get("type"), str):
            try:
                leaf = msgspec.convert(data, Leaf)
            except msgspec.ValidationError as exc:      # text for a shape, a list for a data_name
                raise DumpError(f"entry {entry!r}: {name}: {exc}") from None
            out.append(_leaf(name, entry, io, leaf, store))
        else:
            for key, item in data.items():
                _walk(f"{name}.{key}", entry, io, item, out, store, index_lists)
    # (a bare number or text where a description belongs: no row, as msprobe's compare)


def _entry_rows(entry_name: str, entry: Entry, out: list, store: array) -> None:
    """The rows of a struct entry: its parts' leaves named ``{entry}.{io}.{i or key}``,
    the common case without ``_walk``'s recursion (which took a third longer on
    bench/compare.py's 100k-entry pair)."""
    for key, io in ENTRY_KEYS:
        part = getattr(entry, key)
        if part is UNSET:
            continue
        if type(part) is list:
            items: Any = enumerate(part)
        elif type(part) is dict:
            items = part.items()
        else:
            _walk(f"{entry_name}.{io}", entry_name, io, part, out, store)
            continue
        prefix = f"{entry_name}.{io}."
        for i, item in items:
            if type(item) is Leaf:
                out.append(_leaf(f"{prefix}{i}", entry_name, io, item, store))
            else:
                _walk(f"{prefix}{i}", entry_name, io, item, out, store)


try:
    from . import _cflat
except ImportError:         # built without a C compiler: the same rows, in Python
    _cflat = None           # type: ignore[assignment]
else:
    _cflat.init(Row, Leaf, Entry, UNSET, ENTRY_KEYS, STAT_KEYS, _TENSOR_TYPES, _PLAIN_TYPES, _dtypes, _shapes,
                _leaf, _walk)


def entry_rows(entry_name: str, entry: Entry, out: list, store: array) -> None:
    """``_entry_rows``, in C where the extension was built (its common leaves ~4x faster:
    the per-leaf Python call was ~60% of reading bench/compare.py's 100k-entry pair)."""
    if _cflat is not None:
        _cflat.entry_rows(entry_name, entry, out, store)
    else:
        _entry_rows(entry_name, entry, out, store)


def side_rows(entries: RawEntries, out: list, store: array) -> int:
    """The rows of every entry of ``entries`` appended to ``out`` (statistics to
    ``store``), in file order: what ``flatten`` of each gives; how many entries.  In C
    where the extension was built (one call for the dump), else entry by entry here."""
    if _cflat is not None:
        return _cflat.side_rows(entries.data, entries.decode, entries.decode_entry, entries.dicts_named,
                                flatten, out, store)
    data = entries.data
    names = list(data)
    for name in names:
        out.extend(flatten(name, entries.decode_entry(name, data.pop(name)), store))
    return len(names)


def flatten(entry_name: str, entry: Entry | dict, store: array | None = None) -> list[Row]:
    """All rows of one dump.json entry (a struct or, where it did not fit one, a dict), in
    msprobe's row order; their statistics appended to ``store`` (a side's, or their own)."""
    out: list[Row] = []
    store = store if store is not None else array("d")
    if type(entry) is Entry:
        entry_rows(entry_name, entry, out, store)
        if entry.parameters is not UNSET and any(r.io == PARAMETERS for r in out):
            out.sort(key=lambda r: _ORDER[r.io])   # stable: keeps order within each group
        return out
    if not isinstance(entry, dict):
        return out
    if PARAMETERS_GRAD in entry_name:
        parsed = parse_entry_name(entry_name)
        if parsed is not None and parsed.direction == PARAMETERS_GRAD and not parsed.io:
            for key, item in entry.items():
                _walk(f"{entry_name}.{key}", entry_name, PARAMETERS_GRAD, item, out, store, index_lists=False)
            return out
    parts = [(io, entry[key]) for key, io in ENTRY_KEYS if key in entry]
    for io, part in parts:
        _walk(f"{entry_name}.{io}", entry_name, io, part, out, store)
    if any(io == PARAMETERS for io, _ in parts) and any(r.io == PARAMETERS for r in out):
        out.sort(key=lambda r: _ORDER[r.io])   # stable: keeps order within each group
    return out
