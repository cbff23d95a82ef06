"""Diagnosis on real training runs: several optimizer steps, the NPU side in bf16 or fp32.

Every step of a tiny HF GPT-2 / Llama (AdamW) or conv net with BatchNorm (SGD momentum)
is dumped and compared with an fp32 bench run step by step (``real_runs``). A clean run
must name nothing at any step, though from step 1 on every weight differs; a kernel made
wrong below the API level (``KernelFault``) at one step must be named at that step, and
nothing before it. The expected culprit comes from the fault (which aten call it hit),
never from probe's output.

Cost: dumps are shared per module (benches, clean runs); a fault at step s runs s + 1
steps and compares step s only: its steps before s are checked to be the clean run's
dumps exactly (same call sequence, same values), which the clean tests diagnose.
"""
import csv
import math

import openpyxl
import pytest
from real_runs import KernelFault, compare_steps, load_data, run

from probe.torch_compat import TORCH

STEPS = 3


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]   # conftest: one intra-op thread


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """``dumps(kind, task, opt, bf16)`` -> root of that run's STEPS-step dump, made once."""
    base = tmp_path_factory.mktemp("real_runs")
    made = {}

    def get(kind, task="tensor", opt="adamw", bf16=False):
        key = (kind, task, opt, bf16)
        if key not in made:
            root = base / f"{kind}_{task}_{opt}_{'bf16' if bf16 else 'fp32'}"
            made[key] = run(kind, root, task, steps=STEPS, bf16=bf16, opt=opt)
        return made[key]
    return get


@pytest.fixture(scope="module")
def clean(dumps, tmp_path_factory):
    """``clean(kind, task, opt)`` -> per-step compare of a clean bf16 run with the fp32 bench."""
    done = {}

    def get(kind, task="tensor", opt="adamw"):
        key = (kind, task, opt)
        if key not in done:
            out = tmp_path_factory.mktemp(f"clean_{kind}_{task}_{opt}")
            done[key] = compare_steps(dumps(kind, task, opt, bf16=True), dumps(kind, task, opt), out, STEPS)
        return done[key]
    return get


# ---------------------------------------------------------------- clean runs name nothing

@pytest.mark.parametrize("kind, task, opt", [
    ("gpt2", "tensor", "adamw"),
    ("llama", "tensor", "adamw"),
    ("conv", "tensor", "sgd"),
    ("gpt2", "statistics", "adamw"),
    # the conv weight gradient at step 1: 6% from a bf16 gradient whose statistics agree to 0.2%
    ("conv", "statistics", "sgd"),
    # rsqrt's backward at step 1: its gradient (7e-5 in size) was measured against bf16's floor
    ("llama", "statistics", "adamw"),
])
def test_clean_bf16_run_names_nothing_at_any_step(clean, kind, task, opt):
    steps = clean(kind, task, opt)
    assert len(steps) == STEPS
    for s, (_, summary) in enumerate(steps):
        fd = summary["first_divergence"]
        assert summary["mode"] == task
        assert fd["name"] is None and fd["forward"] is None and fd["backward"] is None, \
            (s, summary["verdict"], summary["suspects"][:3])
        assert summary["verdict"].startswith("no API introduces error"), (s, summary["verdict"])
        assert summary["calls"]["introduces"] == 0, s
        assert summary["drift"] is not None and summary["drift"]["forward"] is not None, s
    for s, (_, summary) in enumerate(steps):
        state = summary["state"]
        if s == 0:      # same initial weights and data: nothing read from outside differs
            assert state["differ"] is False, (s, state["text"], state["largest"])
        else:           # step s-1's bf16 update moved the weights
            assert state["differ"] is True and state["max_error"] > 0, (s, state)


# ---------------------------------------------------------------- faults named at their step

def _flagged(summary):
    return summary["first_divergence"]["name"], [x["npu_name"] for x in summary["suspects"][:3]]


def _rows(paths, expected):
    """(csv rows, compare_result sheet rows, Summary sheet dict, Diagnosis rows) of ``expected``."""
    csv_path = next(p for p in paths if p.endswith(".csv"))
    xlsx_path = next(p for p in paths if p.endswith(".xlsx"))
    prefix = expected + "."
    with open(csv_path, newline="", encoding="utf-8") as fh:
        csv_rows = [r for r in csv.DictReader(fh) if r["NPU Name"].startswith(prefix)]
    wb = openpyxl.load_workbook(xlsx_path, read_only=True)
    try:
        def table(ws):
            it = ws.iter_rows(values_only=True)
            head = next(it)
            return [dict(zip(head, r)) for r in it]
        sheet = [r for r in table(wb["compare_result"]) if str(r["NPU Name"]).startswith(prefix)]
        summary = {r["Item"]: r["Value"] for r in table(wb["Summary"])}
        diag = [r for r in table(wb["Diagnosis"]) if r["NPU Name"] == expected]
    finally:
        wb.close()
    return csv_rows, sheet, summary, diag


def _jump_ok(j):
    """A jump is a plain ratio or "inf": never a huge float standing for a division by ~0."""
    return j == "inf" or (isinstance(j, (int, float)) and math.isfinite(j) and j < 1e6)


