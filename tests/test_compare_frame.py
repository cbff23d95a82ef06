"""probe.compare.read_results: a compare's rows as a typed DataFrame, on a real model's dumps."""
import json

import openpyxl
import pandas as pd
import pytest
import torch

from models import make_gpt, train_step
from probe import PrecisionDebugger
from probe.compare import compare, read_results


def _dump(path, task, bf16):
    model, x, y = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = PrecisionDebugger(dump_path=str(path), task=task)
    try:
        dbg.start()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            train_step(model, opt, x, y)
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    return str(path / "step0" / "rank" / "dump.json")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_rows_come_back_typed_and_as_compared(tmp_path, task):
    npu, bench = _dump(tmp_path / "npu", task, True), _dump(tmp_path / "bench", task, False)
    paths = compare({"npu_json_path": npu, "bench_json_path": bench, "is_print_compare_log": False},
                    str(tmp_path / "out"), html=False)
    with open(paths[-1], encoding="utf-8") as fh:
        summary = json.load(fh)
    df = read_results(str(tmp_path / "out"))            # the folder: its newest result
    assert len(df) == summary["rows"]["total"]
    assert (df["Result"] == "error").sum() == summary["rows"]["error"]
    assert (df["Result"] == "warning").sum() == summary["rows"]["warning"]
    assert isinstance(df["Result"].dtype, pd.CategoricalDtype)
    assert df["NPU Requires_grad"].dtype == "boolean" and df["NPU Name"].dtype == "string"
    numbers = ["Cosine", "MaxAbsErr"] if task == "tensor" else ["Max diff", "MaxRelativeErr"]
    for col in numbers + ["NPU max", "Bench l2norm", "Err/Tolerance"]:
        assert df[col].dtype == "float64", col
    assert df["Bench l2norm"].notna().sum() > 50
    # the numbers are the workbook's, cell for cell
    ws = openpyxl.load_workbook(paths[0], read_only=True)["compare_result"]
    rows = ws.iter_rows(values_only=True)
    head = next(rows)
    sheet = pd.DataFrame(list(rows), columns=head)
    for col in ("NPU max", "Bench l2norm", "Err/Tolerance"):
        a, b = df[col].to_numpy(), pd.to_numeric(sheet[col], errors="coerce").to_numpy(dtype=float)
        assert ((a == b) | (pd.isna(a) & pd.isna(b)) | (abs(a - b) <= 1e-12 * abs(b))).all(), col
    assert read_results(paths[1]).equals(df)             # the CSV path itself


def test_a_path_without_results_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no compare_result_"):
        read_results(str(tmp_path))
    with pytest.raises(ValueError, match="not a compare_result"):
        read_results(str(tmp_path / "nothing.csv"))
