"""Compare an NPU dump with a bench dump (this project's or msprobe's) into an Excel report.

Reads dump files only; never imports the dump side.  Modules, in data-flow order:
reader (stream dump.json) -> rows (flatten entries) -> match (pair rows) -> metrics /
tensors (numbers) -> verdict (pass/warning/error) -> engine (runs one compare) ->
report / xlsx (files) ; entry_points (compare, compare_distributed) and cli are the
entry points, options their one options object, dump_tree finds dump.json files in a
tree, results_dataframe reads a result CSV back; vocabulary (probe/) names rows and columns.
A whole run (two dump trees): run -> executor (local processes or Dask) -> pair_job (one
pair per worker: compare, report, parquet) -> causality (collectives order the ranks) ->
run summary + run_report (workbook). check_ranks: one run's collectives across ranks.
Two inference roots (steps with token_layout.json) are compared by request instead:
requests (run's answer) -> tokens (layouts read, requests matched by prompt) ->
request_dump (a request's rows of every step as a dump of its own) -> pair_job per request.
"""
import importlib

# public name -> module that defines it; imported on first use, so that ``probe compare
# --help`` (which imports this package) stays free of numpy and torch
_EXPORTS = {"compare": ".entry_points", "compare_distributed": ".entry_points", "compare_run": ".run",
            "check_ranks": ".check_ranks", "read_results": ".results_dataframe", "CompareOptions": ".options"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'probe.compare' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