def _check_named(paths, summary, expected):
    """``expected`` is the step's first divergence, suspect 1, and an error row in xlsx/csv."""
    direction = expected.rsplit(".", 1)[1]
    fd = summary["first_divergence"]
    assert fd["name"] == expected, (expected, _flagged(summary), fd[direction])
    assert fd["direction"] == direction
    culprit = fd[direction]
    assert culprit["kind"] == "introduced" and culprit["status"] == "introduces"
    assert summary["verdict"].startswith(expected), summary["verdict"]
    assert summary["suspects"][0]["npu_name"] == expected, _flagged(summary)
    for rec in [culprit] + summary["suspects"]:
        assert _jump_ok(rec["jump"]), (rec["npu_name"], rec["jump"])
    csv_rows, sheet_rows, sheet_summary, diag = _rows(paths, expected)
    outputs = f"{expected}.output."
    assert any(r["Result"] == "error" for r in csv_rows if r["NPU Name"].startswith(outputs)), \
        [(r["NPU Name"], r["Result"]) for r in csv_rows]
    assert any(r["Result"] == "error" for r in sheet_rows if r["NPU Name"].startswith(outputs))
    assert str(sheet_summary["suspect 1"]).startswith(expected), sheet_summary["suspect 1"]
    assert len(diag) == 1 and (diag[0]["Jump"] is None or _jump_ok(diag[0]["Jump"])), diag   # the sheet: no 'inf' text


def _same_dump(root_a, root_b, step):
    """Two dumps of one step hold the same calls with the same values (tensor files named alike)."""
    a, b = load_data(root_a, step), load_data(root_b, step)
    assert list(a) == list(b), step
    for name in a:
        assert a[name] == b[name], (step, name)


def _case_id(v):
    if isinstance(v, tuple):
        op, nth, step, how, factor = v[:5]
        return f"{op.split('.')[0]}-n{nth}-s{step}-{how}{factor}"
    return {True: "bf16", False: "fp32"}.get(v, v) if isinstance(v, bool) else str(v)


FAULTS = [
    # kind, task, optimizer, bf16 NPU, (aten op, nth call, step, how, factor)
    ("gpt2", "tensor", "adamw", True, ("tanh.default", 0, 2, "scale", 1.02)),           # forward
    ("gpt2", "tensor", "adamw", True, ("tanh_backward.default", 1, 1, "scale", 1.02)),  # backward
    ("gpt2", "tensor", "adamw", True, ("addcdiv_.default", 5, 1, "scale", 1.01)),       # optimizer, 1%
    ("gpt2", "tensor", "adamw", False, ("addcdiv_.default", 2, 2, "scale", 1.02)),
    ("llama", "tensor", "adamw", True, ("silu.default", 0, 0, "scale", 1.01)),         # 1% in bf16
    ("llama", "tensor", "adamw", False, ("silu_backward.default", 0, 1, "scale", 1.02)),
    ("conv", "tensor", "sgd", True, ("relu.default", 1, 1, "scale", 1.02)),
    ("conv", "tensor", "sgd", True, ("native_batch_norm.default", 1, 0, "offset", 0.05)),
    ("conv", "tensor", "sgd", False, ("threshold_backward.default", 0, 2, "scale", 1.02)),
    ("conv", "tensor", "adamw_foreach", False, ("_foreach_addcdiv_.ScalarList", 0, 1, "scale", 1.02, 3)),
    pytest.param("conv", "tensor", "adamw_fused", False, ("_fused_adamw_.default", 0, 0, "scale", 1.02, 3),
                 marks=pytest.mark.skipif(TORCH < (2, 4), reason="fused AdamW runs on the CPU from torch 2.4")),
    ("conv", "tensor", "adamw_foreach", True, ("_foreach_addcdiv_.ScalarList", 0, 2, "scale", 1.02, 1)),
    ("conv", "statistics", "adamw_foreach", False, ("_foreach_addcdiv_.ScalarList", 0, 1, "scale", 1.02, 3)),
    ("gpt2", "statistics", "adamw", True, ("tanh.default", 1, 1, "scale", 1.5)),
    ("gpt2", "statistics", "adamw", False, ("native_layer_norm.default", 3, 2, "offset", 0.05)),
]


@pytest.mark.parametrize("kind, task, opt, bf16, spec", FAULTS, ids=_case_id)
def test_fault_named_at_its_step(dumps, tmp_path, kind, task, opt, bf16, spec):
    fault = KernelFault(*spec)
    npu = run(kind, tmp_path / "npu", task, steps=fault.step + 1, bf16=bf16, fault=fault, opt=opt)
    assert fault.applied
    fault.check_mapping(npu)
    expected = fault.expected()
    # before the fault the run is the clean one (bf16) or the bench itself (fp32)
    reference = dumps(kind, task, opt, bf16=bf16)
    for s in range(fault.step):
        _same_dump(npu, reference, s)
    paths, summary = compare_steps(npu, dumps(kind, task, opt), tmp_path / "out", [fault.step])[0]
    _check_named(paths, summary, expected)
