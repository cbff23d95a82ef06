"""A whole inference run compared request by request, not step by step.

Two inference roots (steps with ``token_layout.json``): requests matched by prompt
(``tokens``), each request's rows gathered from every step of each run into a dump of its own
(``request_dump``), and each pair of those compared by the existing pipeline (``pair_job``:
align, diagnosis, replay, report), tagged ``request{N}``. The run's answer then says, per
request, the first generated token that differs and why:

- a call introduces error (the diagnosis' culprit): named with the request, the position of
  its first differing row and the NPU step that computed it;
- no call does, and a token flipped: the flip is said with the bench's logit margin there
  (a near tie rounded the other way), and nothing is blamed;
- neither: clean, when calls were compared.

Rows after a request's first differing token compute other inputs: only the positions up to
it are gathered (``tokens.Pair.judged``). Written to ``OUT/compare_summary.json`` (schema
``probe.run_summary/1`` with ``requests``) and the page ``OUT/compare_run.html``.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

import orjson

from . import tokens
from .layer_mapping import LayerMapping, load_mapping, project
from .options import CompareOptions
from .request_dump import Gathered, gather

log = logging.getLogger(__name__)

SCHEMA = "probe.run_summary/1"
SUMMARY = "compare_summary.json"
REQUESTS_DIR = "requests"


@dataclass
class RequestOutcome:
    """One request's compare: the pair's files and what the run's answer needs."""
    entry: dict                       # the request's entry of compare_summary.json
    paths: list
    step: Optional[int] = None        # the NPU step of its culprit's first differing row
    inputless: tuple = ()             # mapped entries with no input row (layer mapping)


