"""OpAutoCompare on real models on the CPU: a bf16 model passes against its float64 golden,
a deliberately faulty API is flagged (forward or backward only), failing calls are saved
and replayable, in-place APIs are compared from copies made before the call, random APIs
by statistics, tolerances follow kwargs > per-API env > per-dtype env > global env."""
import argparse
import csv
import logging
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml
from conftest import needs_pt_loads

from probe.hook_module.registry import DEFAULT_YAML
from probe.toolbox import OpAutoCompare, apply_feature, replay_cli
from probe.toolbox.options import DEFAULT_TOLERANCE, Tolerances
from probe.toolbox.random_checks import check_random


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """Tools write their default results folder under the working directory."""
    monkeypatch.chdir(tmp_path)


BF16 = torch.bfloat16


# ---- a faulty "device kernel": wrong only in bf16, as a broken low-precision kernel is ----
def faulty_gelu(x):
    if torch.overrides.has_torch_function_unary(x):
        return torch.overrides.handle_torch_function(faulty_gelu, (x,), x)
    y = F.gelu(x)
    return y * 1.05 if x.dtype == BF16 else y


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x * (2.2 if x.dtype == BF16 else 2.0)   # bf16 backward 10% off


def faulty_square(x):
    if torch.overrides.has_torch_function_unary(x):
        return torch.overrides.handle_torch_function(faulty_square, (x,), x)
    return _Square.apply(x)


@pytest.fixture(scope="module")
def faulty_yaml(tmp_path_factory):
    """The packaged registry plus the two faulty APIs, attached to ``torch`` for the module."""
    with open(DEFAULT_YAML, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    data["torch"] = list(data["torch"]) + ["faulty_gelu", "faulty_square"]
    path = tmp_path_factory.mktemp("reg") / "ops.yaml"
    path.write_text(yaml.safe_dump(data))
    torch.faulty_gelu, torch.faulty_square = faulty_gelu, faulty_square
    yield str(path)
    del torch.faulty_gelu, torch.faulty_square


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    """Pre-norm transformer block (RMSNorm, causal attention, GELU MLP)."""

    def __init__(self, d=64, heads=4, act=F.gelu):
        super().__init__()
        self.heads, self.act = heads, act
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.reshape(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(self.n1(x)).chunk(3, -1))
        att = (q @ k.transpose(-2, -1)) * (D // self.heads) ** -0.5
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(y)
        return x + self.fc2(self.act(self.fc1(self.n2(x))))


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))


def test_bf16_models_pass_against_fp64_golden(tmp_path):
    mlp, block = _mlp().to(BF16), Block().to(BF16)
    x, tokens = torch.randn(8, 32, dtype=BF16), torch.randn(2, 16, 64, dtype=BF16)
    with OpAutoCompare(output_dir=str(tmp_path), verbose=False) as ac:
        loss = F.cross_entropy(mlp(x).float(), torch.arange(8) % 10) + block(tokens).float().pow(2).mean()
        loss.backward()
    assert ac.failures() == [], [(r["name"], r["phase"], r["tensor"], r.get("tol_ratio")) for r in ac.failures()]
    rows = ac.rows
    names = {(r["name"], r["phase"]) for r in rows}
    for api in ("Functional.linear", "Functional.gelu", "Functional.softmax",
                "Tensor.__matmul__", "Torch.rsqrt"):
        assert (api, "forward") in names and (api, "backward") in names, api
    # linear's three inputs all get their gradient compared (w.r.t. the API's own inputs)
    lin = {r["tensor"] for r in rows if r["name"] == "Functional.linear" and r["phase"] == "backward"}
    assert {"grad_input.1", "grad_input.2"} <= lin
    # errors are real bf16 roundings, measured, not zero: the golden really is higher precision
    lin_fwd = [r for r in rows if r["name"] == "Functional.linear" and r["phase"] == "forward"]
    assert all(r["golden_dtype"] == "float64" and 0 < r["max_rel"] for r in lin_fwd)
    with open(ac.csv.path, newline="") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert not os.path.exists(tmp_path / "failed")


