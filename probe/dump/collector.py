"""API-level (L1) dumping: the interceptor's handler turns calls into dump entries.

For each registered call it names the entry (``Functional.linear.3``, counters per API
restarting at each step), applies the filters, summarises inputs before the call (an
in-place API overwrites them) and outputs after, records the stack, hands tensor copies
and the entry to the writer, and hooks the call's autograd nodes for its backward entry.
Any failure in this bookkeeping is logged once per API; the call's real result is
always returned, and exceptions raised by the API itself propagate unchanged.
"""
import re
import types

import torch

from probe.dump.call_site import as_called
from probe.dump.entry_builder import EntryBuilder
from probe.dump.records import ForwardEntry
from probe.hook_module import grad_capture
from probe.hook_module.custom_ops import handle_args, mutated_args
from probe.hook_module.torch_function_off import no_function_mode
from probe.vocabulary import CUSTOM, HIDDEN_WRITES, in_place, scope_key


class CallFilter:
    """``list``, ``scope`` and ``data_mode`` of the config, decided per entry, at every level.

    One filter is shared by the APIs, modules and kernels of a dump, so in mix a scope
    may open on a module and close on an API. Scope compares keys without the direction
    (``scope_key``), so ``Module.a.Linear.forward.0`` and ``...backward.0`` both work.
    """

    def __init__(self, config):
        self.patterns = []
        self.substrings = []
        for item in config.list:
            if item.startswith("regex(") and item.endswith(")"):
                self.patterns.append(re.compile(item[6:-1]))
            else:
                self.substrings.append(item)
        self.scope = tuple(scope_key(s) for s in config.scope)
        self.scope_state = 0 if self.scope else 1   # 0 before first, 1 inside, 2 after last, 3 in last module
        self.everything = not (self.scope or self.patterns or self.substrings)   # wants() is always True
        modes = set(config.data_mode)
        every = "all" in modes
        self.forward = every or "forward" in modes or not modes & {"forward", "backward"}
        self.backward = every or "backward" in modes or not modes & {"forward", "backward"}
        self.inputs = every or "input" in modes or not modes & {"input", "output"}
        self.outputs = every or "output" in modes or not modes & {"input", "output"}

    def reset(self):
        self.scope_state = 0 if self.scope else 1

    def wants(self, base, name=None, module=False):
        """Should the call keyed ``base`` ("Functional.linear.0") be dumped?

        ``name`` is what ``list`` matches (default ``base + ".forward"``). A module that
        closes the scope keeps it open until it returns (``module_exit``), so what runs
        inside the last module is dumped too.
        """
        if self.scope:
            state = self.scope_state
            if state == 0:
                if base != self.scope[0]:
                    return False
                self.scope_state = 1
            elif state == 2:
                return False
            if state != 3 and base == self.scope[1]:
                self.scope_state = 3 if module else 2
        if self.patterns or self.substrings:
            if name is None:
                name = base + ".forward"
            return any(s in name for s in self.substrings) or any(p.search(name) for p in self.patterns)
        return True

    def module_exit(self, base):
        if self.scope_state == 3 and base == self.scope[1]:
            self.scope_state = 2


class _Call:
    """One API call between its ``before`` and ``after``."""
    __slots__ = ("base", "summaries", "entry", "grad", "parent", "target", "out_kw")

    def __init__(self, base, summaries, entry, parent):
        self.base = base
        self.summaries = summaries
        self.entry = entry
        self.grad = None     # (autograd edges before the call, number of input slots)
        self.parent = parent
        self.target = None   # an in-place API's first argument (a custom op's written ones): what it writes
        self.out_kw = None   # its ``out=`` argument


class _InPlace(dict):
    """``in_place[name]``: does API ``name`` (``Tensor.add_``, ``Torch._foreach_mul_``,
    ``Tensor.__iadd__``) write its first argument; decided once per name."""

    def __missing__(self, name):
        value = self[name] = in_place(name.rsplit(".", 1)[-1])
        return value


_in_place = _InPlace()


class _Handles(dict):
    """``handles[op]``: the (position, name) of a custom op's handle arguments, once per op."""

    def __missing__(self, func):
        value = self[func] = handle_args(func)
        return value


_handles = _Handles()


def _written(slots, args, kwargs):
    """The tensors at ``slots`` ((position, keyword), ...) of one call, where given."""
    found = []
    for i, kw in slots:
        t = args[i] if i < len(args) else kwargs.get(kw)
        if isinstance(t, torch.Tensor):
            found.append(t)
    return found
_CUSTOM = CUSTOM + "."


