"""This project's own dumps of a real model, fp32 vs bf16 autocast, compared end to end."""
import glob
import os

import torch

from probe.compare import compare
from probe.debugger import PrecisionDebugger  # an ImportError here fails the run, loudly


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(x + self.fc2(torch.nn.functional.relu(self.fc1(x))))


def _dump(path, bf16):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), torch.nn.Linear(32, 10))
    x = torch.randn(8, 32)
    target = torch.randint(0, 10, (8,))
    debugger = PrecisionDebugger(task="tensor", dump_path=str(path), level="L1")
    debugger.start()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(x)
    loss = torch.nn.functional.cross_entropy(out.float(), target)
    loss.backward()
    debugger.stop()
    debugger.step()
    found = glob.glob(os.path.join(str(path), "step0", "*", "dump.json"))
    assert found, "the debugger wrote no dump.json"
    return found[0]


def test_own_dumps_fp32_vs_bf16(tmp_path):
    import openpyxl
    fp32 = _dump(tmp_path / "fp32", bf16=False)
    bf16 = _dump(tmp_path / "bf16", bf16=True)
    xlsx, csv, _page, _summary = compare({"npu_json_path": bf16, "bench_json_path": fp32,
                         "is_print_compare_log": False}, str(tmp_path / "out"), fuzzy_match=True)
    ws = openpyxl.load_workbook(xlsx)["compare_result"]
    header = [c.value for c in ws[1]]
    assert "Cosine" in header                      # tensor mode from the .npy files
    rows = [dict(zip(header, r)) for r in ws.iter_rows(min_row=2, values_only=True)]
    matched = [r for r in rows if r["NPU Name"] and r["Bench Name"]]
    assert len(matched) >= 10
    bf16_rows = [r for r in matched if r["NPU Dtype"] == "torch.bfloat16"]
    assert bf16_rows, "autocast produced no bf16 tensor"
    assert all(r["Result"] != "error" for r in bf16_rows), [
        (r["NPU Name"], r["Err_message"]) for r in bf16_rows if r["Result"] == "error"]
    assert all(isinstance(r["Cosine"], float) and r["Cosine"] > 0.99 for r in bf16_rows
               if r["Cosine"] is not None)
