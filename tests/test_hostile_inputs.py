"""A dump from someone else is untrusted input (issue 45): every reader, fed seeded
mutations of a real dump, answers one line (a DumpError / ConfigError in Python, exit 2
from the CLI) or reads it safely; never a traceback, a hang or a read outside the dump.

The dump is a real one: a tiny conv-free MLP (tests/fixtures/dump/tiny_model.py) trained one
step under the debugger with task "tensor", level "mix" (construct.json), plus a dropout
(draws.safetensors). Each test mutates a copy with a ``random.Random`` seeded per case:
truncation, wrong types, extreme numbers, deep nesting, bad encodings, hostile names
(``../``, absolute paths, symlinks out of the folder, FIFOs, directories).
"""
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from probe import cli
from probe.compare import tensors
from probe.compare.layout_file import load_layout_file
from probe.dump import draw_files
from probe.errors import ConfigError, DumpError

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fixtures", "dump"))
import tiny_model  # noqa: E402

DEEP = 20_000
RAW = "@@raw@@"        # a string in the document replaced by raw JSON text once serialised
fifo_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    """One real dumped step: its rank folder (dump.json, stack.json, construct.json, tensors, draws)."""
    from probe import PrecisionDebugger
    root = tmp_path_factory.mktemp("hostile") / "npu"
    model, x, y = tiny_model.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(task="tensor", level="mix", dump_path=str(root))
    try:
        dbg.start(model)
        tiny_model.train_step(model, opt, F.dropout(x, 0.5, training=True), y)
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    rank = root / "step0" / "rank"
    assert {"dump.json", "stack.json", "construct.json", draw_files.FILE} <= set(os.listdir(rank))
    return str(rank)


@pytest.fixture
def copy(dump, tmp_path):
    """A fresh copy of the dump's rank folder to mutate, and the untouched one as the bench."""
    def make(name="npu"):
        dst = str(tmp_path / name)
        shutil.copytree(dump, dst)
        return dst
    return make


def _serialise(doc, raw: str = "") -> bytes:
    return json.dumps(doc).replace(json.dumps(RAW), raw).encode()


def _leaves(x, out):
    """Every tensor/argument description (a dict with a "type") in a parsed dump."""
    if isinstance(x, dict):
        if isinstance(x.get("type"), str):
            out.append(x)
        for v in x.values():
            _leaves(v, out)
    elif isinstance(x, list):
        for v in x:
            _leaves(v, out)
    return out


def _tensor_leaves(doc):
    return [leaf for leaf in _leaves(doc["data"], []) if leaf.get("data_name")]


# ---------------------------------------------------------------- mutations of dump.json
# Each: (rng, document, text of the file) -> (bytes to write, who must refuse it): FILE, every
# reader of dump.json (compare, overflow, run-ut: exit 2); LEAF, the compare, which reads each
# description's fields (overflow and run-ut read what they need and skip what does not fit);
# None, reading it is allowed too (a truncated file is compared as far as it is complete, an
# infinite statistic is a statistic). Every reader: never a traceback.
FILE, LEAF = "file", "leaf"

def m_wrong_type(rng, doc, text):
    leaf = rng.choice(_tensor_leaves(doc))
    key = rng.choice(["shape", "dtype", "data_name", "md5"])
    leaf[key] = rng.choice([[1, [2]], {"a": 1}, 7, True] + (["abc"] if key == "shape" else [[1], ["x.npy"]]))
    return _serialise(doc), LEAF


def m_entry_type(rng, doc, text):
    name = rng.choice(sorted(doc["data"]))
    doc["data"][name] = rng.choice([5, "text", [1, 2], True])
    return _serialise(doc), FILE


def m_data_type(rng, doc, text):
    doc["data"] = rng.choice([[1], "data", 3])
    return _serialise(doc), FILE


def m_header_type(rng, doc, text):
    doc[rng.choice(["task", "level", "framework", "dump_data_dir"])] = rng.choice([[1], {"a": 1}, 5])
    return _serialise(doc), FILE


