"""Meta check: a custom op whose meta says bf16 while the kernel writes fp32 is caught;
real models give no false alarm and train bit for bit as without the check."""
import json
import os
import textwrap

import torch
import torch.nn.functional as F
from custom_ops import define

from probe.cli import main as cli_main
from probe.debugger import PrecisionDebugger
from probe.forensics import meta_check

define("probe_meta_test", "scale(Tensor x) -> Tensor",
       lambda x: (x * 2).float(),                                  # the kernel always writes fp32
       fake=lambda x: torch.empty_like(x, dtype=torch.bfloat16))   # the meta function says bf16
_pool = define("probe_meta_test", "pool(Tensor x) -> Tensor",
               lambda x: x.sum(-1),
               fake=lambda x: x.new_empty(x.shape))               # forgot the reduction: wrong shape


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 6 * 6, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.emb = torch.nn.Embedding(10, 16)

    def forward(self, x, ids):
        h = self.norm(self.fc(F.relu(self.bn(self.conv(x))).flatten(1))) + self.emb(ids)
        q = h.view(4, 2, 8).transpose(0, 1)
        a = F.scaled_dot_product_attention(q, q, q)
        return F.dropout(a, 0.1).sum() + h[:, ::2].softmax(-1).max()


def _train(debugger, steps=2):
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        if debugger:
            debugger.start()
        x, ids = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            extra = F.linear(x.flatten(1)[:, :16], torch.randn(5, 16)).float().sum()
        loss = model(x, ids) + extra
        loss.backward()
        opt.step()
        opt.zero_grad()
        if debugger:
            debugger.stop()
            debugger.step()
    return [p.detach().clone() for p in model.parameters()]


def test_custom_op_meta_dtype_and_shape_mismatch(tmp_path, caplog):
    d = PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level="L1")
    check = meta_check.enable(d)
    d.start()
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    y = torch.ops.probe_meta_test.scale(x)
    z = _pool(torch.randn(3, 4))
    d.stop()
    assert y.dtype == torch.float32 and z.shape == (3,)      # results untouched
    report = json.loads((tmp_path / "meta_check.json").read_text())
    by_api = {m["api"]: m for m in report["mismatches"]}
    assert set(by_api) == {"Custom.probe_meta_test.scale", "Custom.probe_meta_test.pool"}
    m = by_api["Custom.probe_meta_test.scale"]
    assert m["entry"] == "Custom.probe_meta_test.scale.0.forward" and m["op"].startswith("probe_meta_test.scale")
    out = m["outputs"][0]
    assert out["differs"] == ["dtype"]
    assert out["kernel"]["dtype"] == "torch.float32" and out["meta"]["dtype"] == "torch.bfloat16"
    assert out["kernel"]["shape"] == out["meta"]["shape"] == [3, 4]
    assert "test_forensics_meta_check.py" in m["stack"][0] and "probe_meta_test.scale(x)" in m["stack"][0]
    p = by_api["Custom.probe_meta_test.pool"]["outputs"][0]
    assert p["differs"] == ["shape"] and p["kernel"]["shape"] == [3] and p["meta"]["shape"] == [3, 4]
    console = [r.getMessage() for r in caplog.records if "meta check" in r.getMessage()]
    assert any("kernel float32[3, 4]" in c and "meta bfloat16[3, 4]" in c for c in console)
    assert check.checked >= 2


def test_real_model_no_false_alarm_and_same_training(tmp_path):
    reference = _train(None)
    d = PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level="L1")
    check = meta_check.enable(d)
    params = _train(d)
    report = check.report()
    assert report["mismatches"] == [], report["mismatches"]
    assert report["meta_errors"] == [], report["meta_errors"]
    assert report["checked_calls"] > 30
    # the fake runs touch neither values nor the RNG (dropout): bitwise the same training
    assert all(torch.equal(a, b) for a, b in zip(params, reference))
    # the dump itself is unaffected and holds no Custom entries
    with open(os.path.join(tmp_path, "step1", "rank", "dump.json")) as f:
        names = list(json.load(f)["data"])
    assert "Functional.conv2d.0.forward" in names and not any(n.startswith("Custom.") for n in names)


def test_data_dependent_shapes_are_skipped_not_reported(tmp_path):
    d = PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level="L1")
    check = meta_check.enable(d)
    d.start()
    idx = torch.nonzero(torch.tensor([0.0, 1.0, 2.0]))
    d.stop()
    assert idx.shape == (2, 1)
    report = check.report()
    assert report["mismatches"] == [] and report["skipped"]["output shape depends on the data"] == {"Torch.nonzero": 1}


def test_cli_runs_a_script(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        lib = torch.library.Library("probe_meta_cli", "DEF")
        lib.define("cast(Tensor x) -> Tensor")
        lib.impl("cast", lambda x: x.float() * 2, "CompositeExplicitAutograd")
        lib.impl("cast", lambda x: torch.empty_like(x), "Meta")
        cast = torch.ops.probe_meta_cli.cast
        lin = torch.nn.Linear(4, 4)
        for _ in range(3):
            y = cast(lin(torch.randn(2, 4)).to(torch.bfloat16))
        print("script args", sys.argv[1:])
    """))
    out = tmp_path / "mc.json"
    rc = cli_main(["meta-check", "-o", str(out), str(script), "--flag", "1"])
    assert rc == 1
    printed = capsys.readouterr().out
    assert "script args ['--flag', '1']" in printed and "1 mismatch(es)" in printed
    report = json.loads(out.read_text())
    (m,) = report["mismatches"]
    assert m["api"] == "Custom.probe_meta_cli.cast" and m["count"] == 3
    assert m["outputs"][0]["kernel"]["dtype"] == "torch.float32" and m["outputs"][0]["meta"]["dtype"] == "torch.bfloat16"
    assert str(script) in m["stack"][0]
    # a clean script exits 0
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nprint(torch.nn.functional.gelu(torch.randn(3)).shape)\n")
    assert cli_main(["meta-check", "-o", str(tmp_path / "c.json"), str(clean)]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["checked_calls"] >= 2
