"""Repro scripts: generated from probe's, msprobe's and statistics-only dumps, then run in
a fresh subprocess that has only torch to lean on."""
import ast
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import needs_pt_loads

from probe.cli import main as cli_main
from probe.compare.metrics import tensor_metrics
from probe.debugger import PrecisionDebugger
from probe.forensics.repro import SCRIPT_METRICS
from probe.repro import generate

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "msprobe")
ALLOWED_IMPORTS = {"argparse", "math", "os", "sys", "torch"}


def _run(script, *args, cwd=None):
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})
    return proc


def _run_many(scripts):
    """Several scripts in one fresh interpreter (each as __main__), to keep the suite fast."""
    code = ("import runpy, sys\n"
            "for p in sys.argv[1:]:\n"
            "    print('#### ' + p, flush=True)\n"
            "    sys.argv = [p]\n"
            "    try:\n"
            "        runpy.run_path(p, run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        assert not e.code, e.code\n")
    proc = subprocess.run([sys.executable, "-c", code, *scripts], capture_output=True, text=True, timeout=240,
                          env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = proc.stdout.split("#### ")[1:]
    return {p.split("\n", 1)[0]: p.split("\n", 1)[1] for p in parts}


def _imports(script):
    """Modules the script imports when it starts (torch_npu is imported only for --device npu)."""
    tree = ast.parse(open(script).read())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0])
    return names


def _metric_lines(out, label):
    """[{cosine, max_abs, ...}] of every '<label> cosine ...' line."""
    rows = []
    for line in out.splitlines():
        if line.strip().startswith(label) and "cosine" in line:
            rows.append({k: float(v) for k, v in re.findall(r"(cosine|max_abs|max_rel|one_thousandth|five_thousandths|euc_dist) (\S+)",
                                                     line.split(label, 1)[1].split("  (")[0])})
    return rows


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


