"""The rows of a dump.json entry are the same whether the C extension ``_cflat`` makes
them or the Python path does (``rows._cflat`` set to None): the same fields, the same
statistics at the same places in the side's store, the same order, for msprobe's real
dumps and for the odd leaves the C path hands back to Python mid-entry."""
import glob
import json
import math
import os
from array import array

import pytest

from probe.compare import rows
from probe.compare.reader import read_dump

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "msprobe")

needs_c = pytest.mark.skipif(rows._cflat is None, reason="probe.compare._cflat not built (no C compiler)")


def _side(path, monkeypatch, c: bool):
    """All rows of a dump.json and their store, by one path."""
    with monkeypatch.context() as m:
        if not c:
            m.setattr(rows, "_cflat", None)
        out, store = [], array("d")
        for name, entry in read_dump(path, typed=True):
            out.extend(rows.flatten(name, entry, store))
    return out, store


def _fields(row):
    return (row.name, row.entry, row.io, row.kind, row.dtype, row.shape, row.k, row.requires_grad,
            row.md5, row.data_name, repr(row.value), row.unread)


def _same(path, monkeypatch):
    c_rows, c_store = _side(path, monkeypatch, True)
    py_rows, py_store = _side(path, monkeypatch, False)
    assert [_fields(r) for r in c_rows] == [_fields(r) for r in py_rows]
    assert c_rows == py_rows                  # statistics too (NaN equal to NaN)
    assert len(c_store) == len(py_store)
    assert all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(c_store, py_store))
    return c_rows


@needs_c
@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(FIXTURES, "*", "step0", "*", "dump.json"))))
def test_msprobe_dumps_same_rows(path, monkeypatch):
    got = _same(path, monkeypatch)
    assert got and any(r.kind == "tensor" for r in got)


_T = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3],
      "Max": 1.5, "Min": -1.0, "Mean": 0.25, "Norm": 3.0, "requires_grad": True}


def _odd_entries():
    """Every kind of leaf, the odd ones between common ones (the store's places must follow)."""
    return {
        "Functional.linear.0.forward": {
            "input_args": [_T, dict(_T, Max=2, Min=None), dict(_T, Max="big"), dict(_T, Norm=10 ** 400),
                           dict(_T, Mean=True), dict(_T, shape=None), dict(_T, shape=[]), _T,
                           {"type": "numpy.ndarray", "dtype": "float64", "shape": [4], "Max": 1.0,
                            "Min": 0.0, "Mean": 0.5, "Norm": 1.0},
                           {"type": "SomeTensor", "dtype": "x", "shape": [1]},
                           {"type": "torch.Tensor", "shape": [3], "Max": 1.0},
                           dict(_T, dtype=None), dict(_T, data_name=""), dict(_T, data_name="a.pt", md5="00ff"),
                           dict(_T, uninitialized=True), dict(_T, opaque=True), dict(_T, requires_grad=None),
                           None, [_T, [_T, None]], {"type": "int", "value": 3}],
            "input_kwargs": {"dim": {"type": "int", "value": -1}, "alpha": {"type": "float", "value": 0.5},
                             "flag": {"type": "bool", "value": True}, "mode": {"type": "str", "value": "sum"},
                             "none": {"type": "int", "value": None}, "huge": {"type": "int", "value": 10 ** 30},
                             "huger": {"type": "int", "value": 10 ** 400}, "lst": {"type": "int", "value": [1, 2]},
                             "dev": {"type": "torch.device", "value": "cpu"}, "t": _T, "nothing": None},
            "parameters": {"weight": _T, "bias": dict(_T, shape=[3])},
            "output": [dict(_T, Max=float("inf"), Min=float("-inf")), _T],
        },
        "Functional.relu.0.forward": {"input_args": [_T], "output": None},
        "Functional.relu.1.forward": {"input_args": _T, "output": [_T] * 70},
        "Functional.gelu.0.forward": {"input_args": [_T], "input_kwargs": {"approximate": {"type": "str", "value": "none"},
                                                                           "nested": {"a": _T}}},
        "Module.fc.Linear.parameters_grad": {"weight": _T, "bias": _T},
        "Functional.empty.0.forward": {},
        "Functional.null.0.forward": None,
    }


