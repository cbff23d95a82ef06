"""Crash dumps: a registered API or custom op that raises leaves its call on disk, and
the user's exception goes on as the same object."""
import glob
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from custom_ops import define

from probe.debugger import PrecisionDebugger
from probe.forensics import crash

ERR = ValueError("kernel wrote out of bounds")


def _fail(x, scale):
    raise ERR


def _bump_then_fail(x):
    x.add_(1)           # a kernel that scribbles on its input, then dies
    raise ERR


define("probe_crash_test", "fail(Tensor x, float scale) -> Tensor", _fail)
define("probe_crash_test", "bump_then_fail(Tensor(a!) x) -> ()", _bump_then_fail)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)

    def forward(self, x, bad_weight=None):
        h = self.fc(x)
        if bad_weight is not None:
            h = F.linear(h, bad_weight)    # shapes do not fit: RuntimeError
        return h


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block()])

    def forward(self, x, bad_weight=None):
        return self.blocks[0](x, bad_weight)


def _debugger(tmp_path, task="statistics"):
    d = PrecisionDebugger(task=task, dump_path=str(tmp_path / "dump"), level="L1")
    crash.enable(d)
    return d


def test_registered_api_crash_is_saved_and_reraised(tmp_path):
    torch.manual_seed(0)
    model = Outer()
    x = torch.randn(3, 4)
    bad = torch.randn(5, 7).t()            # a transposed (non-contiguous) input
    d = _debugger(tmp_path, task="tensor")
    d.start()
    model(x)
    with pytest.raises(RuntimeError) as info:
        model(x, bad_weight=bad)
    assert "cannot be multiplied" in str(info.value)
    # training goes on: later calls are still dumped
    y = F.relu(x)
    d.stop()
    d.step()
    assert torch.equal(y, torch.relu(x))

    # the entry is named as the dump names it: the 3rd linear call of the step
    folder = tmp_path / "dump" / "exception" / "Functional.linear.2.forward"
    assert folder.is_dir(), os.listdir(tmp_path / "dump" / "exception")
    meta = json.loads((folder / "exception.json").read_text())
    assert meta["exception"]["type"] == "builtins.RuntimeError"
    assert "cannot be multiplied" in meta["exception"]["message"]
    assert meta["module_path"] == "blocks.0" and meta["module_classes"] == ["Outer", "Block"]
    assert "test_forensics_crash.py" in meta["stack"][0] and "F.linear(h, bad_weight)" in meta["stack"][0]
    entry = json.loads((folder / "dump.json").read_text())["data"]["Functional.linear.2.forward"]
    w = entry["input_args"][1]
    assert w["shape"] == [7, 5] and w["stride"] == [1, 7]
    saved = torch.load(folder / "dump_tensor_data" / w["data_name"], map_location="cpu", weights_only=True)
    assert saved.device.type == "cpu" and torch.equal(saved, bad)
    saved_h = torch.load(folder / "dump_tensor_data" / entry["input_args"][0]["data_name"], weights_only=True)
    assert torch.equal(saved_h, model.blocks[0].fc(x).detach())

    # the repro script replays the failure on its own, with the transposed layout
    proc = subprocess.run([sys.executable, meta["repro"]], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"the API raised RuntimeError: {info.value}" in proc.stdout
    assert "float32[7, 5] stride [1, 7] on cpu" in proc.stdout
    # and the step's dump.json holds the calls before and after the failure
    with open(glob.glob(str(tmp_path / "dump" / "step0" / "*" / "dump.json"))[0]) as f:
        dump = json.load(f)
    assert "Functional.relu.0.forward" in dump["data"]


def test_custom_op_exception_is_the_same_object(tmp_path):
    d = _debugger(tmp_path)
    x = torch.randn(2, 3)
    d.start()
    try:
        with pytest.raises(ValueError) as info:
            torch.ops.probe_crash_test.fail(x, 0.5)
    finally:
        d.stop()
    assert info.value is ERR
    folder = tmp_path / "dump" / "exception" / "Custom.probe_crash_test.fail.0.forward"
    entry = json.loads((folder / "dump.json").read_text())["data"][folder.name]
    assert entry["input_args"][1] == {"type": "float", "value": 0.5}
    t = torch.load(folder / "dump_tensor_data" / entry["input_args"][0]["data_name"], weights_only=True)
    assert torch.equal(t, x)
    # custom ops are not added to the regular dump
    dump = glob.glob(str(tmp_path / "dump" / "step0" / "*" / "dump.json"))
    assert not dump or "Custom." not in open(dump[0]).read()


@pytest.mark.parametrize("capture", [False, True])
def test_input_changed_in_place_by_the_failing_call(tmp_path, capture):
    d = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "dump"), level="L1")
    crash.enable(d, capture_inputs=capture)
    x = torch.zeros(4)
    d.start()
    with pytest.raises(ValueError):
        torch.ops.probe_crash_test.bump_then_fail(x)
    d.stop()
    folder = tmp_path / "dump" / "exception" / "Custom.probe_crash_test.bump_then_fail.0.forward"
    meta = json.loads((folder / "exception.json").read_text())
    info = meta["inputs"]["input.0"]
    saved = torch.load(folder / "dump_tensor_data" / info["data_name"], weights_only=True)
    if capture:   # copied before the call: the values the kernel was given
        assert info["copied"] == "before the call" and torch.equal(saved, torch.zeros(4))
    else:         # copied after: says the values are the scribbled ones
        assert info["modified_in_place"] and torch.equal(saved, torch.ones(4))
        assert any("modified in place" in n for n in meta["notes"])


