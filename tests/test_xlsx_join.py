"""The xlsx writer's two speed paths give the files the plain paths give.

* Rows are joined by the C extension ``_cjoin.join_rows`` where it was built, else by
  ``cells.join_rows_py``: byte for byte the same sheet XML and CSV.
* A big sheet is deflated a chunk at a time on threads (``sheets._ParallelDeflate``),
  with ISA-L where it is installed: one valid deflate stream whose contents are what
  zipfile's own deflate stores, the same bytes however many threads.
"""
import os
import zipfile
import zlib

import numpy as np
import openpyxl
import orjson
import pytest

from probe.compare.xlsx import Sheet, cells, sheets, write_workbook

try:
    from probe.compare.xlsx._cjoin import join_rows as c_join
except ImportError:
    c_join = None

needs_c = pytest.mark.skipif(c_join is None, reason="probe.compare.xlsx._cjoin not built (no C compiler)")


def _block(rng, m, k, nan_every=0):
    a = rng.standard_normal((m, k)) * 10.0 ** rng.integers(-12, 12, (m, k))
    a[::3, 0] = -0.0
    if nan_every:
        a.flat[::nan_every] = np.nan
    return orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY)


def _codes(values, dtype):
    return np.asarray(values, dtype=dtype).tobytes()


def _parts(rng, m):
    """Parts of every kind: texts per row (ASCII, non-ASCII, empty), one text for all rows,
    row numbers, texts picked by codes of each width, blocks of numbers with and without
    NaN, with one opening, one per row or one picked per row."""
    openings = ['<c s="2"', "<c", '<c s="5"']
    many = [f"t{k}é" for k in range(300)]
    return [
        '<row r="', m + 7, '">',
        [("x", "é ü", "", "名前", "a & b")[r % 5] for r in range(m)],
        '<c s="7"/>',
        (_block(rng, m, 3), "<c"),
        (_block(rng, m, 4, nan_every=5), [openings[r % 3] for r in range(m)]),
        (["<a>", "", "é"], _codes([r % 3 for r in range(m)], np.uint8)),
        (many, _codes([(r * 7) % 300 for r in range(m)], np.uint16)),
        (many, _codes([(r * 11) % 300 for r in range(m)], np.uint32)),
        [str(r) for r in range(m)],
        (_block(rng, m, 2, nan_every=2), '<c s="1"'),
        (_block(rng, m, 1, nan_every=3), (openings, _codes([(r * 5) % 3 for r in range(m)], np.uint8))),
        "</row>",
    ]


@needs_c
@pytest.mark.parametrize("m", [0, 1, 2, 7, 300])
def test_the_c_join_gives_the_python_join_bytes(m):
    rng = np.random.default_rng(m)
    xml = _parts(rng, m)
    assert c_join(xml, m, "", "") == cells.join_rows_py(xml, m, "", "")
    fields = [(p[0], None) if isinstance(p, tuple) and isinstance(p[0], bytes) else p for p in xml]
    for sep, end in ((",", "\r\n"), ("", ""), (";", "")):
        assert c_join(fields, m, sep, end) == cells.join_rows_py(fields, m, sep, end)


@needs_c
@pytest.mark.parametrize("m", [0, 1, 300])
def test_rows_prepared_then_joined_on_another_thread_give_the_python_join_bytes(m):
    """``_cjoin.rows`` checks the parts at once and joins them later, on any thread (the
    GIL released while it copies): the bytes of the Python join, each time it is joined."""
    from concurrent.futures import ThreadPoolExecutor

    from probe.compare.xlsx._cjoin import rows

    rng = np.random.default_rng(m + 1)
    xml = _parts(rng, m)
    fields = [(p[0], None) if isinstance(p, tuple) and isinstance(p[0], bytes) else p for p in xml]
    prepared = [(rows(xml, m, "", ""), cells.join_rows_py(xml, m, "", "")),
                (rows(fields, m, ",", "\r\n"), cells.join_rows_py(fields, m, ",", "\r\n"))]
    with ThreadPoolExecutor(4) as pool:
        joined = list(pool.map(lambda r: r[0].join(), prepared * 8))
    assert joined == [want for _, want in prepared * 8]
    assert [r.join() for r, _ in prepared] == [want for _, want in prepared]


