"""Never "clean" where probe could not tell (issue 44).

Each case is one a new user met: a LayerNorm fault after GEMMs summed in another order, a
bf16 MoE whose router softmax overflows to NaN after tokens routed differently, a dump with
empty or no ``data``, a step killed by SIGKILL, two unrelated models, and a whole-run grid
with a step that compared nothing. On real runs (``real_runs``, ``second_device``), in
tensor and statistics mode: the culprit is named, or the verdict, the console's first line
and compare_summary.json say what was not compared and why. The expected culprit comes
from the injected fault, never from probe's output.
"""
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from real_runs import KernelFault, compare_steps, dump_json, run
from second_device import Device

HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = ["tensor", "statistics"]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]   # conftest: one intra-op thread


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(kind, task, steps, bf16)`` -> a dump root of the bench side (the CPU, fp32
    unless ``bf16``), made once."""
    base = tmp_path_factory.mktemp("not_judged_runs")
    made = {}

    def get(kind, task, steps=2, bf16=False):
        key = (kind, task, steps, bf16)
        if key not in made:
            made[key] = run(kind, base / f"{kind}_{task}_{steps}_{bf16}", task, steps=steps, bf16=bf16)
        return made[key]
    return get


def _cli(argv, caplog):
    """compare's answer as the library logs it (INFO), one line each."""
    from probe.cli import main
    caplog.set_level(logging.INFO, logger="probe")
    caplog.clear()
    assert main(argv) == 0
    return [r.getMessage() for r in caplog.records if r.name == "probe.compare.entry_points"]


