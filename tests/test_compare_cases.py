"""Edge cases on small synthetic dumps: dtypes, shapes, NaN/Inf, bad input, the xlsx."""
import io
import json
import math
import os
import sys

import numpy as np
import openpyxl
import pandas as pd
import pytest

from probe.compare import compare, compare_distributed
from probe.compare.engine import compare_dumps
from probe.compare.metrics import tensor_metrics
from probe.compare.reader import DumpMeta, read_dump


def _summary(arr, dtype):
    a = np.asarray(arr, dtype=np.float64)
    d = {"type": "torch.Tensor", "dtype": dtype, "shape": list(np.shape(arr)), "requires_grad": False}
    if a.size:
        d.update(Max=float(a.max()), Min=float(a.min()), Mean=float(a.mean()),
                 Norm=float(np.sqrt((a * a).sum())))
    return d


def write_dump(root, tensors, dtypes=None, task="tensor", level="L1", extra_entries=None):
    """tensors: {entry: [array, ...]} as outputs; saved as .npy in dump_tensor_data."""
    rank = os.path.join(root, "step0", "rank")
    data_dir = os.path.join(rank, "dump_tensor_data")
    os.makedirs(data_dir, exist_ok=True)
    data = {}
    for entry, arrays in tensors.items():
        outs = []
        for i, arr in enumerate(arrays):
            dtype = (dtypes or {}).get((entry, i), "torch.float32")
            s = _summary(arr, dtype)
            if task == "tensor":
                s["data_name"] = f"{entry}.output.{i}.npy"
                np.save(os.path.join(data_dir, s["data_name"]), np.asarray(arr))
            outs.append(s)
        data[entry] = {"input_args": [], "input_kwargs": {}, "output": outs}
    data.update(extra_entries or {})
    path = os.path.join(rank, "dump.json")
    with open(path, "w") as fh:
        json.dump({"task": task, "level": level, "framework": "pytorch", "dump_data_dir": None,
                   "data": data}, fh)
    return path


def run(tmp_path, npu, bench, **kw):
    npu_dtypes, bench_dtypes = kw.pop("npu_dtypes", None), kw.pop("bench_dtypes", None)
    a = write_dump(str(tmp_path / "npu"), npu, npu_dtypes, **kw)
    b = write_dump(str(tmp_path / "bench"), bench, bench_dtypes)
    r = compare_dumps(a, b, progress=False, workers=1)
    return pd.DataFrame(r.columns).set_index("NPU Name", drop=False), r


rng = np.random.default_rng(0)
X = rng.standard_normal((16, 16)).astype(np.float32)


def test_bf16_rounding_passes_and_bigger_error_fails(tmp_path):
    bf16_like = (X.view(np.uint32) & 0xFFFF0000).view(np.float32)     # truncated to bf16
    wrong = X * 1.3
    df, _ = run(tmp_path, {"A.op.0.forward": [bf16_like, wrong]}, {"A.op.0.forward": [X, X]},
                npu_dtypes={("A.op.0.forward", 0): "torch.bfloat16",
                            ("A.op.0.forward", 1): "torch.bfloat16"})
    ok = df.loc["A.op.0.forward.output.0"]
    assert ok["Result"] == "pass" and ok["Tolerance Dtype"] == "bfloat16", ok["Err_message"]
    bad = df.loc["A.op.0.forward.output.1"]
    assert bad["Result"] == "error" and "beyond 10x" in bad["Err_message"]


def test_same_error_fails_at_fp32_tolerance(tmp_path):
    bf16_like = (X.view(np.uint32) & 0xFFFF0000).view(np.float32)
    df, _ = run(tmp_path, {"A.op.0.forward": [bf16_like]}, {"A.op.0.forward": [X]})
    row = df.loc["A.op.0.forward.output.0"]
    assert row["Tolerance Dtype"] == "float32" and row["Result"] == "error"
    assert "beyond the float32 tolerance" in row["Err_message"]


def test_ints_and_bools_are_exact(tmp_path):
    i = np.arange(10, dtype=np.int64)
    j = i.copy(); j[3] = 4
    b = np.array([True, False, True])
    dtypes = {("A.op.0.forward", 0): "torch.int64", ("A.op.0.forward", 1): "torch.int64",
              ("A.op.0.forward", 2): "torch.bool", ("A.op.0.forward", 3): "torch.bool"}
    df, _ = run(tmp_path, {"A.op.0.forward": [i, j, b, ~b]}, {"A.op.0.forward": [i, i, b, b]},
                npu_dtypes=dtypes, bench_dtypes=dtypes)
    assert df.loc["A.op.0.forward.output.0", "Result"] == "pass"
    row = df.loc["A.op.0.forward.output.1"]
    assert row["Result"] == "error" and "1 of 10 elements differ" in row["Err_message"]
    assert df.loc["A.op.0.forward.output.2", "Result"] == "pass"
    assert df.loc["A.op.0.forward.output.3", "Result"] == "error"


