"""A compare's rows as a typed pandas DataFrame, for notebooks.

    from probe.compare import read_results
    df = read_results("out")                 # the newest compare_result_*.csv in "out"
    df[df.Result == "error"].sort_values("Err/Tolerance", ascending=False)

The CSV holds msprobe's columns and ours as text; here numbers are float64 (empty cells
NaN; "inf" as infinity), the Requires_grad columns nullable booleans, and Result,
Direction, Tolerance Dtype and Match categories, so filters and sorts work as they read.
"""
from __future__ import annotations

import glob
import math
import os

from probe.vocabulary import BASE_COLUMNS, BOOLEAN_COLUMNS, MD5_COLUMNS, NUMBER_COLUMNS
from probe.errors import ConfigError
CATEGORIES = ["Result", "Direction", "Tolerance Dtype", "Match"]


def _number(text: str) -> float:
    """A CSV field as a float: "inf" -> inf, "unsupported" -> NaN. (pandas' own parser is
    not correctly rounded for long positional texts such as newer orjson writes.)"""
    try:
        return float(text)
    except ValueError:
        return math.nan


def read_results(path: str):
    """The rows of one compare: ``path`` is a compare_result_*.csv, or a folder whose
    newest one is read. ValueError naming the path when there is none."""
    import pandas as pd
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "compare_result_*.csv")), key=os.path.getmtime)
        if not found:
            raise ConfigError(f"{path}: no compare_result_*.csv in this folder")
        path = found[-1]
    if not path.endswith(".csv") or not os.path.isfile(path):
        raise ConfigError(f"{path}: not a compare_result_*.csv file")
    df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    for col in df.columns:
        if col in NUMBER_COLUMNS:   # Python's float(): correctly rounded for any spelling ("0.0000109...")
            df[col] = df[col].map(_number, na_action="ignore").astype("float64")
        elif col in BOOLEAN_COLUMNS:
            df[col] = df[col].map({"True": True, "False": False}).astype("boolean")
        elif col in CATEGORIES:
            df[col] = df[col].astype("category")
        elif col in BASE_COLUMNS or col in MD5_COLUMNS or col in ("Err_message", "NPU_Stack_Info", "Data_name"):
            df[col] = df[col].astype("string")
    return df
