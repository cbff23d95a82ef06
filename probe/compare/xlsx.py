"""A small streaming .xlsx writer: styled rows at about a million cells per second.

openpyxl (directly or through pandas) writes some 50k cells/s on this class of machine,
i.e. minutes for a 100k-entry compare; the report needs only inline strings, numbers,
booleans, three fills, one percent format, a frozen header, an autofilter and column
widths, which fit in a few hundred lines of SpreadsheetML.  openpyxl reads the result
(the tests check it that way).
"""
from __future__ import annotations

import csv
import io
import os
import pickle
import queue
import re
import struct
import sys
import threading
import zipfile
from itertools import chain
from dataclasses import dataclass, field

import numpy as np

_ILLEGAL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_ILLEGAL_BUT_NUL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f]")   # NUL separates joined cells
_EDGE_SPACE = re.compile(r"\s\x00|\x00\s")
FILLS = {None: 0, "error": 1, "warning": 2}          # row style -> fill slot
_FILL_RGB = {"error": "FFFFC7CE", "warning": "FFFFEB9C"}
# cellXfs: data cells use fill*2 + percent (0 = plain); the header uses _XF_HEADER
_XF_HEADER = 6
_CHUNK_ROWS = 4096                                   # rows encoded and written at a time
# A cell is "<c" + its style attribute + one of these bodies.
_EMPTY = "/>"
_NUM = "><v>%s</v></c>"
_STR = ' t="inlineStr"><is><t>%s</t></is></c>'
_STR_WS = ' t="inlineStr"><is><t xml:space="preserve">%s</t></is></c>'   # edge whitespace kept
_SST_CELL = ' t="s"><v>%d</v></c>'                  # a shared string, by its index
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
            inline = _text_body(text)                     # the same escaping / truncation
            t = inline[inline.index("<t"):inline.rindex("</is>")]
            cell = self.cells[text] = _SST_CELL % len(self.items)
            self.items.append("<si>%s</si>" % t)
        return cell

    def xml(self) -> str:
        n = len(self.items)
        return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                '<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
                f'uniqueCount="{n}">' + "".join(self.items) + "</sst>")


@dataclass
class Sheet:
    name: str
    header: list
    columns: list                        # one list of values per header column
    row_styles: list | None = None       # per data row: None / "error" / "warning"
    widths: list | None = None
    percent_columns: set = field(default_factory=set)
    freeze_header: bool = True
    autofilter: bool = True
    wrap_columns: set = field(default_factory=set)
    charts: list = field(default_factory=list)   # LineChart objects drawn on this sheet
    csv_path: str | None = None          # also write these rows as CSV (same pass, same text)

    @classmethod
    def from_rows(cls, name, header, rows, *args, **kw):
        """A small sheet given row by row."""
        cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in header]
        return cls(name, header, cols, *args, **kw)


@dataclass
class LineChart:
    """A DrawingML line chart of columns of some sheet (blank cells are gaps).

    ``series``: (name, sheet name, column index, first row, last row), rows 1-based;
    ``anchor``: (first column, first row, last column, last row), 0-based cells it covers.
    """
    title: str
    categories: tuple               # (sheet name, column index, first row, last row)
    series: list
    anchor: tuple = (3, 1, 17, 28)
    x_title: str = ""
    y_title: str = ""
    log_y: bool = False


