"""Interception of registered API calls.

A ``TorchFunctionMode`` sees calls of ``torch.*``, Tensor methods and
``torch.nn.functional`` by the function object actually called. Nothing is replaced,
so functions imported before ``start()`` are seen and ``act is F.gelu`` keeps holding.
Operators reach the mode as the method they implement (``a + b`` as ``Tensor.add``;
msprobe names it ``Tensor.__add__``): ``operators.py`` names them from the calling
instruction. What neither can tell apart is patched: three Tensor dunders (``2 + a``,
``2 * a``, ``abs(a)``) and the distributed / torch_npu functions a mode may never see.

    interceptor = Interceptor(resolved, handler)
    interceptor.start()
    ...               # handler(name, func, args, kwargs) runs for each registered call
    interceptor.stop()

A collective reaches the handler as a ``collectives.CollectiveCall``, whose result lists
the tensors it wrote (see collectives.py); one called by a backward node on an autograd
device thread goes to the interceptor of the thread that runs the dump
(``_backward_owner``). A user's wrapper put in a Python-level API's place is never called
by the mode in place of the original (``_dispatching_original``), and while dynamo traces,
the mode and the patches step aside (``_is_compiling``).

The handler must call ``func(*args, **kwargs)`` and return its result. Only the outermost
registered call reaches it: while it runs, registered APIs go straight to the real function.

After ``stop()`` the mode is off the stack and every patch is removed, so calls cost
nothing. (Each ``setattr`` on ``torch.Tensor`` costs ~15 us, rewriting slots in its
subclasses and invalidating attribute caches, which is why so few dunders are patched.)
``stop(keep_patches=True)`` leaves the patches in place, passing calls straight through
(~0.2 us on ``2 * a``), for a caller that starts again soon: a debugger pausing between
training steps saves ~50 us per step; it removes them at ``close()`` or when no later
step is to be dumped.

A limit shared by every function mode: the body of an unregistered Python-level torch
function runs with the mode switched off (it dispatched on itself first), so registered
calls inside it are not seen. ``Tensor.backward`` calling ``torch.ones_like`` is the case
met in practice; msprobe, which patches attributes, records that call.
"""
import gc
import os
import sys
import threading
import types
import weakref

import torch
from torch.overrides import TorchFunctionMode

from probe.hook_module import collectives
from probe.torch_compat import EAGER_FRAME_CODE, TensorBase, compiling_for_patches, run_eagerly
from probe.torch_compat import compiling as _is_compiling


class _ThreadState(threading.local):
    depth = 0        # > 0 while a handler (or probe's own work) runs on this thread
    active = None    # the innermost started Interceptor on this thread


state = _ThreadState()


def _quiet_in_child():
    # A process forked while dumping (DataLoader workers) inherits the mode and the
    # patches; its calls must not be recorded into the parent's dump.
    state.depth += 1


os.register_at_fork(after_in_child=_quiet_in_child)


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
        operators = interceptor.resolved.operators
        self._op_impls = operators.by_impl
        self._op_name = operators.name
        self._interceptor = interceptor
        self._allocators = interceptor.allocators   # id(func) -> None (see watch_allocations)

    @run_eagerly   # called from compiled code (each op of a graph before torch 2.5), never compiled
    def __torch_function__(self, func, types_, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if _is_compiling():   # dynamo is tracing this: probe stays out of the graph
            return func(*args, **kwargs)
        wrapper = None
        if type(func) is _FunctionType:   # Python-level: is ``func`` a user's wrapper?
            original = _dispatching_original(func)
            if original is not None:
                wrapper, func = func, original
        if not state.depth:
            try:
                name = self._by_func[func]   # None: not registered (FuncNames)
            except TypeError:    # unhashable: not a function
                name = None
            if name is None and wrapper is not None:   # the registry met the wrapper at start()
                name = self._by_func[wrapper]
            if func in self._op_impls:   # an operator's implementation: which was it?
                name = self._op_name(func, name)
            if name is not None:
                state.depth += 1     # Interceptor.call, inlined: a Python call less per API
                try:
                    return self._interceptor.handler(name, func, args, kwargs)
                finally:
                    state.depth -= 1
            if id(func) in self._allocators:   # torch.empty and co.: not recorded, remembered
                out = func(*args, **kwargs)
                self._interceptor.allocated(out)
                return out
        return func(*args, **kwargs)


_FunctionType = types.FunctionType
_HANDLE_CODE = torch.overrides.handle_torch_function.__code__
_by_code: dict = {}   # code (or replacement function) met in place of torch's function -> torch's function


def _dispatching_original(func):
    """The torch function whose body handed the mode ``func``, when ``func`` is not it.

    A Python-level torch function dispatches on the name it is bound to at call time
    (``handle_torch_function(silu, ...)`` reads the global ``silu``). After a porting patch
    (``F.silu = npu_silu``, ``npu_silu`` calling the saved original) the mode receives the
    wrapper, and calling it would run the wrapper a second time (x1.01 applied twice).
    The frame that called ``handle_torch_function`` is the original's: call that instead.
    """
    f = sys._getframe(2)
    if f is not None and f.f_code is EAGER_FRAME_CODE:   # the mode's wrapper
        f = f.f_back
    if f is None:
        return None
    if f.f_code is not _HANDLE_CODE:
        # Only a C method looked up by name on ``torch.Tensor`` arrives as a Python
        # function outside handle_torch_function: a replacement set on the class
        # (``Tensor.softmax = wrapper``) calling the C original, which handed it back.
        original = _by_code.get(func, False)
        if original is False:
            original = _by_code[func] = _replaced_method(func)
        return original
    caller = f.f_back
    code = caller.f_code if caller is not None else None
    if code is None or code is func.__code__:
        return None
    original = _by_code.get(code, False)
    if original is False:   # once per wrapped API: find the function object of that code
        original = next((r for r in gc.get_referrers(code)
                         if type(r) is _FunctionType and r.__code__ is code), None)
        _by_code[code] = original
    return original


def _replaced_method(func):
    """torch's C method whose name on ``torch.Tensor`` is now bound to ``func``."""
    for name, value in vars(torch.Tensor).items():
        if value is func or getattr(value, "__probe_original__", None) is func:
            original = getattr(TensorBase, name, None)
            if original is not None and type(original) is not _FunctionType:
                return original
    return None


class _Patches:
    """Attribute patches shared by every interceptor, installed once, removed by the last user."""

    def __init__(self):
        self.originals = {}   # (owner, attr) -> original attribute value, or _MISSING
        self.installed = {}   # (owner, attr) -> the wrapper set there
        self.users = 0
        self.lock = threading.RLock()   # a finalizer's release() may run inside acquire()

    def acquire(self, targets, new_user=True):
        with self.lock:
            self.users += new_user
            for owner, attr in targets:
                if (owner, attr) not in self.originals:
                    self._install(owner, attr)

    def release(self):
        with self.lock:
            self.users -= 1
            if self.users > 0:
                return
            for (owner, attr), original in reversed(list(self.originals.items())):
                mine = self.installed.pop((owner, attr), None)
                now = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
                if now is not mine:   # replaced since (a user's patch): theirs stays
                    continue
                if original is _MISSING:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, original)
            self.originals.clear()

    def _install(self, owner, attr):
        func = getattr(owner, attr)
        key = (owner, attr)
        self.originals[key] = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else func
        collective = getattr(owner, "__name__", "") == "torch.distributed"

        def patched(*args, **kwargs):
            if compiling_for_patches():
                return func(*args, **kwargs)
            active = state.active
            if active is None and collective:
                active = _backward_owner()
            if active is None or state.depth or active._mode is None:   # none running here
                return func(*args, **kwargs)
            name = active.patched_names.get(key)
            if name is None:
                return func(*args, **kwargs)
            if collective:   # the handler records the tensors it wrote; the user gets its return
                return collectives.unwrap(active.call(name, collectives.CollectiveCall(func, attr), args, kwargs))
            return active.call(name, func, args, kwargs)

        wrapper = run_eagerly(patched)   # called from compiled code, never compiled
        wrapper.__name__ = getattr(func, "__name__", attr)
        wrapper.__qualname__ = getattr(func, "__qualname__", attr)
        wrapper.__doc__ = getattr(func, "__doc__", None)
        wrapper.__wrapped__ = func
        wrapper.__probe_original__ = func   # what registry resolution must look at
        setattr(owner, attr, wrapper)
        self.installed[key] = wrapper