@needs_c
def test_odd_leaves_same_rows(tmp_path, monkeypatch):
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "data": _odd_entries()}))
    got = _same(str(path), monkeypatch)
    by_name = {r.name: r for r in got}
    # the odd cases as the Python path has them (so the C path is checked against them too)
    assert by_name["Functional.linear.0.forward.input.3"].stats[3] == math.inf       # 10**400
    assert math.isnan(by_name["Functional.linear.0.forward.input.2"].stats[0])       # a text
    assert by_name["Functional.linear.0.forward.input.lst"].dtype == "<class 'list'>"
    assert by_name["Functional.linear.0.forward.input.huger"].stats[0] == math.inf
    assert by_name["Functional.linear.0.forward.input.none"].dtype == "<class 'NoneType'>"
    assert by_name["Functional.linear.0.forward.input.dev"].dtype == "torch.device"
    assert by_name["Functional.linear.0.forward.input.11"].dtype == "None"
    assert by_name["Functional.linear.0.forward.input.12"].data_name is None
    assert by_name["Functional.linear.0.forward.input.14"].unread
    assert by_name["Functional.relu.1.forward.output.69"].k == by_name["Functional.relu.1.forward.output.0"].k + 69
    ios = [r.io for r in got if r.entry == "Functional.linear.0.forward"]
    assert ios == sorted(ios, key=["input", "parameters", "output"].index)     # msprobe's order


def test_direction_column_follows_the_grammar_for_every_entry(tmp_path):
    """The table's Direction, worked out once per API (engine._directions), is what the
    vocabulary's parser gives each entry: API calls whatever their counter, modules,
    names outside the grammar."""
    from probe.compare.engine import compare_dumps
    from probe.vocabulary import direction

    names = ["Functional.linear.0.forward", "Functional.linear.17.forward", "Functional.linear.3.backward",
             "Tensor.__add__.007.forward", "Torch.matmul.2.forward", "Module.fc.Linear.forward.0",
             "Module.fc.Linear.backward.3", "Module.fc.Linear.parameters_grad", "Functional.a.b.1.backward",
             "weird.5.forward", "5.forward", "x.y.forward", "Functional..1.forward", "Functional.relu.x1.forward",
             "Functional.relu.\u0663.forward", "Module.blocks.0.attn.Attention.forward.12", "Distributed.all_reduce.4.forward"]
    data = {n: ({"weight": _T} if n.endswith("parameters_grad") else {"input_args": [_T], "output": [_T]}) for n in names}
    for side in ("npu", "bench"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "data": data}))
    res = compare_dumps(str(tmp_path / "npu" / "dump.json"), str(tmp_path / "bench" / "dump.json"), progress=False)
    entries = [p.npu.entry for p in res.pairs]
    assert set(entries) == set(names)
    assert res.columns["Direction"] == [direction(e) for e in entries]
    assert {"forward", "backward", "parameters_grad", ""} <= set(res.columns["Direction"])


