"""probe's torch_npu and "npu" code paths, run against the stand-in of tests/npu_standin.py
(torch_npu is absent here): the registry's torch_npu section resolved, patched, dumped and
unpatched (a dotted ``atb.`` name included); run-ut, OpCapture + replay and repro scripts of
NPU.* entries; torch.npu.synchronize / Event for device npu; seed_all seeding the NPU;
``--device npu`` importing torch_npu before it checks for a device.

Where the CPU build of torch cannot take a tensor to "npu", the device paths are checked
through what decides them (the device kind, ``torch.npu.is_available()``, the import of
torch_npu), as npu_standin.py's docstring says.
"""
import argparse
import importlib.util
import os
import random
import runpy
import sys

import numpy as np
import pytest
import torch
from conftest import assert_summary, load_dump, needs_pt_loads
from npu_standin import PROVIDED, StandIn

from probe.cli import main as cli_main
from probe.hook_module.registry import load_registry, resolve
from probe.precheck import entries as precheck_entries
from probe.precheck import run_ut
from probe.repro import generate
from probe.seed import seed_all
from probe.toolbox import OpCapture, OpTimeMeasure, replay_cli, timing
from probe.toolbox import base as toolbox_base

TORCH_NPU_INSTALLED = importlib.util.find_spec("torch_npu") is not None


def _fresh_caches(monkeypatch):
    """probe's process-wide caches of resolved APIs start empty and are put back after the
    test: none may keep the stand-in's functions, nor hide them behind an earlier lookup."""
    monkeypatch.setattr(toolbox_base, "_RESOLVED", {})
    monkeypatch.setattr(precheck_entries, "_cache", {})


@pytest.fixture
def npu(monkeypatch):
    """The stand-in as after ``import torch_npu``; sys.modules and torch.npu restored after."""
    _fresh_caches(monkeypatch)
    return StandIn().install(monkeypatch)


@pytest.fixture
def npu_not_imported(monkeypatch):
    """The stand-in installed but not imported: torch has no ``npu`` until something
    imports torch_npu (what a ``probe`` command run from a shell meets)."""
    _fresh_caches(monkeypatch)
    return StandIn().make_importable(monkeypatch)


@pytest.fixture
def no_torch_npu(monkeypatch):
    if TORCH_NPU_INSTALLED:
        pytest.skip("torch_npu is installed")
    monkeypatch.delattr(torch, "npu", raising=False)


class NpuDevice:
    """What ``tensor.device`` is for an NPU tensor, as far as probe's timing reads it."""
    type = "npu"

    def __str__(self):
        return "npu:0"


def _inputs():
    torch.manual_seed(0)
    return {"x": torch.randn(4, 8, requires_grad=True), "gamma": torch.randn(8, requires_grad=True),
            **{k: torch.randn(2, 3, 4, requires_grad=True) for k in "qkv"}}


def _npu_calls(npu, t):
    """Calls of three stand-in APIs (a tuple output, a keyword, a dotted atb name) on the
    tensors ``t`` and their backward; the outputs are added to ``t``."""
    t["y"] = npu.torch_npu.npu_fast_gelu(t["x"])
    t["out"], t["rstd"] = npu.torch_npu.npu_rms_norm(t["y"], t["gamma"])
    t["att"] = npu.atb._npu_flash_attention_v2(t["q"], t["k"], t["v"], scale=0.5)
    npu.torch_npu.get_npu_format(t["x"])             # not in the registry
    (t["out"].sum() + t["att"].sum()).backward()
    return t


# ---- registry ----------------------------------------------------------------------------
def test_registry_patches_the_torch_npu_names_present_and_lists_the_rest_absent(npu):
    reg = resolve(load_registry())
    patched = {full: (owner, attr) for owner, attr, full in reg.patched if full.startswith("NPU.")}
    assert patched == {f"NPU.{name}": (npu.atb if name.startswith("atb.") else npu.torch_npu,
                                       name.rpartition(".")[2]) for name in PROVIDED}
    listed = load_registry().ops["torch_npu"]
    assert {a for a in reg.absent if a.startswith("torch_npu.")} == \
        {f"torch_npu.{n}" for n in listed if n not in PROVIDED}
    assert not [n for n in reg.by_func.values() if n and n.startswith("NPU.")]   # patched, not mode-seen


