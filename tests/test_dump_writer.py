"""The writer's encoding and failure semantics (issue 22, point 3): entries encoded in the
training process with orjson, msprobe's bare NaN/Infinity kept; a full disk leaves training
untouched, one logged line, every dump.json valid JSON, and no folder for a step not run."""
import glob
import json
import logging
import os
import subprocess

import numpy as np
import pytest
import torch
from conftest import load_dump

from probe.dump.encode import encode_entries, encode_value


@pytest.mark.parametrize("value", [
    {"Max": float("nan"), "Min": float("-inf"), "Mean": float("inf"), "Norm": 1.5},
    {"a": [None, 1, "x", True, 2.5e-7], "b": {}},
    {1: "a non-str key"},
    {"big": 2 ** 70},
    {"output": [None, {"Max": 1.0, "Norm": 2.0}]},                     # a None gradient: null
    {"output": [None, {"Max": float("nan"), "Norm": float("inf")}]},   # ... next to NaN/Infinity
    {"input_args": [{"type": "float", "value": float("-inf")}, None]},
    {"input_args": [{"type": "slice", "value": [float("nan"), None, None]}]},
])
def test_encoded_value_parses_back_as_json_writes_it(value):
    text = encode_value(value).decode()
    assert json.loads(text) == json.loads(json.dumps(value))
    expected = json.dumps(value)
    assert ("NaN" in text, "Infinity" in text) == ("NaN" in expected, "Infinity" in expected)
    assert text.count("null") == expected.count("null")


def test_encoded_entries_are_one_a_line_and_append_to_a_data_object():
    entries = [("A.0.forward", {"v": 1.0}), ("B.0.forward", {"v": float("nan")})]
    first = encode_entries(0, entries[:1])
    rest = encode_entries(1, entries[1:])
    text = "{" + (first + rest).decode() + "\n}"
    data = json.loads(text)
    assert list(data) == ["A.0.forward", "B.0.forward"] and np.isnan(data["B.0.forward"]["v"])
    assert text.count("\n  ") == 2


def test_numpy_scalar_arguments_are_plain_values(make_debugger, dump_dir):
    x = torch.randn(4, 6)
    dbg = make_debugger()
    dbg.start()
    for i in range(40):
        torch.clamp(x, min=np.float64(-0.5)) if i == 20 else torch.relu(x)
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    assert len(data) == 40
    assert data["Torch.clamp.0.forward"]["input_kwargs"]["min"] == {"type": "float64", "value": -0.5}


def _gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=512, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, ids


def _train(model, ids, steps, dbg=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        if dbg is not None:
            dbg.start(model)
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
        if dbg is not None:
            dbg.stop()
            dbg.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 3 MB tmpfs here: {proc.stderr.decode().strip() or proc.returncode}")
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_full_disk_training_goes_on_and_every_dump_json_is_valid(make_debugger, tiny_disk, caplog):
    model, ids = _gpt2()
    want = _train(model, ids, 4)
    model, ids = _gpt2()
    dbg = make_debugger(dump_path=tiny_disk, task="tensor", level="L1")
    with caplog.at_level(logging.WARNING):
        got = _train(model, ids, 4, dbg)
        dbg.close()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    said = [r for r in caplog.records if "writing dump files failed" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    files = glob.glob(os.path.join(tiny_disk, "step*", "rank", "dump.json"))
    assert files   # at least the first step's file
    complete = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            complete.append(json.load(f)["complete"])
    assert False in complete, complete     # a step whose writes failed never says it finished
    assert sorted(os.listdir(tiny_disk)) == sorted(d for d in os.listdir(tiny_disk) if d in
                                                   ("step0", "step1", "step2", "step3"))
    assert not os.path.exists(os.path.join(tiny_disk, "step4"))
    leftovers = [p for p in glob.glob(os.path.join(tiny_disk, "*", ".*"))]
    assert not leftovers


def test_unwritable_folder_training_goes_on(make_debugger, tmp_path, caplog):
    target = tmp_path / "ro"
    target.mkdir()
    (target / "step0").write_text("a file where the step folder goes")
    model, ids = _gpt2()
    want = _train(model, ids, 2)
    model, ids = _gpt2()
    dbg = make_debugger(dump_path=str(target), task="statistics", level="L1")
    with caplog.at_level(logging.WARNING):
        got = _train(model, ids, 2, dbg)
        dbg.close()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len([r for r in caplog.records if "writing dump files failed" in r.getMessage()]) == 1
    json.loads((target / "step1" / "rank" / "dump.json").read_text())
