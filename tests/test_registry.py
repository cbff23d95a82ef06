"""The packaged API registry: every entry resolves or is reported absent, never raises.

One case per (section, name), as torch's own overrides tests generate one case per
overridable function: a renamed or removed torch API shows up as one named failure.
"""
import importlib.util
import os
import re

import pytest
import torch
import torch.nn.functional as F
import yaml

from probe.errors import ConfigError
from probe.hook_module.registry import DEFAULT_YAML, SECTION_PREFIX, load_registry, resolve
from probe.torch_compat import TORCH, indexing_reaches_function_modes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gen_support_wrap_ops.py")

# msprobe's support_wrap_ops.yaml sizes, less what it lists that this torch removed or
# that is deliberately excluded here (see the generator); falling below means lost coverage.
MIN_COUNTS = {"functional": 126, "tensor": 480, "torch": 500, "_VF": 1, "distributed": 18,
              "torch_npu": 100, "aten": 300, "custom": 1}

REGISTRY = load_registry()
# the torch the packaged YAML was generated from (its header says)
with open(DEFAULT_YAML, encoding="utf-8") as _f:
    YAML_TORCH = tuple(int(p) for p in re.search(r"from torch (\d+)\.(\d+)", _f.read(600)).groups())
CASES = [(section, name) for section, names in REGISTRY.ops.items() for name in names]
_OWNERS = {"functional": F, "tensor": torch.Tensor, "torch": torch, "_VF": torch._VF}


@pytest.fixture(scope="module")
def resolved():
    return resolve(REGISTRY)


def _lookup(owner, dotted):
    for part in dotted.split("."):
        owner = getattr(owner, part)
    return owner


@pytest.mark.parametrize("section,name", CASES, ids=[f"{s}.{n}" for s, n in CASES])
def test_entry_resolves_or_is_absent(resolved, section, name):
    if section == "aten":
        assert name in resolved.aten and "." not in name and "::" not in name
        return
    if section == "custom":   # torch.ops namespaces / ops, matched when first called (custom_ops.py)
        assert resolved.custom.every if name == "*" else name in resolved.custom.namespaces | resolved.custom.ops
        return
    if f"{section}.{name}" in resolved.absent:
        return
    full = f"{SECTION_PREFIX[section]}.{name}"
    if section in ("distributed", "torch_npu"):
        assert full in {entry[2] for entry in resolved.patched}
    elif section == "tensor" and name.startswith("__") and name.endswith("__"):
        # patched (C operators report their implementation) or seen as itself (Python-level)
        assert resolved.dunders.get(name) == full or resolved.by_func.get(getattr(torch.Tensor, name)) == full
    else:
        got = resolved.by_func[_lookup(_OWNERS[section], name)]
        # Or named by a higher-priority section: torch.conv2d is F.conv2d, _VF.lstm is torch.lstm.
        assert got == full or got.split(".")[0] in ("Functional", "Torch")


def test_torch_npu_absent_without_torch_npu(resolved):
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu installed")
    assert {f"torch_npu.{n}" for n in REGISTRY.ops["torch_npu"]} <= set(resolved.absent)
    others = [a for a in resolved.absent if not a.startswith("torch_npu.")]
    if TORCH >= YAML_TORCH:
        assert not others
    for item in others:   # an older torch: only APIs it lacks (newer ones the YAML lists)
        section, _, name = item.partition(".")
        with pytest.raises(AttributeError):
            _lookup(_OWNERS[section], name)


def test_yaml_has_every_section_and_header():
    assert set(REGISTRY.ops) == set(SECTION_PREFIX)
    with open(DEFAULT_YAML, encoding="utf-8") as f:
        head = f.read(600)
    assert head.startswith("#") and "gen_support_wrap_ops.py" in head and "delete a line" in head


@pytest.mark.parametrize("section", sorted(MIN_COUNTS))
def test_section_has_msprobe_like_coverage(section):
    assert len(REGISTRY.ops[section]) >= MIN_COUNTS[section]


def test_tiny_model_apis_present(resolved):
    """The fixture model's calls under msprobe's default names."""
    ops = REGISTRY.ops
    assert {"linear", "relu", "layer_norm", "softmax", "nll_loss"} <= set(ops["functional"])
    assert {"__add__", "add_"} <= set(ops["tensor"])
    assert {"log", "ones_like"} <= set(ops["torch"])
    by_func = resolved.by_func
    assert by_func[F.linear] == "Functional.linear"
    assert by_func[F.layer_norm] == "Functional.layer_norm"
    assert by_func[F.softmax] == "Functional.softmax"
    assert by_func[F.nll_loss] == "Functional.nll_loss"
    assert by_func[torch.Tensor.add_] == "Tensor.add_"
    assert by_func[torch.log] == "Torch.log"
    assert by_func[torch.ones_like] == "Torch.ones_like"
    assert {"mm", "addmm", "native_layer_norm", "native_layer_norm_backward",
            "convolution_backward", "_softmax", "threshold_backward"} <= resolved.aten