def _summary(out):
    with open(os.path.join(out, "compare_summary.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _top(summary, n=3):
    return summary["verdict"], [(x["npu_name"], x["reason"]) for x in summary["suspects"][:n]]


def _kinds(summary):
    return [g["kind"] for g in summary["judged"]["not_compared"]]


def _not_judged(summary, said, kind):
    """The verdict, the console's first line and the summary say the step was not judged, and why."""
    assert kind in _kinds(summary), (summary["judged"], summary["verdict"])
    assert summary["judged"]["complete"] is False
    assert summary["verdict"].startswith("not judged: "), summary["verdict"]
    assert "no API introduces error" not in summary["verdict"], summary["verdict"]
    assert said[0].startswith("[probe compare] not judged: "), said[:2]
    text = next(g["text"] for g in summary["judged"]["not_compared"] if g["kind"] == kind)
    assert text in said[0] and text in summary["verdict"]


# ------------------------------------------------------------------- culprits statistics missed

@pytest.mark.parametrize("task", TASKS)
def test_layer_norm_fault_after_reordered_gemms_is_named(runs, tmp_path, task):
    """GPT-2 in fp32 on a device whose matrix products sum in another order; at step 1 one
    LayerNorm takes its mean and variance in bf16 (~1e-3 off) while its input agrees to
    fp32's rounding. Statistics mode called it "can't tell" (any input difference, even
    rounding, let a normalizer off)."""
    fault = KernelFault("native_layer_norm.default", 3, 1, "bf16_stats")
    npu = run("gpt2", tmp_path / "npu", task, steps=2, fault=fault, device=Device(split_k=True))
    assert fault.applied
    fault.check_mapping(npu)
    expected = fault.expected()
    summary = compare_steps(npu, runs("gpt2", task), tmp_path / "out", [1])[0][1]
    assert summary["first_divergence"]["name"] == expected, (expected, *_top(summary))
    assert summary["verdict"].startswith(expected), summary["verdict"]
    assert summary["judged"]["complete"] is True
    culprit = summary["first_divergence"]["forward"]
    assert culprit["input_error"] < 1e-6 < 1e-4 < culprit["output_error"], culprit   # rounding in, a fault out


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("kind, op, nth", [("gpt2", "native_layer_norm.default", 3),
                                           ("conv", "native_batch_norm.default", 1),
                                           ("llama_rms", "rsqrt.default", 2)])
def test_normalizer_scale_in_a_bf16_run_is_named(runs, tmp_path, task, kind, op, nth):
    """GPT-2 (the conv net, Llama with F.rms_norm) in bf16 against fp32; at step 1 its 4th
    LayerNorm's (2nd BatchNorm's, 3rd RMSNorm's: its 1/RMS) output comes out 1.2x; step 0,
    the same bf16 run without a fault, names nothing. The LayerNorm's inputs' statistics
    differ by ~3% (its bias, 1e-3 in size after one AdamW step, moved by 3% of that), so a 0.2 output
    difference was no 10x jump: "inherits" in statistics mode; the BatchNorm's by 5e-3,
    and 0.2 was within 10x bf16's rounding times its amplification (~3): "can't tell".
    Normalized values have a fixed norm: the output Norm must be what the weight and bias
    give, within bf16's rounding."""
    fault = KernelFault(op, nth, 1, "scale", 1.2)
    npu = run(kind, tmp_path / "npu", task, steps=2, fault=fault, bf16=True)
    assert fault.applied
    fault.check_mapping(npu)
    expected = fault.expected()
    clean, summary = (s for _, s in compare_steps(npu, runs(kind, task), tmp_path / "out", [0, 1]))
    assert clean["first_divergence"]["name"] is None and clean["calls"]["introduces"] == 0, _top(clean)
    assert clean["verdict"].startswith("no API introduces error"), clean["verdict"]
    assert summary["first_divergence"]["name"] == expected, (expected, *_top(summary))
    assert summary["verdict"].startswith(expected), summary["verdict"]
    assert summary["judged"]["complete"] is True
    culprit = summary["first_divergence"]["forward"]
    if task == "statistics":       # what the case is about: inputs that differ beyond fp32's tolerance
        assert culprit["input_error"] > 1e-4, culprit["input_error"]
        said = re.search(r"its output's Norm is x([0-9.]+) the bench's", summary["verdict"])
        assert said and abs(float(said.group(1)) - 1.2) < 0.01, summary["verdict"]


@pytest.mark.parametrize("task", TASKS)
def test_nan_from_finite_inputs_is_named_after_routing_flips(runs, tmp_path, task):
    """A bf16 top-2 MoE (near-tie router, its own random stream, split-K) whose second router
    softmax overflows at step 1 (exp without max subtraction: inf / inf), so the loss is NaN.
    Its output is NaN on the NPU side only while its input is finite on both: named, though
    tokens were routed to other experts before it."""
    fault = KernelFault("_softmax.default", 1, 1, "overflow", 100.0)
    npu = run("moe", tmp_path / "npu", task, steps=2, fault=fault, bf16=True, device=Device(split_k=True, seed=7))
    assert fault.applied
    fault.check_mapping(npu)
    expected = fault.expected()
    summary = compare_steps(npu, runs("moe", task), tmp_path / "out", [1])[0][1]
    assert summary["first_divergence"]["name"] == expected, (expected, *_top(summary))
    assert summary["verdict"].startswith(expected), summary["verdict"]
    if task == "statistics":       # what the case is about: routes differ before the culprit
        assert any("different data-dependent paths" in n for n in summary["notes"]), summary["notes"]
        assert "NaN/Inf on the NPU side only" in summary["verdict"], summary["verdict"]


# ------------------------------------------------------------------- dumps with nothing to judge

def _rewrite(path, change):
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    change(doc)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


def _copy_step(root, step, dest):
    """dump.json (and its neighbours) of one step of a run, copied to ``dest``."""
    src = os.path.dirname(dump_json(root, step))
    shutil.copytree(src, dest)
    return os.path.join(dest, "dump.json")


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("how", ["empty", "no_data_key"])
def test_a_dump_without_entries_is_not_judged(runs, tmp_path, caplog, task, how):
    """A dump whose ``data`` is empty (a full disk) or missing was "no API introduces error"."""
    root = runs("gpt2", task)
    npu = _copy_step(root, 1, str(tmp_path / "npu"))
    _rewrite(npu, (lambda d: d.update(data={})) if how == "empty" else (lambda d: d.pop("data")))
    out = str(tmp_path / "out")
    said = _cli(["compare", "--npu", npu, "--bench", dump_json(root, 1), "-o", out], caplog)
    summary = _summary(out)
    _not_judged(summary, said, "empty_side")
    assert summary["first_divergence"]["name"] is None and summary["judged"]["compared"] == 0
    assert summary["dumps"]["npu"]["entries"] == 0 and summary["dumps"]["bench"]["entries"] > 0


_KILLED = textwrap.dedent('''
    """GPT-2 dumped for two steps; step 1 is killed (SIGKILL) in its second block's forward,
    a second after the first block's calls were flushed."""
    import os, signal, sys, time
    import torch
    torch.set_num_threads(1)
    from real_runs import gpt2, _batch, _loss
    from probe import PrecisionDebugger
    root, task = sys.argv[1], sys.argv[2]
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(1)
    dbg = PrecisionDebugger(dump_path=root, task=task, level="L1")
    block = model.transformer.h[1]
    for step in range(2):
        x, y = _batch("gpt2", g)
        if step == 1:
            # the pause lets the writer flush what came before (it flushes every second)
            block.register_forward_pre_hook(lambda m, a: time.sleep(1.2))
            block.register_forward_hook(lambda m, a, o: (time.sleep(1.2), os.kill(os.getpid(), signal.SIGKILL)))
        dbg.start()
        opt.zero_grad()
        _loss("gpt2", model, x, y).backward()
        opt.step()
        dbg.stop()
        dbg.step()
''')


@pytest.mark.parametrize("task", TASKS)
def test_a_step_killed_mid_way_is_reported_incomplete(runs, tmp_path, caplog, task):
    """SIGKILL mid-step: dump.json holds the entries flushed before, valid JSON, and is not
    marked complete; the compare says so first and compares what is there."""
    script = tmp_path / "killed.py"
    script.write_text(_KILLED)
    root = str(tmp_path / "npu")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script), root, task], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    with open(dump_json(root, 0), encoding="utf-8") as fh:
        assert json.load(fh)["complete"] is True          # the step that finished says so
    with open(dump_json(root, 1), encoding="utf-8") as fh:
        killed = json.load(fh)                            # valid JSON up to its last flush
    assert killed["complete"] is False and killed["data"]
    bench = runs("gpt2", task)
    out = str(tmp_path / "out")
    said = _cli(["compare", "--npu", dump_json(root, 1), "--bench", dump_json(bench, 1), "-o", out], caplog)
    summary = _summary(out)
    _not_judged(summary, said, "incomplete_dump")
    assert "the NPU dump is incomplete" in said[0]
    assert summary["dumps"]["npu"]["complete"] is False and summary["dumps"]["bench"]["complete"] is True
    assert summary["dumps"]["npu"]["entries"] == len(killed["data"])
    assert summary["judged"]["compared"] > 0                 # what is there was compared ...
    assert "unrelated_runs" not in _kinds(summary)            # ... and the bench's later calls are no mystery
    assert summary["first_divergence"]["name"] is None, _top(summary)


