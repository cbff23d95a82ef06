"""compare_summary.json: the diagnosis in a form a script or CI job can read.

Schema "probe.compare_summary/1" (docs/formats.md, "compare_summary.json"). JSON has no NaN or
Infinity: a missing number is null, an infinite one the string "inf".
"""
from __future__ import annotations

import json
import math
from collections import Counter
from operator import attrgetter

import numpy as np

from .causality import cant_tell_text
from .diagnosis import N_STATE
from .engine import load_stacks
from .dump_tree import step_of
from .xlsx.cells import code_array
from probe.vocabulary import SUMMARY_METRICS, forward_of

SCHEMA = "probe.compare_summary/1"


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
        if not entry or not self.stacks:
            return None
        s = self.stacks.get(entry)
        if s is None:
            forward = forward_of(entry)
            s = self.stacks.get(forward) if forward else None
        return s


def call_record(result, u, stack) -> dict:
    """One call of the diagnosis as a dict (what the JSON, console and Summary show)."""
    cols = result.columns
    rec = {"npu_name": u.npu_entry, "bench_name": u.bench_entry, "direction": u.direction,
           "position": u.index, "match": u.match, "status": u.status,
           "input_error": _num(u.input_error), "output_error": _num(u.output_error),
           "jump": _num(u.jump), "threshold": _num(u.threshold), "noise": _num(u.noise),
           "noise_input": _num(u.noise_in),
           "module": u.module, "stack": stack(u.npu_entry) or stack(u.bench_entry),
           "phase": u.phase or ("backward" if u.direction == "backward" else "forward"),
           "reason": u.reason or None}
    if u.local is not None:
        le = u.local
        rec["local"] = {"error": _num(le.local), "correct_kernel": _num(le.reference),
                        "rounding": le.rounding, "allowed": _num(le.allowed),
                        "ratio": _num(le.ratio), "scale": _num(le.bias),
                        "scale_spread": _num(le.bias_spread)}
    if u.worst_row is not None:
        i = u.worst_row
        keys = SUMMARY_METRICS["tensor" if result.mode == "tensor" else "statistics"]
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
    rec["unmatched_before"] = [c.name for c in d.candidates]
    return rec


def _state(state, step) -> dict | None:
    """Weights / optimizer state / data read from outside the step, where they differ."""
    if state is None:
        return None
    differ = bool(state.differing)
    since = f" since step {step - 1}" if differ and step else ""
    return {"differ": differ, "compared": state.compared, "differing": len(state.differing),
            "max_error": _num(state.max_error),
            "largest": [{"row": o.row, "shape": list(o.shape) if o.shape is not None else None,
                         "error": _num(o.error), "module": o.module} for o in state.differing[:N_STATE]],
            "text": (f"weights, optimizer state or data read from outside this step differ{since}: "
                     f"{len(state.differing)} of {state.compared} such inputs, largest relative "
                     f"difference {state.max_error:.3g} ({state.differing[0].row})") if differ else
                    f"the {state.compared} inputs read from outside this step (weights, optimizer "
                    f"state, data) agree"}


def _drift(drift) -> dict | None:
    if drift is None:
        return None
    def call(u):
        if u is None:
            return None
        return {"name": u.name, "output_error": _num(u.output_error), "input_error": _num(u.input_error),
                "growth": _num(u.output_error / u.input_error) if u.input_error else None}
    return {"forward": _num(drift.forward), "backward": _num(drift.backward),
            "largest": call(drift.largest), "grows_fastest": call(drift.fastest)}


STATUSES = ("clean", "introduces", "inherits", "unmatched", "not compared", "draw", "can't tell")


NOT_JUDGED = "not judged"     # how a verdict that could not say "no API introduces error" starts


def verdict_text(diag, primary) -> str:
    """The answer of the compare, in one sentence: the culprit, or that there is none and
    what explains the differences (the draws, the NPU side's measured precision, the dtype).
    "No API introduces error" only where enough was compared to say it (coverage.py):
    otherwise what was not compared and why, then what the calls compared showed."""
    parts = []
    d = diag.draws
    gaps = [g.text for g in diag.coverage.gaps] if getattr(diag, "coverage", None) is not None else []
    if d is not None and d.differ:
        parts.append(f"the two runs drew different random numbers from {d.first_differing} on "
                     f"({d.differ} of {d.calls} random calls differ; each is checked against its law instead)")
    if primary is not None:       # the culprit first: that is the answer
        u = primary.call
        where = f" in {u.module}" if u.module else ""
        return "; ".join([f"{u.name}{where} introduces error: {u.reason}"] + parts + gaps)
    dtype = diag.low_precision or "the dtypes compared"
    explains = f"{dtype} and the NPU side's measured precision" if diag.device else dtype
    if any(u.declared and u.output_error is not None and u.output_error > u.tolerance for u in diag.calls):
        explains += " and the TF32/HF32 precision the runs declared (math_modes)"
    # a call statistics could not judge is no clean call: said, with the first of them
    unsure = [u for u in diag.calls if u.status == "can't tell"]
    caveat = []
    if unsure:
        first = unsure[0]
        caveat.append(f"{cant_tell_text(len(unsure), first.name, first.reason)}; "
                      f"dump tensors to judge {'them' if len(unsure) > 1 else 'it'}")
    if gaps:
        compared = diag.coverage.compared
        seen = ([f"among the {compared} call{'s' if compared > 1 else ''} compared none "
                 f"{'is shown to introduce' if unsure else 'introduces'} error beyond what {explains} explains"]
                if compared else [])
        return "; ".join([f"{NOT_JUDGED}: {gaps[0]}"] + gaps[1:] + parts + seen + caveat)
    if unsure:
        return "; ".join(parts + [f"no API is shown to introduce error beyond what {explains} explains"] + caveat)
    return "; ".join(parts + [f"no API introduces error beyond what {explains} explains"])