@needs_c
def test_rows_raise_a_bad_text_when_prepared_not_when_joined():
    """What cannot be joined is said where the rows are made (the encoding thread): a lone
    surrogate as the UnicodeEncodeError the writer catches to replace it, a non-text as a
    TypeError, a block short of rows when joined."""
    from probe.compare.xlsx._cjoin import rows

    with pytest.raises(UnicodeEncodeError):
        rows([["ok", "bad \ud800"]], 2, "", "")
    with pytest.raises(UnicodeEncodeError):
        rows([(["ok", "\udfff"], bytes([0, 1]))], 2, "", "")
    with pytest.raises(TypeError, match="must be str"):
        rows([["ok", 3]], 2, "", "")
    short = rows([(orjson.dumps(np.ones((1, 2)), option=orjson.OPT_SERIALIZE_NUMPY), "<c")], 2, "", "")
    with pytest.raises(ValueError, match="fewer rows"):
        short.join()


def test_prepared_rows_give_the_joined_rows_with_either_join(monkeypatch):
    """``cells.prepared_rows`` (joined later, on the writer's thread) gives the bytes of
    ``encode_rows``, with the C rows and with the Python join (joined at once)."""
    n = 600
    header, cols, styles, heights = _sheet_columns(n)
    sheet = Sheet("rows", header, cols, styles, percent_columns={"pa", "pb"}, wrap_columns={"name"})
    prefixes = sheets._prefixes(sheet)
    shared = sheets._shared_tables(sheet, cells.SharedStrings())
    joins = [cells.join_rows_py] + ([c_join] if c_join is not None else [])
    for lo, hi in ((0, 1), (250, 600)):
        args = ([c[lo:hi] for c in cols], styles[lo:hi], lo, prefixes, shared, True, heights[lo:hi])
        want = cells.encode_rows(*args)
        for join in joins:
            monkeypatch.setattr(cells, "join_rows", join)
            xml, text = cells.prepared_rows(*args)
            assert (xml.join(), text.join()) == want
            assert isinstance(xml, cells.Joined) == (join is cells.join_rows_py)
        xml, text = cells.prepared_rows(*args[:5], False, args[6])
        assert text is None and xml.join() == want[0]


@needs_c
def test_the_c_join_writes_cells_and_fields_as_documented():
    block = orjson.dumps(np.array([[1.5, np.nan], [-0.0, 2e-7]]), option=orjson.OPT_SERIALIZE_NUMPY)
    assert c_join([["<a>", "<b>"], (block, ['<c s="2"', "<c"]), "|"], 2, "", "\n") == (
        b'<a><c s="2"><v>1.5</v></c><c s="2"/>|\n<b><c><v>-0.0</v></c><c><v>2e-7</v></c>|\n')
    assert c_join([["x", "y"], (block, None)], 2, ",", "\r\n") == b"x,1.5,\r\ny,-0.0,2e-7\r\n"


@needs_c
def test_the_c_join_refuses_parts_that_do_not_fit():
    block = orjson.dumps(np.ones((2, 2)), option=orjson.OPT_SERIALIZE_NUMPY)
    with pytest.raises(ValueError, match="2 texts for 3 rows"):
        c_join([["a", "b"]], 3, "", "")
    with pytest.raises(ValueError, match="fewer rows than m"):
        c_join([(block, "<c")], 3, "", "")
    with pytest.raises(TypeError, match="must be str"):
        c_join([["a", 1]], 2, "", "")
    with pytest.raises(TypeError, match="a part is"):
        c_join([3.0], 1, "", "")
    with pytest.raises(ValueError, match="3 bytes of codes for 2 rows"):
        c_join([(["a"], b"\0\0\0")], 2, "", "")
    with pytest.raises(ValueError, match="past its 1 texts"):
        c_join([(["a"], b"\0\1")], 2, "", "")


@pytest.mark.parametrize("n_distinct", [0, 1, 3, 256, 257, 70000])
def test_codes_take_the_fewest_bytes(n_distinct):
    """``cells.codes``: distinct values in order of first appearance (equal values are
    one: dict.fromkeys), per value its index in the fewest bytes that hold it (what
    join_rows picks texts by), from a list or any iterable."""
    rng = np.random.default_rng(n_distinct)
    texts = [f"value {k}" for k in range(n_distinct)]
    values = [texts[k] for k in rng.integers(0, n_distinct, 3 * n_distinct)] + texts if n_distinct else []
    values += [None, True, None, "value 0", "value 0"[:5] + " 0"]      # an equal text, not the same object
    distinct, codes = cells.codes(values)
    assert (distinct, codes) == cells.codes(iter(values))
    assert distinct == list(dict.fromkeys(values))
    width = len(codes) // len(values)
    assert width == (1 if len(distinct) <= 256 else 2 if len(distinct) <= 65536 else 4)
    assert [distinct[k] for k in np.frombuffer(codes, {1: np.uint8, 2: np.uint16, 4: np.uint32}[width])] == values
    with pytest.raises(TypeError, match="unhashable"):
        cells.codes([[1]])


