"""The report reads the diagnosis's calls once (``call_fields.CallFields``) for the
Diagnosis sheet and the page: what each shows is what it shows reading them alone, and
the page's one group of a compare without stack.json is the group each call's missing
stack makes."""
import os

import numpy as np
import orjson
import pytest

from probe.compare import diagnosis, engine, html_report, summary_json
from probe.compare.call_fields import CallFields
from probe.compare.report import diagnosis_sheet

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "msprobe")


@pytest.fixture(scope="module")
def diagnosed():
    npu = os.path.join(FIX, "v26_L1_statistics_bf16", "step0", "proc7891")
    bench = os.path.join(FIX, "v26_L1_statistics_fp32", "step0", "proc7855")
    result = engine.compare_dumps(os.path.join(npu, "dump.json"), os.path.join(bench, "dump.json"),
                                  os.path.join(npu, "stack.json"), progress=False)
    diag = diagnosis.diagnose(result, None, progress=False)
    diagnosis.mark_rows(result, diag)
    return result, diag, summary_json.build(result, diag, None)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=True)
    return a == b


def test_shared_call_fields_give_the_sheet_and_page_of_unshared_ones(diagnosed):
    result, diag, digest = diagnosed
    fields = CallFields(diag.calls)
    shared, alone = diagnosis_sheet(diag, fields), diagnosis_sheet(diag)
    assert len(diag.calls) > 10 and any(u.output_error is not None for u in diag.calls)
    assert all(_same(a, b) for a, b in zip(shared.columns, alone.columns))
    assert shared.row_styles == alone.row_styles
    page = html_report._data(result, diag, digest, {}, fields)
    assert orjson.dumps(page, default=html_report._plain) == orjson.dumps(
        html_report._data(result, diag, digest, {}), default=html_report._plain)
    thresholds = fields.judged_thresholds()
    assert thresholds == [u.threshold if u.output_error is not None else None for u in diag.calls]


def test_without_stacks_the_calls_make_one_group_as_each_missing_stack_does(diagnosed, monkeypatch):
    result, diag, _ = diagnosed
    result.stack_path, saved = None, result.stack_path
    try:
        fast = html_report._groups(result, CallFields(diag.calls))
        # stacks that name none of the calls: each call's own (missing) frame, one by one
        monkeypatch.setattr(html_report.StackLookup, "__init__",
                            lambda self, path: setattr(self, "stacks", {"Other.call.0.forward": "File x"}))
        slow = html_report._groups(result, CallFields(diag.calls))
    finally:
        result.stack_path = saved
    assert fast[1:] == slow[1:] == ([["(no stack)"]], "stack file")
    assert fast[0].dtype == slow[0].dtype and fast[0].tolist() == slow[0].tolist() == [0] * len(diag.calls)
