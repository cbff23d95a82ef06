"""FSDP2 and DDP against one device (issue #33): two gloo ranks (tests/dp_train.py), rank r
training on rows [2r, 2r+2) of each step's global batch of 4, against one process on the
whole batch, same seed, three AdamW steps. ``probe compare --npu DP_ROOT --bench
SINGLE_ROOT --layout FILE`` merges each step's ranks by the layout file below (activations
sharded along the batch dim, activation gradients times 1/2: each rank's mean loss is over
its own rows) and FSDP2's recorded DTensor layouts (the optimizer's calls on the parameter
shards); DDP's parameters are plain copies, checked to agree. A clean run names nothing; a
wrong kernel on rank 1 at step 1 is named with its step and rank."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from gloo_ranks import rank_env, run_ranks
from run_cells import clean_where_merged_calls_are_checked

TIMEOUT = 240
pytestmark = [
    pytest.mark.slow,   # several processes or compiled graphs: minutes on a busy machine
    pytest.mark.skipif(sys.platform != "linux", reason="gloo on 127.0.0.1, Linux"),
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built"),
]

RUNS = {   # name -> (wrapper, dp_train.py options)
    "single_stats": ("single", []),
    "single_tensor": ("single", ["--task", "tensor"]),
    "fsdp2_stats": ("fsdp2", []),
    "fsdp2_tensor": ("fsdp2", ["--task", "tensor"]),
    "fsdp2_tensor_fault": ("fsdp2", ["--task", "tensor", "--fault", "1:1:1.05"]),
    "fsdp2_stats_fault": ("fsdp2", ["--fault", "1:1:1.5"]),
    "ddp_stats": ("ddp", []),
    "ddp_tensor": ("ddp", ["--task", "tensor"]),
    "single_stats_no_opt": ("single", ["--no-optimizer-dump"]),
    "ddp_stats_no_opt": ("ddp", ["--no-optimizer-dump"]),
}

# As a user writes it for this model: the first pattern that matches a row wins.
LAYOUT = """\
# Data parallelism against one device: each rank holds its rows of the global batch (dim 0)
"Functional.mse_loss.*.forward.output.0": {partial: avg}        # the mean over the rank's rows
"Functional.mse_loss.*.backward.input.0": {replicate: true}     # the loss's gradient, 1 on every rank
"Functional.linear.*.forward.input.[12]": {replicate: true}     # weight and bias (FSDP2: all-gathered)
"Functional.linear.*.backward.output.[12]": {partial: avg}      # the rank's own weight and bias gradients
"Functional.*.forward.*": {shard_dim: 0}                        # activations and targets
"Functional.*.backward.*": {shard_dim: 0, scale: 0.5}           # activation gradients: 2x the one device's
"""


def _launch(out, wrapper, opts):
    world = 1 if wrapper == "single" else 2
    codes, outs = run_ranks("dp_train.py", out, world, [wrapper, *opts], TIMEOUT,
                            f"dp_train.py {wrapper} {' '.join(opts)}")
    said = "".join(outs)
    if any(codes) and "support" in said and wrapper != "single":
        return RuntimeError(f"{wrapper} on gloo, torch {torch.__version__}: this gloo lacks a collective it uses")
    assert not any(codes), said[-4000:]
    return os.path.join(out, "dump")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``run(name)`` -> the dump root of RUNS[name], made on first use; skips FSDP2 where
    this torch has none (before 2.3) or where it cannot run on the CPU (before 2.7)."""
    root = tmp_path_factory.mktemp("dp")
    made: dict = {}

    def get(name):
        wrapper, opts = RUNS[name]
        if wrapper == "fsdp2":
            from probe.torch_compat import FSDP2_NOT_ON_CPU, FSDP2_RUNS_ON_CPU, fully_shard_api
            if fully_shard_api() is None:
                pytest.skip(f"torch {torch.__version__} has no FSDP2 (fully_shard: torch.distributed.fsdp from "
                            "2.6, torch.distributed._composable.fsdp in 2.3-2.5)")
            if not FSDP2_RUNS_ON_CPU:   # the gloo ranks run on the CPU
                pytest.skip(FSDP2_NOT_ON_CPU)
        if name not in made:
            made[name] = _launch(str(root / name), wrapper, opts)
        if isinstance(made[name], Exception):
            pytest.skip(str(made[name]))
        return made[name]
    return get


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    path = tmp_path_factory.mktemp("layout") / "dp_layout.yaml"
    path.write_text(LAYOUT)
    return str(path)


