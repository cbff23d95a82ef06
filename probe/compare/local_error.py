"""What each call does to error on its own: the call re-run on the NPU side's own inputs.

Comparing an NPU output with the bench's mixes two things: error the call's inputs already
carried (inherited: different weights after an optimizer step, a faulty call upstream)
and error the call itself added (local). Measured from both sides' tensors alone, the
split needs a model of how the op propagates error, and every simple model fails on some
op: an embedding selects the rows that the last update changed most, a LayerNorm divides
by a small spread, an AdamW update divides by sqrt(v) and turns a gradient's rounding
into a difference of 2 x lr on a weight near zero. Replaying the call from the NPU's
dumped inputs measures the local part directly, whatever the op:

    golden    = the call in float64 on the NPU's inputs (tensor files of a tensor dump)
    local     = ||npu output - golden|| / ||golden||         what the NPU's kernel added
    reference = ||replay in the NPU's dtypes - golden|| / ||golden||
                                                  what a correct kernel of those dtypes adds
    bias      = <npu - golden, golden> / <golden, golden>, minus the same for the replay:
                the part of the local error that is a scale; rounding is zero-mean, a
                kernel bug (a wrong scale, a wrong accumulation dtype) usually is not

A call introduces error when its local error is beyond LOCAL_FACTOR x what a correct
kernel of its dtype adds (the replay's error, and at least the dtype's rounding), or when
its bias stands out of the rounding's spread by BIAS_Z standard errors and is at least the
dtype's rounding. Replays run on the CPU, one call at a time, only for calls whose output
differs at all, through run-ut's rebuilding of calls (``probe.precheck``).
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

LOCAL_FACTOR = 3.0      # local error above this many times a correct kernel's: introduced
BIAS_Z = 8.0            # a scale this many standard errors of rounding away from 0: introduced
# Relative rounding error of one correctly rounded result, by output dtype: what the
# smallest local error of a correct kernel is (half the spacing at 1.0).
ROUNDING = {"torch.bfloat16": 2.0 ** -9, "torch.float16": 2.0 ** -12,
            "torch.float32": 2.0 ** -25, "torch.float64": 2.0 ** -54}


@dataclass
class LocalError:
    """The local error of one call's worst output (see the module docstring)."""
    local: float              # ||npu - golden|| / ||golden||
    reference: float          # ||replay in the NPU's dtypes - golden|| / ||golden||
    rounding: float           # the output dtype's rounding
    bias: float               # scale part of the local error beyond the replay's
    bias_spread: float        # standard error of that scale under rounding noise
    output: int               # which output (or input gradient for a backward entry)
    conditioning: float = 1.0  # sums: ||f(|inputs|)|| / ||f(inputs)||, how much they cancel

    @property
    def correct(self) -> float:
        """What a correct kernel of this dtype may be off by: the replay's error, and at
        least the dtype's rounding of the terms before they cancelled (a correct kernel
        summing in another order differs by that, however small the sum)."""
        return max(self.reference, self.rounding * self.conditioning)

    @property
    def allowed(self) -> float:
        """Local error a correct kernel of this dtype may add."""
        return LOCAL_FACTOR * self.correct

    @property
    def ratio(self) -> float:
        return self.local / self.correct

    @property
    def biased(self) -> bool:
        return abs(self.bias) > max(BIAS_Z * self.bias_spread, self.rounding * self.conditioning)

    @property
    def introduces(self) -> bool:
        return self.local > self.allowed or self.biased

    def reason(self) -> str:
        """One sentence: why the call is or is not the one that made the error."""
        if self.biased and self.local <= self.allowed:
            return (f"re-run on its own inputs, its output is scaled by {1 + self.bias:.4g} "
                    f"({self.bias / max(self.bias_spread, 1e-300):.3g} standard errors of rounding)")
        if self.introduces:
            return (f"re-run on its own inputs, its output is off by {self.local:.3g} where a "
                    f"correct kernel of its dtype is off by {self.correct:.3g}")
        return (f"re-run on its own inputs, its output is off by {self.local:.3g}, within what a "
                f"correct kernel of its dtype gives ({self.correct:.3g}): "
                f"the difference comes from its inputs")


