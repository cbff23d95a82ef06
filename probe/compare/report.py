"""Write a CompareResult: the xlsx (rows + Summary sheet) and a CSV next to it."""
from __future__ import annotations

import csv
import os
import time
from collections import Counter

from .engine import PERCENT_COLUMNS, CompareResult, load_stacks
from .xlsx import Sheet, write_workbook

_WIDTHS = {"NPU Name": 48, "Bench Name": 48, "Err_message": 70, "NPU_Stack_Info": 70,
           "Data_name": 50, "NPU Dtype": 15, "Bench Dtype": 15, "Result": 9,
           "NPU MD5": 11, "BENCH MD5": 11}


def output_stem(output_path: str, tag: str = "") -> str:
    """``{output_path}/compare_result_{tag_}{timestamp}``, not clobbering an earlier one."""
    os.makedirs(output_path, exist_ok=True)
    stamp = time.strftime("%Y%m%d%H%M%S")
    stem = os.path.join(output_path, f"compare_result_{tag + '_' if tag else ''}{stamp}")
    k, candidate = 1, stem
    while os.path.exists(candidate + ".xlsx") or os.path.exists(candidate + ".csv"):
        candidate = f"{stem}_{k}"
        k += 1
    return candidate


def summary_rows(result: CompareResult) -> list:
    """Key/value lines of the Summary sheet (also printed by the CLI)."""
    cols = result.columns
    verdicts = cols["Result"]
    counts = Counter(verdicts)
    lines = [["mode", result.mode],
             ["NPU dump", result.npu.json_path if result.npu else ""],
             ["bench dump", result.bench.json_path if result.bench else ""],
             ["rows", result.n_rows]]
    for level in ("pass", "warning", "error"):
        lines.append([level, counts.get(level, 0)])
    by_dir = Counter(zip(cols["Direction"], verdicts))
    for d in sorted({d for d, _ in by_dir}):
        lines.append([f"{d or 'other'}: pass / warning / error",
                      " / ".join(str(by_dir.get((d, lv), 0)) for lv in ("pass", "warning", "error"))])
    unmatched_npu = sum(1 for b in cols["Bench Name"] if b is None)
    unmatched_bench = sum(1 for a in cols["NPU Name"] if a is None)
    lines.append(["NPU rows without bench", unmatched_npu])
    lines.append(["bench rows without NPU", unmatched_bench])
    for note in result.notes:
        lines.append(["note", note])
    first = next((i for i, v in enumerate(verdicts) if v == "error"), None)
    if first is None:
        lines.append(["first error", "none"])
    else:
        name = cols["NPU Name"][first] or cols["Bench Name"][first]
        lines.append(["first error", f"row {first + 2}: {name}"])
        lines.append(["first error message", cols["Err_message"][first]])
        stack = None
        if result.stack_path:
            entry = _entry_of(result, first)
            stack = load_stacks(result.stack_path).get(entry) if entry else None
        lines.append(["first error stack", stack or "(no stack.json given)"])
    return lines


def _entry_of(result, i):
    name = result.columns["NPU Name"][i]
    if name is None or result.npu is None:
        return None
    for row in result.npu.rows:
        if row.name == name:
            return row.entry
    return None


def _widths(header, cols):
    out = []
    for h in header:
        if h in _WIDTHS:
            out.append(_WIDTHS[h])
        else:
            sample = [v for v in cols[h][:200] if v is not None]
            longest = max([len(f"{v:.6g}") if isinstance(v, float) else len(str(v)) for v in sample],
                          default=0)
            out.append(min(max(len(h) * 0.9, longest + 2, 9), 40))
    return out


def write_report(result: CompareResult, output_path: str, tag: str = "") -> list:
    """Write xlsx + csv; return their paths."""
    stem = output_stem(output_path, tag)
    cols = result.columns
    header = list(cols)
    n = result.n_rows
    rows = (list(r) for r in zip(*(cols[h] for h in header))) if n else iter(())
    styles = [None if v == "pass" else v for v in cols["Result"]]
    main = Sheet("compare_result", header, rows, styles, _widths(header, cols),
                 {h for h in header if h in PERCENT_COLUMNS and result.mode == "statistics"})
    summary = Sheet("Summary", ["Item", "Value"], summary_rows(result), None, [34, 110],
                    freeze_header=False, autofilter=False)
    xlsx_path, csv_path = stem + ".xlsx", stem + ".csv"
    write_workbook(xlsx_path, [main, summary])
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(zip(*(cols[h] for h in header)))
    return [xlsx_path, csv_path]
