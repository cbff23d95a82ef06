"""Crash safety and file I/O of the dump (issue #2, item 8)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest
import torch
from conftest import HERE, load_dump
from models import make_mlp, train_step

import probe.dump.writer as writer_mod

CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {here!r})
    import probe.dump.writer as w
    w._FLUSH_SECONDS = 0
    from probe import PrecisionDebugger
    from models import make_mlp, train_step
    dbg = PrecisionDebugger(dump_path=sys.argv[1], task=sys.argv[2])
    model, x, y = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        dbg.start(); train_step(model, opt, x, y); dbg.stop(); dbg.step()
    dbg.start()
    print("STEP2", flush=True)
    while True:  # mid-step, busy, until killed
        train_step(model, opt, x, y)
""")


def _all_files_named(rank_dir, data):
    names = []

    def walk(v):
        if isinstance(v, dict):
            if "data_name" in v:
                names.append(v["data_name"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(data)
    return names


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_killed_mid_step_leaves_valid_files(dump_dir, tmp_path, task):
    """SIGKILL mid-step: earlier steps complete, the current dump.json valid JSON. With
    statistics a helper process encodes entries: it finishes what it got, then exits."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(here=HERE))
    proc = subprocess.Popen([sys.executable, str(script), dump_dir, task], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "STEP2", proc.stderr.read()
        current = os.path.join(dump_dir, "step2", "rank", "dump.json")
        deadline = time.monotonic() + 20
        seen = 0
        while time.monotonic() < deadline and seen < 100:  # let it write a few flushes, then kill
            time.sleep(0.05)
            try:
                with open(current) as f:
                    seen = len(json.load(f)["data"])
            except (OSError, ValueError):
                pass
        assert seen >= 100, "the current step's entries never reached the disk"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    step2 = _settled(dump_dir, 2)          # valid JSON despite the kill
    assert len(step2) >= seen
    first = load_dump(dump_dir, 0)
    assert list(load_dump(dump_dir, 1)) == list(first)  # earlier steps complete
    assert any(n.endswith(".backward") for n in first) and any(n.startswith("Tensor.add_") for n in first)
    for step in (0, 1):
        rank_dir = os.path.join(dump_dir, f"step{step}", "rank")
        stack = load_dump(dump_dir, step, name="stack.json")
        assert {n for names, _ in stack.values() for n in names} == {n for n in first if n.endswith("forward")}
        for name in _all_files_named(rank_dir, load_dump(dump_dir, step)):
            np.load(os.path.join(rank_dir, "dump_tensor_data", name))


def _settled(dump_dir, step, timeout=10):
    """The step's dump once its size stops changing (a helper may still be writing)."""
    path = os.path.join(dump_dir, f"step{step}", "rank", "dump.json")
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        size = os.path.getsize(path)
        if size == last:
            break
        last = size
        time.sleep(0.2)
    return load_dump(dump_dir, step)


def test_files_are_complete_when_step_returns(make_debugger, dump_dir, monkeypatch):
    real = writer_mod._write_npy

    def slow_write(path, arr):  # a slow disk: the writer thread lags behind training
        time.sleep(0.002)
        real(path, arr)

    monkeypatch.setattr(writer_mod, "_write_npy", slow_write)
    model, x, y = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = make_debugger(task="tensor")
    dbg.start()
    train_step(model, opt, x, y)
    dbg.stop()
    dbg.step()
    rank_dir = os.path.join(dump_dir, "step0", "rank")
    data = load_dump(dump_dir)
    names = _all_files_named(rank_dir, data)
    assert len(names) > 50
    assert sorted(names) == sorted(os.listdir(os.path.join(rank_dir, "dump_tensor_data")))
    for name in names:
        np.load(os.path.join(rank_dir, "dump_tensor_data", name))
    assert load_dump(dump_dir, name="stack.json")


def test_tensor_queue_is_bounded(make_debugger, dump_dir, monkeypatch):
    limit = 4096
    monkeypatch.setattr(writer_mod, "_MAX_PENDING_BYTES", limit)
    peak = []
    dbg = make_debugger(task="tensor")
    real = writer_mod._write_npy

    def slow_write(path, arr):
        peak.append(dbg._writer._bytes)
        time.sleep(0.001)
        real(path, arr)

    monkeypatch.setattr(writer_mod, "_write_npy", slow_write)
    x = torch.randn(8, 8)  # 256 bytes per tensor file
    dbg.start()
    for _ in range(100):
        torch.exp(x)
    dbg.stop()
    dbg.step()
    assert len(peak) == 200 and max(peak) <= limit
    assert len(os.listdir(os.path.join(dump_dir, "step0", "rank", "dump_tensor_data"))) == 200


def test_tensor_past_the_bound_is_copied_once_the_queue_is_empty(make_debugger, dump_dir, monkeypatch):
    """A tensor bigger than the queue's bound waits for the copies before it to reach the
    disk before its own host copy is made, and a written copy is freed at once (the writer
    thread held the last one until the next item came): dumping one 1 GiB call held two
    1 GiB copies beside its input and output (peak 4.4 GB), one is enough."""
    import probe.dump.stats as stats_mod
    monkeypatch.setattr(writer_mod, "_MAX_PENDING_BYTES", 4096)
    real_write, real_copy = writer_mod._write_npy, stats_mod.host_copy
    pending_at_copy = []

    def slow_write(path, arr):      # a slow disk: the writer thread lags behind training
        time.sleep(0.02)
        real_write(path, arr)

    def watched_copy(t):
        pending_at_copy.append(dbg._writer._bytes)
        copy = real_copy(t)
        copies.append(weakref.ref(copy))
        return copy

    monkeypatch.setattr(writer_mod, "_write_npy", slow_write)
    monkeypatch.setattr(stats_mod, "host_copy", watched_copy)
    dbg = make_debugger(task="tensor")
    x = torch.randn(64, 64)         # 16 KiB per tensor file, past the 4 KiB bound
    copies = []
    dbg.start()
    for _ in range(5):
        torch.exp(x)
    deadline = time.monotonic() + 10    # mid-step, every file written: no copy is held any more
    while any(c() is not None for c in copies) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(copies) == 10 and sum(c() is not None for c in copies) == 0
    dbg.stop()
    dbg.step()
    assert len(pending_at_copy) == 10 and set(pending_at_copy) == {0}, pending_at_copy
    assert len(os.listdir(os.path.join(dump_dir, "step0", "rank", "dump_tensor_data"))) == 10


def test_rerun_into_same_path_replaces_that_step(make_debugger, dump_dir):
    x = torch.randn(4)
    first = make_debugger(task="tensor")
    for _ in range(2):
        first.start()
        torch.exp(x)
        torch.sin(x)
        first.stop()
        first.step()
    first.close()
    second = make_debugger(task="statistics", step=[0])
    second.start()
    torch.cos(x)
    second.stop()
    second.step()
    second.close()
    assert list(load_dump(dump_dir, 0)) == ["Torch.cos.0.forward"]
    assert sorted(os.listdir(os.path.join(dump_dir, "step0", "rank"))) == ["construct.json", "dump.json", "stack.json"]
    assert list(load_dump(dump_dir, 1)) == ["Torch.exp.0.forward", "Torch.sin.0.forward"]  # untouched
    leftovers = [os.path.join(root, n) for root, dirs, files in os.walk(dump_dir) for n in dirs + files
                 if n.startswith(".")]
    assert leftovers == []
    assert sorted(os.listdir(dump_dir)) == ["step0", "step1"]


@pytest.mark.parametrize("array", [
    np.random.rand(3, 4).astype(np.float32), np.arange(6).reshape(2, 3).T, np.array(3.5),
    np.zeros((0, 3)), np.array([True, False]), np.arange(12).reshape(3, 4)[:, ::2].astype(np.float16)],
    ids=["f32", "transposed-int", "0d", "empty", "bool", "strided-f16"])
def test_tensor_file_writer_round_trips(tmp_path, array):
    """The writer's .npy files (header cached per dtype/shape) load back exactly with numpy."""
    from probe.dump.writer import _write_npy
    path = str(tmp_path / "t.npy")
    _write_npy(path, array)
    _write_npy(path, array)   # second time through the cached header
    back = np.load(path, allow_pickle=False)
    assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_does_not_write_into_the_parents_dump(make_debugger, dump_dir):
    """A DataLoader-style worker forked while dumping inherits the mode and the patches;
    its calls must stay out of the parent's dump.json."""
    x = torch.randn(4)
    dbg = make_debugger()
    dbg.start()
    x + 1
    pid = os.fork()
    if pid == 0:   # child: many calls, more than a flush's worth
        try:
            for _ in range(3000):
                x * 2
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    x - 1
    dbg.stop()
    dbg.step()
    assert list(load_dump(dump_dir)) == ["Tensor.__add__.0.forward", "Tensor.__sub__.0.forward"]
