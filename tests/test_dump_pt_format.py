"""file_format "pt": tensor files as msprobe writes them for PyTorch (torch.save'd CPU
tensors, ``.pt`` in data_name), read back with ``torch.load(weights_only=True)``, and read
by probe's own compare and run-ut as the npy dumps are."""
import json
import os

import pytest

torch = pytest.importorskip("torch")

from conftest import load_dump, needs_pt_loads  # noqa: E402
from models import make_mlp, train_step  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402
from probe.precheck import run_ut  # noqa: E402


def _dump(dump_path, fmt, dtype=torch.float32):
    cfg = os.path.join(str(dump_path), "config.json")
    os.makedirs(str(dump_path), exist_ok=True)
    with open(cfg, "w") as f:
        json.dump({"task": "tensor", "dump_path": str(dump_path), "level": "L1",
                   "tensor": {"file_format": fmt}}, f)
    model, x, y = make_mlp()
    model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(config_path=cfg)
    dbg.start()
    train_step(model, opt, x.to(dtype), y)
    dbg.stop()
    dbg.step()
    dbg.close()
    return os.path.join(str(dump_path), "step0", "rank")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pt_files_load_with_weights_only(tmp_path, dtype):
    rank = _dump(tmp_path / "pt", "pt", dtype)
    data = load_dump(str(tmp_path / "pt"))
    names = []
    for entry in data.values():
        for part in ("input_args", "output", "input"):
            for d in entry.get(part, []):
                if isinstance(d, dict) and d.get("data_name"):
                    names.append((d["data_name"], d))
    assert len(names) >= 20
    assert all(n.endswith(".pt") for n, _ in names)
    files = os.listdir(os.path.join(rank, "dump_tensor_data"))
    assert files and all(f.endswith(".pt") for f in files)
    for name, desc in names:
        t = torch.load(os.path.join(rank, "dump_tensor_data", name), weights_only=True)
        assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
        assert str(t.dtype) == desc["dtype"] and list(t.shape) == desc["shape"]
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()   # no base saved
        if t.numel():
            assert abs(t.double().max().item() - desc["Max"]) <= 1e-6 * max(1, abs(desc["Max"]))


@needs_pt_loads
def test_pt_and_npy_dumps_agree_in_compare_and_run_ut(tmp_path):
    from probe.compare.entry_points import compare
    pt = _dump(tmp_path / "pt", "pt")
    npy = _dump(tmp_path / "npy", "npy")
    res = run_ut(pt, out_dir=str(tmp_path / "ut"), progress=False)
    statuses = {a.name: a.forward for a in res.apis}
    assert statuses["Functional.linear.0"] == "pass"
    assert not [a for a in res.apis if "cannot rebuild" in a.message]
    paths = compare({"npu_json_path": os.path.join(pt, "dump.json"),
                     "bench_json_path": os.path.join(npy, "dump.json")}, str(tmp_path / "cmp"))
    csv_path = [p for p in paths if p.endswith(".csv")][0]
    import pandas as pd
    rows = pd.read_csv(csv_path)
    cos = pd.to_numeric(rows["Cosine"], errors="coerce").dropna()   # "unsupported": a non-tensor row
    assert len(cos) >= 20 and (cos > 0.999999).all()   # the same run, tensors read on both sides
    assert (rows["Result"] == "pass").all()
