"""The column-at-a-time xlsx/CSV encoding gives what cell-by-cell encoding gives."""
import csv
import io
import math
import zipfile

import numpy as np
import openpyxl

from probe.compare.xlsx import Sheet, cell_body, encode_column, float_text, write_workbook

INF = float("inf")
COLUMNS = {
    "floats": [1.5, -0.1, 1e-300, 123456789.123, 0.0, -0.0, 1 / 3, 1e-5, 1e16, -2.5e-7, 1e22] * 3,
    "floats with gaps": [1.5, None, math.nan, INF, -INF, 2.25, None],
    "all None": [None, None, None],
    "names": ["Functional.linear.0.forward.input.0", "Tensor.__add__.3.backward.output.0", None],
    "strings to escape": ["a & b", "<tag>", "x > y", "tab\there", "line\nbreak", "bell\x07",
                         " lead", "trail ", "quote \" and, comma", "\r", ""],
    "NUL inside": ["a\x00b", "plain"],
    "long": ["x" * 40000, "short"],
    "repeated": ["torch.float32", "torch.bfloat16", None] * 50,
    "bools": [True, False, None] * 40,
    "ints": [1, 2, 3, None],
    "bools and ints": [True, 1, 0, False],
    "mixed": ["unsupported", 0.5, None, INF, 3, True, np.float64(0.25), np.float32(2.0)],
}


class _CsvWriter:
    """csv.writer as Python 3.11+ writes NUL (unquoted, as is); 3.10's raises on it."""
    _NUL_STAND_IN = "\ue000"

    def __init__(self, buf):
        self.buf = buf

    def writerows(self, rows):
        tmp = io.StringIO(newline="")
        csv.writer(tmp).writerows([[v.replace("\x00", self._NUL_STAND_IN) if isinstance(v, str) else v
                                    for v in row] for row in rows])
        self.buf.write(tmp.getvalue().replace(self._NUL_STAND_IN, "\x00"))

    def writerow(self, row):
        self.writerows([row])


def _formula_safe(value):
    """A text that a spreadsheet would take for a formula, with OWASP's leading apostrophe."""
    return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def _csv_text(value) -> str:
    """csv.writer's field, but a finite float in the shortest text that reads back as it,
    laid out as Ryu lays it out (``1e-7`` where csv.writer has repr's ``1e-07``)."""
    if type(value) is float and math.isfinite(value):
        text = float_text.text_py(value)
        assert float(text) == value
        return text
    value = _formula_safe(value)
    buf = io.StringIO()
    _CsvWriter(buf).writerow([value, "x"])
    return buf.getvalue()[:-len(",x\r\n")]


def test_columns_encode_as_cells_do():
    for name, col in COLUMNS.items():
        bodies, fields = encode_column(col)
        assert bodies == [cell_body(v) for v in col], name
        assert fields == [_csv_text(v) for v in col], name


