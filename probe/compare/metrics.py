"""Numbers only: statistics diffs (vectorised over all rows) and tensor metrics.

Everything is computed in float64 after casting, whatever the dumped dtype, so a bf16
tensor and its fp32 bench are compared on their values, not on their storage.
Relative error is |npu - bench| / |bench|; where bench is exactly 0 it is 0 if NPU is
0 too and infinite otherwise (msprobe divides by machine epsilon instead, which gives
~1e16-sized numbers that read like a real measurement).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def stat_diffs(npu: np.ndarray, bench: np.ndarray):
    """(diff, relative error) of Max/Min/Mean/Norm; arrays of shape (rows, 4)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = npu - bench
        same = (npu == bench) | (np.isnan(npu) & np.isnan(bench))
        diff = np.where(same, 0.0, diff)
        rel = np.abs(diff) / np.abs(bench)
        rel = np.where(same, 0.0, rel)
    return diff, rel


def stat_tolerance_ratio(npu: np.ndarray, bench: np.ndarray, numel: np.ndarray,
                         rtol: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Worst |diff| / tolerance over Max/Min/Mean/Norm, one value per row.

    Max/Min/Mean are judged against the tensor's magnitude (RMS = Norm/sqrt(numel)),
    since a mean near 0 is the result of cancellation and its relative error means
    nothing; Norm against itself.  Non-finite statistics are left to the caller (NaN).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        rms = np.abs(bench[:, 3]) / np.sqrt(np.maximum(numel, 1))
        scale = np.maximum(np.maximum(np.abs(bench[:, :3]), rms[:, None]), floor[:, None])
        r3 = np.abs(npu[:, :3] - bench[:, :3]) / (rtol[:, None] * scale)
        rn = np.abs(npu[:, 3] - bench[:, 3]) / (rtol * np.maximum(np.abs(bench[:, 3]), floor))
        both = np.concatenate([r3, rn[:, None]], axis=1)
        both = np.where((npu == bench) | (np.isnan(npu) & np.isnan(bench)), 0.0, both)
        return both.max(axis=1)


@dataclass
class TensorMetrics:
    cosine: float = math.nan
    euc_dist: float = math.nan
    max_abs: float = math.nan
    max_rel: float = math.nan
    one_thousandth: float = math.nan
    five_thousandths: float = math.nan
    tol_ratio: float = math.nan       # worst |err| / element tolerance
    beyond: float = 0.0               # fraction of elements beyond tolerance
    gross: float = 0.0                # fraction beyond gross_factor x tolerance
    numel: int = 0
    nonfinite_same: int = 0           # NaN/Inf at identical positions on both sides
    nonfinite_mismatch: int = 0       # positions where only one side is NaN/Inf (or differs)
    exact_mismatch: int = 0           # for ints/bools: elements that differ
    notes: list = field(default_factory=list)


_CHUNK = 1 << 14       # elements per step: the float64 work buffers stay in L2 cache


def tensor_metrics(a: np.ndarray, b: np.ndarray, rtol: float, floor: float,
                   exact: bool = False, gross_factor: float = 10.0) -> TensorMetrics:
    """Metrics of NPU tensor ``a`` against bench ``b`` (same shape; checked by the caller).

    Elementwise work is float64, as before, but streamed through a few reused
    cache-sized buffers: whole-tensor float64 temporaries cost a page fault per 4 KiB
    and a trip to memory per pass, which made this memory-bound at ~100 MB/s.  Two passes:
    sums, maxima and relative error; then the tolerance, which needs the RMS.  Sums are
    added chunk by chunk (no BLAS, whose idle threads spin), so they can differ from one
    float64 dot product in the last bits; maxima and counts are exact.
    """
    m = TensorMetrics(numel=int(a.size))
    if a.size == 0:
        m.notes.append("empty tensor: nothing to compare")
        return m
    a, b = np.ravel(a), np.ravel(b)
    size = a.size
    finite_only = (a.dtype.kind == "f" or b.dtype.kind == "f") and not (_all_finite(a) and _all_finite(b))
    if finite_only:
        # NaN/Inf counted a chunk at a time; the passes below take the finite elements only,
        # gathered into the same chunks a compacted copy would give (the same sums, bit
        # for bit, without two tensor-sized float64 copies and their masks)
        m.nonfinite_same, m.nonfinite_mismatch, size = _count_nonfinite(a, b)
        if size == 0:
            m.notes.append("no finite elements")
            return m
    step = min(_CHUNK, size)
    x, y, ad, rel = (np.empty(step) for _ in range(4))
    flags = np.empty(step, dtype=bool)
    max_abs, ss_d, na, nb, ab = 0.0, 0.0, 0.0, 0.0, 0.0
    max_rel, n1, n5, differ = 0.0, 0, 0, 0
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in _chunks(a, b, x, y, finite_only):   # pass 1: sums, maxima, relative error
            xs, ys, ds, rs, fs = x[:k], y[:k], ad[:k], rel[:k], flags[:k]
            np.subtract(xs, ys, out=ds)
            np.abs(ds, out=ds)
            max_abs = max(max_abs, float(ds.max()))
            if exact:
                differ += int(np.count_nonzero(ds))
            ss_d += float(np.einsum("i,i->", ds, ds))
            na += float(np.einsum("i,i->", xs, xs))
            nb += float(np.einsum("i,i->", ys, ys))
            ab += float(np.einsum("i,i->", xs, ys))
            np.abs(ys, out=ys)
            np.divide(ds, ys, out=rs)
            np.equal(ys, 0, out=fs)
            if fs.any():                            # bench 0: 0 if NPU is 0 too, else inf
                rs[fs] = np.where(ds[fs] == 0, 0.0, np.inf)
            max_rel = max(max_rel, float(rs.max()))
            n1 += int(np.count_nonzero(np.less_equal(rs, 0.001, out=fs)))
            n5 += int(np.count_nonzero(np.less_equal(rs, 0.005, out=fs)))
    m.max_abs = max_abs
    m.euc_dist = math.sqrt(ss_d)
    if m.numel < 2:
        m.notes.append("0-d or 1-element tensor: cosine not meaningful")
    elif na == 0.0 or nb == 0.0:
        which = "both sides are" if na == nb else ("NPU is" if na == 0.0 else "bench is")
        m.notes.append(f"cosine undefined: {which} all zeros")
    elif ss_d == 0.0:
        m.cosine = 1.0      # identical: exactly 1, not the 1 - 2e-16 that rounding of the sums gives
    else:
        m.cosine = max(-1.0, min(1.0, float(ab / math.sqrt(na) / math.sqrt(nb))))
    m.max_rel = max_rel
    m.one_thousandth = float(n1 / size)
    m.five_thousandths = float(n5 / size)
    if exact:
        m.exact_mismatch = differ
        m.tol_ratio = math.inf if differ else 0.0
        return m
    scale = max(math.sqrt(nb / size), floor)
    worst, beyond, gross = 0.0, 0, 0
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in _chunks(a, b, x, y, finite_only):   # pass 2: against the tolerance
            xs, ys, ds, fs = x[:k], y[:k], ad[:k], flags[:k]
            np.subtract(xs, ys, out=ds)
            np.abs(ds, out=ds)
            np.abs(ys, out=ys)
            np.maximum(ys, scale, out=ys)
            np.multiply(ys, rtol, out=ys)           # rtol * max(|b|, rms, floor), as before
            np.divide(ds, ys, out=ds)
            worst = max(worst, float(ds.max()))
            beyond += int(np.count_nonzero(np.greater(ds, 1.0, out=fs)))
            gross += int(np.count_nonzero(np.greater(ds, gross_factor, out=fs)))
    m.tol_ratio = worst
    m.beyond = float(beyond / size)
    m.gross = float(gross / size)
    return m


def _count_nonfinite(a: np.ndarray, b: np.ndarray):
    """(NaN/Inf at the same places with the same value on both sides, NaN/Inf elsewhere,
    elements finite on both sides), a chunk at a time."""
    same = nonfinite = 0
    for lo in range(0, a.size, _CHUNK):
        a64 = a[lo:lo + _CHUNK].astype(np.float64)
        b64 = b[lo:lo + _CHUNK].astype(np.float64)
        bad = ~(np.isfinite(a64) & np.isfinite(b64))
        nonfinite += int(np.count_nonzero(bad))
        same += int(np.count_nonzero(bad & ((a64 == b64) | (np.isnan(a64) & np.isnan(b64)))))
    return same, nonfinite - same, a.size - nonfinite


def _chunks(a: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, finite_only: bool):
    """Fill ``x``, ``y`` (float64 buffers of one chunk) with the next elements of ``a``,
    ``b`` and yield how many: all elements, or, with ``finite_only``, those finite on both
    sides, packed into full chunks as a compacted copy of them would be cut."""
    step = x.size
    if not finite_only:
        for lo in range(0, a.size, step):
            k = min(step, a.size - lo)
            x[:k] = a[lo:lo + k]
            y[:k] = b[lo:lo + k]
            yield k
        return
    fill = 0
    for lo in range(0, a.size, step):
        a64 = a[lo:lo + step].astype(np.float64)
        b64 = b[lo:lo + step].astype(np.float64)
        keep = np.isfinite(a64) & np.isfinite(b64)
        a64, b64 = a64[keep], b64[keep]
        while a64.size:
            k = min(step - fill, a64.size)
            x[fill:fill + k] = a64[:k]
            y[fill:fill + k] = b64[:k]
            fill += k
            a64, b64 = a64[k:], b64[k:]
            if fill == step:
                yield step
                fill = 0
    if fill:
        yield fill


def _all_finite(a: np.ndarray) -> bool:
    """Whether every element is finite, checked in chunks (no tensor-sized mask)."""
    if a.dtype.kind != "f":
        return True
    flags = np.empty(min(_CHUNK, a.size), dtype=bool)
    for lo in range(0, a.size, flags.size):
        f = flags[:min(flags.size, a.size - lo)]
        if not np.isfinite(a[lo:lo + f.size], out=f).all():
            return False
    return True
