"""Cell encoding of the hand-written .xlsx writer: values -> SpreadsheetML cell bodies and
CSV fields, a column at a time (types are worked out per column, not per cell), and rows
-> sheet XML in one join.  About a million cells per second; XlsxWriter and openpyxl
took ~7x as long on the 100k-entry compare.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from itertools import chain, repeat
from operator import getitem
from typing import Callable, Iterable, Sequence

import numpy as np

from ..codes import codes as value_codes
from . import float_text

_ILLEGAL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_ILLEGAL_BUT_NUL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f]")   # NUL separates joined cells
_EDGE_SPACE = re.compile(r"\s\x00|\x00\s")
# A text a spreadsheet could take for a formula: one that starts with = + - @ (or a tab or
# CR before them). OWASP's CSV-injection advice: such a cell gets a leading apostrophe, in
# the CSV and in the workbook alike (a workbook re-saved as CSV keeps it). Numbers are
# numbers, not texts: a negative one is written as it is.
FORMULA_LEADS = frozenset("=+-@\t\r")


def _formula_lead(joined: str) -> bool:
    """Whether a text of ``joined`` (texts joined by NUL) starts as a formula could. Each
    character is looked for alone first (memchr: ~1 us for a chunk of names), with its NUL
    only where it is there at all (a regex over the chunk took ~200x as long)."""
    return joined[:1] in FORMULA_LEADS or any(c in joined and "\x00" + c in joined for c in FORMULA_LEADS)
# A cell is "<c" + its style attribute + one of these bodies.
_EMPTY = "/>"
_NUM = "><v>%s</v></c>"
_STR = ' t="inlineStr"><is><t>%s</t></is></c>'
_STR_WS = ' t="inlineStr"><is><t xml:space="preserve">%s</t></is></c>'   # edge whitespace kept
_SST_CELL = ' t="s"><v>%d</v></c>'                  # a shared string, by its index
_NUM_AROUND = ("><v>", "</v></c>")                  # a number's cell around its text
_STR_AROUND = (' t="inlineStr"><is><t>', "</t></is></c>")   # a plain text's (``_plain_texts``)
_BOOL = {False: ' t="b"><v>0</v></c>', True: ' t="b"><v>1</v></c>'}
_INF, _NINF = float("inf"), float("-inf")
_NONE_TYPE = type(None)


class SharedStrings:
    """The workbook's shared-strings table (xl/sharedStrings.xml): repeated texts (dtypes,
    shapes, verdicts, messages) are written once and referred to by index, which makes the
    sheet XML (and the deflating of it) much smaller.  Cells read back the same."""

    def __init__(self):
        self.cells, self.items = {}, []

    def body(self, text: str) -> str:
        """The cell body (after the style attribute) referring to ``text``."""
        cell = self.cells.get(text)
        if cell is None:
            inline = text_body(neutral(text))            # the same escaping / truncation
            t = inline[inline.index("<t"):inline.rindex("</is>")]
            cell = self.cells[text] = _SST_CELL % len(self.items)
            self.items.append("<si>%s</si>" % t)
        return cell

    def add(self, texts: list) -> None:
        """``body`` of each of ``texts`` (distinct texts), escaped at once where all are
        printable and short (one pass over them joined, not a call per text: the
        100k-entry pair's 10k distinct messages), else one by one."""
        new = [t for t in texts if t not in self.cells]
        shown = neutral_texts(new)
        joined = "\x00".join(shown)
        escaped: list = []
        if new and joined.count("\x00") == len(new) - 1 and _printable(joined.replace("\x00", "")):
            if "&" in joined or "<" in joined or ">" in joined:
                joined = joined.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            escaped = joined.split("\x00")
        if not escaped or max(map(len, escaped)) > 32000:      # text_body cuts a text past it once escaped
            for t in new:
                self.body(t)
            return
        k = len(self.items)
        for text, e in zip(new, escaped):
            # printable: its only white space is " " (kept at an edge as text_body keeps it)
            self.items.append(('<si><t xml:space="preserve">%s</t></si>' if e[:1] == " " or e[-1:] == " "
                               else "<si><t>%s</t></si>") % e)
            self.cells[text] = _SST_CELL % k
            k += 1

    def xml(self) -> str:
        n = len(self.items)
        return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                '<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
                f'uniqueCount="{n}">' + "".join(self.items) + "</sst>")