def _expected(v):
    """What the cell reads back as (NaN and None are blank; infinities are text)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    if isinstance(v, str):
        v = _formula_safe(v)
        text = "".join(c for c in v if c in "\t\n\r" or ord(c) >= 32)
        text = text.replace("\r\n", "\n").replace("\r", "\n")      # XML reads CR as LF
        return text if len(text) <= 32000 else text[:32000] + "..."
    return v if isinstance(v, bool) else str(v)        # other objects are written as text


def test_workbook_and_csv_round_trip(tmp_path):
    header = list(COLUMNS)
    n = max(map(len, COLUMNS.values()))
    cols = [col + [None] * (n - len(col)) for col in COLUMNS.values()]
    styles = [None, "error", "warning"] * (n // 3) + [None] * (n % 3)
    xlsx, csv_path = str(tmp_path / "t.xlsx"), str(tmp_path / "t.csv")
    write_workbook(xlsx, [Sheet("rows", header, cols, styles, percent_columns={"floats"},
                                csv_path=csv_path)])
    ws = openpyxl.load_workbook(xlsx)["rows"]
    assert [c.value for c in ws[1]] == header
    for r, row in enumerate(ws.iter_rows(min_row=2), start=0):
        for c, cell in enumerate(row):
            want = _expected(cols[c][r])
            if isinstance(want, float):
                assert cell.value == want or (want == 0 and cell.value == 0), (header[c], r)
            else:
                assert cell.value == want, (header[c], r, cell.value, want)
            rgb = cell.fill.fgColor.rgb if cell.fill.fill_type == "solid" else None
            assert rgb == {None: None, "error": "FFFFC7CE", "warning": "FFFFEB9C"}[styles[r]]
            assert cell.number_format.endswith("%") == (header[c] == "floats")
    buf = io.StringIO(newline="")
    w = _CsvWriter(buf)
    w.writerow(header)
    w.writerows([[_csv_text(v) if type(v) is float and math.isfinite(v) else _formula_safe(v) for v in row]
                 for row in zip(*cols)])
    with open(csv_path, newline="", encoding="utf-8") as fh:
        assert fh.read() == buf.getvalue()


def _rows_sheet(n):
    rng = np.random.default_rng(0)
    floats = rng.standard_normal(n).tolist()
    gaps = [None if k % 7 == 0 else math.nan if k % 11 == 0 else INF if k % 13 == 0 else v
            for k, v in enumerate(rng.standard_normal(n).tolist())]
    verdicts = [("pass", "warning", "error")[k % 3] for k in range(n)]      # shared strings
    cols = [[f"row {k}" for k in range(n)], floats, gaps, [None] * n, verdicts]
    header = ["name", "floats", "gaps", "empty", "verdict"]
    styles = [None, "error", "warning", None] * (n // 4)
    return header, cols, styles


def _write(path, header, cols, styles, second_sheet=True):
    sheets = [Sheet("rows", header, cols, styles, csv_path=str(path) + ".csv")]
    if second_sheet:                    # shared strings carry over from sheet to sheet
        sheets.append(Sheet("again", header, cols, styles))
    write_workbook(str(path), sheets)
    with zipfile.ZipFile(path) as z:
        return [z.read(n) for n in sorted(z.namelist())], open(str(path) + ".csv", "rb").read()


def test_chunking_does_not_change_the_file(tmp_path, monkeypatch):
    """Rows are encoded a chunk at a time (shared strings registered for the whole column
    first): the file is the same whatever the chunk size."""
    from probe.compare.xlsx import sheets
    header, cols, styles = _rows_sheet(1000)
    whole = _write(tmp_path / "whole.xlsx", header, cols, styles)
    monkeypatch.setattr(sheets, "CHUNK_ROWS", 64)
    chunked = _write(tmp_path / "chunked.xlsx", header, cols, styles)
    assert chunked == whole


def test_float_array_columns_write_as_lists_do(tmp_path, monkeypatch):
    """The compare's number columns are float64 arrays (NaN: an empty cell); adjacent ones
    with the same cell style are encoded as one block per row. The workbook and the CSV must
    be byte for byte what the same numbers give as lists (NaN as None), whatever the row
    styles, with infinities in some chunks (those go cell by cell), percent columns between
    plain ones, and a column of one value among them."""
    from probe.compare.xlsx import sheets
    rng = np.random.default_rng(1)
    n = 700
    arrays = [rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n) for _ in range(7)]
    arrays[0][::5] = np.nan
    arrays[3][::9] = -0.0
    arrays[4][[3, 400]] = [np.inf, -np.inf]          # chunks 0 and 3 of 128 rows
    arrays[6][:] = np.nan
    header = ["name", "a", "b", "pa", "pb", "same", "c", "d", "e", "tail"]
    values = [[f"row {k}" for k in range(n)], arrays[0], arrays[1], arrays[2], arrays[3],
              np.full(n, 2.5), arrays[4], arrays[5], arrays[6], [("x", "y")[k % 2] for k in range(n)]]
    styles = [(None, "error", "warning", "link")[k % 5 % 4] for k in range(n)]
    monkeypatch.setattr(sheets, "CHUNK_ROWS", 128)

    def write(path, cols):
        sheet = Sheet("rows", header, cols, styles, percent_columns={"pa", "pb"}, csv_path=str(path) + ".csv")
        write_workbook(str(path), [sheet])
        with zipfile.ZipFile(path) as z:
            return [z.read(n) for n in sorted(z.namelist())], open(str(path) + ".csv", "rb").read()

    as_lists = [[None if math.isnan(v) else v for v in c.tolist()] if isinstance(c, np.ndarray) else c
                for c in values]
    assert write(tmp_path / "arrays.xlsx", values) == write(tmp_path / "lists.xlsx", as_lists)
    ws = openpyxl.load_workbook(tmp_path / "arrays.xlsx")["rows"]
    assert ws.cell(2 + 1, 2).value == arrays[0][1] and ws.cell(2, 2).value is None
    assert ws.cell(2 + 3, 7).value == "inf" and ws.cell(2 + 1, 4).number_format.endswith("%")


def test_diagnosis_sheet_leaves_blank_what_a_spreadsheet_cannot_hold(tmp_path):
    """The Diagnosis sheet's number columns are float arrays: None and the infinities are
    empty cells (a spreadsheet has no infinity), and the chart's columns also leave 0 out
    (a log axis cannot show it); finite numbers are written as they are."""
    from types import SimpleNamespace

    from probe.compare.diagnosis import CallDiag
    from probe.compare.report import DIAG_HEADER, diagnosis_sheet
    calls = [CallDiag(0, "forward", "Functional.linear.0.forward", "Functional.linear.0.forward", "exact"),
             CallDiag(1, "forward", "Functional.gelu.0.forward", "Functional.gelu.0.forward", "exact"),
             CallDiag(2, "backward", "Functional.gelu.0.backward", None, "unmatched")]
    calls[0].input_error, calls[0].output_error, calls[0].max_rel = 0.0, 2.5e-3, INF
    calls[1].input_error, calls[1].output_error, calls[1].noise = INF, 0.0, 1e-6
    calls[2].status = "unmatched"
    path = str(tmp_path / "d.xlsx")
    write_workbook(path, [diagnosis_sheet(SimpleNamespace(calls=calls))])
    ws = openpyxl.load_workbook(path, read_only=True).worksheets[0]
    rows = [dict(zip(DIAG_HEADER, r)) for r in ws.iter_rows(min_row=2, values_only=True)]
    assert [r["#"] for r in rows] == [1, 2, 3]
    first, second, third = rows
    assert first["Input Error"] == 0 and first["Output Error"] == 2.5e-3
    assert first["Jump"] is None                   # 2.5e-3 / 0: infinite
    assert first["Threshold"] == calls[0].threshold and first["MaxRelativeErr"] is None
    assert first["Plot Output Error"] == 2.5e-3 and first["Plot Input Error"] is None   # 0: a gap
    assert second["Input Error"] is None and second["Output Error"] == 0 and second["Noise"] == 1e-6
    assert second["Jump"] == 0 and second["Plot Output Error"] is None
    assert third["Output Error"] is None and third["Jump"] is None and third["Threshold"] is None
    assert third["Status"] == "unmatched"
