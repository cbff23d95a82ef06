"""Replay one dumped API call on the bench device, in its dumped dtype and in float64.

* bench: the call as the accelerator made it (same dtypes; under autocast when the dump
  shows float inputs producing a lower-precision output), on the trusted device. When the
  bench device has no kernel for a dtype (fp16 on the CPU), the inputs are upcast to
  float32 and the outputs rounded back, and the row says so.
* golden: every float tensor (and float dtype argument) in float64, no autocast.
In-place APIs always run on copies, so neither run sees the other's update.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from probe.precheck.inputs import flat_outputs, flat_tensors
from probe.tensor_tree import map_tensors

_LOW = (torch.float16, torch.bfloat16)
_RANK = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.float64: 3}


@dataclass
class Run:
    """Outputs (flat leaves, CPU) of one replay, or why there are none."""
    outputs: list | None = None
    note: str = ""
    error: str = ""
    in_grads: list = field(default_factory=list)


def _floats_in(value, acc):
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point:
            acc.add(value.dtype)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _floats_in(v, acc)
    elif isinstance(value, dict):
        for v in value.values():
            _floats_in(v, acc)
    return acc


def _has_dtype_arg(args, kwargs):
    return any(isinstance(v, torch.dtype) for v in list(args) + list(kwargs.values()))


def autocast_dtype(args, kwargs, out_dtypes, conversion: bool):
    """The autocast dtype the dump implies, or None, with no explicit dtype argument (that
    is what autocast produces): a float input wider than a low-precision float output (an
    op autocast runs low), or low-precision float inputs only and a wider float output (an
    op autocast runs in float32, e.g. cross_entropy on bf16 logits: replayed without
    autocast it would compute in bf16, a bias that reads as a scaled output)."""
    if conversion or _has_dtype_arg(args, kwargs):
        return None
    ins = _floats_in(list(args) + list(kwargs.values()), set())
    if not ins:
        return None
    outs = [d for d in out_dtypes if d in _LOW]
    if outs:
        low = min(outs, key=_RANK.__getitem__)
        if any(_RANK[d] > _RANK[low] for d in ins if d in _RANK):
            return low
        return None
    wide_out = [d for d in out_dtypes if d in _RANK and d not in _LOW]
    if wide_out and ins <= set(_LOW):
        return min(ins, key=_RANK.__getitem__)
    return None


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return value


def index_as_written(api, args):
    """``t[a, b]`` indexes with a tuple, which dump.json can only write as a list; indexed
    with a list, torch reads it as a tensor of indices (deprecated since 2.9 for a list
    holding slices, None, Ellipsis, lists or tensors: a warning now, an error or a
    different result later). The index of ``__getitem__``/``__setitem__`` is given back as
    the tuple it was; a list of plain ints or bools (``t[[0, 2]]``) stays a list."""
    if api.leaf in ("__getitem__", "__setitem__") and len(args) > 1 and isinstance(args[1], list) \
            and any(isinstance(x, (slice, type(None), type(Ellipsis), list, tuple, torch.Tensor)) for x in args[1]):
        return [args[0], tuple(args[1]), *args[2:]]
    return args


class Replayer:
    """Runs calls on ``device`` for one API: the bench and the golden."""

    def __init__(self, device: str = "cpu"):
        self.device = device

    # ---- argument conversion --------------------------------------------------------
    def _bench_args(self, value, clone):
        def conv(t):
            t = t.to(self.device)
            return t.clone() if clone else t
        return map_tensors(conv, value)

    def _golden_args(self, value, clone, device):
        def conv(t):
            t = t.to(device)
            if t.dtype.is_floating_point:
                return t.to(torch.float64)
            return t.clone() if clone else t
        value = map_tensors(conv, value)
        return _float_dtype_args(value)

    # ---- forward -----------------------------------------------------------------------
    def forward(self, func, args, kwargs, out_dtypes, api, golden: bool = True):
        """(bench Run, golden Run or None)."""
        args = index_as_written(api, args)
        amp = autocast_dtype(args, kwargs, out_dtypes, api.conversion)
        bench = self._run_bench(func, args, kwargs, out_dtypes, api, amp)
        gold = self._run_golden(func, args, kwargs, api) if golden else None
        return bench, gold

    def _call(self, func, a, k, amp):
        ctx = torch.autocast(self.device.split(":")[0], dtype=amp) if amp is not None else contextlib.nullcontext()
        with torch.no_grad(), ctx:
            return func(*a, **k)

    def _run_bench(self, func, args, kwargs, out_dtypes, api, amp):
        note = f"autocast {str(amp).replace('torch.', '')}" if amp is not None else "dumped dtypes"
        try:
            a, k = self._bench_args(args, api.inplace), self._bench_args(kwargs, api.inplace)
            out = self._call(func, a, k, amp)
            return Run(outputs=[_to_cpu(o) for o in flat_outputs(out)], note=note)
        except Exception as exc:            # noqa: BLE001 - any kernel failure is a finding
            first = exc
            low = _floats_in(list(args) + list(kwargs.values()), set()) & set(_LOW)
            if not low:
                return Run(error=f"{type(first).__name__}: {_short(first)}")
        # No kernel for fp16/bf16 here: compute in float32, round the outputs back.
        up = lambda t: t.to(torch.float32) if t.dtype in _LOW else t       # noqa: E731
        try:
            a = map_tensors(up, self._bench_args(args, api.inplace))
            k = map_tensors(up, self._bench_args(kwargs, api.inplace))
            out = [_to_cpu(o) for o in flat_outputs(self._call(func, a, k, None))]
        except Exception as exc:            # noqa: BLE001
            return Run(error=f"{type(exc).__name__}: {_short(exc)}")
        out = [o.to(d) if isinstance(o, torch.Tensor) and d is not None and o.dtype.is_floating_point else o
               for o, d in zip(out, list(out_dtypes) + [None] * (len(out) - len(out_dtypes)))]
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in low))
        return Run(outputs=out, note=f"upcast to float32 ({names} kernel missing on {self.device}: {_short(first)})")

    def golden(self, func, args, kwargs, api):
        """The call in float64 (on this device, else on the CPU) alone: a Run."""
        return self._run_golden(func, index_as_written(api, args), kwargs, api)

    def _run_golden(self, func, args, kwargs, api):
        for device in dict.fromkeys([self.device, "cpu"]):
            try:
                a = self._golden_args(args, api.inplace, device)
                k = self._golden_args(kwargs, api.inplace, device)
                with torch.no_grad():
                    out = func(*a, **k)
                return Run(outputs=[_to_cpu(o) for o in flat_outputs(out)],
                           note="float64" + ("" if device == self.device else " on cpu"))
            except Exception as exc:        # noqa: BLE001
                err = f"{type(exc).__name__}: {_short(exc)}"
        return Run(error=err)

    # ---- backward ----------------------------------------------------------------------
    def backward(self, func, args, kwargs, wants_grad, out_grads, out_dtypes, api, golden: bool):
        """Grads w.r.t. the input slots (argument order) from the dumped output grads.

        ``wants_grad[i]`` marks the slots the dump holds a gradient for; ``out_grads`` are the
        dumped grads w.r.t. the outputs (None where none flowed)."""
        args = index_as_written(api, args)
        amp = autocast_dtype(args, kwargs, out_dtypes, api.conversion)
        bench = self._grad_run(func, args, kwargs, wants_grad, out_grads, api, amp, None)
        gold = self._grad_run(func, args, kwargs, wants_grad, out_grads, api, None, torch.float64) \
            if golden else None
        return bench, gold

    def _grad_run(self, func, args, kwargs, wants_grad, out_grads, api, amp, wide):
        try:
            if wide is None:
                a, k = self._bench_args(args, True), self._bench_args(kwargs, True)
            else:
                a, k = self._golden_args(args, True, self.device), self._golden_args(kwargs, True, self.device)
            slots = flat_tensors(a, k)
            leaves = []
            for t, want in zip(slots, wants_grad):
                if want and t is not None and t.dtype.is_floating_point:
                    t.requires_grad_(True)
                    leaves.append(t)
            if not leaves:
                return Run(error="no floating input to take a gradient for")
            if api.inplace:              # a leaf cannot be updated in place: feed a copy
                a = map_tensors(lambda t: t.clone() if t.requires_grad else t, a)
                k = map_tensors(lambda t: t.clone() if t.requires_grad else t, k)
            ctx = torch.autocast(self.device.split(":")[0], dtype=amp) if amp is not None \
                else contextlib.nullcontext()
            with torch.enable_grad(), ctx:
                outs = flat_outputs(func(*a, **k))
            pairs = [(o, g) for o, g in zip(outs, out_grads)
                     if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
            if not pairs:
                return Run(error="no output of the replay requires grad")
            grads_in = [g.to(self.device, o.dtype if wide is None else torch.float64).reshape(o.shape)
                        for o, g in pairs]
            got = torch.autograd.grad([o for o, _ in pairs], leaves, grads_in, allow_unused=True)
        except Exception as exc:            # noqa: BLE001
            return Run(error=f"{type(exc).__name__}: {_short(exc)}")
        it = iter(got)
        result = []
        for t, want in zip(slots, wants_grad):
            if want and t is not None and t.dtype.is_floating_point:
                g = next(it)
                result.append(None if g is None else g.detach().cpu())
            else:
                result.append(None)
        return Run(outputs=result, note="float64" if wide is not None else
                   (f"autocast {str(amp).replace('torch.', '')}" if amp is not None else "dumped dtypes"))


def _float_dtype_args(value):
    """Float dtype arguments (softmax(..., dtype=torch.float32)) widened for the golden."""
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64
    if isinstance(value, list):
        return [_float_dtype_args(v) for v in value]
    if isinstance(value, dict):
        return {k: _float_dtype_args(v) for k, v in value.items()}
    return value


def _short(exc) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
