"""The tensors inside an argument tree, through ``torch.utils._pytree``: probe's one mapper
and flattener of tensor trees.

``map_tensors`` / ``flat_tensors`` / ``keyed_tensors`` serve every walk over a call's or a
module's arguments and outputs outside the API hot path: the toolbox (copy, cast, move),
precheck's replay, the module-level dump (``dump.modules``, dataclass outputs such as HF
``ModelOutput`` opened field by field), the crash dump (tensors keyed as dump files name
them), backward origin and the meta check. Containers are pytree's (lists, tuples, named tuples such as
``torch.return_types``, dicts); ``torch.Size`` is a leaf.

One walker stays separate: ``hook_module.grad_capture.input_slots`` / ``output_slots``.
They answer another question, a call's argument slots with ``None`` placeholders where
a slot holds no tensor (msprobe's numbering of backward entries), and they run on the
hot path of every dumped API call, which keeps its own plain loops. (``compare.rows``
walks dump JSON, not tensors; the walkers in ``forensics.repro``'s script template are
part of a generated script that imports only torch.)
"""
import dataclasses

import torch
from torch.utils import _pytree as pytree

from probe.torch_compat import TORCH

# torch 2.1 has no key paths and no ``is_leaf``; there ``torch.Size`` is a leaf already
# (only exact tuples, lists, dicts and named tuples are containers).
_KEY_PATHS = hasattr(pytree, "tree_flatten_with_path")


def _is_size(x):
    return type(x) is torch.Size   # pytree would rebuild it as a plain tuple


_LEAF = {"is_leaf": _is_size} if TORCH >= (2, 2) else {}


def tree_flatten(value):
    return pytree.tree_flatten(value, **_LEAF)


def map_tensors(fn, value):
    """``value`` with every tensor replaced by ``fn(tensor)``, structure kept."""
    return pytree.tree_map_only(torch.Tensor, fn, value, **_LEAF)


def flat_tensors(value, dataclasses_too=False):
    """Every tensor inside ``value``, depth first, in argument order. ``dataclasses_too``:
    a dataclass instance that pytree keeps whole is opened, its fields in order."""
    leaves, _ = tree_flatten(value)
    out = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif dataclasses_too and dataclasses.is_dataclass(x) and not isinstance(x, type):
            out.extend(flat_tensors([getattr(x, f.name) for f in dataclasses.fields(x)], True))
    return out


def keyed_tensors(value):
    """``(keys, tensor)`` for every tensor inside ``value``, depth first: ``keys`` is the
    tuple of positions (int) and dict keys leading to it from ``value``. A named tuple's
    field is keyed by its position, as dump files number a tuple's elements."""
    if not _KEY_PATHS:
        return list(_walk_keys(value, ()))
    leaves, _ = pytree.tree_flatten_with_path(value, is_leaf=_is_size)
    return [(_plain_keys(value, path), x) for path, x in leaves if isinstance(x, torch.Tensor)]


def _walk_keys(value, keys):
    """keyed_tensors for torch 2.1's pytree, whose containers are these four."""
    if isinstance(value, torch.Tensor):
        yield keys, value
    elif type(value) in (list, tuple) or (isinstance(value, tuple) and hasattr(value, "_fields")):
        for i, v in enumerate(value):
            yield from _walk_keys(v, keys + (i,))
    elif type(value) is dict:
        for k, v in value.items():
            yield from _walk_keys(v, keys + (k,))


def _plain_keys(value, path):
    keys = []
    for k in path:
        if isinstance(k, pytree.SequenceKey):
            keys.append(k.idx)
        elif isinstance(k, pytree.MappingKey):
            keys.append(k.key)
        elif isinstance(k, pytree.GetAttrKey):
            fields = getattr(type(value), "_fields", None)
            keys.append(fields.index(k.name) if fields and k.name in fields else k.name)
        else:   # a type registered with pytree by another library
            keys.append(str(k).lstrip(".[").rstrip("]"))
        value = k.get(value)
    return tuple(keys)