def neutral(text: str) -> str:
    """A text cell's text: with a leading apostrophe where it could start a formula."""
    return "'" + text if text[:1] in FORMULA_LEADS else text


def neutral_texts(texts: list, joined: str | None = None) -> list:
    """``neutral`` of each text; the list itself where none needs it. ``joined``: the
    texts joined with nothing between them, where the caller has it: a column with none
    of the characters at all (names) is told from it alone."""
    if joined is None:
        joined = "".join(texts)
    if not any(c in joined for c in FORMULA_LEADS) or not _formula_lead("\x00".join(texts)):
        return texts
    return [neutral(t) for t in texts]


def col_letter(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


def esc(text: str) -> str:
    if not text.isprintable():
        text = _ILLEGAL.sub("", text)
    if "&" in text or "<" in text or ">" in text:
        text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text


def text_body(text: str) -> str:
    text = esc(text)
    if len(text) > 32000:                       # Excel's cell limit is 32767 characters
        text = text[:32000] + "..."
    edge = text[:1].isspace() or text[-1:].isspace()
    return (_STR_WS if edge else _STR) % text


def cell_body(value) -> str:
    """One cell's body (what follows its style attribute), for cells of unusual columns."""
    t = type(value)
    if t is float:
        if value != value:
            return _EMPTY
        if value in (_INF, _NINF):
            return text_body("inf" if value > 0 else "-inf")
        return _NUM % float_text.text(value)
    if value is None:
        return _EMPTY
    if t is bool:
        return _BOOL[value]
    if t is int:
        return _NUM % value
    if isinstance(value, (int, float)):          # numpy scalars
        return cell_body(float(value))
    return text_body(neutral(str(value)))


def encode_column(col: list, sst: SharedStrings | None = None) -> tuple[list, list]:
    """(cell bodies, CSV fields) of one column, worked out per column type, not per cell.

    Each float is formatted once (``float_texts``) for both files;
    strings are escaped in one pass over the joined column.  Cells and fields are what
    ``cell_body`` and ``csv_field`` give for each value, which odd (mixed) columns still use;
    with ``sst``, texts that repeat in the column are shared strings instead.
    """
    if isinstance(col, np.ndarray):
        return _float_column(col)
    kinds = set(map(type, col))
    has_none = _NONE_TYPE in kinds
    kinds.discard(_NONE_TYPE)
    if not kinds:
        return [_EMPTY] * len(col), [""] * len(col)
    if kinds == {float}:
        return _float_column(col)
    if not {bool, int} <= kinds and kinds <= {str, bool, int}:
        if sst is not None:                          # in order of first appearance
            ordered = dict.fromkeys(col)
            cells = {v: sst.body(v) if type(v) is str else cell_body(v) for v in ordered}
            fields = dict(zip(ordered, _fields_of(list(ordered))))
            return list(map(cells.__getitem__, col)), list(map(fields.__getitem__, col))
        uniq = set(col)
        if len(uniq) <= max(64, len(col) >> 3):      # few distinct values: look them up
            cells = {v: cell_body(v) for v in uniq}
            fields = {v: csv_field(v) for v in uniq}
            return list(map(cells.__getitem__, col)), list(map(fields.__getitem__, col))
    if kinds == {str}:
        return _str_column(col, has_none)
    if sst is not None:
        return ([sst.body(v) if type(v) is str else cell_body(v) for v in col],
                list(map(csv_field, col)))
    return list(map(cell_body, col)), list(map(csv_field, col))


def _float_column(col) -> tuple[list, list]:
    """(cell bodies, CSV fields) of floats (a list, None among them, or a float64 array),
    formatted at once; None, NaN and infinities as ``cell_body`` / ``csv_field`` write
    them, but an array's NaN is an empty field too (the array's way to say "no value")."""
    texts = float_texts(col)
    bodies = list(map(_NUM.__mod__, texts))
    if _NULL in texts:                           # None, NaN or an infinity
        blank_nan = isinstance(col, np.ndarray)
        odd = np.flatnonzero(~np.isfinite(col)).tolist() if blank_nan else \
            [k for k, t in enumerate(texts) if t == _NULL]
        for k in odd:
            v = float(col[k]) if blank_nan else col[k]
            bodies[k], texts[k] = (_EMPTY, "") if blank_nan and v != v else (cell_body(v), csv_field(v))
    return bodies, texts


def _constant(col: list) -> bool:
    """Whether a chunk of a column holds one text (or one bool) only."""
    t = type(col[0]) if len(col) else None
    if t is str:
        return col.count(col[0]) == len(col)
    if t is bool:
        return col.count(col[0]) == len(col) and set(map(type, col)) == {bool}
    return False


_NULL = "null"
_NO_STYLE = object()           # rows of several styles


def float_texts(col) -> list:
    """The shortest texts that read back as each float (``1e-5``, ``0.1``; ``float_text``,
    in C++ where built: ``repr`` was half the writing of the 100k-entry compare). None, NaN
    and infinities come out as "null". ``col``: a list, or a 1-d float64 array (the same
    texts)."""
    return float_text.texts(col)


def csv_numbers(values: list) -> list:
    """The CSV fields of a list of numbers, as ``csv_field`` gives each, formatted at once
    (``float_texts``) where they are plain ints and floats."""
    try:
        texts = float_texts(values) if values else []
    except TypeError:            # not plain numbers (numpy scalars): one by one
        return list(map(csv_field, values))
    if _NULL in texts:           # None, NaN or an infinity
        texts = [csv_field(v) if t == _NULL else t for t, v in zip(texts, values)]
    return texts


def _finite_floats(col: list):
    """The texts of a column of finite floats only (the cells' ``<v>`` texts, the CSV's
    fields), or None for any other column."""
    if isinstance(col, np.ndarray):
        return None if not len(col) or not np.isfinite(col).all() else float_texts(col)
    if not col or type(col[0]) is not float or set(map(type, col)) != {float}:
        return None
    texts = float_texts(col)
    return None if _NULL in texts else texts


def _int_texts(col) -> list | None:
    """The texts of a column of ints only (as its cells' ``<v>`` texts and its CSV fields
    have them: ``str``), or None for any other column."""
    if type(col) is not list or not col or type(col[0]) is not int or set(map(type, col)) != {int}:
        return None
    return list(map(str, col))


def shared_texts(col, found: tuple | None = None) -> list | None:
    """A column's distinct values in order of first appearance where its texts repeat
    enough to be shared strings, else None (decided for the whole column, so that the
    XML does not depend on how the rows are chunked). ``found``: ``distinct_codes(col)``
    where the caller has it."""
    if found is None:
        found = distinct_codes(col)
    if found is None:
        return None
    uniq = found[0]
    if len(uniq) > len(col) >> 1 or not any(type(v) is str for v in uniq):
        return None
    return uniq


def distinct_codes(col) -> tuple[list, bytes] | None:
    """``codes`` of a column: its distinct values in order of first appearance and per row
    the index of its value; None for numbers, a column of mostly unique values (names)
    and unhashable values."""
    if type(col) is not list:
        col = list(col) if not isinstance(col, np.ndarray) else None
    if col is None:
        return None
    try:
        if len(set(col[:4096])) > 3072:              # unique names: no
            return None
        return codes(col)
    except TypeError:                                # unhashable values: cell by cell
        return None


@dataclass
class Coded:
    """A column of few distinct values, worked out once for the whole sheet: each value's
    cell body and CSV field, and per row the index of its value (``width`` bytes each, as
    ``join_rows`` takes codes). Its rows are then joined by code, with no text made per
    row (``encode_column`` made two per row in each chunk: a third of the 100k-entry
    pair's encoding went to its dtypes, shapes, verdicts and messages)."""
    bodies: list
    fields: list                 # empty where the sheet has no CSV
    codes: bytes
    width: int

    def chunk(self, lo: int, hi: int) -> bytes:
        """The codes of rows ``lo`` to ``hi``."""
        return self.codes[lo * self.width:hi * self.width]


_CODED_KINDS = frozenset((str, bool, _NONE_TYPE))     # no two of them equal (unlike True and 1)


def coded_column(col, found: tuple | None, sst: SharedStrings | None, with_csv: bool) -> Coded | None:
    """``col`` as a ``Coded`` column where its values repeat (texts, bools, None), else
    None. ``found``: ``distinct_codes(col)``; ``sst``: the column's shared strings
    (``shared_texts``), or None for inline texts. Each value's cell and field are what
    ``encode_column`` gives it in any chunk."""
    if found is None or not len(col):
        return None
    uniq, codes = found
    kinds = set(map(type, uniq))
    if not kinds <= _CODED_KINDS or len(uniq) > (
            len(col) >> 1 if sst is not None else max(64, len(col) >> 3)):
        return None
    if bool in kinds and not set(map(type, col)) <= _CODED_KINDS:
        return None         # a 1 or 0.0 among the bools took True's or False's code: cell by cell
    bodies = [sst.body(v) if sst is not None and type(v) is str else cell_body(v) for v in uniq]
    fields = _fields_of(uniq) if with_csv else []
    return Coded(bodies, fields, codes, len(codes) // len(col))


def _fields_of(values: list) -> list:
    """``csv_field`` of each value; a column's texts at once where none needs quoting
    (a chunk of distinct messages: a call per text was a tenth of writing the CSV)."""
    if set(map(type, values)) != {str}:
        return list(map(csv_field, values))
    texts = neutral_texts(values)
    joined = "".join(texts)
    if "," in joined or '"' in joined or "\n" in joined or "\r" in joined:     # quoted as csv_field quotes
        return ['"' + t.replace('"', '""') + '"' if "," in t or '"' in t or "\n" in t or "\r" in t else t
                for t in texts]
    return texts


def _csv_texts(texts: list) -> list:
    """The CSV fields of printable texts: the texts, but quoted where csv.writer quotes."""
    joined = "".join(texts)
    return list(map(csv_field, texts)) if "," in joined or '"' in joined else texts


_ASCII_PRINTABLE = bytes(range(0x20, 0x7F))


def _printable(text: str) -> bool:
    """``text.isprintable()``: for ASCII, as its bytes with the printable ones deleted (a
    table lookup a byte, a fifth of the time of a Unicode lookup a character: the
    100k-entry pair's names were 0.09 s of it)."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _ASCII_PRINTABLE)
    return text.isprintable()


def _plain_texts(col: list) -> list | None:
    """A column of texts that go into their cells as they are (no escaping, cutting or
    kept edge spaces: a name, a message), or None.  Their cells are then the texts
    between a constant opening and ending, which ``encode_rows`` joins into the texts
    around them (as it does with numbers) instead of making a cell text of each."""
    if type(col) is not list or not col or type(col[0]) is not str:
        return None
    try:
        joined = "".join(col)
    except TypeError:                                # None or other values among them
        return None
    if not _printable(joined) or "&" in joined or "<" in joined or ">" in joined:
        return None
    if len(joined) > 32000 and max(map(len, col)) > 32000:
        return None
    if " " in joined and any(t[:1] == " " or t[-1:] == " " for t in col):
        return None
    return neutral_texts(col, joined)


def _str_column(col: list, has_none: bool) -> tuple[list, list]:
    texts = [("" if v is None else v) for v in col] if has_none else col
    big = "\x00".join(texts)
    if big.count("\x00") != len(col) - 1:            # a cell holds NUL itself: cell by cell
        return list(map(cell_body, col)), list(map(csv_field, col))
    if _formula_lead(big):
        texts = list(map(neutral, texts))
        big = "\x00".join(texts)
    plain_csv = "," not in big and '"' not in big and "\n" not in big and "\r" not in big
    fields = texts if plain_csv else list(map(csv_field, texts))
    printable = "".join(texts).isprintable()     # then no control characters, no space but " "
    if not printable:
        big = _ILLEGAL_BUT_NUL.sub("", big)
    if "&" in big or "<" in big or ">" in big:
        big = big.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    esc = big.split("\x00")
    if max(map(len, esc)) > 32000:
        esc = [t if len(t) <= 32000 else t[:32000] + "..." for t in esc]
    if printable:
        edge = big[:1] == " " or big[-1:] == " " or " \x00" in big or "\x00 " in big
    else:
        edge = big[:1].isspace() or big[-1:].isspace() or _EDGE_SPACE.search(big) is not None
    if edge:
        bodies = [(_STR_WS if t[:1].isspace() or t[-1:].isspace() else _STR) % t for t in esc]
    else:
        bodies = list(map(_STR.__mod__, esc))
    if has_none:
        for k, v in enumerate(col):
            if v is None:
                bodies[k] = _EMPTY
    return bodies, fields


def csv_field(value) -> str:
    """What csv.writer (minimal quoting) writes for one value, a finite float as its cell
    has it (``float_texts``)."""
    if type(value) is float and value - value == 0:
        return float_text.text(value)
    if value is None:
        text = ""
    elif isinstance(value, (int, float, np.number, np.bool_)):   # inf, nan: numbers, not formulas
        text = str(value)
    else:
        text = neutral(str(value))
    if "," in text or '"' in text or "\n" in text or "\r" in text:
        return '"' + text.replace('"', '""') + '"'
    return text


def _float_runs(columns: list, prefixes: list) -> dict:
    """start -> stop of each run of adjacent float-array columns with the same cell
    openings and no infinity in this chunk: encoded as one block (``_block_texts``); a
    column alone too (its NaN, empty cells, were a Python step each in ``_float_column``)."""
    runs, start = {}, None
    for j in range(len(columns) + 1):
        ok = j < len(columns) and isinstance(columns[j], np.ndarray) and columns[j].dtype == np.float64 \
            and not np.isinf(columns[j]).any()
        if start is not None and not (ok and prefixes[j] == prefixes[start]):
            runs[start] = j
            start = None
        if ok and start is None:
            start = j
    return runs


def _block_texts(part: tuple, m: int) -> list:
    """Per row, what ``join_rows`` writes for a block of numbers (``part``: the m x k
    block's text, as ``float_text.block`` gives it (bytes, or a ``Block`` of it), and the
    cells' openings or None for CSV fields): its commas become the XML between cells by
    ``str.replace``, one opening at a time."""
    if not m:
        return []
    raw = part[0] if type(part[0]) is bytes else part[0].text()
    text, openings = raw.decode()[2:-2], part[1]             # "a,b],[c,d"
    if type(openings) is tuple:                               # picked per row
        openings = _picked(openings, m)
    if openings is None:
        return (text.replace("null", "") if "null" in text else text).split("],[")
    by_opening: dict = {}
    if type(openings) is str:
        by_opening[openings] = range(m)
    else:
        for r, opening in enumerate(openings):
            by_opening.setdefault(opening, []).append(r)
    rows = text.split("],[") if len(by_opening) > 1 else [text]
    cells: list = [None] * m
    for opening, where in by_opening.items():
        cell = opening + "><v>"
        sub = "],[".join(rows[r] for r in where) if len(by_opening) > 1 else text
        xml = cell + sub.replace("],[", "</v></c>\x00" + cell).replace(",", "</v></c>" + cell) + "</v></c>"
        if "null" in sub:
            xml = xml.replace("><v>null</v></c>", _EMPTY)
        for r, x in zip(where, xml.split("\x00")):
            cells[r] = x
    return cells


_CODE_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}      # a code's bytes -> its type


def _picked(part: tuple, m: int) -> list:
    """The texts of a ``(texts, codes)`` part, one per row: ``texts[code]``, the codes
    ``len(codes) // m`` bytes each (native order, as numpy writes them)."""
    texts, codes = part
    if not m:
        return []
    return list(map(texts.__getitem__, np.frombuffer(codes, _CODE_TYPES[len(codes) // m]).tolist()))


def join_rows_py(parts: Sequence, m: int, sep: str, end: str) -> bytes:
    """``m`` rows, each the texts of ``parts`` in order (``sep`` between them, ``end``
    after), UTF-8: the C extension ``_cjoin.join_rows``'s reference, where it was not
    built. A part: a list of the rows' texts, one text for every row, an int (row r
    writes int + r), texts picked per row by codes (``(texts, codes)``, see ``_picked``),
    or a block of numbers (``(bytes or Block, openings)``, see ``_block_texts``)."""
    seqs = [repeat(p, m) if type(p) is str else map(str, range(p, p + m)) if type(p) is int
            else _picked(p, m) if type(p) is tuple and type(p[0]) is list
            else _block_texts(p, m) if type(p) is tuple else p
            for p in parts]
    rows = (map(sep.join, zip(*seqs)) if sep else map("".join, zip(*seqs))) if seqs else repeat("", m)
    return "".join(chain.from_iterable(zip(rows, repeat(end)))).encode("utf-8")


def _code_type(n_distinct: int):
    """The narrowest unsigned type that holds the codes of ``n_distinct`` values."""
    return np.uint8 if n_distinct <= 1 << 8 else np.uint16 if n_distinct <= 1 << 16 else np.uint32


def code_array(values: Iterable) -> tuple[list, np.ndarray]:
    """(the distinct values in order of first appearance, per value its index in the
    narrowest unsigned integer array): the compare's ``codes`` (in C where built),
    narrowed. ``values``: a list, or any iterable (read once)."""
    distinct, ids = value_codes(values if type(values) is list else list(values))
    return distinct, ids.astype(_code_type(len(distinct)))


def codes(values: Iterable) -> tuple[list, bytes]:
    """``code_array``'s codes as bytes, 1, 2 or 4 a code (native order): what
    ``join_rows`` picks texts by."""
    distinct, ids = code_array(values)
    return distinct, ids.tobytes()


def tail_codes_py(texts: list, heads: list, which: bytes) -> tuple[list, bytes] | None:
    """``codes`` of each text's tail after its head (``text[len(head):]``; ``which``: per
    text the index of its head in ``heads``, int32 bytes in native order), or None where a
    text or its head is not a str or the text does not start with its head: the C
    extension ``_cjoin.tail_codes``'s reference, where it was not built."""
    if not all(type(t) is str for t in texts):
        return None
    bases = list(map(heads.__getitem__, np.frombuffer(which, np.int32).tolist()))
    if not all(type(b) is str for b in bases) or not all(map(str.startswith, texts, bases)):
        return None
    return codes(map(getitem, texts, map(slice, map(len, bases), repeat(None))))


class Joined:
    """Rows already joined: what ``prepare_rows`` gives where the C join is not used."""

    def __init__(self, data: bytes):
        self.data = data

    def join(self) -> bytes:
        return self.data


_c_rows: Callable | None
try:
    from ._cjoin import block_parts as _c_block_parts
    from ._cjoin import join_rows, tail_codes
    from ._cjoin import rows as _c_rows
except ImportError:        # built without a C compiler: the same bytes, about twice the time
    join_rows, tail_codes, _c_rows, _c_block_parts = join_rows_py, tail_codes_py, None, False
_c_join_rows = join_rows


def _number_block(array: np.ndarray):
    """A run of float columns (m x k) as ``join_rows`` takes it: ``float_text.block``, a
    ``Block`` where the C join reads one (``_cjoin.block_parts``), else the text's bytes
    (which every join reads)."""
    found = float_text.block(array)
    return found if _c_block_parts or type(found) is bytes else found.text()


def prepare_rows(parts: Sequence, m: int, sep: str, end: str):
    """``join_rows``'s rows, to be joined by the returned object's ``join()``: with the C
    join, the parts are checked and their texts' UTF-8 made now (an error, a lone
    surrogate's UnicodeEncodeError too, is raised here), and ``join()`` copies them on any
    thread with the GIL released (a writer thread joins a sheet's rows while this one
    encodes the next: the join was a third of the 100k-entry pair's sheet encoding); the
    parts must not change until then. Otherwise the rows are joined now (``Joined``)."""
    if _c_rows is not None and join_rows is _c_join_rows:
        return _c_rows(parts, m, sep, end)
    return Joined(join_rows(parts, m, sep, end))


def tail_code_array(texts: list, heads: list, which: np.ndarray) -> tuple[list, np.ndarray] | None:
    """``code_array`` of each text's tail after its head (``which``: per text the index
    of its head in ``heads``), or None where a text or its head is not a str or the text
    does not start with its head: ``tail_codes`` (in C where built: no str made per text)."""
    found = tail_codes(texts, heads, np.ascontiguousarray(which, np.int32).tobytes())
    if found is None:
        return None
    distinct, raw = found
    return distinct, np.frombuffer(raw, _code_type(len(distinct)))


def encode_rows(columns: list, styles: list | None, lo: int, prefixes: list, shared: list,
                with_csv: bool, heights: list | None = None, coded: list | None = None) -> tuple[bytes, bytes]:
    """Sheet XML and CSV of rows (``row_parts``), joined."""
    xml, text, m = row_parts(columns, styles, lo, prefixes, shared, with_csv, heights, coded)
    return join_rows(xml, m, "", ""), join_rows(text, m, ",", "\r\n") if with_csv else b""


def prepared_rows(columns: list, styles: list | None, lo: int, prefixes: list, shared: list,
                  with_csv: bool, heights: list | None = None, coded: list | None = None) -> tuple:
    """``encode_rows``'s XML and CSV (None without a CSV) as ``prepare_rows`` objects, to
    be joined on the thread that writes them."""
    xml, text, m = row_parts(columns, styles, lo, prefixes, shared, with_csv, heights, coded)
    return prepare_rows(xml, m, "", ""), prepare_rows(text, m, ",", "\r\n") if with_csv else None


def row_parts(columns: list, styles: list | None, lo: int, prefixes: list, shared: list,
              with_csv: bool, heights: list | None = None, coded: list | None = None) -> tuple[list, list, int]:
    """(``join_rows``'s parts of the sheet XML, of the CSV, the number of rows) of rows
    (``columns``: their values, one list per column; ``lo``: the first one's index), to be
    joined row by row from what each column gives: "<row r=..>", prefix, body, ...,
    "</row>".  A column of finite floats gives just the numbers' texts, its "><v>" and
    "</v></c>" going with the prefixes around them, and so does a column of plain texts
    (``_plain_texts``); a column of one value goes whole into the (per row style) text
    before the next column; a run of float-array columns is one block of numbers
    (``float_text.block``: its text made by the join, on the writer thread).  ``prefixes``: per column, row style -> the cell's opening;
    ``heights``: per row, a height in points or None (the default height); ``coded``:
    per column of the sheet, its ``Coded`` form (``coded_column``) or None, its rows
    joined by code.  Where the rows' styles differ, the texts that depend on the style
    are picked per row by the style's code."""
    m = len(columns[0]) if columns else 0
    st = styles if styles else [None] * m
    one = None if not m else st[0] if st.count(st[0]) == m else _NO_STYLE
    keys = list(prefixes[0]) if prefixes else [None]
    if one is _NO_STYLE:
        where = dict(zip(keys, range(len(keys))))
        style_codes = bytes(map(where.__getitem__, st))

    def per_row(by_style: dict):                 # each row's text of its style
        return by_style[one] if one is not _NO_STYLE else (list(map(by_style.__getitem__, keys)), style_codes)
    runs = _float_runs(columns, prefixes)
    if heights:
        xml_parts: list = [[f'<row r="{r}" ht="{h:g}" customHeight="1">' if h else f'<row r="{r}">'
                            for r, h in zip(range(lo + 2, lo + m + 2), heights)]]
    else:
        xml_parts = ['<row r="', lo + 2]
    csv_parts: list = []
    pending = dict.fromkeys(keys, "" if heights else '">')   # per row style: text before the next part
    lead = ""                                    # what closes the last column's raw texts
    j = 0
    while j < len(columns):
        chunk, table, pre = columns[j], shared[j], prefixes[j]
        if j in runs:
            stop = runs[j]
            block = _number_block(np.stack(columns[j:stop], axis=1))
            if any(pending.values()) or lead:
                xml_parts.append(per_row({style: t + lead for style, t in pending.items()}))
            xml_parts.append((block, per_row(pre)))
            csv_parts.append((block, None))
            pending, lead, j = dict.fromkeys(keys, ""), "", stop
            continue
        j += 1
        plan = coded[j - 1] if coded else None
        if plan is not None:
            codes, w = plan.chunk(lo, lo + m), plan.width
            if codes[:w] * m != codes:
                xml_parts.append(per_row({style: pending[style] + lead + p for style, p in pre.items()}))
                xml_parts.append((plan.bodies, codes))
                csv_parts.append((plan.fields, codes))
                pending, lead = dict.fromkeys(keys, ""), ""
                continue
            k = int.from_bytes(codes[:w], sys.byteorder)    # one value in these rows
            pending = {style: pending[style] + lead + p + plan.bodies[k] for style, p in pre.items()}
            csv_parts.append(plan.fields[k] if with_csv else "")
            lead = ""
            continue
        if _constant(chunk):
            body, field = encode_column(chunk[:1], table)
            pending = {style: pending[style] + lead + p + body[0] for style, p in pre.items()}
            csv_parts.append(field[0])
            lead = ""
            continue
        opening, closing = "", ""                # around each raw text: its cell's body
        if (raw := _finite_floats(chunk)) is not None or (raw := _int_texts(chunk)) is not None:
            bodies, fields, (opening, closing) = raw, raw, _NUM_AROUND
        elif table is None and (raw := _plain_texts(chunk)) is not None:
            bodies, fields, (opening, closing) = raw, _csv_texts(raw), _STR_AROUND
        else:
            bodies, fields = encode_column(chunk, table)
        xml_parts.append(per_row({style: pending[style] + lead + p + opening for style, p in pre.items()}))
        xml_parts.append(bodies)
        csv_parts.append(fields)
        pending, lead = dict.fromkeys(keys, ""), closing
    xml_parts.append(per_row({style: t + lead + "</row>" for style, t in pending.items()}))
    return xml_parts, csv_parts, m