def test_int_vs_float_dtype_is_an_error(tmp_path):
    i = np.arange(4, dtype=np.int64)
    df, _ = run(tmp_path, {"A.op.0.forward": [i]}, {"A.op.0.forward": [i.astype(np.float32)]},
                npu_dtypes={("A.op.0.forward", 0): "torch.int64"})
    row = df.loc["A.op.0.forward.output.0"]
    assert row["Result"] == "error" and "not comparable" in row["Err_message"]


def test_empty_and_zero_d_tensors(tmp_path):
    e = np.zeros((0, 3), np.float32)
    s = np.array(2.0, np.float32)
    df, _ = run(tmp_path, {"A.op.0.forward": [e, s]}, {"A.op.0.forward": [e, np.array(2.001, np.float32)]})
    empty = df.loc["A.op.0.forward.output.0"]
    assert empty["Result"] == "pass" and "empty tensor" in empty["Err_message"]
    zero_d = df.loc["A.op.0.forward.output.1"]
    assert pd.isna(zero_d["Cosine"]) and "0-d" in zero_d["Err_message"]
    assert math.isclose(zero_d["MaxAbsErr"], 1e-3, rel_tol=1e-2)
    assert zero_d["Result"] == "warning"        # 5e-4 relative: 5x the fp32 tolerance


def test_all_zero_tensors(tmp_path):
    z = np.zeros((4, 4), np.float32)
    df, _ = run(tmp_path, {"A.op.0.forward": [z, z]}, {"A.op.0.forward": [z, X[:4, :4]]})
    both = df.loc["A.op.0.forward.output.0"]
    assert both["Result"] == "pass" and "both sides are all zeros" in both["Err_message"]
    one = df.loc["A.op.0.forward.output.1"]
    assert one["Result"] == "error" and "NPU is all zeros" in one["Err_message"]


def test_nan_inf_positions(tmp_path):
    a = X.copy(); a[0, 0] = np.nan; a[1, 1] = np.inf
    moved = X.copy(); moved[0, 1] = np.nan; moved[1, 1] = np.inf
    df, _ = run(tmp_path, {"A.op.0.forward": [a, a]}, {"A.op.0.forward": [a.copy(), moved]})
    same = df.loc["A.op.0.forward.output.0"]
    assert same["Result"] == "warning" and "same 2 positions" in same["Err_message"]
    assert same["Cosine"] == pytest.approx(1.0)
    diff = df.loc["A.op.0.forward.output.1"]
    assert diff["Result"] == "error" and "different positions" in diff["Err_message"]


def test_shape_mismatch_is_an_error_row_without_metrics(tmp_path):
    df, _ = run(tmp_path, {"A.op.0.forward": [X]}, {"A.op.0.forward": [X[:8]]})
    row = df.loc["A.op.0.forward.output.0"]
    assert row["Result"] == "error" and "shape differs" in row["Err_message"]
    assert pd.isna(row["Cosine"]) and pd.isna(row["MaxAbsErr"])


def test_metrics_values():
    a = np.array([1.0, 2.0, 3.0, 0.0])
    b = np.array([1.0, 2.004, 3.0, 0.0])
    m = tensor_metrics(a, b, 1e-4, 1e-6)
    assert m.max_abs == pytest.approx(0.004)
    assert m.max_rel == pytest.approx(0.004 / 2.004)
    assert m.one_thousandth == pytest.approx(0.75) and m.five_thousandths == 1.0
    assert m.cosine == pytest.approx(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
    assert m.euc_dist == pytest.approx(0.004)


def test_identical_tensors_have_cosine_exactly_one():
    """Rounding of the float64 sums made an identical int64 tensor's cosine 0.9999999999999998."""
    for seed in range(20):
        g = np.random.default_rng(seed)
        for a in (g.integers(0, 64, (4, 16)), g.standard_normal((8, 8)).astype(np.float32)):
            m = tensor_metrics(a, a.copy(), 1e-4, 1e-6, exact=a.dtype.kind == "i")
            assert m.cosine == 1.0 and m.euc_dist == 0.0, (seed, a.dtype, m.cosine)
    c = tensor_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0 + 1e-12]), 1e-4, 1e-6).cosine
    assert -1.0 <= c <= 1.0


