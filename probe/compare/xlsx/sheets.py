"""Sheets and the workbook of the hand-written .xlsx writer: the sheet XML around the rows
(view, widths, row heights, autofilter, hyperlinks, drawing), the styles, the workbook
parts, all streamed into one zip in this process (its big sheets deflated on a few
threads; no processes: one compare of one pair is one process)."""
from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import io
import logging
import os
import sys
import types
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat

from probe import lone_surrogates
from probe.written_whole import replaced_when_written

from .cells import SharedStrings, coded_column, col_letter, distinct_codes, esc, prepared_rows, shared_texts
from .chart import write_charts

logger = logging.getLogger(__name__)

deflate_lib: types.ModuleType
try:                # ISA-L's deflate: a quarter of zlib's time at level 1, files as small
    from isal import isal_zlib as deflate_lib
except ImportError:   # a platform without its wheels: zlib, the same files' contents
    deflate_lib = zlib

CHUNK_ROWS = 4096              # rows encoded and written at a time
COMPRESS_LEVEL = 1             # zlib's fastest: the sheets are large and repetitive
_FILL_RGB = {"error": "FFFFC7CE", "warning": "FFFFEB9C"}
# cellXfs: data cells use fill * 2 + percent (0 = plain); then the header, wrapped text,
# a hyperlink (blue, underlined, wrapped), both left-aligned (numbers too)
_FILLS = {None: 0, "error": 1, "warning": 2}
_XF_HEADER, _XF_WRAP, _XF_LINK = 6, 7, 8
ROW_STYLES = (None, "error", "warning", "link")     # what Sheet.row_styles may hold
# Excel's rows per sheet, the header's included: a sheet with more rows is written as
# several sheets ("name", "name (2)", ...), each with the header; its CSV holds them all.
EXCEL_MAX_ROWS = 1_048_576


@dataclass
class Sheet:
    name: str
    header: list
    columns: list                        # one list of values per header column
    row_styles: list | None = None       # per data row: one of ROW_STYLES
    widths: list | None = None
    percent_columns: set = field(default_factory=set)
    freeze_header: bool = True
    autofilter: bool = True
    wrap_columns: set = field(default_factory=set)   # header names whose cells wrap, top-aligned
    charts: list = field(default_factory=list)   # LineChart objects drawn on this sheet
    csv_path: str | None = None          # also write these rows as CSV (same pass, same text)
    row_heights: list | None = None      # per data row: points, or None for the default
    links: list = field(default_factory=list)    # (cell ref "B7", location "'Sheet'!A12")
    active: bool = False                 # the sheet the workbook opens on
    fit_width: bool = False              # printed (and exported to PDF) one page wide, landscape

    @classmethod
    def from_rows(cls, name, header, rows, *args, **kw):
        """A small sheet given row by row."""
        cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in header]
        return cls(name, header, cols, *args, **kw)


def rows_per_sheet() -> int:
    """Data rows a sheet holds (Excel's row limit, less the header)."""
    return EXCEL_MAX_ROWS - 1


