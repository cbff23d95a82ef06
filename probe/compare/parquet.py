"""The per-call diagnosis of every pair of a run as one Parquet dataset.

``OUT/diagnosis.parquet/step=S/rank=R/part-0.parquet``, hive-partitioned: each worker
writes its own pair's file (nothing goes through the parent), and pandas, DuckDB or Dask
read the folder as one table with ``step`` and ``rank`` columns:

    pandas.read_parquet("OUT/diagnosis.parquet")
    pandas.read_parquet("OUT/diagnosis.parquet", filters=[("rank", "=", 3)])

Needs pyarrow (``pip install probe[parquet]``).
"""
from __future__ import annotations

import os

from probe import lone_surrogates

DATASET = "diagnosis.parquet"
COLUMNS = ["index", "direction", "npu_entry", "bench_entry", "match", "module", "status",
           "input_error", "output_error", "tolerance", "epoch"]


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ImportError("diagnosis.parquet not written: pyarrow is missing "
                          "(pip install 'probe[parquet]')") from None
    return pyarrow, pyarrow.parquet


def partition(dataset_dir: str, step: int, rank: int) -> str:
    return os.path.join(dataset_dir, f"step={step}", f"rank={rank}")


def write_calls(dataset_dir: str, step: int, rank: int, calls, epochs: list | None = None) -> str:
    """One pair's calls (diagnosis.CallDiag) as ``step=S/rank=R/part-0.parquet``."""
    pa, pq = _pyarrow()
    calls = list(calls)
    if epochs is None:
        epochs = [None] * len(calls)

    def num(x):
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    def text(values):          # a lone surrogate (not Unicode) as U+FFFD, said once
        try:
            return pa.array(values, pa.string())
        except UnicodeEncodeError:
            lone_surrogates.say_replaced(os.path.dirname(os.path.abspath(dataset_dir)))
            return pa.array([lone_surrogates.replace(v) if type(v) is str else v for v in values], pa.string())
    table = pa.table({
        "index": pa.array([u.index for u in calls], pa.int64()),
        "direction": text([u.direction for u in calls]),
        "npu_entry": text([u.npu_entry for u in calls]),
        "bench_entry": text([u.bench_entry for u in calls]),
        "match": text([u.match for u in calls]),
        "module": text([u.module for u in calls]),
        "status": text([u.status for u in calls]),
        "input_error": pa.array([num(u.input_error) for u in calls], pa.float64()),
        "output_error": pa.array([num(u.output_error) for u in calls], pa.float64()),
        "tolerance": pa.array([num(u.tolerance) for u in calls], pa.float64()),
        "epoch": pa.array(epochs, pa.int64()),
    })
    folder = partition(dataset_dir, step, rank)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "part-0.parquet")
    tmp = f"{path}.{os.getpid()}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)          # a reader never sees half a file
    return path
