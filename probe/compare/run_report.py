"""The run's answer as people read it: the console lines (``answer_lines``) and the run
workbook ``OUT/compare_run_{timestamp}.xlsx``.

Sheets: *Run* (the answer and the notes), *Pairs* (one row per step/rank pair: verdict,
first divergence, why, seconds, the pair's report; red where a pair introduces error, yellow
where it inherits, its inputs differ, or it was not compared or can't be told), *Grid* (steps down, ranks across, one verdict
per cell: the run at a glance).
"""
from __future__ import annotations

import os
import time

from .xlsx import Sheet, write_workbook

_STYLE = {"introduces": "error", "failed": "error", "inherits": "warning",
          "inputs_differ": "warning", "cant_tell": "warning", "not_compared": "warning", "missing": "warning"}
_MAX_GRID_RANKS = 16000          # xlsx has 16384 columns
_MAX_LISTED = 20                 # pairs not compared (or can't tell) listed one a line on the console


def run_sheet(summary: dict) -> Sheet:
    """The answer, one line per item."""
    fd = summary["first_divergence"] or {}
    answer = answer_lines(summary)
    # no first divergence: the answer's own words (never a bare "none" where pairs were not judged)
    headline = fd.get("name") or next((t for t in answer if t.startswith("first divergence: ")),
                                      "first divergence: none")[len("first divergence: "):]
    lines = [["NPU root", summary["npu_root"]], ["bench root", summary["bench_root"]],
             ["steps", ", ".join(map(str, summary["steps"]))],
             ["ranks", ", ".join(map(str, summary["ranks"]))],
             ["first divergence", headline]]
    for key in ("step", "rank", "direction", "kind", "reason", "report"):
        if fd.get(key) is not None:
            lines.append([f"first divergence: {key}", fd[key]])
    lines += [["", text] for text in answer[1:] if not text.startswith(("first", "  "))]
    return Sheet.from_rows("Run", ["Item", "Value"], lines, None, [28, 120],
                           freeze_header=False, autofilter=False)


def pairs_sheet(summary: dict, outcomes: list) -> Sheet:
    seconds = {(o.step, o.rank): o.seconds for o in outcomes}
    grid = summary["grid"]
    header = ["Step", "Rank", "Verdict", "First Divergence", "Reason", "Seconds", "Report"]
    cols = [[c["step"] for c in grid], [c["rank"] for c in grid], [c["verdict"] for c in grid],
            [c["first"] for c in grid], [c.get("reason") for c in grid],
            [seconds.get((c["step"], c["rank"])) for c in grid], [c["report"] for c in grid]]
    return Sheet("Pairs", header, cols, [_STYLE.get(c["verdict"]) for c in grid],
                 [7, 7, 14, 48, 60, 9, 90])


def grid_sheet(summary: dict) -> Sheet:
    """Steps down, ranks across."""
    ranks = summary["ranks"][:_MAX_GRID_RANKS]
    at = {(c["step"], c["rank"]): c["verdict"] for c in summary["grid"]}
    header = ["Step"] + [f"rank{r}" for r in ranks]
    cols = [list(summary["steps"])] + [[at.get((s, r)) for s in summary["steps"]] for r in ranks]
    return Sheet("Grid", header, cols, None, [7] + [13] * len(ranks))


def write_run_workbook(summary: dict, outcomes: list, output_path: str) -> str:
    os.makedirs(output_path, exist_ok=True)
    stem = os.path.join(output_path, f"compare_run_{time.strftime('%Y%m%d%H%M%S')}")
    path, k = stem + ".xlsx", 1
    while os.path.exists(path):
        path, k = f"{stem}_{k}.xlsx", k + 1
    write_workbook(path, [run_sheet(summary), pairs_sheet(summary, outcomes), grid_sheet(summary)])
    return path


def answer_lines(summary: dict) -> list:
    """The run's answer as console lines."""
    if summary.get("requests") is not None:     # an inference run, compared request by request
        from .requests import answer_lines as request_lines
        return request_lines(summary)
    fd = summary["first_divergence"]
    counts: dict = {}
    for cell in summary["grid"]:
        counts[cell["verdict"]] = counts.get(cell["verdict"], 0) + 1
    lines = [f"run: {len(summary['steps'])} step(s) x {len(summary['ranks'])} rank(s): "
             + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    unjudged = [c for c in summary["grid"] if c["verdict"] == "not_compared"]
    unsure = [c for c in summary["grid"] if c["verdict"] == "cant_tell"]
    if fd is None and (unjudged or unsure):
        n = len(summary["grid"])
        said = ([f"{len(unjudged)} of {n} pair(s) were not compared"] if unjudged else []) + \
            ([f"{len(unsure)} of {n} pair(s) have calls statistics can't tell"] if unsure else [])
        lines.append(f"first divergence: none found, but {' and '.join(said)} (never \"clean\")")
    elif fd is None:
        lines.append("first divergence: none (no pair's call introduces error)")
    else:
        what = "introduces error" if fd["kind"] == "introduced" else "inputs already differ"
        ranks = fd.get("ranks") or [fd["rank"]]      # ranks merged: the shard's rank, or the candidates
        where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}" + (
            "" if fd.get("rank_certain", True) else " (which one can't be told)")
        lines.append(f"first divergence: {fd['name']} ({fd['direction']}) at step {fd['step']}, "
                     f"{where}: {what}")
        if fd.get("reason"):
            lines.append(f"  why: {fd['reason']}")
        lines.append(f"  report: {fd['report']}")
    for c in unjudged[:_MAX_LISTED]:
        lines.append(f"not compared: step {c['step']} rank {c['rank']}: {c.get('reason') or 'nothing compared'}")
    if len(unjudged) > _MAX_LISTED:
        lines.append(f"not compared: {len(unjudged) - _MAX_LISTED} more pair(s) (the Pairs sheet lists them)")
    for c in unsure[:_MAX_LISTED]:
        lines.append(f"can't tell: step {c['step']} rank {c['rank']}: {c.get('reason') or 'calls not judged'}")
    if len(unsure) > _MAX_LISTED:
        lines.append(f"can't tell: {len(unsure) - _MAX_LISTED} more pair(s) (the Pairs sheet lists them)")
    for u in summary["unpaired"]:
        lines.append(f"unpaired: only the {u['side']} side has step {u['step']} rank{u['rank']}")
    for note in summary["notes"]:
        lines.append(f"note: {note}")
    return lines
