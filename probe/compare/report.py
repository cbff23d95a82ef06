"""Write a CompareResult: the xlsx (rows, Summary with the diagnosis and its chart, one
row per call in Diagnosis; it opens on Summary), a CSV of the rows, the self-contained
HTML page (html_report) and compare_summary_*.json next to it (also copied to
compare_summary.json, the latest run's).

They are written together (written_whole): each under a temporary name, all renamed once
all are complete, and only then do compare_report.html and compare_summary.json become
this compare's. A compare that fails leaves the folder as it was."""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections import Counter
import numpy as np

from .call_fields import CallFields
from .engine import PERCENT_COLUMNS, CompareResult, load_stacks
from .heap import give_back_free_heap
from . import summary_json
from .html_report import user_frame
from .xlsx import LineChart, Sheet, write_workbook
from .xlsx.cells import code_array
from .xlsx.sheets import row_link, split_note
from probe import lone_surrogates
from probe.written_whole import WrittenTogether

MAIN_SHEET = "compare_result"

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
    levels, level_of = code_array(verdicts)
    dirs, dir_of = code_array(cols["Direction"])
    # (direction, verdict) -> rows, as Counter(zip(..)) counts them, from the two columns' codes
    pairs = np.bincount(dir_of.astype(np.int64) * len(levels) + level_of, minlength=len(dirs) * len(levels))
    by_dir = {(d, lv): int(pairs[i * len(levels) + j]) for i, d in enumerate(dirs) for j, lv in enumerate(levels)
              if pairs[i * len(levels) + j]}
    counts = Counter({lv: int(c) for lv, c in zip(levels, np.bincount(level_of, minlength=len(levels)))})
    lines = [["mode", result.mode],
             ["NPU dump", result.npu.json_path if result.npu else ""],
             ["bench dump", result.bench.json_path if result.bench else ""],
             ["rows", result.n_rows]]
    for level in ("pass", "warning", "error"):
        lines.append([level, counts.get(level, 0)])
    for d in sorted({d for d, _ in by_dir}):
        lines.append([f"{d or 'other'}: pass / warning / error",
                      " / ".join(str(by_dir.get((d, lv), 0)) for lv in ("pass", "warning", "error"))])
    lines.append(["NPU rows without bench", _nones(cols["Bench Name"])])
    lines.append(["bench rows without NPU", _nones(cols["NPU Name"])])
    for note in result.notes:
        lines.append(["note", note])
    first = _first_error(verdicts)
    if first is None:
        lines.append(["first error", "none"])
    else:
        name = cols["NPU Name"][first] or cols["Bench Name"][first]
        lines.append(["first error", f"{_row_text(first)}: {name}"])
        lines.append(["first error message", cols["Err_message"][first]])
        stack = None
        if result.stack_path:
            entry = _entry_of(result, first)
            stack = load_stacks(result.stack_path).get(entry) if entry else None
        lines.append(["first error stack", stack or "(no stack.json given)"])
    return lines


def _nones(column) -> int:
    """How many values of ``column`` are None."""
    return column.count(None) if type(column) is list else sum(1 for v in column if v is None)


def _first_error(verdicts) -> int | None:
    """The index of the first row whose verdict is "error", or None."""
    if type(verdicts) is list:
        try:
            return verdicts.index("error")
        except ValueError:
            return None
    return next((i for i, v in enumerate(verdicts) if v == "error"), None)


def _row_text(row: int) -> str:
    """Where data row ``row`` is in the workbook: "row 12", or "row 12 of compare_result (2)"
    where the main sheet is split (past Excel's row limit)."""
    sheet, _, cell = row_link(MAIN_SHEET, row).rpartition("!A")
    sheet = sheet.strip("'")
    return f"row {cell}" if sheet == MAIN_SHEET else f"row {cell} of {sheet}"


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


DIAG_HEADER = ["#", "Direction", "NPU Name", "Bench Name", "Match", "Module", "Input Error",
               "Output Error", "Jump", "Threshold", "Noise", "Status", "Local Error", "Correct Kernel Error",
               "1 - Cosine", "MaxRelativeErr", "Plot Output Error", "Plot Input Error"]
