"""API-level (L1) dumping: the interceptor's handler turns calls into dump entries.

For each registered call it names the entry (``Functional.linear.3``, counters per API
restarting at each step), applies the filters, summarises inputs before the call (an
in-place API overwrites them) and outputs after, records the stack, hands tensor copies
and the entry to the writer, and hooks the call's autograd nodes for its backward entry.
Any failure in this bookkeeping is logged once per API; the call's real result is
always returned, and exceptions raised by the API itself propagate unchanged.
"""
import logging
import re
import types

import torch

from probe.dump import stats
from probe.dump.call_site import as_called
from probe.dump.records import describe_value
from probe.dump.stack import StackTable
from probe.hook_module import grad_capture
from probe.hook_module.interceptor import guard

log = logging.getLogger("probe")
_no_function_mode = torch._C.DisableTorchFunction


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


_DIRECTION = re.compile(r"\.(?:forward|backward)(?=(?:\.\d+)?$)")


def scope_key(entry_name):
    """Entry name without its direction: ``Functional.linear.0``, ``Module.a.Linear.0``."""
    return _DIRECTION.sub("", entry_name, count=1)


def _base(entry_name):
    return scope_key(entry_name)


class _Summaries:
    """Tensor summary dicts of one call, filled in with a single host fetch.

    With ``async_dump`` (``cache.deferred`` is a list) the fetch of accelerator tensors'
    reductions waits for the next flush of dump.json, where every pending call is
    fetched in one transfer: no host sync per call at all.
    """
    __slots__ = ("cache", "todo")

    def __init__(self, cache):
        self.cache = cache
        self.todo = []  # (summary dict, tensor or None, reductions)

    def add(self, t, summary):
        hit = self.cache.lookup(t)
        if hit is None:
            r = stats.reductions(t)
            if type(r) is not tuple or self.cache.defer_on_cpu:   # waits for one fetch
                self.todo.append((summary, t, r))
                return
            hit = r                    # summarised on the spot (a CPU float tensor)
            self.cache.store(t, r)
        summary["Max"], summary["Min"], summary["Mean"], summary["Norm"] = hit

    def resolve(self):
        if not self.todo:
            return
        deferred = self.cache.deferred
        if deferred is not None and (self.cache.defer_on_cpu or not _all_on_cpu(self.todo)):
            # keep the small reduction results, not the tensors themselves
            deferred.extend((summary, None, r) for summary, _, r in self.todo)
            self.todo = []
            return
        values = stats.fetch([r for _, _, r in self.todo])
        for (summary, t, _), v in zip(self.todo, values):
            summary["Max"], summary["Min"], summary["Mean"], summary["Norm"] = v
            if t is not None:
                self.cache.store(t, v)
        self.todo = []


def _any_pending(grads):
    for g in grads:
        if g is not None and "_pending" in g:
            return True
    return False


def _all_on_cpu(todo):
    for _, _, r in todo:
        if type(r) is stats.Pending and r.parts[0].device.type != "cpu":
            return False
    return True