def _col_letter(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


def _esc(text: str) -> str:
    if not text.isprintable():
        text = _ILLEGAL.sub("", text)
    if "&" in text or "<" in text or ">" in text:
        text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text


def _text_body(text: str) -> str:
    text = _esc(text)
    if len(text) > 32000:                       # Excel's cell limit is 32767 characters
        text = text[:32000] + "..."
    edge = text[:1].isspace() or text[-1:].isspace()
    return (_STR_WS if edge else _STR) % text


def _body(value) -> str:
    """One cell's body (what follows its style attribute), for cells of unusual columns."""
    t = type(value)
    if t is float:
        if value != value:
            return _EMPTY
        if value in (_INF, _NINF):
            return _text_body("inf" if value > 0 else "-inf")
        return _NUM % repr(value)
    if value is None:
        return _EMPTY
    if t is bool:
        return _BOOL[value]
    if t is int:
        return _NUM % value
    if isinstance(value, (int, float)):          # numpy scalars
        return _body(float(value))
    return _text_body(str(value))


def encode_column(col: list, sst: SharedStrings | None = None) -> tuple[list, list]:
    """(cell bodies, CSV fields) of one column, worked out per column type, not per cell.

    Each float is formatted once (repr: what csv.writer writes too) for both files;
    strings are escaped in one pass over the joined column.  Cells and fields are what
    ``_body`` and ``_csv_field`` give for each value, which odd (mixed) columns still use;
    with ``sst``, texts that repeat in the column are shared strings instead.
    """
    kinds = set(map(type, col))
    has_none = _NONE_TYPE in kinds
    kinds.discard(_NONE_TYPE)
    if not kinds:
        return [_EMPTY] * len(col), [""] * len(col)
    if kinds == {float}:
        texts = list(map(repr, col))
        bodies = list(map(_NUM.__mod__, texts))
        bad = np.flatnonzero(~np.isfinite(np.array(col, dtype=np.float64)))   # None -> NaN
        for k in bad.tolist():
            v = col[k]
            bodies[k] = _body(v)
            if v is None:
                texts[k] = ""
        return bodies, texts
    if not {bool, int} <= kinds and kinds <= {str, bool, int}:
        if sst is not None:                          # in order of first appearance
            uniq = dict.fromkeys(col)
            cells = {v: sst.body(v) if type(v) is str else _body(v) for v in uniq}
            fields = {v: _csv_field(v) for v in uniq}
            return list(map(cells.__getitem__, col)), list(map(fields.__getitem__, col))
        uniq = set(col)
        if len(uniq) <= max(64, len(col) >> 3):      # few distinct values: look them up
            cells = {v: _body(v) for v in uniq}
            fields = {v: _csv_field(v) for v in uniq}
            return list(map(cells.__getitem__, col)), list(map(fields.__getitem__, col))
    if kinds == {str}:
        return _str_column(col, has_none)
    if sst is not None:
        return ([sst.body(v) if type(v) is str else _body(v) for v in col],
                list(map(_csv_field, col)))
    return list(map(_body, col)), list(map(_csv_field, col))


def _constant(col: list) -> bool:
    """Whether a chunk of a column holds one text (or one bool) only."""
    t = type(col[0]) if col else None
    if t is str:
        return col.count(col[0]) == len(col)
    if t is bool:
        return col.count(col[0]) == len(col) and set(map(type, col)) == {bool}
    return False


def _finite_floats(col: list):
    """The reprs of a column of finite floats only (the cells' ``<v>`` texts, the CSV's
    fields), or None for any other column."""
    if not col or type(col[0]) is not float or set(map(type, col)) != {float}:
        return None
    if not np.isfinite(np.array(col, dtype=np.float64)).all():
        return None
    return list(map(repr, col))


def _repeats(col: list) -> bool:
    """Whether a column's texts repeat enough to be shared strings (decided for the whole
    column, so that the XML does not depend on how the rows are chunked)."""
    if len(set(col[:4096])) > 3072 or str not in set(map(type, col)):   # unique names: no
        return False
    try:
        uniq = set(col)
    except TypeError:                                # unhashable values: cell by cell
        return False
    return len(uniq) <= len(col) >> 1


def _str_column(col: list, has_none: bool) -> tuple[list, list]:
    texts = [("" if v is None else v) for v in col] if has_none else col
    big = "\x00".join(texts)
    if big.count("\x00") != len(col) - 1:            # a cell holds NUL itself: cell by cell
        return list(map(_body, col)), list(map(_csv_field, col))
    plain_csv = "," not in big and '"' not in big and "\n" not in big and "\r" not in big
    fields = texts if plain_csv else list(map(_csv_field, texts))
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
        edge = big[:1].isspace() or big[-1:].isspace() or _EDGE_SPACE.search(big)
    if edge:
        bodies = [(_STR_WS if t[:1].isspace() or t[-1:].isspace() else _STR) % t for t in esc]
    else:
        bodies = list(map(_STR.__mod__, esc))
    if has_none:
        for k, v in enumerate(col):
            if v is None:
                bodies[k] = _EMPTY
    return bodies, fields


def _csv_field(value) -> str:
    """What csv.writer (minimal quoting) writes for one value."""
    text = "" if value is None else str(value)
    if "," in text or '"' in text or "\n" in text or "\r" in text:
        return '"' + text.replace('"', '""') + '"'
    return text


def _styles() -> str:
    fills = ['<fill><patternFill patternType="none"/></fill>',
             '<fill><patternFill patternType="gray125"/></fill>']
    for key in ("error", "warning"):
        fills.append(f'<fill><patternFill patternType="solid"><fgColor rgb="{_FILL_RGB[key]}"/>'
                     f'<bgColor indexed="64"/></patternFill></fill>')
    xfs = []
    for fill in range(3):
        fill_id = 0 if fill == 0 else fill + 1
        for pct in (0, 1):
            fmt = 164 if pct else 0
            flags = (' applyNumberFormat="1"' if pct else "") + (' applyFill="1"' if fill else "")
            xfs.append(f'<xf numFmtId="{fmt}" fontId="0" fillId="{fill_id}" borderId="0" '
                       f'xfId="0"{flags}/>')
    xfs.append('<xf numFmtId="0" fontId="1" fillId="0" borderId="0" xfId="0" applyFont="1" '
               'applyAlignment="1"><alignment wrapText="1" vertical="top"/></xf>')
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            '<styleSheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
            '<numFmts count="1"><numFmt numFmtId="164" formatCode="0.000%"/></numFmts>'
            '<fonts count="2"><font><sz val="11"/><name val="Calibri"/></font>'
            '<font><b/><sz val="11"/><name val="Calibri"/></font></fonts>'
            f'<fills count="{len(fills)}">{"".join(fills)}</fills>'
            '<borders count="1"><border><left/><right/><top/><bottom/><diagonal/></border></borders>'
            '<cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0"/></cellStyleXfs>'
            f'<cellXfs count="{len(xfs)}">{"".join(xfs)}</cellXfs>'
            '<cellStyles count="1"><cellStyle name="Normal" xfId="0" builtinId="0"/></cellStyles>'
            '</styleSheet>')


