"""One output tensor of a replayed call judged: which standard applies, and the row it makes."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from probe.compare.verdict import Verdict, dtype_class
from probe.precheck import standards as st
from probe.precheck.inputs import is_tensor_desc
from probe.vocabulary import MAX, MIN

SIGMA = 5.0         # statistical checks: five standard errors before calling a sample wrong
MIN_SAMPLE = 100    # fewer elements than this cannot be judged statistically


@dataclass
class TensorResult:
    """A row of accuracy_checking_details: one output (or input gradient) of one call."""
    name: str
    device_dtype: str = ""
    bench_dtype: str = ""
    shape: str = ""
    status: str = "pass"
    message: str = ""
    method: str = ""
    inputs: str = ""
    bench_run: str = ""
    dev: st.ErrorMetrics | None = None
    bench: st.ErrorMetrics | None = None
    ratios: dict = field(default_factory=dict)
    error_rate: float = math.nan


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.to(torch.float32)
    return t.numpy()


def _standard(dtype: str) -> st.Standard:
    return st.STANDARDS.get(dtype_class(dtype) or "", st.STANDARDS["float32"])   # fp32's for ints


def _finish(row: TensorResult, v: Verdict, extra: str = "") -> TensorResult:
    row.status = v.level
    parts = [m for m in (v.text(), extra) if m]
    row.message = "; ".join(parts)
    return row


def judge_leaf(name, desc, dev, bench, golden, *, exact: bool, random: bool, ulp: bool,
               synthetic: bool, bench_note: str, golden_note: str) -> TensorResult | None:
    """Row for one dumped output leaf; None when there is nothing on either side."""
    if desc is None and (bench is None or not isinstance(bench, torch.Tensor)):
        return None
    row = TensorResult(name, inputs="synthetic (statistics dump)" if synthetic else "tensor files",
                       bench_run=bench_note)
    v = Verdict()
    if not is_tensor_desc(desc):
        row.method = "value"
        want = desc.get("value") if isinstance(desc, dict) else desc
        got = bench.item() if isinstance(bench, torch.Tensor) and bench.numel() == 1 else bench
        same = want == got or (isinstance(want, float) and isinstance(got, float)
                               and math.isclose(want, got, rel_tol=1e-6, abs_tol=1e-12))
        if not same:
            v.add("error", f"value {want!r} differs from the replay's {got!r}")
        return _finish(row, v)
    row.device_dtype = desc.get("dtype", "")
    row.shape = str(desc.get("shape"))
    if not isinstance(bench, torch.Tensor):
        v.add("error", f"the replay returned {type(bench).__name__} where the dump has a tensor")
        return _finish(row, v)
    row.bench_dtype = str(bench.dtype)
    if list(bench.shape) != list(desc.get("shape", bench.shape)):
        v.add("error", f"shape {desc.get('shape')} differs from the replay's {list(bench.shape)}")
        return _finish(row, v)
    dev_cls, bench_cls = dtype_class(row.device_dtype), dtype_class(row.bench_dtype)
    if (dev_cls == "exact") != (bench_cls == "exact"):
        v.add("error", f"dtype {row.device_dtype} cannot be compared with the replay's {row.bench_dtype}")
        return _finish(row, v)
    if synthetic or dev is None:
        return _judge_synthetic(row, v, desc, bench, golden)
    x = _np(dev)
    if random:
        return _judge_random(row, v, x, _np(bench))
    if dev_cls == "exact" or exact:
        j, rate = st.judge_exact(x, _np(bench))
        row.method, row.error_rate = "exact", rate
        return _finish(row, j.verdict)
    std = _standard(row.device_dtype)
    bench_np = _np(bench)
    b: np.ndarray | None = bench_np
    g = _np(golden) if isinstance(golden, torch.Tensor) and list(golden.shape) == list(bench.shape) else None
    note = ""
    if g is None:                    # no golden: the bench stands in for it
        g, note = bench_np.astype(np.float64), f"golden unavailable ({golden_note}); judged against the bench"
        b = None
    st.nonfinite_check(v, x, g)
    row.dev = st.error_metrics(x, g, std)
    if b is not None:
        row.bench = st.error_metrics(b, g, std)
        rms = float(np.sqrt(np.mean(np.square(g[np.isfinite(g)])))) if g.size else 0.0
        j = st.judge_benchmark(row.dev, row.bench, std, ulp, rms)
        row.ratios = j.ratios
    else:
        j = st.judge_direct(row.dev, std, ulp)
    row.method = f"{j.method} ({std.name})"
    _merge(v, j.verdict)
    return _finish(row, v, note)


def _merge(v: Verdict, other: Verdict):
    if Verdict._ORDER[other.level] > Verdict._ORDER[v.level]:
        v.level = other.level
    v.messages.extend(other.messages)


def _judge_synthetic(row, v, desc, bench, golden):
    """Statistics dump: the device's values are unknown; shape, dtype and finiteness are not."""
    row.method = "synthetic inputs"
    note = "inputs synthesised from the recorded shape/dtype/range: the dumped output is checked " \
           "by shape, dtype and finiteness only"
    dumped_nonfinite = any(isinstance(desc.get(k), float) and not math.isfinite(desc[k])
                           for k in (MAX, MIN))
    if dumped_nonfinite and bench.dtype.is_floating_point and bool(torch.isfinite(bench).all()):
        v.add("warning", "the dumped output holds Inf/NaN but the replay on synthetic inputs is finite")
    if isinstance(golden, torch.Tensor) and bench.dtype.is_floating_point and golden.shape == bench.shape:
        std = _standard(row.device_dtype)
        row.bench = st.error_metrics(_np(bench), _np(golden), std)
    return _finish(row, v, note)


