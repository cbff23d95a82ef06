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
