"""Compare across layouts: a tensor-parallel run (two gloo ranks, tests/tp_train.py: fc1
colwise, fc2 rowwise through DTensor, or Megatron-style plain shards) against the same
model, data and seed on one device, and TP=2 against TP=4. Each step's ranks are merged
into one logical dump by the recorded layouts (or a layout file); a clean run names
nothing, a wrong kernel on rank 1 at step 1 is named with its step and rank, a Partial
tensor's statistics are "can't tell"."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest
from gloo_ranks import rank_env, run_ranks
from run_cells import clean_where_merged_calls_are_checked

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="gloo on 127.0.0.1, Linux")]

RUNS = {   # name -> (ranks, tp_train.py options); 2 steps each, a fault at step 1 on rank 1
    "single_stats": (1, ["--single"]),
    "single_tensor": (1, ["--single", "--task", "tensor"]),
    "tp_stats": (2, []),
    "tp_tensor": (2, ["--task", "tensor"]),
    "tp_tensor_fault": (2, ["--task", "tensor", "--fault", "1:1:1.05"]),
    "tp_stats_fault": (2, ["--fault", "1:1:1.5"]),
    "tp_stats_small_fault": (2, ["--fault", "1:1:1.05"]),
    "megatron_stats": (2, ["--megatron"]),
    "tp4_stats": (4, []),
}
NEEDS_DTENSOR = {"tp_stats", "tp_tensor", "tp_tensor_fault", "tp_stats_fault", "tp_stats_small_fault", "tp4_stats"}
TIMEOUT = 240


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``run(name)`` -> the dump root of RUNS[name], made on first use (every rank a process,
    killed after TIMEOUT s: a hang fails the test); skips where this torch lacks the
    DTensor APIs tp_train.py needs."""
    root = tmp_path_factory.mktemp("layouts")
    made: dict = {}

    def get(name):
        if name not in made:
            made[name] = _launch(str(root / name), *RUNS[name])
        if isinstance(made[name], Exception):
            pytest.skip(str(made[name]))
        return made[name]
    return get


def _launch(out, world, opts):
    codes, outs = run_ranks("tp_train.py", out, world, ["all", "--steps", "2", *opts], TIMEOUT,
                            f"tp_train.py {' '.join(opts)} on {world} rank(s)")
    said = "".join(outs)
    if any(codes) and ("ModuleNotFoundError" in said or "ImportError" in said):
        return RuntimeError("this torch lacks init_device_mesh / parallelize_module for the CPU")
    assert not any(codes), said[-4000:]
    return os.path.join(out, "dump")


def _compare(npu, bench, out, **kw):
    from probe import compare_run
    kw.setdefault("processes", 1)
    return compare_run(npu, bench, str(out), **kw)


def _pair_summary(out, step):
    path = sorted(glob.glob(os.path.join(str(out), f"compare_summary_step{step}_*.json")))[-1]
    with open(path) as fh:
        return json.load(fh)




def _rows(out, step):
    import pandas as pd
    return pd.read_csv(sorted(glob.glob(os.path.join(str(out), f"compare_result_step{step}_*.csv")))[-1])


@pytest.mark.parametrize("mode", ["stats", "tensor"])
def test_tensor_parallel_against_one_device_names_nothing(run, tmp_path, mode):
    r = _compare(run(f"tp_{mode}"), run(f"single_{mode}"), tmp_path / "o")
    s = r.summary
    assert s["first_divergence"] is None, json.dumps(s["first_divergence"], default=str)[:3000]
    assert s["steps"] == [0, 1] and not s["unpaired"]
    for cell in s["grid"]:    # fc1's relu output is column-sharded and no layout says so
        clean_where_merged_calls_are_checked(cell, "Functional.relu.0.forward.output.0",
                                              "its copies differ across ranks and neither a recorded layout "
                                              "nor the layout file says how to merge them")
    assert "merged by their layouts" in s["notes"][0]
    for step in (0, 1):
        pair = _pair_summary(tmp_path / "o", step)
        assert pair["mode"] == ("statistics" if mode == "stats" else "tensor")
        assert pair["calls"]["introduces"] == 0 and pair["rows"]["error"] == 0
        rows = _rows(tmp_path / "o", step)
        paired = rows[rows["Bench Name"].notna() & rows["NPU Name"].notna()]
        # fc1's output (Shard(dim=1)) and weight (Shard(dim=0)), and the optimizer's in-place
        # updates of sharded weights, merged into the whole tensors and equal to one device's
        for name in ("Functional.linear.0.forward.output.0", "Functional.linear.0.forward.input.1",
                     "Tensor.add_.0.forward.output.0", "Functional.linear.0.backward.output.1"):
            row = paired[paired["NPU Name"] == name].iloc[0]
            assert row["Result"] == "pass", (name, row["Err_message"])
            assert row["NPU Tensor Shape"] == row["Bench Tensor Shape"]
        merged = r.outcomes[0]
        assert merged.culprit is None and merged.error is None
    # fc2's output is Partial(sum): summed exactly from the tensors
    if mode == "tensor":
        row = paired[paired["NPU Name"] == "Functional.linear.1.forward.output.0"].iloc[0]
        assert row["Result"] == "pass" and float(row["Cosine"]) > 0.99999