def test_npu_calls_are_dumped_once_with_inputs_outputs_and_grads(npu, make_debugger, dump_dir):
    dbg = make_debugger(task="statistics")
    t = _inputs()
    dbg.start()
    _npu_calls(npu, t)
    dbg.stop()
    npu.torch_npu.npu_fast_gelu(t["x"])       # between steps: patched, passed straight through
    dbg.step()
    data = load_dump(dump_dir)
    npu_entries = sorted(n for n in data if n.startswith("NPU."))
    assert npu_entries == sorted(f"NPU.{api}.0.{phase}" for phase in ("forward", "backward")
                                 for api in ("npu_fast_gelu", "npu_rms_norm", "atb._npu_flash_attention_v2"))
    # the APIs' own torch ops (sigmoid, rsqrt, matmul, softmax) ran inside: not recorded
    assert {n.rsplit(".", 2)[0] for n in data if not n.startswith("NPU.")} == {"Tensor.sum", "Tensor.__add__"}

    gelu = data["NPU.npu_fast_gelu.0.forward"]
    assert_summary(gelu["input_args"][0], t["x"])
    assert_summary(gelu["output"][0], t["y"])
    rms = data["NPU.npu_rms_norm.0.forward"]
    assert_summary(rms["input_args"][1], t["gamma"])
    assert_summary(rms["output"][0], t["out"])
    assert_summary(rms["output"][1], t["rstd"])
    att = data["NPU.atb._npu_flash_attention_v2.0.forward"]
    assert att["input_kwargs"] == {"scale": {"type": "float", "value": 0.5}}
    assert_summary(att["output"][0], t["att"])
    # backward: output = grads w.r.t. the inputs in argument order
    assert_summary(data["NPU.npu_fast_gelu.0.backward"]["output"][0], t["x"].grad)
    assert_summary(data["NPU.npu_rms_norm.0.backward"]["output"][1], t["gamma"].grad)
    assert_summary(data["NPU.atb._npu_flash_attention_v2.0.backward"]["output"][0], t["q"].grad)

    for name in PROVIDED:                       # still patched between steps ...
        assert npu.lookup(name) is not npu.originals[name]
        assert npu.lookup(name).__probe_original__ is npu.originals[name]
    dbg.close()
    for name in PROVIDED:                       # ... and gone at close()
        assert npu.lookup(name) is npu.originals[name], name
    assert npu.torch_npu.get_npu_format is not None and not hasattr(npu.torch_npu.get_npu_format,
                                                                    "__probe_original__")


def test_debugger_imports_torch_npu_to_resolve_its_section(npu_not_imported, make_debugger, dump_dir):
    assert not hasattr(torch, "npu")
    dbg = make_debugger()
    assert torch.npu is npu_not_imported.npu and sys.modules["torch_npu"] is npu_not_imported.torch_npu
    x = torch.ones(3)
    dbg.start()
    npu_not_imported.torch_npu.fast_gelu(x)
    dbg.stop()
    dbg.step()
    assert list(load_dump(dump_dir)) == ["NPU.fast_gelu.0.forward"]


# ---- pre-check, toolbox replay, repro of NPU.* entries -----------------------------------
@pytest.fixture
def npu_tensor_dump(npu, make_debugger, dump_dir):
    dbg = make_debugger(task="tensor")
    t = _inputs()
    dbg.start()
    _npu_calls(npu, t)
    dbg.stop()
    dbg.step()
    dbg.close()
    return os.path.join(dump_dir, "step0", "rank")


def test_run_ut_replays_npu_entries_from_torch_npu(npu, npu_tensor_dump, tmp_path):
    result = run_ut(npu_tensor_dump, out_dir=str(tmp_path / "ut"), device="cpu", progress=False)
    status = {a.name: (a.forward, a.backward, a.message) for a in result.apis if a.name.startswith("NPU.")}
    assert status == {f"NPU.{api}.0": ("pass", "pass", "")
                      for api in ("npu_fast_gelu", "npu_rms_norm", "atb._npu_flash_attention_v2")}


def _empty_dump(folder):
    path = folder / "dump.json"
    path.write_text('{"task": "tensor", "level": "L1", "data": {}}')
    return str(path)


def test_run_ut_device_npu_imports_torch_npu_to_check_the_device(npu_not_imported, tmp_path):
    npu_not_imported.available = False
    with pytest.raises(ValueError, match="^--device npu: no NPU available$"):
        run_ut(_empty_dump(tmp_path), out_dir=str(tmp_path / "ut"), device="npu", progress=False)
    assert torch.npu is npu_not_imported.npu        # imported to ask it
    npu_not_imported.available = True
    result = run_ut(_empty_dump(tmp_path), out_dir=str(tmp_path / "ut"), device="npu", progress=False)
    assert result.apis == []


def test_run_ut_device_npu_without_torch_npu_is_one_line(no_torch_npu, tmp_path, capsys):
    assert cli_main(["run-ut", "-i", _empty_dump(tmp_path), "-o", str(tmp_path), "--device", "npu:1"]) == 2
    assert capsys.readouterr().err.strip() == "probe run-ut: error: --device npu:1: torch_npu is not installed"


def _replay(argv):
    parser = argparse.ArgumentParser()
    replay_cli.add_arguments(parser)
    return replay_cli.run(parser.parse_args(argv))