def part_names(name: str, n_rows: int) -> list:
    """The names of the sheets that a sheet of ``n_rows`` data rows is written as."""
    parts = max(1, -(-n_rows // rows_per_sheet()))
    return [name] + [f"{name} ({k})" for k in range(2, parts + 1)]


def row_link(name: str, row: int) -> str:
    """The location of data row ``row`` (0-based) of sheet ``name`` once it is split:
    ``'name (2)'!A17``."""
    k, r = divmod(row, rows_per_sheet())
    return f"'{part_names(name, row + 1)[k]}'!A{r + 2}"


def split_note(name: str, n_rows: int) -> str | None:
    """What a compare says where sheet ``name`` is split, or None where it fits."""
    names = part_names(name, n_rows)
    if len(names) == 1:
        return None
    return (f"{n_rows} rows are past Excel's {EXCEL_MAX_ROWS:,} rows a sheet: the workbook splits them "
            f"over {len(names)} sheets ({', '.join(names)}); the CSV holds them all")


def _parts(sheet: Sheet) -> list:
    """``sheet`` as the sheets it is written as (itself where it fits): each a slice of
    its rows; the first keeps its charts, links and being the active one."""
    n = len(sheet.columns[0]) if sheet.columns else 0
    names = part_names(sheet.name, n)
    if len(names) == 1:
        return [sheet]
    size = rows_per_sheet()
    parts = []
    for k, name in enumerate(names):
        lo, hi = k * size, min(n, (k + 1) * size)
        parts.append(dataclasses.replace(
            sheet, name=name, columns=[c[lo:hi] for c in sheet.columns],
            row_styles=sheet.row_styles[lo:hi] if sheet.row_styles else None,
            row_heights=sheet.row_heights[lo:hi] if sheet.row_heights else None,
            charts=sheet.charts if k == 0 else [], links=sheet.links if k == 0 else [],
            active=sheet.active and k == 0, csv_path=None))
    return parts


def _styles_xml() -> str:
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
    xfs.append('<xf numFmtId="0" fontId="0" fillId="0" borderId="0" xfId="0" '
               'applyAlignment="1"><alignment horizontal="left" wrapText="1" vertical="top"/></xf>')
    xfs.append('<xf numFmtId="0" fontId="2" fillId="0" borderId="0" xfId="0" applyFont="1" '
               'applyAlignment="1"><alignment horizontal="left" wrapText="1" vertical="top"/></xf>')
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            '<styleSheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
            '<numFmts count="1"><numFmt numFmtId="164" formatCode="0.000%"/></numFmts>'
            '<fonts count="3"><font><sz val="11"/><name val="Calibri"/></font>'
            '<font><b/><sz val="11"/><name val="Calibri"/></font>'
            '<font><u/><sz val="11"/><color rgb="FF0563C1"/><name val="Calibri"/></font></fonts>'
            f'<fills count="{len(fills)}">{"".join(fills)}</fills>'
            '<borders count="1"><border><left/><right/><top/><bottom/><diagonal/></border></borders>'
            '<cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0"/></cellStyleXfs>'
            f'<cellXfs count="{len(xfs)}">{"".join(xfs)}</cellXfs>'
            '<cellStyles count="1"><cellStyle name="Normal" xfId="0" builtinId="0"/></cellStyles>'
            '</styleSheet>')


_STYLES_XML = _styles_xml()


def _prefixes(sheet: Sheet) -> list:
    """Per column: row style -> the cell's opening "<c" with its style attribute."""
    out = []
    for h in sheet.header:
        p = h in sheet.percent_columns
        wrap = h in sheet.wrap_columns
        pre = {}
        for style in ROW_STYLES:
            if style == "link":
                xf = _XF_LINK
            elif wrap and style is None:
                xf = _XF_WRAP
            else:
                xf = _FILLS[style] * 2 + p
            pre[style] = "<c" + (f' s="{xf}"' if xf else "")
        out.append(pre)
    return out


def _shared_tables(sheet: Sheet, sst: SharedStrings | None, found: list | None = None) -> list:
    """Per column: the shared-strings table if its texts repeat enough, else None.  Every
    text is registered first, column by column, so the indices do not depend on the
    chunking of the rows. ``found``: per column, its ``distinct_codes``, where known."""
    if sst is None:
        return [None] * len(sheet.columns)
    shared = []
    for k, col in enumerate(sheet.columns):
        texts = shared_texts(col, found[k] if found is not None else None)
        sst.add([v for v in texts or () if type(v) is str])
        shared.append(sst if texts is not None else None)
    return shared


def _column_tables(sheet: Sheet, sst: SharedStrings | None, with_csv: bool) -> tuple[list, list]:
    """Per column: its shared-strings table or None (``_shared_tables``), and its
    ``Coded`` form or None (``coded_column``), from one pass over each column's values."""
    found = list(map(distinct_codes, sheet.columns))
    shared = _shared_tables(sheet, sst, found)
    return shared, list(map(coded_column, sheet.columns, found, shared, repeat(with_csv)))


def _header_cell(ref: str, text) -> str:
    return f'<c r="{ref}" s="{_XF_HEADER}" t="inlineStr"><is><t xml:space="preserve">{esc(str(text))}</t></is></c>'


# While the deflate threads run: how soon the encoding thread hands them the GIL back.
SWITCH_INTERVAL_S = 0.0001


def _deflate_chunk(data: bytes, level: int) -> bytes:
    """One chunk as raw deflate blocks of its own, ended on a byte boundary (a sync
    flush), so that the chunks' outputs laid end to end are one deflate stream."""
    c = deflate_lib.compressobj(level, deflate_lib.DEFLATED, -15)
    return c.compress(data) + c.flush(deflate_lib.Z_SYNC_FLUSH)


class _InOrder:
    """Tasks run on a pool of threads, their results taken in the order they were given,
    at most ``ahead`` of them waiting: the writer's one concurrency beside its process
    (deflate and file writes release the GIL, so they run beside the encoding)."""

    def __init__(self, workers: int, ahead: int, name: str):
        self.ahead = ahead
        self.pending: collections.deque = collections.deque()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix=name)

    def submit(self, fn, *args) -> list:
        """Start ``fn(*args)``; the results of the oldest tasks that are done (waiting for
        the oldest while more than ``ahead`` are pending). A task's error is raised here."""
        self.pending.append(self.pool.submit(fn, *args))
        done = []
        while self.pending and (len(self.pending) > self.ahead or self.pending[0].done()):
            done.append(self.pending.popleft().result())
        return done

    def finish(self) -> list:
        """The results of the tasks still pending, in order; the pool ends."""
        try:
            return [self.pending.popleft().result() for _ in range(len(self.pending))]
        finally:
            self.pending.clear()
            self.pool.shutdown()


