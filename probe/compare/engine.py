"""One compare: an NPU dump.json and a bench dump.json -> a table of judged rows.

Stages: read + flatten each side (reader, rows) -> pair (match) -> metrics (metrics;
tensor files loaded lazily, in worker processes when there is enough data) -> verdict.
The result is column-oriented (name -> list or float64 array) so the report writes it
without copying.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
from array import array
from dataclasses import dataclass, field
from collections import deque
from itertools import compress, repeat
from operator import attrgetter, eq, is_, ne, truth
from typing import Iterable, Sequence

import numpy as np

from . import verdict as vd
from .codes import codes, object_codes
from .construct import load_modules
from .match import pair_rows
from .metrics import TensorMetrics, stat_diffs, stat_tolerance_ratio, tensor_metrics
from .reader import DumpMeta, gc_paused, read_dump
from .rows import Row, direction, fields_of, flatten, numel_array, numels, side_rows, stats_in
from .tensors import load, resolve
from probe.errors import DumpError
from probe.tolerances import tolerance_for
from probe.untrusted import read_json
from probe.vocabulary import BACKWARD, ERR_TOLERANCE, FORWARD, PASS, PERCENT_COLUMNS, STATISTICS, TENSOR_METRICS, columns_for  # noqa: F401  (report reads PERCENT_COLUMNS here)


@dataclass
class Side:
    json_path: str
    meta: DumpMeta
    rows: list
    mode: str
    modules: dict = field(default_factory=dict)     # entry -> module label (construct.json)

    @property
    def data_dir(self) -> str:
        return os.path.join(os.path.dirname(os.path.abspath(self.json_path)), "dump_tensor_data")


@dataclass
class CompareResult:
    mode: str
    columns: dict                      # column name -> one value per row: a list, or a float64
                                       # array for the statistics and their differences (NaN: empty)
    notes: list = field(default_factory=list)
    npu: Side | None = None
    bench: Side | None = None
    stack_mode: bool = False
    stack_path: str | None = None
    pairs: list = field(default_factory=list)
    matching: str = "exact"            # exact / fuzzy / aligned
    # (NPU rows, bench rows): per table row the Row its columns were read from (Table.A, Table.B),
    # so the diagnosis takes the statistics from the columns where the pairs still hold them
    table_rows: tuple | None = None
    # (NPU, bench) SideCodes of those rows: their kinds and shapes as the table coded them
    table_codes: tuple | None = None

    @property
    def n_rows(self) -> int:
        return len(self.columns["NPU Name"])


def read_sides(npu_json: str, bench_json: str) -> tuple[Side, Side]:
    """Both sides, one after the other, in this process: one compare is one process's
    work (a run's pairs are spread over processes, one per pair: see executor)."""
    return read_side(npu_json), read_side(bench_json)


def read_side(path: str) -> Side:
    with gc_paused():
        return _read_side(path)


def _read_side(path: str) -> Side:
    meta = DumpMeta(path)
    rows: list[Row] = []
    store = array("d")                 # the side's statistics (Row.stats)
    try:
        for name, entry in read_dump(path, meta, typed=True,
                                     bulk=lambda entries: side_rows(entries, rows, store)):
            rows.extend(flatten(name, entry, store))       # (a file msgspec could not read whole)
    except DumpError as exc:
        if str(exc).startswith("entry "):       # (flatten's: the entry and the field, not the file)
            raise DumpError(f"{path}: {exc}") from None
        raise
    # only tensor rows hold a data_name or an md5 (in C: two passes over 300k rows, not three in Python)
    if any(map(_DATA_NAME, rows)):
        mode = "tensor"
    elif any(map(_MD5, rows)):
        mode = "md5"
    else:
        mode = "statistics"
    return Side(path, meta, rows, mode)


_DATA_NAME, _MD5 = attrgetter("data_name"), attrgetter("md5")
# what Table.of and the judges read of each row (its statistics by store and k)
_ROW_FIELDS = ("name", "entry", "kind", "dtype", "shape", "requires_grad", "unread", "store", "k")
_VALUE = attrgetter("value")


def choose_mode(npu: Side, bench: Side, notes: list) -> str:
    if npu.mode == bench.mode:
        return npu.mode
    if "md5" in (npu.mode, bench.mode) and "tensor" not in (npu.mode, bench.mode):
        notes.append(f"NPU dump is {npu.mode}, bench is {bench.mode}: compared statistics "
                     f"(md5 needs both sides hashed)")
    else:
        notes.append(f"mixed modes (NPU {npu.mode}, bench {bench.mode}): fell back to "
                     f"statistics mode, comparing the summaries both dumps hold")
    return "statistics"


def _explain_meta(npu: DumpMeta, bench: DumpMeta, notes: list):
    for key in ("task", "level", "framework"):
        a, b = getattr(npu, key), getattr(bench, key)
        if a and b and a != b:
            notes.append(f"{key} differs: NPU {a!r} vs bench {b!r}; rows that exist on one side "
                         f"only are listed unmatched")
    for meta in (npu, bench):
        notes.extend(meta.problems)


# ---------------------------------------------------------------- tensor loading

def _metrics_batch(jobs):
    """Worker: load each pair's files and compute metrics (or the load error)."""
    out = []
    for idx, npu_path, bench_path, rtol, floor, exact in jobs:
        try:
            a = load(npu_path)
        except FileNotFoundError:
            out.append((idx, "NPU tensor file missing: " + os.path.basename(npu_path)))
            continue
        except DumpError as exc:   # refused (a FIFO, a pickle, strings): marks its row, not the whole compare
            out.append((idx, f"NPU tensor file unreadable: {exc}"))
            continue
        except Exception as exc:
            out.append((idx, f"NPU tensor file unreadable ({type(exc).__name__}: {exc})"))
            continue
        try:
            b = load(bench_path)
        except FileNotFoundError:
            out.append((idx, "bench tensor file missing: " + os.path.basename(bench_path)))
            continue
        except DumpError as exc:
            out.append((idx, f"bench tensor file unreadable: {exc}"))
            continue
        except Exception as exc:
            out.append((idx, f"bench tensor file unreadable ({type(exc).__name__}: {exc})"))
            continue
        if a.shape != b.shape:
            out.append((idx, f"tensor file shapes differ: NPU {list(a.shape)} vs bench {list(b.shape)}"))
            continue
        out.append((idx, tensor_metrics(a, b, rtol, floor, exact)))
    return out


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _run_jobs(jobs, workers: int | None, progress: bool):
    """Run metric jobs in-process, on a thread pool when there is enough data.

    Threads, not processes: loading (file reads) and the metrics (numpy loops over
    cache-sized chunks) release the GIL for most of their time, and a thread pool starts
    at once where a process pool spent ~0.5 s importing before its first result.
    """
    from tqdm import tqdm
    sizes = [_file_size(j[1]) + _file_size(j[2]) for j in jobs]
    workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
    bar = tqdm(total=sum(sizes), unit="B", unit_scale=True, desc="compare tensors", delay=2.0,
               disable=None if progress else True, file=sys.stderr)   # (None: on a terminal only)
    results = {}
    try:
        if workers <= 1 or sum(sizes) < (16 << 20) or len(jobs) < 2:
            for job, size in zip(jobs, sizes):
                for idx, res in _metrics_batch([job]):
                    results[idx] = res
                bar.update(size)
            return results
        from concurrent.futures import ThreadPoolExecutor, as_completed
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_metrics_batch, [job]): size for job, size in zip(jobs, sizes)}
            for fut in as_completed(futures):
                for idx, res in fut.result():
                    results[idx] = res
                bar.update(futures[fut])
        return results
    finally:
        bar.close()


