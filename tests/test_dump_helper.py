"""Statistics entries encoded by a helper process (issue #2, items 8 and 9).

The helper only moves work off the training thread: dump.json must be byte-identical to
encoding in the training process, complete when ``step()`` returns, and training must go
on unharmed when the helper is killed or cannot take a value.
"""
import json
import logging
import os
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import load_dump
from models import make_convnet, make_gpt, train_step
from probe.dump import writer as writer_mod
from probe.dump.entry_process import EntryProcess


def _raw(dump_dir, step):
    with open(os.path.join(dump_dir, f"step{step}", "rank", "dump.json"), encoding="utf-8") as f:
        return f.read()


def _run(make_debugger, dump_path, make, steps=2, level="L1"):
    model, x, y = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = make_debugger(dump_path=dump_path, level=level)
    for _ in range(steps):
        dbg.start(model)
        train_step(model, opt, x, y)
        dbg.stop()
        dbg.step()
    return dbg


@pytest.mark.parametrize("make,level", [(make_convnet, "L1"), (make_gpt, "mix")])
def test_helper_writes_the_same_dump_as_the_training_process(make_debugger, tmp_path, monkeypatch, make, level):
    with_helper = str(tmp_path / "helper")
    dbg = _run(make_debugger, with_helper, make, level=level)
    helper = dbg._writer._helper
    assert isinstance(helper, EntryProcess) and helper._proc.poll() is None   # alive, in use
    dbg.close()
    assert helper._proc.poll() is not None                                     # gone with close()

    monkeypatch.setattr(writer_mod.DumpWriter, "use_helper_process", False)
    inline = str(tmp_path / "inline")
    dbg = _run(make_debugger, inline, make, level=level)
    assert dbg._writer._helper is None
    for step in (0, 1):
        text = _raw(with_helper, step)
        assert text == _raw(inline, step)
        assert len(json.loads(text)["data"]) > 20


def test_killed_helper_leaves_training_and_dump_whole(make_debugger, dump_dir, caplog):
    model, x, y = make_gpt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = make_debugger()
    dbg.start()
    train_step(model, opt, x, y)
    dbg.stop()
    dbg.step()
    helper = dbg._writer._helper
    dbg.start()
    logits = model(x)                       # forward entries, part of them handed over
    dbg._writer.sync()                      # (on disk: the kill below loses nothing)
    os.kill(helper.pid, signal.SIGKILL)
    helper._proc.wait()
    with caplog.at_level(logging.WARNING, logger="probe"):
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    assert dbg._writer._helper is False
    assert [r for r in caplog.records if "helper process failed" in r.getMessage()]
    assert list(load_dump(dump_dir, 1)) == list(load_dump(dump_dir, 0))   # every entry, in order


def test_numpy_scalar_arguments_are_plain_values_and_the_helper_stays(make_debugger, dump_dir):
    """marshal would turn a numpy float into bytes (buffer protocol): entries hold builtins."""
    x = torch.randn(4, 6)
    dbg = make_debugger()
    dbg.start()
    for i in range(40):                      # several hand-overs before and after the odd value
        torch.clamp(x, min=np.float64(-0.5)) if i == 20 else torch.relu(x)
    dbg.stop()
    dbg.step()
    helper = dbg._writer._helper
    assert isinstance(helper, EntryProcess) and helper._proc.poll() is None   # still in use
    data = load_dump(dump_dir)
    assert len(data) == 40
    assert data["Torch.clamp.0.forward"]["input_kwargs"]["min"] == {"type": "float64", "value": -0.5}


def test_a_batch_marshal_refuses_is_written_in_process_in_order(tmp_path):
    """A value json takes but marshal refuses: that batch is encoded here, after the
    helper's, and the helper continues with the right count."""
    class Weight(float):
        pass

    writer = writer_mod.DumpWriter("statistics", "L1")
    writer.open_dir(str(tmp_path / "step0" / "rank"), with_tensors=False)
    names = []
    for i in range(3 * writer_mod._HELPER_BATCH):
        names.append(f"Torch.relu.{i}.forward")
        writer.add_entry(names[-1], {"w": Weight(i) if i == writer_mod._HELPER_BATCH + 3 else float(i)})
    data = _sync_with_helper_alive_then_load(writer, tmp_path)
    assert list(data) == names
    assert [v["w"] for v in data.values()] == [float(i) for i in range(len(names))]


def _sync_with_helper_alive_then_load(writer, tmp_path):
    writer.sync()
    helper = writer._helper
    assert isinstance(helper, EntryProcess) and helper._proc.poll() is None   # still in use
    writer.close()
    return load_dump(str(tmp_path), 0)


def test_helper_cannot_start_so_the_training_process_encodes(make_debugger, dump_dir, monkeypatch):
    monkeypatch.setattr(EntryProcess, "start", classmethod(lambda cls: None))
    _run(make_debugger, dump_dir, make_gpt, steps=1)
    assert len(load_dump(dump_dir, 0)) > 20


def test_entries_pending_at_stop_are_appended_here_and_the_helper_continues(tmp_path):
    """stop() encodes what is still pending in this process while the helper finishes its
    batches, then appends it; the helper's next batch must land after it, with its comma."""
    writer = writer_mod.DumpWriter("statistics", "L1")
    writer.open_dir(str(tmp_path / "step0" / "rank"), with_tensors=False)
    names = []

    def add(n):
        for _ in range(n):
            names.append(f"Torch.relu.{len(names)}.forward")
            writer.add_entry(names[-1], {"i": len(names)})

    add(writer_mod._HELPER_BATCH + 3)          # one batch to the helper, three pending
    writer.write_meta("{}", {})                # what stop() does
    assert writer._pending == [] and writer._helper_files is None
    with open(tmp_path / "step0" / "rank" / "dump.json", encoding="utf-8") as f:
        assert len(json.load(f)["data"]) == len(names)     # on disk before step()
    add(2 * writer_mod._HELPER_BATCH + 1)      # the helper again, re-opened at the new count
    data = _sync_with_helper_alive_then_load(writer, tmp_path)
    assert list(data) == names
    assert [v["i"] for v in data.values()] == list(range(1, len(names) + 1))
