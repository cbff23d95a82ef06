"""run_ut on this project's own dumps of real models: clean replays pass, damage is caught
by the criterion that fits it, bf16 is judged as bf16, odd APIs never crash the run."""
import csv
import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from probe import PrecisionDebugger  # noqa: E402
from probe.precheck import run_ut  # noqa: E402


class Attention(torch.nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.ln, self.qkv, self.out = torch.nn.LayerNorm(d), torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return x + F.dropout(self.out(y), 0.25, self.training)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(Attention(), torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _dump(path, task="tensor", bf16=False):
    model = _model()
    x, y = torch.randn(4, 8, 16), torch.randint(0, 4, (32,))
    dbg = PrecisionDebugger(task=task, dump_path=str(path))
    dbg.start()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(x)
    F.cross_entropy(out.float().reshape(-1, 4), y).backward()
    dbg.stop()
    dbg.step()
    return os.path.join(str(path), "step0", "rank")


@pytest.fixture(scope="module")
def fp32_dump(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("fp32") / "dump")


def _details(result):
    with open(result.details_csv, newline="") as fh:
        return {r["API Name"]: r for r in csv.DictReader(fh)}


def _data(rank_dir, name):
    return os.path.join(rank_dir, "dump_tensor_data", name)


def test_real_model_replayed_on_cpu_passes(fp32_dump, tmp_path):
    res = run_ut(fp32_dump, out_dir=str(tmp_path), progress=False)
    statuses = {a.name: (a.forward, a.backward) for a in res.apis}
    assert len(statuses) >= 20
    assert all(f in ("pass", "warning") for f, _ in statuses.values()), statuses
    assert all(b in ("pass", "warning", "") for _, b in statuses.values()), statuses
    assert statuses["Functional.linear.0"] == ("pass", "pass")
    rows = _details(res)
    # one row per dumped output tensor, forward and backward
    n_files = len([f for f in os.listdir(os.path.join(fp32_dump, "dump_tensor_data"))
                   if ".forward.output." in f or ".backward.output." in f])
    assert len(rows) == n_files
    assert rows["Functional.linear.0.forward.output.0"]["Standard"] == "benchmark (float32)"
    assert rows["Tensor.transpose.0.forward.output.0"]["Standard"] == "exact"
    assert rows["Functional.dropout.0.forward.output.0"]["Standard"] == "statistical (dropout)"
    with open(res.result_csv, newline="") as fh:
        header = next(csv.reader(fh))
    assert header == ["API Name", "Forward Test Success", "Backward Test Success", "Message"]
    assert os.path.basename(res.result_csv).startswith("accuracy_checking_result_")


def test_corrupted_outputs_flagged_with_the_right_criterion(fp32_dump, tmp_path):
    bad = str(tmp_path / "rank")
    shutil.copytree(fp32_dump, bad)

    def edit(name, fn):
        a = np.load(_data(bad, name))
        np.save(_data(bad, name), fn(a.copy()))

    def one_element(a):
        a.flat[5] = a.flat[5] * 1.5 + 0.1
        return a
    edit("Functional.linear.1.forward.output.0.npy", one_element)                  # one wrong value
    edit("Functional.gelu.0.forward.output.0.npy", lambda a: a + 3e-4 * np.abs(a))  # systematic bias
    edit("Tensor.transpose.1.forward.output.0.npy",                                # exact op, 1 ULP
         lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3,
                            np.nextafter(a, np.float32(np.inf)), a).astype(np.float32))

    def nan(a):
        a.flat[0] = np.nan
        return a
    edit("Functional.linear.2.backward.output.1.npy", nan)                          # NaN in a grad
    res = run_ut(bad, out_dir=str(tmp_path / "out"), progress=False)
    by = {a.name: a for a in res.apis}
    assert by["Functional.linear.1"].forward == "error"
    assert "max relative error" in by["Functional.linear.1"].message
    assert by["Functional.gelu.0"].forward == "error"
    assert "error balance" in by["Functional.gelu.0"].message
    assert by["Tensor.transpose.1"].forward == "error"
    assert "differ from the exact result" in by["Tensor.transpose.1"].message
    assert by["Functional.linear.2"].forward == "pass"
    assert by["Functional.linear.2"].backward == "error"
    assert "Inf/NaN mismatch" in by["Functional.linear.2"].message
    damaged = {"Functional.linear.1", "Functional.gelu.0", "Tensor.transpose.1", "Functional.linear.2"}
    others = [a for a in res.apis if a.name not in damaged]
    assert all("error" not in (a.forward, a.backward) for a in others), \
        [(a.name, a.message) for a in others if "error" in (a.forward, a.backward)]


def test_bf16_outputs_judged_with_bf16_standards(tmp_path):
    rank = _dump(tmp_path / "bf16", bf16=True)
    res = run_ut(rank, out_dir=str(tmp_path / "out"), progress=False)
    assert all(a.forward in ("pass", "warning") and a.backward in ("pass", "warning", "") for a in res.apis), \
        [(a.name, a.message) for a in res.apis]
    rows = _details(res)
    lin = rows["Functional.linear.0.forward.output.0"]
    assert lin["DEVICE Dtype"] == "torch.bfloat16"
    assert lin["Standard"] == "benchmark (bfloat16)"
    assert lin["Bench Run"] == "autocast bfloat16"          # fp32 inputs, bf16 output
    # The same relative change (one bf16 spacing, 2^-7, on 10% of elements) is within bf16
    # accuracy on a bf16 output and an error on a float32 one.
    rng = np.random.default_rng(0)
    for name, dtype in (("Functional.linear.0.forward.output.0.npy", "bf16"),
                        ("Functional.layer_norm.0.forward.output.0.npy", "fp32")):
        a = np.load(_data(rank, name))
        mask = rng.random(a.shape) < 0.1
        b = np.where(mask, a * (1 + 2.0 ** -7), a).astype(np.float32)
        if dtype == "bf16":   # keep it representable in bf16
            b = torch.from_numpy(b).to(torch.bfloat16).float().numpy()
        np.save(_data(rank, name), b)
    res = run_ut(rank, out_dir=str(tmp_path / "out2"), progress=False)
    by = {a.name: a for a in res.apis}
    assert by["Functional.linear.0"].forward in ("pass", "warning"), by["Functional.linear.0"].message
    assert by["Functional.layer_norm.0"].forward == "error"


def test_inplace_apis_run_on_copies(tmp_path):
    torch.manual_seed(1)
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16)
    dbg = PrecisionDebugger(task="tensor", dump_path=str(tmp_path / "d"))
    dbg.start()
    h = lin(x)
    h.mul_(0.5).add_(torch.ones_like(h))
    F.relu(h, inplace=True).sum().backward()
    dbg.stop()
    dbg.step()
    res = run_ut(str(tmp_path / "d" / "step0" / "rank"), out_dir=str(tmp_path / "out"), progress=False)
    by = {a.name: a for a in res.apis}
    assert by["Tensor.mul_.0"].forward == "pass" and by["Tensor.add_.0"].forward == "pass", \
        [(a.name, a.message) for a in res.apis]
    assert by["Functional.relu.0"].forward == "pass"


