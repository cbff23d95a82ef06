"""Plain data handed from the hooks to the writer: dump entries and value summaries.

A forward entry is msprobe's ``{"input_args": [...], "input_kwargs": {...}, "output":
[...]}`` (plus ``parameters`` for a module at L0/mix, ``api`` for a kernel at L2), a
backward entry ``{"input": [...], "output": [...]}``; a field left None (data_mode
filtered it out) is absent from the file. Each element is a tensor summary dict (type,
dtype, shape, Max, Min, Mean, Norm, requires_grad, data_name, md5: msprobe's keys, built
in one C call for most tensors), ``describe_value``'s form of another value, or a list /
dict of those. ``EntryBuilder`` (``entry_builder.py``) makes them; the writer encodes
them with orjson, which serialises these slotted dataclasses through ``to_json``.
"""
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from probe.vocabulary import STAT_KEYS


@dataclass(eq=False)
class ForwardEntry:
    __slots__ = ("input_args", "input_kwargs", "output", "parameters", "api")
    input_args: Optional[List[Any]]
    input_kwargs: Optional[Dict[str, Any]]
    output: Optional[List[Any]]
    parameters: Optional[Dict[str, Any]]
    api: Optional[str]

    def __init__(self):   # fields are filled as the call runs
        self.input_args = self.input_kwargs = self.output = self.parameters = self.api = None

    def to_json(self):
        """msprobe's dict: fields in its order, unset ones absent."""
        d = {}
        if self.input_args is not None:
            d["input_args"] = self.input_args
            d["input_kwargs"] = self.input_kwargs
        if self.output is not None:
            d["output"] = self.output
        if self.parameters is not None:
            d["parameters"] = self.parameters
        if self.api is not None:
            d["api"] = self.api
        return d


@dataclass(eq=False)
class BackwardEntry:
    __slots__ = ("input", "output")
    input: Optional[List[Any]]
    output: Optional[List[Any]]

    def __init__(self):
        self.input = self.output = None

    def to_json(self):
        d = {}
        if self.input is not None:
            d["input"] = self.input
        if self.output is not None:
            d["output"] = self.output
        return d

def tensor_summary(dtype: str, shape: list, requires_grad: bool,
                   stats: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A tensor's summary as dump.json records it: type, dtype, shape, the statistics
    (``vocabulary.STAT_KEYS``, taken from ``stats``; None where unknown), requires_grad.
    For entries made outside the dump's hooks (crash dumps); ``EntryBuilder.summary`` and
    the C summary write the same keys in the same order on the hot path."""
    s: Dict[str, Any] = {"type": "torch.Tensor", "dtype": dtype, "shape": shape}
    for k in STAT_KEYS:
        s[k] = stats.get(k) if stats else None
    s["requires_grad"] = requires_grad
    return s


# Non-tensor argument values msprobe records as {"type": ..., "value": ...}.
_SCALARS = (bool, int, float, str)
# Subclasses (numpy floats, IntEnum, str enums) are stored as their plain value: the same
# JSON, and entries hold only builtin types (what the dump's helper process is sent).
_PLAIN = {float: float, int: int, str: str.__str__, bool: bool}


def describe_value(v):
    """JSON form of a non-tensor argument value (tensors are summarised elsewhere)."""
    if v is None:
        return None
    if isinstance(v, _SCALARS):
        t = type(v)
        if t not in _PLAIN:
            v = next(plain(v) for base, plain in _PLAIN.items() if isinstance(v, base))
        return {"type": t.__name__, "value": v}
    if isinstance(v, slice):
        return {"type": "slice", "value": [_plain(v.start), _plain(v.stop), _plain(v.step)]}
    if isinstance(v, torch.Size):
        return {"type": "torch.Size", "value": list(v)}
    if isinstance(v, torch.dtype):
        return {"type": "torch.dtype", "value": str(v)}
    if isinstance(v, torch.device):
        return {"type": "torch.device", "value": str(v)}
    if isinstance(v, torch.memory_format):
        return {"type": "torch.memory_format", "format": str(v).replace("torch.", "")}
    if v is Ellipsis:
        return {"type": "ellipsis", "value": "..."}
    # an object's default repr carries its address, which differs from run to run and is no data
    return {"type": type(v).__name__, "value": _ADDRESS("", str(v))[:200]}


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+").sub


def _plain(x):
    if x is None or isinstance(x, _SCALARS):
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    return str(x)