def test_partial_statistics_are_cant_tell_with_the_reason(run, tmp_path):
    _compare(run("tp_stats"), run("single_stats"), tmp_path / "o")
    rows = _rows(tmp_path / "o", 1)
    row = rows[rows["NPU Name"] == "Functional.linear.1.forward.output.0"].iloc[0]
    assert row["Result"] == "warning" and row["Err_message"].startswith("warning: can't tell: a Partial(sum) tensor")
    assert "statistics of a sum are not functions of its terms'" in row["Err_message"]
    assert all(row[c] != row[c] for c in ("Max diff", "Err/Tolerance"))       # no numbers from a guess
    pair = _pair_summary(tmp_path / "o", 1)
    assert pair["calls"]["can't tell"] >= 1
    notes = " ".join(pair["notes"])
    assert "NPU ranks 0, 1 merged into one logical dump" in notes and "can't be merged" in notes
    import pandas as pd
    pytest.importorskip("pyarrow", exc_type=ImportError)
    table = pd.read_parquet(tmp_path / "o" / "diagnosis.parquet")
    fc2 = table[(table.npu_entry == "Functional.linear.1.forward") & (table["step"].astype(int) == 1)]
    assert list(fc2.status) == ["can't tell"]


def test_kernel_fault_on_one_rank_is_named_with_its_step_and_rank(run, tmp_path):
    """Tensor mode, the whole-run CLI on two local worker processes: the call, step 1 and
    rank 1, found by comparing each rank's shard with its slice of the bench's tensor."""
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "probe", "compare", "--npu", run("tp_tensor_fault"), "--bench",
                           run("single_tensor"), "-o", str(out), "--processes", "2"], env=rank_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "first divergence: Functional.linear.0.forward (forward) at step 1, rank 1: introduces error" in proc.stderr
    with open(out / "compare_summary.json") as fh:
        fd = json.load(fh)["first_divergence"]
    assert (fd["name"], fd["step"], fd["rank"], fd["ranks"], fd["rank_certain"], fd["merged_ranks"]) == \
        ("Functional.linear.0.forward", 1, 1, [1], True, [0, 1])
    assert "rank 1: its piece differs from the bench's slice at its offset by 0.05" in fd["reason"]
    assert "rank 0 within" in fd["reason"]


def test_statistics_fault_is_named_by_its_shard_extremes(run, tmp_path):
    s = _compare(run("tp_stats_fault"), run("single_stats"), tmp_path / "o").summary
    fd = s["first_divergence"]
    assert (fd["name"], fd["step"], fd["rank"], fd["ranks"], fd["rank_certain"]) == \
        ("Functional.linear.0.forward", 1, 1, [1], True)
    assert "rank 1's Max" in fd["reason"] and "exceeds the whole tensor's" in fd["reason"]