def _compare(npu, bench, out, layout):
    from probe import compare_run
    return compare_run(npu, bench, str(out), processes=1, layout=layout)




def _rows(out, step):
    import glob

    import pandas as pd
    return pd.read_csv(sorted(glob.glob(os.path.join(str(out), f"compare_result_step{step}_*.csv")))[-1])


@pytest.mark.parametrize("name", ["fsdp2_stats", "fsdp2_tensor", "ddp_stats", "ddp_tensor"])
def test_data_parallel_against_one_device_names_nothing(run, layout, tmp_path, name):
    mode = name.rsplit("_", 1)[1]
    s = _compare(run(name), run(f"single_{mode}"), tmp_path / "o", layout).summary
    assert s["first_divergence"] is None, s["first_divergence"]
    assert s["steps"] == [0, 1, 2] and not s["unpaired"]
    for cell in s["grid"]:    # from statistics the loss's mean over a rank's batch is Partial(avg)
        clean_where_merged_calls_are_checked(cell, *(("Functional.mse_loss.0.forward.output.0",
                                                       "a Partial(avg) tensor") if mode == "stats" else (None, None)))
    assert "layout file" in s["notes"][0]
    for step in (0, 1, 2):
        rows = _rows(tmp_path / "o", step)
        paired = rows[rows["Bench Name"].notna() & rows["NPU Name"].notna()]
        assert not (paired["Result"] == "error").any(), paired[paired["Result"] == "error"]["NPU Name"].tolist()
        # activations merged along the batch, activation gradients scaled back, the
        # optimizer's calls on FSDP2's parameter shards merged by their recorded layout
        for row_name in ("Functional.linear.0.forward.output.0", "Functional.relu.0.backward.output.0",
                         "Functional.linear.0.forward.input.1", "Tensor.addcdiv_.0.forward.output.0"):
            row = paired[paired["NPU Name"] == row_name].iloc[0]
            assert row["Result"] == "pass", (row_name, row["Err_message"])
            assert row["NPU Tensor Shape"] == row["Bench Tensor Shape"], row_name
        # the ranks' own weight gradients: averaged from tensors, "can't tell" from statistics
        row = paired[paired["NPU Name"] == "Functional.linear.0.backward.output.1"].iloc[0]
        if mode == "tensor":
            assert row["Result"] == "pass", row["Err_message"]
        else:
            assert row["Err_message"].startswith("warning: can't tell: a Partial(avg) tensor")
    with open(tmp_path / "o" / "merged_npu" / "step1" / "rank" / "dump.json") as fh:
        data = json.load(fh)["data"]
    assert data["Functional.linear.0.forward"]["output"][0]["merge"] == "shard Shard(dim=0) over ranks 0,1 (layout file)"
    assert data["Functional.relu.0.backward"]["output"][0]["merge"] == \
        "shard Shard(dim=0) x0.5 over ranks 0,1 (layout file)"
    merge = data["Tensor.addcdiv_.0.forward"]["output"][0]["merge"]
    assert merge == ("shard Shard(dim=0) over ranks 0,1 (recorded)" if name.startswith("fsdp2")
                     else "replicate over ranks 0,1 (plain)"), merge


