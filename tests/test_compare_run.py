"""Whole runs: a real 2-rank data-parallel training (gloo, one process per rank, a tiny
transformer, 3 steps dumped on both ranks), faults on rank 1 at step 1, one answer for
the run; local worker processes, a Dask LocalCluster, Parquet, check-ranks."""
import gc
import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest
from gloo_ranks import free_port, rank_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="gloo on 127.0.0.1, Linux")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ROOT/{bench,bench2,kernel,collective}/step{0,1,2}/rank{0,1}/dump.json."""
    root = str(tmp_path_factory.mktemp("runs"))
    port = str(free_port())
    script = os.path.join(HERE, "dist_train.py")
    procs = [subprocess.Popen([sys.executable, script, root, port, str(r), "2"], cwd=ROOT,
                              env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return root


def _collective_results_recorded(root):
    with open(os.path.join(root, "collective", "step1", "rank1", "dump.json")) as fh:
        data = json.load(fh)["data"]
    return data["Distributed.all_reduce.0.forward"]["output"] != [None]


def _cell(summary, step, rank):
    return next(c for c in summary["grid"] if c["step"] == step and c["rank"] == rank)


def _cli(argv, capsys, caplog):
    """rc, stdout (the CLI's list of files) and compare's answer, which the library logs at
    INFO (stderr only where logging is not configured: pytest configures it)."""
    from probe.cli import main
    caplog.set_level(logging.INFO, logger="probe")
    caplog.clear()
    rc = main(argv)
    assert gc.isenabled()     # the command pauses the collector, and gives it back
    said = "\n".join(r.getMessage() for r in caplog.records if r.name == "probe.compare.entry_points")
    return rc, capsys.readouterr().out, said


def test_kernel_fault_on_one_rank_is_named_with_its_step_and_rank(runs, tmp_path, capsys, caplog):
    out = str(tmp_path / "o")
    rc, stdout, said = _cli(["compare", "--npu", os.path.join(runs, "kernel"), "--bench",
                             os.path.join(runs, "bench"), "-o", out, "--processes", "2"], capsys, caplog)
    assert rc == 0
    with open(os.path.join(out, "compare_summary.json")) as fh:
        s = json.load(fh)
    assert s["schema"] == "probe.run_summary/1" and s["steps"] == [0, 1, 2] and s["ranks"] == [0, 1]
    fd = s["first_divergence"]
    # the faulty kernel, where it ran: not rank 0 (which only received the error through
    # the gradient all_reduce), not step 2 (which inherits through the weights)
    assert (fd["name"], fd["step"], fd["rank"], fd["direction"], fd["kind"]) == \
        ("Functional.gelu.0.forward", 1, 1, "forward", "introduced")
    with open(fd["report"]) as fh:
        pair = json.load(fh)
    assert pair["npu_json_path"].endswith(os.path.join("kernel", "step1", "rank1", "dump.json"))
    assert [_cell(s, 0, r)["verdict"] for r in (0, 1)] == ["clean", "clean"]
    assert _cell(s, 1, 1)["verdict"] == "introduces"
    assert _cell(s, 1, 0)["verdict"] == "inherits"        # error came through the all_reduce
    assert all(_cell(s, 2, r)["verdict"] != "introduces" for r in (0, 1))
    # the log gives the answer, first what to open: the run's page; stdout lists the files,
    # the run workbook among them
    first = said.splitlines()[0]
    assert first.startswith("[probe compare] open ") and os.path.join(out, "compare_run.html") in first, first
    # the folder's compare_report.html is the run's page, not the last pair's
    with open(os.path.join(out, "compare_run.html"), encoding="utf-8") as a, \
            open(os.path.join(out, "compare_report.html"), encoding="utf-8") as b:
        assert a.read() == b.read()
    assert "[probe compare] first divergence: Functional.gelu.0.forward (forward) at step 1, rank 1" in said
    assert "first divergence" not in stdout
    files = stdout.split()
    assert any(os.path.basename(p).startswith("compare_run_") for p in files)
    assert all(os.path.isfile(p) for p in files)
    from openpyxl import load_workbook
    wb = load_workbook(next(p for p in files if "compare_run_" in p), read_only=True)
    assert wb.sheetnames == ["Run", "Pairs", "Grid"]
    grid = list(wb["Grid"].iter_rows(values_only=True))
    assert grid[0] == ("Step", "rank0", "rank1") and grid[2] == (1, "inherits", "introduces")


def test_collective_fault_on_one_rank_names_the_collective(runs, tmp_path):
    if not _collective_results_recorded(runs):
        pytest.skip("this probe does not record collectives' results yet")
    from probe.compare import compare_run
    run = compare_run(os.path.join(runs, "collective"), os.path.join(runs, "bench"),
                      str(tmp_path / "o"), processes=2)
    fd = run.summary["first_divergence"]
    assert fd["name"].startswith("Distributed.all_reduce.") and fd["kind"] == "introduced"
    assert (fd["step"], fd["rank"]) == (1, 1)
    assert "while no other rank diverged before it" in fd["reason"]
    assert _cell(run.summary, 1, 0)["verdict"] == "clean"


def test_clean_rerun_names_nothing_and_bench2_pairs_by_step_and_rank(runs, tmp_path, capsys, caplog):
    from probe.compare import compare_run
    run = compare_run(os.path.join(runs, "bench2"), os.path.join(runs, "bench"), str(tmp_path / "o"),
                      processes=2)
    assert run.summary["first_divergence"] is None
    assert {c["verdict"] for c in run.summary["grid"]} == {"clean"} and len(run.summary["grid"]) == 6
    rc, _, said = _cli(["compare", "--npu", os.path.join(runs, "kernel"), "--bench",
                        os.path.join(runs, "bench"), "--bench2", os.path.join(runs, "bench2"),
                        "-o", str(tmp_path / "o2"), "--processes", "1"], capsys, caplog)
    assert rc == 0 and "first divergence: Functional.gelu.0.forward" in said
    with open(tmp_path / "o2" / "compare_summary.json") as fh:
        fd = json.load(fh)["first_divergence"]
    with open(fd["report"]) as fh:
        pair = json.load(fh)
    assert pair["bench2_json_path"].endswith(os.path.join("bench2", "step1", "rank1", "dump.json"))


def test_unpaired_rank_and_missing_step_are_named_not_fatal(runs, tmp_path, capsys, caplog):
    npu, bench = str(tmp_path / "npu"), str(tmp_path / "bench")
    shutil.copytree(os.path.join(runs, "kernel"), npu)
    shutil.copytree(os.path.join(runs, "bench"), bench)
    shutil.rmtree(os.path.join(bench, "step2"))                 # the bench stopped a step early
    shutil.rmtree(os.path.join(npu, "step0", "rank1"))          # one rank's dump is gone
    cfg = tmp_path / "compare.json"          # msprobe's -i form, with two roots
    cfg.write_text(json.dumps({"npu_path": npu, "bench_path": bench}))
    rc, _, said = _cli(["compare", "-i", str(cfg), "-o", str(tmp_path / "o"), "--processes", "1"], capsys, caplog)
    assert rc == 0
    with open(tmp_path / "o" / "compare_summary.json") as fh:
        s = json.load(fh)
    assert {(u["side"], u["step"], u["rank"]) for u in s["unpaired"]} == \
        {("bench", 0, 1), ("npu", 2, 0), ("npu", 2, 1)}
    assert [_cell(s, st, r)["verdict"] for st, r in ((0, 1), (2, 0), (2, 1))] == ["missing"] * 3
    assert s["first_divergence"]["name"] == "Functional.gelu.0.forward"
    assert "only the bench side has step0/rank1" in said and "only the NPU side has step2/rank1" in said
    assert "first divergence: Functional.gelu.0.forward (forward) at step 1, rank 1" in said


def test_a_plain_script_without_main_guard_runs_the_pool_once(runs, tmp_path):
    """Spawned workers import probe only: the user's script is not run again in them."""
    script = tmp_path / "user_script.py"
    out = tmp_path / "o"
    script.write_text(
        "print('USER SCRIPT RUNS', flush=True)\n"
        "from probe import compare_distributed\n"
        f"paths = compare_distributed({os.path.join(runs, 'kernel')!r}, {os.path.join(runs, 'bench')!r}, "
        f"{str(out)!r}, processes=2)\n"
        "print('PATHS', len(paths))\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=rank_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("USER SCRIPT RUNS") == 1
    assert "PATHS 26" in proc.stdout   # 6 pairs x (xlsx, csv, page, json) + the run workbook and page
    assert "first divergence: Functional.gelu.0.forward" in proc.stderr
    with open(out / "compare_summary.json") as fh:
        assert json.load(fh)["first_divergence"]["rank"] == 1


def test_dask_cluster_and_parquet_dataset(runs, tmp_path, capsys, caplog):
    pytest.importorskip("distributed")
    pd = pytest.importorskip("pandas")
    # ImportError too: a pyarrow built for NumPy 2 refuses to import under NumPy 1 (the torch 2.1 runs)
    pytest.importorskip("pyarrow", exc_type=ImportError)
    from distributed import LocalCluster
    out = tmp_path / "o"
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                      host="127.0.0.1") as cluster:
        rc, _, said = _cli(["compare", "--npu", os.path.join(runs, "kernel"), "--bench",
                            os.path.join(runs, "bench"), "-o", str(out), "--scheduler",
                            cluster.scheduler_address], capsys, caplog)
    assert rc == 0 and "first divergence: Functional.gelu.0.forward (forward) at step 1, rank 1" in said
    table = pd.read_parquet(out / "diagnosis.parquet")
    assert len(table.groupby(["step", "rank"], observed=True)) == 6
    hit = table[(table.status == "introduces") & (table.npu_entry == "Functional.gelu.0.forward")]
    assert {(int(s), int(r)) for s, r in zip(hit["step"], hit["rank"])} == {(1, 1)}
    # the epoch of each call: collectives passed before it (gradients all_reduced after backward)
    one = table[(table["step"].astype(int) == 1) & (table["rank"].astype(int) == 1)].sort_values("index")
    coll = one[one.npu_entry.str.startswith("Distributed.all_reduce.")]
    assert list(coll.epoch) == list(range(len(coll))) and len(coll) > 1
    assert one[one.npu_entry == "Functional.gelu.0.forward"].epoch.item() == 0


def test_check_ranks_finds_the_rank_with_a_bad_collective_result(runs, capsys, caplog):
    if not _collective_results_recorded(runs):
        pytest.skip("this probe does not record collectives' results yet")
    from probe import check_ranks
    clean = check_ranks(os.path.join(runs, "bench"))
    assert clean.checked > 0 and clean.mismatches == []
    bad = check_ranks(os.path.join(runs, "collective"))
    assert bad.bad_ranks == [1] and bad.first.step == 1
    assert bad.first.name.startswith("Distributed.all_reduce.")
    rc, stdout, _ = _cli(["check-ranks", os.path.join(runs, "collective")], capsys, caplog)
    assert rc == 1 and "first: step 1, rank(s) 1 at Distributed.all_reduce." in stdout


def test_lamport_order_over_collectives():
    """Which rank's divergence is reached by which: through a collective passed after it."""
    from probe.compare.causality import Mark, Timeline, first_of_run, judge_step
    coll = [("Distributed.all_reduce.0.forward", "clean", 0.0, 0.0, 1e-4),
            ("Distributed.all_reduce.1.forward", "clean", 0.0, 0.0, 1e-4)]

    def tl(name, kind, epoch, collective, position):
        return Timeline(Mark(name, "forward", kind, position, epoch, collective), coll)
    # rank 1's kernel before collective #0; rank 0's collective #0 result differs: inherited
    cells = judge_step({0: tl("Distributed.all_reduce.0.forward", "introduced", 0, True, 30),
                        1: tl("Functional.gelu.0.forward", "introduced", 0, False, 12),
                        2: Timeline(None, coll)})
    assert [cells[r].verdict for r in (0, 1, 2)] == ["inherits", "introduces", "clean"]
    assert cells[0].source == 1
    # the same collective differs on two ranks, nothing before it: each is its own culprit
    cells = judge_step({0: tl("Distributed.all_reduce.1.forward", "introduced", 1, True, 40),
                        1: tl("Distributed.all_reduce.1.forward", "introduced", 1, True, 40)})
    assert [c.verdict for c in cells.values()] == ["introduces", "introduces"]
    # a call after collective #1 is reached by a call before it, not by one after it
    cells = judge_step({0: tl("Tensor.add.3.forward", "introduced", 2, False, 50),
                        1: tl("Tensor.mul.0.forward", "introduced", 1, False, 45)})
    assert (cells[0].verdict, cells[1].verdict) == ("inherits", "introduces")
    cells = judge_step({0: tl("Tensor.add.3.forward", "introduced", 1, False, 50),
                        1: tl("Tensor.mul.0.forward", "introduced", 1, False, 45)})
    assert (cells[0].verdict, cells[1].verdict) == ("introduces", "introduces")
    # across steps the earliest step with an introduction wins, inputs_differ only failing one
    at = {(0, 0): judge_step({0: tl("Tensor.add.0.forward", "inputs_differ", 0, False, 3)})[0],
          (2, 1): judge_step({1: tl("Tensor.mul.0.forward", "introduced", 1, False, 45)})[1],
          (1, 0): judge_step({0: tl("Tensor.add.1.forward", "introduced", 3, False, 9)})[0]}
    assert first_of_run(at)[0] == (1, 0)


def test_calls_not_judged_keep_a_step_from_clean():
    """A pair with no divergence: "can't tell" calls judged from the numbers make the cell
    cant_tell; calls whose outputs a merge could not give leave it clean only where the
    calls compared after them agree (a later call that differs, or none: cant_tell)."""
    from probe.compare.causality import Timeline, Unsure, judge_step
    numbers = Unsure(2, "Torch.addmm.3.forward", "its output statistics differ by 0.05", 40)
    merged = Unsure(1, "Functional.mse_loss.0.forward", "Functional.mse_loss.0.forward.output.0 can't be merged "
                    "across ranks: a Partial(avg) tensor", 12)
    cells = judge_step({0: Timeline(None, cant_tell=numbers),
                        1: Timeline(None, unmerged=merged, agree_after=30),
                        2: Timeline(None, unmerged=merged, agree_after=30, differ_after="Tensor.add_.0.forward"),
                        3: Timeline(None, unmerged=merged),
                        4: Timeline(None, cant_tell=numbers, unmerged=merged, agree_after=30),
                        5: Timeline(None)})
    assert [cells[r].verdict for r in range(6)] == ["cant_tell", "clean", "cant_tell", "cant_tell", "cant_tell",
                                                    "clean"]
    assert cells[0].reason == ("2 calls can't be told from statistics, first Torch.addmm.3.forward: its output "
                               "statistics differ by 0.05; dump tensors to judge them")
    said = ("1 call can't be judged (its output can't be merged across ranks), first Functional.mse_loss.0.forward."
            "output.0 can't be merged across ranks: a Partial(avg) tensor; ")
    assert cells[1].reason == said + "the 30 calls compared after it agree with the bench"
    assert cells[2].reason == said + "a call compared after it differs (Tensor.add_.0.forward); dump tensors to judge it"
    assert cells[3].reason == said + "no call compared after it checks it; dump tensors to judge it"
    assert cells[4].reason.startswith("2 calls can't be told") and cells[4].reason.endswith("judge them")
    assert cells[5].reason == ""
    # a step that could not be compared says why first, then what its compared calls could not tell
    gap = "the NPU dump stops at entry 120 of 400 (incomplete_dump)"
    cells = judge_step({0: Timeline(None, not_judged=gap, cant_tell=numbers), 1: Timeline(None, not_judged=gap)})
    assert (cells[0].verdict, cells[1].verdict) == ("not_compared", "not_compared")
    assert cells[0].reason == (gap + "; 2 calls can't be told from statistics, first Torch.addmm.3.forward: its "
                               "output statistics differ by 0.05; dump tensors to judge them")
    assert cells[1].reason == gap
