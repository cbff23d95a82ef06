"""Operators named as msprobe names them, read from the instruction that ran them.

A function mode sees ``a + b`` as ``Tensor.add``, the same function ``a.add(b)`` reaches
it as; msprobe, which patches the dunders, names the first ``Tensor.__add__``. Patching
the dunders of ``torch.Tensor`` at every ``start()`` and restoring them at ``stop()``
costs ~0.5 ms a step (each ``setattr`` on the type rewrites slots in all its subclasses
and invalidates attribute caches the model's own code then refills). Instead, the
caller's current instruction tells them apart: ``BINARY_OP (+)`` for the operator,
``CALL`` for the method. It is read once per call site and cached.

    names = OperatorNames(resolved.dunders)      # dunder -> "Tensor.__add__"
    names.name(func, default)                    # inside __torch_function__
    names.patched                                # dunders that still need a patch

Which function a dunder reaches the mode as is found by running it once under a
recording mode, so nothing here hard-codes torch's implementation table. Dunders no
instruction can tell apart stay patched: the reflected ``2 + a`` and ``2 * a`` (the
same function and instruction as ``a + 2``) and ``abs(a)`` (a ``CALL``, as ``a.abs()``).
``__div__`` / ``__idiv__`` have no operator in Python 3: called explicitly, they are
named as the method they run (``Tensor.div``).
"""
import dis
import logging
import sys

import torch
from torch.overrides import TorchFunctionMode

from probe import python_compat
from probe.torch_compat import EAGER_FRAME_CODE

log = logging.getLogger(__name__)

# dunder -> the operator symbol at its call site ("u-" etc.: unary operators)
SYMBOLS = {
    "__add__": "+", "__sub__": "-", "__mul__": "*", "__truediv__": "/", "__floordiv__": "//",
    "__mod__": "%", "__pow__": "**", "__matmul__": "@", "__and__": "&", "__or__": "|", "__xor__": "^",
    "__lshift__": "<<", "__rshift__": ">>",
    "__radd__": "+", "__rsub__": "-", "__rmul__": "*", "__rtruediv__": "/", "__rfloordiv__": "//",
    "__rmod__": "%", "__rpow__": "**", "__rmatmul__": "@", "__rand__": "&", "__ror__": "|",
    "__rxor__": "^", "__rlshift__": "<<", "__rrshift__": ">>",
    "__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=", "__ifloordiv__": "//=",
    "__imod__": "%=", "__ipow__": "**=", "__imatmul__": "@=", "__iand__": "&=", "__ior__": "|=",
    "__ixor__": "^=", "__ilshift__": "<<=", "__irshift__": ">>=",
    "__eq__": "==", "__ne__": "!=", "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=",
    "__neg__": "u-", "__pos__": "u+", "__invert__": "u~",
}
NO_OPERATOR = frozenset({"__div__", "__idiv__", "__rdiv__"})   # Python 2 names
_BITWISE = frozenset({f"__{p}{op}__" for p in ("", "r", "i") for op in ("and", "or", "xor", "lshift", "rshift")}
                     | {"__invert__"})
_UNARY = ("__neg__", "__pos__", "__invert__", "__abs__")

# Opcodes before Python 3.11 (one per operator) -> symbol
_OLD_BINARY = {
    "ADD": "+", "SUBTRACT": "-", "MULTIPLY": "*", "TRUE_DIVIDE": "/", "FLOOR_DIVIDE": "//",
    "MODULO": "%", "POWER": "**", "MATRIX_MULTIPLY": "@", "AND": "&", "OR": "|", "XOR": "^",
    "LSHIFT": "<<", "RSHIFT": ">>"}
_OPNAME_SYMBOL = {f"BINARY_{k}": v for k, v in _OLD_BINARY.items()}
_OPNAME_SYMBOL.update({f"INPLACE_{k}": v + "=" for k, v in _OLD_BINARY.items()})
_OPNAME_SYMBOL.update({"UNARY_NEGATIVE": "u-", "UNARY_POSITIVE": "u+", "UNARY_INVERT": "u~"})


def _symbol(ins):
    """The operator an instruction runs, or None (a call, a load, ...)."""
    name = ins.opname
    if name == "BINARY_OP" or name == "COMPARE_OP":
        r = ins.argrepr
        if r.startswith("bool(") and r.endswith(")"):   # 3.13: COMPARE_OP with a bool cast
            r = r[5:-1]
        return r
    if name == "CALL_INTRINSIC_1" and ins.argrepr == "INTRINSIC_UNARY_POSITIVE":   # 3.13+: +a
        return "u+"
    return _OPNAME_SYMBOL.get(name)


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.first = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # The first function is all that is asked; running its body could run a user's
        # wrapper (``__rmatmul__`` calls ``torch.matmul``, which a porting patch replaced).
        self.first = func
        raise _Found


class _Found(Exception):
    pass


