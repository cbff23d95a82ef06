"""Entry points: msprobe's ``compare(input_param, output_path, ...)`` and a directory-tree
``compare_distributed`` (a whole run: see run.py).  Both return the paths they wrote."""
from __future__ import annotations

import logging
import os

from probe import console_log, process_end

from .options import DEFAULT, CompareOptions, resolve_options
from .pair_job import compare_pair
from probe.errors import ConfigError
from probe.untrusted import inside

log = logging.getLogger(__name__)
_DEFAULTS = DEFAULT.keywords()


def param_path(d: dict, *keys):
    """The first of ``keys`` that ``d`` gives: a path, so a string (ConfigError for anything else)."""
    for k in keys:
        if d.get(k):
            if not isinstance(d[k], str):
                raise ConfigError(f"{k} must be a path (a string), got {type(d[k]).__name__}")
            return d[k]
    return None


def compare(dump_result_param: dict, output_path: str, stack_mode: bool = False,
            auto_analyze: bool = True, fuzzy_match: bool = False, align: bool | None = None,
            html: bool = True, *, options: CompareOptions | None = None, tag: str = "",
            workers: int | None = None, progress: bool | None = None, **keywords) -> list:
    """Compare one NPU dump.json with one bench dump.json; write xlsx, csv and
    compare_summary json; return their paths.

    ``dump_result_param``: {"npu_json_path", "bench_json_path", "stack_json_path",
    "bench2_json_path", "is_print_compare_log"} (msprobe 8.x's ``npu_path`` /
    ``bench_path`` / ``stack_path`` spellings are accepted too). ``bench2_json_path``, a
    second bench dump of the same program, gives each call's run-to-run noise.
    ``align``: None aligns the call sequences when they differ, True always, False pairs
    by name (msprobe); ``fuzzy_match`` pairs the k-th call of each API. ``auto_analyze``
    adds the diagnosis (first divergence, Diagnosis sheet, summary json). ``html``
    also writes the self-contained page ``compare_report_*.html``; ``replay=False`` judges
    calls by their jump instead of re-running them. ``options``: all of these as one
    ``CompareOptions`` (options.py) instead. ``is_print_compare_log``
    (default True) logs the answer at INFO, shown on stderr where logging is not configured.
    An unknown keyword is a ConfigError naming it.
    """
    given = {k: v for k, v in (("stack_mode", stack_mode), ("auto_analyze", auto_analyze),
                               ("fuzzy_match", fuzzy_match), ("align", align), ("html", html))
             if v != _DEFAULTS[k]}
    options = resolve_options("compare", options, {**given, **keywords}, ("options", "tag", "workers", "progress"))
    if not isinstance(dump_result_param, dict):
        raise ConfigError("dump_result_param must be a dict with npu_json_path and bench_json_path")
    npu = param_path(dump_result_param, "npu_json_path", "npu_path")
    bench = param_path(dump_result_param, "bench_json_path", "bench_path")
    stack = param_path(dump_result_param, "stack_json_path", "stack_path")
    if not npu or not bench:
        raise ConfigError("dump_result_param needs npu_json_path and bench_json_path")
    for p in (npu, bench):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"dump.json not found: {p}")
    if stack is None:       # the NPU dump's own: read only inside its folder (a symlink out: refused)
        guess = os.path.join(os.path.dirname(npu), "stack.json")
        stack = inside(os.path.dirname(os.path.abspath(npu)), "stack.json", "stack.json") \
            if os.path.lexists(guess) else None
    bench2 = param_path(dump_result_param, "bench2_json_path", "bench2_path")
    if bench2 and not os.path.isfile(bench2):
        raise FileNotFoundError(f"dump.json not found: {bench2}")
    verbose = dump_result_param.get("is_print_compare_log", True)
    pr = compare_pair(npu, bench, output_path, options, tag=tag, stack_json=stack, bench2_json=bench2,
                      workers=workers, progress=verbose if progress is None else progress)
    process_end.keep(pr)        # the probe program ends with this: nothing to free (process_end)
    if verbose:
        from .report import console_summary
        console_log.show_info()
        result = pr.result
        first, *rest = console_summary(result, pr.summary, pr.paths)
        log.info("[probe compare] %s", first)           # what to open next, first
        for note in result.notes:
            log.info("[probe compare] %s", note)
        for line in rest:
            log.info("[probe compare] %s", line)
    return pr.paths


def compare_distributed(npu_dir: str, bench_dir: str, output_path: str, *,
                        bench2_dir: str | None = None, executor=None, scheduler: str | None = None,
                        processes: int | None = None, verbose: bool = True, **kwargs) -> list:
    """Compare every step*/rank* dump pair of two dump trees and answer for the whole run.

    Writes each pair's files (tagged ``step1_rank0``), ``compare_summary.json`` for the
    run (schema ``probe.run_summary/1``: the first divergence across steps and ranks,
    the steps x ranks grid) and ``compare_run_{timestamp}.xlsx``; returns the pairs'
    paths and the run workbook's. ``rank``, ``rankN`` and ``procN`` directories are
    accepted; a single dump on each side pairs whatever its directory is called; dumps on
    one side only are named in the summary. Pairs run in local worker processes
    (``processes``, default one per core), or on Dask: ``scheduler`` (an address) or
    ``executor`` (e.g. ``Client(...).get_executor()``). Safe to call from a script without
    an ``if __name__ == "__main__":`` guard. ``compare_run`` returns the summary too.
    ``verbose`` logs the run's answer as ``compare`` does.
    """
    from .run import compare_run
    from .run_report import answer_lines
    run = compare_run(npu_dir, bench_dir, output_path, bench2_root=bench2_dir, executor=executor,
                      scheduler=scheduler, processes=processes, **kwargs)
    if verbose:
        console_log.show_info()
        page = next((p for p in run.paths if os.path.basename(p) == "compare_run.html"), None)
        book = next((p for p in run.paths if os.path.basename(p).startswith("compare_run_")), None)
        log.info("[probe compare] open %s", f"{page} (the run's page; the grid links each pair's page)"
                 if page else f"{book} (the run's workbook)")
        for line in answer_lines(run.summary):
            log.info("[probe compare] %s", line)
    return run.paths