def test_missing_tensor_file_marks_the_row(tmp_path):
    a = write_dump(str(tmp_path / "npu"), {"A.op.0.forward": [X, X]})
    b = write_dump(str(tmp_path / "bench"), {"A.op.0.forward": [X, X]})
    os.remove(os.path.join(os.path.dirname(b), "dump_tensor_data", "A.op.0.forward.output.1.npy"))
    df = pd.DataFrame(compare_dumps(a, b, progress=False).columns)
    assert list(df["Result"]) == ["pass", "warning"]
    assert "bench tensor file missing" in df["Err_message"][1]


def test_data_name_escaping_its_folder_is_refused(tmp_path):
    a = write_dump(str(tmp_path / "npu"), {"A.op.0.forward": [X]})
    b = write_dump(str(tmp_path / "bench"), {"A.op.0.forward": [X]})
    secret = tmp_path / "secret.npy"
    np.save(secret, X)
    d = json.load(open(a))
    d["data"]["A.op.0.forward"]["output"][0]["data_name"] = "../../../../secret.npy"
    json.dump(d, open(a, "w"))
    df = pd.DataFrame(compare_dumps(a, b, progress=False).columns)
    assert df["Result"][0] == "error" and "escapes" in df["Err_message"][0]


def test_pickled_npy_is_not_loaded(tmp_path):
    a = write_dump(str(tmp_path / "npu"), {"A.op.0.forward": [X]})
    b = write_dump(str(tmp_path / "bench"), {"A.op.0.forward": [X]})
    np.save(os.path.join(os.path.dirname(a), "dump_tensor_data", "A.op.0.forward.output.0.npy"),
            np.array([{"x": 1}], dtype=object), allow_pickle=True)
    df = pd.DataFrame(compare_dumps(a, b, progress=False).columns)
    assert df["Result"][0] == "error" and "unreadable" in df["Err_message"][0]


def test_truncated_dump_compares_what_is_valid(tmp_path):
    entries = {f"A.op.{k}.forward": [X] for k in range(6)}
    a = write_dump(str(tmp_path / "npu"), entries, task="statistics")
    b = write_dump(str(tmp_path / "bench"), entries, task="statistics")
    text = open(a).read()
    cut = text.index('"A.op.4.forward"') + 40
    open(a, "w").write(text[:cut])
    meta = DumpMeta(a)
    assert len(list(read_dump(a, meta))) == 4 and meta.truncated
    r = compare_dumps(a, b, progress=False)
    df = pd.DataFrame(r.columns)
    assert any("truncated" in n and "after 4 entries" in n for n in r.notes)
    assert (df["Result"][:4] == "pass").all()
    assert df["Bench Name"].notna().all() and df["NPU Name"].isna().sum() == 2  # kept, not dropped


def test_missing_dump_json_is_a_clear_error(tmp_path):
    b = write_dump(str(tmp_path / "bench"), {"A.op.0.forward": [X]})
    with pytest.raises(FileNotFoundError, match="dump.json not found"):
        compare({"npu_json_path": str(tmp_path / "nope.json"), "bench_json_path": b}, str(tmp_path / "o"))


def test_task_level_mismatch_is_explained(tmp_path):
    a = write_dump(str(tmp_path / "npu"), {"A.op.0.forward": [X]}, task="statistics", level="mix")
    b = write_dump(str(tmp_path / "bench"), {"A.op.0.forward": [X]})
    r = compare_dumps(a, b, progress=False)
    assert r.mode == "statistics"
    assert any("task differs" in n for n in r.notes) and any("level differs" in n for n in r.notes)


