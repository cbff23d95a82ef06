"""Filters at every level (issue #3, item 4): scope, list, data_mode, step; and what a
filtered-out call costs (no statistics, no stack capture)."""
import json

import pytest
from conftest import load_dump
from test_levels_modules import run_tiny


def config(tmp_path, dump_dir, level, **section):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": dump_dir, "level": level,
                                "statistics": section}))
    return str(path)


def forwards(data):
    return [k for k in data if ".forward" in k]


def test_scope_on_module_names_keeps_the_last_module_whole(make_debugger, dump_dir, tmp_path):
    path = config(tmp_path, dump_dir, "L0",
                  scope=["Module.blocks.0.fc2.Linear.forward.0", "Module.blocks.1.Block.forward.0"])
    run_tiny(make_debugger, "L0", steps=1, config_path=path)
    data = load_dump(dump_dir)
    assert forwards(data) == [
        "Module.blocks.0.fc2.Linear.forward.0", "Module.blocks.0.norm.LayerNorm.forward.0",
        "Module.blocks.1.fc1.Linear.forward.0", "Module.blocks.1.act.ReLU.forward.0",
        "Module.blocks.1.fc2.Linear.forward.0", "Module.blocks.1.norm.LayerNorm.forward.0",
        "Module.blocks.1.Block.forward.0"]
    assert "Module.blocks.1.Block.backward.0" in data and "Module.head.Linear.backward.0" not in data


def test_scope_in_mix_spans_apis_and_modules(make_debugger, dump_dir, tmp_path):
    path = config(tmp_path, dump_dir, "mix", scope=["Module.head.Linear.forward.0", "Torch.log.0.forward"])
    run_tiny(make_debugger, "mix", steps=1, config_path=path)
    assert forwards(load_dump(dump_dir)) == [
        "Functional.linear.4.forward", "Module.head.Linear.forward.0", "Functional.softmax.0.forward",
        "Tensor.__add__.2.forward", "Torch.log.0.forward"]


def test_list_matches_module_names_substrings_and_regex(make_debugger, dump_dir, tmp_path):
    path = config(tmp_path, dump_dir, "L0", list=["blocks.1.fc", r"regex(^Module\.head\.)"])
    run_tiny(make_debugger, "L0", steps=1, config_path=path)
    data = load_dump(dump_dir)
    assert set(data) == {
        f"Module.{m}.Linear.{d}" for m in ("blocks.1.fc1", "blocks.1.fc2", "head")
        for d in ("forward.0", "backward.0", "parameters_grad.0")}
    construct = load_dump(dump_dir, name="construct.json")
    assert construct["Module.blocks.1.fc1.Linear.forward.0"] is None   # its parent was filtered out


def test_list_in_mix(make_debugger, dump_dir, tmp_path):
    path = config(tmp_path, dump_dir, "mix", list=["Functional.linear"])
    run_tiny(make_debugger, "mix", steps=1, config_path=path)
    data = load_dump(dump_dir)
    assert data and all(k.startswith("Functional.linear.") for k in data)


def test_list_at_L2(make_debugger, dump_dir, tmp_path):
    path = config(tmp_path, dump_dir, "L2", list=["Aten.mm.", "regex(threshold_backward)"])
    run_tiny(make_debugger, "L2", steps=1, config_path=path)
    data = load_dump(dump_dir)
    assert {k.split(".")[1] for k in data} == {"mm", "threshold_backward"}


@pytest.mark.parametrize("level", ["L0", "L2"])
def test_data_mode_forward_backward(make_debugger, dump_dir, tmp_path, level):
    path = config(tmp_path, dump_dir, level, data_mode=["forward"])
    run_tiny(make_debugger, level, steps=1, config_path=path)
    data = load_dump(dump_dir)
    assert data and not any(".backward" in k or "parameters_grad" in k for k in data)
    if level == "L2":   # no kernel that autograd ran during backward
        assert not any(v.get("api", "").endswith(".backward") for v in data.values())
        assert not any("_backward" in k for k in data)


def test_data_mode_backward_and_input_at_L0(make_debugger, dump_dir, tmp_path):
    path = config(tmp_path, dump_dir, "L0", data_mode=["backward", "input"])
    run_tiny(make_debugger, "L0", steps=1, config_path=path)
    data = load_dump(dump_dir)
    assert data and not any(".forward." in k for k in data)
    backward = [v for k, v in data.items() if ".backward." in k]
    assert backward and all(set(v) == {"input"} for v in backward)
    assert "Module.head.Linear.parameters_grad.0" in data


def test_step_filter_at_L0(make_debugger, dump_dir, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"dump_path": dump_dir, "level": "L0", "step": [1]}))
    run_tiny(make_debugger, "L0", steps=2, config_path=str(path))
    with pytest.raises(FileNotFoundError):
        load_dump(dump_dir, 0)
    data = load_dump(dump_dir, 1)
    assert "Module.blocks.0.fc1.Linear.forward.0" in data     # counters restart each step


@pytest.mark.parametrize("level", ["L0", "mix", "L2"])
def test_filtered_out_calls_cost_no_statistics_and_no_stack(make_debugger, dump_dir, tmp_path, monkeypatch, level):
    """Counting calls of the summary and stack functions: a list that matches nothing
    leaves them uncalled; one module in the list costs that module's tensors only."""
    from probe.dump.entry_builder import EntryBuilder
    from probe.dump.stack import StackTable
    counts = {"summaries": 0, "capture": 0}
    real_summary, real_capture = EntryBuilder.summary, StackTable.capture

    def summary(self, *args):
        counts["summaries"] += 1
        return real_summary(self, *args)

    def capture(self, *args, **kwargs):
        counts["capture"] += 1
        return real_capture(self, *args, **kwargs)
    monkeypatch.setattr(EntryBuilder, "summary", summary)
    monkeypatch.setattr(StackTable, "capture", capture)

    run_tiny(make_debugger, level, steps=1, config_path=config(tmp_path, dump_dir, level, list=["nothing.matches"]))
    assert counts == {"summaries": 0, "capture": 0}
    if level == "L2":
        return
    run_tiny(make_debugger, level, steps=1, config_path=config(tmp_path, dump_dir, level, list=["Module.head."]))
    assert counts["capture"] == 1
    # head: input, output, weight, bias; grads of its output and input; two parameter grads
    assert 0 < counts["summaries"] <= 8
