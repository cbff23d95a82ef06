"""From alert to dump: after a layer's weight is corrupted at step k, the monitor arms a
PrecisionDebugger dump of step k+1 restricted to that layer."""
import json
import os

import pytest
import torch
from test_monitor import LAYER, make_gpt2, one_thread, train  # noqa: F401  (one_thread: autouse fixture)

from probe import Monitor

K = 12


def dumped(out, step):
    root = os.path.join(out, "dump")
    steps = sorted(d for d in os.listdir(root) if d.startswith("step"))
    with open(os.path.join(root, f"step{step}", "rank", "dump.json"), encoding="utf-8") as f:
        return steps, json.load(f)["data"]


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_alert_arms_a_dump_of_the_alerting_layer_at_the_next_step(tmp_path, level):
    out = str(tmp_path)
    model, opt, batches = make_gpt2()
    with Monitor(output_dir=out, dump_on_alert=True, dump_level=level, formats=["alerts"]) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, K + 4, corrupt_at=K)
    first = mon.alerts[0]
    assert (first.step, first.module) == (K, LAYER)
    steps, data = dumped(out, K + 1)
    assert steps == [f"step{K + 1}"]                     # one step, once (dump_max=1)
    names = list(data)
    # HF's Conv1D forward: view, addmm, view; forward and backward of each, nothing else
    apis = sorted(n for n in names if not n.startswith("Module."))
    assert sorted(n.split(".")[1] for n in apis if n.endswith(".forward")) == ["addmm", "view", "view"]
    assert len([n for n in apis if n.endswith(".backward")]) == 3
    if level == "mix":
        modules = [n for n in names if n.startswith("Module.")]
        assert f"Module.{LAYER}.Conv1D.forward.0" in modules
        assert all(n.startswith(f"Module.{LAYER}.Conv1D.") for n in modules)
    else:
        assert not any(n.startswith("Module.") for n in names)
    # the dumped addmm is the corrupted layer's: its weight input is the x10 weight
    addmm = next(v for n, v in data.items() if ".addmm." in n and n.endswith(".forward"))
    weight_norm = model.get_submodule(LAYER).weight.norm().item()
    norms = [a["Norm"] for a in addmm["input_args"] if isinstance(a, dict) and "Norm" in a]
    assert any(n == pytest.approx(weight_norm, rel=1e-2) for n in norms)


def test_dump_leaves_training_bitwise_identical(tmp_path):
    def run(arm):
        model, opt, batches = make_gpt2()
        mon = Monitor(output_dir=str(tmp_path / str(arm)), dump_on_alert=arm, activations=True)
        mon.set_monitor(model, optimizer=opt)
        losses = train(model, opt, batches, K + 3, corrupt_at=K)
        mon.close()
        return model, losses
    m0, l0 = run(False)
    m1, l1 = run(True)
    assert all(torch.equal(a, b) for a, b in zip(l0, l1))
    assert all(torch.equal(a, b) for a, b in zip(m0.parameters(), m1.parameters()))
    assert os.path.isdir(tmp_path / "True" / "dump" / f"step{K + 1}")
