"""Operators get msprobe's dunder names, read from the instruction that ran them (issue #2, item 3).

One generated case per operator dunder of the registry, as torch/overrides' tests do: the
operator written as source (so the call site is real bytecode) is named ``Tensor.__x__``,
and the method it runs, called as a method, keeps the method's name.
"""
import gc

import pytest
import torch
from conftest import load_dump

from probe.hook_module import operators
from probe.hook_module.registry import DEFAULT_YAML, load_registry, resolve
from probe.torch_compat import indexing_reaches_function_modes

RESOLVED = resolve(load_registry(None))
REGISTERED = {name[len("Tensor."):] for name in list(RESOLVED.by_func.values()) + list(RESOLVED.dunders.values())
              if name.startswith("Tensor.__")}
BINARY = {d: s for d, s in operators.SYMBOLS.items() if not s.startswith("u")}
CASES = sorted(d for d in operators.SYMBOLS if d in REGISTERED and d != "__rmatmul__")


def _source(dunder):
    """Python source that runs ``dunder`` through its operator, on tensors a, b (or ints i, j)."""
    symbol = operators.SYMBOLS[dunder]
    x, y = ("i", "j") if dunder in operators._BITWISE else ("a", "b")
    if symbol.startswith("u"):
        return f"r = {symbol[1:]}{x}"
    if symbol.endswith("=") and symbol not in ("==", "!=", "<=", ">="):
        return f"{x}_inplace {symbol} {y}"
    if dunder.startswith("__r") and dunder != "__rshift__":
        return f"r = 2 {symbol} {x}"
    return f"r = {x} {symbol} {y}"


def _tensors():
    a = torch.rand(3, 3) + 1
    i = torch.tensor([[1, 2, 3]] * 3)
    return {"a": a, "b": torch.rand(3, 3) + 1, "i": i, "j": torch.tensor([[3, 1, 2]] * 3),
            "a_inplace": a.clone(), "i_inplace": i.clone()}


def _run_source(dump_once, source):
    ns = _tensors()
    exec(compile(f"def run():\n    global a_inplace, i_inplace\n    {source}\n", "<user code>", "exec"), ns)
    data, _ = dump_once(ns["run"])
    return list(data)


@pytest.mark.parametrize("dunder", CASES)
def test_operator_is_named_as_its_dunder(dump_once, dunder):
    assert _run_source(dump_once, _source(dunder)) == [f"Tensor.{dunder}.0.forward"]


BY_SITE = {name: impl for impl, table in RESOLVED.operators.by_impl.items() for name in table.values() if name}


# (Tensor.__pow__'s implementation is a Python wrapper that no method name reaches)
@pytest.mark.parametrize("dunder", sorted(d for d in CASES if RESOLVED.by_func.get(BY_SITE.get(f"Tensor.{d}"))))
def test_the_method_an_operator_runs_keeps_its_own_name(dump_once, dunder):
    """``a.add(b)`` is Tensor.add even though ``a + b`` reaches the mode as the same function."""
    impl = BY_SITE[f"Tensor.{dunder}"]
    method = RESOLVED.by_func[impl]
    attr = method.split(".", 1)[1]
    x, y = ("i", "j") if dunder in operators._BITWISE else ("a", "b")
    arg = "" if operators.SYMBOLS[dunder].startswith("u") else y
    target = f"{x}_inplace" if attr.endswith("_") else x
    assert _run_source(dump_once, f"r = {target}.{attr}({arg})") == [f"{method}.0.forward"]


def test_operators_inside_torch_wrappers_and_comprehensions(dump_once):
    """``a ** 2`` reaches the mode from torch's Python wrapper (skipped to find the user's
    line); operators in nested code objects are read from their own bytecode."""
    source = "r = [x ** 2 for x in (a, b)]; s = (lambda t: -t)(a); u = sum([a, b])"
    names = _run_source(dump_once, source)
    assert names[:3] == ["Tensor.__pow__.0.forward", "Tensor.__pow__.1.forward", "Tensor.__neg__.0.forward"]
    # builtin sum: 0 + a is the patched __radd__; a + b inside sum() has no operator instruction
    assert names[3:] == ["Tensor.__radd__.0.forward", "Tensor.add.0.forward"]


def test_deleting_an_operator_stops_its_dump_but_not_its_methods(tmp_path, make_debugger, dump_dir):
    with open(DEFAULT_YAML, encoding="utf-8") as f:
        text = f.read().replace("\n  - __add__\n", "\n", 1)
    path = tmp_path / "ops.yaml"
    path.write_text(text, encoding="utf-8")
    a, b = torch.randn(3), torch.randn(3)
    dbg = make_debugger(wrap_ops_yaml=str(path))
    dbg.start()
    a + b
    a.add(b)
    dbg.stop()
    dbg.step()
    assert list(load_dump(dump_dir)) == ["Tensor.add.0.forward"]


def test_only_three_tensor_attributes_are_patched_while_dumping(make_debugger):
    """Each setattr on torch.Tensor costs ~15 us and invalidates attribute caches; the
    collectives are patched only once a process group exists."""
    dbg = make_debugger()     # closes the debugger before it, which removes its patches
    gc.collect()              # and debuggers dropped without close() give theirs back
    before = dict(vars(torch.Tensor))
    dist_before = dict(vars(torch.distributed))
    dbg.start()
    changed = {k for k, v in vars(torch.Tensor).items() if before.get(k) is not v}
    dist_changed = {k for k, v in vars(torch.distributed).items() if dist_before.get(k) is not v}
    dbg.close()
    # torch 2.1: indexing reaches no function mode, so it is patched too (torch_compat)
    indexing = set() if indexing_reaches_function_modes() else {"__getitem__", "__setitem__"}
    assert changed == {"__abs__", "__radd__", "__rmul__"} | indexing
    assert dist_changed == set()
    assert dict(vars(torch.Tensor)) == before