def _prefixes(sheet: Sheet) -> list:
    """Per column: row style -> the cell's opening "<c" with its style attribute."""
    out = []
    for h in sheet.header:
        p = h in sheet.percent_columns
        out.append({style: "<c" + (f' s="{fill * 2 + p}"' if fill * 2 + p else "")
                    for style, fill in FILLS.items()})
    return out


class _FrozenStrings:
    """The shared strings as the worker process sees them: lookups only.  A text the
    parent did not register is an error there (that chunk is then encoded by the parent),
    never a new index that the parent's table would not have."""

    def __init__(self, cells: dict):
        self.cells = cells

    def body(self, text: str) -> str:
        return self.cells[text]


class _Rows:
    """Encodes rows lo..hi of one sheet: (the sheet XML of those rows, their CSV bytes).

    Every shared string of the sheet is registered first (column by column), so a chunk
    encodes to the same cells in this process and in the worker process."""

    def __init__(self, sheet: Sheet, sst: SharedStrings | None):
        self.columns, self.styles = sheet.columns, sheet.row_styles
        self.prefixes = _prefixes(sheet)
        self.shared = [sst if sst is not None and _repeats(c) else None for c in sheet.columns]
        self.csv = sheet.csv_path is not None
        for col, table in zip(self.columns, self.shared):
            if table is not None:
                for v in dict.fromkeys(col):
                    if type(v) is str:
                        table.body(v)

    def state(self) -> tuple:
        """What the worker needs besides the rows (see xlsx_worker)."""
        frozen = _FrozenStrings(next((t.cells for t in self.shared if t is not None), {}))
        return self.prefixes, [None if t is None else frozen for t in self.shared], self.csv

    def chunk(self, lo: int, hi: int) -> tuple:
        """Rows lo..hi as sent to the worker: (columns, styles, lo)."""
        return [c[lo:hi] for c in self.columns], (self.styles[lo:hi] if self.styles else None), lo

    def encode(self, lo: int, hi: int) -> tuple[bytes, bytes]:
        """Rows lo..hi encoded in this process."""
        return encode_rows([c[lo:hi] for c in self.columns],
                           self.styles[lo:hi] if self.styles else None, lo,
                           self.prefixes, self.shared, self.csv)


