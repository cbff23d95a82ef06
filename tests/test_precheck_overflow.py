"""Overflow check: the API that first turned finite values into Inf/NaN, not those that
passed them on; in msprobe's dumps, in this project's dumps, and while training."""
import glob
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from probe import PrecisionDebugger  # noqa: E402
from probe.dump.overflow import OverflowCheck  # noqa: E402
from probe.precheck import find_overflow  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "msprobe")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fixture(name):
    path = os.path.join(FIXTURES, name)
    assert os.path.isdir(path), f"fixture {name} missing from tests/fixtures/msprobe"
    return path


def test_msprobe_statistics_dump_first_overflow_is_layer_norm():
    # input scaled by 1e38: finite (Max/Min ~3e38, Norm Infinity) until layer_norm gives NaN
    report = find_overflow(_fixture("v26_L1_statistics_overflow"))
    assert report.first.entry == "Functional.layer_norm.0.forward"
    assert report.first.kinds == ["NaN"]
    names = [h.entry for h in report.hits]
    assert "Tensor.__add__.0.forward" not in names           # finite 3e38 sums, not an overflow
    assert "Functional.linear.2.forward" in report.passed_on  # NaN in, NaN out
    assert "Torch.log.0.backward" not in names                # finite grads, but its forward input was NaN


def test_msprobe_overflow_check_dump():
    report = find_overflow(_fixture("v833_L1_overflow_check_overflow"))
    assert [h.entry for h in report.hits] == ["Functional.layer_norm.0.forward"]


def _model_step(x):
    """linear -> exp (overflows on a large input) -> mul -> relu -> sum: exp is the origin."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    h = lin(x)
    e = torch.exp(h * 30.0)
    y = torch.nn.functional.relu(e * 0.5)
    loss = y.sum()
    loss.backward()
    return loss


def _big_input():
    x = torch.randn(4, 8)
    x[0] = 20.0
    return x


def test_own_full_dump_overflow_found_at_exp_not_downstream(tmp_path):
    dbg = PrecisionDebugger(task="tensor", dump_path=str(tmp_path / "d"))
    dbg.start()
    _model_step(_big_input())
    dbg.stop()
    dbg.step()
    report = find_overflow(str(tmp_path / "d"))
    assert report.first.entry == "Torch.exp.0.forward"
    assert report.first.kinds == ["Inf"]
    downstream = {"Tensor.__mul__.1.forward", "Functional.relu.0.forward", "Tensor.sum.0.forward"}
    assert downstream <= set(report.passed_on)
    assert not downstream & {h.entry for h in report.hits}
    # the files alone say the same: statistics removed, tensors read
    dump_json = glob.glob(str(tmp_path / "d" / "step0" / "*" / "dump.json"))[0]
    with open(dump_json) as fh:
        dump = json.load(fh)
    for entry in dump["data"].values():
        for side in entry.values():
            for d in (side if isinstance(side, list) else side.values() if isinstance(side, dict) else []):
                if isinstance(d, dict) and "Max" in d:
                    d.pop("Max"), d.pop("Min")
    with open(dump_json, "w") as fh:
        json.dump(dump, fh)
    assert find_overflow(str(tmp_path / "d")).first.entry == "Torch.exp.0.forward"


def test_overflow_check_dumps_only_the_origin_with_tensors(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="probe"):
        with OverflowCheck(str(tmp_path / "ov"), overflow_nums=1) as oc:
            _model_step(_big_input())
    assert oc.found == ["Torch.exp.0.forward"]
    assert any("Torch.exp.0.forward" in r.getMessage() for r in caplog.records)
    rank = tmp_path / "ov" / "step0" / "rank"
    with open(rank / "dump.json") as fh:
        dump = json.load(fh)
    assert dump["task"] == "overflow_check"
    assert list(dump["data"]) == ["Torch.exp.0.forward"]
    files = sorted(os.listdir(rank / "dump_tensor_data"))
    assert files == ["Torch.exp.0.forward.input.0.npy", "Torch.exp.0.forward.output.0.npy"]
    inp = np.load(rank / "dump_tensor_data" / files[0])
    assert np.isfinite(inp).all() and np.isinf(np.load(rank / "dump_tensor_data" / files[1])).any()
    assert find_overflow(str(tmp_path / "ov")).first.entry == "Torch.exp.0.forward"


def test_overflow_check_all_backward_and_inplace(tmp_path):
    def step():
        x = _big_input()
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(8, 8))
        h = x @ w
        h.mul_(1e37)                  # in-place origin: its dumped input must be the value before
        (h.clamp(-1, 1).sum() + torch.exp(w * 100).sum()).backward()
    with OverflowCheck(str(tmp_path / "all"), overflow_nums=-1) as oc:
        step()
    assert oc.found[0] == "Tensor.mul_.0.forward"
    assert "Torch.exp.0.forward" in oc.found
    assert "Torch.exp.0.backward" in oc.found       # finite grad in, exp's huge outputs give Inf
    assert "Tensor.clamp.0.forward" not in oc.found  # Inf in, finite out: no overflow
    rank = tmp_path / "all" / "step0" / "rank" / "dump_tensor_data"
    assert np.isfinite(np.load(rank / "Tensor.mul_.0.forward.input.0.npy")).all()
    with OverflowCheck(str(tmp_path / "none"), overflow_nums=-1) as oc:
        _model_step(torch.randn(4, 8) * 0.1)
    assert oc.found == []


def test_overflow_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "probe", "overflow", _fixture("v26_L1_statistics_overflow")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("first overflow: Functional.layer_norm.0.forward")
    clean = _fixture("v26_L1_statistics_fp32")
    proc = subprocess.run([sys.executable, "-m", "probe", "overflow", clean], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "no overflow" in proc.stdout