def test_implementation_is_found_by_running_the_dunder():
    assert operators.implementation("__add__") is torch.Tensor.add
    assert operators.implementation("__iadd__") is torch.Tensor.add_
    assert operators.implementation("__neg__") is torch.Tensor.neg
    assert operators.implementation("__and__") is torch.Tensor.__and__


def test_a_debugger_dropped_without_close_gives_its_patches_back(dump_dir):
    """Patches stay between steps until close(); a debugger the user drops without
    closing it must not leave them behind."""
    from probe import PrecisionDebugger
    PrecisionDebugger(dump_path=dump_dir).close()   # closes any debugger before this test
    gc.collect()
    before = dict(vars(torch.Tensor))
    dbg = PrecisionDebugger(dump_path=dump_dir)
    dbg.start()
    2 * torch.ones(2)
    dbg.stop()
    dbg.step()
    assert dict(vars(torch.Tensor)) != before
    del dbg
    gc.collect()
    assert dict(vars(torch.Tensor)) == before


def test_an_interceptor_stopped_out_of_order_gets_no_more_calls():
    """A tool stopped while a debugger started after it still runs: the tool's handler
    must see nothing more, the debugger's everything, also through kept patches."""
    from probe.hook_module.interceptor import Interceptor
    from probe.hook_module.registry import load_registry, resolve
    resolved = resolve(load_registry())
    seen = {"tool": [], "debugger": []}

    def handler(who):
        def record(name, func, args, kwargs):
            seen[who].append(name)
            return func(*args, **kwargs)
        return record

    x = torch.ones(2)
    tool, debugger = Interceptor(resolved, handler("tool")), Interceptor(resolved, handler("debugger"))
    tool.start()
    debugger.start()
    tool.stop()
    2 * x
    debugger.stop(keep_patches=True)
    2 * x                                 # between steps: patched, nobody records
    debugger.start()
    2 * x
    debugger.close()
    assert seen == {"tool": [], "debugger": ["Tensor.__rmul__", "Tensor.__rmul__"]}


def test_patches_go_after_the_last_step_to_dump(dump_dir):
    from probe import PrecisionDebugger
    PrecisionDebugger(dump_path=dump_dir).close()   # closes any debugger before this test
    gc.collect()
    before = dict(vars(torch.Tensor))
    dbg = PrecisionDebugger(dump_path=dump_dir, step=[0, 2])
    for step in range(4):
        dbg.start()
        2 * torch.ones(2)
        dbg.stop()
        patched = dict(vars(torch.Tensor)) != before
        assert patched == (step in (0, 2)), step   # kept from a dumped step's start() ...
        dbg.step()
        assert dict(vars(torch.Tensor)) == before, step   # ... to its step(): no dump next
    dbg.close()


def test_on_a_python_whose_instructions_are_not_read_operators_are_named_as_their_method(
        make_debugger, dump_dir, monkeypatch, caplog):
    """On a Python outside ``BYTECODE_PYTHONS`` (forced here on the one that runs the suite)
    ``a + b`` is named as the method it runs, arguments keep torch's dispatch form, the
    reflected ``2 * a`` (a patch, no instruction read) keeps its dunder, and the log says
    so once for every debugger made."""
    from probe import python_compat
    monkeypatch.setattr(python_compat, "READS_BYTECODE", False)
    monkeypatch.setattr(operators, "_fallback_said", [])
    a, b = torch.randn(3), torch.randn(3)
    with caplog.at_level("WARNING", logger="probe"):
        for _ in range(2):
            dbg = make_debugger()
            dbg.start()
            a + b
            2 * a
            torch.nn.functional.softmax(a, -1)
            dbg.stop()
            dbg.step()
    data = load_dump(dump_dir)
    assert list(data) == ["Tensor.add.0.forward", "Tensor.__rmul__.0.forward", "Functional.softmax.0.forward"]
    # dispatch form: softmax(a, -1) arrives as softmax(a, -1, _stacklevel=..., dtype=...)
    assert set(data["Functional.softmax.0.forward"]["input_kwargs"]) >= {"dtype"}
    said = [r.getMessage() for r in caplog.records if "instructions are not ones probe reads" in r.getMessage()]
    assert len(said) == 1 and "Tensor.add" in said[0], said


def test_arguments_are_recorded_as_written_where_instructions_are_read(make_debugger, dump_dir):
    """The counterpart of the fallback above: on a Python probe reads, ``a + b`` is msprobe's
    ``Tensor.__add__`` and ``softmax(a, -1)`` has the two arguments written."""
    a, b = torch.randn(3), torch.randn(3)
    dbg = make_debugger()
    dbg.start()
    a + b
    torch.nn.functional.softmax(a, -1)
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    assert list(data) == ["Tensor.__add__.0.forward", "Functional.softmax.0.forward"]
    assert len(data["Functional.softmax.0.forward"]["input_args"]) == 2
    assert data["Functional.softmax.0.forward"]["input_kwargs"] == {}
