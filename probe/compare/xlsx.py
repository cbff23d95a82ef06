"""A small streaming .xlsx writer: styled rows at about a million cells per second.

openpyxl (directly or through pandas) writes some 50k cells/s on this class of machine,
i.e. minutes for a 100k-entry compare; the report needs only inline strings, numbers,
booleans, three fills, one percent format, a frozen header, an autofilter and column
widths, which fit in a few hundred lines of SpreadsheetML.  openpyxl reads the result
(the tests check it that way).
"""
from __future__ import annotations

import math
import re
import zipfile
from dataclasses import dataclass, field

_ILLEGAL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
FILLS = {None: 0, "error": 1, "warning": 2}          # row style -> fill slot
_FILL_RGB = {"error": "FFFFC7CE", "warning": "FFFFEB9C"}
# cellXfs: data cells use fill*2 + percent (0 = plain); the header uses _XF_HEADER
_XF_HEADER = 6


@dataclass
class Sheet:
    name: str
    header: list
    rows: object                         # iterable of lists, one value per header column
    row_styles: list | None = None       # per data row: None / "error" / "warning"
    widths: list | None = None
    percent_columns: set = field(default_factory=set)
    freeze_header: bool = True
    autofilter: bool = True
    wrap_columns: set = field(default_factory=set)


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


def _cell(value, style: int) -> str:
    """One <c> element; no cell reference (cells are positional, empty ones kept as <c/>)."""
    s = f' s="{style}"' if style else ""
    t = type(value)
    if t is float:
        if value != value:
            return f"<c{s}/>"
        if value in (_INF, _NINF):
            value = "inf" if value > 0 else "-inf"
        else:
            return f"<c{s}><v>{value!r}</v></c>"
    elif value is None:
        return f"<c{s}/>"
    elif t is bool:
        return f'<c{s} t="b"><v>{int(value)}</v></c>'
    elif t is int:
        return f"<c{s}><v>{value}</v></c>"
    elif isinstance(value, (int, float)):          # numpy scalars
        return _cell(float(value), style)
    text = _esc(str(value))
    if len(text) > 32000:                       # Excel's cell limit is 32767 characters
        text = text[:32000] + "..."
    return f'<c{s} t="inlineStr"><is><t xml:space="preserve">{text}</t></is></c>'


_INF, _NINF = float("inf"), float("-inf")


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


def _write_sheet(zf: zipfile.ZipFile, index: int, sheet: Sheet) -> None:
    ncol = len(sheet.header)
    letters = [_col_letter(i) for i in range(ncol)]
    pct = [sheet.header[i] in sheet.percent_columns for i in range(ncol)]
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
        buf, r = [], 1
        styles = sheet.row_styles
        for k, values in enumerate(sheet.rows):
            r += 1
            fill = FILLS.get(styles[k]) if styles else 0
            base = fill * 2
            buf.append(f'<row r="{r}">' + "".join(
                [_cell(v, base + p) for v, p in zip(values, pct)]) + "</row>")
            if len(buf) > 2000:
                fh.write("".join(buf).encode("utf-8"))
                buf = []
        buf.append("</sheetData>")
        if sheet.autofilter and ncol:
            buf.append(f'<autoFilter ref="A1:{letters[-1]}{max(r, 1)}"/>')
        buf.append("</worksheet>")
        fh.write("".join(buf).encode("utf-8"))


def _header_cell(ref: str, text) -> str:
    return f'<c r="{ref}" s="{_XF_HEADER}" t="inlineStr"><is><t xml:space="preserve">{_esc(str(text))}</t></is></c>'


def write_workbook(path: str, sheets: list) -> None:
    """Write ``sheets`` (list of Sheet) to ``path``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        n = len(sheets)
        zf.writestr("[Content_Types].xml",
                    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                    '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                    '<Default Extension="xml" ContentType="application/xml"/>'
                    '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
                    '<Override PartName="/xl/styles.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"/>'
                    + "".join(f'<Override PartName="/xl/worksheets/sheet{i + 1}.xml" ContentType='
                              f'"application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
                              for i in range(n)) + "</Types>")
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
                      f'officeDocument/2006/relationships/styles" Target="styles.xml"/></Relationships>')
        zf.writestr("xl/styles.xml", _styles())
        for i, sheet in enumerate(sheets):
            _write_sheet(zf, i + 1, sheet)
