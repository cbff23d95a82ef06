"""Statistics entries encoded by a helper process (issue #2, items 8 and 9).

The helper only moves work off the training thread: dump.json must be byte-identical to
encoding in the training process, complete when ``step()`` returns, and training must go
on unharmed when the helper is killed or cannot take a value.
"""
import json
import logging
import os
import signal
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import load_dump
from models import make_convnet, make_gpt, make_mlp, train_step
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


def test_helper_writes_each_steps_stack_json_as_the_training_process(make_debugger, tmp_path, monkeypatch):
    """Steps that add stacks, drop some and bring one back: the helper's stack.json is the
    training process's, byte for byte, and names every entry of its step."""
    x = torch.randn(4, 6)

    def run(dump_path):
        dbg = make_debugger(dump_path=dump_path)
        for step in range(4):
            dbg.start()
            if step != 2:
                torch.relu(x)                      # every step but one
            if step >= 1:
                torch.exp(x), torch.sin(x)         # new at step 1
            if step == 3:
                torch.cos(x)                       # new at step 3, after a step without relu
            dbg.stop()
            dbg.step()
        return dbg

    for run_dir, helper in (("helper", True), ("inline", False)):   # one line: the same stacks
        monkeypatch.setattr(writer_mod.DumpWriter, "use_helper_process", helper)
        dbg = run(str(tmp_path / run_dir))
        assert isinstance(dbg._writer._helper, EntryProcess) == helper
        dbg.close()
    for step in range(4):
        texts = []
        for run_dir in ("helper", "inline"):
            with open(tmp_path / run_dir / f"step{step}" / "rank" / "stack.json", encoding="utf-8") as f:
                texts.append(f.read())
        assert texts[0] == texts[1]
        groups = json.loads(texts[0])
        assert sorted(n for names, _ in groups.values() for n in names) == sorted(load_dump(tmp_path / "helper", step))
    last = json.loads(texts[0])
    assert any(names == ["Torch.cos.0.forward"] and "torch.cos(x)" in frames[0] for names, frames in last.values())


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


def _meta(tmp_path):
    folder = tmp_path / "step0" / "rank"
    return [json.loads((folder / name).read_text(encoding="utf-8")) for name in ("stack.json", "construct.json")]


def test_stop_gives_the_helper_the_meta_files_and_encodes_the_last_entries_here(tmp_path):
    """stop() hands stack.json and construct.json to the helper and encodes the entries
    still pending here while it finishes: all of it is on disk when stop() returns, and the
    helper's next batch lands after those entries, with its comma."""
    writer = writer_mod.DumpWriter("statistics", "mix")
    writer.open_dir(str(tmp_path / "step0" / "rank"), with_tensors=False)
    names = []

    def add(n):
        for _ in range(n):
            names.append(f"Torch.relu.{len(names)}.forward")
            writer.add_entry(names[-1], {"i": len(names)})

    def stop():
        frames = ["File model.py, line 3, in forward, \n y = x.relu()"]
        writer.write_meta([(tuple(names), json.dumps(frames))], {n: "Module.net.Net.forward.0" for n in names})
        return {"0": [names[:], frames]}

    add(writer_mod._HELPER_BATCH + 3)          # one batch to the helper, three pending
    stack = stop()
    assert writer._pending == [] and writer._helper_files is None
    assert writer._meta_written.is_set()       # nothing for the writer thread to do
    assert len(load_dump(str(tmp_path), 0)) == len(names)        # on disk before step()
    assert _meta(tmp_path) == [stack, dict.fromkeys(names, "Module.net.Net.forward.0")]

    add(2 * writer_mod._HELPER_BATCH + 1)      # the helper again, re-opened at the new count
    stack = stop()
    data = _sync_with_helper_alive_then_load(writer, tmp_path)
    assert list(data) == names
    assert [v["i"] for v in data.values()] == list(range(1, len(names) + 1))
    assert _meta(tmp_path)[0] == stack


