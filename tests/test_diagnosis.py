"""Diagnosis on real dumps: a small transformer run twice, once with one call made faulty.

The expected culprit is named from the fault's own call count (the n-th call of an API is
``{Prefix}.{api}.{n}.{direction}``), never from probe's output.

Faults are applied by a TorchFunctionMode entered *below* the debugger's: the debugger
records the call (name, inputs, outputs) and calls the real function, which then reaches
this mode; whatever this mode does inside is invisible to the dump, so the faulty run
has the same call sequence as the clean one and only the chosen call's values differ.
"""
import json

import openpyxl
import pytest

from probe.compare import compare

import glob
import math
import os
import re

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

B, T, D, V, HEADS, LAYERS = 2, 8, 32, 50, 2, 2


class Attention(nn.Module):
    def __init__(self, fused=False):
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fused = fused

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(B, T, HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v))
        if self.fused:              # one fused API where the bench makes five
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            att = F.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(D // HEADS), dim=-1)
            y = torch.matmul(att, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    def __init__(self, extra_add=False, fused=False):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(D), Attention(fused), nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.extra_add = extra_add
        self.register_buffer("pad", torch.zeros(B, T, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        if self.extra_add:          # the "NPU" side makes one more add of the same signature
            x = x + self.pad
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, extra_add=False, fused=False):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block(extra_add and i == 0, fused and i == 0) for i in range(LAYERS)])
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        with torch._C.DisableTorchFunction():     # not an API call of the model: not dumped
            return torch.mul(g, ctx.factor), None


def scale_output(factor):
    def run(func, args, kwargs):
        return func(*args, **kwargs) * factor
    return run


def gelu_tanh(func, args, kwargs):
    return func(*args, **dict(kwargs, approximate="tanh"))


def softmax_bf16(func, args, kwargs):
    x, *rest = args
    return func(x.to(torch.bfloat16), *rest, **kwargs).to(x.dtype)


def bump_one_element(delta):
    def run(func, args, kwargs):
        out = func(*args, **kwargs)
        mask = torch.zeros_like(out)
        mask.view(-1)[3] = delta
        return out + mask
    return run


def scale_input_grad(factor):
    """Forward untouched; the grad w.r.t. the first input is scaled inside the call."""
    def run(func, args, kwargs):
        x, *rest = args
        return func(_ScaleGrad.apply(x, factor), *rest, **kwargs)
    return run


class Fault(TorchFunctionMode):
    """Apply ``how(func, args, kwargs)`` to the ``nth`` call (from 0) of ``target``."""

    def __init__(self, target=None, nth=0, how=None, noise=None):
        super().__init__()
        self.target, self.nth, self.how, self.seen = target, nth, how, 0
        self.noise = noise            # (target, relative size, generator): every call jittered

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.noise is not None and func is self.noise[0]:
            out = func(*args, **kwargs)
            _, size, gen = self.noise
            jitter = torch.randn(out.shape, generator=gen) * size * out.detach().abs().mean()
            return out + jitter
        if func is self.target:
            k, self.seen = self.seen, self.seen + 1
            if k == self.nth and self.how is not None:
                return self.how(func, args, kwargs)
        return func(*args, **kwargs)


def dump_run(dump_path, task, fault=None, extra_add=False, level="L1", fused=False):
    """One training step of the tiny transformer, dumped; returns the dump.json path."""
    from probe import PrecisionDebugger
    torch.manual_seed(0)
    model = TinyTransformer(extra_add, fused)
    g = torch.Generator().manual_seed(1)
    idx, target = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    dbg = PrecisionDebugger(dump_path=str(dump_path), task=task, level=level)
    try:
        with fault or Fault():
            dbg.start(model=model) if level == "mix" else dbg.start()
            try:
                logits = model(idx)
                loss = F.cross_entropy(logits.reshape(B * T, V), target.reshape(-1))
                loss.backward()
            finally:
                dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    found = glob.glob(os.path.join(str(dump_path), "step0", "*", "dump.json"))
    assert found, "the debugger wrote no dump.json"
    return found[0]

# name -> (fault factory, extra add on the NPU side, expected culprit, its direction)
CASES = {
    "layernorm_x1.01": (lambda: Fault(F.layer_norm, 1, scale_output(1.01)), False,
                        "Functional.layer_norm.1.forward", "forward"),
    "gelu_tanh": (lambda: Fault(F.gelu, 1, gelu_tanh), False, "Functional.gelu.1.forward", "forward"),
    "softmax_bf16": (lambda: Fault(F.softmax, 0, softmax_bf16), False,
                     "Functional.softmax.0.forward", "forward"),
    "matmul_one_element": (lambda: Fault(torch.matmul, 2, bump_one_element(1.0)), False,
                           "Torch.matmul.2.forward", "forward"),
    "backward_only": (lambda: Fault(F.gelu, 0, scale_input_grad(1.01)), False,
                      "Functional.gelu.0.backward", "backward"),
    "extra_api_then_fault": (lambda: Fault(F.layer_norm, 3, scale_output(1.01)), True,
                             "Functional.layer_norm.3.forward", "forward"),
}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Dumps made on first use and shared: key -> dump.json."""
    root = tmp_path_factory.mktemp("diag")
    made = {}

    def get(key, task, **kw):
        if (key, task) not in made:
            made[(key, task)] = dump_run(root / f"{key}_{task}", task, **kw)
        return made[(key, task)]
    get.root = root
    return get


def run_compare(npu, bench, out, **kw):
    param = {"npu_json_path": npu, "bench_json_path": bench, "is_print_compare_log": False}
    if "bench2" in kw:
        param["bench2_json_path"] = kw.pop("bench2")
    paths = compare(param, str(out), **kw)
    with open(paths[-1], encoding="utf-8") as fh:
        return json.load(fh), paths


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("case", list(CASES))
def test_first_divergence_names_the_faulty_call(dumps, case, task, tmp_path):
    make_fault, extra, culprit, direction = CASES[case]
    bench = dumps("clean", task)
    npu = dumps(case, task, fault=make_fault(), extra_add=extra)
    summary, _ = run_compare(npu, bench, tmp_path)
    found = summary["first_divergence"][direction]
    assert found is not None, summary["first_divergence"]
    assert found["kind"] == "introduced"
    assert found["npu_name"] == culprit and found["bench_name"] == culprit
    assert found["output_error"] > 4 * found["input_error"]
    assert found["stack"] and "test_diagnosis.py" in found["stack"]
    assert found["worst_output"]["npu_row"].startswith(culprit + ".output")
    if direction == "backward":                        # the forward pass is untouched
        assert summary["first_divergence"]["forward"] is None
    assert summary["first_divergence"]["name"] == culprit
    assert summary["suspects"] and culprit in [s["npu_name"] for s in summary["suspects"]]
    if extra:
        assert summary["matching"] == "aligned"
        # the extra add (the 2nd add of block 0) is unmatched, forward and backward
        assert summary["unmatched"]["npu"] == ["Tensor.__add__.1.forward", "Tensor.__add__.1.backward"]
        assert summary["unmatched"]["bench"] == []
    else:
        assert summary["matching"] == "exact"


def test_exact_names_blame_the_shifted_add_alignment_does_not(dumps, tmp_path):
    """msprobe's pairing by name compares the extra add with the next real one: from the
    statistics an add is the first call whose inputs differ; alignment pairs the right calls. In a tensor dump the
    replay of each call on its own inputs sees that the adds computed what they were given,
    so even pairing by name names the faulty LayerNorm."""
    bench = dumps("clean", "statistics")
    npu = dumps("extra_api_then_fault", "statistics", fault=CASES["extra_api_then_fault"][0](), extra_add=True)
    exact, _ = run_compare(npu, bench, tmp_path / "exact", align=False)
    wrong = exact["inputs_differ"]
    assert wrong is not None and wrong["npu_name"].startswith("Tensor.__add__.")
    aligned, _ = run_compare(npu, bench, tmp_path / "aligned", align=True)
    assert aligned["first_divergence"]["forward"]["npu_name"] == "Functional.layer_norm.3.forward"
    bench = dumps("clean", "tensor")
    npu = dumps("extra_api_then_fault", "tensor", fault=CASES["extra_api_then_fault"][0](), extra_add=True)
    replayed, _ = run_compare(npu, bench, tmp_path / "replayed", align=False)
    fwd = replayed["first_divergence"]["forward"]
    assert fwd["npu_name"] == "Functional.layer_norm.3.forward" and fwd["local"]["ratio"] > 3


def test_identical_runs_have_no_divergence_and_the_report_has_its_chart(dumps, tmp_path):
    bench = dumps("clean", "tensor")
    again = dumps("clean_again", "tensor")
    summary, paths = run_compare(again, bench, tmp_path)
    assert summary["first_divergence"] == {"name": None, "direction": None, "forward": None, "backward": None}
    assert summary["calls"]["introduces"] == summary["calls"]["inherits"] == 0
    assert summary["calls"]["clean"] == summary["calls"]["total"] > 50
    # a faulty run: the chart plots the error the Diagnosis sheet lists
    npu = dumps("layernorm_x1.01", "tensor", fault=CASES["layernorm_x1.01"][0]())
    summary, paths = run_compare(npu, bench, tmp_path / "faulty")
    wb = openpyxl.load_workbook(paths[0])
    assert wb.sheetnames == ["compare_result", "Summary", "Diagnosis"]
    charts = wb["Summary"]._charts
    assert len(charts) == 1 and type(charts[0]).__name__ == "LineChart"
    refs = [s.val.numRef.f for s in charts[0].series]
    assert refs and all(r.startswith("'Diagnosis'!$") for r in refs)
    ws = wb["Diagnosis"]
    header = [c.value for c in ws[1]]
    rows = [dict(zip(header, r)) for r in ws.iter_rows(min_row=2, values_only=True)]
    culprit = next(r for r in rows if r["NPU Name"] == "Functional.layer_norm.1.forward")
    assert culprit["Status"] == "introduces"
    assert culprit["Plot Output Error"] == pytest.approx(0.01, rel=1e-3)      # the 1.01 scaling
    # its local error (re-run on its own inputs) is a number, far beyond a correct kernel's
    assert isinstance(culprit["Local Error"], float) and isinstance(culprit["Correct Kernel Error"], float)
    assert culprit["Local Error"] == pytest.approx(0.01, rel=0.05)
    assert culprit["Local Error"] > 3 * culprit["Correct Kernel Error"]
    before = rows[:rows.index(culprit)]
    assert before and all(r["Status"] == "clean" and not r["Plot Output Error"] for r in before)
    # numbers are numbers: no infinity written as the text 'inf' (a Jump from an input error of 0 is empty)
    for r in rows:
        for h in ("Input Error", "Output Error", "Jump", "Threshold", "Noise", "Local Error",
                  "Correct Kernel Error", "1 - Cosine", "MaxRelativeErr"):
            assert r[h] is None or isinstance(r[h], (int, float)), (r["NPU Name"], h, r[h])
        if r["Input Error"] == 0 and r["Output Error"]:
            assert r["Jump"] is None
    # the Summary's worst output does not round an error row's cosine to 1
    lines = dict(wb["Summary"].iter_rows(min_row=2, values_only=True))
    worst = lines["first divergence (forward): worst output"]
    assert ".output.0: error" in worst and "beyond" in worst, worst    # why the row is an error, first
    cos = re.search(r"Cosine ([0-9.e-]+)(,| \(same direction)", worst)   # a scaling: cosine 1, said why
    assert cos and (float(cos.group(1)) < 1 or cos.group(2) != ","), worst
    lines = dict(wb["Summary"].iter_rows(min_row=2, values_only=True))
    assert lines["first divergence (forward)"].startswith("Functional.layer_norm.1.forward")


def test_mix_dump_gives_the_module_path(dumps, tmp_path):
    root = dumps.root
    bench = dump_run(root / "mix_clean", "tensor", level="mix")
    npu = dump_run(root / "mix_fault", "tensor", fault=CASES["layernorm_x1.01"][0](), level="mix")
    summary, _ = run_compare(npu, bench, tmp_path)
    fwd = summary["first_divergence"]["forward"]
    # layer_norm call 1 is block 0's second LayerNorm; module entries are not blamed
    assert fwd["npu_name"] == "Functional.layer_norm.1.forward"
    assert fwd["module"] == "blocks.0.ln2 (LayerNorm)"


def test_fused_api_against_its_composite_is_a_group(dumps, tmp_path):
    bench = dumps("clean", "tensor")
    npu = dump_run(dumps.root / "fused", "tensor", fault=Fault(F.layer_norm, 3, scale_output(1.01)), fused=True)
    summary, paths = run_compare(npu, bench, tmp_path)
    fwd_groups = [g for g in summary["groups"] if g["npu"][0].endswith(".forward")]
    assert [g["npu"] for g in fwd_groups] == [["Functional.scaled_dot_product_attention.0.forward"]]
    assert {"Functional.softmax.0.forward", "Torch.matmul.0.forward", "Torch.matmul.1.forward"} <= set(
        fwd_groups[0]["bench"])
    assert summary["first_divergence"]["forward"]["npu_name"] == "Functional.layer_norm.3.forward"
    df = pd.read_csv(paths[1]).set_index("NPU Name")
    sdpa = "Functional.scaled_dot_product_attention.0.forward"
    # q pairs with the bench's q (first matmul's input), v with the second matmul's second input
    assert df.loc[f"{sdpa}.input.0", "Bench Name"] == "Torch.matmul.0.forward.input.0"
    assert df.loc[f"{sdpa}.input.2", "Bench Name"] == "Torch.matmul.1.forward.input.1"
    assert df.loc[f"{sdpa}.output.0", "Bench Name"] == "Torch.matmul.1.forward.output.0"
    assert df.loc[f"{sdpa}.output.0", "Result"] == "pass"


def test_noise_floor_from_a_second_bench_run(dumps, tmp_path):
    """Every matmul jitters run to run (a nondeterministic kernel); only the LayerNorm is wrong."""
    root = dumps.root

    def run(name, seed, fault_ln):
        gen = torch.Generator().manual_seed(seed)
        fault = Fault(F.layer_norm, 3, scale_output(1.05) if fault_ln else None,
                      noise=(torch.matmul, 1e-3, gen))
        return dump_run(root / name, "tensor", fault=fault)
    npu, bench, bench2 = run("noisy_npu", 1, True), run("noisy_bench", 2, False), run("noisy_bench2", 3, False)
    blind, _ = run_compare(npu, bench, tmp_path / "blind")
    assert blind["first_divergence"]["forward"]["npu_name"] == "Torch.matmul.0.forward"
    summary, _ = run_compare(npu, bench, tmp_path / "noise", bench2=bench2)
    fwd = summary["first_divergence"]["forward"]
    assert fwd["npu_name"] == "Functional.layer_norm.3.forward"
    assert fwd["noise"] is not None and fwd["output_error"] > 4 * fwd["noise"]
    assert summary["bench2_json_path"] == bench2
