"""Entry names and counters (issue #2, items 3 and 4): what is seen, and how it is named.

The reference is msprobe 8.3.3's own L1 dump of the same tiny-model run
(tests/fixtures/msprobe/v833_L1_statistics_fp32), not probe's output.
"""
import gc
import importlib.util
import json
import logging
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES, load_dump
from torch.nn.functional import gelu  # imported before start(): must still be seen

MSPROBE_833 = os.path.join(FIXTURES, "msprobe", "v833_L1_statistics_fp32", "step0", "rank", "dump.json")
# APIs one of the two tools records and the other does not, for this run. msprobe 8.3.3
# records torch.ones_like called inside Tensor.backward; probe's function mode cannot
# see it (26.2 does not record it either).
ONLY_MSPROBE = {"Torch.ones_like.0.forward"}
ONLY_PROBE = set()


def _tiny_model():
    spec = importlib.util.spec_from_file_location("tiny_model", os.path.join(FIXTURES, "dump", "tiny_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_model_names_match_msprobe_833(make_debugger, dump_dir):
    tm = _tiny_model()
    with open(MSPROBE_833) as f:
        expected = [n for n in json.load(f)["data"] if n not in ONLY_MSPROBE]
    model, x, y = tm.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = make_debugger()
    for _ in range(2):
        dbg.start()
        tm.train_step(model, opt, x, y)
        dbg.stop()
        dbg.step()
    for step in (0, 1):  # counters restart at step(): both steps carry the same names
        got = [n for n in load_dump(dump_dir, step) if n not in ONLY_PROBE]
        assert got == expected, f"step {step}"


def test_operators_and_methods_keep_msprobe_names(dump_once):
    a = torch.randn(3, 4)
    b = torch.randn(3, 4)
    bt = torch.randn(4, 3)
    idx = torch.tensor([0, 2])

    def run():
        c = a + b
        a + b
        a.add(b)
        torch.add(a, b)
        c += b
        2 * a
        a @ bt
        a[0]
        a[idx]
        -a
        a.sum()
        torch.sum(a)
        F.relu(a)
        c.relu_()

    data, _ = dump_once(run)
    assert list(data) == [
        "Tensor.__add__.0.forward", "Tensor.__add__.1.forward", "Tensor.add.0.forward",
        "Torch.add.0.forward", "Tensor.__iadd__.0.forward", "Tensor.__rmul__.0.forward",
        "Tensor.__matmul__.0.forward", "Tensor.__getitem__.0.forward", "Tensor.__getitem__.1.forward",
        "Tensor.__neg__.0.forward", "Tensor.sum.0.forward", "Torch.sum.0.forward",
        "Functional.relu.0.forward", "Tensor.relu_.0.forward"]
    # argument values are recorded too: 2 * a is Tensor.__rmul__(a, 2), a[0] gets the int 0
    assert data["Tensor.__rmul__.0.forward"]["input_args"][1] == {"type": "int", "value": 2}
    assert data["Tensor.__getitem__.0.forward"]["input_args"][1] == {"type": "int", "value": 0}


def test_python_level_and_aliased_dunders_keep_their_names(dump_once):
    """Some dunders are seen by the function mode as themselves (no patch needed), others
    share an implementation (2 / a is __rtruediv__, an alias of __rdiv__; abs(a) is
    Tensor.abs): each must still get its own msprobe name."""
    a = torch.randn(3, 3)

    def run():
        1 - a
        a // 2
        2 ** a
        2 / a
        abs(a)
        a.abs()
        b = a.clone()
        b[0] = 1.0

    data, _ = dump_once(run)
    assert list(data) == [
        "Tensor.__rsub__.0.forward", "Tensor.__floordiv__.0.forward", "Tensor.__rpow__.0.forward",
        "Tensor.__rtruediv__.0.forward", "Tensor.__abs__.0.forward", "Tensor.abs.0.forward",
        "Tensor.clone.0.forward", "Tensor.__setitem__.0.forward"]


def test_alias_imported_before_start_is_seen_and_identity_holds(dump_once):
    act = F.gelu
    x = torch.randn(4)

    def run():
        checks = (act is F.gelu, gelu is F.gelu, torch.nn.functional.gelu is gelu)
        y = gelu(x) if act is F.gelu else None
        return checks, y

    data, (checks, y) = dump_once(run)
    assert checks == (True, True, True)
    assert torch.equal(y, F.gelu(x))
    assert "Functional.gelu.0.forward" in data


def test_only_the_outermost_registered_call_is_dumped(dump_once):
    x = torch.randn(2, 6)
    w = torch.ones(6)

    def run():
        F.layer_norm(x, (6,), w)    # calls torch.layer_norm inside
        F.softmax(x, dim=-1)        # calls Tensor.softmax inside
        F.normalize(x, dim=-1)      # Tensor.norm, clamp_min, expand_as, __truediv__ inside

    data, _ = dump_once(run)
    assert list(data) == ["Functional.layer_norm.0.forward", "Functional.softmax.0.forward",
                          "Functional.normalize.0.forward"]


def test_nothing_is_intercepted_after_stop(make_debugger, dump_dir):
    tensor_attrs = dict(vars(torch.Tensor))
    functional = dict(vars(F))
    dbg = make_debugger()
    x = torch.randn(3)
    dbg.start()
    x + x
    dbg.stop()
    assert torch._C._len_torch_function_stack() == 0
    assert dict(vars(F)) == functional                         # torch.nn.functional never replaced
    x + x                                                      # not recorded, not counted
    F.relu(x)
    dbg.start()
    x + x
    dbg.stop()
    dbg.step()
    assert list(load_dump(dump_dir)) == ["Tensor.__add__.0.forward", "Tensor.__add__.1.forward"]
    dbg.close()
    assert dict(vars(torch.Tensor)) == tensor_attrs            # every dunder restored, same objects


def test_a_users_own_function_mode_sees_only_the_users_calls(make_debugger, dump_dir):
    """probe's own tensor work (statistics, detach, grad hooks) must not reach a mode the
    user entered (a FLOP counter, a fault injector): it sees what it sees without probe."""
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    def run(dbg):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3)
        x = torch.randn(2, 4, requires_grad=True)
        with Recorder() as rec:
            if dbg:
                dbg.start()
            y = F.gelu(lin(x)) + x[:, :3]                    # a Functional call and operators
            y.sum().backward()
            if dbg:
                dbg.stop()
        return rec.seen, y.detach(), x.grad

    seen_off, y_off, g_off = run(None)
    dbg = make_debugger()
    seen_on, y_on, g_on = run(dbg)
    dbg.step()
    assert "Functional.gelu.0.forward" in load_dump(dump_dir)
    assert seen_on == seen_off, (str(seen_on), seen_off)
    assert torch.equal(y_on, y_off) and torch.equal(g_on, g_off)


def test_tensor_dunders_pass_through_between_steps_and_are_the_originals_after_close(make_debugger, dump_dir):
    dbg = make_debugger()     # closes the debugger before it, which removes its patches
    gc.collect()              # and debuggers dropped without close() give theirs back
    tensor_attrs = dict(vars(torch.Tensor))
    x = torch.randn(3)
    for _ in range(2):
        dbg.start()
        2 * x
        dbg.stop()
        assert vars(torch.Tensor).get("__rmul__") is not tensor_attrs.get("__rmul__")
        y = 2 * x + abs(x) + (1 + x)    # between steps: patched, not recorded
        dbg.step()
    assert list(load_dump(dump_dir, 1)) == ["Tensor.__rmul__.0.forward"]
    assert torch.equal(y, torch.mul(x, 2) + torch.abs(x) + torch.add(x, 1))
    dbg.close()
    assert dict(vars(torch.Tensor)) == tensor_attrs


def test_a_debugger_made_while_another_keeps_its_patches_still_names_reflected_operators(tmp_path):
    """The registry is resolved before the previous debugger is closed, with its patched
    dunders still installed: ``2 * x`` must still be told from ``x * 2``."""
    from probe import PrecisionDebugger
    x = torch.randn(3)
    for i in range(2):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / str(i)))
        dbg.start()
        x * 2
        2 * x
        dbg.stop()
        dbg.step()
        assert list(load_dump(tmp_path / str(i))) == ["Tensor.__mul__.0.forward", "Tensor.__rmul__.0.forward"]
    dbg.close()


