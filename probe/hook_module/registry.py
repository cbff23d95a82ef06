"""Which APIs are dumped: ``support_wrap_ops.yaml`` loaded, checked and resolved.

The YAML has one list of names per section (``functional``, ``tensor``, ``torch``,
``torch_npu``, ``distributed``, ``_VF``, ``aten``, ``custom``: see custom_ops.py). Resolving turns the names into the
objects the interceptor meets at call time, once, at ``start()``:

    >>> reg = resolve(load_registry())
    >>> reg.by_func[torch.nn.functional.relu]
    'Functional.relu'

Deleting a line from the YAML stops that API being dumped and changes nothing else.
"""
import difflib
import logging
import os
import types
from dataclasses import dataclass, field

import yaml

from probe.errors import ConfigError
from probe.hook_module import collectives
from probe.hook_module.custom_ops import CustomOps
from probe.hook_module.operators import OperatorNames
from probe.torch_compat import indexing_reaches_function_modes
from probe.vocabulary import SECTION_PREFIX  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)
DEFAULT_YAML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support_wrap_ops.yaml")

# When one function object is listed in several sections (F.conv2d is torch.conv2d),
# the first section here names it: modules call the functional form.
_MODE_PRIORITY = ("functional", "torch", "_VF")


@dataclass
class Registry:
    """The YAML as loaded: section -> API names, in file order."""
    path: str
    ops: dict


class FuncNames(dict):
    """Function -> "Prefix.name". A function not registered maps to None, remembered on
    first sight, so the function mode looks every torch call up with one subscript (a
    ``get`` method written in Python would cost a call per torch call)."""

    def __missing__(self, func):
        name = self[func] = self.name_unknown(func)
        return name

    custom = CustomOps()   # the registry's ``custom`` section: torch.ops operators named on first sight

    def name_unknown(self, func):
        """Name of a function met for the first time: a ``torch.ops`` operator the
        ``custom`` section selects, or None."""
        return self.custom.name(func) if self.custom else None

    def get(self, func, default=None):
        try:
            name = self[func]
        except TypeError:   # unhashable: not a function
            return default
        return default if name is None else name

    def named(self):
        """(function, name) pairs of the registered functions."""
        return ((f, n) for f, n in self.items() if n is not None)


@dataclass
class ResolvedRegistry:
    """Registry entries turned into what the interceptor needs on the hot path."""
    by_func: FuncNames = field(default_factory=FuncNames)   # object the function mode sees -> "Prefix.name"
    dunders: dict = field(default_factory=dict)     # torch.Tensor dunder attr -> "Tensor.__add__"
    operators: object = None                        # OperatorNames: how the dunders are told apart
    patched: list = field(default_factory=list)     # (owner object, attr, "Prefix.name") to patch
    aten: frozenset = frozenset()                   # aten op names ("mm", "add") for L2
    custom: CustomOps = field(default_factory=CustomOps)   # torch.ops operators dumped as APIs
    absent: list = field(default_factory=list)      # "section.name" not present in this torch


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_registry(path=None):
    """Load and check the YAML; any problem is a one-line ConfigError naming the file."""
    path = path or DEFAULT_YAML
    try:
        with open(path, encoding="utf-8") as f:
            # libyaml's safe loader where PyYAML was built with it: 0.06 s against 0.6 s for
            # the registry's 2,600 lines, paid by every PrecisionDebugger(...)
            data = yaml.load(f, Loader=_SAFE_LOADER)
    except FileNotFoundError:
        raise ConfigError(f"wrap_ops_yaml: file not found: {path}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: malformed YAML{where}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of section -> list of API names")
    ops = {}
    for section, names in data.items():
        if section not in SECTION_PREFIX:
            raise ConfigError(f"{path}: unknown section {section!r}; allowed: {', '.join(SECTION_PREFIX)}")
        names = names or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{path}: section {section!r} must be a list of API names")
        ops[section] = list(dict.fromkeys(names))
    return Registry(path=path, ops=ops)


def _section_owner(section):
    """The object whose attributes a section names, or None when not installed."""
    import torch
    if section == "functional":
        return torch.nn.functional
    if section == "tensor":
        return torch.Tensor
    if section == "torch":
        return torch
    if section == "_VF":
        return torch._VF
    if section == "distributed":
        import torch.distributed as dist
        return dist if dist.is_available() else None
    if section == "custom":   # "_C.onednn_mm" is torch.ops._C.onednn_mm
        return torch.ops
    if section == "torch_npu":
        try:
            import torch_npu  # optional, only on Ascend machines
        except ImportError:
            return None
        return torch_npu
    return None


