"""What differs between the torch versions probe supports, in one place.

probe declares ``torch>=2.1`` (torch_npu's oldest maintained line); CI runs the whole
suite on torch 2.1 and 2.13. Everything a newer torch added that probe leans on is looked
up here once, with what stands in for it on an older one; a feature that cannot work
there says so in one log line where it is used (see ``TORCH``'s users).

    from probe.torch_compat import is_compiling, TORCH
    if TORCH < (2, 4): ...
"""
import functools
from typing import Optional

import torch

TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

# Dynamo folds both to True while it traces (2.1-2.2: torch._utils.is_compiling is in
# its table of constant functions), so a compiled region gets the plain torch call.
is_compiling = getattr(torch.compiler, "is_compiling", None) or torch._utils.is_compiling

# The C base class of torch.Tensor: public as torch._C.TensorBase from torch 2.2 on,
# torch._C._TensorBase before.
TensorBase = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase


def op_name(op) -> Optional[str]:
    """An ``OpOverload``'s name without namespace or overload (``mm`` for aten.mm.default);
    None for what has no schema (a higher-order operator). torch 2.4 added it as
    ``OpOverload._opname``; the schema's name holds it on every torch."""
    schema = getattr(op, "_schema", None)
    return None if schema is None else schema.name.split("::", 1)[-1]


def _cpu_half_aminmax() -> bool:
    try:
        torch.aminmax(torch.zeros(1, dtype=torch.float16))
        return True
    except RuntimeError:   # "aminmax_cpu" not implemented for 'Half'
        return False


def _aminmax_any_cpu_dtype(t):
    if t.dtype is torch.float16 and t.device.type == "cpu":
        return torch.min(t), torch.max(t)
    return torch.aminmax(t)


# torch.aminmax of a float16 tensor on the CPU came after torch 2.1 (2.1 raises); min and
# max give the same two numbers there, in two passes.
aminmax = torch.aminmax if _cpu_half_aminmax() else _aminmax_any_cpu_dtype


@functools.lru_cache(maxsize=None)
def indexing_reaches_function_modes() -> bool:
    """Whether ``t[i]`` and ``t[i] = tensor`` reach a torch function mode (as
    ``Tensor.__getitem__`` / ``__setitem__``). On torch 2.1 neither does (``t[i] = 2.0``
    does; later torch, all): probe then patches both, as it patches the operators no
    instruction tells apart. Found by trying, once."""
    from torch.overrides import TorchFunctionMode
    seen = []

    class _Look(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", None))
            return func(*args, **(kwargs or {}))
    t, v = torch.zeros(2), torch.ones(())
    with torch.no_grad(), _Look():
        t[0]
        t[1] = v
    return seen == ["__getitem__", "__setitem__"]