def test_counters_restart_each_step_and_unlisted_steps_are_skipped(make_debugger, dump_dir):
    dbg = make_debugger(step=[1, "3-4"])
    x = torch.randn(3)
    for _ in range(5):
        dbg.start()
        for _ in range(2):
            torch.exp(x)
        dbg.stop()
        dbg.step()
    dbg.close()
    assert sorted(d for d in os.listdir(dump_dir) if not d.startswith(".")) == ["step1", "step3", "step4"]
    for step in (1, 3, 4):
        assert list(load_dump(dump_dir, step)) == ["Torch.exp.0.forward", "Torch.exp.1.forward"]


def test_hook_error_logged_once_per_api_and_result_returned(dump_once, monkeypatch, caplog):
    import probe.dump.stats as stats

    def broken(*args):
        raise RuntimeError("summary exploded")

    monkeypatch.setattr(stats, "reductions", broken)   # both summary paths fail
    monkeypatch.setattr(stats.SummaryCache, "summary", broken)
    x = torch.randn(5)

    def run():
        return [torch.exp(x) for _ in range(3)] + [torch.sin(x) for _ in range(2)]

    with caplog.at_level(logging.WARNING, logger="probe"):
        _, outs = dump_once(run)
    assert all(torch.equal(o, torch.exp(x)) for o in outs[:3])
    assert all(torch.equal(o, torch.sin(x)) for o in outs[3:])
    msgs = [r.getMessage() for r in caplog.records if "summary exploded" in r.getMessage()]
    assert len(msgs) == 2 and any("Torch.exp" in m for m in msgs) and any("Torch.sin" in m for m in msgs)


