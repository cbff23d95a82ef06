"""Diagnosis across two devices: runs that differ as two chips differ, not only by dtype.

The "NPU" run trains on a simulated second device (``second_device.Device``): its own
random stream with dropout on, TF32-like matrix units, another reduction order (split-K),
HF's fused attention where the bench runs eager attention with grouped k/v heads. A clean
run must name nothing at any step, in tensor and statistics mode; a fault of the kind real
kernels have (``real_runs.KernelFault``: a 2% scale, one wrong element, in forward and
backward, at steps 0-2) must be named at its step. The expected culprit comes from the
faulted aten call, never from probe's output.
"""
import json
import os

import pytest
import torch
import torch.nn.functional as F
from real_runs import KernelFault, compare_steps, run
from second_device import Device

STEPS = 3


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]   # conftest: one intra-op thread


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(kind, task, device, dropout, attn)`` -> a STEPS-step dump root, made once.
    ``device`` None is the bench (the CPU, eager attention, fp32); its "bf16" key runs the
    NPU side under bf16 autocast."""
    base = tmp_path_factory.mktemp("device_runs")
    made = {}

    def get(kind, task, device=None, dropout=0.0, attn="eager"):
        key = (kind, task, tuple(sorted((device or {}).items())), dropout, attn)
        if key not in made:
            root = base / f"run{len(made)}"
            sim = dict(device or {})
            bf16 = sim.pop("bf16", False)
            made[key] = run(kind, root, task, steps=STEPS, dropout=dropout, attn=attn, bf16=bf16,
                            device=Device(**sim) if device is not None else None)
        return made[key]
    return get


def _id(v):
    if isinstance(v, dict):
        return "+".join(f"{k}{'' if val is True else val}" for k, val in sorted(v.items())) or "cpu"
    if isinstance(v, tuple):
        return f"{v[0].split('.')[0]}-n{v[1]}-s{v[2]}-{v[3]}{v[4]}"
    return str(v)


CLEAN = [
    # kind, task, the NPU's device, dropout, the NPU's attention
    ("gpt2", "tensor", {"seed": 7}, 0.1, "eager"),            # its own random stream, dropout on
    ("gpt2", "statistics", {"seed": 7}, 0.1, "eager"),
    ("gpt2", "statistics", {"seed": 7, "bf16": True}, 0.1, "eager"),   # bf16 against fp32 too
    ("gpt2", "tensor", {"tf32": True}, 0.0, "eager"),         # TF32/HF32-like matrix units
    ("gpt2", "statistics", {"tf32": True}, 0.0, "eager"),
    ("gpt2", "statistics", {"tf32": "truncate"}, 0.0, "eager"),   # TF32 as an H200 ran it: see second_device
    ("gpt2", "tensor", {"tf32": "truncate"}, 0.0, "eager"),
    ("gpt2", "tensor", {"split_k": True, "seed": 7}, 0.1, "eager"),   # another reduction order
    ("llama", "tensor", {"split_k": True}, 0.0, "sdpa"),      # fused GQA attention against eager
]


@pytest.mark.parametrize("kind, task, device, dropout, attn", CLEAN, ids=_id)
def test_clean_device_run_names_nothing_at_any_step(runs, tmp_path, kind, task, device, dropout, attn):
    bench = runs(kind, task, dropout=dropout)
    npu = runs(kind, task, device, dropout, attn)
    for s, (_, summary) in enumerate(compare_steps(npu, bench, tmp_path, STEPS)):
        fd = summary["first_divergence"]
        assert fd["name"] is None and summary["calls"]["introduces"] == 0, \
            (s, summary["verdict"], [(x["npu_name"], x["reason"]) for x in summary["suspects"][:3]])
        if summary["calls"]["can't tell"]:   # statistics: a call four numbers could not judge is said
            assert "no API is shown to introduce error" in summary["verdict"], summary["verdict"]
            assert "can't be told from statistics" in summary["verdict"], summary["verdict"]
        else:
            assert "no API introduces error" in summary["verdict"], summary["verdict"]
        if dropout and device.get("seed"):
            draws = summary["draws"]
            assert draws["differ"] > 0 and draws["first_differing"] == "Functional.dropout.0.forward", draws
            assert summary["verdict"].startswith(
                "the two runs drew different random numbers from Functional.dropout.0.forward on"), summary["verdict"]
            assert summary["calls"]["draw"] == draws["calls"]
        if device.get("tf32") and task == "tensor":   # measured, said once, not assumed
            assert [p["api"] for p in summary["device_precision"]] == ["matrix units"], summary["device_precision"]
            assert "the NPU side's measured precision" in summary["verdict"]


FAULTS = [
    # kind, task, the NPU's device, dropout, attention, (aten op, nth call, step, how, factor)
    ("gpt2", "tensor", {"tf32": True, "seed": 7}, 0.1, "eager", ("addmm.default", 3, 1, "scale", 1.02)),
    ("gpt2", "tensor", {"seed": 7}, 0.1, "eager", ("tanh_backward.default", 1, 2, "scale", 1.02)),
    ("gpt2", "tensor", {"split_k": True, "seed": 7}, 0.1, "eager", ("addmm.default", 0, 0, "poke", 0.5)),
    ("gpt2", "statistics", {"tf32": True}, 0.0, "eager", ("tanh.default", 1, 1, "scale", 1.5)),
    # a matrix product 5% off (the demo's fault, named on an H200) in a run that declares TF32
    ("gpt2", "tensor", {"tf32": "truncate"}, 0.0, "eager", ("addmm.default", 3, 1, "scale", 1.05)),
    ("llama", "tensor", {"split_k": True}, 0.0, "sdpa",
     ("_scaled_dot_product_flash_attention_for_cpu_backward.default", 0, 1, "scale", 1.02)),
    ("llama", "tensor", {"tf32": True}, 0.0, "sdpa",
     ("_scaled_dot_product_flash_attention_for_cpu.default", 1, 2, "scale", 1.02)),
]


@pytest.mark.parametrize("kind, task, device, dropout, attn, spec", FAULTS, ids=_id)
def test_fault_on_a_device_named_at_its_step(runs, tmp_path, kind, task, device, dropout, attn, spec):
    fault = KernelFault(*spec)
    npu = run(kind, tmp_path / "npu", task, steps=fault.step + 1, fault=fault, dropout=dropout, attn=attn,
              device=Device(**device))
    if not fault.applied:
        pytest.skip(f"this torch runs no {spec[0]} here")
    expected = fault.expected()
    summary = compare_steps(npu, runs(kind, task, dropout=dropout), tmp_path / "out", [fault.step])[0][1]
    assert summary["first_divergence"]["name"] == expected, \
        (expected, summary["verdict"], [(x["npu_name"], x["reason"]) for x in summary["suspects"][:3]])
    assert summary["verdict"].startswith(expected), summary["verdict"]


def test_a_call_statistics_cannot_judge_is_said_not_passed_as_clean(runs, tmp_path):
    """Statistics mode, a run that declares truncated TF32 (every product moves by up to
    2e-3), a matrix product 5% off at step 1 whose inputs already differ: four statistics
    can't tell it from amplification. The verdict must say so, naming it, and never that
    no API introduces error (it said that before)."""
    fault = KernelFault("addmm.default", 3, 1, "scale", 1.05)
    npu = run("gpt2", tmp_path / "npu", "statistics", steps=2, fault=fault, device=Device(tf32="truncate"))
    summary = compare_steps(npu, runs("gpt2", "statistics"), tmp_path / "out", [1])[0][1]
    verdict = summary["verdict"]
    assert "no API introduces error" not in verdict, verdict
    if summary["first_divergence"]["name"] is None:
        assert summary["calls"]["can't tell"] >= 1, summary["calls"]
        assert f"can't be told from statistics, first {fault.expected()}" in verdict, verdict
        assert "the TF32/HF32 precision the runs declared" in verdict, verdict
    else:   # named outright: better still
        assert summary["first_divergence"]["name"] == fault.expected(), verdict


def _wrong_scale_dropout(original):
    """A dropout kernel that forgets 1/(1-p): kept elements equal the input."""
    def dropout(input, p=0.5, training=True, inplace=False):
        out = original(input, p, training, inplace)
        return out * (1 - p) if training and p > 0 else out
    return dropout


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_wrong_dropout_scale_is_named_though_the_draws_differ(runs, tmp_path, monkeypatch, task):
    monkeypatch.setattr(F, "dropout", _wrong_scale_dropout(F.dropout))
    npu = run("gpt2", tmp_path / "npu", task, steps=1, dropout=0.1, device=Device(seed=7))
    monkeypatch.undo()
    summary = compare_steps(npu, runs("gpt2", task, dropout=0.1), tmp_path / "out", [0])[0][1]
    assert summary["first_divergence"]["name"] == "Functional.dropout.0.forward", summary["verdict"]
    assert "1/(1-p)" in summary["verdict"], summary["verdict"]


def test_the_same_two_dumps_give_the_same_summary(runs, tmp_path):
    """Random calls are never re-run with a fresh draw: two compares agree to the byte
    (but for the output folder in the paths)."""
    npu = runs("gpt2", "tensor", {"seed": 7}, 0.1)
    bench = runs("gpt2", "tensor", dropout=0.1)
    a = compare_steps(npu, bench, tmp_path / "a", [1])[0][1]
    b = compare_steps(npu, bench, tmp_path / "b", [1])[0][1]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["draws"]["differ"] > 0 and os.path.basename(a["npu_json_path"]) == "dump.json"


def test_math_modes_are_recorded_and_named_beside_the_measured_precision(runs, tmp_path):
    """dump.json records the settings that set a device's precision, read as each step
    starts; the compare names those of the NPU side beside the precision it measured."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        npu = run("gpt2", tmp_path / "npu", "tensor", steps=1, device=Device(tf32=True))
    finally:
        torch.set_float32_matmul_precision(before)
    summary = compare_steps(npu, runs("gpt2", "tensor"), tmp_path / "out", [0])[0][1]
    assert summary["math_modes"]["npu"]["float32_matmul_precision"] == "high"
    assert summary["math_modes"]["bench"]["float32_matmul_precision"] == before
    (precision,) = summary["device_precision"]
    assert "float32_matmul_precision=high" in precision["text"], precision


