"""A whole run: every step/rank pair of two dump trees compared, and one answer.

Each pair is compared on its own (its own xlsx, csv, compare_summary json, Parquet part,
tagged ``step1_rank0``); the run's answer is then assembled from what the pairs sent
back: a steps x ranks grid of verdicts, corrected across ranks by the collectives
(causality), and the run's first divergence. Written to ``OUT/compare_summary.json``
(schema ``probe.run_summary/1``) and a run workbook with the grid.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field

from probe.errors import ConfigError

from .causality import first_of_run, judge_step
from .dump_tree import find_dumps, label, order, pair_dumps, rank_number, step_number, tag_for
from .options import CompareOptions, resolve_options
from .pair_job import PairJob, lost_pair, run_pair

log = logging.getLogger(__name__)

SCHEMA = "probe.run_summary/1"
SUMMARY = "compare_summary.json"
_RUN_KEYWORDS = ("bench2_root", "executor", "scheduler", "processes", "parquet", "layout", "layer_mapping",
                 "options")


@dataclass
class RunResult:
    summary: dict                      # the run summary (schema probe.run_summary/1)
    summary_path: str
    paths: list = field(default_factory=list)   # every pair's files, then the run workbook
    outcomes: list = field(default_factory=list)  # pair_job.PairOutcome per pair
    seconds: float = 0.0


def compare_run(npu_root: str, bench_root: str, output_path: str, *, bench2_root: str | None = None,
                executor=None, scheduler: str | None = None, processes: int | None = None,
                parquet: bool = True, layout: str | None = None, layer_mapping: str | None = None,
                options: CompareOptions | None = None, **keywords) -> RunResult:
    """Compare every step*/rank* pair of two dump trees and answer for the whole run.

    ``executor``: a ``concurrent.futures.Executor`` (e.g. a Dask client's
    ``get_executor()``); ``scheduler``: a Dask scheduler address; neither: local worker
    processes, ``processes`` of them (default one per core, at most one per pair).
    ``bench2_root``: a second bench run, paired by step/rank, for run-to-run noise.
    ``options``: what pairs, what is concluded, what is written (options.py), or the same as
    keywords (stack_mode, fuzzy_match, align, auto_analyze, replay, html, as ``compare``).
    ``layout``: a layout file (layout_file.py) for plain tensors sharded by hand; steps with
    another number of ranks on each side merge their ranks by layout (merged_pair.py).
    ``layer_mapping``: inference roots only: a layer mapping file (layer_mapping.py), which
    rows of the NPU run's modules are which of the bench's (vLLM against transformers).
    """
    t0 = time.perf_counter()
    options = resolve_options("compare_run", options, keywords, _RUN_KEYWORDS)
    from .tokens import is_inference_root
    if is_inference_root(npu_root) and is_inference_root(bench_root):
        # inference steps are never paired by number: request by request (requests.py)
        from .requests import compare_requests
        unused = [k for k, v in (("bench2_root", bench2_root), ("layout", layout), ("scheduler", scheduler),
                                 ("executor", executor)) if v]
        summary, summary_path, paths = compare_requests(npu_root, bench_root, output_path, options, unused=unused,
                                                        layer_mapping=layer_mapping)
        return RunResult(summary, summary_path, paths, [], time.perf_counter() - t0)
    if layer_mapping:
        raise ConfigError(f"layer mapping {layer_mapping}: applies to inference dumps (steps with token_layout.json); "
                          f"{npu_root} and {bench_root} are not both")
    npu_root, bench_root = os.path.abspath(npu_root), os.path.abspath(bench_root)
    output_path = os.path.abspath(output_path)
    from .merged_pair import plan_merges
    rules = None
    if layout:
        from .layout_file import load_layout_file
        rules = load_layout_file(layout)          # a bad file: one line, before any work
    plan = plan_merges(npu_root, bench_root, output_path, rules)
    notes = []
    merges = {}
    if plan is None:
        pairs, unpaired = pair_dumps(npu_root, bench_root)
        if rules is not None:
            notes.append(f"layout file {layout}: not used (every step has as many ranks on both sides)")
    else:
        pairs, unpaired, notes = [p[:3] for p in plan.pairs], plan.unpaired, list(plan.notes)
        merges = {p[0]: p[3] for p in plan.pairs if p[3] is not None}
    bench2 = {}
    if bench2_root:
        bench2 = find_dumps(bench2_root)
        if len(pairs) == 1 and len(bench2) == 1:
            bench2 = {pairs[0][0]: next(iter(bench2.values()))}
        lacking = [label(k) for k, _, _ in pairs if k not in bench2]
        if lacking:
            notes.append(f"bench2 has no dump for {', '.join(lacking[:20])}"
                         f"{' ...' if len(lacking) > 20 else ''}: compared without a noise floor there")
    for side, key in unpaired:
        other = "bench" if side == "npu" else "NPU"
        notes.append(f"only the {'NPU' if side == 'npu' else 'bench'} side has {label(key)} "
                     f"(no {other} dump): not compared")
    if not pairs:
        from .merged_pair import merge_hint
        raise FileNotFoundError(f"no step/rank dump is on both sides: {npu_root} vs {bench_root}"
                                f"{merge_hint(npu_root, bench_root)}")
    os.makedirs(output_path, exist_ok=True)
    dataset = None
    if parquet and options.analysis.auto_analyze:
        from .parquet import DATASET
        dataset = os.path.join(output_path, DATASET)
        shutil.rmtree(dataset, ignore_errors=True)      # a table of this run only
    single = len(pairs) == 1
    jobs = [PairJob(key, step_number(key), rank_number(key), a, b, output_path,
                    tag_for(key) or ("" if single else "single"), bench2.get(key),
                    options, dataset, merges.get(key))
            for key, a, b in pairs]
    from .executor import map_pairs
    outcomes = list(map_pairs(run_pair, jobs, executor=executor, scheduler=scheduler,
                              processes=processes, on_error=lost_pair))
    outcomes.sort(key=lambda o: order(o.key))
    summary = build_summary(npu_root, bench_root, outcomes, unpaired, notes)
    summary_path = os.path.join(output_path, SUMMARY)
    write_summary(summary_path, summary)
    paths = [p for o in outcomes for p in o.paths]
    from .run_report import write_run_workbook
    paths.append(write_run_workbook(summary, outcomes, output_path))
    if options.output.html:       # the run's page: the answer and the grid, linking the pairs
        from .html_report import write_run_page
        from .report import link_latest
        page = write_run_page(summary, os.path.join(output_path, "compare_run.html"))
        paths.append(page)
        # the folder's compare_report.html is the run's page (as compare_summary.json is the
        # run's summary), not the page of whichever pair finished last
        link_latest(page, os.path.join(output_path, "compare_report.html"))
    return RunResult(summary, summary_path, paths, outcomes, time.perf_counter() - t0)


def build_summary(npu_root: str, bench_root: str, outcomes: list, unpaired: list, notes: list) -> dict:
    by_step: dict = {}
    for o in outcomes:
        by_step.setdefault(o.step, {})[o.rank] = None if o.error else o.timeline
    cells = {}
    for step, timelines in by_step.items():
        for rank, cell in judge_step(timelines).items():
            cells[step, rank] = cell
    outcome_at = {(o.step, o.rank): o for o in outcomes}
    for o in outcomes:
        if o.error:
            notes.append(f"{label(o.key)} failed: {o.error}")
        elif o.timeline is None:
            notes.append(f"{label(o.key)}: compared without a diagnosis (auto_analyze off)")
    missing = {(step_number(k), rank_number(k)): side for side, k in unpaired}
    steps = sorted({s for s, _ in cells} | {s for s, _ in missing})
    ranks = sorted({r for _, r in cells} | {r for _, r in missing})
    grid = []
    for s in steps:
        for r in ranks:
            c, o = cells.get((s, r)), outcome_at.get((s, r))
            if c is None:
                grid.append({"step": s, "rank": r, "verdict": "missing", "first": None,
                             "report": None, "html": None})
                continue
            grid.append({"step": s, "rank": r, "verdict": c.verdict,
                         "first": c.mark.name if c.mark else None,
                         "reason": c.reason if c.verdict in ("not_compared", "cant_tell", "clean") and c.reason
                         else None,
                         "report": o.report if o else None, "html": o.html if o else None})
    first = None
    found = first_of_run(cells)
    if found is not None:
        (s, r), c = found
        o = outcome_at[s, r]
        heirs = sorted(r2 for (s2, r2), v in cells.items() if s2 == s and v.source == r)
        reason = c.reason + (f"; rank{'s' if len(heirs) > 1 else ''} {', '.join(map(str, heirs))} "
                             f"inherit{'' if len(heirs) > 1 else 's'} it through the collectives"
                             if heirs else "")
        first = {"name": c.mark.name, "step": s, "rank": r, "direction": c.mark.direction,
                 "kind": c.mark.kind, "reason": reason, "report": o.report, "html": o.html}
        if o.culprit and o.culprit.get("call") == c.mark.name:     # ranks merged: the shard's rank
            first.update(rank=o.culprit["ranks"][0], ranks=o.culprit["ranks"], rank_certain=o.culprit["certain"],
                         merged_ranks=o.culprit["merged_ranks"], reason=f"{reason}; {o.culprit['text']}")
        others = sorted((k, v) for k, v in cells.items()
                        if v.verdict == "introduces" and k != (s, r) and k[0] == s)
        for (s2, r2), v in others:
            notes.append(f"also introduces error at step {s2}, rank {r2}: {v.mark.name}")
        later = sorted({k[0] for k, v in cells.items() if k[0] > s and v.verdict != "clean"})
        if later:
            notes.append(f"step{'s' if len(later) > 1 else ''} {', '.join(map(str, later))} "
                         f"come{'' if len(later) > 1 else 's'} after the first divergence (step {s}): "
                         f"the differences there follow from it (weights differ since step {s})")
    return {"schema": SCHEMA, "npu_root": npu_root, "bench_root": bench_root,
            "first_divergence": first, "steps": steps, "ranks": ranks, "grid": grid,
            "unpaired": [{"side": side, "step": step_number(k), "rank": rank_number(k)}
                         for side, k in unpaired],
            "notes": notes}


def write_summary(path: str, summary: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1, allow_nan=False)
    os.replace(tmp, path)