def test_gradients_nothing_after_checks_are_cant_tell_from_statistics(run, layout, tmp_path):
    """DDP against one device in statistics mode, the dump stopped before the optimizer's
    step: the ranks' own weight gradients (Partial(avg)) can't be merged from statistics and
    no call compared after them reads them. Nothing checked them: every step is "cant_tell"
    (never clean), saying how many calls, the first and why; the run names no culprit and
    its answer does not say clean."""
    from probe.compare.run_report import answer_lines
    s = _compare(run("ddp_stats_no_opt"), run("single_stats_no_opt"), tmp_path / "o", layout).summary
    assert s["first_divergence"] is None and s["steps"] == [0, 1, 2] and not s["unpaired"]
    for cell in s["grid"]:
        with open(cell["report"]) as fh:
            n = json.load(fh)["calls"]["can't tell"]
        assert cell["verdict"] == "cant_tell", cell
        assert re.fullmatch(rf"{n} calls can't be judged \(their outputs can't be merged across ranks\), first "
                            r"Functional\.mse_loss\.0\.forward\.output\.0 can't be merged across ranks: "
                            r"a Partial\(avg\) tensor.*; no call compared after the last of them checks them; "
                            r"dump tensors to judge them", cell["reason"]), cell["reason"]
    lines = answer_lines(s)
    assert lines[0].endswith(": cant_tell 3"), lines
    assert lines[1] == "first divergence: none found, but 3 of 3 pair(s) have calls statistics can't tell " \
                       "(never \"clean\")", lines


@pytest.mark.parametrize("mode, scale_said", [("tensor", "its piece differs from the bench's slice at its offset"),
                                              ("stats", "rank 1's Max")])
def test_fsdp2_fault_on_one_rank_is_named_with_its_step_and_rank(run, layout, tmp_path, mode, scale_said):
    """fc1's matrix product scaled on rank 1 at step 1 (1.05 in tensor mode; 1.5 in
    statistics, which name a shard by its extremes): the CLI names the call, step 1, rank 1."""
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "probe", "compare", "--npu", run(f"fsdp2_{mode}_fault"), "--bench",
                           run(f"single_{mode}"), "-o", str(out), "--layout", layout, "--processes", "1"],
                          env=rank_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "first divergence: Functional.linear.0.forward (forward) at step 1, rank 1: introduces error" in proc.stderr
    with open(out / "compare_summary.json") as fh:
        fd = json.load(fh)["first_divergence"]
    assert (fd["name"], fd["step"], fd["rank"], fd["ranks"], fd["rank_certain"], fd["merged_ranks"]) == \
        ("Functional.linear.0.forward", 1, 1, [1], True, [0, 1])
    assert scale_said in fd["reason"]


def test_a_scale_rule_is_validated(tmp_path):
    from probe.compare.layout_file import parse_layout
    from probe.errors import ConfigError
    rules = parse_layout({"a.*": {"shard_dim": 0, "scale": 0.5}, "b": {"replicate": True}})
    assert (rules.rules[0].kind, rules.rules[0].scale, rules.rules[1].scale) == ("shard", 0.5, 1.0)
    for bad, said in (({"scale": 0.5}, "must be exactly one of"), ({"shard_dim": 0, "scale": 0}, "finite non-zero"),
                      ({"shard_dim": 0, "scale": "x"}, "finite non-zero")):
        with pytest.raises(ConfigError, match=said):
            parse_layout({"a": bad}, "l.yaml")


@pytest.mark.skipif(not hasattr(torch.UntypedStorage, "resizable"),
                    reason="torch < 2.2 has no UntypedStorage.resizable() to read the mark with")
def test_tensor_dumps_leave_storages_resizable():
    """FSDP2 frees each unsharded parameter by resizing its storage to 0; Tensor.numpy()
    marks a storage non-resizable for good, and a tensor dump under FSDP2 failed there."""
    from probe.dump.draw_files import pack_mask, pack_nonzero, zero_free
    from probe.dump.stats import crc32, host_copy, reductions
    t, mask = torch.randn(4, 3), torch.ones(5, dtype=torch.bool)
    host_copy(t), host_copy(t.t()), crc32(t), pack_nonzero(t), zero_free(t), pack_mask(mask)
    reductions(t), reductions(t.t())
    assert t.untyped_storage().resizable() and mask.untyped_storage().resizable()
    t.untyped_storage().resize_(0)