def _judge_random(row, v, x, b):
    """Random outputs: the device's sample must look drawn from the bench's distribution."""
    row.method = "statistical (random API)"
    x = x.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    n = x.size
    if n < MIN_SAMPLE:
        return _finish(row, v, f"{n} elements: too few to judge a random output")
    if not np.isfinite(x).all():
        v.add("error", "random output holds Inf/NaN")
        return _finish(row, v)
    mx, mb, sx, sb = x.mean(), b.mean(), x.std(), b.std()
    se = math.sqrt((sx * sx + sb * sb) / n) or 1e-12
    if abs(mx - mb) > SIGMA * se:
        v.add("error", f"mean {mx:.4g} vs bench {mb:.4g}: {abs(mx - mb) / se:.1f} standard errors apart")
    if sb > 0 and abs(sx / sb - 1.0) > SIGMA * math.sqrt(2.0 / n) + 0.02:
        v.add("error", f"std {sx:.4g} vs bench {sb:.4g}")
    zx, zb = np.mean(x == 0), np.mean(b == 0)
    zse = math.sqrt(max(zb * (1 - zb), 1.0 / n) * 2.0 / n)
    if abs(zx - zb) > SIGMA * zse + 1.0 / n:
        v.add("error", f"zero fraction {zx:.3%} vs bench {zb:.3%}")
    lo, hi = b.min(), b.max()
    span = hi - lo
    if x.min() < lo - span or x.max() > hi + span:
        v.add("warning", f"range [{x.min():.4g}, {x.max():.4g}] far outside the bench's [{lo:.4g}, {hi:.4g}]")
    return _finish(row, v)


def judge_dropout(row_name, desc, dev_out, x_in, p, dev_dtype) -> TensorResult:
    """Dropout, element-wise where it can be: kept elements must equal input / (1 - p)."""
    row = TensorResult(row_name, device_dtype=dev_dtype, shape=str(desc.get("shape")),
                       method="statistical (dropout)", inputs="tensor files")
    v = Verdict()
    out = _np(dev_out).astype(np.float64).ravel()
    inp = _np(x_in).astype(np.float64).ravel()
    if out.size != inp.size:
        v.add("error", "output and input sizes differ")
        return _finish(row, v)
    kept = out != 0
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    std = _standard(dev_dtype)
    expect = inp[kept] * scale
    tol = 2 * std.eps * np.maximum(np.abs(expect), std.small_value)
    bad = int(np.count_nonzero(np.abs(out[kept] - expect) > tol))
    if bad:
        v.add("error", f"{bad} kept elements differ from input x 1/(1-p) = {scale:.4g}")
    n = out.size
    dropped = float(np.mean(~kept & (inp != 0)))
    if n >= MIN_SAMPLE:
        se = math.sqrt(p * (1 - p) / n) or 1.0 / n
        if abs(dropped - p) > SIGMA * se + 1.0 / n:
            v.add("error", f"dropped fraction {dropped:.3%} vs p = {p:.3%}: "
                           f"{abs(dropped - p) / se:.1f} standard errors apart")
        note = ""
    else:
        note = f"{n} elements: too few to judge the dropped fraction"
    row.error_rate = bad / max(int(kept.sum()), 1)
    return _finish(row, v, note)