def m_huge_int(rng, doc, text):
    leaf = rng.choice(_tensor_leaves(doc))
    leaf["shape"] = [RAW]
    return _serialise(doc, "9" * rng.randint(4400, 6000)), FILE


def m_extreme_stat(rng, doc, text):
    leaf = rng.choice(_tensor_leaves(doc))
    leaf[rng.choice(["Max", "Min", "Mean", "Norm"])] = RAW
    return _serialise(doc, rng.choice(["1e999", "-1e999", str(10 ** 400), "1e-999", "9" * 5000])), None


def m_deep(rng, doc, text):
    leaf = rng.choice(_tensor_leaves(doc))
    leaf[rng.choice(["shape", "value", "Max"])] = RAW
    n = rng.randint(DEEP // 2, DEEP)
    return _serialise(doc, "[" * n + "]" * n), LEAF


def m_not_utf8(rng, doc, text):
    raw = text.encode()
    at = raw.index(b'"', rng.randint(len(raw) // 4, len(raw) // 2)) + 1     # inside a string
    return raw[:at] + rng.choice([b"\xe9", b"\xff", b"\xc3\x28", b"\xed\xa0\x80"]) + raw[at:], FILE


def m_utf16(rng, doc, text):
    return text.encode(rng.choice(["utf-16", "utf-16-le", "utf-16-be"])), FILE


def m_truncated(rng, doc, text):
    raw = text.encode()
    return raw[:rng.randint(0, len(raw) - 1)], None


DUMP_MUTATIONS = [m_wrong_type, m_entry_type, m_data_type, m_header_type, m_huge_int, m_extreme_stat,
                  m_deep, m_not_utf8, m_utf16, m_truncated]


def _mutated(folder, mutation, seed):
    path = os.path.join(folder, "dump.json")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    raw, must_refuse = mutation(random.Random(seed), json.loads(text), text)
    with open(path, "wb") as fh:
        fh.write(raw)
    return path, must_refuse


def _one_line(capsys, argv):
    """Run the CLI in this process: (exit code, the error line or None). A traceback
    fails the test by itself (cli.main lets anything but a user's mistake through)."""
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code == 0:
        return code, None
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"probe {argv[0]}: error: "), err
    return code, line


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mutation", DUMP_MUTATIONS, ids=lambda m: m.__name__[2:])
def test_dump_json(copy, dump, tmp_path, capsys, mutation, seed):
    """compare, overflow and (for what must be refused) run-ut: one line naming dump.json."""
    npu = copy()
    path, must_refuse = _mutated(npu, mutation, seed)
    out = str(tmp_path / "out")
    code, line = _one_line(capsys, ["compare", "--npu", npu, "--bench", dump, "-o", out, "--no-html"])
    if must_refuse:
        assert code == 2 and path in line, line
    for argv in (["overflow", npu],) + ((["run-ut", "-i", npu, "-o", out],) if must_refuse else ()):
        code, line = _one_line(capsys, argv)
        if must_refuse == FILE:
            assert code == 2 and path in line, line


# ---------------------------------------------------------------- stack.json, construct.json

def _json_mutations(rng, doc, key_file):
    """Bytes of a mutated stack.json / construct.json (all must be refused)."""
    key = rng.choice(sorted(doc)) if doc else "Functional.linear.0.forward"
    n = rng.randint(DEEP // 2, DEEP)
    text = json.dumps(doc)
    return [
        _serialise({key: RAW}, "[" * n + "]" * n),                      # deep nesting
        _serialise(rng.choice([[1, 2], "text", 5])),                    # not an object
        _serialise({key: rng.choice([5, {"a": 1}, [[1], [2]] if key_file == "stack.json" else [1]])}),
        text.encode("utf-16"),                                          # bad encodings
        text.encode()[:1] + b"\xff" + text.encode()[1:],
        b'{"a": ' + b"9" * 5000 + b"}",                                 # past float64
        text.encode()[:max(1, rng.randint(0, len(text) - 1))],          # truncated
    ]


@pytest.mark.parametrize("name", ["stack.json", "construct.json"])
def test_stack_and_construct_json(copy, dump, tmp_path, capsys, name):
    rng = random.Random(name)
    with open(os.path.join(dump, name), encoding="utf-8") as fh:
        doc = json.load(fh)
    for i, raw in enumerate(_json_mutations(rng, doc, name)):
        npu = copy(f"npu{i}")
        path = os.path.join(npu, name)
        with open(path, "wb") as fh:
            fh.write(raw)
        code, line = _one_line(capsys, ["compare", "--npu", npu, "--bench", dump, "-s", "-o",
                                        str(tmp_path / "out"), "--no-html"])
        assert code == 2 and path in line, (i, line)


@pytest.mark.parametrize("kind", ["fifo", "symlink out"])
@pytest.mark.parametrize("name", ["stack.json", "construct.json", "dump.json"])
def test_a_json_file_that_is_a_fifo_or_leaves_the_folder_is_refused(copy, dump, tmp_path, capsys, name, kind):
    if kind == "fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    npu = copy()
    path = os.path.join(npu, name)
    os.rename(path, str(tmp_path / name))
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(str(tmp_path / name), path)      # the real file, outside the dump's folder
    code, line = _one_line(capsys, ["compare", "--npu", os.path.join(npu, "dump.json"), "--bench",
                                    os.path.join(dump, "dump.json"), "-s", "-o", str(tmp_path / "o"), "--no-html"])
    if name == "dump.json" and kind != "fifo":      # the file the user named: read where it leads
        assert code == 0
    else:
        assert code == 2 and name in line and ("FIFO" in line or "escapes" in line), line


# ---------------------------------------------------------------- compare.json

@pytest.mark.parametrize("seed", range(2))
def test_compare_json(dump, tmp_path, capsys, seed):
    rng = random.Random(seed)
    good = {"npu_json_path": os.path.join(dump, "dump.json"), "bench_json_path": os.path.join(dump, "dump.json")}
    key = rng.choice(sorted(good))
    n = rng.randint(DEEP // 2, DEEP)
    cases = [_serialise([good]), _serialise(rng.choice([5, "x", None])),
             _serialise({**good, key: rng.choice([5, ["a"], {"a": 1}, True])}),
             _serialise({**good, key: RAW}, "[" * n + "]" * n),
             json.dumps(good).encode("utf-16"), json.dumps(good).encode()[:rng.randint(1, 40)],
             b'{"npu_json_path": ' + b"9" * 5000 + b"}"]
    for i, raw in enumerate(cases):
        path = str(tmp_path / f"compare{i}.json")
        with open(path, "wb") as fh:
            fh.write(raw)
        code, line = _one_line(capsys, ["compare", "-i", path, "-o", str(tmp_path / "out"), "--no-html"])
        assert code == 2, (i, line)


# ---------------------------------------------------------------- layout files

@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_layout_files(tmp_path, suffix):
    rng = random.Random(suffix)
    good = {"Functional.linear.*.forward.output.0": {"shard_dim": 1}}
    text = json.dumps(good)
    n = rng.randint(DEEP // 2, DEEP)
    cases = [text.encode("utf-16"), b"\xff" + text.encode(), text.encode()[:rng.randint(1, len(text) - 2)],
             _serialise([good]), _serialise({"x": {"shard_dim": RAW}}, "9" * 5000),
             _serialise({"x": RAW}, "[" * n + "]" * n),
             _serialise({"x": rng.choice([{"shard_dim": "1"}, {"partial": 5}, [1], {"scale": 1e999}])})]
    for i, raw in enumerate(cases):
        path = tmp_path / f"layout{i}{suffix}"
        path.write_bytes(raw)
        with pytest.raises(ConfigError) as info:
            load_layout_file(str(path))
        assert str(path) in str(info.value) and "\n" not in str(info.value), (i, info.value)
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / f"fifo{suffix}"
        os.mkfifo(fifo)
        with pytest.raises(ConfigError, match="FIFO"):
            load_layout_file(str(fifo))


# ---------------------------------------------------------------- draws.safetensors

def _draws_header(raw: bytes):
    (n,) = np.frombuffer(raw[:8], dtype="<u8")
    return int(n), json.loads(raw[8:8 + int(n)])


def _with_header(raw: bytes, header_bytes: bytes) -> bytes:
    n, _ = _draws_header(raw)
    return len(header_bytes).to_bytes(8, "little") + header_bytes + raw[8 + n:]


@pytest.mark.parametrize("seed", range(3))
def test_draws_file(copy, seed):
    """A bench run given random_from reads the NPU's draws file: a ConfigError line, never
    an AttributeError / a hang inside the user's training script."""
    rng = random.Random(seed)
    with open(os.path.join(copy("orig"), draw_files.FILE), "rb") as fh:
        raw = fh.read()
    _, header = _draws_header(raw)
    entry = rng.choice([k for k in header if k != "__metadata__"])
    n = rng.randint(DEEP // 2, DEEP)
    cases = [
        _with_header(raw, _serialise({**header, entry: rng.choice([[1, 2], "U8", 5, None])})),
        _with_header(raw, _serialise({**header, entry: {"dtype": "U8", "data_offsets": rng.choice([[0], ["a", 1], [0, 2 ** 70]])}})),
        _with_header(raw, _serialise({**header, entry: RAW}, "[" * n + "]" * n)),
        _with_header(raw, _serialise({**header, "__metadata__": {**header["__metadata__"], entry: RAW}}, "9" * 5000)),
        raw[:rng.randint(0, 7)], raw[:rng.randint(8, len(raw) - 1)],
    ]
    for i, blob in enumerate(cases):
        folder = copy(f"d{seed}_{i}")
        path = os.path.join(folder, draw_files.FILE)
        with open(path, "wb") as fh:
            fh.write(blob)
        with pytest.raises(ConfigError) as info:
            draw_files.StepDraws(folder)
        assert path in str(info.value) and "\n" not in str(info.value), (i, info.value)
    hostile = copy(f"h{seed}")
    path = os.path.join(hostile, draw_files.FILE)
    os.remove(path)
    if rng.random() < 0.5 and hasattr(os, "mkfifo"):
        os.mkfifo(path)
    else:
        os.symlink(os.path.join(copy(f"out{seed}"), draw_files.FILE), path)   # a real file, outside
    with pytest.raises(ConfigError, match="FIFO|escapes"):
        draw_files.StepDraws(hostile)


# ---------------------------------------------------------------- tensor files (.npy, .pt)

def _hostile_arrays(rng):
    return [np.zeros(rng.randint(1, 9), dtype=[("a", "<f4"), ("b", "<i4")]),
            np.array(["a", "bc"][:rng.randint(1, 2)]), np.array([b"x"]),
            np.array(["2024-01-01"], dtype="datetime64[D]")]


@pytest.mark.parametrize("seed", range(3))
def test_tensor_files(copy, tmp_path, seed):
    """tensors.load (the compare, run-ut, overflow and repro all load through it) and resolve."""
    rng = random.Random(seed)
    folder = copy()
    data = os.path.join(folder, "dump_tensor_data")
    name = rng.choice(sorted(f for f in os.listdir(data) if f.endswith(".npy")))
    path = os.path.join(data, name)
    with open(path, "rb") as fh:
        good = fh.read()
    bad = [good[:rng.randint(0, len(good) - 1)], b"\x93NUMPY" + bytes(rng.randrange(256) for _ in range(40))]
    for i, arr in enumerate(_hostile_arrays(rng)):
        p = str(tmp_path / f"a{i}.npy")
        np.save(p, arr)
        bad.append(open(p, "rb").read())
    p = str(tmp_path / "pickle.npy")
    np.save(p, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    bad.append(open(p, "rb").read())
    for i, blob in enumerate(bad):
        with open(path, "wb") as fh:
            fh.write(blob)
        with pytest.raises(DumpError) as info:
            tensors.load(path)
        assert path in str(info.value) and "\n" not in str(info.value), (i, info.value)
    os.remove(path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(path)
        with pytest.raises(DumpError, match="FIFO"):
            tensors.load(path)
        os.remove(path)
    os.mkdir(path)
    with pytest.raises(DumpError, match="directory"):
        tensors.load(path)
    outside = str(tmp_path / "secret.npy")
    np.save(outside, np.zeros(3, np.float32))
    link = os.path.join(data, "link.npy")
    os.symlink(outside, link)
    hostile = ["../" * rng.randint(1, 6) + "secret.npy", outside, "link.npy", "", "a\x00b.npy",
               rng.choice([5, ["x.npy"], None, {"a": 1}])]
    for data_name in hostile:
        with pytest.raises(DumpError) as info:
            tensors.resolve(data, data_name)
        assert "\n" not in str(info.value)


def test_pt_files_refused_before_torch_2_6(tmp_path, monkeypatch):
    """torch.load(weights_only=True) can be bypassed before torch 2.6 (CVE-2025-32434): there
    a dump's .pt file is refused in one line; from 2.6 it loads (plain tensors only)."""
    from probe import torch_compat
    path = str(tmp_path / "x.pt")
    torch.save(torch.arange(4, dtype=torch.bfloat16), path)
    monkeypatch.setattr(torch_compat, "SAFE_WEIGHTS_ONLY", False)
    with pytest.raises(DumpError, match="CVE-2025-32434") as info:
        tensors.load(path)
    assert "\n" not in str(info.value)
    monkeypatch.setattr(torch_compat, "SAFE_WEIGHTS_ONLY", True)
    assert tensors.load(path).tolist() == [0.0, 1.0, 2.0, 3.0]
    torch.save({"not": "a tensor", "f": [1, 2]}, path)
    with pytest.raises(DumpError, match="does not hold a tensor"):
        tensors.load(path)


# ---------------------------------------------------------------- through a process: exit codes

def _probe(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "probe", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=os.path.dirname(HERE), errors="replace")


@fifo_only
def test_a_fifo_tensor_file_marks_its_row_and_the_compare_ends(copy, dump, tmp_path):
    """A FIFO named like a tensor file once blocked ``probe compare`` for ever in np.load."""
    npu = copy()
    d = json.load(open(os.path.join(npu, "dump.json")))
    name = _tensor_leaves(d)[0]["data_name"]
    path = os.path.join(npu, "dump_tensor_data", name)
    os.remove(path)
    os.mkfifo(path)
    r = _probe("compare", "--npu", npu, "--bench", dump, "-o", str(tmp_path / "o"), "--no-html")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    csv_path = next(p for p in r.stdout.split() if p.endswith(".csv"))
    import pandas as pd
    row = pd.read_csv(csv_path).set_index("NPU Name").loc[name[:-len(".npy")]]
    assert row["Result"] == "error" and "FIFO" in row["Err_message"] and "\n" not in row["Err_message"]


def test_exit_code_2_from_a_process(copy, dump, tmp_path):
    npu = copy()
    _mutated(npu, m_utf16, 0)
    for argv in (["compare", "--npu", npu, "--bench", dump, "-o", str(tmp_path / "o")], ["overflow", npu],
                 ["run-ut", "-i", npu, "-o", str(tmp_path / "u")]):
        r = _probe(*argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"probe {argv[0]}: error: {npu}/dump.json: dump.json ")
        assert "UTF-16" in lines[0], lines


def test_run_ut_reads_no_tensor_folder_outside_the_dump(copy, dump, tmp_path, capsys):
    """With no dump_tensor_data beside dump.json, dump.json's own dump_data_dir is followed
    only inside the dump's folder (a relative one from there, not from the working directory)."""
    npu = copy()
    elsewhere = str(tmp_path / "elsewhere")
    shutil.move(os.path.join(npu, "dump_tensor_data"), elsewhere)
    path = os.path.join(npu, "dump.json")
    d = json.load(open(path))
    for given in (elsewhere, os.path.relpath(elsewhere, npu)):
        d["dump_data_dir"] = given
        json.dump(d, open(path, "w"))
        code, line = _one_line(capsys, ["run-ut", "-i", npu, "-o", str(tmp_path / "u")])
        assert code == 2 and "dump_data_dir" in line and "outside" in line, line
    inner = os.path.join(npu, "tensors")
    shutil.move(elsewhere, inner)
    assert tensors.data_folder(path, "tensors") == inner     # from the dump's folder, not the cwd