def encode_rows(columns: list, styles: list | None, lo: int, prefixes: list, shared: list,
                with_csv: bool) -> tuple[bytes, bytes]:
    """Sheet XML and CSV of rows (``columns``: their values, one list per column; ``lo``:
    the first one's index) in one join over the cells in row order: "<row r=..>", prefix,
    body, ..., "</row>".  A column of finite floats gives just the numbers' texts, its
    "><v>" and "</v></c>" going with the prefixes around them; a column of one value goes
    whole into the (per row style) text before the next column."""
    m = len(columns[0]) if columns else 0
    enc, kind = [], []              # kind: 0 cell bodies, 1 float texts, 2 one body
    for chunk, table in zip(columns, shared):
        if _constant(chunk):
            body, field = encode_column(chunk[:1], table)
            enc.append((body[0], [field[0]] * m))
            kind.append(2)
            continue
        plain = _finite_floats(chunk)
        kind.append(1 if plain is not None else 0)
        enc.append((plain, plain) if plain is not None else encode_column(chunk, table))
    st = styles if styles else [None] * m
    seqs = [[f'<row r="{r}">' for r in range(lo + 2, lo + m + 2)]]
    pending = dict.fromkeys(FILLS, "")
    prev_raw = False
    for pre, (bodies, _), kd in zip(prefixes, enc, kind):
        lead, tail = ("</v></c>" if prev_raw else ""), ("><v>" if kd == 1 else "")
        full = {style: pending[style] + lead + p + tail for style, p in pre.items()}
        if kd == 2:
            pending = {style: t + bodies for style, t in full.items()}
        else:
            seqs.append(list(map(full.__getitem__, st)))
            seqs.append(bodies)
            pending = dict.fromkeys(FILLS, "")
        prev_raw = kd == 1
    end = {style: t + ("</v></c>" if prev_raw else "") + "</row>" for style, t in pending.items()}
    seqs.append(list(map(end.__getitem__, st)))
    xml = "".join(chain.from_iterable(zip(*seqs))).encode("utf-8")
    text = ("\r\n".join(map(",".join, zip(*[f for _, f in enc]))) + "\r\n") if with_csv else ""
    return xml, text.encode("utf-8")


