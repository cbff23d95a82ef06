"""Draw replay: a bench run takes the NPU run's random draws (``random_from``).

The NPU side records each random call's draw next to its dump (every task); a bench run
given ``random_from=NPU_ROOT`` returns the NPU's draw for the same call. The main test is a
real one: a tiny HF GPT-2 with dropout 0.1 everywhere, trained 3 steps with AdamW, the
"NPU" and the bench seeded differently (as two devices draw differently) but with the same
weights and data; with replay every step compares with nothing named and every dropout row
equal, without it the dropout rows differ. Then: the dropout arithmetic is torch's own,
bitwise, forward and backward, for each dropout API and dtype; rand*-style values come back
as drawn; a call that does not fit is one DrawMismatch naming it; recording changes nothing
in the NPU run; masks take 1 bit an element; a fused attention's dropout is said once.
"""
import csv
import json
import logging
import math
import os
import struct

import pytest
import torch
import torch.nn.functional as F
from conftest import load_dump
from real_runs import BATCH, HIDDEN, LAYERS, SEQ, VOCAB, compare_steps, dump_json

from probe import ConfigError, PrecisionDebugger
from probe.dump import draw_files, draws
from probe.errors import DrawMismatch

STEPS = 3
FILE = draw_files.FILE


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread, as the diagnosis tests (a loaded machine's pool makes the
    compare's many tiny tensor ops wait)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def gpt2_dropout():
    """tests/real_runs.py's tiny GPT-2 with resid, embd and attn dropout 0.1, eager attention."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)   # the same initial weights on both sides
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=4,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    cfg._attn_implementation = "eager"
    return GPT2LMHeadModel(cfg)


def train(root, seed, task="tensor", steps=STEPS, debugger=True, **kw):
    """``steps`` AdamW steps in train mode, the random stream seeded with ``seed`` (the data
    comes from its own generator): (losses, final parameters)."""
    model = gpt2_dropout().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(seed)
    dbg = PrecisionDebugger(dump_path=str(root), task=task, level="L1", **kw) if debugger else None
    losses = []
    try:
        for _ in range(steps):
            x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
            if dbg:
                dbg.start()
            opt.zero_grad()
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if dbg:
                dbg.stop()
                dbg.step()
    finally:
        if dbg:
            dbg.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def draws_of(root, step=0, rank="rank"):
    return draw_files.StepDraws(os.path.join(str(root), f"step{step}", rank))


def dropout_rows(paths):
    csv_path = next(p for p in paths if p.endswith(".csv"))
    with open(csv_path, newline="", encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if r["NPU Name"].startswith("Functional.dropout.")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("draws")
    npu = base / "npu"
    out = {"npu": train(npu, seed=1), "npu_root": npu}
    out["bench"] = train(base / "bench", seed=2, random_from=str(npu))
    out["free"] = train(base / "free", seed=2)
    out["replayed"] = compare_steps(npu, base / "bench", base / "cmp_replayed", STEPS)
    out["own"] = compare_steps(npu, base / "free", base / "cmp_own", STEPS)
    return out


# ---------------------------------------------------------------- the real run

def test_gpt2_with_dropout_compares_call_by_call_when_the_bench_takes_the_npu_draws(runs):
    assert runs["bench"][0] == runs["npu"][0]               # the same losses, bitwise
    for a, b in zip(runs["bench"][1], runs["npu"][1]):
        assert torch.equal(a, b)
    for s, (paths, summary) in enumerate(runs["replayed"]):
        assert summary["first_divergence"]["name"] is None, (s, summary["verdict"])
        rows = dropout_rows(paths)
        outputs = [r for r in rows if ".forward.output." in r["NPU Name"]]
        assert len(outputs) == 7 and all(r["Result"] == "pass" for r in rows), s   # 2 layers x 3 + embd
        assert all(float(r["MaxAbsErr"]) == 0.0 and float(r["Cosine"]) > 0.99999 for r in outputs), s


def test_without_random_from_the_dropout_outputs_differ(runs):
    assert runs["free"][0] != runs["npu"][0]
    for s, (paths, _) in enumerate(runs["own"]):
        outputs = [r for r in dropout_rows(paths) if ".forward.output." in r["NPU Name"]]
        assert any(r["Result"] == "error" for r in outputs), s
        assert all(float(r["MaxAbsErr"]) > 0 for r in outputs), s


def test_the_npu_dump_holds_one_mask_a_dropout_call(runs):
    data = json.load(open(dump_json(runs["npu_root"], 0), encoding="utf-8"))["data"]
    calls = sorted(e for e in data if e.startswith("Functional.dropout.") and e.endswith(".forward"))
    d = draws_of(runs["npu_root"])
    assert sorted(d.records) == calls
    for entry in calls:
        rec = d.records[entry]
        assert rec.kind == "mask" and rec.p == 0.1 and list(rec.shape) == data[entry]["input_args"][0]["shape"]


# ---------------------------------------------------------------- recording

def test_recording_leaves_the_npu_training_bitwise_as_without_the_debugger(tmp_path):
    free = train(tmp_path / "none", seed=1, debugger=False)
    dumped = train(tmp_path / "npu", seed=1, task="statistics")
    assert dumped[0] == free[0]
    assert all(torch.equal(a, b) for a, b in zip(dumped[1], free[1]))


def test_recording_changes_nothing_in_dump_json(tmp_path, monkeypatch):
    """The draw handler adds a frame between the API and the collector, which reads the
    caller's frame for the arguments as written: the entries are the same as without it."""
    for side in ("on", "off"):   # one line, so that the stacks are the same
        monkeypatch.setattr(draws, "RECORD", side == "on")
        train(tmp_path / side, seed=1, task="statistics", steps=1)
    assert not os.path.exists(tmp_path / "off" / "step0" / "rank" / FILE)
    assert load_dump(tmp_path / "on") == load_dump(tmp_path / "off")
    with open(tmp_path / "on" / "step0" / "rank" / "stack.json") as a, open(tmp_path / "off" / "step0" / "rank" / "stack.json") as b:
        assert json.load(a) == json.load(b)


def test_statistics_task_records_masks_bit_packed(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics")
    x = torch.randn(3, 5, 7)   # 105 elements: 14 bytes
    dbg.start()
    F.dropout(x, 0.25, True)
    torch.rand(4, 6)
    dbg.stop()
    dbg.step()
    dbg.close()
    path = tmp_path / "step0" / "rank" / FILE
    d = draws_of(tmp_path)
    assert d.records["Functional.dropout.0.forward"].kind == "mask"
    assert d.raw("Functional.dropout.0.forward").size == math.ceil(105 / 8)
    assert d.raw("Torch.rand.0.forward").size == 24 * 4
    (header,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert path.stat().st_size == 8 + header + 14 + 96   # the file is the header and the bits


def test_a_short_write_is_completed(tmp_path, monkeypatch):
    rec = draw_files.DrawRecord("values", (4,), "torch.float32")
    data = torch.arange(4, dtype=torch.float32)
    monkeypatch.setattr(os, "writev", lambda fd, parts: os.write(fd, bytes(memoryview(parts[0]))[:10]), raising=False)
    rank_dir = tmp_path / "step0" / "rank"
    rank_dir.mkdir(parents=True)
    draw_files.write_step(str(rank_dir), {"Torch.rand.0.forward": (rec, draw_files.values_array(data))})
    assert torch.equal(draws_of(tmp_path).values("Torch.rand.0.forward"), data)


def test_a_step_without_random_calls_has_no_draws_file(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics")
    x = torch.randn(4)
    for _ in range(2):
        dbg.start()
        torch.exp(x) if dbg.current_step == 0 else F.dropout(x, 0.5, False)   # eval mode draws nothing
        dbg.stop()
        dbg.step()
    dbg.close()
    for step in (0, 1):
        assert sorted(os.listdir(tmp_path / f"step{step}" / "rank")) == ["construct.json", "dump.json", "stack.json"]


def test_the_file_is_safetensors(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics")
    x = torch.randn(40)
    dbg.start()
    F.dropout(x, 0.5, True)
    torch.randn(3, dtype=torch.bfloat16)
    dbg.stop()
    dbg.step()
    dbg.close()
    loaded = safetensors_numpy.load_file(str(tmp_path / "step0" / "rank" / FILE))
    assert set(loaded) == {"Functional.dropout.0.forward", "Torch.randn.0.forward"}
    assert loaded["Functional.dropout.0.forward"].size == 5


def test_a_mask_counts_an_element_whose_input_was_zero_as_drawn(tmp_path):
    """output != 0 cannot tell a kept 0 from a dropped element; the recorded mask is the
    one the call drew (its gradient there is the proof)."""
    x = torch.softmax(torch.randn(2, 4, 8, 8).masked_fill(torch.ones(8, 8).triu(1).bool(), float("-inf")), -1)
    assert (x == 0).sum() > 50
    torch.manual_seed(3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics")
    xr = x.clone().requires_grad_()
    dbg.start()
    F.dropout(xr, 0.5, True).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert torch.equal(draws_of(tmp_path).mask("Functional.dropout.0.forward"), xr.grad != 0)


def test_a_cpu_dropout_that_draws_otherwise_is_drawn_again_through_the_api(tmp_path, monkeypatch, caplog):
    """The CPU's dropout mask is drawn again alone (bernoulli_ on its noise tensor), checked
    on the first call against the output; where that check fails the API itself runs again."""
    monkeypatch.setattr(draws, "_FAST", {"dropout": True})
    monkeypatch.setattr(draws, "_fast_checked", set())
    real = torch.Tensor.bernoulli_
    monkeypatch.setattr(torch.Tensor, "bernoulli_", lambda self, p=0.5, **kw: real(self, 0.5, **kw))   # a wrong draw
    x = torch.randn(6, 7)   # no grad: no mask saved by autograd, drawn again
    with caplog.at_level(logging.WARNING, logger="probe"):
        npu = _side(tmp_path / "npu", 1, lambda x: [F.dropout(x, 0.2, True) for _ in range(3)], x, grad=False)
    assert draws._FAST["dropout"] is False and not caplog.records
    bench = _side(tmp_path / "bench", 2, lambda x: [F.dropout(x, 0.2, True) for _ in range(3)], x, grad=False,
                  random_from=str(tmp_path / "npu"))
    assert all(torch.equal(a, b) for a, b in zip(npu[0], bench[0]))


def test_saved_tensor_hooks_are_never_run_by_recording(tmp_path):
    """Under saved-tensor hooks (activation checkpointing, offloading) reading the mask
    autograd saved would run their unpack hook: the mask is drawn again instead."""
    unpacked = []
    x = torch.randn(5, 9)
    x[0] = 0

    def fn(xr):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: unpacked.append(1) or t):
            outs = [F.dropout(xr, 0.4, True) for _ in range(2)]
        assert not unpacked
        return outs
    npu = _side(tmp_path / "npu", 1, fn, x)
    assert len(unpacked) == 2              # the backward's own
    unpacked.clear()
    bench = _side(tmp_path / "bench", 2, fn, x, random_from=str(tmp_path / "npu"))
    assert all(torch.equal(a, b) for a, b in zip(npu[0], bench[0])) and torch.equal(npu[1], bench[1])


# ---------------------------------------------------------------- replay, call by call

def _calls(x):
    """One call of each dropout API, and of APIs whose output is the draw."""
    y = x.detach().clone()
    F.dropout(y, 0.3, True, True)   # in place
    return [F.dropout(x, 0.3, True), F.dropout1d(x.flatten(2), 0.3, True), F.dropout2d(x, 0.3, True),
            F.dropout3d(x.unsqueeze(2), 0.3, True), F.alpha_dropout(x, 0.3, True),
            F.feature_alpha_dropout(x, 0.3, True), torch.dropout(x, 0.3, True),
            torch.native_dropout(x, 0.3, True)[0], y, F.dropout(x, 0.5, True)]


def _side(root, seed, fn, x, grad=True, **kw):
    torch.manual_seed(seed)
    dbg = PrecisionDebugger(dump_path=str(root), task="statistics", **kw)
    xr = x.clone().requires_grad_(grad)
    dbg.start()
    try:
        outs = fn(xr)
        if grad:
            sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs) if o.requires_grad).backward()
    finally:
        dbg.stop()
    dbg.step()
    dbg.close()
    return [o.detach() for o in outs], xr.grad


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_replayed_dropout_is_torch_own_arithmetic_bitwise(tmp_path, dtype, grad):
    """Bench = NPU here (same device and input), so a replay that is torch's dropout for the
    NPU's mask gives the NPU's outputs and input gradient bit for bit (zeros included).
    With grad the NPU side reads the masks autograd saved; without, it draws them again."""
    try:
        F.dropout(torch.ones(2, dtype=dtype), 0.5, True)
    except RuntimeError as exc:   # torch 2.1's CPU has no float16 bernoulli
        pytest.skip(f"no {dtype} dropout on this torch's CPU: {exc}")
    x = torch.randn(2, 3, 4, 5).to(dtype)
    x[0, 0] = 0
    npu = _side(tmp_path / "npu", 1, _calls, x, grad)
    bench = _side(tmp_path / "bench", 2, _calls, x, grad, random_from=str(tmp_path / "npu"))
    own = _side(tmp_path / "own", 2, _calls, x, grad)
    for i, (a, b, c) in enumerate(zip(npu[0], bench[0], own[0])):
        assert a.dtype == dtype and torch.equal(a, b), i
        assert not torch.equal(a, c), i      # the bench's own draw differs: the test can fail
    assert (npu[1] is None and bench[1] is None) if not grad else torch.equal(npu[1], bench[1])


def test_replayed_values_are_the_npu_draws_in_the_bench_dtype(tmp_path):
    def fn(x):
        t = torch.empty(6)
        t.uniform_()
        return [torch.rand(3, 4), torch.randn(5, dtype=torch.bfloat16 if npu_side else torch.float32),
                torch.randint(0, 100, (7,)), torch.randperm(9), torch.bernoulli(torch.full((8,), 0.5)),
                torch.multinomial(torch.ones(10), 4), torch.normal(torch.zeros(4), 1.0), t,
                torch.empty(5).normal_(), torch.empty(6).bernoulli_(0.5), torch.empty(3).exponential_(), x * 1]
    x = torch.randn(3)
    npu_side = True
    npu, _ = _side(tmp_path / "npu", 1, fn, x)
    npu_side = False
    bench, _ = _side(tmp_path / "bench", 2, fn, x, random_from=str(tmp_path / "npu"))
    for i, (a, b) in enumerate(zip(npu, bench)):
        assert torch.equal(a.to(b.dtype), b), i
    assert bench[1].dtype == torch.float32   # the bench's own dtype, the NPU's bf16 values


def test_the_bench_generator_moves_on_as_after_its_own_draw(tmp_path):
    def fn(x):
        return [F.dropout(x, 0.5, True), torch.rand(4)]
    x = torch.randn(64)
    _side(tmp_path / "npu", 1, fn, x)
    torch.manual_seed(2)
    F.dropout(x, 0.5, True)
    torch.rand(4)
    expected = torch.rand(5)
    _side(tmp_path / "bench", 2, fn, x, random_from=str(tmp_path / "npu"))
    assert torch.equal(torch.rand(5), expected)


def _bench(tmp_path, fn, steps=1):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "bench"), task="statistics", random_from=str(tmp_path / "npu"))
    try:
        for _ in range(steps):
            dbg.start()
            fn()
            dbg.stop()
            dbg.step()
    finally:
        dbg.close()


@pytest.fixture
def npu_two_dropouts(tmp_path):
    x = torch.randn(4, 8)
    _side(tmp_path / "npu", 1, lambda x: [F.dropout(x, 0.1, True), F.dropout(x, 0.1, True)], x)
    return x


def _one_line(info):
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_another_shape_is_one_error_naming_the_call(tmp_path, npu_two_dropouts):
    x = npu_two_dropouts
    with pytest.raises(DrawMismatch) as info:
        _bench(tmp_path, lambda: (F.dropout(x, 0.1, True), F.dropout(x[:2], 0.1, True)))
    msg = _one_line(info)
    assert "Functional.dropout.1.forward at step 0" in msg and "[2, 8] here, [4, 8] in the NPU run" in msg


def test_another_p_is_one_error_naming_the_call(tmp_path, npu_two_dropouts):
    x = npu_two_dropouts
    with pytest.raises(DrawMismatch) as info:
        _bench(tmp_path, lambda: F.dropout(x, 0.2, True))
    assert "Functional.dropout.0.forward at step 0" in _one_line(info) and "p=0.2 here, p=0.1" in str(info.value)


def test_an_extra_call_is_one_error_naming_the_call(tmp_path, npu_two_dropouts):
    x = npu_two_dropouts
    with pytest.raises(DrawMismatch) as info:
        _bench(tmp_path, lambda: [F.dropout(x, 0.1, True) for _ in range(3)])
    msg = _one_line(info)
    assert "Functional.dropout.2.forward at step 0" in msg and "drew at 2 Functional.dropout calls" in msg


def test_a_missing_call_is_one_error_at_step(tmp_path, npu_two_dropouts):
    x = npu_two_dropouts
    with pytest.raises(DrawMismatch) as info:
        _bench(tmp_path, lambda: F.dropout(x, 0.1, True))
    assert "step 0: the NPU run drew at Functional.dropout.1.forward" in _one_line(info)


def test_a_call_in_eval_mode_where_the_npu_drew_is_one_error(tmp_path, npu_two_dropouts):
    x = npu_two_dropouts
    with pytest.raises(DrawMismatch) as info:
        _bench(tmp_path, lambda: F.dropout(x, 0.1, False))
    assert "Functional.dropout.0.forward" in _one_line(info) and "draws nothing" in str(info.value)


def test_a_random_call_where_the_npu_made_none_is_one_error_naming_it(tmp_path):
    _side(tmp_path / "npu", 1, lambda x: [x * 1], torch.ones(3))
    with pytest.raises(DrawMismatch) as info:
        _bench(tmp_path, lambda: torch.rand(2))
    msg = _one_line(info)
    assert "Torch.rand.0.forward at step 0" in msg and "made no random call at this step" in msg


def test_a_step_the_npu_did_not_dump_is_one_error(tmp_path, npu_two_dropouts):
    x = npu_two_dropouts
    with pytest.raises(ConfigError) as info:
        _bench(tmp_path, lambda: (F.dropout(x, 0.1, True), F.dropout(x, 0.1, True)), steps=2)
    assert "has no step1" in _one_line(info)


class _DropNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x):
        return self.drop(torch.relu(self.fc(x))).sum()