@needs_c
@pytest.mark.parametrize("identity", [False, True])
def test_codes_same_by_c_and_python(identity, monkeypatch):
    """codes.codes (equal values share a code, as dict.fromkeys has them) and
    codes.object_codes (only the same object does) give the same distinct values and
    the same codes in C and in Python: NaNs, 1 / 1.0 / True, equal texts that are
    different objects, shared and unshared tuples, None."""
    import numpy as np

    from probe.compare import codes

    nan, shared = float("nan"), (2, 3)
    text = "".join(["torch.", "float32"])              # equal to the literal, another object
    values = ["torch.float32", text, None, 1, 1.0, True, nan, float("nan"), nan, shared, (2, 3), shared,
              tuple([2, 3]), (), None, "torch.float32"] * 50 + [str(i % 7) for i in range(1000)]
    fn = codes.object_codes if identity else codes.codes
    c_distinct, c_ids = fn(values)
    monkeypatch.setattr(codes, "_cflat", None)
    py_distinct, py_ids = fn(values)
    assert len(c_distinct) == len(py_distinct) and all(map(lambda a, b: a is b, c_distinct, py_distinct))
    assert c_ids.dtype == py_ids.dtype == np.int32 and np.array_equal(c_ids, py_ids)
    assert [c_distinct[k] is v or c_distinct[k] == v for k, v in zip(c_ids.tolist(), values)] == [True] * len(values)
    assert bool(c_ids[0] == c_ids[1]) is (not identity)    # equal texts: one code by value, two by identity
    with pytest.raises(TypeError):
        codes.codes([[1], [1]])                           # unhashable: as dict.fromkeys has it


def _screened_pair(tmp_path, mode):
    """An NPU and a bench dump whose rows differ in every way the screen words one by one:
    kinds, argument values (NaN equal to NaN), dtypes not comparable, shapes, an
    uninitialised buffer, a row on one side only; statistics off on a row with another
    finding, and on one without; the rest agree. ``mode``: "tensor" (a row names a tensor
    file), "md5" (one has a hash) or "statistics" (none has either)."""
    npu = _odd_entries()
    if mode != "tensor":
        del npu["Functional.linear.0.forward"]["input_args"][13]["data_name"]
    if mode == "statistics":
        del npu["Functional.linear.0.forward"]["input_args"][13]["md5"]
    bench = json.loads(json.dumps(npu))
    bench["Functional.linear.0.forward"]["parameters"]["weight"].update(requires_grad=False, Max=100.0)
    bench["Functional.linear.0.forward"]["parameters"]["bias"].update(Max=1.501)
    args = bench["Functional.linear.0.forward"]["input_args"]
    args[0] = {"type": "int", "value": 3}                                  # a tensor there, a value here
    args[1] = dict(args[1], dtype="torch.int64")                          # not comparable with float32
    args[7] = dict(args[7], shape=[3, 2])                                 # shape differs
    args[12] = dict(args[12], uninitialized=True)                         # no data on one side
    kwargs = bench["Functional.linear.0.forward"]["input_kwargs"]
    kwargs["dim"] = {"type": "int", "value": 1}                          # an argument differs
    npu["Functional.gelu.0.forward"]["input_kwargs"]["approximate"] = {"type": "float", "value": float("nan")}
    bench["Functional.gelu.0.forward"]["input_kwargs"]["approximate"] = {"type": "float", "value": float("nan")}
    bench["Functional.relu.1.forward"]["output"] = [_T] * 69               # one output fewer
    paths = []
    for side, data in (("npu", npu), ("bench", bench)):
        (tmp_path / side).mkdir()
        path = tmp_path / side / "dump.json"
        path.write_text(json.dumps({"task": "statistics", "level": "L1", "data": data}))
        paths.append(str(path))
    return paths


