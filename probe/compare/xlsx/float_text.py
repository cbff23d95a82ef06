"""The texts of floats in the compare's workbook and CSV.

A float is written as the fewest digits that read back as the same float, laid out as
Ryu's printer lays them out: ``1.0``, ``0.00001``, ``1e-7``, ``1.2e30``, ``-0.0``; NaN and
the infinities are ``"null"`` here (the cells and fields around them say what to write).
That is what orjson wrote before 3.11.7, which started writing ``1.2e+30``: made here, the
files no longer depend on which orjson is installed.

The C++ extension ``_cfloat`` (``std::to_chars``) makes them where it was built, and makes
a block's text without the GIL when the rows are joined (``Block``): the 100k-entry
compare writes 7M numbers, which took orjson ~0.6 s on the main thread
(bench/compare.py). The Python here gives the same texts (tests/test_xlsx_numbers.py):
``repr``'s digits are the same shortest digits.
"""
from __future__ import annotations

from decimal import Decimal
import numpy as np

NULL = "null"            # NaN, an infinity, or None


def text_py(x: float) -> str:
    """One float's text: ``_cfloat.text``'s reference."""
    if x != x or x - x != 0:
        return NULL
    if x == 0:
        return "-0.0" if str(x)[0] == "-" else "0.0"
    sign, digit_tuple, k = Decimal(repr(x)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    n = len(digits)
    kk = n + int(k)                              # 10**(kk-1) <= |x| < 10**kk
    s = "-" if sign else ""
    if 0 <= int(k) and kk <= 16:                 # 1234e7 -> 12340000000.0
        return s + digits + "0" * int(k) + ".0"
    if 0 < kk <= 16:                             # 1234e-2 -> 12.34
        return s + digits[:kk] + "." + digits[kk:]
    if -5 < kk <= 0:                             # 1234e-6 -> 0.001234
        return s + "0." + "0" * -kk + digits
    return s + digits[0] + ("." + digits[1:] if n > 1 else "") + "e" + str(kk - 1)


def texts_py(values) -> list:
    """Each value's text: a list of floats, ints (``str``) and None (``"null"``), or a 1-d
    float64 array; TypeError for any other value. ``_cfloat.texts``'s reference."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype != np.float64:
            raise TypeError("texts: an array must be 1-d float64")
        return list(map(text_py, values.tolist()))
    out = []
    for v in values:
        t = type(v)
        if t is float:
            out.append(text_py(v))
        elif v is None:
            out.append(NULL)
        elif t is int:
            out.append(str(v))
        else:
            raise TypeError(f"texts: a value is a float, an int or None, not {t.__name__}")
    return out


def block_text_py(array: np.ndarray) -> bytes:
    """A float64 m x k array's text, ``[[a,b],[c,d]]``: ``_cfloat.Block(array).text()``'s
    reference."""
    if array.ndim != 2 or array.dtype != np.float64:
        raise TypeError("Block: the array must be 2-d float64")
    if not len(array):
        return b"[]"
    return ("[[" + "],[".join(",".join(map(text_py, row)) for row in array.tolist()) + "]]").encode()


try:
    from ._cfloat import Block, text, texts
except ImportError:          # built without a C++17 compiler: the same texts, ~30x the time
    text, texts, Block = text_py, texts_py, None          # type: ignore[misc,assignment]


def block(array: np.ndarray):
    """A float64 m x k array's numbers as ``join_rows`` takes a block of them: a ``Block``,
    whose text the join makes (on a writer thread, without the GIL), where built; else the
    text itself (``block_text_py``)."""
    return Block(array) if Block is not None else block_text_py(array)