_DIAG_WIDTHS = [7, 10, 44, 44, 14, 28, 12, 12, 10, 10, 10, 11, 12, 12, 11, 13, 12, 12]
_STATUS_STYLE = {"introduces": "error", "inherits": "warning"}


def _numbers(values) -> np.ndarray:
    """A number column of the Diagnosis sheet, as float64 (the writer's fast path): NaN,
    an empty cell, for None (numpy's conversion) and the infinities (a spreadsheet has
    none: 'inf' would be a text that sorts and filters as text)."""
    column = np.array(values, dtype=np.float64)
    column[~np.isfinite(column)] = np.nan
    return column


def _plot(column: np.ndarray) -> np.ndarray:
    """Chart cells of a ``_numbers`` column: the log axis cannot show 0 or infinity, so
    those are gaps."""
    column = column.copy()
    with np.errstate(invalid="ignore"):
        column[~(column > 0)] = np.nan
    return column


def diagnosis_sheet(diag, fields: CallFields | None = None) -> Sheet:
    """One row per call: its error in and out, its verdict (Status) and, where it was re-run
    on the NPU's own inputs, its local error against what a correct kernel of its dtype adds.
    Jump (output error / input error) is empty where the input error is 0. Each field read
    with ``attrgetter`` over the calls (100k of them in the 100k-entry pair); ``fields``:
    the calls' ``CallFields`` where the report shares them (the page reads them too)."""
    calls = diag.calls
    field = fields if fields is not None else CallFields(calls)
    out_err, in_err, status = field("output_error"), field("input_error"), field("status")
    local = field("local", keep=False)           # (the fields only this sheet shows: not kept for the page)
    no_local = local.count(None) == len(local)
    out_col, in_col = _numbers(out_err), _numbers(in_err)
    cols = [[i + 1 for i in field("index")], field("direction"), field("npu_entry"), field("bench_entry"),
            field("match", keep=False), field("module"), in_col, out_col,
            _numbers([u.jump if e is not None else None for u, e in zip(calls, out_err)]),
            _numbers(field.judged_thresholds()),
            _numbers(field("noise", keep=False)), status,
            _numbers(local if no_local else [e.local if e is not None else None for e in local]),
            _numbers(local if no_local else [e.correct if e is not None else None for e in local]),
            _numbers(field("one_minus_cos", keep=False)), _numbers(field("max_rel", keep=False)),
            _plot(out_col), _plot(in_col)]
    return Sheet("Diagnosis", DIAG_HEADER, cols, list(map(_STATUS_STYLE.get, status)), _DIAG_WIDTHS)


def _describe(label, rec, judged: bool = True) -> list:
    if rec is None:
        return [[label, "none: no call adds error beyond what its dtype explains" if judged
                 else "none found among the calls compared (not judged: see above)"]]
    name = rec["npu_name"] or rec["bench_name"]
    if rec["bench_name"] and rec["bench_name"] != rec["npu_name"]:
        name += f"  (bench: {rec['bench_name']})"
    what = "introduces error" if rec["kind"] == "introduced" else (
        "the first call whose inputs differ; no compared call before it introduced error")
    lines = [[label, f"{name}: {what}" + (f": {rec['reason']}" if rec.get("reason") else "")],
             [f"{label}: error in / out", f"input {_fmt(rec['input_error'])}, output "
                                          f"{_fmt(rec['output_error'])} (threshold {_fmt(rec['threshold'])})"]]
    w = rec.get("worst_output")
    if w:
        why = w.get("err_message") or w["result"]      # the message starts with the result
        lines.append([f"{label}: worst output", f"{w['npu_row']}: {why}; " + ", ".join(
            _metric(k, v, w["result"]) for k, v in w["metrics"].items() if v is not None)])
    if rec.get("unmatched_before"):
        lines.append([f"{label}: one-sided calls just before it", ", ".join(rec["unmatched_before"][:20])])
    if rec.get("module"):
        lines.append([f"{label}: module", rec["module"]])
    lines.append([f"{label}: stack", rec.get("stack") or "(no stack.json)"])
    return lines