def test_error_raised_by_the_api_itself_propagates_unchanged(dump_once):
    def run():
        with pytest.raises(RuntimeError, match="size of tensor"):
            torch.randn(2) + torch.randn(3)
        return torch.exp(torch.zeros(1))

    data, out = dump_once(run)
    assert torch.equal(out, torch.ones(1))
    assert "Torch.exp.0.forward" in data


def test_list_filter_and_data_mode(make_debugger, dump_dir):
    x = torch.randn(3, requires_grad=True)
    dbg = make_debugger(config_path=_cfg(dump_dir, {"list": ["relu", "Torch.exp.1"],
                                                    "data_mode": ["backward"]}))
    dbg.start()
    y = F.relu(x) + torch.exp(x) + torch.exp(x)
    y.sum().backward()
    dbg.stop()
    dbg.step()
    assert sorted(load_dump(dump_dir)) == ["Functional.relu.0.backward", "Torch.exp.1.backward"]


def test_scope_filter(make_debugger, dump_dir):
    x = torch.randn(3)
    dbg = make_debugger(config_path=_cfg(dump_dir, {"scope": ["Torch.sin.0.forward", "Torch.cos.1.forward"]}))
    dbg.start()
    torch.cos(x); torch.sin(x); torch.exp(x); torch.cos(x); torch.cos(x)
    dbg.stop()
    dbg.step()
    assert list(load_dump(dump_dir)) == ["Torch.sin.0.forward", "Torch.exp.0.forward", "Torch.cos.1.forward"]


def _cfg(dump_dir, section, task="statistics"):
    path = os.path.join(dump_dir, "cfg.json")
    with open(path, "w") as f:
        json.dump({"task": task, "dump_path": dump_dir, "level": "L1", task: section}, f)
    return path