class _ParallelDeflate:
    """The compressor of a big zip entry: zipfile's writer hands it each chunk (and
    writes what it returns), and it deflates the chunks on a pool of threads, each
    chunk on its own (pigz's way; the first 32 KB of each 5 MB chunk compress a little
    worse), returning their outputs in order.  The deflate releases the GIL, so this
    runs beside the encoding of the next chunks (bench/xlsx.py).  The threads take the
    GIL back at each of the deflate's output blocks and wait up to the switch interval
    each time the encoding thread holds it: at Python's default 5 ms the sheet was
    written as if serially, hence ``SWITCH_INTERVAL_S`` while the pool runs (the
    caller's interval is restored).

    The output depends on the chunks, not on the number of threads."""

    def __init__(self, level: int, workers: int):
        self.level = level
        self.interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self.interval, SWITCH_INTERVAL_S))
        self.work = _InOrder(workers, 2 * workers, "probe-xlsx-deflate")

    def compress(self, data: bytes) -> bytes:
        return b"".join(self.work.submit(_deflate_chunk, data, self.level))

    def flush(self) -> bytes:
        """The rest, and the stream's final (empty) block (zipfile calls it once)."""
        try:
            rest = self.work.finish()
        finally:
            sys.setswitchinterval(self.interval)
        return b"".join(rest) + deflate_lib.compressobj(self.level, deflate_lib.DEFLATED, -15).flush()


class _WriteBehind:
    """A file written on a thread of its own, in order: a write releases the GIL, and
    the 100k-entry pair's 180 MB CSV took 0.33 s of the encoding thread to write; a big
    sheet's zip entry too (zipfile's CRC of its 390 MB, 0.2 s, and the handing of its
    chunks to the deflate threads). An error of a write is raised by a later ``write``
    or by ``wait`` / ``close``. ``ahead``: writes that may wait (each holds its data)."""

    def __init__(self, fh, name: str = "probe-csv-writer", ahead: int = 4):
        self.fh = fh
        self.work = _InOrder(1, ahead, name)

    def write(self, data: bytes):
        self.work.submit(self.fh.write, data)

    def write_rows(self, rows):
        """Write rows still to be joined (``cells.prepare_rows``): joined on the writer's
        thread, the GIL released while they are copied, so that the next rows are
        encoded meanwhile."""
        self.work.submit(self._joined, rows)

    def _joined(self, rows):
        self.fh.write(rows.join())

    def wait(self):
        """Every write done; the file stays open."""
        self.work.finish()

    def close(self):
        try:
            self.wait()
        finally:
            self.fh.close()