# ---------------------------------------------------------------- the compare

def compare_dumps(npu_json: str, bench_json: str, stack_json: str | None = None,
                  stack_mode: bool = False, fuzzy_match: bool = False,
                  workers: int | None = None, progress: bool = True,
                  align: bool | None = None, stage=None) -> CompareResult:
    """Read both dumps, pair rows (exact / fuzzy / aligned), compute metrics and verdicts.
    ``stage``: called with "pairing" and "metrics" as those stages start (progress bars)."""
    with gc_paused():
        return _compare_dumps(npu_json, bench_json, stack_json, stack_mode, fuzzy_match,
                              workers, progress, align, stage or (lambda name: None))


def _compare_dumps(npu_json, bench_json, stack_json, stack_mode, fuzzy_match, workers,
                   progress, align, stage) -> CompareResult:
    """read -> pair -> judge, each stage once; the diagnosis and the writers read the table."""
    npu, bench = read_sides(npu_json, bench_json)
    stage("pairing")
    notes: list[str] = []
    mode = _mode_of(npu, bench, notes)
    pairs, matching = _pair(npu, bench, fuzzy_match, align, notes)
    stage("metrics")
    table = Table.of(pairs, mode, stack_mode)
    JUDGES[mode](table, _screen(table), _TensorFiles(npu.data_dir, bench.data_dir, workers, progress))
    table.close()
    if stack_mode:
        _stack_column(table, pairs, stack_json)
    return CompareResult(mode, table.cols, notes, npu, bench, stack_mode, stack_json, pairs, matching,
                         (table.A, table.B), table.codes)


def _mode_of(npu: Side, bench: Side, notes: list) -> str:
    _explain_meta(npu.meta, bench.meta, notes)
    return choose_mode(npu, bench, notes)


def _pair(npu: Side, bench: Side, fuzzy_match: bool, align, notes: list) -> tuple[list, str]:
    npu.modules, bench.modules = load_modules(npu.json_path), load_modules(bench.json_path)
    pairs, matching = pair_rows(npu.rows, bench.rows, fuzzy=fuzzy_match, align=align,
                                npu_modules=npu.modules, bench_modules=bench.modules, notes=notes)
    if matching == "aligned":
        notes.append("the call sequences differ: calls aligned by signature and statistics "
                     "(see the Match column) instead of by name")
    return pairs, matching


