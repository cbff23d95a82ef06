"""The texts of floats in the compare's workbook and CSV (``probe.compare.xlsx.float_text``).

* The C++ extension ``_cfloat`` and the Python reference give the same text for every
  float: random bit patterns (every exponent), values parsed from short decimals (where the
  shortest digits matter), powers of ten around the layout's edges, subnormals, -0.0.
* Each text reads back as its float, in the fewest digits (``repr``'s), laid out as Ryu
  lays them out (``1e-7``, ``0.00001``, ``1e16``): the same text whichever orjson is
  installed (3.11.7 began writing ``1e+16``).
* A ``Block``'s text is made by whichever join needs it first, on any thread, and the sheet
  and CSV rows joined from it are those joined from its text.
"""
import math
import threading
import zipfile

import numpy as np
import pytest

from probe.compare.xlsx import cells, float_text

try:
    from probe.compare.xlsx import _cfloat, _cjoin
except ImportError:
    _cfloat = _cjoin = None

needs_c = pytest.mark.skipif(_cfloat is None or _cjoin is None,
                             reason="probe.compare.xlsx._cfloat or _cjoin not built (no C/C++17 compiler)")

KNOWN = [(1.0, "1.0"), (0.0, "0.0"), (-0.0, "-0.0"), (0.1, "0.1"), (-2.5, "-2.5"), (123.456, "123.456"),
         (1e-5, "0.00001"), (1.5e-5, "0.000015"), (1e-6, "1e-6"), (1e-7, "1e-7"), (-1.25e-7, "-1.25e-7"),
         (1e15, "1000000000000000.0"), (1e16, "1e16"), (1.2e30, "1.2e30"), (1e100, "1e100"),
         (123456789012345680.0, "1.2345678901234568e17"), (9007199254740993.0, "9007199254740992.0"),
         (5e-324, "5e-324"), (2.2250738585072014e-308, "2.2250738585072014e-308"),
         (1.7976931348623157e308, "1.7976931348623157e308"), (1 / 3, "0.3333333333333333"),
         (float("nan"), "null"), (float("inf"), "null"), (float("-inf"), "null")]


def _values(n=200_000, seed=0):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 64, n, dtype=np.uint64)
    random_bits = bits.view(np.float64)
    decimals = np.array([float(f"{d}e{e}") for d, e in zip(rng.integers(1, 10 ** 6, 20_000),
                                                         rng.integers(-330, 300, 20_000))])
    tens = np.array([s * 10.0 ** e * f for e in range(-330, 309) for f in (1.0, 0.9999999999999999, 1.0000000000000002)
                     for s in (1, -1)])
    stats = rng.standard_normal(20_000) * 10.0 ** rng.integers(-12, 12, 20_000)
    return np.concatenate([random_bits, decimals, tens, stats, [v for v, _ in KNOWN]])


def test_known_texts():
    for value, text in KNOWN:
        assert float_text.text_py(value) == text, value
        assert float_text.text(value) == text, value


def test_texts_read_back_in_the_fewest_digits():
    for v in _values(20_000, seed=1).tolist():
        t = float_text.text_py(v)
        if v != v or v - v != 0:
            assert t == "null"
            continue
        assert float(t) == v and math.copysign(1, float(t)) == math.copysign(1, v)   # -0.0 too
        digits = t.split("e")[0].replace("-", "").replace(".", "").strip("0")
        shortest = repr(v).split("e")[0].replace("-", "").replace(".", "").strip("0")
        assert digits == shortest, (v, t)


@needs_c
def test_c_texts_are_the_reference_texts():
    values = _values()
    reference = list(map(float_text.text_py, values.tolist()))
    assert _cfloat.texts(values) == reference
    assert _cfloat.texts(values[::-3]) == reference[::-3]          # strided
    assert _cfloat.texts(values.tolist()) == reference
    assert [_cfloat.text(v) for v in values[:5000].tolist()] == reference[:5000]


def test_texts_of_lists_and_what_they_refuse():
    for texts in {float_text.texts_py, float_text.texts}:
        assert texts([1.5, None, 3, -(2 ** 70), 1e-7]) == ["1.5", "null", "3", str(-(2 ** 70)), "1e-7"]
        assert texts(np.array([], np.float64)) == []
        for bad in ([True], [np.float64(1.0)], ["1.0"], np.zeros(3, np.float32), np.zeros((2, 2))):
            with pytest.raises(TypeError):
                texts(bad)


def _array(seed, m, k):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)) * 10.0 ** rng.integers(-12, 20, (m, k))
    a.flat[::7] = np.nan
    a[::5, 0] = -0.0
    return a