_HELPER_ROWS = 50_000   # from this many rows on, a worker process encodes chunks too
# The worker imports this very copy of probe: the folder holding the package replaces
# sys.path[0] (the current directory, which might hold another probe or a numpy.py).
_WORKER = ("import sys; sys.path[0] = %r; from probe.compare.xlsx_worker import main; main()"
           % os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_IN_FLIGHT = 3          # chunks handed to the worker and not yet back
_AHEAD = 16             # chunks this process encodes ahead of the one it must write next
_FRAME = struct.Struct("<qqq")     # worker -> writer: first row, XML bytes (-1: failed), CSV bytes


class _Chunks:
    """The encoded chunks of a sheet, in row order.

    Encoding is pure Python and holds the GIL, so a big sheet is shared with a worker
    process (a fresh interpreter running ``xlsx_worker.main``): it is handed the next
    chunks in order, a few at a time, while this process encodes the chunks after them (or runs
    whatever else this process has to do meanwhile, such as the diagnosis), so the load
    balances itself.  A fresh process, not a fork: a fork's pages are shared
    copy-on-write, and touching millions of objects on both sides would copy them all.
    If the worker cannot start, dies or fails on a chunk, this process encodes it.
    """

    def __init__(self, rows: _Rows, n: int):
        self.rows, self.n = rows, n
        self.proc = None
        self.done: dict = {}                     # lo -> (xml, csv), or None: encode here
        self.in_flight: list = []                # chunks the worker has, in order
        self.next = 0                            # first chunk nobody has taken
        if n < _HELPER_ROWS or (os.cpu_count() or 1) < 2 or not sys.executable:
            return
        import subprocess
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         bufsize=0)
        except (OSError, ValueError):
            return
        for pipe in (self.proc.stdin, self.proc.stdout):
            _widen(pipe)
        self.feed, self.results = queue.Queue(), queue.Queue()
        self.feed.put(rows.state())
        # one thread writes to the worker, one reads from it: the worker must never wait
        # for this process to get round to its pipes (reading and writing release the GIL)
        self.threads = [threading.Thread(target=self._feed, args=(self.proc.stdin,), daemon=True),
                        threading.Thread(target=self._receive, args=(self.proc.stdout,), daemon=True)]
        for t in self.threads:
            t.start()

    def _feed(self, pipe):
        try:
            while (item := self.feed.get()) is not None:
                data = memoryview(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
                while data:                      # few, big writes: each one gives up the
                    data = data[pipe.write(data):]   # GIL and waits to get it back
        except (OSError, ValueError):            # the worker is gone: _receive sees EOF
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass

    def _receive(self, pipe):
        """Worker's results -> self.results as (lo, (xml, csv) or None); None at its end."""
        try:
            while (head := _read_exact(pipe, _FRAME.size)) is not None:
                lo, n_xml, n_csv = _FRAME.unpack(head)
                if n_xml < 0:
                    self.results.put((lo, None))
                    continue
                xml, text = _read_exact(pipe, n_xml), _read_exact(pipe, n_csv)
                if xml is None or text is None:
                    break
                self.results.put((lo, (xml, text)))
        except (OSError, ValueError):
            pass
        self.results.put(None)

    def _hand_out(self):
        while self.proc is not None and len(self.in_flight) < _IN_FLIGHT and self.next < self.n:
            lo = self.next
            self.next += _CHUNK_ROWS
            self.in_flight.append(lo)
            self.feed.put(self.rows.chunk(lo, min(self.n, lo + _CHUNK_ROWS)))

    def _collect(self, block: bool):
        """Take the worker's finished chunks (waiting for one if ``block``)."""
        while self.proc is not None and self.in_flight:
            try:
                item = self.results.get(block)
            except queue.Empty:
                return
            if item is None:
                return self.close()              # the worker died: what it had is ours
            lo, data = item
            self.done[lo] = data
            self.in_flight.remove(lo)
            block = False

    def __iter__(self):
        for lo in range(0, self.n, _CHUNK_ROWS):
            while self.proc is not None and lo not in self.done:
                self._collect(block=False)
                self._hand_out()
                if lo in self.done:
                    break
                if lo not in self.in_flight or (self.next < self.n and len(self.done) < _AHEAD):
                    mine = lo if lo not in self.in_flight else self.next
                    if mine == self.next:
                        self.next += _CHUNK_ROWS
                    self.done[mine] = self.rows.encode(mine, min(self.n, mine + _CHUNK_ROWS))
                else:
                    self._collect(block=True)
            data = self.done.pop(lo, None)
            yield data if data is not None else self.rows.encode(lo, min(self.n, lo + _CHUNK_ROWS))

    def close(self):
        if self.proc is not None:
            proc, self.proc = self.proc, None
            self.feed.put(None)
            proc.kill()
            proc.wait()
            for t in self.threads:
                t.join()
            proc.stdout.close()


def _widen(pipe) -> None:
    """A 1 MiB pipe buffer where Linux allows it (64 KiB otherwise): a chunk's XML then
    crosses in a few reads, each of which gives up the GIL and waits to get it back."""
    try:
        import fcntl
        fcntl.fcntl(pipe.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):           # not Linux: the default buffer
        pass


def _read_exact(pipe, size: int) -> bytes | None:
    """``size`` bytes from an unbuffered pipe, or None at its end."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        k = pipe.readinto(view[got:])
        if not k:
            return None
        got += k
    return bytes(buf)


class _Pump:
    """Writes to ``fh`` from a second thread: deflate and the file write release the GIL,
    so compressing one chunk overlaps encoding the next."""

    def __init__(self, fh):
        self.queue, self.error = queue.Queue(maxsize=3), None
        self.thread = threading.Thread(target=self._run, args=(fh,), daemon=True)
        self.thread.start()

    def _run(self, fh):
        while (data := self.queue.get()) is not None:
            if self.error is None:
                try:
                    fh.write(data)
                except BaseException as exc:     # re-raised in the writing thread
                    self.error = exc

    def write(self, data: bytes):
        if self.error is not None:
            raise self.error
        self.queue.put(data)

    def close(self):
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def _write_sheet(zf: zipfile.ZipFile, index: int, sheet: Sheet, sst: SharedStrings | None = None) -> None:
    ncol = len(sheet.header)
    letters = [_col_letter(i) for i in range(ncol)]
    with zf.open(f"xl/worksheets/sheet{index}.xml", "w", force_zip64=True) as fh:
        parts = ['<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                 '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
                 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
                 '<sheetViews><sheetView workbookViewId="0">']
        if sheet.freeze_header:
            parts.append('<pane ySplit="1" topLeftCell="A2" activePane="bottomLeft" state="frozen"/>'
                         '<selection pane="bottomLeft" activeCell="A2" sqref="A2"/>')
        parts.append('</sheetView></sheetViews><sheetFormatPr defaultRowHeight="15"/>')
        if sheet.widths:
            parts.append("<cols>" + "".join(
                f'<col min="{i + 1}" max="{i + 1}" width="{w:.1f}" customWidth="1"/>'
                for i, w in enumerate(sheet.widths)) + "</cols>")
        parts.append('<sheetData><row r="1">')
        parts.extend(_header_cell(f"{letters[c]}1", h) for c, h in enumerate(sheet.header))
        parts.append("</row>")
        fh.write("".join(parts).encode("utf-8"))
        n = len(sheet.columns[0]) if sheet.columns else 0
        csv_fh = open(sheet.csv_path, "wb") if sheet.csv_path else None
        chunks = _Chunks(_Rows(sheet, sst), n)
        out = _Pump(fh) if n > _CHUNK_ROWS else fh
        try:
            if csv_fh:
                head = io.StringIO(newline="")
                csv.writer(head).writerow(sheet.header)
                csv_fh.write(head.getvalue().encode("utf-8"))
            for xml, text in chunks:
                out.write(xml)
                if csv_fh:
                    csv_fh.write(text)
        finally:
            chunks.close()
            if out is not fh:
                out.close()
            if csv_fh:
                csv_fh.close()
        tail = ["</sheetData>"]
        if sheet.autofilter and ncol:
            tail.append(f'<autoFilter ref="A1:{letters[-1]}{max(n + 1, 1)}"/>')
        if sheet.charts:
            tail.append('<drawing r:id="rId1"/>')
        tail.append("</worksheet>")
        fh.write("".join(tail).encode("utf-8"))


def _header_cell(ref: str, text) -> str:
    return f'<c r="{ref}" s="{_XF_HEADER}" t="inlineStr"><is><t xml:space="preserve">{_esc(str(text))}</t></is></c>'



_NS_C = "http://schemas.openxmlformats.org/drawingml/2006/chart"
_NS_A = "http://schemas.openxmlformats.org/drawingml/2006/main"
_NS_R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_COLORS = ["C00000", "2E75B6", "70AD47", "7F6000"]


def _ref(sheet: str, col: int, r1: int, r2: int | None = None) -> str:
    c = _col_letter(col)
    name = "'" + _esc(sheet).replace("'", "''") + "'"
    return f"{name}!${c}${r1}" + (f":${c}${r2}" if r2 is not None else "")


def _rich(text: str) -> str:
    return (f'<c:title><c:tx><c:rich><a:bodyPr/><a:p><a:r><a:t>{_esc(text)}</a:t></a:r></a:p>'
            f'</c:rich></c:tx><c:overlay val="0"/></c:title>')


def _chart_xml(ch: LineChart) -> str:
    cs, cc, c1, c2 = ch.categories
    sers = []
    for k, (name, sh, col, r1, r2) in enumerate(ch.series):
        color = _COLORS[k % len(_COLORS)]
        sers.append(
            f'<c:ser><c:idx val="{k}"/><c:order val="{k}"/>'
            f'<c:tx><c:v>{_esc(name)}</c:v></c:tx>'
            f'<c:spPr><a:ln w="15875"><a:solidFill><a:srgbClr val="{color}"/></a:solidFill></a:ln></c:spPr>'
            f'<c:marker><c:symbol val="circle"/><c:size val="3"/>'
            f'<c:spPr><a:solidFill><a:srgbClr val="{color}"/></a:solidFill></c:spPr></c:marker>'
            f'<c:cat><c:numRef><c:f>{_ref(cs, cc, c1, c2)}</c:f></c:numRef></c:cat>'
            f'<c:val><c:numRef><c:f>{_ref(sh, col, r1, r2)}</c:f></c:numRef></c:val>'
            f'<c:smooth val="0"/></c:ser>')
    log = '<c:logBase val="10"/>' if ch.log_y else ""
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            f'<c:chartSpace xmlns:c="{_NS_C}" xmlns:a="{_NS_A}" xmlns:r="{_NS_R}">'
            f'<c:chart>{_rich(ch.title)}<c:autoTitleDeleted val="0"/><c:plotArea><c:layout/>'
            '<c:lineChart><c:grouping val="standard"/><c:varyColors val="0"/>' + "".join(sers)
            + '<c:marker val="1"/><c:axId val="500000001"/><c:axId val="500000002"/></c:lineChart>'
            '<c:catAx><c:axId val="500000001"/><c:scaling><c:orientation val="minMax"/></c:scaling>'
            '<c:delete val="0"/><c:axPos val="b"/>' + (_rich(ch.x_title) if ch.x_title else "")
            + '<c:numFmt formatCode="General" sourceLinked="1"/><c:tickLblPos val="low"/>'
            '<c:crossAx val="500000002"/><c:crosses val="autoZero"/><c:auto val="1"/>'
            '<c:lblAlgn val="ctr"/><c:lblOffset val="100"/><c:noMultiLvlLbl val="0"/></c:catAx>'
            f'<c:valAx><c:axId val="500000002"/><c:scaling>{log}<c:orientation val="minMax"/></c:scaling>'
            '<c:delete val="0"/><c:axPos val="l"/><c:majorGridlines/>'
            + (_rich(ch.y_title) if ch.y_title else "")
            + '<c:numFmt formatCode="0.0E+0" sourceLinked="0"/><c:tickLblPos val="low"/>'
            '<c:crossAx val="500000001"/><c:crosses val="autoZero"/><c:crossBetween val="between"/>'
            '</c:valAx></c:plotArea><c:legend><c:legendPos val="b"/><c:overlay val="0"/></c:legend>'
            '<c:plotVisOnly val="1"/><c:dispBlanksAs val="gap"/></c:chart></c:chartSpace>')


def _drawing_xml(charts: list, first_rid: int = 1) -> str:
    anchors = []
    for k, ch in enumerate(charts):
        c1, r1, c2, r2 = ch.anchor
        anchors.append(
            f'<xdr:twoCellAnchor><xdr:from><xdr:col>{c1}</xdr:col><xdr:colOff>0</xdr:colOff>'
            f'<xdr:row>{r1}</xdr:row><xdr:rowOff>0</xdr:rowOff></xdr:from>'
            f'<xdr:to><xdr:col>{c2}</xdr:col><xdr:colOff>0</xdr:colOff><xdr:row>{r2}</xdr:row>'
            f'<xdr:rowOff>0</xdr:rowOff></xdr:to><xdr:graphicFrame macro="">'
            f'<xdr:nvGraphicFramePr><xdr:cNvPr id="{k + 2}" name="Chart {k + 1}"/><xdr:cNvGraphicFramePr/>'
            f'</xdr:nvGraphicFramePr><xdr:xfrm><a:off x="0" y="0"/><a:ext cx="0" cy="0"/></xdr:xfrm>'
            f'<a:graphic><a:graphicData uri="{_NS_C}"><c:chart xmlns:c="{_NS_C}" r:id="rId{first_rid + k}"/>'
            f'</a:graphicData></a:graphic></xdr:graphicFrame><xdr:clientData/></xdr:twoCellAnchor>')
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            '<xdr:wsDr xmlns:xdr="http://schemas.openxmlformats.org/drawingml/2006/spreadsheetDrawing" '
            f'xmlns:a="{_NS_A}" xmlns:r="{_NS_R}">' + "".join(anchors) + "</xdr:wsDr>")


def _rels(targets: list) -> str:
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            + "".join(f'<Relationship Id="rId{k + 1}" Type="{_NS_R}/{kind}" Target="{target}"/>'
                      for k, (kind, target) in enumerate(targets)) + "</Relationships>")


def _write_charts(zf: zipfile.ZipFile, sheets: list) -> list:
    """Drawing + chart parts for sheets with charts; returns their content-type overrides."""
    overrides, n_chart, n_drawing = [], 0, 0
    for i, sheet in enumerate(sheets):
        if not sheet.charts:
            continue
        n_drawing += 1
        targets = []
        for ch in sheet.charts:
            n_chart += 1
            zf.writestr(f"xl/charts/chart{n_chart}.xml", _chart_xml(ch))
            overrides.append((f"/xl/charts/chart{n_chart}.xml",
                              "application/vnd.openxmlformats-officedocument.drawingml.chart+xml"))
            targets.append(("chart", f"../charts/chart{n_chart}.xml"))
        zf.writestr(f"xl/drawings/drawing{n_drawing}.xml", _drawing_xml(sheet.charts))
        zf.writestr(f"xl/drawings/_rels/drawing{n_drawing}.xml.rels", _rels(targets))
        zf.writestr(f"xl/worksheets/_rels/sheet{i + 1}.xml.rels",
                    _rels([("drawing", f"../drawings/drawing{n_drawing}.xml")]))
        overrides.append((f"/xl/drawings/drawing{n_drawing}.xml",
                          "application/vnd.openxmlformats-officedocument.drawing+xml"))
    return overrides


def write_workbook(path: str, sheets) -> None:
    """Write ``sheets`` (Sheet objects, or an iterator that makes them one at a time: the
    first can be written while the later ones are still being worked out) to ``path``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        sst = SharedStrings()
        done = []
        for sheet in sheets:
            done.append(sheet)
            _write_sheet(zf, len(done), sheet, sst)
        zf.writestr("xl/sharedStrings.xml", sst.xml())
        _write_parts(zf, done)


def _write_parts(zf: zipfile.ZipFile, sheets: list) -> None:
    """Everything but the sheets and the shared strings: charts, workbook, styles, rels."""
    n = len(sheets)
    chart_types = _write_charts(zf, sheets)
    zf.writestr("[Content_Types].xml",
                '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                '<Default Extension="xml" ContentType="application/xml"/>'
                '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
                '<Override PartName="/xl/styles.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"/>'
                '<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
                + "".join(f'<Override PartName="/xl/worksheets/sheet{i + 1}.xml" ContentType='
                          f'"application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
                          for i in range(n))
                + "".join(f'<Override PartName="{p}" ContentType="{t}"/>' for p, t in chart_types)
                + "</Types>")
    zf.writestr("_rels/.rels",
                '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
                'relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>')
    names = "".join(f'<sheet name="{_esc(s.name)}" sheetId="{i + 1}" r:id="rId{i + 1}"/>'
                    for i, s in enumerate(sheets))
    defined = "".join(
        f'<definedName name="_xlnm._FilterDatabase" localSheetId="{i}" hidden="1">'
        f"'{_esc(s.name)}'!$A$1:${_col_letter(len(s.header) - 1)}$1</definedName>"
        for i, s in enumerate(sheets) if s.autofilter and s.header)
    zf.writestr("xl/workbook.xml",
                '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                '<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
                'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
                f"<sheets>{names}</sheets>"
                + (f"<definedNames>{defined}</definedNames>" if defined else "") + "</workbook>")
    zf.writestr("xl/_rels/workbook.xml.rels",
                '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                + "".join(f'<Relationship Id="rId{i + 1}" Type="http://schemas.openxmlformats.org/'
                          f'officeDocument/2006/relationships/worksheet" Target="worksheets/sheet{i + 1}.xml"/>'
                          for i in range(n))
                + f'<Relationship Id="rId{n + 1}" Type="http://schemas.openxmlformats.org/'
                  f'officeDocument/2006/relationships/styles" Target="styles.xml"/>'
                + f'<Relationship Id="rId{n + 2}" Type="http://schemas.openxmlformats.org/'
                  f'officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
                  '</Relationships>')
    zf.writestr("xl/styles.xml", _styles())