@pytest.mark.parametrize("level", ["L0", "mix", "L2"])
def test_replay_works_at_every_level_and_adds_no_entry(tmp_path, level):
    """At L0 no API entry exists, at L2 a dispatch mode records kernels: the draws are
    taken all the same, and probe's own tensor work makes no kernel entry."""
    grads, names = [], []
    for side, seed in (("npu", 1), ("bench", 2)):
        torch.manual_seed(0)
        model, x = _DropNet(), torch.randn(4, 8)
        torch.manual_seed(seed)
        kw = {"random_from": str(tmp_path / "npu")} if side == "bench" else {}
        dbg = PrecisionDebugger(dump_path=str(tmp_path / side), task="statistics", level=level, model=model, **kw)
        for _ in range(2):
            dbg.start()
            model(x).backward()
            dbg.stop()
            dbg.step()
        dbg.close()
        grads.append(model.fc.weight.grad)
        names.append([list(load_dump(tmp_path / side, s)) for s in (0, 1)])
    assert torch.equal(grads[0], grads[1])
    assert names[0] == names[1]


# ---------------------------------------------------------------- what cannot be taken

@pytest.mark.parametrize("side", ["npu", "bench"])
def test_fused_attention_dropout_is_said_once_with_what_to_do(tmp_path, caplog, side):
    q = torch.randn(1, 2, 4, 8)
    fn = lambda: [F.scaled_dot_product_attention(q, q, q, dropout_p=0.1) for _ in range(3)] + \
        [F.scaled_dot_product_attention(q, q, q)]
    kw = {}
    if side == "bench":
        _side(tmp_path / "npu", 1, lambda x: [x * 1], torch.ones(1))
        kw["random_from"] = str(tmp_path / "npu")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / side / "x"), task="statistics", **kw)
    with caplog.at_level(logging.WARNING, logger="probe"):
        dbg.start()
        fn()
        dbg.stop()
        dbg.step()
    dbg.close()
    lines = [r.getMessage() for r in caplog.records if "scaled_dot_product_attention" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "dropout_p=0.1" in lines[0] and "eager attention" in lines[0] and "dropout_p=0" in lines[0]


# ---------------------------------------------------------------- config and files

def test_random_from_is_checked_at_construction(tmp_path, dump_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    for value, said in ((str(tmp_path / "none"), "is not a folder"), (str(empty), "holds no step folders"),
                        (5, "must be the path")):
        with pytest.raises(ConfigError) as info:
            PrecisionDebugger(dump_path=dump_dir, random_from=value)
        assert said in _one_line(info) and "random_from" in str(info.value)
    (tmp_path / "d" / "step0").mkdir(parents=True)
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(dump_path=str(tmp_path / "d"), random_from=str(tmp_path / "d"))
    assert "this run's dump_path" in _one_line(info)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"dump_path": dump_dir, "random_from": str(empty)}))
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(config_path=str(cfg))
    assert str(cfg) in _one_line(info) and "random_from" in str(info.value)