def test_finds_cpu_bf16_layer_norm_backward_precision_loss(tmp_path):
    """No accelerator needed to find precision loss: torch's CPU bf16 layer_norm backward
    sums weight/bias gradients over rows with bf16-sized error growing with the row count
    (~7x the bf16 tolerance at 2048 rows), while its forward and input gradient are fine."""
    torch.manual_seed(0)
    ln = nn.LayerNorm(64).to(BF16)
    x = torch.randn(2048, 64, dtype=BF16, requires_grad=True)
    with OpAutoCompare(output_dir=str(tmp_path), ops="layer_norm", verbose=False) as ac:
        (ln(x).float() * torch.randn(2048, 64)).sum().backward()
    status = {(r["phase"], r["tensor"]): r["status"] for r in ac.rows}
    assert status == {("forward", "output.0"): "pass", ("backward", "grad_input.0"): "pass",
                      ("backward", "grad_input.1"): "fail", ("backward", "grad_input.2"): "fail"}


@needs_pt_loads
def test_faulty_forward_is_flagged_saved_and_replayed(tmp_path, faulty_yaml, capsys, caplog):
    caplog.set_level(logging.INFO, logger="probe")
    torch.manual_seed(0)
    block = Block(act=torch.faulty_gelu).to(BF16)
    x = torch.randn(2, 8, 64, dtype=BF16)
    ref = block(x)
    with OpAutoCompare(output_dir=str(tmp_path), yaml_path=faulty_yaml) as ac:
        out = block(x)
        out.float().sum().backward()
    assert torch.equal(out, ref)                      # the model's result is untouched
    bad = ac.failures()
    assert {r["name"] for r in bad} == {"Torch.faulty_gelu"}
    assert [r["phase"] for r in bad] == ["forward", "backward"]  # y*1.05: its gradient too
    # verbose (the default): the failing row is logged at INFO, never printed by the library
    said = [r.getMessage() for r in caplog.records
            if r.name == "probe.toolbox.autocompare" and r.levelno == logging.INFO]
    assert any("FAIL Torch.faulty_gelu.0 forward" in m for m in said)
    assert "comparisons, 2 failed (Torch.faulty_gelu)" in said[-1]   # stop()'s summary
    assert "FAIL" not in capsys.readouterr().out
    saved = tmp_path / "failed" / "Torch.faulty_gelu" / "0"
    assert (saved / "inputs.pt").exists()
    parser = argparse.ArgumentParser()
    replay_cli.add_arguments(parser)
    assert replay_cli.run(parser.parse_args([str(tmp_path / "failed"), "--yaml", faulty_yaml])) == 1
    assert "output.0 vs float32 golden: fail" in capsys.readouterr().out


def test_faulty_backward_is_flagged_backward_only(tmp_path, faulty_yaml):
    x = torch.randn(16, 16, dtype=BF16, requires_grad=True)
    with OpAutoCompare(output_dir=str(tmp_path), yaml_path=faulty_yaml, ops="faulty_square",
                       verbose=False) as ac:
        torch.faulty_square(x * 1).sum().backward()
    phases = {(r["phase"], r["status"]) for r in ac.rows}
    assert phases == {("forward", "pass"), ("backward", "fail")}


def test_inplace_api_compared_from_copies_taken_before_the_call(tmp_path):
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    h = a.clone()
    with apply_feature("torch.Tensor.add_", "autocompare", output_dir=str(tmp_path), verbose=False) as ac:
        h.add_(b)
        h.add_(b)
    assert torch.allclose(h, a + 2 * b)
    assert [(r["name"], r["status"]) for r in ac.rows] == [("Tensor.add_", "pass")] * 2


def test_setitem_updates_are_compared(tmp_path, faulty_yaml):
    x = torch.zeros(4, 8, dtype=BF16)
    v = torch.randn(8, dtype=BF16)
    with OpAutoCompare(output_dir=str(tmp_path), ops="__setitem__", verbose=False) as ac:
        x[1] = v
    assert [(r["tensor"], r["status"]) for r in ac.rows] == [("input.0 (updated)", "pass")]


def test_condition_func_sees_real_arguments(tmp_path):
    seen = []

    def big_only(x, *args, **kwargs):
        seen.append(tuple(x.shape))
        return x.numel() > 100

    with apply_feature("torch.nn.functional.gelu", "autocompare", condition_func=big_only,
                       output_dir=str(tmp_path), verbose=False) as ac:
        F.gelu(torch.randn(4))
        F.gelu(torch.randn(20, 20))
        F.silu(torch.randn(20, 20))                   # not applied: another API
    assert seen == [(4,), (20, 20)]
    assert [(r["name"], r["call_id"]) for r in ac.rows] == [("Functional.gelu", 0)]