def test_xlsx_fills_types_and_summary(tmp_path):
    a = write_dump(str(tmp_path / "npu"), {"A.op.0.forward": [X, X * 1.0003, X * 2], "B.op.0.forward": [X]},
                   task="statistics")
    b = write_dump(str(tmp_path / "bench"), {"A.op.0.forward": [X, X, X]}, task="statistics")
    out = tmp_path / "out" / "nested"
    before = set(os.listdir(tmp_path))
    paths = compare({"npu_json_path": a, "bench_json_path": b, "is_print_compare_log": False},
                    str(out), stack_mode=True)
    assert set(os.listdir(tmp_path)) == before | {"out"}        # nothing written elsewhere
    xlsx, csv, page, summary_path = paths
    assert page.endswith(".html") and os.path.basename(page).startswith("compare_report_")
    assert os.path.basename(xlsx).startswith("compare_result_") and xlsx.endswith(".xlsx")
    assert os.path.isfile(csv)
    assert os.path.basename(summary_path).startswith("compare_summary_") and summary_path.endswith(".json")
    latest = out / "compare_summary.json"          # the latest run's, under a fixed name
    assert latest.read_bytes() == open(summary_path, "rb").read()
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    wb = openpyxl.load_workbook(xlsx)
    assert wb.sheetnames == ["compare_result", "Summary", "Diagnosis"]
    ws = wb["compare_result"]
    header = [c.value for c in ws[1]]
    assert header[:8] == ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
                          "Bench Tensor Shape", "NPU Requires_grad", "Bench Requires_grad"]
    assert "NPU_Stack_Info" in header and header[-4:] == ["Direction", "Tolerance Dtype", "Err/Tolerance", "Match"]
    assert ws.freeze_panes == "A2" and ws.auto_filter.ref.startswith("A1:")
    col = {h: i + 1 for i, h in enumerate(header)}
    results = {ws.cell(r, 1).value: ws.cell(r, col["Result"]).value for r in range(2, ws.max_row + 1)}
    assert results["A.op.0.forward.output.0"] == "pass"
    assert results["A.op.0.forward.output.2"] == "error"
    for r in range(2, ws.max_row + 1):
        verdict = ws.cell(r, col["Result"]).value
        fill = ws.cell(r, 1).fill
        colour = fill.fgColor.rgb if fill.fill_type == "solid" else None
        assert colour == {"pass": None, "warning": "FFFFEB9C", "error": "FFFFC7CE"}[verdict]
        rel = ws.cell(r, col["MaxRelativeErr"])
        if rel.value is not None:
            assert isinstance(rel.value, float) and rel.number_format.endswith("%")
        assert isinstance(ws.cell(r, col["Max diff"]).value, (float, type(None)))
    summary = dict(wb["Summary"].iter_rows(min_row=2, values_only=True))
    assert summary["error"] == 1 and summary["pass"] == 1 and summary["warning"] == 2
    assert summary["first error"].endswith("A.op.0.forward.output.2")
    assert "tolerance" in summary["first error message"]
    assert summary["forward: pass / warning / error"] == "1 / 2 / 1"


def test_distributed_and_cli(tmp_path, capsys):
    from probe.compare.cli import add_arguments, run as cli_run
    import argparse
    for side in ("npu", "bench"):
        for rank in (0, 1):
            p = write_dump(str(tmp_path / side), {"A.op.0.forward": [X]}, task="statistics")
            os.replace(os.path.dirname(p), os.path.join(os.path.dirname(os.path.dirname(p)), f"rank{rank}"))
    paths = compare_distributed(str(tmp_path / "npu"), str(tmp_path / "bench"), str(tmp_path / "o"),
                                processes=2)
    names = sorted(os.path.basename(p) for p in paths)
    assert os.path.isfile(tmp_path / "o" / "compare_summary.json")     # not among the returned paths
    # per pair: xlsx, csv, page, summary json; and the run's workbook and page
    assert len(names) == 10 and names[0].startswith("compare_report_step0_rank0_")
    assert "compare_run.html" in names
    assert sum(n.startswith("compare_summary_step0_rank1_") for n in names) == 1
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    rc = cli_run(parser.parse_args(["--npu", str(tmp_path / "npu" / "step0" / "rank1"),
                                    "--bench", str(tmp_path / "bench" / "step0" / "rank1"),
                                    "-o", str(tmp_path / "o2")]))
    out = capsys.readouterr().out.split()
    assert rc == 0 and len(out) == 4 and all(os.path.isfile(p) for p in out)
    with pytest.raises(ValueError):
        cli_run(parser.parse_args(["-o", str(tmp_path / "o3")]))


