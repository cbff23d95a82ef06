"""compare_summary.json: the diagnosis in a form a script or CI job can read.

Schema "probe.compare_summary/1" (README, "compare_summary.json"). JSON has no NaN or
Infinity: a missing number is null, an infinite one the string "inf".
"""
from __future__ import annotations

import json
import math
from collections import Counter

from .engine import load_stacks

SCHEMA = "probe.compare_summary/1"
_TENSOR_KEYS = ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                "Five Thousandths Err Ratio", "Err/Tolerance"]
_STAT_KEYS = ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
              "MeanRelativeErr", "NormRelativeErr", "Err/Tolerance"]


def _num(x):
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, (int, float)):
        x = float(x)
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    return x


class StackLookup:
    """Stack text of an entry; a backward entry falls back to its forward call's stack."""

    def __init__(self, path):
        self.stacks = load_stacks(path) if path else {}

    def __call__(self, entry):
        if not entry:
            return None
        s = self.stacks.get(entry)
        if s is None and entry.endswith(".backward"):
            s = self.stacks.get(entry[: -len("backward")] + "forward")
        return s


def call_record(result, u, stack) -> dict:
    """One call of the diagnosis as a dict (what the JSON, console and Summary show)."""
    cols = result.columns
    rec = {"npu_name": u.npu_entry, "bench_name": u.bench_entry, "direction": u.direction,
           "position": u.index, "match": u.match, "status": u.status,
           "input_error": _num(u.input_error), "output_error": _num(u.output_error),
           "jump": _num(u.jump), "threshold": _num(u.threshold), "noise": _num(u.noise),
           "noise_input": _num(u.noise_in),
           "module": u.module, "stack": stack(u.npu_entry) or stack(u.bench_entry)}
    if u.worst_row is not None:
        i = u.worst_row
        keys = _TENSOR_KEYS if result.mode == "tensor" else _STAT_KEYS
        rec["worst_output"] = {
            "npu_row": cols["NPU Name"][i], "bench_row": cols["Bench Name"][i],
            "result": cols["Result"][i], "err_message": cols["Err_message"][i],
            "tolerance_dtype": cols["Tolerance Dtype"][i],
            "metrics": {k: _num(cols[k][i]) for k in keys if k in cols}}
    return rec


def _divergence(result, d, stack):
    if d is None:
        return None
    rec = call_record(result, d.call, stack)
    rec["kind"] = d.kind
    if d.candidates:
        rec["unmatched_before"] = [c.name for c in d.candidates]
    return rec


def _groups(result, groups) -> list:
    """Entries of each group on each side, in call order."""
    if not groups:
        return []
    pos = [{}, {}]
    for p, side in zip(pos, (result.npu, result.bench)):
        for k, r in enumerate(side.rows if side else ()):
            p.setdefault(r.entry, k)
    out = []
    for u in groups:
        npu = dict.fromkeys(result.pairs[i].npu.entry for i in u.rows if result.pairs[i].npu)
        bench = dict.fromkeys(result.pairs[i].bench.entry for i in u.rows if result.pairs[i].bench)
        out.append({"npu": sorted(npu, key=lambda e: pos[0].get(e, 0)),
                    "bench": sorted(bench, key=lambda e: pos[1].get(e, 0))})
    return out


def build(result, diag, bench2_path: str | None = None, stack_path: str | None = None) -> dict:
    """The summary dict."""
    stack = StackLookup(stack_path or result.stack_path)
    cols = result.columns
    counts = Counter(cols["Result"])
    status = Counter(u.status for u in diag.calls)
    groups = [u for u in diag.calls if u.match.startswith("group")]
    primary = diag.forward or diag.backward
    return {
        "schema": SCHEMA,
        "mode": result.mode,
        "npu_json_path": result.npu.json_path if result.npu else None,
        "bench_json_path": result.bench.json_path if result.bench else None,
        "bench2_json_path": bench2_path,
        "matching": result.matching,
        "error_measure": diag.error_measure,
        "rows": {"total": result.n_rows, "pass": counts.get("pass", 0),
                 "warning": counts.get("warning", 0), "error": counts.get("error", 0)},
        "calls": {"total": len(diag.calls), **{k: status.get(k, 0) for k in
                  ("clean", "introduces", "inherits", "unmatched", "not compared")}},
        "unmatched": {"npu": [u.npu_entry for u in diag.calls if u.status == "unmatched" and u.npu_entry],
                      "bench": [u.bench_entry for u in diag.calls
                                if u.status == "unmatched" and not u.npu_entry]},
        "groups": _groups(result, groups),
        "first_divergence": {
            "name": primary.call.name if primary else None,
            "direction": primary.call.direction if primary else None,
            "forward": _divergence(result, diag.forward, stack),
            "backward": _divergence(result, diag.backward, stack)},
        "suspects": [dict(call_record(result, u, stack), rank=k + 1, score=_num(u.score))
                     for k, u in enumerate(diag.suspects)],
        "notes": list(result.notes),
    }


def write(path: str, summary: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1, allow_nan=False)
