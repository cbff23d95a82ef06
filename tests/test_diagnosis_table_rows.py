"""The diagnosis takes the rows' statistics from the compare's columns (``CompareResult.table_rows``
names the rows they were read from) and reads a row replaced since the compare (as a shard
merge's ``before_diagnosis`` replaces rows) from the row itself: the same diagnosis as one
that reads every row."""
import glob
import os
from array import array

import msgspec

from probe.compare.diagnosis import diagnose
from probe.compare.engine import compare_dumps

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "msprobe")


def dump(name):
    return glob.glob(os.path.join(FIX, name, "step0", "*", "dump.json"))[0]


def _numbers(diag):
    return [(u.status, u.input_error, u.output_error, u.worst_row) for u in diag.calls]


def test_a_row_replaced_after_the_compare_is_diagnosed_by_its_own_statistics():
    result = compare_dumps(dump("v26_L1_statistics_bf16"), dump("v26_L1_statistics_fp32"), progress=False,
                           workers=1)
    assert result.table_rows is not None and result.table_rows[0] == [p.npu for p in result.pairs]
    before = diagnose(result)
    u = next(u for u in before.calls if u.worst_row is not None and u.output_error is not None
             and result.pairs[u.worst_row].npu.stats[3] > 0)
    i = u.worst_row
    pair = result.pairs[i]
    pair.npu = msgspec.structs.replace(pair.npu, store=array("d", [x * 3.0 for x in pair.npu.stats]), k=0)
    after = diagnose(result)
    assert after.calls[u.index].output_error != before.calls[u.index].output_error
    result.table_rows = None                    # no record of the rows: every row read
    assert _numbers(diagnose(result)) == _numbers(after)


def test_a_table_without_statistic_columns_reads_the_rows():
    md5 = compare_dumps(dump("v26_L1_statistics_md5_bf16"), dump("v26_L1_statistics_md5_fp32"), progress=False,
                        workers=1)
    assert "NPU max" not in md5.columns
    diag = diagnose(md5)
    md5.table_rows = None
    assert _numbers(diagnose(md5)) == _numbers(diag)


def _with_a_shape_changed(tmp_path, name: str) -> str:
    """A copy of fixture ``name``'s dump with its first output tensor's shape reversed: a
    pair whose rows hold the same names and differ in one shape."""
    import json
    with open(dump(name), encoding="utf-8") as fh:
        doc = json.load(fh)
    for entry in doc["data"].values():
        out = (entry.get("output") or [None])[0]
        if isinstance(out, dict) and out.get("type") == "torch.Tensor" and len(out.get("shape") or []) > 1 \
                and out["shape"] != out["shape"][::-1]:
            out["shape"] = out["shape"][::-1]
            break
    else:
        raise AssertionError("no output tensor whose shape reverses differently")
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def test_the_per_row_facts_from_the_tables_codes_are_those_read_from_the_rows(tmp_path):
    """The per-row facts (which side holds a row, which rows are tensors, equal shapes, the
    bench tensor's elements) come from the table's codes of the rows where the pairs still
    hold them (``CompareResult.table_codes``): the same facts as read from the rows, on a
    pair with one-sided rows and on one whose rows differ in a shape."""
    import numpy as np
    from probe.compare.diagnosis import _RowFacts
    one_sided = compare_dumps(dump("v26_L1_statistics_bf16"), dump("v833_L1_statistics_bf16"), progress=False,
                              workers=1)
    reshaped = compare_dumps(dump("v26_L1_statistics_fp32"), _with_a_shape_changed(tmp_path, "v26_L1_statistics_bf16"),
                             progress=False, workers=1)
    for result in (one_sided, reshaped):
        assert result.table_codes is not None and result.table_rows is not None
        coded = _RowFacts.of(result)
        result.table_codes = None
        read = _RowFacts.of(result)
        for name in ("npu_tensor", "bench_tensor", "has_npu", "has_bench", "paired", "same_shape", "out_same",
                     "bench_in", "bench_numel", "bench_norm", "part"):
            a, b = getattr(coded, name), getattr(read, name)
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name
        facts = read
    assert not facts.same_shape[facts.paired].all()                   # the reshaped pair: a shape differs
    assert not all(p.npu is not None and p.bench is not None for p in one_sided.pairs)     # one-sided rows