def test_unreplayable_apis_are_skipped_with_the_reason(fp32_dump, tmp_path):
    import json
    rank = str(tmp_path / "rank")
    shutil.copytree(fp32_dump, rank)
    with open(os.path.join(rank, "dump.json")) as fh:
        dump = json.load(fh)
    data = dump["data"]
    data["Torch.no_such_api.0.forward"] = {"input_args": [], "input_kwargs": {}, "output": [None]}
    entry = json.loads(json.dumps(data["Functional.gelu.0.forward"]))
    entry["input_kwargs"]["approximate"] = {"type": "MyObject", "value": "<object>"}
    data["Functional.gelu.7.forward"] = entry
    missing = json.loads(json.dumps(data["Functional.linear.0.forward"]))
    missing["input_args"][0]["data_name"] = "../../escape.npy"
    data["Functional.linear.9.forward"] = missing
    with open(os.path.join(rank, "dump.json"), "w") as fh:
        json.dump(dump, fh)
    res = run_ut(rank, out_dir=str(tmp_path / "out"), progress=False)
    by = {a.name: a for a in res.apis}
    assert by["Torch.no_such_api.0"].forward == "SKIP" and "does not exist" in by["Torch.no_such_api.0"].message
    assert by["Functional.gelu.7"].forward == "SKIP" and "MyObject" in by["Functional.gelu.7"].message
    assert by["Functional.linear.9"].forward == "SKIP" and "escapes" in by["Functional.linear.9"].message
    assert by["Functional.gelu.0"].forward == "pass"