def _differing_row(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> Optional[int]:
    """The first row whose difference is at least half the largest row's: where an error
    starts (rows after it inherit it through attention)."""
    if a is None or b is None or a.shape != b.shape or not len(a):
        return None
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = np.nanmax(np.abs(b64), axis=1) + 1e-30
    err = np.nanmax(np.abs(a64 - b64), axis=1) / scale
    err = np.where(np.isnan(err), np.inf, err)
    if not np.any(err > 0):
        return None
    return int(np.argmax(err >= 0.5 * np.max(err)))


def _margin(g: Gathered, position: int, vocab_floor: int, token: int) -> Optional[float]:
    """The bench's logit margin at ``position``: top-1 minus top-2 of the last gathered output
    that holds that row and is as wide as the vocabulary (lm_head's), when its top-1 is the
    bench's token; None when not dumped (statistics dumps hold no logits)."""
    for name in reversed(list(g.origin)):
        key = f"{name}.output.0"
        positions = g.positions.get(key)
        if not positions or position not in positions or key in g.row_stats:
            continue
        rows = g.rows_of(key)
        if rows is None or rows.ndim != 2 or rows.shape[1] <= vocab_floor:
            continue
        row = rows[positions.index(position)].astype(np.float64)
        if int(np.argmax(row)) != token:
            return None
        top = np.sort(row)[-2:]
        return float(top[1] - top[0])
    return None


def _same_precision(result) -> bool:
    """Whether every paired row has one dtype on both sides (a run against itself batched
    otherwise): then any difference at all is the batch's."""
    cols = result.columns
    return all(a == b for a, b in zip(cols["NPU Dtype"], cols["Bench Dtype"])
               if isinstance(a, str) and isinstance(b, str))


def batch_variant(diag, g_npu: Gathered, g_bench: Gathered) -> Optional[dict]:
    """The first call whose rows for this request differ at all between the two runs while
    its inputs' rows agree bit for bit: the kernel that is not batch-invariant (rows are in
    position order on both sides, so a reordering of the batch is no difference)."""
    for u in diag.calls:
        if not u.npu_entry or not u.bench_entry or u.status in ("unmatched", "not compared"):
            continue
        inputs = [k[len(u.npu_entry):] for k in g_npu.positions
                  if k.startswith(u.npu_entry + ".input.") and u.bench_entry + k[len(u.npu_entry):] in g_bench.positions]
        same_in = True
        for suffix in inputs:
            a, b = g_npu.rows_of(u.npu_entry + suffix), g_bench.rows_of(u.bench_entry + suffix)
            if a is None or b is None or a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
                same_in = False
                break
        if not same_in or not inputs:
            continue
        key = ".output.0"
        a, b = g_npu.rows_of(u.npu_entry + key), g_bench.rows_of(u.bench_entry + key)
        if a is None or b is None or a.shape != b.shape or np.array_equal(a, b, equal_nan=True):
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        row = int(np.argmax(np.nanmax(diff, axis=1) > 0))
        positions, steps = g_npu.positions[u.npu_entry + key], g_npu.steps_at[u.npu_entry + key]
        return {"name": u.name, "position": positions[row], "step": steps[row],
                "largest_difference": float(np.nanmax(diff))}
    return None


def mapped(g: Gathered, mapping: LayerMapping, side: str) -> Tuple[Gathered, List[str]]:
    """A request's gathered dump reduced to the rows the layer mapping names, under the
    bench's module names (layer_mapping.py), written beside it as ``dump_mapped.json``; and
    the entries it maps an output of and no input."""
    with open(g.json_path, "rb") as fh:
        doc = orjson.loads(fh.read())
    p = project(doc.get("data") or {}, mapping, side)
    out = Gathered(os.path.join(os.path.dirname(g.json_path), "dump_mapped.json"), g.mode)
    for new, src in p.source_row.items():
        if src in g.positions:
            out.positions[new], out.steps_at[new] = g.positions[src], g.steps_at[src]
        if src in g.row_stats:
            out.row_stats[new] = g.row_stats[src]
        if src in g.files:
            out.files[new] = g.files[src]
    for target, name in p.source_entry.items():
        out.origin[target] = g.origin.get(name, [])
    doc["data"] = p.data
    with open(out.json_path, "wb") as fh:
        fh.write(orjson.dumps(doc))
    return out, p.inputless()


def _token_rank(side: tokens.Side) -> set:
    return {len(lay.token_shape) for lay in side.layouts.values()}


def compare_request(pair: tokens.Pair, npu: tokens.Side, bench: tokens.Side, output_path: str,
                    options: CompareOptions, tag: str, docs: Optional[tuple] = None,
                    mapping: Optional[LayerMapping] = None) -> RequestOutcome:
    """One request of each run gathered and compared (``docs``: each side's parsed dump.json
    files by step, shared by the run's requests; ``mapping``: only the rows it names are
    compared, as the bench's modules)."""
    from .pair_job import compare_pair
    limit = pair.judged()
    folder = os.path.join(output_path, REQUESTS_DIR, tag)
    shutil.rmtree(folder, ignore_errors=True)
    docs = docs or ({}, {})
    # a serving engine's flat token rows against HF's [batch, seq] ones: both as [n, ...]
    unit_seq = _token_rank(npu) == _token_rank(bench)
    g_npu = gather(npu, pair.npu, limit, os.path.join(folder, "npu"), docs[0], unit_seq)
    g_bench = g_logits = gather(bench, pair.bench, limit, os.path.join(folder, "bench"), docs[1], unit_seq)
    inputless: List[str] = []
    if mapping is not None:
        (g_npu, inputless), (g_bench, _) = mapped(g_npu, mapping, "npu"), mapped(g_bench, mapping, "bench")
    gen_npu, gen_bench = pair.npu.generated(), pair.bench.generated()
    flip = pair.first_differing_token()
    plen = len(pair.npu.prompt)
    entry: dict = {"request": pair.number, "npu_id": pair.npu.rid, "bench_id": pair.bench.rid,
                   "prompt_tokens": plen, "generated": {"npu": gen_npu, "bench": gen_bench},
                   "first_differing_token": flip, "tokens": None, "bench_margin": None,
                   "judged_positions": limit, "verdict": "not compared", "first": None,
                   "position": None, "step": None, "reason": None, "calls_compared": 0,
                   "report": None, "html": None}
    if flip is not None:
        entry["tokens"] = [gen_npu[flip], gen_bench[flip]]
        entry["bench_margin"] = _margin(g_logits, plen + flip - 1, max(gen_npu[flip], gen_bench[flip]),
                                        gen_bench[flip])
    pr = compare_pair(g_npu.json_path, g_bench.json_path, output_path, options, tag=tag)
    entry["report"] = pr.paths[-1] if pr.summary is not None else None
    entry["html"] = next((p for p in pr.paths if p.endswith(".html")), None)
    out = RequestOutcome(entry, list(pr.paths), inputless=tuple(inputless))
    diag = pr.diagnosis
    if diag is None:
        return out
    compared = sum(1 for u in diag.calls if u.status not in ("unmatched", "not compared"))
    entry["calls_compared"] = compared
    primary = diag.forward
    if primary is not None and primary.kind == "introduced":
        u = primary.call
        key_n, key_b = f"{u.npu_entry}.output.0", f"{u.bench_entry}.output.0"
        row = _differing_row(g_npu.rows_of(key_n), g_bench.rows_of(key_b))
        if row is None:
            row = 0
        positions, steps = g_npu.positions.get(key_n) or [], g_npu.steps_at.get(key_n) or []
        if row < len(positions):
            entry["position"], out.step = positions[row], steps[row]
        origin = dict(g_npu.origin.get(u.npu_entry or "") or [])
        entry.update(verdict="introduces", first=u.name, step=out.step, reason=u.reason or None,
                     step_name=origin.get(out.step) if out.step is not None else None,
                     direction=u.direction, kind=primary.kind)
    elif flip is not None and not compared:   # differing tokens, nothing judged before them
        entry["reason"] = (f"request {pair.number}, token {flip}: {gen_npu[flip]} vs {gen_bench[flip]}; "
                           "no call was compared, so what made them differ is not judged")
    elif flip is not None:
        m = entry["bench_margin"]
        dtype = diag.low_precision or "the dtypes'"
        entry.update(verdict="flip", position=plen + flip - 1, reason=(
            f"request {pair.number}, token {flip}: {gen_npu[flip]} vs {gen_bench[flip]}, bench margin "
            + (f"{m:.3g}" if m is not None else "unknown (the bench's logits were not dumped as tensors)")
            + f": {dtype} rounding (no call introduces error before it)"))
    elif compared:
        entry["verdict"] = "clean"
    if entry["verdict"] in ("clean", "flip") and _same_precision(pr.result):
        entry["batch_variant"] = batch_variant(diag, g_npu, g_bench)
    return out


def compare_requests(npu_root: str, bench_root: str, output_path: str, options: CompareOptions,
                     unused: Optional[list] = None, layer_mapping: Optional[str] = None):
    """Compare two inference roots request by request, in this process; returns
    (summary, summary path, paths written). ``unused``: the run options given that do not
    apply here (said in the notes); ``layer_mapping``: a layer mapping file
    (layer_mapping.py), for two runs whose modules are named otherwise (vLLM against
    transformers)."""
    t0 = time.perf_counter()
    mapping = load_mapping(layer_mapping) if layer_mapping else None   # a bad file: one line, before any work
    npu_root, bench_root = os.path.abspath(npu_root), os.path.abspath(bench_root)
    output_path = os.path.abspath(output_path)
    os.makedirs(output_path, exist_ok=True)
    npu_sides, bench_sides = tokens.read_sides(npu_root), tokens.read_sides(bench_root)
    notes: list = [f"{k} not used: inference roots are compared request by request, in this process"
                   for k in unused or ()]
    ranks = sorted(set(npu_sides) & set(bench_sides))
    sources = sorted({lay.source for sides in (npu_sides, bench_sides) for side in sides.values()
                      for lay in side.layouts.values()})
    if len(sources) > 1 and mapping is None:
        notes.append(f"the runs come from different engines ({', '.join(sources)}): their calls are named "
                     "otherwise and few pair; --layer-mapping FILE compares the modules both models have, "
                     "per token (docs/inference.md)")
    for side, sides, other in (("NPU", npu_sides, bench_sides), ("bench", bench_sides, npu_sides)):
        for r in sorted(set(sides) - set(other)):
            notes.append(f"only the {side} side has rank {r}: not compared")
    outcomes: list = []
    unmatched: dict = {"npu": [], "bench": []}
    for rank in ranks:
        npu, bench = npu_sides[rank], bench_sides[rank]
        pairs, lone_npu, lone_bench = tokens.match(npu.requests, bench.requests)
        number = {id(req): k for k, req in enumerate(npu.requests)}
        for req in lone_npu:
            unmatched["npu"].append({"request": number[id(req)], "id": req.rid, "rank": rank, "prompt": req.prompt})
        for req in lone_bench:
            unmatched["bench"].append({"id": req.rid, "rank": rank, "prompt": req.prompt})
        docs: tuple = ({}, {})
        for pair in pairs:
            tag = f"request{pair.number}" + (f"_rank{rank}" if len(ranks) > 1 else "")
            try:
                o = compare_request(pair, npu, bench, output_path, options, tag, docs, mapping)
            except Exception as exc:       # one request must not end the run's answer
                log.debug("request %s failed:\n%s", pair.number, traceback.format_exc())
                o = RequestOutcome({"request": pair.number, "npu_id": pair.npu.rid, "bench_id": pair.bench.rid,
                                    "verdict": "failed", "reason": f"{type(exc).__name__}: {exc}",
                                    "first_differing_token": pair.first_differing_token()}, [])
            o.entry["rank"] = rank
            outcomes.append(o)
    for side, lone in unmatched.items():
        for r in lone:
            notes.append(f"the {'NPU' if side == 'npu' else 'bench'} run's request {r['id']} (rank {r['rank']}, "
                         f"prompt of {len(r['prompt'])} tokens) has no request with its prompt in the other run: "
                         "not compared")
    if not outcomes:
        notes.append("no request of one run has its prompt in the other: nothing compared")
    inputless = sorted({n for o in outcomes for n in o.inputless})
    if inputless:
        notes.append(f"layer mapping {layer_mapping}: no input of {', '.join(inputless[:5])}"
                     + (f" and {len(inputless) - 5} more" if len(inputless) > 5 else "")
                     + " is mapped: each is judged as if its inputs agreed (map an input row of it too)")
    summary = build_summary(npu_root, bench_root, outcomes, unmatched, ranks, notes)
    summary_path = os.path.join(output_path, SUMMARY)
    write_summary(summary_path, summary)
    paths = [p for o in outcomes for p in o.paths]
    if options.output.html:
        from .html_report import write_requests_page
        from .report import link_latest
        page = write_requests_page(summary, os.path.join(output_path, "compare_run.html"))
        paths.append(page)
        link_latest(page, os.path.join(output_path, "compare_report.html"))
    log.debug("inference run compared in %.1f s", time.perf_counter() - t0)
    return summary, summary_path, paths


def write_summary(path: str, summary: dict) -> None:
    """The run's compare_summary.json, written whole under a temporary name, then renamed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1, allow_nan=False)
    os.replace(tmp, path)


def build_summary(npu_root: str, bench_root: str, outcomes: list, unmatched: dict, ranks: list,
                  notes: list) -> dict:
    requests = [o.entry for o in outcomes]
    culprits = [o for o in outcomes if o.entry.get("verdict") == "introduces" and o.step is not None]
    first = None
    if culprits:
        o = min(culprits, key=lambda o: (o.step, o.entry["position"], o.entry["request"]))
        e = o.entry
        first = {"name": e["first"], "step": o.step, "rank": e["rank"], "request": e["request"],
                 "position": e["position"], "direction": e.get("direction"), "kind": e.get("kind"),
                 "reason": f"request {e['request']}, position {e['position']} (NPU step {o.step}"
                           + (f", {e['step_name']}" if e.get("step_name") else "") + ")"
                           + (f": {e['reason']}" if e.get("reason") else ""),
                 "report": e["report"], "html": e["html"]}
        others = sorted({x.entry["first"] for x in culprits if x is not o and x.entry["first"] != e["first"]})
        if others:
            notes.append(f"other requests name other calls: {', '.join(others[:10])}")
    variants = [e for e in requests if e.get("batch_variant")]
    invariance = None
    if variants:
        e = min(variants, key=lambda e: (e["batch_variant"]["step"], e["batch_variant"]["position"], e["request"]))
        v = e["batch_variant"]
        invariance = dict(v, request=e["request"], text=(
            f"{v['name']} is not batch-invariant: for request {e['request']} (position {v['position']}, "
            f"NPU step {v['step']}) it computes other bits from the same inputs in the two runs "
            f"(largest difference {v['largest_difference']:.3g}); every call before it agrees bit for bit"))
        notes.append(invariance["text"])
    for e in requests:
        if e.get("verdict") == "flip":
            notes.append(e["reason"])
        elif e.get("verdict") == "failed":
            notes.append(f"request {e['request']} failed: {e['reason']}")
    return {"schema": SCHEMA, "kind": "inference", "npu_root": npu_root, "bench_root": bench_root,
            "first_divergence": first, "requests": requests, "unmatched_requests": unmatched,
            "batch_invariance": invariance,
            "steps": [], "ranks": ranks, "grid": [], "unpaired": [], "notes": notes}


def answer_lines(summary: dict) -> list:
    """The run's answer as console lines."""
    reqs = summary["requests"]
    counts: dict = {}
    for e in reqs:
        counts[e["verdict"]] = counts.get(e["verdict"], 0) + 1
    lone = summary["unmatched_requests"]
    lines = [f"inference run: {len(reqs)} request(s) compared: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
             + (f"; unmatched: {len(lone['npu'])} NPU, {len(lone['bench'])} bench" if lone["npu"] or lone["bench"] else "")]
    fd = summary["first_divergence"]
    if fd is None:
        lines.append("first divergence: none (no request's call introduces error)")
    else:
        lines.append(f"first divergence: {fd['name']} ({fd['direction']}) at NPU step {fd['step']}, "
                     f"request {fd['request']}, position {fd['position']}: introduces error")
        if fd.get("reason"):
            lines.append(f"  why: {fd['reason']}")
        lines.append(f"  report: {fd['report']}")
    for e in reqs:
        if e.get("first_differing_token") is not None and e.get("tokens"):
            lines.append(f"request {e['request']}: first differing token {e['first_differing_token']} "
                         f"({e['tokens'][0]} vs {e['tokens'][1]})")
    for note in summary["notes"]:
        lines.append(f"note: {note}")
    return lines