@needs_c
@pytest.mark.parametrize("mode", ["statistics", "md5", "tensor"])
def test_compare_same_table_by_c_and_python(mode, tmp_path, monkeypatch):
    """The whole table (every column: findings, tolerance classes, statistics) is the same
    when the rows, the fields and the codes are made in C or in Python, on rows that
    differ in every way the screen words."""
    import numpy as np

    from probe.compare import codes
    from probe.compare.engine import compare_dumps

    npu, bench = _screened_pair(tmp_path, mode)
    res = compare_dumps(npu, bench, progress=False)
    assert res.mode == mode
    got = res.columns
    monkeypatch.setattr(rows, "_cflat", None)
    monkeypatch.setattr(codes, "_cflat", None)
    want = compare_dumps(npu, bench, progress=False).columns
    assert list(got) == list(want)
    for name, col in want.items():
        if isinstance(col, np.ndarray):
            assert np.array_equal(got[name], col, equal_nan=True), name
        else:
            assert list(got[name]) == list(col), name
    text = dict(zip(want["NPU Name"], want["Err_message"]))
    assert text["Functional.linear.0.forward.input.0"].endswith("error: NPU is a tensor, bench is a value")
    assert "dtypes not comparable" in text["Functional.linear.0.forward.input.1"]
    assert "shape differs: NPU [2, 3], bench [3, 2]" in text["Functional.linear.0.forward.input.7"]
    assert "no data to compare" in text["Functional.linear.0.forward.input.12"]
    assert text["Functional.linear.0.forward.input.dim"] == "error: argument differs: NPU -1, bench 1"
    assert "argument differs" not in text["Functional.gelu.0.forward.input.approximate"]     # NaN and NaN
    assert "no bench row" in text["Functional.relu.1.forward.output.69"]
    assert want["Tolerance Dtype"][want["NPU Name"].index("Functional.linear.0.forward.input.8")] == "float32"
    if mode == "statistics":
        weight = text["Functional.linear.0.forward.parameters.weight"]      # two findings, in order
        assert weight.startswith("warning: requires_grad differs: NPU True, bench False; error: statistics off by ")
        assert weight.endswith("x the float32 tolerance (rtol 0.0001), more than 10x") and weight.count(";") == 1
        assert text["Functional.linear.0.forward.parameters.bias"].startswith("warning: statistics off by ")


@needs_c
def test_direction_keys_same_by_c_and_python(monkeypatch):
    """The Direction column's per-API keys (an API call's counter set to 0) are the same in
    C and in Python, and give each entry the direction the vocabulary's parser gives it,
    for names in and outside the grammar: non-ASCII digits, empty parts, near misses."""
    from probe.compare import engine
    from probe.vocabulary import direction

    names = ["Functional.linear.0.forward", "Functional.linear.17.forward", "Tensor.__add__.007.backward",
             "Module.fc.Linear.forward.0", "Module.fc.Linear.parameters_grad", "Functional.a.b.1.backward",
             "weird.5.forward", "5.forward", ".1.forward", "x.y.forward", "Functional..1.forward", "a..forward",
             "Functional.relu.\u0663.forward", "\u00e9.12.backward", "a.1.forwardx", "a.1.Forward", ".forward",
             "forward", "", ".", "Distributed.all_reduce.4.forward", "Module.blocks.0.attn.Attention.backward.12"]
    got = engine._api_keys(names)
    monkeypatch.setattr(engine, "_cflat", None)
    assert engine._api_keys(names) == got
    assert got[:3] == ["Functional.linear.0.forward", "Functional.linear.0.forward", "Tensor.__add__.0.backward"]
    assert engine._directions(names * 2) == [direction(n) for n in names * 2]


@needs_c
def test_finding_texts_same_by_c_and_python(monkeypatch):
    """The statistics judge's findings read "{head}{ratio:.3g}{tail}" whether made in C or
    in Python, for every kind of float64: tiny, huge, inf, NaN, signed zero, halfway cases."""
    import numpy as np

    from probe.compare import engine

    rng = np.random.default_rng(0)
    numbers = np.concatenate([rng.standard_normal(5000) * np.exp(rng.uniform(-700, 700, 5000)),
                              [np.inf, -np.inf, np.nan, 0.0, -0.0, 5e-324, 1.7976931348623157e308, 999.5, 9.995, 1.0]])
    head, tail = "warning: statistics off by ", "x the float32 tolerance (rtol 0.0001) \u00e9 100%"
    got = engine._g3_texts(head, numbers[::2], tail)        # (a strided view: taken contiguous)
    monkeypatch.setattr(engine, "_cflat", None)
    assert engine._g3_texts(head, numbers[::2], tail) == got
    assert got == [head + format(x, ".3g") + tail for x in numbers[::2].tolist()]
