"""The one entry builder: every dumper (APIs, modules, kernels, overflow) makes its
dump.json entries here, so an entry means the same whichever hook saw the call.

An :class:`EntryBuilder` turns a call's values into their JSON form (tensor summaries,
tensor files for task ``tensor``), fills the records of ``records.py``, summarises
gradients inside the backward pass, and logs a dumper's failure once per API. It holds
what a dump step shares: the summary cache, the stack table, the writer.
"""
import logging

import torch

from probe.dump import dtensor_layout, stats
from probe.dump.fresh_buffers import FreshBuffers
from probe.dump.records import BackwardEntry, ForwardEntry, describe_value
from probe.dump.stack import StackTable
from probe.dump.step_stats import StepStats
from probe.hook_module.interceptor import guard
from probe.hook_module.torch_function_off import no_function_mode
from probe.inference import token_stats
from probe.log_once import LogOnce
from probe.torch_compat import real_tensors
from probe.vocabulary import NO_STATS, STAT_KEYS

log = logging.getLogger(__name__)


class Summaries:
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
            r = stats.reductions(t, self.cache.step_stats)
            if type(r) is not tuple or self.cache.defer_on_cpu:   # waits for one fetch
                self.todo.append((summary, t, r))
                return
            hit = r                    # summarised on the spot (a CPU float tensor)
            self.cache.store(t, r)
        summary.update(zip(STAT_KEYS, hit))

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
            summary.update(zip(STAT_KEYS, v))
            if t is not None:
                self.cache.store(t, v)
        self.todo = []


def _all_on_cpu(todo):
    for _, _, r in todo:
        if type(r) is stats.Pending and r.parts.device.type != "cpu":
            return False
    return True


def any_pending(grads):
    """True when a gradient summary still waits for its numbers (``grad_seen``)."""
    for g in grads:
        if g is not None and "_pending" in g:
            return True
    return False


