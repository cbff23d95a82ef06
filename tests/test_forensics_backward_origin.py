"""Backward-error origin: a backward that raises, or turns finite gradients into NaN/Inf,
is traced to the forward API call that made the node, without anomaly mode."""
import json

import pytest
import torch
from custom_ops import define

from probe.debugger import PrecisionDebugger
from probe.forensics import backward_origin

ERR = RuntimeError("custom backward kernel failed")


def _gate_backward(ctx, grad):
    raise ERR


define("probe_origin_test", "gate(Tensor x) -> Tensor", lambda x: x.clone(), backward=_gate_backward)


class Gate(torch.nn.Module):
    def forward(self, x):
        y = torch.sigmoid(x)
        y.mul_(2)                   # in place on a tensor sigmoid saved for backward
        return y


class Net(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = act

    def forward(self, x):
        return self.act(self.fc(x))


class Root(torch.nn.Module):
    def forward(self, x):
        return torch.sqrt(x) * 3    # sqrt'(0) = inf: finite forward, Inf gradient


class Custom(torch.nn.Module):
    def forward(self, x):
        return torch.ops.probe_origin_test.gate(x)


def _debugger(tmp_path):
    d = PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level="L1")
    backward_origin.enable(d)
    return d


def _reports(tmp_path):
    return json.loads((tmp_path / "backward_origin.json").read_text())


@pytest.fixture(autouse=True)
def _restore():
    original = torch.autograd.backward
    yield
    for f in list(backward_origin._trackers):
        backward_origin.untrack(f)
    assert torch.autograd.backward is original


def _error_without_probe(model, x):
    try:
        model(x).sum().backward()
    except RuntimeError as exc:
        return str(exc)
    raise AssertionError("expected backward to fail")


def test_backward_raises_in_a_registered_api_node(tmp_path, caplog):
    torch.manual_seed(0)
    model = Net(Gate())
    x = torch.randn(3, 4)
    expected = _error_without_probe(model, x)
    d = _debugger(tmp_path)
    d.start()
    out = model(x).sum()
    with pytest.raises(RuntimeError) as info:
        out.backward()
    d.stop()
    assert str(info.value) == expected                    # the user's error, untouched
    (rep,) = _reports(tmp_path)
    assert rep["kind"] == "exception" and rep["entry"] == "Torch.sigmoid.0.forward"
    assert rep["node"] == "SigmoidBackward0"
    assert rep["module_path"] == "act" and rep["module_classes"] == ["Net", "Gate"]
    assert "test_forensics_backward_origin.py" in rep["forward_stack"][0]
    assert "y = torch.sigmoid(x)" in rep["forward_stack"][0]
    assert "modified by an inplace operation" in rep["exception"]["message"]
    assert any("SigmoidBackward0 raised" in r.getMessage() and "Torch.sigmoid.0.forward" in r.getMessage()
               for r in caplog.records)


def test_custom_op_backward_raises_same_exception(tmp_path):
    model = Net(Custom())
    d = _debugger(tmp_path)
    d.start()
    loss = model(torch.randn(2, 4)).sum()
    with pytest.raises(RuntimeError) as info:
        torch.autograd.grad(loss, list(model.parameters()))
    d.stop()
    assert info.value is ERR
    (rep,) = _reports(tmp_path)
    assert rep["entry"] == "Custom.probe_origin_test.gate.0.forward" and rep["module_classes"] == ["Net", "Custom"]


def test_nan_born_in_backward(tmp_path, caplog):
    def run(debugger):
        torch.manual_seed(0)
        model = Net(Root())
        x = torch.randn(3, 4)
        with torch.no_grad():
            model.fc.weight.zero_()          # fc outputs its bias
            model.fc.bias.copy_(torch.tensor([0.0, 1.0, 4.0, 9.0]))
        if debugger:
            debugger.start()
        y = model(x)
        assert torch.isfinite(y).all()                     # the forward is finite
        y.sum().backward()
        if debugger:
            debugger.stop()
        return model.fc.bias.grad.clone(), model.fc.weight.grad.clone()

    plain = run(None)
    d = _debugger(tmp_path)
    traced = run(d)
    assert all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(plain, traced))
    assert torch.isinf(traced[0][0])                      # the NaN/Inf really happened
    reps = _reports(tmp_path)
    assert [r["entry"] for r in reps] == ["Torch.sqrt.0.forward"], reps
    rep = reps[0]
    assert rep["kind"] == "nonfinite" and rep["node"] == "SqrtBackward0"
    assert rep["module_path"] == "act" and "torch.sqrt(x) * 3" in rep["forward_stack"][0]
    # the nodes downstream of sqrt (the linear's) got Inf from sqrt: not reported as origins
    assert not any("Functional.linear" in r.getMessage() for r in caplog.records)


def test_healthy_backward_reports_nothing(tmp_path):
    model = Net(torch.nn.GELU())
    d = _debugger(tmp_path)
    d.start()
    model(torch.randn(5, 4)).pow(2).mean().backward()
    d.stop()
    assert not (tmp_path / "backward_origin.json").exists()
    backward_origin.disable(d)
    assert getattr(torch.autograd.backward, "_probe_original", None) is None