@pytest.mark.parametrize("task", TASKS)
def test_unrelated_models_are_not_judged(runs, tmp_path, caplog, task):
    """GPT-2 against the conv net: almost nothing pairs, and the verdict was clean."""
    out = str(tmp_path / "out")
    said = _cli(["compare", "--npu", dump_json(runs("gpt2", task), 0), "--bench", dump_json(runs("conv", task), 0),
                 "-o", out], caplog)
    summary = _summary(out)
    kind = "nothing_paired" if summary["judged"]["compared"] == 0 else "unrelated_runs"
    _not_judged(summary, said, kind)
    assert summary["judged"]["paired"] < summary["judged"]["npu_calls"] / 2


@pytest.mark.parametrize("task", TASKS)
def test_nan_no_call_can_be_blamed_for_is_not_judged(tmp_path, caplog, runs, task):
    """The MoE's overflowing softmax left out of the NPU dump (as a dump ``list`` without
    softmax leaves it): the NaN then first shows in calls whose inputs are already NaN, and
    no call can be blamed. Not "no API introduces error"."""
    fault = KernelFault("_softmax.default", 1, 1, "overflow", 100.0)
    npu = run("moe", tmp_path / "npu", task, steps=2, fault=fault, bf16=True, device=Device(split_k=True, seed=7))
    assert fault.applied
    path = dump_json(npu, 1)
    _rewrite(path, lambda d: d["data"].pop(fault.expected()))
    out = str(tmp_path / "out")
    said = _cli(["compare", "--npu", path, "--bench", dump_json(runs("moe", task), 1), "-o", out], caplog)
    summary = _summary(out)
    _not_judged(summary, said, "unexplained_nonfinite")
    assert summary["first_divergence"]["name"] is None, _top(summary)


# ------------------------------------------------------------------- the whole-run grid

@pytest.mark.parametrize("task", TASKS)
def test_run_grid_never_calls_a_step_with_nothing_compared_clean(runs, tmp_path, caplog, task):
    """A whole-run compare whose step 1 NPU dump has no entries (a full disk at that step):
    that cell is "not_compared" with its reason, never "clean"; the other steps are clean."""
    bench = runs("gpt2", task, steps=3)
    npu = str(tmp_path / "npu")
    shutil.copytree(bench, npu)
    _rewrite(dump_json(npu, 1), lambda d: d.update(data={}))
    out = str(tmp_path / "out")
    said = _cli(["compare", "--npu", npu, "--bench", bench, "-o", out], caplog)
    summary = _summary(out)
    cells = {c["step"]: c for c in summary["grid"]}
    assert [cells[s]["verdict"] for s in (0, 1, 2)] == ["clean", "not_compared", "clean"], summary["grid"]
    assert "the NPU dump has no entries" in cells[1]["reason"]
    assert cells[0]["reason"] is None and summary["first_divergence"] is None
    first = next(line for line in said if line.startswith("[probe compare] run: "))
    assert "not_compared 1" in first and "clean 2" in first, first
    assert any(line.startswith("[probe compare] not compared: step 1 rank 0: the NPU dump has no entries")
               for line in said), said