@needs_c
def test_block_text_is_the_reference_text():
    for m, k in [(0, 3), (1, 1), (3, 5), (4096, 16)]:
        a = _array(m + k, m, k)
        assert _cfloat.Block(a).text() == float_text.block_text_py(a)
    with pytest.raises(TypeError):
        _cfloat.Block(np.zeros(4))
    with pytest.raises(TypeError):
        _cfloat.Block(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError):                        # C order only: its rows are read in place
        _cfloat.Block(np.zeros((3, 2)).T)
    a = _array(11, 40, 3)                                  # an unaligned buffer is read as well
    raw = bytearray(a.nbytes + 1)
    unaligned = np.frombuffer(raw, np.float64, a.size, offset=1).reshape(a.shape)
    unaligned[:] = a
    assert not unaligned.flags.aligned
    assert _cfloat.Block(unaligned).text() == float_text.block_text_py(a)


@needs_c
def test_join_refuses_a_block_of_fewer_rows():
    block = _cfloat.Block(np.ones((2, 3)))
    for parts in ([(block, None)], [(block, '<c s="1"')]):
        with pytest.raises(ValueError, match="a block holds 2 rows for 4 rows"):
            _cjoin.join_rows(parts, 4, ",", "|")
    assert _cjoin.join_rows([(block, None)], 2, ",", "|") == b"1.0,1.0,1.0|1.0,1.0,1.0|"


def _join_into(out: dict, key: str, rows) -> None:
    out[key] = rows.join()


@needs_c
def test_join_takes_blocks_and_makes_their_text_once_for_both_files():
    assert _cjoin.block_parts
    m = 3000
    a = _array(7, m, 6)
    text = float_text.block_text_py(a)
    opening = (['<c s="1"', '<c s="2"'], bytes(np.arange(m, dtype=np.uint8) % 2))
    for _ in range(5):                                  # the sheet's and the CSV's joins race for the text
        block = _cfloat.Block(a)
        xml = _cjoin.rows(['<row r="', 2, '">', (block, opening), "</row>"], m, "", "")
        csv = _cjoin.rows(["x", (block, None)], m, ",", "\r\n")
        out = {}
        threads = [threading.Thread(target=_join_into, args=(out, k, r)) for k, r in (("xml", xml), ("csv", csv))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out["xml"] == cells.join_rows_py(['<row r="', 2, '">', (text, opening), "</row>"], m, "", "")
        assert out["csv"] == cells.join_rows_py(["x", (text, None)], m, ",", "\r\n")
        assert out["csv"] == cells.join_rows_py(["x", (block, None)], m, ",", "\r\n")   # the Python join reads it too


def _written(tmp_path, name, columns, styles):
    from probe.compare.xlsx import Sheet, write_workbook

    header = [f"c{k}" for k in range(len(columns))]
    path, csv_path = str(tmp_path / f"{name}.xlsx"), str(tmp_path / f"{name}.csv")
    write_workbook(path, [Sheet("rows", header, columns, styles, csv_path=csv_path)])
    with zipfile.ZipFile(path) as z:
        return z.read("xl/worksheets/sheet1.xml"), open(csv_path, "rb").read()


def test_the_workbook_and_csv_numbers_are_the_same_without_the_extension(tmp_path, monkeypatch):
    """A sheet of the compare's number columns (runs of float arrays, several chunks, NaN,
    -0.0, every exponent's layout, a float list with None) written with ``_cfloat`` and
    with the Python texts: the same sheet XML and CSV, each number reading back as itself."""
    m = 9000                                           # past two chunks (sheets.CHUNK_ROWS)
    a = _array(3, m, 5)
    floats = [None if k % 11 == 0 else float(a[k, 1]) for k in range(m)]
    names = [f"Functional.linear.{k}.forward" for k in range(m)]
    columns = [names, *(np.ascontiguousarray(a[:, j]) for j in range(5)), floats]
    styles = [("error", "warning", None)[k % 3] for k in range(m)]
    built = _written(tmp_path, "c", columns, styles)
    monkeypatch.setattr(float_text, "Block", None)
    monkeypatch.setattr(float_text, "text", float_text.text_py)
    monkeypatch.setattr(float_text, "texts", float_text.texts_py)
    assert _written(tmp_path, "py", columns, styles) == built
    rows = [line.split(",") for line in built[1].decode().splitlines()[1:]]
    for k in range(0, m, 97):
        for j in range(5):
            field, v = rows[k][1 + j], a[k, j]
            assert field == ("" if v != v else float_text.text_py(float(v)))
            assert v != v or float(field) == v


def test_a_join_that_cannot_read_blocks_gets_their_text(tmp_path, monkeypatch):
    """Where the C join was built without ``_cfloat`` there (``_cjoin.block_parts`` false),
    a run of float columns goes to it as text: the same sheet and CSV."""
    m = 5000
    a = _array(5, m, 4)
    columns = [[f"n{k}" for k in range(m)], *(np.ascontiguousarray(a[:, j]) for j in range(4))]
    styles = [("error", None)[k % 2] for k in range(m)]
    built = _written(tmp_path, "blocks", columns, styles)
    monkeypatch.setattr(cells, "_c_block_parts", False)
    assert _written(tmp_path, "texts", columns, styles) == built