def test_distinct_objects_get_their_own_names(resolved):
    assert resolved.by_func[F.relu] == "Functional.relu"
    assert resolved.by_func[torch.relu] == "Torch.relu"
    assert resolved.by_func[torch.Tensor.add] == "Tensor.add"
    assert resolved.dunders["__add__"] == "Tensor.__add__"
    if indexing_reaches_function_modes():
        assert resolved.by_func[torch.Tensor.__getitem__] == "Tensor.__getitem__"   # seen as itself
    else:   # torch 2.1: patched
        assert resolved.operators.patched["__getitem__"] == "Tensor.__getitem__"
    assert resolved.by_func[torch.Tensor.__rsub__] == "Tensor.__rsub__" and "__rsub__" not in resolved.dunders
    assert F.conv2d is torch.conv2d
    assert resolved.by_func[F.conv2d] == "Functional.conv2d"
    assert resolved.by_func[torch.linalg.norm] == "Torch.linalg.norm"


def test_bookkeeping_apis_not_dumped():
    ops = REGISTRY.ops
    for name in ("size", "dim", "data_ptr", "is_contiguous", "__torch_function__", "__repr__",
                 "__len__", "__iter__", "__bool__", "__hash__", "__get__", "register_hook",
                 "backward", "requires_grad_", "retain_grad", "item", "tolist", "numpy",
                 "storage", "untyped_storage", "_version"):
        assert name not in ops["tensor"], name
    for name in ("manual_seed", "get_default_dtype", "is_tensor", "is_grad_enabled",
                 "no_grad", "compile"):
        assert name not in ops["torch"], name
    assert [n for n in ops["tensor"] if n.startswith("_") and not n.startswith("__")] == []


# --- load_registry errors: one line, naming the file -------------------------------

def _write(tmp_path, text):
    path = tmp_path / "ops.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("text,what", [
    ("functional: [relu\n", "malformed"),
    ("functional:\n  - relu\n  bad: [\n", "malformed"),
    ("bogus:\n  - relu\n", "unknown section"),
    ("functional: relu\n", "must be a list"),
    ("functional:\n  - relu\n  - [1, 2]\n", "must be a list"),
    ("- relu\n", "mapping"),
])
def test_bad_yaml_is_one_line_config_error(tmp_path, text, what):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_registry(path)
    msg = str(exc.value)
    assert path in msg and what in msg and "\n" not in msg


def test_missing_file_is_config_error(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not found") as exc:
        load_registry(path)
    assert path in str(exc.value) and "\n" not in str(exc.value)


# --- deleting a line removes exactly that API --------------------------------------

def _without(section, name):
    """The packaged YAML text with one ``  - name`` line deleted from ``section``."""
    with open(DEFAULT_YAML, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    current, out, removed = None, [], 0
    for line in lines:
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.rstrip()[:-1]
        if current == section and line.strip() == f"- {name}":
            removed += 1
            continue
        out.append(line)
    assert removed == 1
    return "".join(out)


@pytest.mark.parametrize("section,name,obj", [
    ("functional", "relu", lambda: F.relu),
    ("tensor", "add_", lambda: torch.Tensor.add_),
    ("torch", "ones_like", lambda: torch.ones_like),
    ("tensor", "__add__", None),
    ("aten", "mm", None),
    ("distributed", "all_reduce", None),
])
def test_deleting_a_line_removes_only_that_api(tmp_path, resolved, section, name, obj):
    edited = resolve(load_registry(_write(tmp_path, _without(section, name))))
    by_func = dict(resolved.by_func.named())
    dunders = dict(resolved.dunders)
    patched = list(resolved.patched)
    aten = set(resolved.aten)
    if obj is not None:
        assert by_func.pop(obj()) == f"{SECTION_PREFIX[section]}.{name}"
    elif section == "tensor":
        dunders.pop(name)
    elif section == "aten":
        aten.remove(name)
    else:
        patched = [p for p in patched if p[2] != f"{SECTION_PREFIX[section]}.{name}"]
        assert len(patched) == len(resolved.patched) - 1
    assert dict(edited.by_func.named()) == by_func
    assert edited.dunders == dunders
    assert edited.patched == patched
    assert edited.aten == aten
    assert edited.absent == resolved.absent


# --- the generator -----------------------------------------------------------------

def test_generator_runs_and_output_loads(tmp_path, monkeypatch):
    """Not byte-equal to the checked-in YAML (that is curated by hand), but same shape."""
    spec = importlib.util.spec_from_file_location("gen_support_wrap_ops", SCRIPT)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out = tmp_path / "gen.yaml"
    assert gen.main(["-o", str(out)]) == 0
    generated = load_registry(str(out))
    assert list(generated.ops) == list(REGISTRY.ops)
    for section, names in generated.ops.items():
        assert names == sorted(names), section
        assert len(names) >= MIN_COUNTS[section], section
    assert yaml.safe_load(out.read_text()).keys() == REGISTRY.ops.keys()


def test_function_names_remember_unregistered_functions_as_none(resolved):
    """The function mode's one-subscript lookup: registered -> name, anything else -> None."""
    names = type(resolved.by_func)(resolved.by_func)
    assert names[F.linear] == "Functional.linear"
    assert names[torch.Tensor.is_floating_point] is None        # not registered: remembered
    assert torch.Tensor.is_floating_point in names
    assert names.get(torch.Tensor.is_floating_point, "x") == "x"
    assert names.get([], "x") == "x"                             # unhashable
    assert dict(names.named()) == {f: n for f, n in names.items() if n is not None}
