"""One step/rank pair of a run: compare, report, digest; the unit of work of a whole-run
compare, run in a worker process (local pool or Dask), so it lives here, in the library:
a worker imports probe, never the user's script.

The worker writes the pair's own files (xlsx, csv, compare_summary json, its Parquet
part) and sends back only a small ``PairOutcome``: what the run-level answer needs (the
pair's first divergence placed among the collectives, and the collective calls), not its
rows, so a run of thousands of ranks gathers kilobytes per pair.
"""
from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .causality import Timeline, epochs, timeline
from .options import DEFAULT, CompareOptions

if TYPE_CHECKING:            # numpy and the engine load in the worker, when a pair runs
    from .diagnosis import Diagnosis
    from .engine import CompareResult
    from .merged_pair import MergeJob

log = logging.getLogger(__name__)


@dataclass
class PairResult:
    """A compare of one pair in this process: the paths written, the diagnosis, the digest."""
    paths: list
    result: CompareResult
    diagnosis: Diagnosis | None      # None without auto_analyze
    summary: dict | None             # the pair's compare_summary dict


def compare_pair(npu_json: str, bench_json: str, output_path: str, options: CompareOptions = DEFAULT, *,
                 tag: str = "", stack_json: str | None = None, bench2_json: str | None = None,
                 workers: int | None = None, progress: bool = False, merged=None) -> PairResult:
    """Compare one NPU dump.json with one bench dump.json and write its report.

    ``options``: what pairs, what is concluded, what is written (options.py);
    ``progress``: a bar naming the stage (shown from 2 s on); ``merged``: a
    merged_pair.MergedPair when a side is several ranks merged (its rows that can't be
    told, and the rank whose shard differs)."""
    matching, analysis, output = options.matching, options.analysis, options.output
    import contextlib
    import json

    from .diagnosis import diagnose, mark_rows, noise_floor
    from .engine import compare_dumps
    from .heap import give_back_free_heap
    from .reader import gc_paused
    from .report import write_report
    bar = stage_bar() if progress else None

    def stage(name):           # shown from 2 s on (update respects the delay, refresh not)
        if bar is not None:
            bar.set_description(f"compare: {name}", refresh=False)
            bar.update(0)
    # millions of live containers, next to no cycles: see engine
    with gc_paused(), bar if bar is not None else contextlib.nullcontext():
        result = compare_dumps(npu_json, bench_json, stack_json, stack_mode=output.stack_mode,
                               fuzzy_match=matching.fuzzy_match, workers=workers, progress=progress,
                               align=matching.align, stage=stage)
        if merged is not None:
            merged.before_diagnosis(result)
        diag = None
        if analysis.auto_analyze:
            noise = noise_floor(bench_json, bench2_json, workers=workers, align=matching.align) if bench2_json else None
            stage("diagnosis")
            diag = diagnose(result, noise, replay=analysis.replay, progress=progress)
            result.table_rows = result.table_codes = None    # (the diagnosis's: given back with its temporaries below)
            if merged is not None:
                merged.after_diagnosis(result, diag)
            mark_rows(result, diag)      # the rows say what the diagnosis found
            give_back_free_heap()        # its temporaries' pages: not under the report's peak
        result.table_rows = result.table_codes = None    # (without a diagnosis too: not held under the report's peak)
        paths = write_report(result, output_path, tag, diag, bench2_json, html=output.html, progress=bar)
    summary = None
    if analysis.auto_analyze:
        with open(paths[-1], encoding="utf-8") as fh:
            summary = json.load(fh)
    return PairResult(paths, result, diag, summary)


def stage_bar():
    """The compare's progress bar, naming the stage, where stderr is a terminal; None
    where it is a file or a pipe (a CI log, a script's capture), which would only collect
    the bar's frames, and then tqdm is not imported either (~30 ms of the command)."""
    import sys
    try:
        terminal = sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):      # no stderr (pythonw: None), a closed one
        terminal = False
    if not terminal:
        return None
    from tqdm import tqdm
    return tqdm(total=None, desc="compare: reading", unit=" rows", delay=2.0, file=sys.stderr, leave=False)


@dataclass
class PairJob:
    """What a worker needs for one pair (plain data: pickled to local or Dask workers)."""
    key: tuple                        # (step dir, rank id) as layout.find_dumps gives them
    step: int
    rank: int
    npu_json: str
    bench_json: str
    output_path: str
    tag: str
    bench2_json: str | None = None
    options: CompareOptions = DEFAULT
    parquet_dir: str | None = None    # the run's diagnosis.parquet dataset, or None
    merge: MergeJob | None = None     # ranks merged before the compare


@dataclass
class PairOutcome:
    """What comes back from a worker."""
    key: tuple
    step: int
    rank: int
    paths: list = field(default_factory=list)
    report: str | None = None         # the pair's compare_summary json
    html: str | None = None           # the pair's page, when one was written
    timeline: Timeline | None = None
    notes: list = field(default_factory=list)
    error: str | None = None          # why the pair failed (the run goes on)
    culprit: dict | None = None       # a merged pair's rank whose shard differs (merged_pair)
    seconds: float = 0.0
    host: str = ""


def lost_pair(job: PairJob, exc: BaseException) -> PairOutcome:
    """The outcome of a pair whose worker process died."""
    return PairOutcome(job.key, job.step, job.rank, error=f"worker lost ({type(exc).__name__}: {exc})")


def run_pair(job: PairJob) -> PairOutcome:
    """The worker function: never raises (a failed pair is one cell of the run's grid)."""
    import socket
    t0 = time.perf_counter()
    out = PairOutcome(job.key, job.step, job.rank, host=f"{socket.gethostname()}:{os.getpid()}")
    try:
        merged = job.merge.run() if job.merge is not None else None
        pr = compare_pair(job.npu_json, job.bench_json, job.output_path, job.options, tag=job.tag,
                          bench2_json=job.bench2_json, workers=1, progress=False, merged=merged)
        if merged is not None:
            out.culprit = merged.culprit_dict()
        out.paths = pr.paths
        if pr.summary is not None:
            out.report = pr.paths[-1]
            out.html = next((p for p in pr.paths if p.endswith(".html")), None)
            out.notes = list(pr.summary.get("notes") or [])
        if pr.diagnosis is not None:
            out.timeline = timeline(pr.diagnosis)
            if job.parquet_dir:
                from .parquet import write_calls
                try:
                    write_calls(job.parquet_dir, job.step, job.rank, pr.diagnosis.calls,
                                epochs(pr.diagnosis.calls))
                except ImportError as exc:
                    out.notes.append(str(exc))
    except Exception as exc:            # one bad pair must not end a run of thousands
        out.error = f"{type(exc).__name__}: {exc}"
        log.debug("pair %s failed:\n%s", job.key, traceback.format_exc())
    out.seconds = time.perf_counter() - t0
    return out