class EntryBuilder:
    """Builds the entries of one dump run; shared by every dumper of a debugger."""

    # Gradients' statistics are fetched once per backward entry on an accelerator;
    # True forces that path on the CPU too (the tests use it).
    defer_grad_fetch = False

    def __init__(self, config, writer, save_tensors=None):
        self.writer = writer
        self.md5 = config.summary_mode == "md5"
        self.save_tensors = config.task == "tensor" if save_tensors is None else save_tensors
        # file_format "pt": torch.save'd CPU tensors (dtype kept, bf16 too), as msprobe writes
        pt = getattr(config, "file_format", "npy") == "pt"
        self.ext, self.host_copy = (".pt", stats.torch_copy) if pt else (".npy", stats.host_copy)
        self.stacks = StackTable()
        self.cache = stats.SummaryCache()
        # an inference step's token_shape (its layout's): floating tensors whose leading dims
        # are these get "token_stats", one [Max, Min, Mean, Norm] per token row
        self.token_shape = None
        self.rows_deferred = None   # async_dump: (summary, TokenRows) fetched at the flush
        self.fresh = FreshBuffers()   # torch.empty buffers not yet written: recorded without values
        if config.async_dump:   # an accelerator's results in one device buffer, fetched at the flush
            self.cache.step_stats = StepStats()
            self.cache.deferred = []
            self.rows_deferred = []
            writer.before_flush.append(self.fetch_deferred)
        self._said = LogOnce(log)

    def reset_step(self):
        self.stacks.clear()
        self.cache.clear()
        self.token_shape = None
        self.fresh.clear()

    def fail(self, name, exc):
        """A dumper's failure on ``name``: said once per API, the call unaffected."""
        self._said.warning(name, "probe: dumping %s failed (%s: %s); the API's result is unaffected",
                        name, type(exc).__name__, exc)

    # ---- forward ------------------------------------------------------------
    def summaries(self, cache=None):
        return Summaries(self.cache if cache is None else cache)

    def inputs(self, entry, fwd, args, kwargs, summaries):
        """Fill ``entry``'s input_args/input_kwargs; files are named only where written."""
        save = self.save_tensors
        describe = self.describe
        entry.input_args = [describe(a, summaries, save and f"{fwd}.input.{i}") for i, a in enumerate(args)]
        entry.input_kwargs = {k: self.unread(v) if k == "out" else describe(v, summaries, save and f"{fwd}.{k}")
                              for k, v in kwargs.items()}

    def outputs(self, entry, fwd, out, summaries):
        outs = out if isinstance(out, (tuple, list)) else [out]
        save = self.save_tensors
        describe = self.describe
        entry.output = [describe(o, summaries, save and f"{fwd}.output.{i}") for i, o in enumerate(outs)]

    def forward_entry(self):
        return ForwardEntry()

    def summary(self, t, summaries):
        md5 = self.md5
        token_shape = self.token_shape
        # token_stats after md5 in the dict: the compiled summary adds them only without it
        s = summaries.cache.summary(t, None if md5 else token_shape)
        if s is None:
            local, layout = dtensor_layout.split(t)   # a DTensor: its shard, no collective
            s = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
                 **NO_STATS, "requires_grad": t.requires_grad}
            if layout is not None:
                s.update(layout)
            summaries.add(local, s)
            t = local
        if md5:
            s["md5"] = stats.crc32(t)
        if token_shape is not None and "token_stats" not in s and token_stats.matches(t, token_shape):
            self.token_rows(t, s, summaries.cache)
        return s

    def token_rows(self, t, s, cache):
        """``s["token_stats"]`` of ``t``: at once on the CPU, at the flush on a device."""
        if t.is_inference():   # never cached (no version counter): no lookup, no store
            rows = token_stats.row_reductions(t, self.token_shape)
        else:
            rows = cache.lookup_rows(t)
            if rows is None:
                rows = token_stats.row_reductions(t, self.token_shape)
                cache.store_rows(t, rows)
        if rows.values is not None or rows.on_cpu or self.rows_deferred is None:
            s["token_stats"] = rows.resolve()
        else:
            self.rows_deferred.append((s, rows))

    def describe(self, v, summaries, file_stem=None):
        """``v``'s dump.json form; ``file_stem`` names its tensor files (task tensor; a
        false value where no file is written, so the hot path builds no names)."""
        if isinstance(v, torch.Tensor):
            if self.fresh and self.fresh.holds(v):
                return self.unread(v)
            s = self.summary(v, summaries)
            if self.save_tensors and file_stem:
                s["data_name"] = self.save(v, file_stem)
            return s
        if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
            rows = self.cache.step_stats
            # a foreach op's list on CUDA: its tensors' rows in two launches
            started = rows is not None and len(v) > 1 and rows.prefetch(v)
            try:
                return [self.describe(x, summaries, file_stem and f"{file_stem}.{i}") for i, x in enumerate(v)]
            finally:
                if started:
                    rows.forget_prefetched()
        if isinstance(v, dict):
            return {k: self.describe(x, summaries, file_stem and f"{file_stem}.{k}") for k, x in v.items()}
        return describe_value(v)

    def unread(self, v):
        """The record of a buffer whose contents are not data (an ``out=`` argument, an
        unwritten ``torch.empty``): no statistics, no tensor file, ``"uninitialized": true``."""
        if isinstance(v, torch.Tensor):
            return {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape),
                    **NO_STATS, "requires_grad": v.requires_grad, "uninitialized": True}
        if isinstance(v, (list, tuple)):
            return [self.unread(x) for x in v]
        return describe_value(v)

    def opaque(self, v):
        """The record of a handle (a custom op's argument holding an address): its type and
        shape, no value, ``"opaque": true``; the compare never compares it."""
        if isinstance(v, torch.Tensor):
            return {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape),
                    **NO_STATS, "requires_grad": v.requires_grad, "opaque": True}
        return {"type": type(v).__name__, "value": None, "opaque": True}

    def save(self, t, file_stem):
        name = file_stem + self.ext
        t = dtensor_layout.split(t)[0]
        self.writer.wait_for_room(t.numel() * t.element_size())   # the copy made once the queue has room
        self.writer.add_tensor(name, self.host_copy(t))
        return name

    def fetch_deferred(self):
        """async_dump: fill every summary waiting for its numbers, in one host transfer."""
        pending, self.cache.deferred[:] = list(self.cache.deferred), []
        if pending:
            with guard(), no_function_mode(), real_tensors():   # a flush may come while dynamo compiles
                values = self.cache.step_stats.fetch([r for _, _, r in pending])
            for (summary, _, _), v in zip(pending, values):
                summary.update(zip(STAT_KEYS, v))
        if self.rows_deferred:
            rows, self.rows_deferred[:] = list(self.rows_deferred), []
            with guard(), no_function_mode(), real_tensors():
                token_stats.fetch_all([r for _, r in rows])
            for summary, r in rows:
                summary["token_stats"] = r.values

    # ---- backward -----------------------------------------------------------
    def grad_seen(self, g):
        """Summarise a gradient inside the backward pass, before autograd reuses its buffer.

        On an accelerator the reductions start now but are fetched with the rest of the
        entry's (``resolve_grads``): one host transfer per backward entry.
        """
        with no_function_mode():   # in a backward hook the function mode is live
            if not (self.md5 or self.save_tensors):
                s = self.cache.summary(g)   # a plain CPU tensor: the whole dict in one call
                if s is not None:
                    return s
        with guard(), no_function_mode():
            summaries = Summaries(self.cache)
            s = self.summary(g, summaries)
            if not summaries.todo or (g.device.type == "cpu" and not self.defer_grad_fetch):
                summaries.resolve()
            else:
                s["_pending"] = summaries
            if self.save_tensors:
                s["_tensor"] = self.host_copy(dtensor_layout.split(g)[0])
            return s

    @staticmethod
    def resolve_grads(grads):
        """Fetch the pending reductions of one backward entry's gradients together."""
        pending = [g.pop("_pending") for g in grads if g is not None and "_pending" in g]
        if pending:
            with guard(), no_function_mode():
                merged = pending[0]
                for p in pending[1:]:
                    merged.todo.extend(p.todo)
                merged.resolve()

    def finish_grad(self, summary, file_stem):
        """A gradient summary from ``grad_seen``, complete: its numbers, its tensor file."""
        if summary is None:
            return None
        self.resolve_grads([summary])
        array = summary.pop("_tensor", None)
        if array is not None:
            name = file_stem + self.ext
            self.writer.add_tensor(name, array)
            summary["data_name"] = name
        return summary

    def backward_entry(self, bwd, out_grads, in_grads, inputs=True, outputs=True):
        """The backward entry of gradients from ``grad_seen``: input = the gradients
        flowing in (of the forward's outputs), output = those flowing out."""
        entry = BackwardEntry()
        if self.save_tensors or any_pending(out_grads) or any_pending(in_grads):
            self.resolve_grads(out_grads + in_grads)
            if inputs:
                entry.input = [self.finish_grad(g, f"{bwd}.input.{i}") for i, g in enumerate(out_grads)]
            if outputs:
                entry.output = [self.finish_grad(g, f"{bwd}.output.{i}") for i, g in enumerate(in_grads)]
        else:   # summaries complete, no tensor files: nothing to finish
            if inputs:
                entry.input = list(out_grads)   # a copy: a second backward may reuse the list
            if outputs:
                entry.output = in_grads
        return entry