def _metric(name, value, result) -> str:
    """``name value`` for the Summary; a cosine of exactly 1 on a row that is off says why."""
    if name == "Cosine" and value == 1.0 and result not in ("pass", None):
        return "Cosine 1 (same direction: the error is in the magnitude)"
    return f"{name} {_fmt(value)}"


def _fmt(x) -> str:
    if isinstance(x, float):
        text = f"{x:.4g}"
        digits = 4
        while text in ("1", "-1") and x not in (1.0, -1.0) and digits < 17:   # a cosine of 0.99998 is not 1
            digits += 2
            text = f"{x:.{digits}g}"
        return text
    return "-" if x is None else str(x)


def diagnosis_lines(summary: dict) -> list:
    """Summary-sheet lines (also printed) naming where the error starts."""
    fd = summary["first_divergence"]
    lines = [["verdict", summary.get("verdict", "")]]
    for gap in (summary.get("judged") or {}).get("not_compared") or []:
        lines.append(["not judged", gap["text"]])
    lines += [["matching", summary["matching"]], ["error measure", summary["error_measure"]],
             ["calls: clean / introduce / inherit / unmatched",
              " / ".join(str(summary["calls"][k]) for k in ("clean", "introduces", "inherits", "unmatched"))]]
    if summary.get("replayed_calls"):
        lines.append(["calls re-run on the NPU's own inputs", summary["replayed_calls"]])
    state = summary.get("state")
    if state:
        lines.append(["weights and state", state["text"]])
    drift = summary.get("drift")
    if drift:
        grow = drift.get("grows_fastest")
        lines.append(["drift", f"last forward output {_fmt(drift['forward'])}, last backward output "
                               f"{_fmt(drift['backward'])}" + (
                                   f"; grows fastest at {grow['name']} (x{_fmt(grow['growth'])})"
                                   if grow else "")])
    complete = not (summary.get("judged") or {}).get("not_compared")
    lines += _describe("first divergence (forward)", fd["forward"], complete)
    lines += _describe("first divergence (backward)", fd["backward"], complete)
    if fd["forward"] is None and fd["backward"] is None and summary.get("inputs_differ"):
        lines += _describe("inputs differ first at", summary["inputs_differ"])
    for s in summary["suspects"]:
        lines.append([f"suspect {s['rank']}", f"{s['npu_name'] or s['bench_name']} ({s['direction']}): "
                      f"output error {_fmt(s['output_error'])} vs input {_fmt(s['input_error'])}"
                      + (f", module {s['module']}" if s.get("module") else "")
                      + (f"; {s['reason']}" if s.get("reason") else "")])
    return lines


_LABEL_WIDTH, _VALUE_WIDTH = 34, 110     # Summary columns (characters)
_LINE_PT, _MAX_ROW_PT = 14, 409          # a text line's height; Excel's highest row