class ApiCollector:
    """The interceptor's handler for L1 dumping: names and filters calls; the entries
    themselves come from the shared ``EntryBuilder`` (``self.entries``)."""

    def __init__(self, config, writer, entries=None):
        self.config = config
        self.writer = writer
        self.filter = CallFilter(config)
        self.entries = entries or EntryBuilder(config, writer)
        self.stacks = self.entries.stacks
        self.cache = self.entries.cache
        self.counters = {}
        # mix: a Construct shared with the module hooks; None at L1 (construct.json {}).
        self.construct = None

    def reset_step(self):
        self.counters.clear()
        self.entries.reset_step()
        self.filter.reset()
        if self.construct is not None:
            self.construct.reset()

    # ---- the handler ------------------------------------------------------
    def __call__(self, name, func, args, kwargs):
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        base = f"{name}.{n}"
        flt = self.filter
        if not flt.everything and not flt.wants(base):
            return func(*args, **kwargs)
        try:
            with no_function_mode():
                call = self._before(name, base, func, args, kwargs)
        except Exception as exc:
            self.entries.fail(name, exc)
            call = None
        out = func(*args, **kwargs)
        if call is not None:
            when_done = getattr(out, "when_done", None)   # an async collective: outputs once it completes
            if when_done is None or not when_done(lambda: self._finish(name, call, out)):
                self._finish(name, call, out)
        return out

    def _finish(self, name, call, out):
        try:
            with no_function_mode():
                self._after(call, out)
        except Exception as exc:
            self.entries.fail(name, exc)

    # ---- forward ------------------------------------------------------------
    def _before(self, name, base, func, args, kwargs):
        if type(func) is types.FunctionType:
            args, kwargs = as_called(func, args, kwargs)
        fwd = base + ".forward"
        entries = self.entries
        call = _Call(base, entries.summaries(), ForwardEntry(),
                     None if self.construct is None else self.construct.current)
        flt = self.filter
        custom = name.startswith(_CUSTOM)
        if args and _in_place[name]:
            call.target = args[0]
        elif custom:   # a custom op writes what its schema marks (a!)
            call.target = mutated_args(func, args, kwargs) or None
        elif name in HIDDEN_WRITES:
            call.target = _written(HIDDEN_WRITES[name], args, kwargs) or None
        call.out_kw = kwargs.get("out")
        if flt.forward:
            if flt.inputs:
                entries.inputs(call.entry, fwd, args, kwargs, call.summaries)
                if custom:
                    for i, arg in _handles[func]:   # an address, not data
                        if i < len(args):
                            call.entry.input_args[i] = entries.opaque(args[i])
                        elif arg in kwargs:
                            call.entry.input_kwargs[arg] = entries.opaque(kwargs[arg])
            self.stacks.capture(fwd, getattr(func, "__code__", None))
        if flt.backward and torch.is_grad_enabled():
            inputs = grad_capture.input_slots(args, kwargs)
            if any(t is not None and t.requires_grad for t in inputs):
                call.grad = (grad_capture.edges_before(inputs), len(inputs))
        return call

    def _after(self, call, out):
        base = call.base
        flt = self.filter
        shown = out
        fresh = self.entries.fresh
        if fresh:   # written: data from now on
            fresh.written(call.target)
            fresh.written(call.out_kw)
            if getattr(out, "when_done", None) is not None:   # a collective's result: the tensors it wrote
                fresh.written(list(out))
        if call.target is not None:
            self.entries.cache.forget(call.target)
            if out is None and not base.rsplit(".", 1)[0].endswith("__"):
                shown = call.target   # torch._fused_adamw_ and co. return nothing: what they wrote
                # is the result (``x[i] = v`` keeps msprobe's null output)
        if flt.forward and flt.outputs:
            self.entries.outputs(call.entry, base + ".forward", shown, call.summaries)
        call.summaries.resolve()
        parent = call.parent
        if flt.forward:
            self.writer.add_entry(base + ".forward", call.entry)
            if self.construct is not None:
                self.construct.tree[base + ".forward"] = parent and parent[0]
        if call.grad is not None:
            before, n_inputs = call.grad
            outputs = grad_capture.output_slots(out)
            grad_capture.hook_call(before, outputs, n_inputs, self.entries.grad_seen,
                                   self._backward_done_fn(base, parent))

    # ---- backward -----------------------------------------------------------
    def _backward_done_fn(self, base, parent=None):
        bwd = base + ".backward"
        construct = self.construct
        entries = self.entries

        def on_done(out_grads, in_grads):
            try:
                flt = self.filter
                entry = entries.backward_entry(bwd, out_grads, in_grads, flt.inputs, flt.outputs)
                self.writer.add_entry(bwd, entry)
                if construct is not None:
                    construct.tree[bwd] = parent and parent[1]
            except Exception as exc:
                entries.fail(base.rsplit(".", 1)[0], exc)
        return on_done
