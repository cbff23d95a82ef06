"""Compare an NPU dump with a bench dump (this project's or msprobe's) into an Excel report.

Reads dump files only; never imports the dump side.  Modules, in data-flow order:
reader (stream dump.json) -> rows (flatten entries) -> match (pair rows) -> metrics /
tensors (numbers) -> verdict (pass/warning/error) -> engine (runs one compare) ->
report / xlsx (files) ; api and cli are the entry points, layout finds dump trees.
A whole run (two dump trees): run -> executor (local processes or Dask) -> pair_job (one
pair per worker: compare, report, parquet) -> causality (collectives order the ranks) ->
run summary + run_report (workbook). check_ranks: one run's collectives across ranks.
"""
from .api import compare, compare_distributed
from .check_ranks import check_ranks
from .frame import read_results
from .run import compare_run

__all__ = ["compare", "compare_distributed", "compare_run", "check_ranks", "read_results"]