@pytest.mark.parametrize("capture", [False, True])
def test_crash_under_inference_mode_is_saved(tmp_path, capture):
    # inference tensors have no version counter: the crash dump must not need one
    torch.manual_seed(0)
    model = Outer()
    d = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "dump"), level="L1")
    crash.enable(d, capture_inputs=capture)
    with torch.inference_mode():
        x = torch.randn(3, 4)
        bad = torch.randn(5, 7)
        d.start()
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            model(x, bad_weight=bad)
        d.stop()
    folder = tmp_path / "dump" / "exception" / "Functional.linear.1.forward"
    meta = json.loads((folder / "exception.json").read_text())
    info = meta["inputs"]["input.1"]
    saved = torch.load(folder / "dump_tensor_data" / info["data_name"], weights_only=True)
    assert torch.equal(saved, bad) and "modified_in_place" not in info


def test_broken_crash_dump_never_replaces_the_users_error(tmp_path, caplog):
    d = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / "dump"), level="L1")
    feature = crash.enable(d)

    def no_dir():
        raise OSError("disk full")
    feature.dump_dir_fn = no_dir
    d.start()
    try:
        with pytest.raises(ValueError) as info:
            torch.ops.probe_crash_test.fail(torch.ones(1), 1.0)
        out = torch.ops.aten.add(torch.ones(1), 1)     # still works afterwards
    finally:
        d.stop()
    assert info.value is ERR and out.item() == 2.0
    assert any("disk full" in r.getMessage() for r in caplog.records)


def test_one_dump_per_api_and_error(tmp_path):
    d = _debugger(tmp_path)
    d.start()
    for _ in range(5):          # user code that uses an exception as control flow
        try:
            torch.ops.probe_crash_test.fail(torch.ones(1), 1.0)
        except ValueError:
            pass
    d.stop()
    assert len(os.listdir(tmp_path / "dump" / "exception")) == 1


@pytest.mark.parametrize("level", ["L0", "mix", "L2"])
def test_crash_dump_at_every_level(tmp_path, level):
    """Modules-only (L0) and kernel (L2) dumps still watch API calls for crashes."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    d = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    d.start(model)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        model(torch.randn(2, 5))
    d.stop()
    d.step()
    d.close()
    folder = tmp_path / "dump" / "exception" / "Functional.linear.0.forward"
    assert (folder / "exception.json").is_file(), os.listdir(tmp_path / "dump")


def test_inputs_are_keyed_and_described_as_the_dump_names_them():
    """input.<i>[.<j>...] for positional arguments, the keyword's name for keyword ones;
    a named tuple's fields by position; a torch.Size recorded whole, as the dump does."""
    from collections import namedtuple
    from types import SimpleNamespace
    Pair = namedtuple("Pair", "scale weight")
    a, b, c, d, e = (torch.full((i + 1,), float(i)) for i in range(5))
    call = SimpleNamespace(args=(a, [b, {"k": c}], Pair(2.0, d), torch.Size([3, 4])),
                           kwargs={"bias": e, "dims": [1, a], "dim": 0})
    found = crash._tensors(call)
    assert [k for k, _ in found] == ["input.0", "input.1.0", "input.1.1.k", "input.2.1", "bias", "dims.1"]
    assert all(t is want for (_, t), want in zip(found, [a, b, c, d, e, a]))
    saved = {k: {"data_name": f"x.{k}.pt"} for k, _ in found}
    args = crash._describe(call.args, "input", saved, positional=True)
    assert args[1][1]["k"]["data_name"] == "x.input.1.1.k.pt" and args[2][1]["data_name"] == "x.input.2.1.pt"
    assert args[3] == {"type": "torch.Size", "value": [3, 4]}
    kwargs = crash._describe(call.kwargs, "kwargs", saved, positional=False)
    assert kwargs["dims"][1]["data_name"] == "x.dims.1.pt" and kwargs["dim"] == {"type": "int", "value": 0}
