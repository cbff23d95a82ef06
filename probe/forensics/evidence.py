"""What the forensics features record about a call, and how: its stack (captured cheaply,
formatted late), its module path and user line, its tensors (described, copied, summarised
with the dump's statistic keys), the JSON files they write, a failure said once.

Everything here runs inside a user's training step, so every function is cheap on the
path that runs per call (frame walks keep code objects, formatting waits for a report)
and nothing here may raise into the user's code: callers wrap it and log once.
"""
import json
import linecache
import logging
import os
import sys
import threading

import torch

from probe import rank
from probe.dump.stack import TORCH_OP_PLUMBING, is_plumbing
from probe.log_once import LogOnce
from probe.vocabulary import NO_STATS, STAT_KEYS

log = logging.getLogger(__name__)

_CALL_IMPL = torch.nn.Module._call_impl.__code__

# Warn once per key, for the whole process: a broken feature must not flood a training log.
log_once = LogOnce(log).warning


def _is_plumbing(filename):
    return is_plumbing(filename, TORCH_OP_PLUMBING)


def capture(skip=1):
    """(frames, modules) of the current call site, cheaply.

    ``frames`` is a tuple of (code, line), innermost first, without probe's and torch's
    dispatch frames; ``modules`` the nn.Modules whose ``__call__`` is on the stack,
    outermost first. Format them with :func:`format_frames` / :func:`module_path` only
    when something is reported.
    """
    f = sys._getframe(skip)
    while f is not None and _is_plumbing(f.f_code.co_filename):
        f = f.f_back
    frames = []
    modules = []
    while f is not None:
        code = f.f_code
        if code is _CALL_IMPL:
            m = f.f_locals.get("self")
            if m is not None:
                modules.append(m)
        frames.append((code, f.f_lineno))
        f = f.f_back
    modules.reverse()
    return tuple(frames), tuple(modules)


def format_frames(frames):
    """stack.json's frame strings, innermost first."""
    out = []
    for code, line in frames:
        src = linecache.getline(code.co_filename, line).strip()
        out.append(f"File {code.co_filename}, line {line}, in {code.co_name}, \n {src}")
    return out


def module_path(modules):
    """{"module_path": "0.fc1", "module_classes": ["Sequential", "Block", "Linear"]}.

    The dotted name is found by looking each module up in its caller's children, as
    ``named_modules()`` would name it from the outermost module on the stack.
    """
    if not modules:
        return {"module_path": None, "module_classes": []}
    parts = []
    for parent, child in zip(modules, modules[1:]):
        name = next((k for k, v in parent._modules.items() if v is child), None)
        if name is None:   # held in a container (ModuleList, ModuleDict) that is never called
            name = next((k for k, v in parent.named_modules(remove_duplicate=False) if v is child and k), None)
        parts.append(name if name is not None else f"<{type(child).__name__}>")
    return {"module_path": ".".join(parts), "module_classes": [type(m).__name__ for m in modules]}


def user_line(frames):
    """'file:line in func' of the innermost frame, for one-line console reports."""
    if not frames:
        return "?"
    code, line = frames[0]
    return f"{code.co_filename}:{line} in {code.co_name}"


def write_json(path, obj):
    """Write atomically (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def describe_tensor(t):
    """dtype/shape/stride/device of a tensor, without touching its values."""
    d = {"dtype": str(t.dtype), "shape": list(t.shape), "device": str(t.device)}
    try:
        d["stride"] = list(t.stride())
    except (RuntimeError, NotImplementedError):   # sparse, nested: no strides
        d["stride"] = None
    return d


def cpu_copy(t):
    """A CPU copy with its own compact storage (a view must not save its whole base).

    Device tensors come back in the plain layout (``.cpu()`` converts NPU internal
    formats), so what is saved loads on any machine.
    """
    t = t.detach()
    if t.device.type == "cpu":
        return t.clone()
    return t.to("cpu")


def summary(t):
    """Max/Min/Mean/Norm of a CPU tensor, as dump.json records them (None when empty)."""
    if t.numel() == 0 or t.is_complex():
        return dict(NO_STATS)
    w = t.to(torch.float64)
    if t.dtype == torch.bool:
        mx, mn = bool(w.max()), bool(w.min())
    elif not t.dtype.is_floating_point:
        mx, mn = int(w.max()), int(w.min())
    else:
        mx, mn = float(w.max()), float(w.min())
    return dict(zip(STAT_KEYS, (mx, mn, float(w.mean()), float(torch.linalg.vector_norm(w)))))


current_rank = rank.current_rank   # the features' name for it