def test_run_grid_never_calls_a_step_with_a_call_statistics_cannot_judge_clean(runs, tmp_path, caplog):
    """Statistics mode, a run that declares truncated TF32, a matrix product 5% off at step 1
    whose inputs already differ: the pair names no culprit and says one call can't be told
    from statistics. The run's grid cell for step 1 is "cant_tell" with that call and why,
    never "clean": in compare_summary.json, on the console, in the run workbook and on the
    run's page; step 0 (no fault) stays clean, and the run's headline never says clean."""
    fault = KernelFault("addmm.default", 3, 1, "scale", 1.05)
    npu = run("gpt2", tmp_path / "npu", "statistics", steps=2, fault=fault, device=Device(tf32="truncate"))
    assert fault.applied
    out = str(tmp_path / "out")
    said = _cli(["compare", "--npu", npu, "--bench", runs("gpt2", "statistics"), "-o", out], caplog)
    summary = _summary(out)
    cells = {c["step"]: c for c in summary["grid"]}
    assert [cells[s]["verdict"] for s in (0, 1)] == ["clean", "cant_tell"], summary["grid"]
    assert cells[0]["reason"] is None and summary["first_divergence"] is None
    with open(cells[1]["report"], encoding="utf-8") as fh:
        pair = json.load(fh)
    n = pair["calls"]["can't tell"]
    assert n >= 1 and f"can't be told from statistics, first {fault.expected()}" in pair["verdict"], pair["verdict"]
    reason = cells[1]["reason"]
    assert reason.startswith(f"{n} call{'s' if n > 1 else ''} can't be told from statistics, first "
                             f"{fault.expected()}: its output statistics differ by "), reason
    assert reason.endswith(f"dump tensors to judge {'them' if n > 1 else 'it'}"), reason
    # the console: the counts, a headline that is not "none", the cell with its reason
    first = next(line for line in said if line.startswith("[probe compare] run: "))
    assert "cant_tell 1" in first and "clean 1" in first, first
    assert "[probe compare] first divergence: none found, but 1 of 2 pair(s) have calls statistics can't tell " \
           "(never \"clean\")" in said, said
    assert f"[probe compare] can't tell: step 1 rank 0: {reason}" in said, said
    # the run workbook: the Pairs row (yellow, with the reason), the Grid cell, the Run sheet
    import openpyxl
    book = openpyxl.load_workbook(next(os.path.join(out, f) for f in os.listdir(out)
                                       if f.startswith("compare_run_") and f.endswith(".xlsx")))
    pairs = {row[0].value: row for row in book["Pairs"].iter_rows(min_row=2)}
    assert [c.value for c in pairs[1][2:5]] == ["cant_tell", None, reason]
    assert pairs[1][2].fill.fgColor.rgb == "FFFFEB9C" and pairs[0][2].value == "clean"
    assert [[c.value for c in row] for row in book["Grid"].iter_rows(min_row=2)] == [[0, "clean"], [1, "cant_tell"]]
    run_items = {row[0].value: row[1].value for row in book["Run"].iter_rows(min_row=2)}
    assert run_items["first divergence"].startswith("none found, but 1 of 2 pair(s) have calls statistics can't tell")
    # the run's page: the cell says "can't tell" with the reason, the banner counts the pairs
    from headless_browser import headless_chromium, open_page
    browser = headless_chromium()
    try:
        from selenium.webdriver.common.by import By
        open_page(browser, os.path.join(out, "compare_run.html"))
        tds = browser.find_elements(By.CSS_SELECTOR, "#grid td")
        assert [td.get_attribute("class") for td in tds] == ["clean", "cant_tell"]
        link = tds[1].find_element(By.TAG_NAME, "a")
        assert link.text == "can't tell" and link.get_attribute("title") == reason
        assert browser.find_element(By.ID, "verdict").get_attribute("class") == "unsure"
        assert browser.find_element(By.ID, "culprit").text == \
            "Can't tell: 1 of 2 pair(s) have calls statistics can't judge"
        assert "not every pair could be judged" in browser.find_element(By.ID, "next").text
    finally:
        browser.quit()
