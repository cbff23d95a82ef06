"""Dump side of task ``overflow_check``: keep only the calls where Inf/NaN first appear.

Every registered call is checked as it runs: if none of its float inputs holds Inf/NaN
and one of its outputs does, the call is dumped at full detail (statistics and a tensor
file for every input and output) and logged at once; the same holds for a backward
whose grads w.r.t. the inputs turn non-finite while the grads w.r.t. the outputs (and
the forward inputs) were finite. Calls that merely pass Inf/NaN on are not dumped.
After ``overflow_nums`` such calls (-1: no limit) checking stops and costs nothing more.

Checking costs one ``isfinite().all()`` per float tensor; only in-place APIs have their
inputs copied before the call (their inputs are overwritten), and gradients are kept
only while their call's backward runs.

    collector = OverflowCollector(config, writer, overflow_nums=1)   # an Interceptor handler
    with OverflowCheck("./dump", overflow_nums=1) as oc:             # or stand-alone
        loss = model(x); loss.backward()
    oc.found  # ["Torch.exp.0.forward"]
"""
from __future__ import annotations

import logging
import os

import torch

from probe.dump.collector import ApiCollector
from probe.dump.entry_builder import EntryBuilder
from probe.dump.records import BackwardEntry, ForwardEntry
from probe.hook_module import grad_capture
from probe.hook_module.interceptor import guard

log = logging.getLogger(__name__)


def _nonfinite(tensors) -> bool:
    for t in tensors:
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.numel():
            if not bool(torch.isfinite(t).all()):
                return True
    return False


def _inplace(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return (leaf.endswith("_") and not leaf.endswith("__")) or (leaf.startswith("__i") and leaf.endswith("__")) \
        or leaf == "__setitem__"


def _snapshot(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    return value


class OverflowCollector(ApiCollector):
    """Interceptor handler for ``overflow_check``; dumps overflow origins with their tensors."""

    def __init__(self, config, writer, overflow_nums: int | None = None):
        # "full detail": every tensor of a kept call is saved
        super().__init__(config, writer, EntryBuilder(config, writer, save_tensors=True))
        n = getattr(config, "overflow_nums", 1) if overflow_nums is None else overflow_nums
        self.overflow_nums = int(n)
        self.found: list = []              # entry names dumped, in order

    @property
    def exhausted(self) -> bool:
        return self.overflow_nums != -1 and len(self.found) >= self.overflow_nums

    def __call__(self, name, func, args, kwargs):
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        base = f"{name}.{n}"
        if self.exhausted or not self.filter.wants(base):
            return func(*args, **kwargs)
        flt = self.filter
        try:
            inputs = grad_capture.input_slots(args, kwargs)
            dirty_in = _nonfinite(inputs)
            before = (_snapshot(args), _snapshot(kwargs)) if flt.forward and not dirty_in and _inplace(name) \
                else None
            grad = None
            if flt.backward and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
                grad = (grad_capture.edges_before(inputs), len(inputs))
        except Exception as exc:  # never disturb the user's call
            self.entries.fail(name, exc)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            outputs = grad_capture.output_slots(out)
            if flt.forward and not dirty_in and _nonfinite(outputs):
                a, k = before if before is not None else (args, kwargs)
                self._record_forward(base, func, a, k, out)
            if grad is not None and not self.exhausted:
                grad_capture.hook_call(grad[0], outputs, grad[1], self._keep_grad,
                                       self._on_backward(base, dirty_in))
        except Exception as exc:
            self.entries.fail(name, exc)
        return out

    # ---- forward ------------------------------------------------------------------------
    def _record_forward(self, base, func, args, kwargs, out):
        if self.exhausted:
            return
        fwd = base + ".forward"
        flt = self.filter
        entries = self.entries
        summaries = entries.summaries()
        entry = ForwardEntry()
        if flt.inputs:
            entries.inputs(entry, fwd, args, kwargs, summaries)
        if flt.outputs:
            entries.outputs(entry, fwd, out, summaries)
        summaries.resolve()
        self.stacks.capture(fwd, getattr(func, "__code__", None))
        self._keep(fwd, entry)

    # ---- backward -----------------------------------------------------------------------
    def _keep_grad(self, g):
        """A grad as seen in the backward pass: copied, since autograd may reuse its buffer."""
        with guard():
            return g.detach().clone()

    def _on_backward(self, base, forward_inputs_dirty):
        bwd = base + ".backward"

        def on_done(out_grads, in_grads):
            if self.exhausted or forward_inputs_dirty:
                return
            try:
                with guard():
                    if _nonfinite(out_grads) or not _nonfinite(in_grads):
                        return
                    describe = self.entries.describe
                    summaries = self.entries.summaries()
                    entry = BackwardEntry()
                    if self.filter.inputs:
                        entry.input = [describe(g, summaries, f"{bwd}.input.{i}") for i, g in enumerate(out_grads)]
                    if self.filter.outputs:
                        entry.output = [describe(g, summaries, f"{bwd}.output.{i}") for i, g in enumerate(in_grads)]
                    summaries.resolve()
                    self._keep(bwd, entry)
            except Exception as exc:
                self.entries.fail(base.rsplit(".", 1)[0], exc)
        return on_done

    # ---- shared -------------------------------------------------------------------------
    def _keep(self, name, entry):
        self.writer.add_entry(name, entry)
        self.found.append(name)
        limit = "all" if self.overflow_nums == -1 else self.overflow_nums
        log.warning("probe overflow_check: %s produced Inf/NaN from finite inputs (%d of %s)",
                    name, len(self.found), limit)


class OverflowCheck:
    """Stand-alone overflow_check around a block of code (what task overflow_check does
    inside PrecisionDebugger): files go to ``{dump_path}/step{step}/rank``."""

    def __init__(self, dump_path, overflow_nums=1, step=0, **config):
        from probe.config import load_config
        self.config = load_config(task="tensor", dump_path=dump_path, **config)
        self.rank_dir = os.path.join(dump_path, f"step{step}", "rank")
        self.overflow_nums = overflow_nums
        self.collector = None

    @property
    def found(self):
        return list(self.collector.found) if self.collector else []

    def __enter__(self):
        from probe.dump.writer import DumpWriter
        from probe.hook_module.interceptor import Interceptor
        from probe.hook_module.registry import load_registry, resolve
        self._writer = DumpWriter("overflow_check", self.config.level)
        self.collector = OverflowCollector(self.config, self._writer, self.overflow_nums)
        self._interceptor = Interceptor(resolve(load_registry(self.config.wrap_ops_yaml)), self.collector)
        self._writer.open_dir(self.rank_dir, True)
        self._interceptor.start()
        return self

    def __exit__(self, *exc):
        self._interceptor.stop()
        self._writer.write_meta(self.collector.stacks.parts(), {})
        if exc[0] is None:       # ran to its end: the dump is complete
            self._writer.finish_step()
        self._writer.close()
        return False