@dataclass
class Table:
    """The compare's table, a column at a time: ``cols`` (output column -> one value per
    row, a list or, for the statistics and their differences, a float64 array with NaN
    for an empty cell: what the workbook, the CSV, the page and the summary json read), the paired rows
    (``A`` the NPU side's, ``B`` the bench side's, None where unpaired), the statistics of
    the rows both sides hold as numpy arrays (``stat_sel`` rows x ``vocabulary.STATISTICS``)
    and each row's findings so far."""
    mode: str
    A: list
    B: list
    cols: dict
    stat_sel: np.ndarray             # rows both sides hold a summary of (int64)
    npu_st: np.ndarray
    bench_st: np.ndarray
    verdicts: dict = field(default_factory=dict)   # rows with several findings
    # rows with one finding so far: its level and its Err_message text (most rows with
    # anything to say have one: two lists, not a Verdict or a dict entry each)
    levels: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    kinds: tuple = ((), ())          # per side, each row's kind (None: no row)
    fields: tuple = ({}, {})         # per side, field name -> each row's (rows.fields_of)
    tol_run: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))     # per row, its tolerance class's code
    tol_classes: list = field(default_factory=list)     # the names of those codes
    present: tuple = ((), ())        # per side, a bool array: the row is there
    codes: tuple = ()                # per side, its kinds and dtypes as codes (SideCodes)

    @classmethod
    def of(cls, pairs: list, mode: str, stack_mode: bool) -> Table:
        """The descriptive columns of the paired rows (names, dtypes, shapes, statistics),
        each side's fields read from its rows in one C pass (``fields_of``), the shape texts,
        tolerance classes and directions worked out once per distinct value (the kinds and
        dtypes coded once per side: ``SideCodes``)."""
        n = len(pairs)
        cols: dict = dict.fromkeys(columns_for(mode, stack_mode))   # in order; filled below
        A, B, match = fields_of(pairs, ("npu", "bench", "align"))
        shape_text = _Memo(lambda s: None if s is None else str(list(s)))
        per_side, side_codes = {}, {}
        summaries = {}               # side -> STATISTICS x rows, NaN where a row has none
        for side, rows in (("NPU", A), ("Bench", B)):
            f = per_side[side] = dict(zip(_ROW_FIELDS, fields_of(rows, _ROW_FIELDS)))
            summaries[side] = np.ascontiguousarray(stats_in(f.pop("store"), f.pop("k")).T)
            cols[f"{side} Name"] = f["name"]
            cols[f"{side} Dtype"] = f["dtype"]
            c = side_codes[side] = SideCodes.of(f)
            # (a "none" row, and only one, has no shape: rows.py makes it so); the shapes
            # are shared tuples (rows.py): their texts made once per object
            cols[f"{side} Tensor Shape"] = _take([shape_text[v] for v in c.shapes], c.shape)
            cols[f"{side} Requires_grad"] = f["requires_grad"]
        fa, fb = per_side["NPU"], per_side["Bench"]
        ca, cb = side_codes["NPU"], side_codes["Bench"]
        has_a, has_b = ca.present, cb.present
        entries = fa["entry"]
        if not has_a.all():                              # bench-only rows: their entry
            entries = [a if a is not None else b for a, b in zip(entries, fb["entry"])]
        cols["Direction"] = _directions(entries)
        del entries
        cols["Match"] = match
        if mode == "tensor":
            cols["Data_name"] = [str([r.data_name if r and r.data_name else "-1" for r in ab])
                                 for ab in zip(A, B)]
        sel = np.flatnonzero(ca.has_data & cb.has_data)
        for side in per_side:
            if mode != "md5":        # md5 mode shows its hashes instead
                for s, column in zip(STATISTICS, summaries[side]):
                    cols[f"{side} {s.column}"] = column
        npu_st, bench_st = summaries["NPU"].T[sel], summaries["Bench"].T[sel]
        for c, col in cols.items():
            if col is None:        # filled by the judges (or empty in this mode)
                cols[c] = np.full(n, np.nan) if c == ERR_TOLERANCE else [None] * n
        run, classes = _running_tolerance(ca, cb)
        table = cls(mode, A, B, cols, sel, npu_st, bench_st,
                    levels=[None] * n, messages=[None] * n, tol_run=run, tol_classes=classes)
        table.kinds = (fa["kind"], fb["kind"])
        table.present = (has_a, has_b)
        table.fields = (fa, fb)
        table.codes = (ca, cb)
        table._requires_grad()
        return table

    def tol_name(self, i: int):
        """Row ``i``'s tolerance class (None: no float tensor yet)."""
        return self.tol_classes[self.tol_run[i]]

    def _requires_grad(self):
        rg_n, rg_b = self.cols["NPU Requires_grad"], self.cols["Bench Requires_grad"]
        consistent = list(map(eq, rg_n, rg_b))
        for i in np.flatnonzero(~(self.present[0] & self.present[1])).tolist():
            consistent[i] = None                         # a one-sided row
        self.cols["Requires_grad Consistent"] = consistent
        if not consistent.count(False):                  # (counts False and what equals it: none, the usual case)
            return
        for i in np.flatnonzero(np.fromiter(map(is_, consistent, repeat(False)), bool, len(consistent))).tolist():
            self.verdict(i).add("warning", f"requires_grad differs: NPU {rg_n[i]}, bench {rg_b[i]}")

    def verdict(self, i: int) -> vd.Verdict:
        v = self.verdicts.get(i)
        if v is None:
            v = self.verdicts[i] = vd.Verdict()
            if self.levels[i] is not None:          # its one finding so far, as Verdict.add has it
                v.level, v.messages = self.levels[i], [self.messages[i]]
                self.levels[i] = self.messages[i] = None
        return v

    def find(self, i: int, level: str, text: str):
        """A finding on row ``i``; the usual one-finding row needs no Verdict object."""
        self.find_many((i,), level, (text,))

    def find_many(self, rows: Sequence[int], level: str, texts: Iterable[str], headed: bool = False):
        """``find`` of one level on many rows (the statistics judge's hundreds of thousands):
        rows with no finding yet get theirs at once (stored in C where none of ``rows``
        has one yet, the usual case). ``texts``: one per row, read one at a time (a
        generator need not hold them all); ``headed``: each begins with the level's head
        (``"warning: "``), as a row's one finding is stored (one text made per row, not two)."""
        have, messages, verdicts = self.levels, self.messages, self.verdicts
        head = f"{level}: " if level != PASS else ""
        if not any(map(have.__getitem__, rows)) and (not verdicts or not any(map(verdicts.__contains__, rows))):
            deque(map(have.__setitem__, rows, repeat(level)), 0)
            deque(map(messages.__setitem__, rows, texts if headed else map(head.__add__, texts)), 0)
            return
        for i, text in zip(rows, texts):
            if headed:
                text = text[len(head):]
            if have[i] is None and i not in verdicts:
                have[i], messages[i] = level, head + text
            else:
                self.verdict(i).add(level, text)

    def close(self):
        """The one-sided rows' findings, then the Result and Err_message columns."""
        _one_sided(self)
        levels, which = codes(self.levels)           # (None and the three levels: coded in C)
        result = _take([level or PASS for level in levels], which)
        message, self.levels, self.messages = self.messages, [], []
        for i, v in self.verdicts.items():
            result[i], message[i] = v.level, v.text()
        # the texts are made row by row, so equal ones are separate objects: one each
        # (the 100k-entry pair's 270k messages hold 10k texts: 31 MB less at the peak)
        texts, which = codes(message)
        self.cols["Result"] = result
        self.cols["Err_message"] = _take(["" if t is None else t for t in texts], which)