def _deflate_in_parallel(fh, level: int) -> _ParallelDeflate | None:
    """Make zipfile's writer ``fh`` (a ``ZipFile.open(.., "w")`` of a deflated entry)
    deflate on threads: its compressor, a zlib object, is swapped for a
    ``_ParallelDeflate``. None where this Python's writer holds no such compressor (it
    then deflates as it always does)."""
    if type(getattr(fh, "_compressor", None)) is not type(zlib.compressobj()):
        return None
    fh._compressor = _ParallelDeflate(level, min(4, os.cpu_count() or 1))
    return fh._compressor


def _without_surrogates(column):
    """A column's texts with their lone surrogates replaced (numbers as they are)."""
    if not isinstance(column, list):
        return column
    return [lone_surrogates.replace(v) if type(v) is str else v for v in column]


def _write_sheet(zf: zipfile.ZipFile, index: int, sheet: Sheet, sst: SharedStrings | None = None,
                 progress=None, csv_fh: _WriteBehind | None = None) -> bool:
    """Write one sheet (its rows also to ``csv_fh``, the CSV's writer, where given);
    whether texts with lone surrogates were replaced to encode them."""
    n = len(sheet.columns[0]) if sheet.columns else 0
    with zf.open(f"xl/worksheets/sheet{index}.xml", "w", force_zip64=True) as fh:
        if n <= CHUNK_ROWS:
            return _sheet_xml(fh, sheet, sst, progress, csv_fh)
        _deflate_in_parallel(fh, COMPRESS_LEVEL)     # before the first write; fh's close flushes and ends the pool
        behind = _WriteBehind(fh, "probe-xlsx-writer", 2)
        try:
            replaced = _sheet_xml(behind, sheet, sst, progress, csv_fh)
        except BaseException:
            with contextlib.suppress(Exception):     # the first error is the one raised
                behind.wait()
            raise
        behind.wait()
        return replaced


def _sheet_xml(fh, sheet: Sheet, sst: SharedStrings | None, progress, csv_fh: _WriteBehind | None) -> bool:
    """``_write_sheet``'s XML, written to ``fh`` (the zip entry, or its writer thread)."""
    ncol = len(sheet.header)
    letters = [col_letter(i) for i in range(ncol)]
    n = len(sheet.columns[0]) if sheet.columns else 0
    parts = ['<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
             '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
             'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
             + ('<sheetPr><pageSetUpPr fitToPage="1"/></sheetPr>' if sheet.fit_width else '')
             + '<sheetViews><sheetView' + (' tabSelected="1"' if sheet.active else '')
             + ' workbookViewId="0">']
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
    prefixes, (shared, coded) = _prefixes(sheet), _column_tables(sheet, sst, csv_fh is not None)
    replaced = False
    for lo in range(0, n, CHUNK_ROWS):
        hi = min(n, lo + CHUNK_ROWS)
        columns = [c[lo:hi] for c in sheet.columns]
        styles = sheet.row_styles[lo:hi] if sheet.row_styles else None
        heights = sheet.row_heights[lo:hi] if sheet.row_heights else None
        try:
            xml, text = prepared_rows(columns, styles, lo, prefixes, shared, csv_fh is not None, heights, coded)
        except UnicodeEncodeError:        # a lone surrogate: UTF-8 has no such character (no codes: texts made again)
            xml, text = prepared_rows(list(map(_without_surrogates, columns)), styles, lo, prefixes,
                                      shared, csv_fh is not None, heights)
            replaced = True
        if csv_fh:                          # first: the CSV's thread starts on the rows' number texts, which
            csv_fh.write_rows(text)         # the sheet's writer (also the CRC and the deflate's feeder) shares
        if hasattr(fh, "write_rows"):       # a writer thread: it joins them
            fh.write_rows(xml)
        else:
            fh.write(xml.join())
        if progress is not None:
            progress(hi - lo)
    tail = ["</sheetData>"]
    if sheet.autofilter and ncol:
        tail.append(f'<autoFilter ref="A1:{letters[-1]}{max(n + 1, 1)}"/>')
    if sheet.links:
        tail.append("<hyperlinks>" + "".join(
            f'<hyperlink ref="{ref}" location="{esc(loc).replace(chr(34), "&quot;")}" display="{ref}"/>'
            for ref, loc in sheet.links) + "</hyperlinks>")
    if sheet.fit_width:
        tail.append('<pageMargins left="0.5" right="0.5" top="0.6" bottom="0.6" header="0.3" footer="0.3"/>'
                    '<pageSetup orientation="landscape" fitToWidth="1" fitToHeight="0"/>')
    if sheet.charts:
        tail.append('<drawing r:id="rId1"/>')
    tail.append("</worksheet>")
    fh.write("".join(tail).encode("utf-8"))
    return replaced