def _lookup(owner, name):
    """``owner.name``; dotted names (msprobe lists ``linalg.norm`` under torch) walk submodules.
    Through probe's own patch, if one is installed: a debugger keeps them between steps."""
    obj = owner
    for part in name.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return getattr(obj, "__probe_original__", obj)


def _seen_as_itself(obj, name):
    """A dunder a function mode reports as itself needs no patch: Python-level ones
    (``__rsub__``, which dispatch on their own function) and slot wrappers
    (``__getitem__``; where indexing reaches no mode, torch 2.1, those are patched).
    C methods such as ``__add__`` report their implementation, ``add``."""
    return (isinstance(obj, types.FunctionType) and obj.__name__ == name) or \
        (type(obj).__name__ == "wrapper_descriptor" and
         (name not in ("__getitem__", "__setitem__") or indexing_reaches_function_modes()))


def _warn_unknown(path, absent):
    """One line for the names of a user's YAML that neither this torch nor the packaged
    registry knows (``geluu``): such an API is silently not dumped otherwise. Names the
    packaged YAML lists but this torch lacks (newer APIs, torch_npu) are expected."""
    known = load_registry().ops
    unknown = [a for a in absent if a.partition(".")[2] not in known.get(a.partition(".")[0], ())]
    if not unknown:
        return
    hints = []
    for item in unknown:
        section, _, name = item.partition(".")
        owner = _section_owner(section)
        pool = set(known.get(section, ())) | (set(dir(owner)) if owner is not None else set())
        close = difflib.get_close_matches(name, sorted(pool), n=3)
        hints.append(f"{section}.{name}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    log.warning("probe: %s: not dumped, no such API: %s", path, "; ".join(hints))


def _replaced_by_user(obj):
    """A Python function defined outside torch, found where torch's function was."""
    return type(obj) is types.FunctionType and \
        (getattr(obj, "__module__", None) or "torch").split(".", 1)[0] not in ("torch", "probe")


def resolve(registry):
    """Map registry names to the objects met at call time; unknown names go to ``absent``."""
    out = ResolvedRegistry()
    ops = registry.ops
    out.aten = frozenset(ops.get("aten", ()))
    out.custom = out.by_func.custom = CustomOps(ops.get("custom", ()))
    for section in _MODE_PRIORITY + ("tensor", "distributed", "torch_npu"):
        names = ops.get(section)
        if not names:
            continue
        owner = _section_owner(section)
        prefix = SECTION_PREFIX[section]
        for name in names:
            obj = _lookup(owner, name)
            if obj is None or not callable(obj):
                out.absent.append(f"{section}.{name}")
                continue
            full = f"{prefix}.{name}"
            if section == "tensor" and name.startswith("__") and name.endswith("__") \
                    and not _seen_as_itself(obj, name):
                # Operators reach a function mode as the method they implement
                # (a + b arrives as Tensor.add): named from their call site (operators.py).
                out.dunders[name] = full
            elif section in ("distributed", "torch_npu"):
                # Plain Python / vendor functions a function mode may not see.
                # A dotted name (torch_npu's atb.npu_x) is patched on its own submodule.
                parent, _, attr = name.rpartition(".")
                out.patched.append((_lookup(owner, parent) if parent else owner, attr, full))
                if section == "distributed":   # the same collective under a newer torch's name
                    out.patched.extend((owner, new, full) for new in collectives.RENAMED.get(name, ())
                                       if callable(getattr(owner, new, None)))
            elif _replaced_by_user(obj) and section in ("functional", "torch", "tensor"):
                # A porting patch (``F.gelu = npu_gelu``) put a user's function in torch's
                # place: a function mode never sees it called (it is no torch function),
                # only what it calls. Patched as msprobe does, the call is recorded once
                # under the API's name; the original it calls runs inside, unrecorded.
                parent, _, attr = name.rpartition(".")
                out.patched.append((_lookup(owner, parent) if parent else owner, attr, full))
                out.by_func.setdefault(obj, full)
            else:
                out.by_func.setdefault(obj, full)
    if out.absent and os.path.abspath(registry.path) != DEFAULT_YAML:
        _warn_unknown(registry.path, out.absent)
    out.operators = OperatorNames(out.dunders)
    for func, full in out.operators.itself.items():
        out.by_func.setdefault(func, full)
    return out


# Public names of the lookups other stages share (precheck resolves an entry's API with them).
section_owner = _section_owner
lookup = _lookup
