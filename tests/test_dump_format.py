"""dump.json / stack.json / construct.json layout and tensor summaries (issue #2, item 6).

Statistics are checked against torch's own float64 reductions, and the tiny-model run
against msprobe 8.3.3's dump of the same run (values and schema).
"""
import json
import os
import re
import warnings
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES, assert_summary, load_dump
from test_dump_names import MSPROBE_833, _tiny_model

PROBE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + "probe" + os.sep

SUMMARY_CASES = {
    "float32": lambda: torch.randn(5, 7),
    "float64": lambda: torch.randn(6, dtype=torch.float64),
    "bfloat16": lambda: (torch.randn(5, 7) * 100).to(torch.bfloat16),
    "float16": lambda: (torch.randn(5, 7) * 1000).to(torch.float16),
    "float16_sum_overflows_fp16": lambda: torch.full((4096,), 60000.0, dtype=torch.float16),
    "int64": lambda: torch.randint(-100, 100, (4, 5)),
    "int8": lambda: torch.randint(-100, 100, (4, 5), dtype=torch.int8),
    "uint8": lambda: torch.randint(0, 255, (4, 5), dtype=torch.uint8),
    "zero_dim": lambda: torch.tensor(2.5),
}


@pytest.mark.parametrize("case", sorted(SUMMARY_CASES))
def test_summary_matches_torch(dump_once, case):
    torch.manual_seed(0)
    t = SUMMARY_CASES[case]()
    data, _ = dump_once(lambda: torch.clone(t))
    entry = data["Torch.clone.0.forward"]
    assert_summary(entry["input_args"][0], t)
    assert_summary(entry["output"][0], t)
    if not t.dtype.is_floating_point:  # ints are exact: Max/Min are ints
        assert isinstance(entry["input_args"][0]["Max"], int)


def test_summary_of_bool_empty_nan_inf(dump_once, dump_dir):
    b = torch.tensor([[True, False, True], [False, False, True]])
    cases = [b, torch.empty(0, 3), torch.tensor([1.0, float("nan"), 3.0]),
             torch.tensor([1.0, float("inf"), -3.0]), torch.tensor([-float("inf"), float("inf")])]
    with warnings.catch_warnings(record=True) as caught:   # NaN/Inf: no numpy warnings
        warnings.simplefilter("always")
        data, _ = dump_once(lambda: [torch.clone(t) for t in cases])
    assert [str(w.message) for w in caught] == []
    s = [data[f"Torch.clone.{i}.forward"]["input_args"][0] for i in range(len(cases))]
    assert (s[0]["Max"], s[0]["Min"]) == (True, False)
    assert s[0]["Mean"] == pytest.approx(b.double().mean().item())
    assert s[0]["Norm"] == pytest.approx(b.double().norm().item())
    assert s[1]["shape"] == [0, 3] and s[1]["dtype"] == "torch.float32"
    for case, summary in zip(cases[2:], s[2:]):
        assert_summary(summary, case)
    assert s[3]["Max"] == float("inf") and s[4]["Min"] == float("-inf")
    with open(os.path.join(dump_dir, "step0", "rank", "dump.json")) as f:
        raw = f.read()
    assert re.search(r'"Max": ?NaN', raw) and re.search(r'"Max": ?Infinity', raw) and re.search(r'"Min": ?-Infinity', raw)  # bare tokens