def _sheet_columns(n):
    """The compare's kinds of columns: names, constant texts, float arrays in runs (NaN,
    infinities in some chunks), a float list, shared texts, bools."""
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n) for _ in range(5)]
    arrays[0][::5] = np.nan
    arrays[2][[3, n - 2]] = [np.inf, -np.inf]
    header = ["name", "dtype", "a", "b", "pa", "pb", "c", "list", "verdict", "flag"]
    cols = [[f"Functional.linear.{k}.forward.output.0" for k in range(n)], ["torch.float32"] * n,
            arrays[0], arrays[1], arrays[2], arrays[3], arrays[4],
            rng.standard_normal(n).tolist(), [("pass", "error: x > y & z")[k % 2] for k in range(n)],
            [k % 3 == 0 for k in range(n)]]
    styles = [(None, "error", "warning", "link")[k % 7 % 4] for k in range(n)]
    heights = [None if k % 4 else 30 for k in range(n)]
    return header, cols, styles, heights


@needs_c
def test_encode_rows_gives_the_same_bytes_with_either_join(monkeypatch):
    n = 600
    header, cols, styles, heights = _sheet_columns(n)
    sheet = Sheet("rows", header, cols, styles, percent_columns={"pa", "pb"}, wrap_columns={"name"})
    prefixes = sheets._prefixes(sheet)
    shared = sheets._shared_tables(sheet, cells.SharedStrings())
    for lo, hi in ((0, 1), (0, 250), (250, 600)):
        for chunk_styles, chunk_heights in ((styles[lo:hi], heights[lo:hi]), (None, None), ([None] * (hi - lo), None)):
            args = ([c[lo:hi] for c in cols], chunk_styles, lo, prefixes, shared, True, chunk_heights)
            monkeypatch.setattr(cells, "join_rows", c_join)
            with_c = cells.encode_rows(*args)
            monkeypatch.setattr(cells, "join_rows", cells.join_rows_py)
            assert cells.encode_rows(*args) == with_c


def test_coded_columns_give_the_bytes_of_their_cells(monkeypatch):
    """Columns of repeated values (shared texts, inline texts, bools, None among them, one
    value) joined by code, worked out once for the sheet, give the bytes that their cells
    made chunk by chunk give, with the C codes and their Python twin; a column where
    numbers sit among bools is not coded."""
    n = 600
    header, cols, styles, _ = _sheet_columns(n)
    extra = {"dtype or none": [None if k % 5 == 0 else ("float32", "bfloat16")[k % 2] for k in range(n)],
             "grad": [None if k % 4 == 0 else k % 3 == 0 for k in range(n)],
             "hostile": [("=1+1", "a,b", " x ", "ok", 'say "y"')[k % 5] for k in range(n)],
             "one": ["exact"] * n,
             # 1 == True and 0.0 == False: one code would write the number as a bool
             "bools and numbers": [(True, 1, False, 0.0, None)[k % 5] for k in range(n)]}
    header, cols = header + list(extra), cols + list(extra.values())
    sheet = Sheet("rows", header, cols, styles, percent_columns={"pa", "pb"}, wrap_columns={"name"})
    prefixes = sheets._prefixes(sheet)
    from probe.compare import codes as value_codes
    for cflat in (value_codes._cflat, None):            # the compare's codes in C, and in Python
        monkeypatch.setattr(value_codes, "_cflat", cflat)
        for with_csv in (True, False):
            shared, coded = sheets._column_tables(sheet, cells.SharedStrings(), with_csv)
            assert [h for h, c in zip(header, coded) if c is not None] == [
                "dtype", "verdict", "flag", "dtype or none", "grad", "hostile", "one"]
            for lo, hi in ((0, 1), (0, 250), (250, 600)):
                for chunk_styles in (styles[lo:hi], None):
                    args = ([c[lo:hi] for c in cols], chunk_styles, lo, prefixes, shared, with_csv, None)
                    assert cells.encode_rows(*args, coded) == cells.encode_rows(*args)


