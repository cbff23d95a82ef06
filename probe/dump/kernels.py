"""Kernel-level (L2) dumping: every aten op the dispatcher runs, forward and backward.

msprobe's L2 dumps NPU kernels through the vendor's tooling; here L2 is the dispatcher
level, seen by a ``TorchDispatchMode`` between ``start()`` and ``stop()``. It sees the
kernels autograd runs during ``loss.backward()`` too; like msprobe's kernel entries they
are recorded as forward entries of those kernels: ``Aten.mm.default.3.forward``. The
YAML's ``aten`` section (op names without overload) says which ops are dumped.

Each entry also records, under ``"api"``, the registered API it ran under, named with
the same counters an L1 or mix dump of the run uses (``Functional.linear.0.forward``;
a backward kernel: ``Functional.linear.0.backward``), so a compare can drill from the
API that diverged to its kernels. A light interceptor handler (``ApiTracker``) names the
APIs without dumping them; backward kernels find theirs on the autograd node running.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from probe.dump.entry_builder import Summaries
from probe.dump.modules import blocked
from probe.dump.records import ForwardEntry
from probe.hook_module.grad_capture import input_slots, output_slots
from probe.hook_module.interceptor import state
from probe.hook_module.torch_function_off import no_function_mode
from probe.torch_compat import op_name

_current_node = torch._C._current_autograd_node
_META_KEY = "probe_api"


class _NoCache:
    """For outputs of mutating kernels: below autograd the version counter is bumped only
    after the kernel returns, so a (tensor, version) cache would hand back the input's
    summary taken before the kernel ran."""
    deferred = None
    defer_on_cpu = False
    step_stats = None

    def summary(self, t, token_shape=None):   # the compiled path would cache it: stats.reductions' path instead
        return None

    def lookup(self, t):
        return None

    def store(self, t, value):
        pass


_NO_CACHE = _NoCache()


class ApiTracker:
    """Interceptor handler at L2: names each outermost API call, dumps nothing."""

    def __init__(self):
        self.counters = {}
        self.current = None

    def reset_step(self):
        self.counters.clear()
        self.current = None

    def __call__(self, name, func, args, kwargs):
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        base = f"{name}.{n}"
        before = None
        if torch.is_grad_enabled():
            with no_function_mode():
                before = _grad_fns(input_slots(args, kwargs))
        prev = self.current
        self.current = base + ".forward"
        try:
            out = func(*args, **kwargs)
        finally:
            self.current = prev
        if before is not None:
            try:
                with no_function_mode():
                    _tag_nodes(output_slots(out), before, base + ".backward")
            except Exception:  # never the user's problem: those kernels lack "api"
                pass
        return out


def _grad_fns(tensors) -> set:
    return {t.grad_fn for t in tensors if t is not None and t.grad_fn is not None}


def _tag_nodes(outputs, before: set, label: str, limit: int = 512) -> None:
    """Mark every autograd node the call created with ``label``, so each backward
    kernel finds its API on the node running it (not only the output's node: a 3-D
    linear, a chunk, a cross_entropy make several).  The walk goes from the outputs'
    nodes towards the inputs and stops at the inputs' own nodes (taken before the call:
    an in-place call replaces them), at leaves and at nodes an earlier API marked."""
    todo = [fn for fn in _grad_fns(outputs) if fn not in before]
    seen = set(todo)
    while todo and limit:
        fn = todo.pop()
        limit -= 1
        try:
            meta = fn.metadata
        except Exception:  # some nodes take no metadata
            continue
        if _META_KEY in meta:
            continue
        meta[_META_KEY] = label
        for nxt, _ in fn.next_functions:
            if (nxt is not None and nxt not in seen and nxt not in before
                    and type(nxt).__name__ != "AccumulateGrad"):
                seen.add(nxt)
                todo.append(nxt)


class _Mode(TorchDispatchMode):
    def __init__(self, dumper):
        super().__init__()
        self._dumper = dumper

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._dumper.call(func, args, kwargs or {})


class KernelDumper:
    """The dispatch mode's handler; shares writer, filter and stacks with ``api``."""

    def __init__(self, api_collector, aten_ops, tracker):
        self.api = api_collector
        self.aten = aten_ops
        self.tracker = tracker
        self.counters = {}
        self.names = {}     # OpOverload -> ("Aten.mm.default", mutates), or None when the YAML leaves it out
        self._mode = None

    @property
    def active(self):
        return self._mode is not None

    def reset_step(self):
        self.counters.clear()

    def start(self):
        if self._mode is None:
            self._mode = _Mode(self)
            self._mode.__enter__()

    def stop(self):
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            finally:
                self._mode = None

    def call(self, func, args, kwargs):
        info = self.names.get(func, False)
        if info is False:
            info = self._name(func)
        if info is None or blocked.value:
            return func(*args, **kwargs)
        name, mutates = info
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        base = f"{name}.{n}"
        api = self.api
        entries = api.entries
        flt = api.filter
        node = _current_node()
        if (not (flt.backward if node is not None else flt.forward)) or not flt.wants(base):
            return func(*args, **kwargs)
        fwd = base + ".forward"
        summaries = entry = None
        state.depth += 1   # probe's own torch calls are not APIs of the run
        try:
            summaries = entries.summaries()
            entry = ForwardEntry()
            if flt.inputs:
                entries.inputs(entry, fwd, args, kwargs, summaries)
            api.stacks.capture(fwd)
        except Exception as exc:
            entries.fail(name, exc)
            entry = None
        finally:
            state.depth -= 1
        out = func(*args, **kwargs)
        if entry is None:
            return out
        state.depth += 1
        try:
            if flt.outputs:
                out_summaries = Summaries(_NO_CACHE) if mutates else summaries
                entries.outputs(entry, fwd, out, out_summaries)
                if mutates:
                    out_summaries.resolve()
            summaries.resolve()
            if node is not None:
                owner = node.metadata.get(_META_KEY)
            else:
                owner = self.tracker.current
            if owner is not None:
                entry.api = owner
            api.writer.add_entry(fwd, entry)
        except Exception as exc:
            entries.fail(name, exc)
        finally:
            state.depth -= 1
        return out

    def _name(self, func):
        op = op_name(func)
        info = None
        if op in self.aten:
            info = (f"Aten.{op}.{func._overloadname}", bool(func._schema.is_mutable))
        self.names[func] = info
        return info
