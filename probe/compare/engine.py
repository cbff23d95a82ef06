"""One compare: an NPU dump.json and a bench dump.json -> a table of judged rows.

Stages: read + flatten each side (reader, rows) -> pair (match) -> metrics (metrics;
tensor files loaded lazily, in worker processes when there is enough data) -> verdict.
The result is column-oriented (name -> list) so the report writes it without copying.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from . import verdict as vd
from .construct import load_modules
from .match import Pair, pair_rows
from .metrics import TensorMetrics, stat_diffs, stat_tolerance_ratio, tensor_metrics
from .reader import DumpMeta, read_dump
from .rows import Row, direction, flatten
from .tensors import load, resolve

BASE = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
        "Bench Tensor Shape", "NPU Requires_grad", "Bench Requires_grad"]
STATS = ["NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min",
         "Bench mean", "Bench l2norm"]
TENSOR_METRICS = ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr",
                  "One Thousandth Err Ratio", "Five Thousandths Err Ratio"]
STAT_DIFFS = ["Max diff", "Min diff", "Mean diff", "L2norm diff",
              "MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr"]
TAIL = ["Requires_grad Consistent", "Result", "Err_message"]
EXTRAS = ["Direction", "Tolerance Dtype", "Err/Tolerance", "Match"]
PERCENT_COLUMNS = {"MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr"}


def columns_for(mode: str, stack_mode: bool) -> list[str]:
    """msprobe's columns for the mode, then ours."""
    stack = ["NPU_Stack_Info"] if stack_mode else []
    if mode == "tensor":
        return BASE + TENSOR_METRICS + STATS + TAIL + stack + ["Data_name"] + EXTRAS
    if mode == "md5":
        return BASE + ["NPU MD5", "BENCH MD5"] + TAIL + stack + EXTRAS
    return BASE + STAT_DIFFS + STATS + TAIL + stack + EXTRAS


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
    columns: dict                      # column name -> list of values (one per row)
    notes: list = field(default_factory=list)
    npu: Side | None = None
    bench: Side | None = None
    stack_mode: bool = False
    stack_path: str | None = None
    pairs: list = field(default_factory=list)
    matching: str = "exact"            # exact / fuzzy / aligned

    @property
    def n_rows(self) -> int:
        return len(self.columns["NPU Name"])


def read_side(path: str) -> Side:
    meta = DumpMeta(path)
    rows: list[Row] = []
    for name, entry in read_dump(path, meta):
        rows.extend(flatten(name, entry))
    tensors = [r for r in rows if r.kind == "tensor"]
    if tensors and any(r.data_name for r in tensors):
        mode = "tensor"
    elif tensors and any(r.md5 for r in tensors):
        mode = "md5"
    else:
        mode = "statistics"
    return Side(path, meta, rows, mode)


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