def test_md5_is_crc32_and_matches_msprobe(make_debugger, dump_dir):
    """Same tensors as msprobe 26.2's md5 fixtures (fp32 and bf16 autocast): same CRC32."""
    tm = _tiny_model()
    model, x, _ = tm.make()
    fc1 = model.blocks[0].fc1
    dbg = make_debugger(config_path=_cfg(dump_dir, "statistics", {"summary_mode": "md5"}))
    dbg.start()
    F.linear(x, fc1.weight, fc1.bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.linear(x, fc1.weight, fc1.bias)
    dbg.stop()
    dbg.step()
    got = load_dump(dump_dir)
    for i, variant in enumerate(("fp32", "bf16")):
        ref = _load_v26(f"v26_L1_statistics_md5_{variant}")["Functional.linear.0.forward"]
        mine = got[f"Functional.linear.{i}.forward"]
        assert [a["md5"] for a in mine["input_args"]] == [a["md5"] for a in ref["input_args"]]
        assert [a["md5"] for a in mine["output"]] == [a["md5"] for a in ref["output"]]
        assert mine["output"][0]["dtype"] == ref["output"][0]["dtype"]
    assert got["Functional.linear.0.forward"]["input_args"][0]["md5"] == f"{zlib.crc32(x.numpy()):08x}"


def test_tiny_model_values_and_schema_match_msprobe_833(make_debugger, dump_dir):
    tm = _tiny_model()
    with open(MSPROBE_833) as f:
        ref_doc = json.load(f)
    model, x, y = tm.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = make_debugger()
    dbg.start()
    tm.train_step(model, opt, x, y)
    dbg.stop()
    dbg.step()
    with open(os.path.join(dump_dir, "step0", "rank", "dump.json")) as f:
        doc = json.load(f)
    # msprobe's header, plus the precision settings the run had and whether its step finished
    # (keys msprobe's readers skip)
    assert {k: v for k, v in doc.items() if k not in ("data", "math_modes", "complete")} == \
        {k: v for k, v in ref_doc.items() if k != "data"}
    assert doc["complete"] is True
    assert doc["math_modes"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    for name, ref in ref_doc["data"].items():
        if name not in doc["data"]:
            continue
        mine = doc["data"][name]
        if name.endswith(".forward"):
            assert set(mine) == set(ref) - {"is_recompute"}, name
            # the tensors, in call order (how they split into args/kwargs: see the next test)
            _same_values(_tensors([mine["input_args"], mine["input_kwargs"]]),
                         _tensors([ref["input_args"], ref["input_kwargs"]]), name)
            _same_values(mine["output"], ref["output"], name)
        else:  # grads w.r.t. inputs are in argument order here, autograd-node order in msprobe
            assert set(mine) == set(ref) == {"input", "output"}
            _same_values(mine["input"], ref["input"], name)


def test_tiny_model_argument_layout_matches_msprobe_833(make_debugger, dump_dir):
    tm = _tiny_model()
    with open(MSPROBE_833) as f:
        ref = json.load(f)["data"]
    model, x, y = tm.make()
    dbg = make_debugger()
    dbg.start()
    tm.train_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y)
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    layout = {n: (_types(e["input_args"]), _types(e["input_kwargs"])) for n, e in data.items() if n.endswith("forward")}
    expected = {n: (_types(e["input_args"]), _types(e["input_kwargs"])) for n, e in ref.items() if n in layout}
    assert layout == expected


def _types(v):
    if isinstance(v, dict) and "type" in v:
        return v["type"]
    if isinstance(v, dict):
        return {k: _types(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_types(x) for x in v]
    return v


def _tensors(v):
    if isinstance(v, dict) and v.get("type") == "torch.Tensor":
        return [v]
    if isinstance(v, dict):
        v = list(v.values())
    if isinstance(v, list):
        return [t for x in v for t in _tensors(x)]
    return []


def _same_values(mine, ref, where):
    if isinstance(ref, dict) and ref.get("type") == "torch.Tensor":
        for key in ("type", "dtype", "shape", "requires_grad"):
            assert mine[key] == ref[key], (where, key)
        for key in ("Max", "Min", "Mean", "Norm"):
            assert mine[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), (where, key)
    elif isinstance(ref, dict):
        assert set(mine) == set(ref), where
        for k in ref:
            _same_values(mine[k], ref[k], where)
    elif isinstance(ref, list):
        assert len(mine) == len(ref), where
        for a, b in zip(mine, ref):
            _same_values(a, b, where)
    else:
        assert mine == ref, where


def test_non_tensor_arguments(dump_once):
    x = torch.randn(2, 3, 4)

    def run():
        x[1:, ..., None]
        x.sum(dim=1, keepdim=True)
        x.to(torch.float64)
        x.reshape(torch.Size([6, 4]))
        torch.clamp(x, min=-0.5, max=None)
        F.dropout(x, p=0.0, training=False)

    data, _ = dump_once(run)
    getitem = data["Tensor.__getitem__.0.forward"]["input_args"][1]
    assert getitem == [{"type": "slice", "value": [1, None, None]}, {"type": "ellipsis", "value": "..."}, None]
    assert data["Tensor.sum.0.forward"]["input_kwargs"] == {"dim": {"type": "int", "value": 1},
                                                             "keepdim": {"type": "bool", "value": True}}
    assert data["Tensor.to.0.forward"]["input_args"][1] == {"type": "torch.dtype", "value": "torch.float64"}
    assert data["Torch.clamp.0.forward"]["input_kwargs"] == {"min": {"type": "float", "value": -0.5}, "max": None}
    assert data["Functional.dropout.0.forward"]["input_kwargs"]["p"] == {"type": "float", "value": 0.0}


def test_python_level_apis_are_recorded_as_written(dump_once):
    """torch re-packs a Python-level API's arguments (``F.layer_norm`` gets its weight as a
    keyword, ``F.embedding`` its keywords positionally); entries keep the user's layout,
    keyword order included, each call site its own, however often it runs."""
    x, w, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    idx, table = torch.tensor([0, 2]), torch.randn(5, 4)

    def run():
        for _ in range(2):
            F.layer_norm(x, (4,), w, b, 1e-5)
            F.layer_norm(x, (4,), eps=1e-3, bias=b, weight=w)
            F.embedding(weight=table, input=idx)
            F.softmax(x, dim=-1)

    data, _ = dump_once(run)
    for n in (0, 2):
        positional = data[f"Functional.layer_norm.{n}.forward"]
        assert len(positional["input_args"]) == 5 and positional["input_kwargs"] == {}
        assert positional["input_args"][4] == {"type": "float", "value": 1e-5}
        keywords = data[f"Functional.layer_norm.{n + 1}.forward"]
        assert len(keywords["input_args"]) == 2 and list(keywords["input_kwargs"]) == ["eps", "bias", "weight"]
        assert keywords["input_kwargs"]["eps"] == {"type": "float", "value": 1e-3}
    for n in (0, 1):
        embedding = data[f"Functional.embedding.{n}.forward"]
        assert embedding["input_args"] == [] and list(embedding["input_kwargs"]) == ["weight", "input"]
        assert embedding["input_kwargs"]["weight"]["shape"] == [5, 4]
        assert list(data[f"Functional.softmax.{n}.forward"]["input_kwargs"]) == ["dim"]


def test_torch_size_argument(dump_once):
    x = torch.randn(2, 3, 4)
    data, _ = dump_once(lambda: x.reshape(torch.Size([6, 4])))
    assert data["Tensor.reshape.0.forward"]["input_args"][1] == {"type": "torch.Size", "value": [6, 4]}


def test_tensor_task_writes_npy_files(make_debugger, dump_dir):
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(3, 6).to(torch.bfloat16)
    dbg = make_debugger(task="tensor")
    dbg.start()
    y = torch.tanh(x)
    z = F.linear(y.to(torch.bfloat16), w)
    z.float().sum().backward()
    dbg.stop()
    dbg.step()
    rank_dir = os.path.join(dump_dir, "step0", "rank")
    with open(os.path.join(rank_dir, "dump.json")) as f:
        doc = json.load(f)
    assert doc["task"] == "tensor" and doc["dump_data_dir"] == os.path.join(rank_dir, "dump_tensor_data")
    data = doc["data"]
    files = sorted(os.listdir(os.path.join(rank_dir, "dump_tensor_data")))
    named = []
    for name, entry in data.items():
        for part, values in entry.items():
            for i, s in enumerate(values if isinstance(values, list) else values.values()):
                if isinstance(s, dict) and s.get("type") == "torch.Tensor":
                    assert s["data_name"] == f"{name}.{part.replace('_args', '')}.{i}.npy"
                    named.append(s["data_name"])
    assert sorted(named) == files
    tanh_in = np.load(os.path.join(rank_dir, "dump_tensor_data", "Torch.tanh.0.forward.input.0.npy"))
    assert np.array_equal(tanh_in, x.detach().numpy())
    lin = data["Functional.linear.0.forward"]
    assert lin["input_args"][1]["dtype"] == "torch.bfloat16"
    w_file = np.load(os.path.join(rank_dir, "dump_tensor_data", lin["input_args"][1]["data_name"]))
    assert w_file.dtype == np.float32 and np.array_equal(w_file, w.float().numpy())
    g = np.load(os.path.join(rank_dir, "dump_tensor_data", "Torch.tanh.0.backward.output.0.npy"))
    assert np.array_equal(g, x.grad.numpy())


@pytest.fixture(params=["compiled", "python"])
def stack_keys(request, monkeypatch):
    """The stack table's keys from the compiled extension or from Python: same stacks."""
    from probe.dump import stack
    if request.param == "python":
        monkeypatch.setattr(stack, "_frame_key", None)
    elif stack._frame_key is None:
        pytest.skip("probe.dump._cstack was not built (no C compiler)")
    return request.param


def test_layout_stack_and_construct(make_debugger, dump_dir, stack_keys):
    x = torch.randn(3, requires_grad=True)
    dbg = make_debugger()
    dbg.start()
    y = torch.exp(x)  # the line stack.json must point at
    y = F.relu(y)
    y.sum().backward()
    dbg.stop()
    dbg.step()
    assert os.listdir(os.path.join(dump_dir, "step0")) == ["rank"]
    assert sorted(os.listdir(os.path.join(dump_dir, "step0", "rank"))) == ["construct.json", "dump.json", "stack.json"]
    assert load_dump(dump_dir, name="construct.json") == {}
    stack = load_dump(dump_dir, name="stack.json")
    by_name = {n: frames for names, frames in stack.values() for n in names}
    forwards = [n for n in load_dump(dump_dir) if n.endswith(".forward")]
    assert set(by_name) == set(forwards)
    frames = by_name["Torch.exp.0.forward"]
    assert frames[0].startswith(f"File {__file__}, line ") and "in test_layout_stack_and_construct" in frames[0]
    assert frames[0].endswith("y = torch.exp(x)  # the line stack.json must point at")
    for frames in by_name.values():
        for frame in frames:
            assert PROBE_DIR not in frame and "torch/overrides.py" not in frame, frame


def test_stack_json_groups_the_calls_of_one_line(make_debugger, dump_dir, stack_keys):
    """Every API called from one line has the same stack, whichever way probe saw the call
    (function mode, operator, patched dunder): one stack.json group, as msprobe groups."""
    x = torch.randn(4, requires_grad=True)
    dbg = make_debugger()
    dbg.start()
    for _ in range(2):
        y = torch.exp(x) * torch.sin(x) + (2 * x)  # five APIs, one line
    y = F.relu(y)
    dbg.stop()
    dbg.step()
    stack = load_dump(dump_dir, name="stack.json")
    groups = sorted(sorted(names) for names, _ in stack.values())
    line = sorted(f"{api}.{n}.forward" for api in ("Torch.exp", "Torch.sin", "Tensor.__mul__",
                                                   "Tensor.__rmul__", "Tensor.__add__") for n in (0, 1))
    assert groups == sorted([line, ["Functional.relu.0.forward"]])
    (frames,) = [f for names, f in stack.values() if "Torch.exp.0.forward" in names]
    assert frames[0].endswith("# five APIs, one line")


def _load_v26(name):
    base = os.path.join(FIXTURES, "msprobe", name, "step0")
    (proc,) = os.listdir(base)
    with open(os.path.join(base, proc, "dump.json")) as f:
        return json.load(f)["data"]


def _cfg(dump_dir, task, section):
    path = os.path.join(dump_dir, "cfg.json")
    with open(path, "w") as f:
        json.dump({"task": task, "dump_path": dump_dir, "level": "L1", task: section}, f)
    return path


def test_unusual_layouts_and_dtypes_dump_their_values(dump_once, dump_dir):
    """Negative-bit and conjugate views, half and integer tensors: statistics and tensor
    files hold the values the tensor reads as, whichever copy path each one takes."""
    base = torch.randn(3, 4)
    z = torch.complex(torch.randn(5), torch.randn(5))
    cases = [torch._neg_view(base), base.t(), z.conj(), torch.randn(6).half(),
             torch.randn(6).bfloat16(), torch.arange(7, dtype=torch.int16), torch.randn(4) > 0]
    data, _ = dump_once(lambda: [torch.clone(t) for t in cases], task="tensor")
    folder = os.path.join(dump_dir, "step0", "rank", "dump_tensor_data")
    for i, case in enumerate(cases):
        summary = data[f"Torch.clone.{i}.forward"]["input_args"][0]
        saved = np.load(os.path.join(folder, summary["data_name"]), allow_pickle=False)
        want = case.resolve_conj().resolve_neg()
        want = want.float() if want.dtype == torch.bfloat16 else want
        assert torch.equal(torch.from_numpy(saved), want), i
        if not case.is_complex():
            assert_summary(summary, case)


def test_stack_json_text_is_the_json_of_its_table(make_debugger, dump_dir):
    """stack.json is written from frames encoded once per stack: the same text as encoding
    the table whole, and it parses back to the table."""
    from probe.dump.encode import stack_text
    tm = _tiny_model()
    model, x, y = tm.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = make_debugger()
    for step in range(2):   # the second step reuses every stack
        dbg.start()
        tm.train_step(model, opt, x, y)
        dbg.stop()
        stacks = dbg._collector.stacks
        table = stacks.to_json()
        assert len(table) > 5
        assert json.loads(stack_text(stacks.parts())) == table
        dbg.step()
        assert load_dump(dump_dir, step, name="stack.json") == table


def _exp_of(x):
    return torch.exp(x)  # the shared frame: naïve «helper» line


def test_stack_frames_shared_between_stacks_are_each_stacks_own_lines(make_debugger, dump_dir, stack_keys):
    """Stacks through one helper from two call sites share its frame (formatted once per
    table): each stack still names its own caller's line, and each stack's text is
    exactly ``json.dumps`` of its frames (non-ASCII source escaped as before)."""
    x = torch.randn(3)
    dbg = make_debugger()
    dbg.start()
    _exp_of(x)  # first call site
    _exp_of(x)  # second call site
    dbg.stop()
    table = dbg._collector.stacks
    texts = {names[0]: text for names, text in table.parts()}
    dbg.step()
    stack = load_dump(dump_dir, name="stack.json")
    by_name = {n: frames for names, frames in stack.values() for n in names}
    first, second = by_name["Torch.exp.0.forward"], by_name["Torch.exp.1.forward"]
    assert first[0] == second[0] and first[0].endswith("naïve «helper» line")
    assert first[1].endswith("# first call site") and second[1].endswith("# second call site")
    assert first[2:] == second[2:]
    for name, frames in by_name.items():
        assert texts[name] == json.dumps(frames), name
