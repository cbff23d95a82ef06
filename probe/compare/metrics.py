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


def tensor_metrics(a: np.ndarray, b: np.ndarray, rtol: float, floor: float,
                   exact: bool = False, gross_factor: float = 10.0) -> TensorMetrics:
    """Metrics of NPU tensor ``a`` against bench ``b`` (same shape; checked by the caller)."""
    m = TensorMetrics(numel=int(a.size))
    if a.size == 0:
        m.notes.append("empty tensor: nothing to compare")
        return m
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    fa, fb = np.isfinite(a), np.isfinite(b)
    finite = fa & fb
    if not finite.all():
        nonfinite = ~(fa & fb)
        same = nonfinite & ((a == b) | (np.isnan(a) & np.isnan(b)))
        m.nonfinite_same = int(same.sum())
        m.nonfinite_mismatch = int(nonfinite.sum()) - m.nonfinite_same
        a, b = a[finite], b[finite]
    if a.size == 0:
        m.notes.append("no finite elements")
        return m
    d = a - b
    ad = np.abs(d, out=d)
    m.max_abs = float(ad.max())
    m.euc_dist = float(math.sqrt(float(np.dot(ad, ad))))
    na, nb = float(np.dot(a, a)), float(np.dot(b, b))
    if m.numel < 2:
        m.notes.append("0-d or 1-element tensor: cosine not meaningful")
    elif na == 0.0 or nb == 0.0:
        which = "both sides are" if na == nb else ("NPU is" if na == 0.0 else "bench is")
        m.notes.append(f"cosine undefined: {which} all zeros")
    else:
        m.cosine = float(np.dot(a, b) / math.sqrt(na) / math.sqrt(nb))
    abs_b = np.abs(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = ad / abs_b
    zero_b = abs_b == 0
    if zero_b.any():
        rel[zero_b] = np.where(ad[zero_b] == 0, 0.0, np.inf)
    m.max_rel = float(rel.max())
    m.one_thousandth = float(np.count_nonzero(rel <= 0.001) / rel.size)
    m.five_thousandths = float(np.count_nonzero(rel <= 0.005) / rel.size)
    if exact:
        m.exact_mismatch = int(np.count_nonzero(ad))
        m.tol_ratio = math.inf if m.exact_mismatch else 0.0
    else:
        rms = math.sqrt(nb / b.size)
        ratio = ad / (rtol * np.maximum(abs_b, max(rms, floor)))
        m.tol_ratio = float(ratio.max())
        m.beyond = float(np.count_nonzero(ratio > 1.0) / ratio.size)
        m.gross = float(np.count_nonzero(ratio > gross_factor) / ratio.size)
    return m