def _fmt_shape(row: Row | None):
    return "" if row is None or row.shape is None else str(list(row.shape))


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
        except Exception as exc:   # a damaged file marks its row, not the whole compare
            out.append((idx, f"NPU tensor file unreadable ({type(exc).__name__}: {exc})"))
            continue
        try:
            b = load(bench_path)
        except FileNotFoundError:
            out.append((idx, "bench tensor file missing: " + os.path.basename(bench_path)))
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
    """Run metric jobs in-process for small data, in a process pool for large."""
    from tqdm import tqdm
    total = sum(_file_size(j[1]) + _file_size(j[2]) for j in jobs)
    workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="compare tensors", delay=2.0,
               disable=not progress, file=sys.stderr)
    results = {}
    try:
        if workers <= 1 or total < (64 << 20) or len(jobs) < 4:
            for job in jobs:
                for idx, res in _metrics_batch([job]):
                    results[idx] = res
                bar.update(_file_size(job[1]) + _file_size(job[2]))
            return results
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        ctx = mp.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
        batches, cur, cur_bytes = [], [], 0
        target = max(8 << 20, total // (workers * 8))
        for job in jobs:
            size = _file_size(job[1]) + _file_size(job[2])
            cur.append(job)
            cur_bytes += size
            if cur_bytes >= target:
                batches.append((cur, cur_bytes))
                cur, cur_bytes = [], 0
        if cur:
            batches.append((cur, cur_bytes))
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(_metrics_batch, b): size for b, size in batches}
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
                  align: bool | None = None) -> CompareResult:
    """Read both dumps, pair rows (exact / fuzzy / aligned), compute metrics and verdicts."""
    npu = read_side(npu_json)
    bench = read_side(bench_json)
    notes: list[str] = []
    _explain_meta(npu.meta, bench.meta, notes)
    mode = choose_mode(npu, bench, notes)
    npu.modules, bench.modules = load_modules(npu_json), load_modules(bench_json)
    pairs, matching = pair_rows(npu.rows, bench.rows, fuzzy=fuzzy_match, align=align,
                                npu_modules=npu.modules, bench_modules=bench.modules, notes=notes)
    if matching == "aligned":
        notes.append("the call sequences differ: calls aligned by signature and statistics "
                     "(see the Match column) instead of by name")
    n = len(pairs)
    cols = {c: [None] * n for c in columns_for(mode, stack_mode)}
    verdicts = [vd.Verdict() for _ in range(n)]
    tol_names: list = [None] * n

    # --- descriptive columns and the per-row tolerance class (running coarsest dtype)
    running = None
    for i, p in enumerate(pairs):
        a, b = p.npu, p.bench
        cols["NPU Name"][i] = a.name if a else None
        cols["Bench Name"][i] = b.name if b else None
        cols["NPU Dtype"][i] = a.dtype if a else None
        cols["Bench Dtype"][i] = b.dtype if b else None
        cols["NPU Tensor Shape"][i] = _fmt_shape(a) if a and a.kind != "none" else None
        cols["Bench Tensor Shape"][i] = _fmt_shape(b) if b and b.kind != "none" else None
        cols["NPU Requires_grad"][i] = a.requires_grad if a else None
        cols["Bench Requires_grad"][i] = b.requires_grad if b else None
        cols["Direction"][i] = direction((a or b).entry)
        cols["Match"][i] = p.align
        if a and a.kind == "tensor":
            running = vd.coarser(running, vd.dtype_class(a.dtype))
        if b and b.kind == "tensor":
            running = vd.coarser(running, vd.dtype_class(b.dtype))
        tol_names[i] = running
        if a and b:
            rg = a.requires_grad == b.requires_grad
            cols["Requires_grad Consistent"][i] = rg
            if not rg:
                verdicts[i].add("warning", f"requires_grad differs: NPU {a.requires_grad}, "
                                           f"bench {b.requires_grad}")
        if mode == "tensor":
            names = [r.data_name if r and r.data_name else "-1" for r in (a, b)]
            cols["Data_name"][i] = str(names)

    # --- statistics columns (all modes carry them except md5's own columns)
    stat_idx = [i for i, p in enumerate(pairs) if p.npu and p.bench
                and p.npu.kind != "none" and p.bench.kind != "none"]
    npu_st = np.array([pairs[i].npu.stats for i in stat_idx], dtype=np.float64).reshape(-1, 4)
    bench_st = np.array([pairs[i].bench.stats for i in stat_idx], dtype=np.float64).reshape(-1, 4)
    if mode != "md5":
        for i, p in enumerate(pairs):
            for side, row in (("NPU", p.npu), ("Bench", p.bench)):
                if row is not None and row.kind != "none":
                    for k, c in enumerate(("max", "min", "mean", "l2norm")):
                        cols[f"{side} {c}"][i] = row.stats[k]
    if mode == "statistics":
        diff, rel = stat_diffs(npu_st, bench_st)
        for k, (dc, rc) in enumerate(zip(STAT_DIFFS[:4], STAT_DIFFS[4:])):
            dcol, rcol = cols[dc], cols[rc]
            for j, i in enumerate(stat_idx):
                dcol[i] = float(diff[j, k])
                rcol[i] = float(rel[j, k])

    # --- per-row judgement
    tensor_jobs = []
    stat_rows = []            # indices (into stat_idx) judged by statistics
    for j, i in enumerate(stat_idx):
        p = pairs[i]
        a, b, v = p.npu, p.bench, verdicts[i]
        if a.kind != b.kind:
            v.add("error", f"NPU is a {a.kind}, bench is a {b.kind}")
            continue
        if a.kind == "value":
            if a.value != b.value and not (_isnan(a.value) and _isnan(b.value)):
                v.add("error", f"argument differs: NPU {a.value!r}, bench {b.value!r}")
            if mode == "tensor":
                for c in TENSOR_METRICS:
                    cols[c][i] = "unsupported"
            continue
        if not vd.comparable(a.dtype, b.dtype):
            v.add("error", f"dtypes not comparable: NPU {a.dtype}, bench {b.dtype}")
            continue
        if a.shape != b.shape:
            v.add("error", f"shape differs: NPU {list(a.shape)}, bench {list(b.shape)}")
            continue
        exact = vd.dtype_class(a.dtype) == "exact"
        tol = vd.TOLERANCES.get(tol_names[i]) or vd.TOLERANCES["float32"]
        cols["Tolerance Dtype"][i] = "exact" if exact else tol.name
        if mode == "md5":
            cols["NPU MD5"][i], cols["BENCH MD5"][i] = a.md5, b.md5
            if a.md5 == b.md5:
                continue
            if a.dtype == b.dtype and tol_names[i] == vd.dtype_class(a.dtype):
                v.add("error", f"CRC32 differs ({a.md5} vs {b.md5}) with the same dtype")
                continue
            why = (f"across dtypes ({a.dtype} vs {b.dtype})" if a.dtype != b.dtype
                   else f"downstream of {tol_names[i]} computation")
            v.add("pass", f"CRC32 differs, as it must {why}; judged by the statistics "
                          f"the md5 dump also holds")
            stat_rows.append(j)
        elif mode == "tensor":
            if not a.data_name or not b.data_name:
                side = "NPU" if not a.data_name else "bench"
                v.add("warning", f"{side} has no tensor file for this row (data_name missing)")
                continue
            try:
                pa = resolve(npu.data_dir, a.data_name)
                pb = resolve(bench.data_dir, b.data_name)
            except ValueError as exc:
                v.add("error", str(exc))
                continue
            tensor_jobs.append((i, pa, pb, tol.rtol, tol.floor, exact))
        else:
            stat_rows.append(j)

    # statistics judgement, vectorised
    if stat_rows:
        sel = np.array(stat_rows, dtype=np.int64)
        rows_i = [stat_idx[j] for j in stat_rows]
        tols = [vd.TOLERANCES.get(tol_names[i]) or vd.TOLERANCES["float32"] for i in rows_i]
        numel = np.array([pairs[i].bench.numel for i in rows_i], dtype=np.float64)
        rtol = np.array([t.rtol for t in tols])
        floor = np.array([t.floor for t in tols])
        ns, bs = npu_st[sel], bench_st[sel]
        ratio = stat_tolerance_ratio(ns, bs, numel, rtol, floor)
        finite_n, finite_b = np.isfinite(ns), np.isfinite(bs)
        all_finite = (finite_n.all(axis=1) & finite_b.all(axis=1)).tolist()
        ratios = ratio.tolist()
        for k, i in enumerate(rows_i):
            v = verdicts[i]
            exact = vd.dtype_class(pairs[i].npu.dtype) == "exact"
            r = ratios[k]
            if all_finite[k] and not exact:          # the common case, kept cheap
                cols["Err/Tolerance"][i] = r
                if r > 1.0:
                    vd.judge_ratio(v, r, tols[k], "statistics off by")
                continue
            missing = np.isnan(ns[k]) & np.isnan(bs[k])      # not dumped (e.g. ints' Mean)
            bad_n, bad_b = ~finite_n[k] & ~missing, ~finite_b[k] & ~missing
            if bad_n.any() or bad_b.any():
                if (bad_n == bad_b).all() and np.array_equal(ns[k][bad_n], bs[k][bad_b], equal_nan=True):
                    v.add("warning", "NaN/Inf in the statistics of both sides (overflow on both)")
                else:
                    v.add("error", f"NaN/Inf differ: NPU {_fmt_stats(ns[k])}, bench {_fmt_stats(bs[k])}")
                continue
            if exact and r > 0:
                v.add("error", "integer/bool statistics differ (exact dtype)")
                r = math.inf
            cols["Err/Tolerance"][i] = r
            if not exact:
                vd.judge_ratio(v, r, tols[k], "statistics off by")

    # tensor metrics, lazily loaded
    if tensor_jobs:
        results = _run_jobs(tensor_jobs, workers, progress)
        for i, *_rest in tensor_jobs:
            res = results.get(i)
            v = verdicts[i]
            if isinstance(res, str):
                v.add("warning" if "missing" in res else "error", res)
                continue
            _tensor_row(cols, i, res, v, tol_names[i], _rest[-1])

    # --- one-sided rows and None rows
    for i, p in enumerate(pairs):
        a, b, v = p.npu, p.bench, verdicts[i]
        if a is None:
            v.add("warning", "no NPU row matched this bench row")
        elif b is None:
            v.add("warning", "no bench row matched this NPU row")
        elif a.kind == "none" and b.kind != "none":
            v.add("error", f"NPU is None, bench is a {b.kind}")
        elif b.kind == "none" and a.kind != "none":
            v.add("error", f"bench is None, NPU is a {a.kind}")
    cols["Result"] = [v.level for v in verdicts]
    cols["Err_message"] = [v.text() for v in verdicts]
    if stack_mode:
        stacks = load_stacks(stack_json) if stack_json else {}
        col, seen = cols["NPU_Stack_Info"], set()
        for i, p in enumerate(pairs):
            if p.npu and p.npu.entry not in seen:
                seen.add(p.npu.entry)
                col[i] = stacks.get(p.npu.entry)
    return CompareResult(mode, cols, notes, npu, bench, stack_mode, stack_json, pairs, matching)


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
    cols["Err/Tolerance"][i] = m.tol_ratio
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
    tol = vd.TOLERANCES.get(tol_name) or vd.TOLERANCES["float32"]
    vd.judge_cosine(v, m.cosine, tol)
    vd.judge_elements(v, m.tol_ratio, m.beyond, m.gross, tol)


def load_stacks(path: str) -> dict:
    """entry name -> stack text; reads msprobe's grouped and older per-name layouts."""
    import json
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    out = {}
    if not isinstance(data, dict):
        return out
    for key, value in data.items():
        if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
                and isinstance(value[1], list)):
            text = "\n".join(map(str, value[1]))
            for name in value[0]:
                out[name] = text
        elif isinstance(value, list):
            out[key] = "\n".join(map(str, value))
        elif isinstance(value, str):
            out[key] = value
    return out