def judged(diag) -> dict | None:
    """What the verdict rests on: the calls compared, and each reason it could not judge."""
    cov = getattr(diag, "coverage", None)
    if cov is None:
        return None
    return {"complete": cov.judged, "calls": cov.calls, "npu_calls": cov.npu_calls,
            "bench_calls": cov.bench_calls, "paired": cov.paired, "compared": cov.compared,
            "not_compared": [{"kind": g.kind, "text": g.text} for g in cov.gaps]}


def _dumps(diag) -> dict | None:
    """Whether each side's dump.json finished (probe's marker; null where it has none)."""
    cov = getattr(diag, "coverage", None)
    if cov is None:
        return None
    return {name: None if st is None else {"entries": st.entries, "complete": st.complete,
                                             "truncated": st.truncated}
            for name, st in (("npu", cov.npu), ("bench", cov.bench))}


def _groups(result, groups) -> list:
    """Entries of each group on each side, in call order."""
    if not groups:
        return []
    pos: list = [{}, {}]
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
    levels, level_of = code_array(cols["Result"])      # 350k rows counted in C, not a Counter's step each
    counts = dict(zip(levels, np.bincount(level_of, minlength=len(levels)).tolist()))
    status = Counter(map(attrgetter("status"), diag.calls))
    groups = [u for u in diag.calls if u.match.startswith("group")]
    primary = diag.forward or diag.backward
    step = step_of(result.npu.json_path) if result.npu else None
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
        "calls": {"total": len(diag.calls), **{k: status.get(k, 0) for k in STATUSES}},
        "unmatched": {"npu": [u.npu_entry for u in diag.calls if u.status == "unmatched" and u.npu_entry],
                      "bench": [u.bench_entry for u in diag.calls
                                if u.status == "unmatched" and not u.npu_entry]},
        "groups": _groups(result, groups),
        "verdict": verdict_text(diag, primary),
        "judged": judged(diag),
        "dumps": _dumps(diag),
        "replayed_calls": diag.replayed,
        "draws": None if diag.draws is None else {
            "calls": diag.draws.calls, "differ": diag.draws.differ,
            "first_differing": diag.draws.first_differing, "not_checked": diag.draws.unjudged},
        "math_modes": {"npu": result.npu.meta.math_modes if result.npu else None,
                       "bench": result.bench.meta.math_modes if result.bench else None},
        "device_precision": [{"api": p.api, "calls": p.calls, "typical_error": _num(p.typical_error),
                              "typical_excess": _num(p.typical_excess), "text": p.text} for p in diag.device],
        "first_divergence": {
            "name": primary.call.name if primary else None,
            "direction": primary.call.direction if primary else None,
            "forward": _divergence(result, diag.forward, stack),
            "backward": _divergence(result, diag.backward, stack)},
        "inputs_differ": _divergence(result, diag.inputs_differ, stack),
        "state": _state(diag.state, step),
        "drift": _drift(diag.drift),
        "suspects": [dict(call_record(result, u, stack), rank=k + 1, score=_num(u.score))
                     for k, u in enumerate(diag.suspects)],
        "notes": list(result.notes) + _limits(result, diag),
    }


def _limits(result, diag) -> list:
    """What this compare could not judge, said once."""
    notes = []
    if result.mode != "tensor":
        notes.append("statistics mode: calls are judged from Max/Min/Mean/Norm alone; an error "
                     "these four numbers do not show, or one within the dtype's rounding of them "
                     f"({'bf16: ~1%' if diag.low_precision else 'fp32: ~1e-4'}), is not seen; a "
                     "tensor dump re-runs each call on its own inputs and sees such errors")
    if result.mode != "tensor" and diag.draws is not None and diag.draws.differ:
        notes.append(f"the two runs drew different random numbers from {diag.draws.first_differing} on: in "
                     "statistics mode every call after it sees inputs that differ, and a fault there is "
                     "\"can't tell\" at best; dump tensors (each call is then re-run on its own inputs) or "
                     "give the bench the NPU run's draws (random_from)")
    if diag.paths_differ:
        notes.append(f"the two runs took different data-dependent paths from {diag.paths_differ} on (its output "
                     "has another number of elements on each side: tokens routed to other experts, a mask of another size): in "
                     "statistics mode the calls after it are \"can't tell\" at best; dump tensors to judge them")
    if diag.draws is not None and diag.draws.unjudged:
        notes.append(f"{len(diag.draws.unjudged)} random calls draw inside their kernel and were not checked "
                     f"(first: {diag.draws.unjudged[0]}); for a check run use eager attention or dropout_p=0")
    if result.mode == "tensor" and diag.replayed == 0 and any(u.output_error for u in diag.calls):
        notes.append("no call could be re-run from the dump's files: calls judged by their jump")
    return notes


def write(path: str, summary: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1, allow_nan=False)