def test_whole_file_and_streamed_reads_agree(tmp_path, monkeypatch):
    """orjson parses a normal file whole; bare NaN tokens (msprobe writes them) and big files
    are streamed. Both paths must hand out the same entries and meta."""
    entries = {f"A.op.{k}.forward": [X * (k + 1)] for k in range(5)}
    a = write_dump(str(tmp_path / "npu"), entries, task="statistics")
    import probe.compare.reader as reader

    def read(path):
        meta = DumpMeta(path)
        return list(read_dump(path, meta)), (meta.task, meta.level, meta.entries, meta.truncated)

    whole = read(a)
    monkeypatch.setattr(reader, "WHOLE_FILE_BYTES", 0)
    streamed = read(a)
    assert whole == streamed and whole[1][2] == 5
    monkeypatch.undo()
    text = open(a).read().replace(f'"Max": {float(X.max())}', '"Max": NaN', 1)
    assert "NaN" in text
    open(a, "w").write(text)
    got, meta = read(a)
    assert meta[2] == 5 and math.isnan(got[0][1]["output"][0]["Max"])


def _odd_entries() -> dict:
    """Entries the struct decoding does not fit, beside ones it does: each read as dicts."""
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.0,
         "Min": -1, "Mean": True, "Norm": None, "requires_grad": False, "md5": "00ab"}
    return {
        "Functional.op.0.forward": {"input_args": [t, [t, None, {"type": "int", "value": 3}]],
                                    "input_kwargs": {"dim": {"type": "int", "value": -1},
                                                     "out": None},
                                    "output": [t]},
        "Functional.op.1.forward": {"input_args": [{"nested": {"a": t, "b": [t]}}],   # a dict argument
                                    "input_kwargs": {"cfg": {"x": {"type": "float", "value": 0.5}}},
                                    "output": t},
        "Module.fc.Linear.forward.0": {"input_args": [t], "parameters": {"weight": t, "bias": None},
                                       "output": [t], "unknown_key": [1, 2]},
        "Functional.op.2.forward": {"input_args": [{"type": "torch.Size", "value": [2, 3]},
                                                   {"type": "slice", "value": [0, None, 1]},
                                                   {"type": "torch.dtype", "value": "torch.float16"}]},
        "Module.fc.Linear.parameters_grad": {"weight": [t], "bias": [t]},
        "Functional.op.3.forward": None,
        "Functional.op.4.forward": {"input_args": "not a list", "output": [t]},
        "Tensor.__setitem__.0.forward": {"input_args": [t], "parameters": None, "output": None},   # null parts: rows
        "Functional.op.5.forward": {"input_args": [{"type": "torch.Size", "dtype": None, "shape": None,
                                                    "value": [2, 3]},      # keys there, null: a tensor row
                                                   {"type": "torch.Tensor", "shape": [2]},   # no dtype key
                                                   {"type": "float", "value": 12345.5}]},   # written 1e400
    }


def test_struct_and_dict_reads_flatten_alike(tmp_path):
    """The compare decodes entries into msgspec structs, falling back to dicts where an entry
    does not fit them; every other reader gets dicts. Both must give the same rows, on the
    msprobe fixtures and on odd entries (nested dict arguments, parameter gradients,
    non-float statistics, unknown keys)."""
    from probe.compare.rows import flatten
    fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
    paths = sorted(os.path.join(d, "dump.json") for d, _, files in os.walk(fixtures) if "dump.json" in files)
    odd = tmp_path / "dump.json"
    odd.write_text(json.dumps({"task": "statistics", "level": "mix", "data": _odd_entries()})
                   .replace("12345.5", "1e400"))       # beyond float64: orjson refuses, json reads inf
    import msgspec
    msgspec.json.decode(odd.read_bytes(), type=dict[str, msgspec.Raw])   # msgspec takes the file:
    # its entries go the struct path (that 1e400's entry, refused by the structs and orjson, as dicts)
    nan = tmp_path / "nan" / "dump.json"         # bare NaN tokens: msgspec refuses the file
    nan.parent.mkdir()
    nan.write_text(odd.read_text().replace('"Max": 1.0', '"Max": NaN', 1))
    paths += [str(nan), str(odd)]       # the odd one last: its rows are checked below
    assert len(paths) >= 10
    for path in paths:
        metas = DumpMeta(path), DumpMeta(path)
        typed = [r for n, e in read_dump(path, metas[0], typed=True) for r in flatten(n, e)]
        plain = [r for n, e in read_dump(path, metas[1]) for r in flatten(n, e)]
        assert typed == plain and typed, path
        assert (metas[0].task, metas[0].level, metas[0].entries) == \
               (metas[1].task, metas[1].level, metas[1].entries)
    kinds = {(r.name, r.kind) for r in typed}
    assert ("Tensor.__setitem__.0.forward.output", "none") in kinds
    assert ("Functional.op.5.forward.input.0", "tensor") in kinds
    assert ("Functional.op.1.forward.input.0.nested.b.0", "tensor") in kinds        # the dict argument
    assert ("Module.fc.Linear.parameters_grad.weight", "tensor") in kinds
    assert ("Functional.op.0.forward.input.dim", "value") in kinds


