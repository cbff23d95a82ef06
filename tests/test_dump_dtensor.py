"""Tensor parallelism (DTensor) under the debugger: statistics come from each rank's local
shard with no collective, so a rank filter never hangs the ranks it leaves out; entries
record the shard's layout; training stays bitwise identical."""
import json
import os
import sys

import pytest
import torch
from gloo_ranks import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="gloo on 127.0.0.1, Linux")]


def _tp_run(out, dump_ranks, world=2, timeout=120):
    """Both ranks of tests/tp_train.py; a rank that hangs fails the test after ``timeout``."""
    codes, outs = run_ranks("tp_train.py", out, world, [dump_ranks], timeout,
                            f"tensor-parallel run with dump ranks {dump_ranks}")
    said = "".join(outs)
    if any(codes) and ("ModuleNotFoundError" in said or "ImportError" in said):
        pytest.skip("this torch lacks init_device_mesh / parallelize_module for the CPU")
    assert not any(codes), outs
    return [torch.load(os.path.join(out, f"losses_rank{r}.pt"), weights_only=True) for r in range(world)]


def test_rank_filter_on_a_dtensor_model_finishes_and_training_is_bitwise(tmp_path):
    plain = _tp_run(tmp_path / "plain", "none")
    one = _tp_run(tmp_path / "one", "0")
    for a, b in zip(plain, one):
        assert all(torch.equal(x, y) for x, y in zip(a["losses"], b["losses"]))
        assert all(torch.equal(x, y) for x, y in zip(a["weights"], b["weights"]))
    step = tmp_path / "one" / "dump" / "step0"
    assert sorted(os.listdir(step)) == ["rank0"]
    with open(step / "rank0" / "dump.json", encoding="utf-8") as fh:
        data = json.load(fh)["data"]
    # fc1 (colwise): its weight is sharded on dim 0, 32 rows -> 16 on each rank
    lin = data["Functional.linear.0.forward"]
    weight = lin["input_args"][1]
    assert weight["shape"] == [32, 16] and weight["local_shape"] == [16, 16]
    assert weight["placements"] == ["Shard(dim=0)"] and weight["mesh_shape"] == [2]
    assert weight["global_offset"] in ([0, 0], None)
    assert all(isinstance(weight[k], float) for k in ("Max", "Min", "Mean", "Norm"))


def test_every_rank_dumping_records_each_ranks_own_shard(tmp_path):
    _tp_run(tmp_path / "all", "all")
    offsets = []
    for r in (0, 1):
        with open(tmp_path / "all" / "dump" / "step0" / f"rank{r}" / "dump.json", encoding="utf-8") as fh:
            weight = json.load(fh)["data"]["Functional.linear.0.forward"]["input_args"][1]
        offsets.append(weight["global_offset"])
    if None not in offsets:
        assert offsets == [[0, 0], [16, 0]], offsets
