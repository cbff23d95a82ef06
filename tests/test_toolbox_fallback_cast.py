"""OpFallback and OpDtypeCast on real models: the fallback path runs (CPU copies, results
back with autograd), in-place / out= / setitem keep their semantics (the user's tensor is
updated, its version bumps, gradients equal a run without the tool); casting changes the
computation's dtype only where asked and reports each call."""
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from probe.toolbox import OpDtypeCast, OpFallback, apply_feature
from probe.toolbox.options import parse_dtype_map


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """Tools write their default results folder under the working directory."""
    monkeypatch.chdir(tmp_path)


BF16 = torch.bfloat16


def _step(a, b, w):
    """A small model step using in-place ops, setitem and out=; returns (loss, version bumps)."""
    h = torch.sin(a @ w)
    v0 = h._version
    h.add_(b)                         # in place on a non-leaf
    h[0] = 0.5                        # __setitem__ returns None
    F.relu(h, inplace=True)
    buf = torch.empty_like(h)
    with torch.no_grad():
        torch.mul(h, 2, out=buf)      # out=
    return (h.pow(2).sum() + (buf * h).mean()), h._version - v0, buf


def _inputs():
    torch.manual_seed(0)
    return (torch.randn(6, 8, requires_grad=True), torch.randn(6, 5, requires_grad=True),
            torch.randn(8, 5, requires_grad=True))


def test_fallback_keeps_inplace_semantics_and_gradients():
    a, b, w = _inputs()
    loss0, bumps0, buf0 = _step(a, b, w)
    g0 = torch.autograd.grad(loss0, (a, b, w))
    with OpFallback(verbose=False) as fb:
        loss1, bumps1, buf1 = _step(a, b, w)
    g1 = torch.autograd.grad(loss1, (a, b, w))
    assert torch.equal(loss0, loss1) and torch.equal(buf0, buf1)
    assert bumps1 == bumps0 == 3
    for x, y in zip(g0, g1):
        assert torch.equal(x, y)
    ran = {(n, what) for n, _, what in fb.calls}
    for api in ("Tensor.add_", "Functional.relu", "Tensor.__setitem__", "Torch.mul", "Tensor.__matmul__"):
        assert (api, "fallback") in ran, api


def test_fallback_returns_the_real_tensor_for_inplace_and_leaves_views_on_device():
    x = torch.zeros(3, 4)
    with apply_feature(["torch.Tensor.add_", "torch.Tensor.view"], "fallback", verbose=False) as fb:
        y = x.add_(1)
        v = x.view(12)               # a view must alias x: stays on the device
    assert y is x and torch.equal(x, torch.ones(3, 4))
    v[0] = 7
    assert x[0, 0] == 7
    assert fb.calls == [("Tensor.add_", 0, "fallback"), ("Tensor.view", 0, "on device: the result is a view of an input")]


def test_fallback_mlp_training_matches_and_bisects_by_loss():
    """Bisect workflow: falling back one API at a time leaves a healthy model's loss unchanged."""
    def train(tool=None):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x, t = torch.randn(32, 16), torch.randint(0, 4, (32,))
        losses = []
        for _ in range(3):
            if tool:
                tool.start()
            loss = F.cross_entropy(m(x), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if tool:
                tool.stop()
            losses.append(loss.item())
        return losses
    ref = train()
    for api in ("linear", "gelu", "layer_norm", "cross_entropy"):
        tool = OpFallback(ops=api, verbose=False)
        assert train(tool) == ref, api
        assert tool.calls and all(c[2] == "fallback" for c in tool.calls)


def test_fallback_condition_func_and_env(monkeypatch):
    monkeypatch.setenv("OP_FALLBACK_LIST", "gelu,silu")
    monkeypatch.setenv("OP_FALLBACK_DISABLE_LIST", "silu")
    x = torch.randn(4, 4)
    with OpFallback(verbose=False, condition_func=lambda t, *a, **k: t.shape[0] == 4) as fb:
        F.gelu(x), F.silu(x), F.gelu(torch.randn(2, 2)), torch.tanh(x)
    assert [(n, i) for n, i, _ in fb.calls] == [("Functional.gelu", 0)]


def test_dtype_cast_runs_the_api_in_the_target_dtype():
    """fp32 -> fp64 for linear: the model's output is exactly the fp64 linear rounded to fp32."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 64)
    x = torch.randn(32, 256, requires_grad=True)
    plain = lin(x)
    with OpDtypeCast(ops="linear", dtype_map="torch.float32->torch.float64", verbose=False) as cast:
        out = lin(x)
        out.sum().backward()
    w, b = lin.weight.detach().double(), lin.bias.detach().double()
    assert out.dtype == torch.float32
    assert torch.equal(out, F.linear(x.detach().double(), w, b).float())
    assert not torch.equal(out, plain)                     # fp32 accumulation differs
    assert x.grad.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32
    assert torch.allclose(x.grad, lin.weight.detach().sum(0).expand(32, 256))
    assert cast.calls == [{"name": "Functional.linear", "call_id": 0,
                           "inputs": "float32->float64,float32->float64,float32->float64",
                           "outputs": "float64->float32"}]


def test_dtype_cast_inplace_updates_the_real_tensor(monkeypatch):
    monkeypatch.setenv("OP_DTYPE_CAST_DICT", "bf16->fp32")
    a = torch.randn(64, requires_grad=True)
    h = (a * 1).to(BF16)
    t = torch.randn(64, dtype=BF16)
    v0 = h._version
    with OpDtypeCast(ops="^Tensor.mul_$", verbose=False) as cast:
        y = h.mul_(t)
    assert y is h and h.dtype == BF16 and h._version > v0
    assert torch.equal(h, ((a.detach().to(BF16)).float() * t.float()).to(BF16))
    h.float().sum().backward()
    assert torch.equal(a.grad, t.float())                  # the gradient reached the original tensor
    assert len(cast.calls) == 1


def test_parse_dtype_map_and_per_op_override(monkeypatch):
    assert parse_dtype_map("torch.float16->torch.float32,bf16->fp64") == {torch.float16: torch.float32,
                                                                           BF16: torch.float64}
    with pytest.raises(ValueError):
        parse_dtype_map("bf16=fp32")
    monkeypatch.setenv("GELU_OP_DTYPE_CAST_DICT", "bf16->fp64")
    x = torch.randn(8, dtype=BF16)
    with OpDtypeCast(ops="gelu,silu", verbose=False) as cast:
        F.gelu(x), F.silu(x)
    assert [c["inputs"] for c in cast.calls] == ["bfloat16->float64", "bfloat16->float32"]


def test_verbose_calls_are_logged_not_printed(caplog, capsys):
    caplog.set_level(logging.INFO, logger="probe")
    x = torch.randn(4, 8)
    with OpFallback(ops="^Tensor.add$", verbose=True):
        x.add(1)
    with OpDtypeCast(ops="gelu", dtype_map="torch.float32->torch.float64", verbose=True):
        F.gelu(x)
    said = [(r.name, r.getMessage()) for r in caplog.records if r.levelno == logging.INFO]
    assert ("probe.toolbox.fallback", "probe fallback: Tensor.add.0 fallback (cpu)") in said
    assert ("probe.toolbox.fallback", "probe fallback: 1 calls ran on cpu, 0 stayed on the device") in said
    assert ("probe.toolbox.dtype_cast",
            "probe cast_dtype: Functional.gelu.0 inputs float32->float64 outputs float64->float32") in said
    assert capsys.readouterr().out == ""
