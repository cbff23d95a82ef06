"""Interception of registered API calls.

A ``TorchFunctionMode`` sees calls of ``torch.*``, Tensor methods and
``torch.nn.functional`` by the function object actually called. Nothing is replaced,
so functions imported before ``start()`` are seen and ``act is F.gelu`` keeps holding.
What the mode cannot tell apart is patched for the time the interceptor runs: Tensor
dunders (``a + b`` reaches the mode as ``Tensor.add``; msprobe names it
``Tensor.__add__``) and distributed / torch_npu functions a mode may never see.

    interceptor = Interceptor(resolved, handler)
    interceptor.start()
    ...               # handler(name, func, args, kwargs) runs for each registered call
    interceptor.stop()

The handler must call ``func(*args, **kwargs)`` and return its result. Only the outermost
registered call reaches it: while it runs, registered APIs go straight to the real function.
After ``stop()`` nothing is patched and nothing is on the mode stack: the cost is zero.

A limit shared by every function mode: the body of an unregistered Python-level torch
function runs with the mode switched off (it dispatched on itself first), so registered
calls inside it are not seen. ``Tensor.backward`` calling ``torch.ones_like`` is the case
met in practice; msprobe, which patches attributes, records that call.
"""
import threading

import torch
from torch.overrides import TorchFunctionMode


class _ThreadState(threading.local):
    depth = 0        # > 0 while a handler (or probe's own work) runs on this thread
    enabled = False  # the interceptor was started on this thread


state = _ThreadState()


class guard:
    """Context manager: torch calls made by probe itself are not intercepted."""
    __slots__ = ()

    def __enter__(self):
        state.depth += 1

    def __exit__(self, *exc):
        state.depth -= 1


class _Mode(TorchFunctionMode):
    def __init__(self, interceptor):
        super().__init__()
        self._by_func = interceptor.resolved.by_func
        self._call = interceptor.call

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if not state.depth:
            name = self._by_func.get(func)
            if name is not None:
                return self._call(name, func, args, kwargs)
        return func(*args, **kwargs)


class Interceptor:
    """Routes every registered API call to ``handler`` between ``start()`` and ``stop()``."""

    def __init__(self, resolved, handler):
        self.resolved = resolved
        self.handler = handler
        self._mode = None
        self._patches = []  # (owner, attr, original or _MISSING)

    @property
    def active(self):
        return self._mode is not None

    def call(self, name, func, args, kwargs):
        state.depth += 1
        try:
            return self.handler(name, func, args, kwargs)
        finally:
            state.depth -= 1

    def start(self):
        if self._mode is not None:
            return
        for attr, full in self.resolved.dunders.items():
            self._patch(torch.Tensor, attr, full)
        for owner, attr, full in self.resolved.patched:
            self._patch(owner, attr, full)
        self._mode = _Mode(self)
        self._mode.__enter__()
        state.enabled = True

    def stop(self):
        if self._mode is None:
            return
        state.enabled = False
        try:
            self._mode.__exit__(None, None, None)
        finally:
            self._mode = None
            for owner, attr, original in reversed(self._patches):
                if original is _MISSING:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, original)
            self._patches = []

    def _patch(self, owner, attr, full):
        original = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr)
        func = getattr(owner, attr)
        call = self.call

        def wrapper(*args, **kwargs):
            if state.depth or not state.enabled:
                return func(*args, **kwargs)
            return call(full, func, args, kwargs)

        wrapper.__name__ = getattr(func, "__name__", attr)
        wrapper.__qualname__ = getattr(func, "__qualname__", attr)
        wrapper.__doc__ = getattr(func, "__doc__", None)
        wrapper.__wrapped__ = func
        self._patches.append((owner, attr, original))
        setattr(owner, attr, wrapper)


_MISSING = object()
