"""Compare msprobe's own dumps and check the numbers against msprobe's compare xlsx."""
import glob
import math
import os

import pandas as pd
import pytest
from conftest import needs_pt_loads

from probe.compare.engine import compare_dumps

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "msprobe")


def dump(name):
    return glob.glob(os.path.join(FIX, name, "step0", "*", "dump.json"))[0]


def reference(name):
    return pd.read_excel(os.path.join(FIX, "compare_reference", name, "reference.xlsx"))


def ours(npu, bench, **kw):
    r = compare_dumps(dump(npu), dump(bench), progress=False, workers=1, **kw)
    return r, pd.DataFrame(r.columns)


def _num(series):
    return pd.to_numeric(series.astype(str).str.rstrip("%"), errors="coerce")


def assert_close_columns(df, ref, columns, scale=None):
    merged = df.merge(ref, on="NPU Name", suffixes=("", "_ref"))
    assert len(merged) == len(ref)
    checked = 0
    for col in columns:
        a = pd.to_numeric(merged[col], errors="coerce") * (scale or {}).get(col, 1)
        b = _num(merged[col + "_ref"])
        both = a.notna() & b.notna()
        for x, y, name in zip(a[both], b[both], merged["NPU Name"][both]):
            assert math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6), (col, name, x, y)
            checked += 1
    return checked


def test_statistics_v26_numbers_match_msprobe():
    r, df = ours("v26_L1_statistics_bf16", "v26_L1_statistics_fp32")
    assert r.mode == "statistics"
    ref = reference("v26_L1_statistics_bf16_vs_fp32")
    assert list(df["NPU Name"]) == list(ref["NPU Name"])        # same rows, same order
    assert list(df.columns[:28 - 1]) == [c for c in ref.columns if c != "NPU_Stack_Info"][:27]
    # msprobe writes relative errors as "0.2289%" strings; we store the fraction
    pct = {c: 100 for c in ("MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")}
    n = assert_close_columns(df, ref, ["Max diff", "Min diff", "Mean diff", "L2norm diff",
                                       "NPU max", "NPU l2norm", "Bench mean", "Bench min"] + list(pct), pct)
    assert n > 1000


def test_bf16_vs_fp32_is_not_a_dtype_error():
    _, df = ours("v26_L1_statistics_bf16", "v26_L1_statistics_fp32")
    ref = reference("v26_L1_statistics_bf16_vs_fp32")
    assert (ref["Result"] == "error").sum() > 30          # msprobe 26 flags every bf16 row
    bf16 = df[df["NPU Dtype"] == "torch.bfloat16"]
    assert len(bf16) > 30 and (bf16["Result"] != "error").all()
    assert set(bf16["Tolerance Dtype"]) == {"bfloat16"}


def test_statistics_v833_names_and_unmatched_rows():
    r, df = ours("v833_L1_statistics_bf16", "v833_L1_statistics_fp32")
    ref = reference("v833_L1_statistics_bf16_vs_fp32")
    assert list(df["NPU Name"]) == list(ref["NPU Name"])
    only_npu = df[df["Bench Name"].isna()]
    assert list(only_npu["NPU Name"]) == list(ref[ref["Bench Name"].isna()]["NPU Name"])
    assert (only_npu["Result"] == "warning").all()
    assert only_npu["Err_message"].str.contains("no bench row matched").all()
    assert_close_columns(df, ref, ["Max diff", "Mean diff", "L2norm diff"])


@needs_pt_loads
def test_tensor_metrics_match_msprobe():
    r, df = ours("v26_L1_tensor_bf16", "v26_L1_tensor_fp32")
    assert r.mode == "tensor"
    ref = reference("v26_L1_tensor_bf16_vs_fp32")
    assert list(df["NPU Name"]) == list(ref["NPU Name"])
    n = assert_close_columns(df, ref, ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr",
                                       "One Thousandth Err Ratio", "Five Thousandths Err Ratio"])
    assert n > 700
    # non-tensor arguments: no metric, like msprobe
    inplace = df[df["NPU Name"] == "Functional.relu.0.forward.input.inplace"].iloc[0]
    assert inplace["Cosine"] == "unsupported" and inplace["Result"] == "pass"
    # all-zero tensors: msprobe says cosine 1; we say it is undefined and why
    zero = df[df["NPU Name"] == "Functional.layer_norm.0.forward.input.3"].iloc[0]
    assert pd.isna(zero["Cosine"]) and "all zeros" in zero["Err_message"]
    assert zero["Result"] == "pass"
    assert (df["Result"] != "error").all()                 # a healthy bf16 run