def test_hf32_of_torch_npu_is_recorded(tmp_path, monkeypatch):
    from npu_standin import StandIn
    StandIn().install(monkeypatch)
    torch.npu.matmul.allow_hf32 = True
    from probe.dump.math_modes import math_modes, reduced_precision
    modes = math_modes()
    assert modes["npu.matmul.allow_hf32"] is True and "npu.matmul.allow_hf32" in reduced_precision(modes)
    torch.npu.matmul.allow_hf32 = False
    assert "npu.matmul.allow_hf32" not in reduced_precision(math_modes())


def _write_dump(path, entries):
    path.mkdir(parents=True)
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": entries}
    (path / "dump.json").write_text(json.dumps(doc), encoding="utf-8")
    return str(path / "dump.json")


def _stat(shape, mx, mn, mean, norm, dtype="torch.float32"):
    return {"type": "torch.Tensor", "dtype": dtype, "shape": shape, "Max": mx, "Min": mn, "Mean": mean,
            "Norm": norm, "requires_grad": False}


def test_finite_statistics_never_differ_by_inf(tmp_path):
    """A call whose output has another shape on one side (keepdim on one device) with finite
    statistics is not measured: never "differs by inf"; NaN on one side only still is."""
    from probe.compare import compare
    x = _stat([4, 4], 2.0, -1.0, 0.5, 3.0)
    npu = _write_dump(tmp_path / "npu", {
        "Torch.sum.0.forward": {"input_args": [x], "input_kwargs": {}, "output": [_stat([4, 1], 3.0, 1.0, 2.0, 4.5)]},
        "Torch.exp.0.forward": {"input_args": [x], "input_kwargs": {}, "output": [_stat([4, 4], float("nan"), 0.3, 1.0, 5.0)]}})
    bench = _write_dump(tmp_path / "bench", {
        "Torch.sum.0.forward": {"input_args": [x], "input_kwargs": {}, "output": [_stat([4], 3.0, 1.0, 2.0, 4.5)]},
        "Torch.exp.0.forward": {"input_args": [x], "input_kwargs": {}, "output": [_stat([4, 4], 7.4, 0.3, 1.0, 5.0)]}})
    paths = compare({"npu_json_path": npu, "bench_json_path": bench, "is_print_compare_log": False},
                    str(tmp_path / "out"), html=False)
    with open(paths[-1], encoding="utf-8") as fh:
        summary = json.load(fh)
    assert "inf" not in summary["verdict"].split("Torch.exp")[0], summary["verdict"]
    assert summary["first_divergence"]["name"] == "Torch.exp.0.forward", summary["verdict"]
    assert "Torch.sum.0.forward" not in [s["npu_name"] for s in summary["suspects"]]