def _own_dump(path, bf16=False):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(8, 16)
    d = PrecisionDebugger(task="tensor", dump_path=str(path), level="L1")
    d.start()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(x)
    out.float().pow(2).mean().backward()
    d.stop()
    d.step()
    return str(path)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Scripts from probe's own dump, both msprobe tensor dumps and a statistics-only dump;
    all but one are run together in one fresh interpreter (torch's import dominates)."""
    tmp = tmp_path_factory.mktemp("repro")
    dump = _own_dump(tmp / "dump")
    made = {"own_fwd": generate(dump, "Functional.layer_norm.0.forward", output=str(tmp / "gen" / "ln_fwd.py")),
            "own_bwd": generate(dump, "Functional.linear.0.backward", output=str(tmp / "gen" / "lin_bwd.py"))}
    for fx in ("v26_L1_tensor_fp32", "v833_L1_tensor_fp32"):
        for api in ("Functional.linear.3.backward", "Functional.softmax.0.forward", "Tensor.add_.0.forward"):
            made[(fx, api)] = generate(os.path.join(FIXTURES, fx), api, output=str(tmp / fx / f"{api}.py"))
    made["stats"] = generate(os.path.join(FIXTURES, "v833_L1_statistics_fp32"), "Functional.nll_loss.0.forward",
                             output=str(tmp / "stats" / "nll.py"))
    # the pair of files is all a fresh machine needs: move it away from the dump
    away = tmp / "elsewhere"
    shutil.copytree(tmp / "gen", away)
    shutil.rmtree(dump)
    made["own_fwd"], made["own_bwd"] = str(away / "ln_fwd.py"), str(away / "lin_bwd.py")
    outs = _run_many([p for k, p in made.items() if k != "own_fwd"])
    return tmp, made, outs


def test_own_dump_forward_script_runs_as_is(scripts):
    tmp, made, _ = scripts
    for script in made.values():
        assert _imports(script) <= ALLOWED_IMPORTS, (script, _imports(script))
    proc = _run(made["own_fwd"], cwd=str(tmp))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "== Functional.layer_norm.0.forward on cpu" in out and "(dumped)" in out
    vs_dump, vs_ref = _metric_lines(out, "vs dump"), _metric_lines(out, "vs float64 cpu")
    assert vs_dump[0]["max_abs"] == 0.0 and vs_dump[0]["cosine"] == pytest.approx(1.0)   # same kernel, same bits
    assert 0 < vs_ref[0]["max_abs"] < 1e-5 and vs_ref[0]["cosine"] > 0.999999


def test_own_dump_backward_script(scripts):
    _, made, outs = scripts
    out = outs[made["own_bwd"]]
    # weight and bias grads against the dumped ones, in probe's argument order (x needs no grad)
    assert "grad of input.0" not in out and "grad of input.1" in out and "grad of input.2" in out
    assert "vs dump grad_input.1 " in out and "vs dump grad_input.2 " in out and "transposed" not in out
    rows = _metric_lines(out, "vs dump grad_input")
    assert len(rows) == 2 and all(r["max_abs"] < 1e-6 and r["cosine"] > 0.999999 for r in rows), out
    assert len(_metric_lines(out, "vs float64 cpu")) == 2


def test_bundled_tensors_are_cpu_and_keep_bf16(tmp_path):
    dump = _own_dump(tmp_path / "dump", bf16=True)
    script = generate(dump, "Functional.linear.0.forward", output=str(tmp_path / "r.py"))
    data = torch.load(str(tmp_path / "r.pt"), map_location="cpu", weights_only=True)
    assert data and all(t.device.type == "cpu" for t in data.values())
    # autocast: the dumped output is bf16, stored as float32 .npy by probe, restored here
    assert data["output.0"].dtype == torch.bfloat16
    assert "torch.bfloat16" in open(script).read()


@needs_pt_loads
@pytest.mark.parametrize("fixture", ["v26_L1_tensor_fp32", "v833_L1_tensor_fp32"])
def test_msprobe_tensor_dump(scripts, fixture):
    _, made, outs = scripts
    lin = outs[made[(fixture, "Functional.linear.3.backward")]]
    # msprobe orders grads by autograd node (bias first, weight transposed): paired by shape
    assert "vs dump grad_input.2 (transposed)" in lin and "vs dump grad_input.0 " in lin
    for api in ("Functional.linear.3.backward", "Functional.softmax.0.forward", "Tensor.add_.0.forward"):
        out = outs[made[(fixture, api)]]
        rows = _metric_lines(out, "vs dump")
        assert rows and all(r["max_abs"] <= 1e-6 for r in rows), out
        assert _metric_lines(out, "vs float64 cpu")


def test_statistics_only_dump_synthesises_inputs(scripts):
    _, made, outs = scripts
    script = made["stats"]
    text = open(script).read()
    assert "SYNTHETIC INPUTS" in text.split('"""')[1]         # said in the header
    out = outs[script]
    assert "[SYNTHETIC inputs: input.0, input.1]" in out and "statistics only" in out
    assert _metric_lines(out, "vs float64 cpu")
    # the synthesised values follow the recorded shape, dtype and range
    ns = {"__file__": script}
    exec(compile(text, script, "exec"), ns)       # __name__ is not __main__: defines only
    with open(glob.glob(os.path.join(FIXTURES, "v833_L1_statistics_fp32", "step0", "*", "dump.json"))[0]) as f:
        rec = json.load(f)["data"]["Functional.nll_loss.0.forward"]["input_args"]
    gen = torch.Generator().manual_seed(0)
    for key, desc in (("input.0", rec[0]), ("input.1", rec[1])):
        t = ns["synthesize"](ns["TENSORS"][key], gen)
        assert list(t.shape) == desc["shape"] and str(t.dtype) == desc["dtype"]
        assert float(t.max()) == pytest.approx(desc["Max"]) and float(t.min()) == pytest.approx(desc["Min"])


def test_script_metrics_match_compare_metrics():
    ns = {"torch": torch, "math": math}
    exec(SCRIPT_METRICS, ns)
    rng = np.random.default_rng(0)
    b = rng.standard_normal(1000)
    cases = [(b + rng.standard_normal(1000) * 1e-3, b),
             (np.where(np.arange(1000) % 7 == 0, 0.0, b), np.where(np.arange(1000) % 5 == 0, 0.0, b)),
             (np.concatenate([b[:-3], [np.nan, np.inf, 1.0]]), np.concatenate([b[:-3], [np.nan, 2.0, -np.inf]])),
             (np.zeros(10), np.zeros(10))]
    for a, ref in cases:
        m = ns["metrics"](torch.from_numpy(a), torch.from_numpy(ref))
        e = tensor_metrics(a, ref, rtol=1e-3, floor=1e-6)
        for k, ek in (("cosine", e.cosine), ("max_abs", e.max_abs), ("max_rel", e.max_rel),
                      ("one_thousandth", e.one_thousandth), ("five_thousandths", e.five_thousandths),
                      ("euc_dist", e.euc_dist)):
            assert (math.isnan(m[k]) and math.isnan(ek)) or m[k] == pytest.approx(ek, rel=1e-12, abs=1e-15), (k, m[k], ek)
        assert (m["nonfinite_same"], m["nonfinite_mismatch"]) == (e.nonfinite_same, e.nonfinite_mismatch)


def test_data_name_cannot_leave_its_folder(tmp_path):
    rank = tmp_path / "dump" / "step0" / "rank"
    (rank / "dump_tensor_data").mkdir(parents=True)
    secret = tmp_path / "dump" / "step0" / "secret.npy"
    np.save(secret, np.full((2, 2), 7.0, dtype=np.float32))
    desc = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 2], "Max": 1.0, "Min": -1.0,
            "Mean": 0.0, "Norm": 1.0, "requires_grad": False, "data_name": "../../secret.npy"}
    (rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": {
        "Torch.abs.0.forward": {"input_args": [desc], "input_kwargs": {}, "output": []}}}))
    script = generate(str(tmp_path / "dump"), "Torch.abs.0", output=str(tmp_path / "abs.py"))
    data = torch.load(str(tmp_path / "abs.pt"), weights_only=True)
    assert data == {}                                     # the file outside was not read
    assert "escapes" in open(script).read()               # and the header says why


def test_cli(tmp_path, capsys):
    out = tmp_path / "sm.py"
    rc = cli_main(["repro", os.path.join(FIXTURES, "v26_L1_tensor_fp32"), "--api", "Functional.softmax.0.forward",
                   "--device", "npu", "-o", str(out)])
    assert rc == 0 and out.is_file() and (tmp_path / "sm.pt").is_file()
    assert "torch_npu" in _imports(str(out))              # npu target: the script brings torch_npu
    assert "torch_npu" not in _imports(generate(os.path.join(FIXTURES, "v26_L1_tensor_fp32"),
                                                "Functional.softmax.0.forward", output=str(tmp_path / "c.py")))
    rc = cli_main(["repro", os.path.join(FIXTURES, "v26_L1_tensor_fp32"), "--api", "Functional.nope.0.forward"])
    assert rc == 2 and "Functional.nope.0 is not in any dump.json" in capsys.readouterr().err