# Elements per chunk of the float64 sums: a few 8 MB buffers, where whole-tensor float64
# copies made a 1 GiB float32 output peak at 14.4 GB (issue #45).
MEASURE_CHUNK = 1 << 20


@dataclass
class _Sums:
    """The float64 sums ``_measure`` needs, added chunk by chunk."""
    gg: float = 0.0       # sum g^2
    dd: float = 0.0       # sum (npu - g)^2
    dg: float = 0.0       # sum (npu - g) g
    rr: float = 0.0       # sum (replay - g)^2
    rg: float = 0.0       # sum (replay - g) g
    g4: float = 0.0       # sum g^4
    n: int = 0            # elements summed (the finite ones)
    replay_finite: bool = True


def _measure(npu, golden, replay):
    """(local, reference, bias, bias spread) of one output; None where nothing to measure.

    Streamed: each chunk of the three tensors is widened to float64 on its own, so the
    measure adds a few chunk-sized buffers to the tensors already in memory. Each sum is
    numpy's pairwise sum within a chunk, the chunks' sums added in order: the same as one
    sum over the whole tensor up to the last bits (about 1e-16 relative per chunk); the
    counts and the NaN/Inf checks are exact."""
    import torch
    if not (isinstance(npu, torch.Tensor) and isinstance(golden, torch.Tensor)):
        return None
    if not npu.dtype.is_floating_point or npu.shape != golden.shape or npu.numel() == 0:
        return None
    flat = [npu.detach().reshape(-1), golden.detach().reshape(-1)]
    if isinstance(replay, torch.Tensor) and replay.shape == golden.shape:
        flat.append(replay.detach().reshape(-1))
    s = _Sums()
    for lo in range(0, flat[0].numel(), MEASURE_CHUNK):
        if not _add_chunk(s, [t[lo:lo + MEASURE_CHUNK] for t in flat]):
            return math.inf, 0.0, 0.0, 0.0          # NaN/Inf where the golden has none
    if s.gg == 0.0:
        return None
    norm = math.sqrt(s.gg)
    local = math.sqrt(s.dd) / norm
    bias = s.dg / s.gg
    reference, ref_bias = 0.0, 0.0
    if len(flat) == 3 and s.replay_finite:
        reference, ref_bias = math.sqrt(s.rr) / norm, s.rg / s.gg
    # The scale's standard error under rounding noise: the noise spread over the golden's
    # elements in proportion to their size, over their effective number (sum g^2)^2 / sum g^4
    # (a cross-entropy gradient is a few -1/N entries among many tiny ones: not g.size).
    n_eff = s.gg * s.gg / max(s.g4, 1e-300)
    spread = max(reference, local - abs(bias)) / math.sqrt(max(min(n_eff, s.n), 1.0))
    return local, reference, bias - ref_bias, spread


def _add_chunk(s: _Sums, chunk) -> bool:
    """Add one chunk (npu, golden[, replay] slices) to ``s``; False where the NPU side is
    NaN/Inf at other places than the golden (no measure then)."""
    import numpy as np
    import torch
    # numpy without BLAS (np.dot threads and spins on a busy machine): a few float64 sums
    a, g = (t.to(torch.float64).numpy() for t in chunk[:2])
    r = chunk[2].to(torch.float64).numpy() if len(chunk) == 3 else None
    fa, fg = np.isfinite(a), np.isfinite(g)
    if not (fa.all() and fg.all()):
        if not np.array_equal(fa, fg):
            return False
        a, g = a[fa], g[fa]
        r = r[fa] if r is not None else None
    g2 = g * g
    s.gg += float(np.sum(g2))
    s.g4 += float(np.sum(g2 * g2))
    s.n += g.size
    d = a - g
    s.dd += float(np.sum(d * d))
    s.dg += float(np.sum(d * g))
    if r is not None and s.replay_finite:
        if not np.isfinite(r).all():
            s.replay_finite = False
        else:
            dr = r - g
            s.rr += float(np.sum(dr * dr))
            s.rg += float(np.sum(dr * g))
    return True