def test_resume_continues_without_duplicates(fp32_dump, tmp_path):
    out = str(tmp_path / "out")
    full = run_ut(fp32_dump, out_dir=out, progress=False)
    with open(full.result_csv, newline="") as fh:
        rows = list(csv.reader(fh))
    with open(full.result_csv, "w", newline="") as fh:     # "interrupted" after 6 APIs
        csv.writer(fh).writerows(rows[:7])
    with open(full.details_csv, newline="") as fh:
        n_details = sum(1 for _ in fh)
    again = run_ut(fp32_dump, out_dir=out, resume=True, progress=False)
    assert again.result_csv == full.result_csv
    assert len(again.apis) == len(rows) - 7
    with open(again.result_csv, newline="") as fh:
        names = [r[0] for r in csv.reader(fh)][1:]
    assert names == [r[0] for r in rows[1:]]
    with open(again.details_csv, newline="") as fh:
        assert sum(1 for _ in fh) == n_details


def test_white_and_black_lists(fp32_dump, tmp_path):
    res = run_ut(fp32_dump, out_dir=str(tmp_path / "w"), white_list=["linear"], progress=False)
    assert res.apis and all(a.name.startswith("Functional.linear.") for a in res.apis)
    res = run_ut(fp32_dump, out_dir=str(tmp_path / "b"), black_list=["linear", "Tensor.view"], progress=False)
    assert not any(a.name.startswith(("Functional.linear.", "Tensor.view.")) for a in res.apis)


def test_random_apis_judged_statistically(tmp_path):
    torch.manual_seed(2)
    x = torch.randn(64, 32)
    dbg = PrecisionDebugger(task="tensor", dump_path=str(tmp_path / "d"))
    dbg.start()
    F.dropout(x, 0.3, True)
    torch.rand(50, 40)
    torch.randn(50, 40)
    dbg.stop()
    dbg.step()
    rank = str(tmp_path / "d" / "step0" / "rank")
    res = run_ut(rank, out_dir=str(tmp_path / "o1"), progress=False)
    assert all(a.forward == "pass" for a in res.apis), [(a.name, a.message) for a in res.apis]
    # a dropout that scales wrongly, a "uniform" sample with a shifted mean
    out = _data(rank, "Functional.dropout.0.forward.output.0.npy")
    np.save(out, np.load(out) * 1.1)
    out = _data(rank, "Torch.rand.0.forward.output.0.npy")
    np.save(out, np.load(out) * 0.9)
    res = run_ut(rank, out_dir=str(tmp_path / "o2"), progress=False)
    by = {a.name: a for a in res.apis}
    assert by["Functional.dropout.0"].forward == "error" and "1/(1-p)" in by["Functional.dropout.0"].message
    assert by["Torch.rand.0"].forward == "error" and "mean" in by["Torch.rand.0"].message
    assert by["Torch.randn.0"].forward == "pass"


def test_fp16_kernel_missing_on_cpu_is_upcast_and_recorded(tmp_path):
    """linalg.inv has no fp16 CPU kernel: the bench runs in float32 and says so."""
    import json
    rank = tmp_path / "rank"
    (rank / "dump_tensor_data").mkdir(parents=True)
    torch.manual_seed(3)
    a = (torch.randn(6, 6) + 4 * torch.eye(6)).half()
    inv = torch.linalg.inv(a.float()).half()
    bad = inv.clone()
    bad[0, 0] *= 1.25

    def desc(t, name):
        np.save(str(rank / "dump_tensor_data" / name), t.float().numpy())
        return {"type": "torch.Tensor", "dtype": "torch.float16", "shape": list(t.shape), "Max": float(t.max()),
                "Min": float(t.min()), "Mean": float(t.float().mean()), "Norm": float(t.float().norm()),
                "requires_grad": False, "data_name": name}
    data = {
        "Torch.linalg.inv.0.forward": {"input_args": [desc(a, "in.npy")], "input_kwargs": {},
                                       "output": [desc(inv, "good.npy")]},
        "Torch.linalg.inv.1.forward": {"input_args": [desc(a, "in.npy")], "input_kwargs": {},
                                       "output": [desc(bad, "bad.npy")]}}
    with open(rank / "dump.json", "w") as fh:
        json.dump({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}, fh)
    res = run_ut(str(rank), out_dir=str(tmp_path / "out"), progress=False)
    by = {a.name: a for a in res.apis}
    rows = _details(res)
    assert rows["Torch.linalg.inv.0.forward.output.0"]["Bench Run"].startswith("upcast to float32 (float16 kernel")
    assert by["Torch.linalg.inv.0"].forward == "pass"
    assert by["Torch.linalg.inv.1"].forward == "error"


