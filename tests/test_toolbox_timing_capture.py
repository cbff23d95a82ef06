import pytest

"""OpTimeMeasure: one CSV row per call, backward time per call, warm-up flagged, summary;
OpCapture + probe replay: a captured MLP replays bitwise on the CPU, forward and backward,
a tampered capture is reported, saved files load with weights_only."""
import argparse
import csv
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import needs_pt_loads

from probe.toolbox import OpCapture, OpTimeMeasure, apply_feature, replay_cli


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """Tools write their default results folder under the working directory."""
    monkeypatch.chdir(tmp_path)



def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def _replay(argv, capsys):
    parser = argparse.ArgumentParser()
    replay_cli.add_arguments(parser)
    rc = replay_cli.run(parser.parse_args(argv))
    return rc, capsys.readouterr().out


def test_timing_one_row_per_call_with_backward(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="probe")
    m = _mlp()
    x, t = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with OpTimeMeasure(output_dir=str(tmp_path), warmup=1) as tm:
        for _ in range(3):
            F.cross_entropy(m(x), t).backward()
    expected = {"Functional.linear": 6, "Functional.gelu": 3, "Functional.cross_entropy": 3}
    with open(tmp_path / "op_time.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    counts = {}
    for r in rows:
        counts[r["name"]] = counts.get(r["name"], 0) + 1
    assert counts == expected
    assert [r["call_id"] for r in rows if r["name"] == "Functional.linear"] == [str(i) for i in range(6)]
    assert all(float(r["forward_ms"]) >= 0 and float(r["backward_ms"]) >= 0 for r in rows)
    assert [r["warmup"] for r in rows if r["name"] == "Functional.gelu"] == ["True", "False", "False"]
    lin0 = rows[0]
    assert lin0["input_shapes"] == "8x16;32x16;32" and lin0["output_shapes"] == "8x32"
    assert lin0["input_dtypes"] == "float32;float32;float32"
    summary = {a["name"]: a for a in tm.summary()}
    assert summary["Functional.linear"]["calls"] == 5 and summary["Functional.gelu"]["calls"] == 2
    # verbose (the default): the summary table is logged at INFO, not printed
    table = [r.getMessage() for r in caplog.records if r.name == "probe.toolbox.timing"]
    assert len(table) == 1 and "slowest APIs" in table[0] and "Functional.linear" in table[0]
    assert "slowest APIs" not in capsys.readouterr().out
    assert (tmp_path / "op_time_summary.csv").exists()


def test_timing_measures_the_slow_api(tmp_path):
    big, small = torch.randn(400, 400), torch.randn(4, 4)
    with OpTimeMeasure(output_dir=str(tmp_path), warmup=0, verbose=False) as tm:
        for _ in range(3):
            big @ big @ big
            small + small
    top = tm.summary()[0]
    assert top["name"] == "Tensor.__matmul__"


@needs_pt_loads
def test_capture_and_replay_reproduce(tmp_path, capsys):
    m = _mlp()
    x, t = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with OpCapture(output_dir=str(tmp_path), verbose=False) as cap:
        F.cross_entropy(m(x), t).backward()
    lin = tmp_path / "Functional.linear" / "1"
    assert {"meta.json", "inputs.pt", "outputs.pt", "grads.pt"} <= set(os.listdir(lin))
    saved = torch.load(lin / "inputs.pt", weights_only=True)
    assert torch.equal(saved["1"], m[2].weight.detach())
    grads = torch.load(lin / "grads.pt", weights_only=True)
    assert torch.equal(grads["in.1"], m[2].weight.grad)          # grad w.r.t. the API's weight input
    assert len(cap.saved) == 4
    rc, out = _replay([str(tmp_path), "--verbose"], capsys)
    assert rc == 0, out
    assert "grad_input.1 vs saved: pass max_abs=0 " in out           # bitwise on the same device
    assert "output.0 vs float64 golden: pass" in out
    assert "grad_input.1 vs float64 golden: pass" in out             # weight grad vs the fp64 golden's
    rc, out = _replay([str(tmp_path), "--time", "--times", "2", "--forward-only", "--ops", "linear"], capsys)
    assert rc == 0 and out.count("Functional.linear.") == 2 and "gelu" not in out
    # a capture that does not reproduce is reported
    data = torch.load(lin / "outputs.pt", weights_only=True)
    data["0"] = data["0"] * 1.1
    torch.save(data, lin / "outputs.pt")
    rc, out = _replay([str(tmp_path)], capsys)
    assert rc == 1 and "Functional.linear.1" in out and "output.0 vs saved: fail" in out


@needs_pt_loads
def test_capture_inplace_inputs_are_taken_before_the_call(tmp_path, capsys):
    h = torch.ones(5)
    with apply_feature("torch.Tensor.mul_", "op_capture", output_dir=str(tmp_path), verbose=False):
        h.mul_(3)
    saved = torch.load(tmp_path / "Tensor.mul_" / "0" / "inputs.pt", weights_only=True)
    assert torch.equal(saved["0"], torch.ones(5))
    rc, out = _replay([str(tmp_path)], capsys)
    assert rc == 0, out