_MISSING = object()
_patches = _Patches()
_started: list = []   # started interceptors, any thread, in start order
_current_autograd_node = getattr(torch._C, "_current_autograd_node", lambda: None)


def _backward_owner():
    """The interceptor of the training thread, for a collective called by a backward node on
    an autograd device thread (CUDA's, NPU's: ``state`` is per thread and that one started
    none). FSDP2's reduce-scatters run there on an accelerator, as does any collective in a
    custom Function's backward (tensor parallelism's gradient all-reduce); the CPU runs
    them on the thread that called ``backward()``."""
    if not _started or _current_autograd_node() is None:
        return None
    return _started[-1]


def _process_group_exists():
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


class Interceptor:
    """Routes every registered API call to ``handler`` between ``start()`` and ``stop()``."""

    def __init__(self, resolved, handler):
        self.resolved = resolved
        self.handler = run_eagerly(handler)   # called from compiled code, never compiled
        self.patched_names = {(torch.Tensor, attr): full for attr, full in resolved.operators.patched.items()}
        self.patched_names.update(((owner, attr), full) for owner, attr, full in resolved.patched)
        # Collectives cannot run before a process group exists: patched only once one does.
        self._collectives = [k for k, full in self.patched_names.items() if full.startswith("Distributed.")]
        self._always = [k for k in self.patched_names if k not in self._collectives]
        self._mode = None
        self._outer = None
        self._patched = False    # False, "some" (not the collectives yet) or "all"
        self._release = None     # finalizer giving the patches back, once
        self.allocators = {}     # id(func) -> None: unregistered calls whose result goes to allocated()
        self.allocated = None

    def watch_allocations(self, funcs, allocated):
        """Hand the results of ``funcs`` (``torch.empty`` and co., not registered APIs) called
        outside any registered call to ``allocated(result)``: buffers whose contents are not
        data until written. Set before ``start()``."""
        self.allocators = dict.fromkeys(id(f) for f in funcs)
        self.allocated = allocated

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
        collectives = self._collectives if self._patched != "all" and _process_group_exists() else []
        if not self._patched or collectives:
            _patches.acquire(self._always + collectives, new_user=not self._patched)
            if not self._patched:   # an interceptor dropped without stop() gives its share back
                self._release = weakref.finalize(self, _patches.release)
            self._patched = "all" if collectives or not self._collectives else "some"
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._outer, state.active = state.active, self
        _started.append(self)

    def stop(self, keep_patches=False):
        if self._mode is not None:
            if self in _started:
                _started.remove(self)
            if state.active is self:
                state.active = self._outer
            else:   # stopped out of order: unlink it from the interceptors started after it
                inner = state.active
                while inner is not None and inner._outer is not self:
                    inner = inner._outer
                if inner is not None:
                    inner._outer = self._outer
            self._outer = None
            try:
                self._mode.__exit__(None, None, None)
            finally:
                self._mode = None
        if self._patched and not keep_patches:
            self._patched = False
            self._release()

    def close(self):
        self.stop()