def test_md5_mode():
    r, df = ours("v26_L1_statistics_md5_bf16", "v26_L1_statistics_md5_fp32")
    assert r.mode == "md5"
    ref = reference("v26_md5_bf16_vs_fp32")
    merged = df.merge(ref, on="NPU Name", suffixes=("", "_ref"))
    tensors = merged[merged["NPU Dtype"].str.startswith("torch.").fillna(False)]
    assert (tensors["NPU MD5"] == tensors["NPU MD5_ref"]).all()
    assert (tensors["BENCH MD5"] == tensors["BENCH MD5_ref"]).all()
    same = tensors[tensors["NPU MD5"] == tensors["BENCH MD5"]]
    assert len(same) > 20 and (same["Result"] == "pass").all()
    # different hashes across bf16/fp32 are expected: judged by statistics instead
    cross = tensors[(tensors["NPU Dtype"] != tensors["Bench Dtype"])]
    assert len(cross) > 10 and cross["Err_message"].str.contains("judged by the statistics").all()


def test_md5_report_with_diagnosis(tmp_path):
    # md5 mode has no MaxRelativeErr column: the diagnosis must not need one
    from probe.compare import compare
    src = dump("v26_L1_statistics_md5_fp32")
    paths = compare({"npu_json_path": src, "bench_json_path": src, "is_print_compare_log": False},
                    str(tmp_path), workers=1)
    assert len(paths) == 4 and all(os.path.isfile(p) for p in paths)   # xlsx, csv, page, json


def test_md5_same_dtype_hash_difference_is_error():
    # the same dump against itself with one hash altered
    import json, shutil, tempfile
    tmp = tempfile.mkdtemp()
    try:
        src = dump("v26_L1_statistics_md5_fp32")
        data = json.load(open(src))
        data["data"]["Functional.linear.0.forward"]["input_args"][0]["md5"] = "deadbeef"
        p = os.path.join(tmp, "dump.json")
        json.dump(data, open(p, "w"))
        r = compare_dumps(p, src, progress=False)
        df = pd.DataFrame(r.columns)
        row = df[df["NPU Name"] == "Functional.linear.0.forward.input.0"].iloc[0]
        assert row["Result"] == "error" and "CRC32 differs" in row["Err_message"]
        assert (df["Result"] == "error").sum() == 1
    finally:
        shutil.rmtree(tmp)


def test_mixed_modes_fall_back_to_statistics():
    r, df = ours("v26_mix_tensor_fp32", "v26_mix_statistics_fp32")
    assert r.mode == "statistics"
    assert any("fell back to statistics" in n for n in r.notes)
    # the same run dumped twice: every statistic identical
    assert (df["Result"] == "pass").all(), df[df["Result"] != "pass"][["NPU Name", "Err_message"]]
    assert df["NPU Name"].str.contains(r"\.parameters\.weight$").any()
    assert df["NPU Name"].str.contains(r"parameters_grad\.0\.weight$").any()


def test_overflow_nan_inf_in_statistics():
    r, df = ours("v26_L1_statistics_overflow", "v26_L1_statistics_fp32")
    row = df[df["NPU Name"] == "Tensor.__mul__.0.forward.output.0"]
    # the bench has no such call (overflow run scales the input): unmatched, kept
    assert len(row) == 1 and pd.isna(row.iloc[0]["Bench Name"])
    r2, df2 = ours("v26_L1_statistics_overflow", "v26_L1_statistics_overflow")
    bad = df2[df2["NPU Name"] == "Tensor.__mul__.0.forward.output.0"].iloc[0]
    assert bad["Result"] == "warning" and "NaN/Inf" in bad["Err_message"]
    first = df[df["NPU Name"].fillna("").str.startswith("Functional.linear.0.forward.output")].iloc[0]
    assert first["Result"] == "error" and "NaN/Inf differ" in first["Err_message"]


def test_fuzzy_match_pairs_by_order_when_counters_shift():
    from probe.compare.match import match
    from probe.compare.rows import flatten
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1, "Min": 0,
         "Mean": 0.5, "Norm": 1, "requires_grad": False}
    npu = flatten("Functional.relu.1.forward", {"input_args": [t], "output": [t]})
    bench = flatten("Functional.relu.0.forward", {"input_args": [t], "output": [t]})
    exact = match(npu, bench)
    assert all(p.npu is None or p.bench is None for p in exact) and len(exact) == 4
    fuzzy = match(npu, bench, fuzzy=True)
    assert [(p.npu.name, p.bench.name) for p in fuzzy] == [
        ("Functional.relu.1.forward.input.0", "Functional.relu.0.forward.input.0"),
        ("Functional.relu.1.forward.output.0", "Functional.relu.0.forward.output.0")]
