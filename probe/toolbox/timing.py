"""OpTimeMeasure: forward and backward time of every chosen API call.

Forward: on CUDA / NPU, events recorded around the call on the current stream and read
once at ``stop()`` (no synchronisation per call, so the timed program keeps its overlap);
``sync=True`` synchronises before and after each call instead (wall time, kernels
included). On the CPU, ``time.perf_counter``.
Backward: from the moment autograd reaches the call's output nodes (pre-hook) to the moment
the last node leading into its inputs has run (post-hook), found with grad_capture, so it
is this API's backward and not the whole graph's. The first ``warmup`` calls of each API
are flagged and left out of the summary (caches, allocator and autotuning make them slow).
"""
import logging
import os
import time

import torch

from probe.hook_module import grad_capture
from probe.hook_module.interceptor import guard
from probe.toolbox import base

log = logging.getLogger(__name__)

COLUMNS = ["name", "call_id", "forward_ms", "backward_ms", "input_shapes", "input_dtypes",
           "output_shapes", "output_dtypes", "device", "warmup"]


class _Clock:
    """Timestamps for one device: events on CUDA / NPU, perf_counter elsewhere."""

    def __init__(self, device, sync):
        kind = device.type
        self.device = device
        self.events = None
        self.sync = sync and kind in ("cuda", "npu")
        if not sync:
            if kind == "cuda" and torch.cuda.is_available():
                self.events = torch.cuda.Event
            elif kind == "npu" and hasattr(torch, "npu") and torch.npu.is_available():
                self.events = torch.npu.Event

    def mark(self):
        if self.events is not None:
            e = self.events(enable_timing=True)
            e.record()
            return e
        if self.sync:
            base.synchronize(self.device)
        return time.perf_counter()

    @staticmethod
    def elapsed_ms(a, b):
        if a is None or b is None:
            return None
        if isinstance(a, float):
            return (b - a) * 1e3
        b.synchronize()
        return a.elapsed_time(b)


class OpTimeMeasure(base.ToolBase):
    """Time chosen APIs; ``rows`` (one per call) go to ``op_time.csv``, a summary to the console.

    ``warmup``: calls per API flagged as warm-up (default 1); ``sync``: synchronise per call
    instead of events; ``backward`` (default True); ``top``: rows in the summary table.
    """
    feature = "op_time_measure"
    env_list = "OP_TIME_MEASURE_LIST"
    env_disable_list = "OP_TIME_MEASURE_DISABLE_LIST"

    def __init__(self, ops=None, disable_ops=None, condition_func=None, output_dir=None,
                 warmup=1, sync=False, backward=True, top=20, yaml_path=None, verbose=None):
        super().__init__(ops, disable_ops, condition_func, yaml_path, output_dir, verbose)
        self.warmup = warmup
        self.sync = sync
        self.backward = backward
        self.top = top
        self.rows = []
        self._marks = []  # (row, key, start, end) read at stop()
        self._clocks = {}

    def _clock(self, device):
        c = self._clocks.get(device)
        if c is None:
            c = self._clocks[device] = _Clock(device, self.sync)
        return c

    def handle(self, name, call_id, func, args, kwargs):
        try:
            with guard():
                device = base.call_device(args, kwargs)
                clock = self._clock(device)
                flat = base.flat_tensors((args, kwargs))
                before = grad_capture.edges_before(flat) if (
                    self.backward and torch.is_grad_enabled() and any(t.requires_grad for t in flat)) else None
                row = {"name": name, "call_id": call_id, "forward_ms": None, "backward_ms": None,
                       "input_shapes": base.describe(flat, "shape"), "input_dtypes": base.describe(flat, "dtype"),
                       "device": str(device), "warmup": call_id < self.warmup}
                start = clock.mark()
        except Exception as exc:
            self.fail(name, exc)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            with guard():
                end = clock.mark()
                self._marks.append((row, "forward_ms", start, end))
                outs = base.flat_outputs(out)
                present = [o for o in outs if o is not None]
                row["output_shapes"] = base.describe(present, "shape")
                row["output_dtypes"] = base.describe(present, "dtype")
                self.rows.append(row)
                if before is not None:
                    self._hook_backward(row, before, outs, len(flat), clock)
        except Exception as exc:
            self.fail(name, exc)
        return out

    def _hook_backward(self, row, before, outs, n_in, clock):
        t0 = []

        def seen(g):
            if not t0:
                with guard():
                    t0.append(clock.mark())
            return None

        def on_done(out_grads, in_grads):
            with guard():
                end = clock.mark()
                if t0:
                    if self.active:
                        self._marks.append((row, "backward_ms", t0[0], end))
                    else:  # backward after stop(): read now and rewrite the report
                        row["backward_ms"] = _Clock.elapsed_ms(t0[0], end)
                        try:
                            self._write()
                        except OSError as exc:
                            self.fail(row["name"], exc, "report not written")

        grad_capture.hook_call(before, outs, n_in, seen, on_done)

    # ---- report ----------------------------------------------------------------------
    def _resolve(self):
        for row, key, a, b in self._marks:
            row[key] = _Clock.elapsed_ms(a, b)
        self._marks = []

    def summary(self):
        """Per API (warm-up calls excluded): calls, forward and backward total / mean ms, slowest first."""
        agg = {}
        for r in self.rows:
            if r["warmup"]:
                continue
            a = agg.setdefault(r["name"], {"name": r["name"], "calls": 0, "forward_ms": 0.0, "backward_ms": 0.0,
                                           "backward_calls": 0})
            a["calls"] += 1
            a["forward_ms"] += r["forward_ms"] or 0.0
            if r["backward_ms"] is not None:
                a["backward_ms"] += r["backward_ms"]
                a["backward_calls"] += 1
        out = sorted(agg.values(), key=lambda a: a["forward_ms"] + a["backward_ms"], reverse=True)
        for a in out:
            a["total_ms"] = a["forward_ms"] + a["backward_ms"]
            a["forward_mean_ms"] = a["forward_ms"] / a["calls"]
            a["backward_mean_ms"] = a["backward_ms"] / a["backward_calls"] if a["backward_calls"] else None
        return out

    def _write(self):
        sink = base.CsvSink(os.path.join(self.output_dir, "op_time.csv"), COLUMNS)
        sink.rows = self.rows
        sink.rewrite()
        cols = ["name", "calls", "total_ms", "forward_ms", "forward_mean_ms", "backward_ms", "backward_mean_ms"]
        s = base.CsvSink(os.path.join(self.output_dir, "op_time_summary.csv"), cols)
        s.rows = self.summary()
        s.rewrite()

    def on_stop(self):
        self._resolve()
        self._write()
        if self.verbose:
            log.info("%s", format_summary(self.summary()[: self.top]))


def format_summary(rows):
    head = f"{'API':<36} {'calls':>6} {'total ms':>10} {'fwd ms':>10} {'fwd mean':>10} {'bwd ms':>10} {'bwd mean':>10}"
    lines = ["probe op_time_measure: slowest APIs (warm-up calls excluded)", head, "-" * len(head)]
    for a in rows:
        bm = "-" if a["backward_mean_ms"] is None else f"{a['backward_mean_ms']:.4f}"
        lines.append(f"{a['name'][:36]:<36} {a['calls']:>6} {a['total_ms']:>10.4f} {a['forward_ms']:>10.4f} "
                     f"{a['forward_mean_ms']:>10.4f} {a['backward_ms']:>10.4f} {bm:>10}")
    return "\n".join(lines)