def _write_raw(rank_dir, header, data=b""):
    text = json.dumps(header).encode()
    os.makedirs(rank_dir, exist_ok=True)
    with open(os.path.join(rank_dir, FILE), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


META = {"format": "probe.draws/1",
        "Torch.rand.0.forward": json.dumps({"kind": "values", "shape": [2], "dtype": "torch.float32"})}


@pytest.mark.parametrize("header, data, said", [
    ({"__metadata__": META, "Torch.rand.0.forward": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}},
     b"\0" * 4, "outside the data"),
    ({"__metadata__": META, "Torch.rand.0.forward": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}},
     b"\0" * 4, "is 8 bytes, the file holds 4"),
    ({"__metadata__": dict(META, format="other")}, b"", "not a probe.draws/1 file"),
    ({"__metadata__": META, "../x.0.forward": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}},
     b"\0" * 8, "bad entry name"),
    ({"__metadata__": {"format": "probe.draws/1", "Torch.rand.0.forward": "{\"kind\": \"pickle\"}"},
      "Torch.rand.0.forward": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, b"\0" * 8, "kind"),
])
def test_a_damaged_file_is_one_clear_error(tmp_path, header, data, said):
    _write_raw(tmp_path / "step0" / "rank", header, data)
    with pytest.raises(ConfigError) as info:
        draws_of(tmp_path)
    assert said in _one_line(info) and FILE in str(info.value)


def test_every_random_api_has_a_kind():
    """One source of truth: precheck's RANDOM and DROPOUT_ARGS decide what is a draw."""
    from probe.precheck.entries import DROPOUT_ARGS, RANDOM
    assert {draws.kind_of(n) for n in DROPOUT_ARGS} == {"mask"}
    assert all(draws.kind_of(n) in ("values", "mask", "inside") for n in RANDOM)
    assert draws.kind_of("linear") is None and draws.kind_of("scaled_dot_product_attention") == "fused"
