"""A DTensor as the dump records it: its local shard, with no collective.

Most reductions on a DTensor (``t.max()``, ``t.sum()``) dispatch DTensor's own collectives,
which every rank of its mesh must enter. A dump restricted to some ranks (``"rank": [0]``)
would then wait forever for the others: a tensor-parallel job hangs. So the statistics and
the tensor file of a DTensor come from ``t._local_tensor`` (what ``to_local()`` returns,
without an autograd node), and its entry says where that shard sits, for a compare across
layouts to merge shards:

    "shape": [8, 16]                  the global shape, as a single device would have it
    "local_shape": [4, 16]            the shard's
    "placements": ["Shard(dim=0)"]    one per mesh dimension, as torch writes them (Replicate(), Partial(sum))
    "mesh_shape": [2]
    "global_offset": [4, 0]           where the shard starts in the global tensor

    local, layout = split(t)          # (t, None) for any other tensor
"""
from __future__ import annotations

import sys

import torch


def _dtensor_type():
    """DTensor's class when torch.distributed.tensor is already imported (a model that
    uses DTensors imported it), else None: probe never imports it for a plain model."""
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        module = sys.modules.get(name)
        cls = getattr(module, "DTensor", None) if module is not None else None
        if cls is not None:
            return cls
    return None


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def split(t):
    """(the tensor to summarise and save, its layout dict or None). A plain tensor (every
    tensor off the C path on an accelerator) returns after one type check."""
    if type(t) in _PLAIN:
        return t, None
    cls = _dtensor_type()
    if cls is None or not isinstance(t, cls):
        return t, None
    local = getattr(t, "_local_tensor", None)
    if local is None:
        local = t.to_local()
    mesh = t.device_mesh
    layout = {"local_shape": list(local.shape), "placements": [repr(p) for p in t.placements],
              "mesh_shape": list(mesh.shape), "global_offset": _offset(t, mesh)}
    return local, layout


def _offset(t, mesh):
    """The shard's offset in the global tensor (torch's own computation; None where this
    torch does not have it)."""
    for name in ("torch.distributed.tensor._utils", "torch.distributed._tensor._utils"):
        try:
            module = __import__(name, fromlist=["compute_local_shape_and_global_offset"])
            _, offset = module.compute_local_shape_and_global_offset(t.shape, mesh, t.placements)
            return list(offset)
        except Exception:   # noqa: BLE001 - another torch's signature: the offset is left out
            continue
    return None
