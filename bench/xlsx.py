"""The workbook writer's speed paths, each beside the path it replaces (printed ratios).

A sheet shaped like the compare's main sheet (two name columns, constant texts, 16
float64 columns, shared verdict texts, rows of three styles) is

* encoded with the C join (``_cjoin.join_rows``) and with its Python reference;
* deflated, its whole XML, by ISA-L and by zlib (level 1, one thread);
* written as a workbook with its CSV: chunks deflated on threads, the CSV written behind,
  and as zipfile deflates it by itself in the encoding thread.

    python bench/xlsx.py [--rows 100000]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
import zlib

import numpy as np

from probe.compare.xlsx import Sheet, cells, sheets, write_workbook


def _sheet(n: int, csv_path: str | None = None) -> Sheet:
    rng = np.random.default_rng(0)
    names = [f"Functional.linear.{k // 3}.forward.{('input.0', 'input.1', 'output.0')[k % 3]}" for k in range(n)]
    numbers = [rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n) for _ in range(16)]
    header = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", *[f"n{k}" for k in range(16)], "Err_message"]
    cols = [names, list(names), ["torch.float32"] * n, ["torch.float32"] * n, *numbers,
            [f"error: statistics off by {k % 997}x" for k in range(n)]]
    styles = [(None, "error", "warning")[k % 3] for k in range(n)]
    return Sheet("rows", header, cols, styles, csv_path=csv_path)


def _encode_s(sheet: Sheet, join) -> tuple[float, bytes]:
    cells.join_rows, saved = join, cells.join_rows
    try:
        n, parts = len(sheet.columns[0]), []
        t = time.perf_counter()
        prefixes = sheets._prefixes(sheet)
        shared, coded = sheets._column_tables(sheet, cells.SharedStrings(), True)   # as the writer codes them
        for lo in range(0, n, sheets.CHUNK_ROWS):
            hi = min(n, lo + sheets.CHUNK_ROWS)
            parts.append(cells.encode_rows([c[lo:hi] for c in sheet.columns], sheet.row_styles[lo:hi], lo,
                                           prefixes, shared, True, None, coded)[0])
        return time.perf_counter() - t, b"".join(parts)
    finally:
        cells.join_rows = saved


def _deflate_s(lib, xml: bytes) -> float:
    t = time.perf_counter()
    c = lib.compressobj(1, lib.DEFLATED, -15)
    c.compress(xml)
    c.flush()
    return time.perf_counter() - t


class _Inline:
    """A file written in the calling thread (what ``sheets._WriteBehind`` replaced)."""

    def __init__(self, fh, *named):
        self.fh = fh

    def write(self, data: bytes):
        self.fh.write(data)

    def wait(self):
        pass

    def close(self):
        self.fh.close()


def _workbook_s(n: int, tmp: str, threaded: bool) -> float:
    swap, behind = sheets._deflate_in_parallel, sheets._WriteBehind
    if not threaded:
        sheets._deflate_in_parallel, sheets._WriteBehind = (lambda fh, level: None), _Inline
    try:
        sheet = _sheet(n, os.path.join(tmp, "t.csv"))
        t = time.perf_counter()
        write_workbook(os.path.join(tmp, "t.xlsx"), [sheet])
        return time.perf_counter() - t
    finally:
        sheets._deflate_in_parallel, sheets._WriteBehind = swap, behind


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    n = ap.parse_args().rows
    sheet = _sheet(n)
    py_s, xml = _encode_s(sheet, cells.join_rows_py)
    if cells.join_rows is cells.join_rows_py:
        print(f"encode {n} rows: Python join {py_s:.2f} s (the C join was not built)")
    else:
        c_s, c_xml = _encode_s(sheet, cells.join_rows)
        assert c_xml == xml, "the two joins differ"
        print(f"encode {n} rows ({len(xml) / 1e6:.0f} MB of XML): C join {c_s:.2f} s, Python join {py_s:.2f} s"
              f"   x{py_s / c_s:.2f}")
    z_s = _deflate_s(zlib, xml)
    if sheets.deflate_lib is zlib:
        print(f"deflate the XML: zlib {z_s:.2f} s (isal not installed)")
    else:
        i_s = _deflate_s(sheets.deflate_lib, xml)
        print(f"deflate the XML, one thread: ISA-L {i_s:.2f} s, zlib {z_s:.2f} s   x{z_s / i_s:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        plain, threaded = _workbook_s(n, tmp, False), _workbook_s(n, tmp, True)
    print(f"workbook + CSV: threads {threaded:.2f} s, zipfile's zlib in the encoding thread {plain:.2f} s   x{plain / threaded:.2f}")


if __name__ == "__main__":
    main()