def _lines_of(text, width: int) -> int:
    """How many lines ``text`` takes wrapped in a column ``width`` characters wide."""
    return sum(max(1, -(-len(line) // width)) for line in str(text).split("\n"))


def _row_height(label, value):
    # a column holds ~1.1 of its width in characters of proportional text
    n = max(_lines_of(label, int(_LABEL_WIDTH * 1.1)), _lines_of(value, int(_VALUE_WIDTH * 1.1)))
    return min(n * _LINE_PT, _MAX_ROW_PT) if n > 1 else None


def culprit_row(diag) -> int | None:
    """Row index (0-based, in the compare_result table) of the first divergence: its worst
    output row, else its first row."""
    primary = diag.forward or diag.backward if diag is not None else None
    if primary is None:
        return None
    u = primary.call
    if u.worst_row is not None:
        return u.worst_row
    return u.rows[0] if u.rows else None


def summary_sheet(result: CompareResult, digest: dict | None, diag) -> Sheet:
    """Label | value, the value wrapped in a wide column with row heights that fit it; the
    culprit's row and the first error row linked into compare_result."""
    lines = summary_rows(result)
    links = []
    culprit = culprit_row(diag)
    if digest is not None:
        if culprit is not None:
            name = result.columns["NPU Name"][culprit] or result.columns["Bench Name"][culprit]
            lines.insert(0, ["culprit row (click)", f"{MAIN_SHEET} {_row_text(culprit)}: {name}"])
            links.append(("B2", row_link(MAIN_SHEET, culprit)))
            fd = digest["first_divergence"]
            frame = user_frame((fd["forward"] or fd["backward"] or {}).get("stack"))
            if frame:
                lines.insert(1, ["culprit called at", frame])
        lines += diagnosis_lines(digest)
    first = _first_error(result.columns["Result"])
    styles: list = [None] * len(lines)
    for k, (label, _) in enumerate(lines):
        if label == "first error" and first is not None:
            links.append((f"B{k + 2}", row_link(MAIN_SHEET, first)))
    for ref, _ in links:
        styles[int(ref[1:]) - 2] = "link"
    return Sheet.from_rows("Summary", ["Item", "Value"], lines, styles, [_LABEL_WIDTH, _VALUE_WIDTH],
                           freeze_header=False, autofilter=False, wrap_columns={"Item", "Value"},
                           row_heights=[_row_height(k, v) for k, v in lines], links=links,
                           active=True, fit_width=True)


def write_report(result: CompareResult, output_path: str, tag: str = "", diag=None,
                 bench2_path: str | None = None, html: bool = True, progress=None) -> list:
    """Write xlsx + csv (+ compare_summary json with a diagnosis, + the HTML page); return
    their paths (the json last).

    ``diag``: a Diagnosis, or a function that makes one; it runs first, in this process
    (one compare of one pair is one process: no helper threads or processes).
    ``progress``: a tqdm-like bar (``set_description``, ``update``) or None.
    """
    stem = output_stem(output_path, tag)
    split = split_note(MAIN_SHEET, result.n_rows)
    if split is not None and split not in result.notes:     # said in the Summary, the summary json, the console
        result.notes.append(split)
    digest = None
    if diag is not None:
        if progress is not None:
            progress.set_description("compare: diagnosis", refresh=False)
            progress.update(0)
        diag = diag() if callable(diag) else diag
        digest = _encodable(summary_json.build(result, diag, bench2_path), output_path)
    with WrittenTogether() as files:
        paths = _write_files(result, diag, digest, stem, files, html, progress)
    d = os.path.dirname(stem)
    for path in paths[2:]:      # now that all are complete: the folder's latest page and summary
        fixed = "compare_report.html" if path.endswith(".html") else "compare_summary.json"
        link_latest(path, os.path.join(d, fixed))
    return paths


def _encodable(digest: dict, folder: str) -> dict:
    """The summary with its lone surrogates replaced (UTF-8 cannot hold them), said once."""
    if not lone_surrogates.in_text(json.dumps(digest, ensure_ascii=False)):
        return digest
    lone_surrogates.say_replaced(os.path.abspath(folder))
    return lone_surrogates.replace_in(digest)


def _write_files(result, diag, digest, stem: str, files: WrittenTogether, html: bool, progress) -> list:
    """Write the compare's files, each to ``files.path`` (renamed when all are done);
    return their final paths: xlsx, csv, page, summary json."""
    xlsx_path, csv_path = stem + ".xlsx", stem + ".csv"
    fields = CallFields(diag.calls) if diag is not None else None      # read once: the sheet's and the page's
    sheets = _sheets(result, diag, digest, fields, files.path(csv_path))
    if progress is not None:
        progress.set_description("compare: writing xlsx", refresh=False)
        progress.total = sum(len(s.columns[0]) if s.columns else 0 for s in sheets)
    write_workbook(files.path(xlsx_path), sheets, progress.update if progress is not None else None)
    # the sheets' own columns, and what the workbook's threads freed in their own heaps
    # (glibc keeps a heap per thread), given back before the page's data is made: the
    # page is the report's peak (the 100k-entry pair's went up ~30 MB without this)
    del sheets
    give_back_free_heap()
    paths = [xlsx_path, csv_path]
    d, base = os.path.split(stem)
    json_path = os.path.join(d, base.replace("compare_result", "compare_summary", 1) + ".json")
    if html:
        from .html_report import write_page
        if progress is not None:
            progress.set_description("compare: writing page", refresh=False)
            progress.update(0)
        page = os.path.join(d, base.replace("compare_result", "compare_report", 1) + ".html")
        write_page(result, diag, digest, files.path(page),
                   {"xlsx": xlsx_path, "json": json_path if digest is not None else None}, fields)
        paths.append(page)
    if digest is not None:
        summary_json.write(files.path(json_path), digest)
        paths.append(json_path)
    return paths


def _sheets(result, diag, digest, fields: CallFields | None, csv_path: str) -> list:
    """The workbook's sheets: the rows (also written to ``csv_path``), the Summary and,
    with a diagnosis, one row per call with the Summary's chart of it."""
    cols = result.columns
    header = list(cols)
    styles = [None if v == "pass" else v for v in cols["Result"]]
    main = Sheet(MAIN_SHEET, header, [cols[h] for h in header], styles, _widths(header, cols),
                 {h for h in header if h in PERCENT_COLUMNS and result.mode == "statistics"},
                 csv_path=csv_path)
    summary = summary_sheet(result, digest, diag)
    sheets = [main, summary]
    if diag is not None and digest is not None:
        diag_sheet = diagnosis_sheet(diag, fields)
        sheets.append(diag_sheet)
        n = len(diag_sheet.columns[0])
        if n:
            col = DIAG_HEADER.index
            top = len(summary.columns[0]) + 2          # below the text, not over it
            summary.charts.append(LineChart(
                "Error along the call sequence (log scale; gaps = no error)",
                ("Diagnosis", col("#"), 2, n + 1),
                [("output error", "Diagnosis", col("Plot Output Error"), 2, n + 1),
                 ("input error", "Diagnosis", col("Plot Input Error"), 2, n + 1)],
                anchor=(0, top, 2, top + 28), x_title="call # (Diagnosis sheet)",
                y_title=digest["error_measure"], log_y=True))
    return sheets


def link_latest(path: str, fixed: str) -> None:
    """``fixed`` becomes the latest compare's file (a fixed name for scripts and CI): a hard
    link where the file system has them (a big page is not copied), else a copy; replaced
    atomically (ranks may race)."""
    tmp = f"{fixed}.{os.getpid()}.tmp"
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
    os.replace(tmp, fixed)


def console_summary(result: CompareResult, digest: dict | None, paths: list) -> list:
    """The few lines the CLI prints: what to open next, row counts, the verdict; first, when
    the compare could not judge everything, what it could not and why."""
    counts = Counter(result.columns["Result"])
    page = next((p for p in paths if p.endswith(".html")), None)
    book = next((p for p in paths if p.endswith(".xlsx")), None)
    lines = [f"open {page} (the page; every column: {book})" if page and book else f"open {page or book or paths[0]}"]
    lines += [f"{result.mode} mode, {result.n_rows} rows: "
             + ", ".join(f"{k} {counts.get(k, 0)}" for k in ("pass", "warning", "error"))]
    gaps = ((digest or {}).get("judged") or {}).get("not_compared") or []
    if gaps:        # what could not be judged (an incomplete dump, nothing paired) comes first
        lines.insert(0, "not judged: " + "; ".join(g["text"] for g in gaps))
    if digest is not None:
        fd = digest["first_divergence"]
        rec = fd["forward"] or fd["backward"]
        if rec is None:
            lines.append(f"verdict: {digest.get('verdict') or 'no API introduces error'}")
        else:
            where = [f"module {rec['module']}"] if rec.get("module") else []
            frame = user_frame(rec.get("stack"))
            if frame:
                where.append(f"called at {frame}")
            lines.append(f"verdict: {rec['npu_name'] or rec['bench_name']} ({rec['direction']}) introduces error"
                         + (" (" + ", ".join(where) + ")" if where else "")
                         + (f": {rec['reason']}" if rec.get("reason") else
                            f"; output error {_fmt(rec['output_error'])} vs input {_fmt(rec['input_error'])}"))
        state = digest.get("state")
        if state and state.get("differ"):
            lines.append(state["text"])
    return lines