def implementation(dunder):
    """The function a function mode receives when ``torch.Tensor.<dunder>`` runs, or None."""
    dtype = torch.int64 if dunder in _BITWISE else torch.float32
    x = torch.ones(2, dtype=dtype)
    args = (x,) if dunder in _UNARY else (x, 1 if dunder.startswith("__r") else torch.ones(2, dtype=dtype))
    rec = _Recorder()
    try:
        with torch.no_grad(), rec:
            unpatched(dunder)(*args)
    except _Found:
        return rec.first
    except Exception:
        return None
    return None


def unpatched(dunder):
    """``torch.Tensor.<dunder>`` as torch defines it, through probe's own patch if one is
    installed (a debugger keeps its patches between steps, until ``close()``)."""
    f = getattr(torch.Tensor, dunder, None)
    return getattr(f, "__probe_original__", f)


class OperatorNames:
    """Dunder names for the functions operators reach a function mode as.

    ``dunders`` are the registered ones (dunder -> full name); every operator is looked
    at, so an unregistered one (deleted from the YAML) maps to None and is not dumped
    under its method's name either.
    """

    def __init__(self, dunders):
        self.by_impl = {}    # implementation -> {symbol: "Tensor.__add__" or None}
        self.reads_instructions = python_compat.READS_BYTECODE
        self.itself = {}     # the dunder's own function -> name (the mode sees it as itself)
        self.patched = {}    # dunder -> name: no call site tells it apart
        claims = {}          # (implementation, symbol) -> [dunder, ...]
        for dunder in sorted(set(SYMBOLS) | set(dunders)):
            if dunder in NO_OPERATOR:
                continue
            full = dunders.get(dunder)
            impl = implementation(dunder)
            symbol = SYMBOLS.get(dunder)
            if impl is not None and impl is unpatched(dunder) \
                    and getattr(impl, "__name__", None) == dunder:   # not an alias of a method
                if full is not None:
                    self.itself[impl] = full
            elif impl is None or symbol is None:
                if full is not None:
                    self.patched[dunder] = full
            else:
                claims.setdefault((impl, symbol), []).append(dunder)
        if not self.reads_instructions and claims:
            _say_fallback()   # no table: the mode names ``a + b`` as the method it runs
        for (impl, symbol), owners in claims.items():
            forward = [d for d in owners if not d.startswith("__r")]
            keep = forward[0] if len(forward) == 1 else (owners[0] if len(owners) == 1 else None)
            for d in owners:
                if d == keep:
                    if self.reads_instructions:
                        self.by_impl.setdefault(impl, {})[symbol] = dunders.get(d)
                elif d in dunders:   # 2 + a and a + 2: same function, same instruction
                    self.patched[d] = dunders[d]

    def name(self, func, default):
        """``func``'s name for the call being made: the dunder's when an operator ran it."""
        table = self.by_impl.get(func)
        if table is None:
            return default
        return table.get(_caller_symbol(), default)


_fallback_said: list = []


def _say_fallback():
    if not _fallback_said:
        _fallback_said.append(True)
        log.warning("probe: Python %d.%d's instructions are not ones probe reads (it reads %s): operators are "
                    "named as the method they run (a + b is Tensor.add, msprobe's Tensor.__add__) and "
                    "arguments are recorded as torch dispatches them", *sys.version_info[:2],
                    ", ".join("%d.%d" % v for v in python_compat.BYTECODE_PYTHONS))


# ---- reading the calling instruction -------------------------------------------------
def _plumbing_codes():
    """Code objects of torch's Python wrappers between an operator and the mode (``a ** 2``
    runs Tensor.__pow__, a Python wrapper, then handle_torch_function)."""
    codes = {torch.overrides.handle_torch_function.__code__}
    wrapped = getattr(torch.Tensor.__pow__, "__code__", None)
    if wrapped is not None:
        codes.add(wrapped)
    codes.add(EAGER_FRAME_CODE)   # the mode runs under run_eagerly's wrapper
    return frozenset(id(c) for c in codes)


_PLUMBING = _plumbing_codes()
_sites: dict = {}   # (id(code), lasti) -> (code, symbol or None)
_codes: dict = {}   # id(code) -> (code, {offset: symbol})


def _caller_symbol(depth=3):
    """Symbol of the instruction running in the frame that called the operator.

    ``depth`` counts from here: this function, ``OperatorNames.name``, the mode's
    ``__torch_function__``, then the caller (or torch's wrappers, skipped).
    """
    f = sys._getframe(depth)
    while f is not None and id(f.f_code) in _PLUMBING:
        f = f.f_back
    if f is None:
        return None
    code = f.f_code
    key = (id(code), f.f_lasti)
    hit = _sites.get(key)
    if hit is not None and hit[0] is code:
        return hit[1]
    symbol = _symbols_of(code).get(f.f_lasti)
    _sites[key] = (code, symbol)   # the code object is kept: its id cannot be reused
    return symbol


def _symbols_of(code):
    hit = _codes.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    table = {}
    for ins in dis.get_instructions(code):
        s = _symbol(ins)
        if s is not None:
            table[ins.offset] = s
    _codes[id(code)] = (code, table)
    return table
