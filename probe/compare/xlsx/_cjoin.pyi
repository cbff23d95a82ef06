"""Type stub of the C extension ``_cjoin.c`` (the rows of a sheet or CSV in one pass)."""
from typing import Sequence, Union

_Part = Union[list, str, int, tuple]

def join_rows(parts: Sequence[_Part], m: int, sep: str, end: str) -> bytes:
    """``m`` rows, each its parts' texts in order (``sep`` between, ``end`` after), UTF-8."""

class Rows:
    """Rows checked and ready to join (on any thread: ``join`` releases the GIL)."""
    def join(self) -> bytes: ...

def rows(parts: Sequence[_Part], m: int, sep: str, end: str) -> Rows:
    """``parts`` checked (their texts' UTF-8 made), to be joined by ``Rows.join``."""

def tail_codes(texts: list, heads: list, which: bytes) -> tuple[list, bytes] | None:
    """``codes`` of each text's tail after its head (``which``: int32 indices into ``heads``), or None."""

block_parts: bool
"""Whether ``_cfloat`` was there when this was imported: parts may then hold a ``_cfloat.Block``."""