# APIs that sum products of their inputs (linear in each): their golden on the inputs'
# magnitudes says how far the terms cancelled.
SUMS = frozenset({"sum", "mean", "nansum", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear",
                  "einsum", "conv1d", "conv2d", "conv3d", "__matmul__", "dot", "mv", "tensordot", "cumsum"})


class Replays:
    """Local errors of calls of one NPU dump (a tensor dump: the files hold the inputs)."""

    def __init__(self, npu_json: str):
        from probe.precheck.inputs import Loader
        from probe.precheck.replay import Replayer
        from .reader import DumpMeta, read_dump
        self.entries = dict(read_dump(npu_json, DumpMeta(npu_json)))
        data_dir = os.path.join(os.path.dirname(os.path.abspath(npu_json)), "dump_tensor_data")
        self.loader = Loader(data_dir, "cpu")
        self.replayer = Replayer("cpu")

    def first_tensors(self, entry: str):
        """(first input tensor, first output tensor, output dtype) of an entry as float64
        numpy arrays from its files (a backward entry: the gradient w.r.t. the output and
        w.r.t. the input), or None where the dump holds no files for them."""
        from probe.precheck.inputs import flat_outputs, is_tensor_desc
        e = self.entries.get(entry)
        if not isinstance(e, dict):
            return None
        ins = e.get("input_args") if "input_args" in e else e.get("input")
        outs = e.get("output")
        x = next((d for d in flat_outputs(ins or []) if is_tensor_desc(d)), None)
        y = next((d for d in flat_outputs(outs or []) if is_tensor_desc(d)), None)
        if x is None or y is None or not x.get("data_name") or not y.get("data_name"):
            return None
        try:
            tx, ty = self.loader.dumped(x), self.loader.dumped(y)
        except Exception as exc:        # noqa: BLE001 - a file that cannot be read: no check
            logger.debug("tensors of %s could not be read: %s", entry, exc)
            return None
        if tx is None or ty is None or tx.shape != ty.shape:
            return None
        import torch
        return (tx.detach().to(torch.float64).numpy(), ty.detach().to(torch.float64).numpy(), str(ty.dtype))

    def output_tensor(self, entry: str):
        """The first output of an entry as a float64 numpy array, or None."""
        from probe.precheck.inputs import flat_outputs, is_tensor_desc
        e = self.entries.get(entry)
        y = next((d for d in flat_outputs((e or {}).get("output") or []) if is_tensor_desc(d)), None) \
            if isinstance(e, dict) else None
        if y is None or not y.get("data_name"):
            return None
        try:
            import torch
            return self.loader.dumped(y).detach().to(torch.float64).numpy()
        except Exception as exc:        # noqa: BLE001
            logger.debug("output of %s could not be read: %s", entry, exc)
            return None

    def _golden_of_magnitudes(self, func, args, kwargs, api):
        """The float64 golden of the call on its inputs' absolute values (a sum's terms
        before they cancel), or None."""
        from probe.tensor_tree import map_tensors
        absolute = lambda t: t.abs() if t.is_floating_point() else t
        try:
            gold = self.replayer.golden(func, map_tensors(absolute, args), map_tensors(absolute, kwargs), api)
        except Exception:   # noqa: BLE001 - no measure of cancellation: judged as before
            return None
        return gold.outputs if gold is not None and not gold.error else None

    def local_error(self, entry: str) -> LocalError | None:
        """The call's local error, or None when it cannot be replayed from the dump."""
        try:
            return self._local_error(entry)
        except Exception as exc:        # noqa: BLE001 - a replay that fails only loses a hint
            logger.debug("replay of %s failed: %s", entry, exc)
            return None

    def _local_error(self, entry: str) -> LocalError | None:
        from probe.precheck.entries import parse_name, resolve_api
        from probe.precheck.inputs import Unrebuildable, flat_outputs, flat_tensors, is_tensor_desc, torch_dtype
        api = parse_name(entry)
        if api is None or api.random:
            return None
        fwd = self.entries.get(f"{api.base}.forward")
        if not isinstance(fwd, dict) or "input_args" not in fwd:
            return None
        try:
            func = resolve_api(api)
            self.loader.synthetic = False
            args = self.loader.build(fwd.get("input_args", []), api.base + ".forward")
            kwargs = self.loader.build(fwd.get("input_kwargs", {}), api.base + ".forward")
            out_descs = flat_outputs(fwd.get("output") or [])
            out_dtypes = [torch_dtype(d["dtype"]) if is_tensor_desc(d) else None for d in out_descs]
            if api.direction == "forward":
                dumped = [self.loader.dumped(d) for d in out_descs]
            else:
                bwd = self.entries.get(entry)
                if not isinstance(bwd, dict) or "input" not in bwd or "output" not in bwd:
                    return None
                out_grads = [self.loader.tensor(d) if is_tensor_desc(d) else None for d in bwd["input"]]
                grads = list(bwd["output"])
                slots = flat_tensors(args, kwargs)
                if len(grads) != len(slots):        # msprobe's autograd-edge order: no slots
                    return None
                dumped = [self.loader.dumped(d) for d in grads]
        except (Unrebuildable, LookupError, TypeError, ValueError):
            return None
        if self.loader.synthetic or not isinstance(kwargs, dict):
            return None                     # inputs without files: nothing exact to replay
        if api.inplace:
            func = _returning_self(func)
        if api.direction == "forward":
            replay, gold = self.replayer.forward(func, args, kwargs, out_dtypes, api, golden=True)
        else:
            wants = [d is not None for d in dumped]
            replay, gold = self.replayer.backward(func, args, kwargs, wants, out_grads, out_dtypes,
                                                  api, golden=True)
        if gold is None or gold.error or not gold.outputs:
            return None
        replayed = replay.outputs if replay is not None and not replay.error else None
        sums = api.direction == "forward" and api.leaf in SUMS
        magnitudes = self._golden_of_magnitudes(func, args, kwargs, api) if sums else None

        def conditioning(k):
            if not magnitudes or k >= len(magnitudes) or k >= len(gold.outputs):
                return 1.0
            return _cancellation(gold.outputs[k], magnitudes[k])

        worst = None
        for k, (npu, golden) in enumerate(zip(dumped, gold.outputs)):
            rep = replayed[k] if replayed and k < len(replayed) else None
            m = _measure(npu, golden, rep)
            if m is None:
                continue
            rounding = ROUNDING.get(str(npu.dtype), ROUNDING["torch.float32"])
            le = LocalError(m[0], m[1], rounding, m[2], m[3], k, conditioning(k))
            if worst is None or (le.ratio, abs(le.bias)) > (worst.ratio, abs(worst.bias)):
                worst = le
        return worst


def _cancellation(golden, magnitude) -> float:
    """||f(|inputs|)|| / ||f(inputs)||: how far the terms of a sum cancelled (1: not at all)."""
    import torch
    if not (isinstance(golden, torch.Tensor) and isinstance(magnitude, torch.Tensor)) or golden.shape != magnitude.shape:
        return 1.0
    g = float(torch.linalg.vector_norm(golden.double()))
    m = float(torch.linalg.vector_norm(magnitude.double()))
    return max(m / g, 1.0) if g > 0 and math.isfinite(m) else 1.0


def _returning_self(func):
    """An in-place API whose result is its first argument (``torch._foreach_add_`` returns
    None): the dump records the updated tensors as its output, so the replay returns them."""
    def call(*args, **kwargs):
        out = func(*args, **kwargs)
        return args[0] if out is None and args else out
    return call