class ApiCollector:
    """The interceptor's handler for L1 dumping."""

    # Gradients' statistics are fetched once per backward entry on an accelerator;
    # True forces that path on the CPU too (the tests use it).
    defer_grad_fetch = False

    def __init__(self, config, writer):
        self.config = config
        self.writer = writer
        self.filter = CallFilter(config)
        self.md5 = config.summary_mode == "md5"
        self.save_tensors = config.task == "tensor"
        self.stacks = StackTable()
        self.cache = stats.SummaryCache()
        if config.async_dump:
            self.cache.deferred = []
            writer.before_flush = self._fetch_deferred
        self.counters = {}
        self._failed = set()
        # mix: a Construct shared with the module hooks; None at L1 (construct.json {}).
        self.construct = None

    def reset_step(self):
        self.counters.clear()
        self.stacks.clear()
        self.cache.clear()
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
        # probe's own tensor work (statistics, detach, hooks) goes past every
        # __torch_function__: past probe's mode, which a patched operator's hook runs
        # under (~40 pass-through calls per API), and past the user's modes and tensor
        # subclasses, which must not see probe's work
        try:
            with _no_function_mode():
                call = self._before(base, func, args, kwargs)
        except Exception as exc:
            self._fail(name, exc)
            call = None
        out = func(*args, **kwargs)
        if call is not None:
            when_done = getattr(out, "when_done", None)   # an async collective: outputs once it completes
            if when_done is None or not when_done(lambda: self._finish(name, call, out)):
                self._finish(name, call, out)
        return out

    def _finish(self, name, call, out):
        try:
            with _no_function_mode():
                self._after(call, out)
        except Exception as exc:
            self._fail(name, exc)

    def _fetch_deferred(self):
        """async_dump: fill every summary waiting for its numbers, in one host transfer."""
        pending, self.cache.deferred[:] = list(self.cache.deferred), []
        if pending:
            with guard(), _no_function_mode():
                values = stats.fetch([r for _, _, r in pending])
            for (summary, _, _), v in zip(pending, values):
                summary["Max"], summary["Min"], summary["Mean"], summary["Norm"] = v

    def _fail(self, name, exc):
        if name not in self._failed:
            self._failed.add(name)
            log.warning("probe: dumping %s failed (%s: %s); the API's result is unaffected",
                        name, type(exc).__name__, exc)

    # ---- forward ------------------------------------------------------------
    def _before(self, base, func, args, kwargs):
        if type(func) is types.FunctionType:
            args, kwargs = as_called(func, args, kwargs)
        fwd = base + ".forward"
        summaries = _Summaries(self.cache)
        call = {"base": base, "summaries": summaries, "entry": {}, "grad": None,
                "parent": None if self.construct is None else self.construct.current}
        flt = self.filter
        if flt.forward and flt.inputs:
            save = self.save_tensors   # file names are built only where files are written
            call["entry"]["input_args"] = [self._describe(a, summaries, save and f"{fwd}.input.{i}")
                                           for i, a in enumerate(args)]
            call["entry"]["input_kwargs"] = {k: self._describe(v, summaries, save and f"{fwd}.{k}")
                                             for k, v in kwargs.items()}
        if flt.forward:
            self.stacks.capture(fwd, getattr(func, "__code__", None))
        if flt.backward and torch.is_grad_enabled():
            inputs = grad_capture.input_slots(args, kwargs)
            if any(t is not None and t.requires_grad for t in inputs):
                call["grad"] = (grad_capture.edges_before(inputs), len(inputs))
        return call

    def _after(self, call, out):
        base = call["base"]
        flt = self.filter
        summaries = call["summaries"]
        entry = call["entry"]
        if flt.forward and flt.outputs:
            outs = out if isinstance(out, (tuple, list)) else [out]
            save = self.save_tensors
            entry["output"] = [self._describe(o, summaries, save and f"{base}.forward.output.{i}")
                               for i, o in enumerate(outs)]
        summaries.resolve()
        parent = call["parent"]
        if flt.forward:
            self.writer.add_entry(base + ".forward", entry)
            if self.construct is not None:
                self.construct.tree[base + ".forward"] = parent and parent[0]
        if call["grad"] is not None:
            before, n_inputs = call["grad"]
            outputs = grad_capture.output_slots(out)
            grad_capture.hook_call(before, outputs, n_inputs, self._grad_seen,
                                   self._backward_done_fn(base, parent))

    def _summary(self, t, summaries):
        s = summaries.cache.summary(t)
        if s is None:
            s = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
                 "Max": None, "Min": None, "Mean": None, "Norm": None,
                 "requires_grad": t.requires_grad}
            summaries.add(t, s)
        if self.md5:
            s["md5"] = stats.crc32(t)
        return s

    def _describe(self, v, summaries, file_stem=None):
        """``v``'s dump.json form; ``file_stem`` names its tensor files (task tensor; a
        false value where no file is written, so the hot path builds no names)."""
        if isinstance(v, torch.Tensor):
            s = self._summary(v, summaries)
            if self.save_tensors and file_stem:
                s["data_name"] = self._save(v, file_stem)
            return s
        if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
            return [self._describe(x, summaries, file_stem and f"{file_stem}.{i}") for i, x in enumerate(v)]
        if isinstance(v, dict):
            return {k: self._describe(x, summaries, file_stem and f"{file_stem}.{k}") for k, x in v.items()}
        return describe_value(v)

    def _save(self, t, file_stem):
        name = file_stem + ".npy"
        self.writer.add_tensor(name, stats.host_copy(t))
        return name

    # ---- backward -----------------------------------------------------------
    def _grad_seen(self, g):
        """Summarise a gradient inside the backward pass, before autograd reuses its buffer.

        On an accelerator the reductions start now but are fetched with the rest of the
        entry's (``_resolve_grads``): one host transfer per backward entry.
        """
        with _no_function_mode():   # in a backward hook the function mode is live
            if not (self.md5 or self.save_tensors):
                s = self.cache.summary(g)   # a plain CPU tensor: the whole dict in one call
                if s is not None:
                    return s
        with guard(), _no_function_mode():
            summaries = _Summaries(self.cache)
            s = self._summary(g, summaries)
            if not summaries.todo or (g.device.type == "cpu" and not self.defer_grad_fetch):
                summaries.resolve()
            else:
                s["_pending"] = summaries
            if self.save_tensors:
                s["_tensor"] = stats.host_copy(g)
            return s

    @staticmethod
    def _resolve_grads(grads):
        """Fetch the pending reductions of one backward entry's gradients together."""
        pending = [g.pop("_pending") for g in grads if g is not None and "_pending" in g]
        if pending:
            with guard(), _no_function_mode():
                merged = pending[0]
                for p in pending[1:]:
                    merged.todo.extend(p.todo)
                merged.resolve()

    def _backward_done_fn(self, base, parent=None):
        bwd = base + ".backward"
        construct = self.construct

        def on_done(out_grads, in_grads):
            try:
                entry = {}
                flt = self.filter
                if self.save_tensors or _any_pending(out_grads) or _any_pending(in_grads):
                    self._resolve_grads(out_grads + in_grads)
                    if flt.inputs:
                        entry["input"] = [self._finish_grad(g, f"{bwd}.input.{i}") for i, g in enumerate(out_grads)]
                    if flt.outputs:
                        entry["output"] = [self._finish_grad(g, f"{bwd}.output.{i}") for i, g in enumerate(in_grads)]
                else:   # summaries complete, no tensor files: nothing to finish
                    if flt.inputs:
                        entry["input"] = list(out_grads)   # a copy: a second backward may reuse the list
                    if flt.outputs:
                        entry["output"] = in_grads
                self.writer.add_entry(bwd, entry)
                if construct is not None:
                    construct.tree[bwd] = parent and parent[1]
            except Exception as exc:
                self._fail(base.rsplit(".", 1)[0], exc)
        return on_done

    def _finish_grad(self, summary, file_stem):
        if summary is None:
            return None
        self._resolve_grads([summary])
        array = summary.pop("_tensor", None)
        if array is not None:
            name = file_stem + ".npy"
            self.writer.add_tensor(name, array)
            summary["data_name"] = name
        return summary