def test_small_statistics_fault_names_the_call_and_step_and_says_the_rank_cannot_be_told(run, tmp_path):
    """A 5% scale on rank 1's shard, whose extremes and RMS stay inside what rank 0's shard
    holds: statistics name the call and the step; which rank is said not to be known."""
    from probe.compare.run_report import answer_lines
    s = _compare(run("tp_stats_small_fault"), run("single_stats"), tmp_path / "o").summary
    fd = s["first_divergence"]
    assert (fd["name"], fd["step"], fd["ranks"], fd["rank_certain"]) == ("Functional.linear.0.forward", 1, [0, 1], False)
    assert "cannot be told from statistics" in fd["reason"]
    assert "at step 1, ranks 0, 1 (which one can't be told)" in "\n".join(answer_lines(s))


LAYOUT = """\
# Megatron-style fc1: column-parallel on plain tensors (rows of the weight and bias, columns of the output)
"Functional.linear.0.forward.input.[12]": {shard_dim: 0}
"Functional.linear.0.forward.output.0": {shard_dim: 1}
"Functional.linear.0.backward.input.0": {shard_dim: 1}
"Functional.linear.0.backward.output.[12]": {shard_dim: 0}
"Tensor.add_.[01].forward.*": {shard_dim: 0}     # SGD's updates of fc1's weight and bias shards
"""


def test_megatron_plain_shards_merge_by_a_layout_file_and_compare_clean(run, tmp_path):
    layout = tmp_path / "layout.yaml"
    layout.write_text(LAYOUT)
    r = _compare(run("megatron_stats"), run("single_stats"), tmp_path / "o", layout=str(layout))
    assert r.summary["first_divergence"] is None and "layout file" in r.summary["notes"][0]
    rows = _rows(tmp_path / "o", 1)
    for name in ("Functional.linear.0.forward.output.0", "Functional.linear.0.backward.output.1",
                 "Tensor.add_.0.forward.output.0"):
        row = rows[rows["NPU Name"] == name].iloc[0]
        assert row["Result"] == "pass" and row["NPU Tensor Shape"] == row["Bench Tensor Shape"], name
    with open(tmp_path / "o" / "merged_npu" / "step1" / "rank" / "dump.json") as fh:
        out = json.load(fh)["data"]["Functional.linear.0.forward"]["output"][0]
    assert out["shape"] == [4, 32] and out["merge"] == "shard Shard(dim=1) over ranks 0,1 (layout file)"
    # without the file nothing says how the plain shards lie: one line says what to give
    with pytest.raises(FileNotFoundError, match="give a layout file"):
        _compare(run("megatron_stats"), run("single_stats"), tmp_path / "p")


def test_a_bad_layout_file_is_one_error_line(run, tmp_path, capsys):
    from probe.cli import main
    bad = tmp_path / "layout.json"
    bad.write_text(json.dumps({"Functional.linear.*.forward.output.0": {"shard_dim": "1"}}))
    rc = main(["compare", "--npu", run("megatron_stats"), "--bench", run("single_stats"), "-o",
               str(tmp_path / "o"), "--layout", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0] == (f"probe compare: error: layout file {bad}: key 'Functional.linear.*.forward.output.0': "
                      "shard_dim '1' must be an integer (a dimension, negative from the end)")
    assert not (tmp_path / "o").exists()


def test_two_ranks_against_four_merge_both_sides(run, tmp_path):
    r = _compare(run("tp_stats"), run("tp4_stats"), tmp_path / "o")
    assert r.summary["first_divergence"] is None
    notes = " ".join(_pair_summary(tmp_path / "o", 1)["notes"])
    assert "NPU ranks 0, 1 merged" in notes and "bench ranks 0, 1, 2, 3 merged" in notes
    rows = _rows(tmp_path / "o", 1)
    row = rows[rows["NPU Name"] == "Functional.linear.0.forward.output.0"].iloc[0]
    assert row["Result"] == "pass" and row["NPU Tensor Shape"] == row["Bench Tensor Shape"] == "[4, 32]"


def test_merged_pairs_run_on_a_dask_cluster(run, tmp_path):
    pytest.importorskip("distributed")
    from distributed import LocalCluster
    npu, bench = run("tp_tensor_fault"), run("single_tensor")
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                      host="127.0.0.1") as cluster:
        s = _compare(npu, bench, tmp_path / "o", processes=None, scheduler=cluster.scheduler_address).summary
    fd = s["first_divergence"]
    assert (fd["name"], fd["step"], fd["rank"]) == ("Functional.linear.0.forward", 1, 1)
