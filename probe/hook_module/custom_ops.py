"""Operators called through ``torch.ops`` outside torch's own namespaces: which are dumped,
and under what name.

A serving engine's kernels are such ops: vLLM's ``torch.ops._C.onednn_mm`` (every linear),
``torch.ops._C.rotary_embedding``, ``torch.ops.vllm.unified_attention_with_output``;
torch_npu's ``torch.ops.npu.*``; whatever a user registers with ``torch.library``. No
registry section lists them by function object (they exist only once their library is
loaded, in the process that loads it), so the registry's ``custom`` section names
namespaces and ops, matched when an op is first called:

* ``"*"``: every namespace torch does not ship (the default);
* ``"_C"``: every op of one namespace (torch's own too, when named);
* ``"_C.onednn_mm"``: one op, every overload.

An op is named as called, ``Custom.{namespace}.{op}``, with ``.{overload}`` for an overload
other than ``default`` (``torch.ops.ns.op(...)`` and ``torch.ops.ns.op.default(...)`` are
one name):

    >>> CustomOps(["*"]).name(torch.ops._C.onednn_mm)
    'Custom._C.onednn_mm'
"""
from __future__ import annotations

import re

import torch

from probe.torch_compat import op_name
from probe.vocabulary import CUSTOM

EVERY = "*"
# Namespaces of ops that ship with torch (and probe's own): "*" leaves them out; the
# registry's other sections cover the torch APIs that reach them.
BUILTIN_NAMESPACES = frozenset({
    "aten", "prims", "prim", "_c10d_functional", "_c10d_functional_autograd", "c10d",
    "_dtensor", "profiler", "higher_order", "quantized", "_quantized", "rngprims",
    "debugprims", "inductor", "mkldnn", "onednn", "_test", "_functorch", "_inductor_test",
    "quantized_decomposed", "_nested_tensor", "_prims", "fsdp", "symm_mem", "_export",
    "streams", "aoti_torch", "_quant", "probe",
})


def op_parts(func):
    """(namespace, op, overload) of a ``torch.ops`` operator (overload None for a packet),
    or None for anything else."""
    ops = torch._ops
    if isinstance(func, ops.OpOverload):
        return func.namespace, op_name(func), func._overloadname
    if isinstance(func, ops.OpOverloadPacket):
        ns, _, op = func._qualified_op_name.partition("::")
        return ns, op, None
    return None


def custom_op_name(func):
    """'Custom.ns.op' ('Custom.ns.op.overload' unless default) for a torch.ops operator
    outside torch's namespaces; None for anything else."""
    parts = op_parts(func)
    if parts is None or parts[0] in BUILTIN_NAMESPACES:
        return None
    return _name(*parts)


def _name(ns, op, overload):
    return f"{CUSTOM}.{ns}.{op}" + ("" if overload in (None, "default") else f".{overload}")


class CustomOps:
    """The registry's ``custom`` section, resolved: ``name(func)`` is the entry name of a
    selected op, None for one not selected (or no op)."""

    def __init__(self, patterns=()):
        self.every = EVERY in patterns
        self.namespaces = frozenset(p for p in patterns if p != EVERY and "." not in p)
        self.ops = frozenset(p for p in patterns if "." in p)

    def __bool__(self):
        return bool(self.every or self.namespaces or self.ops)

    def name(self, func):
        parts = op_parts(func)
        if parts is None:
            return None
        ns, op, overload = parts
        if ns in self.namespaces or f"{ns}.{op}" in self.ops or (self.every and ns not in BUILTIN_NAMESPACES):
            return _name(ns, op, overload)
        return None


def mutated_args(func, args, kwargs):
    """The tensors an op's schema says it writes (``Tensor(a!) out``): what an op that
    returns nothing produced (vLLM's attention writes its ``output`` argument). Empty for a
    function without a schema."""
    schema = getattr(func, "_schema", None)
    if schema is None:   # a packet: its default overload's schema
        default = getattr(func, "default", None)
        schema = getattr(default, "_schema", None)
    if schema is None:
        return []
    written = []
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        if isinstance(value, torch.Tensor):
            written.append(value)
    return written


# An argument the schema names a handle (vLLM's ``onednn_mm(..., Tensor handler_tensor)``, the
# address of a C++ object holding the weight; ``shm_allreduce(int handle, ...)``): an address.
_HANDLE = re.compile(r"(?:^|_)handler?(?:_|$)").search


def handle_args(func):
    """The positions and names of the arguments ``func``'s schema names a handle: their
    values are addresses that differ from run to run, no data."""
    schema = getattr(func, "_schema", None) or getattr(getattr(func, "default", None), "_schema", None)
    if schema is None:
        return ()
    return tuple((i, arg.name) for i, arg in enumerate(schema.arguments) if _HANDLE(arg.name))
