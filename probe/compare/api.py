"""Entry points: msprobe's ``compare(input_param, output_path, ...)`` and a directory-tree
``compare_distributed``.  Both return the paths they wrote."""
from __future__ import annotations

import os
import sys

from .layout import pair_dumps, tag_for


def _param(d: dict, *keys):
    for k in keys:
        if d.get(k):
            return d[k]
    return None


def compare(dump_result_param: dict, output_path: str, stack_mode: bool = False,
            auto_analyze: bool = True, fuzzy_match: bool = False, align: bool | None = None,
            html: bool = True, **kwargs) -> list:
    """Compare one NPU dump.json with one bench dump.json; write xlsx, csv and
    compare_summary json; return their paths.

    ``dump_result_param``: {"npu_json_path", "bench_json_path", "stack_json_path",
    "bench2_json_path", "is_print_compare_log"} (msprobe 8.x's ``npu_path`` /
    ``bench_path`` / ``stack_path`` spellings are accepted too). ``bench2_json_path``, a
    second bench dump of the same program, gives each call's run-to-run noise.
    ``align``: None aligns the call sequences when they differ, True always, False pairs
    by name (msprobe); ``fuzzy_match`` pairs the k-th call of each API. ``auto_analyze``
    adds the diagnosis (first divergence, Diagnosis sheet, summary json). ``html``
    also writes the self-contained page ``compare_report_*.html``.
    """
    from .diagnosis import diagnose, noise_floor
    from .engine import compare_dumps, gc_paused
    from .report import console_summary, write_report
    if not isinstance(dump_result_param, dict):
        raise ValueError("dump_result_param must be a dict with npu_json_path and bench_json_path")
    npu = _param(dump_result_param, "npu_json_path", "npu_path")
    bench = _param(dump_result_param, "bench_json_path", "bench_path")
    stack = _param(dump_result_param, "stack_json_path", "stack_path")
    if not npu or not bench:
        raise ValueError("dump_result_param needs npu_json_path and bench_json_path")
    for p in (npu, bench):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"dump.json not found: {p}")
    if stack is None:
        guess = os.path.join(os.path.dirname(npu), "stack.json")
        stack = guess if os.path.isfile(guess) else None
    bench2 = _param(dump_result_param, "bench2_json_path", "bench2_path")
    if bench2 and not os.path.isfile(bench2):
        raise FileNotFoundError(f"dump.json not found: {bench2}")
    verbose = dump_result_param.get("is_print_compare_log", True)
    workers = kwargs.get("workers")
    from tqdm import tqdm
    bar = tqdm(total=None, desc="compare: reading", unit=" rows", delay=2.0, file=sys.stderr,
               disable=not kwargs.get("progress", verbose), leave=False)

    def stage(name):           # shown from 2 s on (update respects the delay, refresh not)
        bar.set_description(f"compare: {name}", refresh=False)
        bar.update(0)
    with gc_paused(), bar:          # millions of live containers, next to no cycles: see engine
        result = compare_dumps(npu, bench, stack, stack_mode=stack_mode, fuzzy_match=fuzzy_match,
                               workers=workers, progress=kwargs.get("progress", verbose),
                               align=align, stage=stage)
        diag = None
        if auto_analyze:
            noise = noise_floor(bench, bench2, workers=workers, align=align) if bench2 else None
            diag = lambda: diagnose(result, noise)    # noqa: E731  (run beside the rows)
        paths = write_report(result, output_path, kwargs.get("tag", ""), diag, bench2, html=html,
                             progress=bar)
    if verbose:
        for note in result.notes:
            print(f"[probe compare] {note}", file=sys.stderr)
        digest = None
        if diag is not None:
            import json
            with open(paths[-1], encoding="utf-8") as fh:
                digest = json.load(fh)
        for line in console_summary(result, digest, paths):
            print(f"[probe compare] {line}", file=sys.stderr)
    return paths


def _one(job):
    key, npu, bench, output_path, kw = job
    return compare({"npu_json_path": npu, "bench_json_path": bench, "is_print_compare_log": False},
                   output_path, tag=tag_for(key) or "single", progress=False, workers=1, **kw)


def compare_distributed(npu_dir: str, bench_dir: str, output_path: str, **kwargs) -> list:
    """Compare every step*/rank* dump pair of two dump trees, in parallel processes.

    ``rank``, ``rankN`` and ``procN`` directories are accepted; a single dump on each side
    pairs whatever its directory is called.  Ranks present on one side only are reported.
    """
    pairs, unpaired = pair_dumps(npu_dir, bench_dir)
    for side, key in unpaired:
        print(f"[probe compare] only the {side} side has {'/'.join(k for k in key if k)}: skipped",
              file=sys.stderr)
    if not pairs:
        raise FileNotFoundError(f"no matching step/rank dumps between {npu_dir} and {bench_dir}")
    kw = {k: kwargs[k] for k in ("stack_mode", "fuzzy_match", "align", "auto_analyze", "html") if k in kwargs}
    jobs = [(key, a, b, output_path, kw) for key, a, b in pairs]
    procs = kwargs.get("processes") or min(len(jobs), os.cpu_count() or 1)
    paths = []
    if procs <= 1 or len(jobs) == 1:
        for job in jobs:
            paths.extend(_one(job))
        return paths
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    ctx = mp.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=procs, mp_context=ctx) as pool:
        for result in pool.map(_one, jobs):
            paths.extend(result)
    return paths