def test_a_nan_output_against_an_overflowing_norm_is_an_infinite_error(tmp_path):
    """float64 outputs whose norms overflow on both sides (EucDist and Bench l2norm inf)
    have no relative error to divide out; NaN on the NPU side only then makes the error
    infinite, by the rule for NaN/Inf on one side, and the call is named."""
    from probe.compare.diagnosis import diagnose
    npu = np.array([np.nan, 1e150, 1e150, 1e150])
    bench = np.array([1.0, -1e200, -1e200, -1e200])
    f64 = {("Functional.mul.0.forward", 0): "torch.float64"}
    df, r = run(tmp_path, {"Functional.mul.0.forward": [npu]}, {"Functional.mul.0.forward": [bench]},
                npu_dtypes=f64, bench_dtypes=f64)
    row = df.loc["Functional.mul.0.forward.output.0"]
    assert row["Result"] == "error" and math.isinf(row["Bench l2norm"])
    d = diagnose(r, replay=False)
    (call,) = d.calls
    assert call.status == "introduces" and call.output_error == math.inf
    assert d.forward is not None and d.forward.call is call


@pytest.mark.parametrize("shape", [[None, 4], [2 ** 63] * 17], ids=["null size", "past float64"])
def test_a_one_sided_row_with_a_shape_of_no_numbers_is_listed(tmp_path, shape):
    """A row only one side has is listed unmatched whatever its shape holds (it is never
    measured, so its shape is never multiplied out: 2**1071 elements is past float64)."""
    leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "Max": 1.0, "Min": -1.0,
            "Mean": 0.0, "Norm": 2.0, "requires_grad": False}
    odd = dict(leaf, shape=shape)
    entry = {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]}
    a = write_dump(str(tmp_path / "npu"), {}, task="statistics", extra_entries={"Functional.linear.0.forward": entry})
    b = write_dump(str(tmp_path / "bench"), {}, task="statistics", extra_entries={
        "Functional.linear.0.forward": dict(entry, input_args=[leaf, odd])})
    paths = compare({"npu_json_path": a, "bench_json_path": b}, str(tmp_path / "out"))
    csv_path = next(p for p in paths if p.endswith(".csv"))
    rows = pd.read_csv(csv_path, keep_default_na=False)
    extra = rows[rows["Bench Name"] == "Functional.linear.0.forward.input.1"]
    assert len(extra) == 1 and extra["NPU Name"].iloc[0] == ""
    assert "no NPU row matched" in extra["Err_message"].iloc[0]


def test_equal_messages_are_one_text(tmp_path):
    """Rows off by the same amount say the same thing; their Err_message is one str object,
    not one made per row (the 100k-entry pair's 270k messages hold 10k texts: 31 MB)."""
    entries = {f"Functional.linear.{k}.forward": [X] for k in range(40)}
    off = {name: [X * np.float32(1.01)] for name in entries}
    _, r = run(tmp_path, off, entries, task="statistics")
    messages = [m for m in r.columns["Err_message"] if m]
    assert len(messages) == 40 and len(set(messages)) == 1 and "statistics off by" in messages[0]
    assert len(set(map(id, messages))) == 1


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_is_drawn_on_a_terminal_only(tmp_path, monkeypatch):
    """A log or a pipe gets no bar frames: the compare does not even import tqdm (an
    import of it fails here); a terminal gets the bar naming the stage."""
    from probe.compare.pair_job import stage_bar
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    assert stage_bar() is None
    a = write_dump(str(tmp_path / "npu"), {"A.op.0.forward": [X]}, task="statistics")
    b = write_dump(str(tmp_path / "bench"), {"A.op.0.forward": [X * 1.5]}, task="statistics")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "tqdm", None)          # `import tqdm` raises ImportError
        paths = compare({"npu_json_path": a, "bench_json_path": b, "is_print_compare_log": False},
                        str(tmp_path / "o"), progress=True)
    assert len(paths) == 4 and all(os.path.isfile(p) for p in paths)
    assert piped.getvalue() == ""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bar = stage_bar()
    assert bar is not None
    bar.refresh()           # (drawn from 2 s on; refresh draws now)
    bar.close()
    assert "compare: reading" in terminal.getvalue()