def test_statistics_dump_uses_marked_synthetic_inputs(tmp_path):
    rank = _dump(tmp_path / "stats", task="statistics")
    res = run_ut(rank, out_dir=str(tmp_path / "out"), progress=False)
    rows = _details(res)
    assert rows and all(r["Inputs"] == "synthetic (statistics dump)" for r in rows.values()
                        if r["Standard"] != "value")
    assert all(a.forward in ("pass", "warning") for a in res.apis), [(a.name, a.message) for a in res.apis]


def test_cli_exit_status_and_files(fp32_dump, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "probe", "run-ut", "-i", os.path.join(fp32_dump, "dump.json"),
           "-o", str(tmp_path / "cli"), "--white-list", "linear", "gelu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "forward" in proc.stdout and glob.glob(str(tmp_path / "cli" / "accuracy_checking_details_*.csv"))
    proc = subprocess.run([sys.executable, "-m", "probe", "run-ut", "-i", str(tmp_path / "nothing")],
                          capture_output=True, text=True, cwd=root)
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_a_replayed_index_is_the_tuple_it_was(tmp_path):
    """``t[:, None, 1:]`` is dumped with its index as a JSON list; replayed as a list, torch
    warns that it reads it as a tensor of indices (an error or another result in later
    torch). Compared in tensor mode against a run whose values differ, the call is re-run
    with the tuple: no warning, and it is found to reproduce its output (not named)."""
    import json
    import warnings

    from probe.compare import compare
    paths = []
    for side, noise in (("npu", 1e-3), ("bench", 0.0)):
        dbg = PrecisionDebugger(task="tensor", dump_path=str(tmp_path / side))
        x = (torch.linspace(-1, 1, 24).reshape(4, 6) + noise).requires_grad_()
        dbg.start()
        y = (x * 2)[:, None, 1:]
        y.sum().backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        paths.append(glob.glob(os.path.join(str(tmp_path / side), "step0", "*", "dump.json"))[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compare({"npu_json_path": paths[0], "bench_json_path": paths[1], "is_print_compare_log": False},
                      str(tmp_path / "out"), html=False)
    said = [str(w.message) for w in caught if "non-tuple sequence" in str(w.message)]
    assert not said, said[:1]
    with open(out[-1], encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["replayed_calls"] >= 1
    assert summary["first_divergence"]["name"] is None, summary["verdict"]


def test_a_tensor_mode_compare_warns_nothing_from_probe(tmp_path):
    """Warnings raised in probe's modules are errors here: every index form (tensors, an
    Ellipsis, None and slices, a list) is replayed as written, so each indexing call gets
    its local error, and nothing warns (a list of tensors read as a non-tuple index warned,
    and later torch reads it as one tensor of indices)."""
    import warnings

    import openpyxl

    from probe.compare import compare
    paths = []
    i, j = torch.tensor([0, 2]), torch.tensor([1, 3])
    for side, noise in (("npu", 1e-3), ("bench", 0.0)):
        dbg = PrecisionDebugger(task="tensor", dump_path=str(tmp_path / side))
        x = (torch.linspace(-1, 1, 24).reshape(4, 6) + noise).requires_grad_()
        dbg.start()
        y = x * 2
        parts = [y[i, j], y[..., 0], y[:, None, 1:], y[[0, 2]], y[i]]
        sum(p.sum() for p in parts).backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        paths.append(glob.glob(os.path.join(str(tmp_path / side), "step0", "*", "dump.json"))[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", module=r"probe(\.|$)")
        out = compare({"npu_json_path": paths[0], "bench_json_path": paths[1], "is_print_compare_log": False},
                      str(tmp_path / "out"), html=False)
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if os.sep + "probe" + os.sep in w.filename or "non-tuple" in str(w.message)]
    assert not ours, ours[:2]
    ws = openpyxl.load_workbook(out[0])["Diagnosis"]
    header = [c.value for c in ws[1]]
    rows = [dict(zip(header, r)) for r in ws.iter_rows(min_row=2, values_only=True)]
    indexing = [r for r in rows if str(r["NPU Name"]).startswith("Tensor.__getitem__.") and r["Direction"] == "forward"]
    assert len(indexing) == 5
    for r in indexing:      # re-run on its own inputs: a local error, and not blamed
        assert isinstance(r["Local Error"], float) and r["Status"] != "introduces", r