def _open_csv(path: str, header: list, files: contextlib.ExitStack) -> _WriteBehind:
    """The CSV of a sheet, written whole or not at all, its header written."""
    tmp = files.enter_context(replaced_when_written(path))
    out = _WriteBehind(open(tmp, "wb"))
    files.callback(out.close)        # closed before it is renamed (callbacks run in reverse)
    head = io.StringIO(newline="")
    csv.writer(head).writerow(header)
    out.write(head.getvalue().encode("utf-8"))
    return out


def write_workbook(path: str, sheets, progress=None) -> list:
    """Write ``sheets`` (Sheet objects, or an iterator that makes them one at a time) to
    ``path``, and each sheet's CSV where it has a ``csv_path``; return the names of the
    sheets written (a sheet past Excel's row limit is several: ``part_names``). Nothing is
    left half-written: each file is renamed to its name when complete (written_whole).
    ``progress``: called with the number of rows written after each chunk."""
    replaced = False
    with contextlib.ExitStack() as files:
        tmp = files.enter_context(replaced_when_written(path))
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL) as zf:
            sst = SharedStrings()
            done: list = []
            for sheet in sheets:
                csv_fh = _open_csv(sheet.csv_path, sheet.header, files) if sheet.csv_path is not None else None
                parts = _parts(sheet)
                if len(parts) > 1:
                    logger.warning("probe: the workbook's sheet %s: %s", sheet.name,
                                   split_note(sheet.name, len(sheet.columns[0])))
                for part in parts:
                    done.append(part)
                    replaced |= _write_sheet(zf, len(done), part, sst, progress, csv_fh)
            xml = sst.xml()
            try:
                data = xml.encode("utf-8")
            except UnicodeEncodeError:
                data, replaced = lone_surrogates.replace(xml).encode("utf-8"), True
            zf.writestr("xl/sharedStrings.xml", data)
            _write_parts(zf, done)
    if replaced:
        lone_surrogates.say_replaced(os.path.dirname(os.path.abspath(path)))
    return [s.name for s in done]


def _write_parts(zf: zipfile.ZipFile, sheets: list) -> None:
    """Everything but the sheets and the shared strings: charts, workbook, styles, rels."""
    n = len(sheets)
    active = next((i for i, s in enumerate(sheets) if s.active), 0)
    chart_types = write_charts(zf, sheets)
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
    names = "".join(f'<sheet name="{esc(s.name)}" sheetId="{i + 1}" r:id="rId{i + 1}"/>'
                    for i, s in enumerate(sheets))
    defined = "".join(
        f'<definedName name="_xlnm._FilterDatabase" localSheetId="{i}" hidden="1">'
        f"'{esc(s.name)}'!$A$1:${col_letter(len(s.header) - 1)}$1</definedName>"
        for i, s in enumerate(sheets) if s.autofilter and s.header)
    zf.writestr("xl/workbook.xml",
                '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                '<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
                'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
                f'<bookViews><workbookView activeTab="{active}"/></bookViews>'
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
    zf.writestr("xl/styles.xml", _STYLES_XML)