def _one_sided(t: Table):
    """Rows with one side missing or None (a few: found with numpy, then one by one)."""
    (has_a, has_b), (ca, cb) = t.present, t.codes
    for i in np.flatnonzero(~(has_a & has_b) | (ca.has_data != cb.has_data)).tolist():
        a, b = t.A[i], t.B[i]
        if a is None:
            t.verdict(i).add("warning", "no NPU row matched this bench row")
        elif b is None:
            t.verdict(i).add("warning", "no bench row matched this NPU row")
        elif a.kind == "none":
            if b.kind != "none":
                t.verdict(i).add("error", f"NPU is None, bench is a {b.kind}")
        elif b.kind == "none":
            t.verdict(i).add("error", f"bench is None, NPU is a {a.kind}")


@dataclass
class Screened:
    """What the judges get: rows whose kinds, dtypes and shapes agree (``js``: their
    places in ``Table.stat_sel``; ``how``: per such row its index into ``hows``, the
    (exact, tolerance, Tolerance Dtype text) of its dtypes and tolerance class;
    ``exact``: per such row, judged exactly), and the rows that are plain arguments
    (judged by equality here)."""
    js: np.ndarray
    how: np.ndarray
    hows: list
    exact: np.ndarray
    values: list
    rows_i: np.ndarray              # per such row, its index among the table's rows

    @property
    def rows(self) -> list:
        """(j, i, (exact, tolerance, Tolerance Dtype text)) per row: what the md5 and
        tensor judges walk one by one (i indexing the table's rows)."""
        return list(zip(self.js.tolist(), self.rows_i.tolist(), map(self.hows.__getitem__, self.how.tolist())))