def test_a_step_like_the_last_leaves_only_the_tail_for_stop_to_encode(tmp_path):
    """The batch before a step's last _HELPER_TAIL entries goes to the helper early, when
    the step has as many entries as the one before: stop() then encodes only those. A step
    that differs is written whole and in order all the same."""
    writer = writer_mod.DumpWriter("statistics", "L1")
    batch, tail = writer_mod._HELPER_BATCH, writer_mod._HELPER_TAIL
    per_step = 2 * batch + tail + 5        # without the early batch, tail + 5 would be left
    pending_at_stop = []
    for step, n in enumerate((per_step, per_step, per_step + 7, per_step)):
        rank_dir = str(tmp_path / f"step{step}" / "rank")
        writer.open_dir(rank_dir, with_tensors=False)
        names = [f"Torch.relu.{i}.forward" for i in range(n)]
        for i, name in enumerate(names):
            writer.add_entry(name, {"i": i})
        pending_at_stop.append(len(writer._pending))
        writer.write_meta([], {})
        writer.sync()
        assert list(load_dump(str(tmp_path), step)) == names
    assert writer._helper                  # all of it through the helper
    writer.close()
    assert pending_at_stop == [tail + 5, tail, (tail + 7) % batch, per_step % batch]


def test_helper_dead_with_entries_unwritten_they_are_written_here(make_debugger, tmp_path, caplog, monkeypatch):
    """Entries handed to the helper that it never wrote (it was killed) are written by the
    training process once it finds the helper gone; stack.json and construct.json too."""
    def run(dump_path, kill):
        model, x, _ = make_mlp()
        dbg = make_debugger(dump_path=dump_path, level="mix")
        dbg.start(model)
        model(x)
        dbg._writer.sync()
        helper = dbg._writer._helper
        if kill:
            os.kill(helper.pid, signal.SIGSTOP)   # it reads nothing more...
        try:
            for _ in range(3):
                model(x)                          # (what is handed over fits the pipe's buffer)
            assert not kill or dbg._writer._sent  # handed over, not acknowledged
        finally:
            if kill:
                os.kill(helper.pid, signal.SIGKILL)   # ...and dies
                helper._proc.wait()
        dbg.stop()
        dbg.step()
        dbg.close()
        folder = os.path.join(dump_path, "step0", "rank")
        meta = [json.load(open(os.path.join(folder, n), encoding="utf-8")) for n in ("stack.json", "construct.json")]
        return load_dump(dump_path, 0), meta

    with caplog.at_level(logging.WARNING, logger="probe"):
        data, (stacks, construct) = run(str(tmp_path / "killed"), kill=True)
    assert [r for r in caplog.records if "helper process failed" in r.getMessage()]
    monkeypatch.setattr(writer_mod.DumpWriter, "use_helper_process", False)
    expected, (expected_stacks, expected_construct) = run(str(tmp_path / "inline"), kill=False)
    assert list(data) == list(expected) and len(data) > 2 * writer_mod._HELPER_BATCH
    assert construct == expected_construct
    assert [names for names, _ in stacks.values()] == [names for names, _ in expected_stacks.values()]


def test_helper_dying_while_stop_waits_for_it_loses_nothing(tmp_path):
    """stop() handed the meta files over and waits for the helper, which dies instead: the
    batch it never wrote, the pending entries and the meta files are all written here."""
    writer = writer_mod.DumpWriter("statistics", "mix")
    writer.open_dir(str(tmp_path / "step0" / "rank"), with_tensors=False)
    names = [f"Torch.relu.{i}.forward" for i in range(2 * writer_mod._HELPER_BATCH + 3)]
    for name in names[:writer_mod._HELPER_BATCH]:
        writer.add_entry(name, {"x": 1.5})
    writer.sync()
    helper = writer._helper
    os.kill(helper.pid, signal.SIGSTOP)        # it reads nothing more
    killer = threading.Timer(0.3, os.kill, (helper.pid, signal.SIGKILL))
    killer.start()
    try:
        for name in names[writer_mod._HELPER_BATCH:]:
            writer.add_entry(name, {"x": 1.5})
        frames = ["File model.py, line 3, in forward, \n y = x.relu()"]
        stack = {"0": [names, frames]}
        construct = dict.fromkeys(names, "Module.net.Net.forward.0")
        writer.write_meta([(tuple(names), json.dumps(frames))], construct)   # waits for the helper
    finally:
        killer.join()
        helper._proc.wait()
    writer.sync()
    assert writer._helper is False
    assert list(load_dump(str(tmp_path), 0)) == names
    assert _meta(tmp_path) == [stack, dict.fromkeys(names, "Module.net.Net.forward.0")]
    writer.close()
