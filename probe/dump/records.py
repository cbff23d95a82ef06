"""Plain data handed from the hooks to the writer: summaries of values and entries."""
import torch

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
    return {"type": type(v).__name__, "value": str(v)[:200]}


def _plain(x):
    if x is None or isinstance(x, _SCALARS):
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    return str(x)