def _screen(t: Table) -> Screened:
    """The checks every mode makes first: kinds, argument values, dtypes, shapes. The
    agreeing rows (almost all) are found with numpy over each side's codes, the dtype
    pairs judged once per distinct (NPU dtype, bench dtype, tolerance class); the few rows
    with something to say are worded one by one."""
    sel, A, B = t.stat_sel, t.A, t.B
    (ca, cb), (fa, fb) = t.codes, t.fields
    ka, kb = ca.kind[sel], cb.kind[sel]
    differ = ka != kb
    for i in sel[differ].tolist():
        t.verdict(i).add("error", f"NPU is a {A[i].kind}, bench is a {B[i].kind}")
    is_value = ~differ & (ka == _KIND_CODE["value"])
    values = sel[is_value].tolist()
    if values:
        va = list(map(_VALUE, map(A.__getitem__, values)))
        vb = list(map(_VALUE, map(B.__getitem__, values)))
        for i, x, y in compress(zip(values, va, vb), map(ne, va, vb)):
            if not (_isnan(x) and _isnan(y)):
                t.verdict(i).add("error", f"argument differs: NPU {x!r}, bench {y!r}")
    js = np.flatnonzero(~differ & ~is_value)
    it = sel[js]
    # per (NPU dtype, bench dtype, tolerance class): None if not comparable, else
    # (exact, tolerance, Tolerance Dtype text) -- a few distinct keys for 100ks of rows
    nb, nc = max(len(cb.dtypes), 1), max(len(t.tol_classes), 1)
    key = (ca.dtype[it].astype(np.int64) * nb + cb.dtype[it]) * nc + t.tol_run[it]
    uniq, how = _dense_codes(key, len(ca.dtypes) * nb * nc)
    hows = [_dtype_judgement((ca.dtypes[k // (nb * nc)], cb.dtypes[k // nc % nb], t.tol_classes[k % nc]))
            for k in uniq.tolist()]
    ok = np.array([h is not None for h in hows] or [True])[how]
    for i in it[~ok].tolist():
        t.verdict(i).add("error", f"dtypes not comparable: NPU {A[i].dtype}, bench {B[i].dtype}")
    # the shapes are shared tuples (rows.py): the same object is the same shape; the
    # others compared by value
    same = np.fromiter(map(is_, fa["shape"], fb["shape"]), bool, len(A))[it]
    for k in np.flatnonzero(ok & ~same).tolist():
        i = int(it[k])
        if A[i].shape != B[i].shape:
            t.verdict(i).add("error", f"shape differs: NPU {list(A[i].shape)}, bench {list(B[i].shape)}")
            ok[k] = False
    if fa["unread"].count(True) or fb["unread"].count(True):
        unread = (np.fromiter(map(truth, fa["unread"]), bool, len(A))
                  | np.fromiter(map(truth, fb["unread"]), bool, len(B)))[it] & ok
        for i in it[unread].tolist():     # torch.empty's contents, an out= buffer, a handle's address
            t.verdict(i).add("pass", "no data to compare: an uninitialised buffer (torch.empty, out=) or a handle")
        ok &= ~unread
    js, it, how = js[ok], it[ok], how[ok]
    texts = [h[2] if h is not None else None for h in hows]
    code = np.full(len(A), len(texts), np.int64)
    code[it] = how
    t.cols["Tolerance Dtype"] = list(map((texts + [None]).__getitem__, code.tolist()))
    exact = np.array([h is not None and h[2] == "exact" for h in hows] or [False])[how]
    return Screened(js, how, hows, exact, values, it)


def _dense_codes(key: np.ndarray, size: int) -> tuple:
    """(the distinct values of ``key`` in order, per element its index among them):
    ``np.unique(key, return_inverse=True)``, by a table of ``size`` (the values' range,
    a few hundred here) where that is small."""
    if size > (1 << 20):
        uniq, inv = np.unique(key, return_inverse=True)
        return uniq, inv.reshape(-1)
    seen = np.zeros(size, bool)
    seen[key] = True
    uniq = np.flatnonzero(seen)
    lut = np.zeros(size, np.int64)
    lut[uniq] = np.arange(len(uniq))
    return uniq, lut[key]


@dataclass
class _TensorFiles:
    """Where tensor mode finds its files and how it loads them."""
    npu_dir: str
    bench_dir: str
    workers: int | None
    progress: bool


# ---------------------------------------------------------------- the judges, one per mode

def judge_statistics(t: Table, screened: Screened, files: _TensorFiles):
    """Statistics mode: the difference columns, and each row judged by its statistics."""
    diff, rel = stat_diffs(t.npu_st, t.bench_st)
    n = len(t.A)
    for k, s in enumerate(STATISTICS):
        t.cols[s.diff] = _scatter(n, t.stat_sel, diff[:, k])
        t.cols[s.relative] = _scatter(n, t.stat_sel, rel[:, k])
    _judge_by_statistics(t, screened.js, screened.exact)


def judge_md5(t: Table, screened: Screened, files: _TensorFiles):
    """md5 mode: equal hashes pass; hashes that must differ (across dtypes, downstream of
    lower precision) are judged by the statistics the md5 dump also holds."""
    stat_rows, exact = [], []
    npu_md5, bench_md5 = t.cols["NPU MD5"], t.cols["BENCH MD5"]
    for j, i, how in screened.rows:
        a, b = t.A[i], t.B[i]
        npu_md5[i], bench_md5[i] = a.md5, b.md5
        if a.md5 == b.md5:
            continue
        tol_name = t.tol_name(i)
        if a.dtype == b.dtype and tol_name == vd.dtype_class(a.dtype):
            t.verdict(i).add("error", f"CRC32 differs ({a.md5} vs {b.md5}) with the same dtype")
            continue
        why = (f"across dtypes ({a.dtype} vs {b.dtype})" if a.dtype != b.dtype
               else f"downstream of {tol_name} computation")
        t.verdict(i).add("pass", f"CRC32 differs, as it must {why}; judged by the statistics "
                                 f"the md5 dump also holds")
        stat_rows.append(j)
        exact.append(how[2] == "exact")
    _judge_by_statistics(t, np.array(stat_rows, np.int64), np.array(exact, bool))


def judge_tensor(t: Table, screened: Screened, files: _TensorFiles):
    """Tensor mode: each pair's files loaded (lazily, on threads when there is enough
    data) and judged by their metrics; arguments have none."""
    for i in screened.values:
        for c in TENSOR_METRICS:
            t.cols[c][i] = "unsupported"
    jobs = []
    for _j, i, (exact, tol, _text) in screened.rows:
        a, b = t.A[i], t.B[i]
        if not a.data_name or not b.data_name:
            side = "NPU" if not a.data_name else "bench"
            t.verdict(i).add("warning", f"{side} has no tensor file for this row (data_name missing)")
            continue
        try:
            pa = resolve(files.npu_dir, a.data_name)
            pb = resolve(files.bench_dir, b.data_name)
        except ValueError as exc:
            t.verdict(i).add("error", str(exc))
            continue
        jobs.append((i, pa, pb, tol.rtol, tol.floor, exact))
    if not jobs:
        return
    results = _run_jobs(jobs, files.workers, files.progress)
    for i, *_rest in jobs:
        res = results.get(i)
        if isinstance(res, str):
            t.verdict(i).add("warning" if "missing" in res else "error", res)
            continue
        _tensor_row(t.cols, i, res, t.verdict(i), t.tol_name(i), _rest[-1])


JUDGES = {"statistics": judge_statistics, "md5": judge_md5, "tensor": judge_tensor}


def _judge_by_statistics(t: Table, sel: np.ndarray, exact: np.ndarray):
    """Rows (``sel``: places in ``t.stat_sel``; ``exact``: per row, its dtypes are
    compared exactly) judged by their statistics, vectorised; rows with NaN/Inf or exact
    dtypes one by one."""
    if not len(sel):
        return
    ri = t.stat_sel[sel]
    # per row its tolerance class's code: the tolerances are looked up per class (a few)
    run = t.tol_run[ri]
    present = np.flatnonzero(np.bincount(run, minlength=len(t.tol_classes)))
    classes = [t.tol_classes[k] for k in present.tolist()]
    lut = np.zeros(len(t.tol_classes), np.int8)
    lut[present] = np.arange(len(present))
    cls = lut[run]
    del run
    tol_of = [vd.TOLERANCES.get(name) or vd.TOLERANCES["float32"] for name in classes]
    numel = t.codes[1].numel(ri)          # the bench side's, as the metrics take it
    ns, bs = t.npu_st[sel], t.bench_st[sel]
    ratio = stat_tolerance_ratio(ns, bs, numel, np.array([x.rtol for x in tol_of])[cls],
                                 np.array([x.floor for x in tol_of])[cls])
    common = np.isfinite(ns).all(axis=1) & np.isfinite(bs).all(axis=1) & ~exact     # kept cheap
    t.cols[ERR_TOLERANCE][ri[common]] = ratio[common]
    # vd.ratio_finding(r, tol, "statistics off by") of each row beyond its tolerance, made
    # per tolerance class and level (a few) with the text's constant ends joined once; each
    # text made once with its level's head, as find_many stores it (an unheaded text and a
    # headed one per row were the compare's peak memory: ~40 MB on the 100k-entry pairs)
    hit = common & (ratio > 1.0)
    for c, tol in enumerate(tol_of):
        mine = cls == c
        for level, tail, how_far in zip(("warning", "error"), vd.ratio_tails(tol, "statistics off by"),
                                        (ratio <= vd.ERROR_FACTOR, ratio > vd.ERROR_FACTOR)):
            ks = np.flatnonzero(hit & mine & how_far)
            if len(ks):
                # (the texts, kept, made before the rows' int objects, freed after: the ints'
                # memory is then not pinned by the texts, and goes back to the system)
                texts = _g3_texts(f"{level}: statistics off by ", ratio[ks], tail)
                t.find_many(ri[ks].tolist(), level, texts, headed=True)
                del texts
    for k in np.flatnonzero(~common).tolist():
        _judge_uncommon(t, int(ri[k]), ns[k], bs[k], float(ratio[k]), bool(exact[k]), tol_of[cls[k]])


def _g3_texts(head: str, numbers: np.ndarray, tail: str) -> list:
    """``head + format(x, ".3g") + tail`` for each of ``numbers`` (float64): the statistics
    judge's findings, one text made per row (in C; else by printf's %.3g, which is
    format's .3g and a third faster)."""
    if _cflat is not None:
        return _cflat.g3_texts(head, np.ascontiguousarray(numbers, np.float64), tail)
    return list(map((head.replace("%", "%%") + "%.3g" + tail.replace("%", "%%")).__mod__, numbers.tolist()))


def _judge_uncommon(t: Table, i: int, ns: np.ndarray, bs: np.ndarray, r: float, exact: bool, tol):
    """A row with NaN/Inf statistics or an exact dtype."""
    missing = np.isnan(ns) & np.isnan(bs)             # not dumped (e.g. ints' Mean)
    bad_n, bad_b = ~np.isfinite(ns) & ~missing, ~np.isfinite(bs) & ~missing
    if bad_n.any() or bad_b.any():
        if (bad_n == bad_b).all() and np.array_equal(ns[bad_n], bs[bad_b], equal_nan=True):
            t.verdict(i).add("warning", "NaN/Inf in the statistics of both sides (overflow on both)")
        else:
            t.verdict(i).add("error", f"NaN/Inf differ: NPU {_fmt_stats(ns)}, bench {_fmt_stats(bs)}")
        return
    if exact and r > 0:
        t.verdict(i).add("error", "integer/bool statistics differ (exact dtype)")
        r = math.inf
    t.cols[ERR_TOLERANCE][i] = r
    if not exact:
        vd.judge_ratio(t.verdict(i), r, tol, "statistics off by")


def _stack_column(t: Table, pairs: list, stack_json: str | None):
    """Each NPU entry's stack, on its first row."""
    stacks = load_stacks(stack_json) if stack_json else {}
    col, seen = t.cols["NPU_Stack_Info"], set()
    for i, p in enumerate(pairs):
        if p.npu and p.npu.entry not in seen:
            seen.add(p.npu.entry)
            col[i] = stacks.get(p.npu.entry)


class _Memo(dict):
    """``memo[key]`` is ``fn(key)``, computed once per distinct key."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __missing__(self, key):
        value = self[key] = self.fn(key)
        return value


def _dtype_judgement(key):
    """(exact, tolerance, Tolerance Dtype text) of a row pair, or None if not comparable."""
    npu_dtype, bench_dtype, tol_name = key
    if not vd.comparable(npu_dtype, bench_dtype):
        return None
    exact = vd.dtype_class(npu_dtype) == "exact"
    tol = tolerance_for(tol_name)
    return exact, tol, "exact" if exact else tol.name


def _scatter(n: int, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A float column of ``n`` cells holding ``values`` at rows ``idx``, NaN (an empty
    cell) elsewhere."""
    col = np.full(n, np.nan)
    col[idx] = values
    return col


def _running_tolerance(side_a: SideCodes, side_b: SideCodes) -> tuple:
    """Per row, the coarsest float class of its tensors and of all tensors before it
    (each side's rank worked out once per distinct dtype): (per row a code, the class
    name of each code; None: no float tensor yet)."""
    none = len(vd.RANK)
    names = [k for k, _ in sorted(vd.RANK.items(), key=lambda kv: kv[1])] + [None]
    if not len(side_a.kind):
        return np.zeros(0, np.int8), names
    ranks = []
    for side in (side_a, side_b):
        lut = np.array([vd.RANK.get(vd.dtype_class(d) or "", none) for d in side.dtypes] or [none], np.int64)
        ranks.append(np.where(side.kind == _KIND_CODE["tensor"], lut[side.dtype], none))
    return np.minimum.accumulate(np.minimum(*ranks)).astype(np.int8), names


_KIND_CODE = {None: 0, "none": 1, "tensor": 2, "value": 3}     # another kind: the next code


@dataclass
class SideCodes:
    """One side's kinds and dtypes as codes, each coded once per side: what the presence,
    the tolerance classes and the screen read of every row."""
    kind: np.ndarray         # per row, its kind's _KIND_CODE (0: no row)
    dtype: np.ndarray        # per row, its dtype's index in ``dtypes``
    dtypes: list             # the side's distinct dtypes (None among them)
    shape: np.ndarray        # per row, its shape's index in ``shapes``
    shapes: list             # the side's distinct shape objects (rows.py shares one per shape)

    @classmethod
    def of(cls, f: dict) -> SideCodes:
        kinds, kind = codes(f["kind"])
        lut = np.array([_KIND_CODE.setdefault(k, len(_KIND_CODE)) for k in kinds] or [0], np.int16)
        dtypes, dtype = codes(f["dtype"])
        shapes, shape = object_codes(f["shape"])
        return cls(lut[kind], dtype, dtypes, shape, shapes)

    def numel(self, rows: np.ndarray) -> np.ndarray:
        """``numel_array`` of these rows' shapes (worked out once per distinct shape)."""
        return numel_array(self.shapes)[self.shape[rows]]

    @property
    def present(self) -> np.ndarray:
        """Per row: the side has it."""
        return self.kind != _KIND_CODE[None]

    @property
    def tensor(self) -> np.ndarray:
        """Per row: the side has it and it is a tensor."""
        return self.kind == _KIND_CODE["tensor"]

    @property
    def has_data(self) -> np.ndarray:
        """Per row: the side has it and it is not None (a tensor or an argument)."""
        return self.kind > _KIND_CODE["none"]


def _directions(entries: list) -> list:
    """``direction`` of each row's entry, worked out once per API and direction: an API
    call's entry ``{base}.{N}.{forward|backward}`` has the direction of ``{base}.0.{...}``
    whatever its counter (vocabulary's grammar reads the counter's digits as a number
    only), so 100k entries take a few hundred parses, not 100k. The rows of an entry share
    its name: coded (``codes``) and keyed (``_api_keys``) once per entry, in C."""
    distinct, which = codes(entries)
    of_key = _Memo(direction)
    return _take(list(map(of_key.__getitem__, _api_keys(distinct))), which)


def _take(values: list, which: np.ndarray) -> list:
    """``[values[k] for k in which]``, taken by numpy (no int object per row); ``values``:
    texts or None (numpy would spread a sequence over the cells)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out[which].tolist()


def _api_keys(entries: list) -> list:
    """Per entry, ``{base}.0.{forward|backward}`` for an API call's ``{base}.{N}.{...}``
    (N: ASCII digits, base not empty), else the entry itself."""
    if _cflat is not None:
        return _cflat.api_keys(entries, FORWARD, BACKWARD)
    keys = []
    for entry in entries:
        if type(entry) is str:
            head, dot, last = entry.rpartition(".")
            if last == FORWARD or last == BACKWARD:
                base, dot, index = head.rpartition(".")
                if base and index.isdigit() and index.isascii():
                    keys.append(f"{base}.0.{last}")
                    continue
        keys.append(entry)
    return keys


try:
    from . import _cflat
except ImportError:         # built without a C compiler: the same keys, in Python
    _cflat = None           # type: ignore[assignment]


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _fmt_stats(s) -> str:
    return "[" + ", ".join(f"{x:g}" for x in s) + "]"


def _tensor_row(cols, i, m: TensorMetrics, v: vd.Verdict, tol_name, exact: bool):
    cols["Cosine"][i] = m.cosine
    cols["EucDist"][i] = m.euc_dist
    cols["MaxAbsErr"][i] = m.max_abs
    cols["MaxRelativeErr"][i] = m.max_rel
    cols["One Thousandth Err Ratio"][i] = m.one_thousandth
    cols["Five Thousandths Err Ratio"][i] = m.five_thousandths
    cols[ERR_TOLERANCE][i] = m.tol_ratio
    for note in m.notes:
        v.add("pass", note)
    if m.nonfinite_mismatch:
        v.add("error", f"NaN/Inf at different positions: {m.nonfinite_mismatch} of {m.numel} elements")
    elif m.nonfinite_same:
        v.add("warning", f"NaN/Inf at the same {m.nonfinite_same} positions on both sides; "
                         f"metrics over the finite rest")
    if exact:
        if m.exact_mismatch:
            v.add("error", f"{m.exact_mismatch} of {m.numel} elements differ (exact dtype)")
        return
    tol = tolerance_for(tol_name)
    vd.judge_cosine(v, m.cosine, tol)
    vd.judge_elements(v, m.tol_ratio, m.beyond, m.gross, tol)


def load_stacks(path: str) -> dict:
    """entry name -> stack text; reads msprobe's grouped and older per-name layouts.
    {} without the file; DumpError (one line: the file, the key, what is wrong) for one
    that is not such a mapping."""
    try:
        data = read_json(path, "stack.json")
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise DumpError(f"{path}: stack.json must be an object (stack id or entry name -> frames), "
                        f"got {type(data).__name__}")
    out: dict = {}
    for key, value in data.items():
        if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
                and isinstance(value[1], list)):
            text = _frames(path, key, value[1])
            for name in value[0]:
                if not isinstance(name, str):
                    raise DumpError(f"{path}: stack.json key {key!r}: entry names must be strings, "
                                    f"got {type(name).__name__}")
                out[name] = text
        elif isinstance(value, list):
            out[key] = _frames(path, key, value)
        elif isinstance(value, str):
            out[key] = value
        else:
            raise DumpError(f"{path}: stack.json key {key!r}: expected [[entry names], [frames]], "
                            f"a list of frames or a text, got {type(value).__name__}")
    return out


def _frames(path: str, key: str, frames: list) -> str:
    """A stack's frames (texts) as one text; DumpError for a frame that is not text."""
    for frame in frames:
        if type(frame) is not str:
            raise DumpError(f"{path}: stack.json key {key!r}: a frame must be a text, got {type(frame).__name__}")
    return "\n".join(frames)
