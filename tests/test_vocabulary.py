"""The dump's vocabulary (probe/vocabulary.py): one parser of entry names for every reader,
the statistic keys the dump writes, the compare's columns."""
import pytest

from probe import vocabulary as v
from probe.vocabulary import EntryName, parse_entry_name


@pytest.mark.parametrize("name, parsed", [
    ("Functional.linear.3.forward", EntryName("Functional", "linear", 3, "forward")),
    ("Torch.linalg.norm.0.backward", EntryName("Torch", "linalg.norm", 0, "backward")),
    ("Aten.mm.default.12.forward", EntryName("Aten", "mm.default", 12, "forward")),
    ("Tensor.__getitem__.0.forward.input.1.0", EntryName("Tensor", "__getitem__", 0, "forward", "input", "1.0")),
    ("Functional.dropout.0.forward.input.p", EntryName("Functional", "dropout", 0, "forward", "input", "p")),
    ("Module.blocks.0.fc1.Linear.forward.0", EntryName("Module", "blocks.0.fc1.Linear", 0, "forward")),
    ("Module.blocks.0.fc1.Linear.backward.2.output.0",
     EntryName("Module", "blocks.0.fc1.Linear", 2, "backward", "output", "0")),
    ("Module.attn.output.dense.Linear.forward.0.parameters.weight",      # a submodule called "output"
     EntryName("Module", "attn.output.dense.Linear", 0, "forward", "parameters", "weight")),
    ("Module.a.Linear.parameters_grad", EntryName("Module", "a.Linear", None, "parameters_grad")),
    ("Module.a.Linear.parameters_grad.1", EntryName("Module", "a.Linear", 1, "parameters_grad")),
    ("Module.a.Linear.parameters_grad.1.weight",
     EntryName("Module", "a.Linear", 1, "parameters_grad", "parameters_grad", "weight")),
    ("Functional.linear.0", EntryName("Functional", "linear", 0, "")),
    ("Module.a.Linear.0", EntryName("Module", "a.Linear", 0, "")),
])
def test_parse(name, parsed):
    assert parse_entry_name(name) == parsed


@pytest.mark.parametrize("name", ["", "linear", "Functional.linear", "Functional.linear.forward",
                                  "Functional..0.forward", "optimizer", "Functional.linear.0.forward.input",
                                  "1x.linear.0.forward"])
def test_not_names(name):
    assert parse_entry_name(name) is None


def test_derived_names():
    assert v.entry_key("Functional.linear.3.forward") == "Functional.linear.forward"
    assert v.entry_key("Module.a.Linear.forward.2") == "Module.a.Linear.forward"
    assert v.entry_key("Module.a.Linear.parameters_grad.0") == "Module.a.Linear.parameters_grad"
    assert v.entry_key("odd") == "odd"
    assert v.scope_key("Functional.linear.0.forward") == "Functional.linear.0"
    assert v.scope_key("Module.a.Linear.backward.0") == "Module.a.Linear.0"
    assert v.scope_key("Functional.linear.0") == "Functional.linear.0"
    assert v.module_label("Module.blocks.0.fc1.Linear.forward.0") == "blocks.0.fc1 (Linear)"
    assert v.module_label("optimizer") == "optimizer"
    assert v.module_label(None) is None
    assert v.forward_of("Torch.sum.1.backward") == "Torch.sum.1.forward"
    assert v.forward_of("Module.a.Linear.backward.0") == "Module.a.Linear.forward.0"
    assert v.forward_of("Torch.sum.1.forward") is None
    assert v.backward_of("Module.a.Linear.forward.0") == "Module.a.Linear.backward.0"
    assert v.direction("Functional.linear.0.backward.output.0") == "backward"
    assert v.direction("nothing") == ""
    assert v.api_name("Module.a.Linear.forward.0") is None
    assert v.api_name("Functional.linear.0.forward").leaf == "linear"
    n = parse_entry_name("Module.blocks.0.fc1.Linear.forward.0.input.0")
    assert (n.module_path, n.module_class, n.entry, n.base) == \
        ("blocks.0.fc1", "Linear", "Module.blocks.0.fc1.Linear.forward.0", "Module.blocks.0.fc1.Linear.0")


def test_the_c_summary_writes_the_statistic_keys_in_order():
    torch = pytest.importorskip("torch")
    from probe.dump import stats
    t = torch.arange(6, dtype=torch.float32)
    s = stats.SummaryCache().summary(t)
    if s is None:
        pytest.skip("the C statistics extension is not built")
    keys = [k for k in s if k in v.STAT_KEYS]
    assert tuple(keys) == v.STAT_KEYS


def test_columns_come_from_the_statistics():
    assert v.STAT_COLUMNS == ["NPU max", "NPU min", "NPU mean", "NPU l2norm",
                              "Bench max", "Bench min", "Bench mean", "Bench l2norm"]
    assert v.STAT_DIFFS[:4] == ["Max diff", "Min diff", "Mean diff", "L2norm diff"]
    cols = v.columns_for("statistics", stack_mode=True)
    assert cols.index("NPU_Stack_Info") == cols.index("Err_message") + 1 and cols[-1] == "Match"


def test_the_fast_path_answers_as_the_grammar_whatever_came_before():
    """An API call's name is read from its end, its base (Prefix.api) checked once per API;
    a name whose base the fast path refuses goes the general way. The answers do not
    depend on which names were parsed before (the per-API memo)."""
    names = ["Functional.linear.3.forward", "Functional.linear.x.forward", "Functional..0.forward",
             "Functional.a..b.0.forward", "Functional.a.forward.b.0.forward", "Tensor.add.forward.0.forward",
             "Module.a.Linear.0.forward", "1x.linear.0.forward", "Functional.linear.3.forward.input.0",
             "Functional.linear.", "Torch.linalg.norm.0.backward", "Functional.linear.0.backward"]
    cold = [parse_entry_name(n) for n in names]
    warm = [parse_entry_name(n) for n in reversed(names)][::-1]
    assert cold == warm
    assert cold[0] == EntryName("Functional", "linear", 3, "forward")
    assert cold[1] is None and cold[2] is None and cold[3] is None and cold[7] is None
    assert cold[5] == EntryName("Tensor", "add.forward", 0, "forward")
    assert cold[8] == EntryName("Functional", "linear", 3, "forward", "input", "0")
    assert cold[10] == EntryName("Torch", "linalg.norm", 0, "backward")