@needs_pt_loads
def test_capture_and_replay_of_an_npu_api_by_its_torch_npu_name(npu, tmp_path, capsys):
    x, gamma = torch.randn(4, 8), torch.randn(8)
    with OpCapture(ops=[r"^torch_npu\.npu_rms_norm$"], output_dir=str(tmp_path), verbose=False) as cap:
        npu.torch_npu.npu_rms_norm(x, gamma)
        npu.torch_npu.npu_fast_gelu(x)
    assert [os.path.relpath(p, tmp_path) for p in cap.saved] == [os.path.join("NPU.npu_rms_norm", "0")]
    assert _replay([str(tmp_path), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "NPU.npu_rms_norm.0" in out and "output.1 vs saved: pass max_abs=0 " in out


def test_replay_device_npu_imports_torch_npu_before_checking(npu_not_imported, tmp_path):
    # the device check passes once torch_npu is imported: the next complaint is the empty folder
    with pytest.raises(ValueError, match="no captured calls"):
        _replay([str(tmp_path), "--device", "npu"])
    assert torch.npu is npu_not_imported.npu
    npu_not_imported.available = False
    with pytest.raises(ValueError, match="^--device npu:0: no NPU available$"):
        _replay([str(tmp_path), "--device", "npu:0"])


def test_replay_device_npu_without_torch_npu(no_torch_npu, tmp_path, capsys):
    assert cli_main(["replay", str(tmp_path), "--device", "npu"]) == 2
    assert capsys.readouterr().err.strip() == "probe replay: error: --device npu: torch_npu is not installed"


@pytest.mark.parametrize("api", ["NPU.npu_rms_norm.0.backward", "NPU.atb._npu_flash_attention_v2.0.forward"])
def test_repro_script_of_an_npu_entry_imports_and_runs_torch_npu(npu, npu_tensor_dump, tmp_path, monkeypatch,
                                                                  capsys, api):
    script = generate(npu_tensor_dump, api, output=str(tmp_path / "r.py"))
    text = open(script).read()
    assert "\nimport torch_npu" in text and f"return torch_npu.{api.split('.', 1)[1].rsplit('.', 2)[0]}\n" in text
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(script, run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    vs_dump = [line for line in out.splitlines() if line.strip().startswith("vs dump") and "cosine" in line]
    assert vs_dump and all("max_abs 0 " in line for line in vs_dump), out


def test_repro_for_device_npu_n_imports_torch_npu(npu, npu_tensor_dump, tmp_path):
    text = open(generate(npu_tensor_dump, "Tensor.sum.0.forward", device="npu:0",
                         output=str(tmp_path / "r.py"))).read()
    assert "\nimport torch_npu" in text


# ---- device paths: synchronize, events, seeds ---------------------------------------------
@pytest.mark.parametrize("device", ["npu", "npu:0", NpuDevice()])
def test_synchronize_on_npu_calls_torch_npu(npu, device):
    toolbox_base.synchronize(device)
    assert npu.synchronized == [device]
    toolbox_base.synchronize("cpu")
    npu.available = False
    toolbox_base.synchronize(device)
    assert npu.synchronized == [device]


def test_timing_on_npu_reads_npu_events_at_stop(npu, monkeypatch, tmp_path):
    device = NpuDevice()
    monkeypatch.setattr(toolbox_base, "call_device", lambda args, kwargs: device)
    x = torch.randn(64, 64)
    with OpTimeMeasure(ops=[r"^torch_npu\.npu_fast_gelu$"], output_dir=str(tmp_path), warmup=0,
                       verbose=False) as tm:
        for _ in range(3):
            npu.torch_npu.npu_fast_gelu(x)
            torch.relu(x)
        assert all(not e.synchronized for e in npu.events)   # nothing waits per call
    assert [(r["name"], r["device"]) for r in tm.rows] == [("NPU.npu_fast_gelu", "npu:0")] * 3
    assert len(npu.events) == 6 and all(e.enable_timing and e.recorded_at is not None for e in npu.events)
    assert [e.synchronized for e in npu.events] == [False, True] * 3          # each end read once
    assert [r["forward_ms"] for r in tm.rows] == [
        (end.recorded_at - start.recorded_at) * 1e3 for start, end in zip(npu.events[::2], npu.events[1::2])]
    assert npu.synchronized == []


def test_timing_on_npu_with_sync_synchronizes_around_each_call(npu):
    clock = timing._Clock(NpuDevice(), sync=True)
    start, end = clock.mark(), clock.mark()
    assert isinstance(start, float) and timing._Clock.elapsed_ms(start, end) >= 0
    assert [str(d) for d in npu.synchronized] == ["npu:0", "npu:0"] and npu.events == []
    npu.available = False
    clock = timing._Clock(NpuDevice(), sync=False)   # no NPU: perf_counter, no events
    assert isinstance(clock.mark(), float) and npu.events == []


@pytest.fixture
def restore_rngs(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "")
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def test_seed_all_seeds_every_npu(npu, restore_rngs, make_debugger):
    seed_all(123)
    assert npu.seeds == [("manual_seed_all", 123)]
    make_debugger(seed=7)                      # a config seed goes through seed_all
    assert npu.seeds[-1] == ("manual_seed_all", 7)
