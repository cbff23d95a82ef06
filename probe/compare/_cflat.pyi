"""Type stub of the C extension ``_cflat.c`` (the rows of a dump.json entry in one pass)."""
from array import array
from typing import Any, Callable

def init(Row: type, Leaf: type, Entry: type, UNSET: Any, entry_keys: tuple, stat_keys: tuple, tensor_types: tuple,
         plain_types: tuple, dtypes: dict, shapes: dict, leaf: Callable, walk: Callable) -> None:
    """What ``entry_rows`` makes (``Row``), reads (``Leaf``) and falls back on (``leaf``, ``walk``)."""

def entry_rows(entry_name: str, entry: Any, out: list, store: array) -> None:
    """``rows._entry_rows``: the entry's rows appended to ``out``, their statistics to ``store``."""

def fields(rows: list, names: tuple) -> tuple:
    """Per name, the list of each row's attribute (None for a None row)."""

def side_rows(data: dict, decode: Callable, decode_entry: Callable, skip: str, flatten: Callable,
              out: list, store: array) -> int:
    """Every entry of ``data`` (name -> raw JSON) decoded and flattened into ``out``; how many."""

def codes(values: list, identity: bool) -> tuple[list, bytearray]:
    """``codes.codes`` of a list: (the distinct values in order, per value its index as int32);
    ``identity``: only the same object shares a code."""

def api_keys(entries: list, forward: str, backward: str) -> list:
    """``engine._api_keys``: per entry, an API call's entry with its counter set to 0, else the entry."""

def g3_texts(head: str, numbers: Any, tail: str) -> list:
    """``engine._g3_texts``: ``head + "%.3g" % x + tail`` for each float64 ``x`` of ``numbers`` (a buffer)."""