def test_random_apis_by_statistics(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    with OpAutoCompare(output_dir=str(tmp_path), verbose=False) as ac:
        F.dropout(x, p=0.3, training=True)
        torch.rand(10000)
        torch.randn(5000)
        torch.bernoulli(torch.full((4000,), 0.2))
        torch.randperm(100)
        F.dropout(x, p=0.3, training=False)           # eval: compared element by element
    by = {}
    for r in ac.rows:
        by.setdefault(r["name"], []).append(r)
    assert all(r["status"] == "pass" for r in ac.rows), [r for r in ac.rows if r["status"] != "pass"]
    drop = [r["tensor"] for r in by["Functional.dropout"]]
    assert drop == ["output.0 zero ratio", "output.0 kept values", "output.0"]
    assert {"Torch.rand", "Torch.randn", "Torch.bernoulli", "Torch.randperm"} <= set(by)
    # a dropout that drops at the wrong rate, or rescales wrongly, fails
    y = F.dropout(x, p=0.1)
    wrong_rate = check_random("dropout", ([x], {"p": 0.3}), y, Tolerances(), "Functional.dropout")
    assert wrong_rate[0][1]["status"] == "fail"
    wrong_scale = check_random("dropout", ([x], {"p": 0.1}), y * 1.05, Tolerances(), "Functional.dropout")
    assert [r["status"] for _, r in wrong_scale] == ["pass", "fail"]


def test_tolerance_priority(monkeypatch):
    monkeypatch.setenv("AUTOCOMPARE_ERROR_TOLERANCE", "1,2")
    monkeypatch.setenv("AUTOCOMPARE_ERROR_TOLERANCE_BFLOAT16", "3,4")
    monkeypatch.setenv("LINEAR_AUTOCOMPARE_ERROR_TOLERANCE_BFLOAT16", "5,6")
    t = Tolerances()
    assert t.get("Functional.linear", BF16) == (5, 6)
    assert t.get("Functional.gelu", BF16) == (3, 4)
    assert t.get("Functional.gelu", torch.float16) == (1, 2)
    assert Tolerances(tolerances={"bf16": "7,8"}).get("Functional.linear", BF16) == (7, 8)
    assert Tolerances(op_tolerances={"linear": (9, 10)}).get("Functional.linear", torch.float32) == (9, 10)
    monkeypatch.delenv("AUTOCOMPARE_ERROR_TOLERANCE")
    assert Tolerances().get("Functional.gelu", torch.float32) == DEFAULT_TOLERANCE[torch.float32]
    with pytest.raises(ValueError):
        Tolerances(tolerance="1e-3")


def test_env_lists_select_apis(tmp_path, monkeypatch):
    monkeypatch.setenv("OP_AUTOCOMPARE_LIST", "torch.nn.functional.linear,softmax")
    monkeypatch.setenv("OP_AUTOCOMPARE_DISABLE_LIST", "softmax")
    m = _mlp()
    with OpAutoCompare(output_dir=str(tmp_path), verbose=False) as ac:
        F.softmax(m(torch.randn(2, 32)), -1)
    assert {r["name"] for r in ac.rows} == {"Functional.linear"}
    with OpAutoCompare(ops=["gelu"], output_dir=str(tmp_path / "kw"), verbose=False) as ac:  # kwargs win
        m(torch.randn(2, 32))
    assert {r["name"] for r in ac.rows} == {"Functional.gelu"}


def test_tool_failure_never_breaks_the_api(tmp_path, monkeypatch, caplog):
    import probe.toolbox.autocompare as mod

    def boom(*a, **k):
        raise RuntimeError("broken golden machinery")

    monkeypatch.setattr(mod, "golden_inputs", boom)
    m = _mlp()
    x = torch.randn(2, 32)
    ref = m(x)
    with OpAutoCompare(output_dir=str(tmp_path), verbose=False):
        out = m(x)
    assert torch.equal(out, ref)
    assert sum("broken golden machinery" in r.getMessage() for r in caplog.records) == 2  # once per API (linear, gelu)