def _entry_bytes(path, name):
    """A zip member's stored (compressed) bytes, as they lie in the file."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        head = fh.read(30)
        fh.seek(info.header_offset + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little"))
        return fh.read(info.compress_size)


def _write_big(path, monkeypatch, n=900):
    header, cols, styles, heights = _sheet_columns(n)
    monkeypatch.setattr(sheets, "CHUNK_ROWS", 64)
    write_workbook(str(path), [Sheet("rows", header, cols, styles, row_heights=heights,
                                     csv_path=str(path) + ".csv")])
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None                      # every member's CRC checks
        return {name: z.read(name) for name in z.namelist()}, open(str(path) + ".csv", "rb").read()


def test_big_sheets_deflate_on_threads_into_one_valid_stream(tmp_path, monkeypatch):
    engaged = []
    swap = sheets._deflate_in_parallel
    monkeypatch.setattr(sheets, "_deflate_in_parallel", lambda fh, level: engaged.append(swap(fh, level)))
    threaded = _write_big(tmp_path / "threads.xlsx", monkeypatch)
    assert engaged and engaged[0] is not None, "this Python's zipfile writer was not given the threads"
    monkeypatch.setattr(sheets, "_deflate_in_parallel", lambda fh, level: None)   # zipfile's own deflate
    assert _write_big(tmp_path / "plain.xlsx", monkeypatch) == threaded
    monkeypatch.undo()
    monkeypatch.setattr(sheets, "deflate_lib", zlib)                              # no ISA-L
    assert _write_big(tmp_path / "zlib.xlsx", monkeypatch) == threaded
    ws = openpyxl.load_workbook(tmp_path / "threads.xlsx")["rows"]
    assert ws.cell(2 + 899, 1).value == "Functional.linear.899.forward.output.0"


def test_the_deflated_bytes_do_not_depend_on_the_number_of_threads(tmp_path, monkeypatch):
    stored = []
    for cores in (1, 3):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        _write_big(tmp_path / f"{cores}.xlsx", monkeypatch)
        stored.append(_entry_bytes(tmp_path / f"{cores}.xlsx", "xl/worksheets/sheet1.xml"))
    assert stored[0] == stored[1]


def test_a_failing_csv_or_sheet_write_is_raised_not_lost(tmp_path, monkeypatch):
    class Full:
        """A file whose third write fails, as on a full disk."""
        def __init__(self, fh):
            self.fh, self.writes = fh, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                raise OSError(28, "No space left on device")
            return self.fh.write(data)

        def close(self):
            self.fh.close()

    real = sheets._WriteBehind
    for failing in ("csv", "sheet"):          # the CSV's writer, or the big sheet's (named)
        monkeypatch.setattr(sheets, "_WriteBehind", lambda fh, *named, failing=failing: real(
            Full(fh) if (failing == "sheet") == bool(named) else fh, *named))
        with pytest.raises(OSError, match="No space left"):
            _write_big(tmp_path / f"full_{failing}.xlsx", monkeypatch)


def test_plain_text_columns_join_raw_as_their_cells_are_written(monkeypatch):
    """A column of texts that need no escaping goes into the join as the texts themselves,
    its cells' constant ends joined into the texts around it: the same bytes as one cell
    text per value, for texts that take the short way and texts that must not."""
    n = 50
    texts = {
        "names": [f"Functional.linear.{k}.forward.input.{k % 3}" for k in range(n)],
        "csv quoting": [("a,b", 'say "x"', "plain")[k % 3] for k in range(n)],
        "inner spaces, unicode, empty": [("two words", "é 名前", "")[k % 3] for k in range(n)],
        "edge space": [(" lead", "x")[k % 2] for k in range(n)],
        "to escape": [("a & b", "x < y", "ok")[k % 3] for k in range(n)],
        "control": [("tab\there", "ok")[k % 2] for k in range(n)],
        "None among them": [None if k % 4 == 0 else f"t{k}" for k in range(n)],
    }
    header = ["lead", *texts, "number"]
    cols = [[float(k) for k in range(n)], *texts.values(), [k / 3 for k in range(n)]]
    styles = [(None, "error", "warning")[k % 3] for k in range(n)]
    sheet = Sheet("rows", header, cols, styles, wrap_columns={"names"})
    prefixes = sheets._prefixes(sheet)
    shared = [None] * len(cols)
    for chunk_styles in (styles, None):
        args = (cols, chunk_styles, 0, prefixes, shared, True, None)
        raw = cells.encode_rows(*args)
        with monkeypatch.context() as m:
            m.setattr(cells, "_plain_texts", lambda col: None)
            assert cells.encode_rows(*args) == raw
    took = [name for name, col in texts.items() if cells._plain_texts(col) is not None]
    assert took == ["names", "csv quoting", "inner spaces, unicode, empty"]


def test_the_printable_check_of_plain_texts_is_isprintable():
    """``_plain_texts`` tells printable ASCII by its bytes (a fifth of the time): the
    answer of ``str.isprintable`` for every ASCII character, alone and among others, and
    for texts beyond ASCII."""
    chars = [chr(c) for c in range(128)] + ["é", "\u2028", "\x85", "名", "\U0001F600", "\u00a0"]
    texts = chars + [f"name.{c}.x" for c in chars] + ["", "plain text", "tab\there"]
    assert [cells._printable(t) for t in texts] == [t.isprintable() for t in texts]


@needs_c
def test_tail_codes_in_c_give_the_python_codes():
    """The page's row names after their call's name, coded in C with no str made per row
    (texts of 1-byte characters) or by a str of each tail (wider ones): the distinct tails
    and codes of the Python reference; None where a name or its call's name is missing
    or the name does not start with it."""
    from probe.compare.xlsx._cjoin import tail_codes

    rng = np.random.default_rng(7)
    heads = [f"Functional.linear.{k}.forward" for k in range(400)] + ["Tensor.é.0.forward", "", None]
    picks = rng.integers(0, 401, 5000)
    texts = [heads[k] + ("", ".input.0", ".output.0", ".input.1", ".é", "\x00x")[r % 6] for r, k in enumerate(picks)]

    def both(texts, which):
        raw = np.asarray(which, np.int32).tobytes()
        got = tail_codes(texts, heads, raw)
        assert got == cells.tail_codes_py(texts, heads, raw)
        return got

    distinct, codes = both(texts, picks)
    assert distinct == ["", ".input.0", ".output.0", ".input.1", ".é", "\x00x"]
    assert len(codes) == len(texts)
    wide = texts + ["Tensor.é.0.forward.名"]        # a text of 2-byte characters: by str
    assert both(wide, list(picks) + [400])[0] == distinct + [".名"]
    assert both(texts[:3] + ["Functional.linear.0.forwarX"], list(picks[:3]) + [0]) is None
    assert both(texts[:3] + ["x"], list(picks[:3]) + [-1]) is None         # -1: the last head, None
    assert both(texts[:3] + [None], list(picks[:4])) is None
    assert both(["x", "xy"], [401, -2]) == (["x", "xy"], bytes([0, 1]))     # "" heads: the whole text
    assert both([], []) == ([], b"")
    many = [f"{heads[0]}.{k}" for k in range(70000)]                       # codes of 4 bytes
    assert len(both(many, [0] * len(many))[1]) == 4 * len(many)
    with pytest.raises(IndexError):
        tail_codes(["x"], heads, np.asarray([9999], np.int32).tobytes())


def test_shared_strings_added_at_once_are_the_strings_added_one_by_one():
    """``SharedStrings.add`` escapes printable texts together: the same items and cells,
    in the same order, as ``body`` text by text; texts it cannot take together (control
    characters, NUL, past Excel's cell limit) go one by one, and texts already there keep
    their index."""
    quiet = [f"warning: Max diff {k / 7:.6g} > {k}" for k in range(50)] + [
        " lead", "trail ", "a & b <c> d", "=1+1", "-3", "@x", "'quoted", "é 名前", "", " "]
    loud = quiet + ["tab\there", "x" * 40000, "a\x00b", "\u2028"]
    long = quiet + ["a&" * 15999 + "b"]      # under the limit as given, past it once escaped
    for texts in (quiet, loud, long):
        together, alone = cells.SharedStrings(), cells.SharedStrings()
        for s in (together, alone):
            s.body(texts[3])
        together.add(texts)
        for t in texts:
            alone.body(t)
        assert together.items == alone.items and together.cells == alone.cells
