"""The tensors inside an argument tree, through ``torch.utils._pytree``: the one mapper and
flattener of the tools that copy, cast or move a call's arguments (toolbox, precheck).

Containers are pytree's (lists, tuples, named tuples such as ``torch.return_types``,
dicts); ``torch.Size`` is a leaf. The dump's own hot path numbers a call's tensors by
argument slot instead (``hook_module.grad_capture.input_slots`` / ``output_slots``).
"""
import torch
from torch.utils._pytree import tree_flatten, tree_map_only


def _is_size(x):
    return type(x) is torch.Size   # pytree would rebuild it as a plain tuple


def map_tensors(fn, value):
    """``value`` with every tensor replaced by ``fn(tensor)``, structure kept."""
    return tree_map_only(torch.Tensor, fn, value, is_leaf=_is_size)


def flat_tensors(value):
    """Every tensor inside ``value``, depth first, in argument order."""
    leaves, _ = tree_flatten(value, is_leaf=_is_size)
    return [x for x in leaves if isinstance(x, torch.Tensor)]
