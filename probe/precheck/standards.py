"""Accuracy standards: per-tensor error metrics against the float64 golden, and verdicts.

Sources (also in docs/precheck.md): msprobe's api_accuracy_checker (mindstudio-probe) for the
small-value domain, the error balance, the ULP standard and the benchmark method's ratio
thresholds; IEEE-754 spacing for the dtype's epsilon. Metrics are computed in float64 on
numpy arrays; compare.metrics supplies cosine, max errors and the thousandths ratios.

Three ways of judging a float tensor, the first available wins:
* benchmark method: the device's error against the golden divided by the bench's error
  against the same golden (the bench being the API replayed in the dumped dtype on the
  trusted device). A kernel as accurate as the bench scores about 1, whatever the dtype;
* direct standard: fractions of elements beyond dtype-aware relative-error limits, used
  when no bench run exists;
* exact standard: selections, rearrangements, conversions and int/bool outputs must be
  bitwise equal to the bench.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from probe.compare.metrics import tensor_metrics
from probe.compare.verdict import TOLERANCES, Verdict
from probe.tolerances import tolerance_for

# dtype -> small-value threshold (|golden| below it is judged by absolute error),
# small-value atol, epsilon (spacing at 1.0), mantissa bits, min normal exponent,
# direct standard (relative-error limit for errors, limit for warnings).
# small_value / small_value_atol: msprobe compare_utils.precision_configs.
# direct limits: msprobe run_ut compare (fp16/bf16: 99% within 1e-2 else error, 99.9%
# within 1e-3 else warning; fp32: 99.9% within 1e-3 else error, 99.99% within 1e-4 else warning).


@dataclass(frozen=True)
class Standard:
    name: str
    small_value: float
    small_atol: float
    eps: float
    mant_bits: int
    min_exp: int
    err_rel: float
    warn_rel: float
    ulp_limit: float      # an element is "ULP-bad" beyond this many ULPs (msprobe: fp32 32, fp16/bf16 1)


STANDARDS = {
    "bfloat16": Standard("bfloat16", 1e-3, 1e-5, 2.0 ** -7, 7, -126, 1e-2, 1e-3, 1.0),
    "float16": Standard("float16", 1e-3, 1e-5, 2.0 ** -10, 10, -14, 1e-2, 1e-3, 1.0),
    "float32": Standard("float32", 1e-6, 1e-9, 2.0 ** -23, 23, -126, 1e-3, 1e-4, 32.0),
    "float64": Standard("float64", 1e-12, 1e-15, 2.0 ** -52, 52, -1022, 1e-6, 1e-7, 32.0),
}

# Benchmark method: metric -> (warning above, error above) for device/bench ratios.
# msprobe api_precision_compare.benchmark_algorithms_thresholds.
RATIO_LIMITS = {
    "small_value_err": (1.0, 2.0),
    "rmse": (1.0, 2.0),
    "max_rel_err": (1.0, 10.0),
    "mean_rel_err": (1.0, 2.0),
    "eb": (1.0, 2.0),
}
# Floor of the relative metrics: a device error below max(eps, rtol / 10), rtol being the
# compare engine's tolerance for the dtype (fp32 1e-4 -> 1e-5, about 84 eps), is what
# summing in another order gives, and never fails however small the bench's error is (a
# 2-thread CPU dump replayed with 1 thread gave fp32 layer_norm weight grads mean relative
# errors of 1.3e-6 against the bench's 3.8e-7: ratio 3.4, an "error" by msprobe's limits).
REORDER_FRACTION = 0.1
RATIO_WHEN_BENCH_EXACT = 10000.0    # device error over a bench error of 0 (msprobe's default)
# ULP standard (msprobe ULPStandard): fp32 passes with mean ULP error < 64 or < 5% of
# elements beyond 32 ULP; fp16/bf16 with < 0.1% beyond 1 ULP; or when no worse than bench.
ULP_FP32_MEAN, ULP_FP32_PROPORTION, ULP_LOW_PROPORTION = 64.0, 0.05, 0.001
# Direct standard gross check (msprobe run_ut compare: cosine below 0.99 is an error).
COSINE_ERROR = 0.99


@dataclass
class ErrorMetrics:
    """Errors of one tensor against the golden (all NaN when not computed)."""
    cosine: float = math.nan
    max_abs: float = math.nan
    max_rel: float = math.nan
    mean_rel: float = math.nan
    one_thousandth: float = math.nan
    five_thousandths: float = math.nan
    eb: float = math.nan
    rmse: float = math.nan
    small_value_err: float = math.nan
    max_ulp: float = math.nan
    mean_ulp: float = math.nan
    ulp_proportion: float = math.nan
    beyond_err: float = math.nan      # fraction of elements failing the direct error limit
    beyond_warn: float = math.nan
    nonfinite_mismatch: int = 0
    numel: int = 0


def error_metrics(x: np.ndarray, g: np.ndarray, std: Standard) -> ErrorMetrics:
    """Errors of ``x`` (device or bench) against golden ``g``, judged at ``std``'s dtype."""
    x = np.asarray(x, dtype=np.float64).ravel()
    g = np.asarray(g, dtype=np.float64).ravel()
    tol = tolerance_for(std.name)
    base = tensor_metrics(x, g, tol.rtol, tol.floor)
    m = ErrorMetrics(cosine=base.cosine, max_abs=base.max_abs, max_rel=base.max_rel,
                     one_thousandth=base.one_thousandth, five_thousandths=base.five_thousandths,
                     nonfinite_mismatch=base.nonfinite_mismatch, numel=int(x.size))
    finite = np.isfinite(x) & np.isfinite(g)
    if not finite.all():
        x, g = x[finite], g[finite]
    if x.size == 0:
        return m
    err = np.abs(x - g)
    ag = np.abs(g)
    m.eb = float(np.mean((x - g) / np.maximum(1.0, ag)))
    small = ag < std.small_value
    n_small = int(np.count_nonzero(small))
    m.small_value_err = float(np.count_nonzero(err[small] > std.small_atol) / n_small) if n_small else 0.0
    normal = ~small
    if normal.any():
        en, gn = err[normal], ag[normal]
        rel = en / gn
        m.rmse = float(np.sqrt(np.mean(en * en)))
        m.max_rel = float(rel.max())
        m.mean_rel = float(rel.mean())
        bad_small = err[small] > std.small_atol
        m.beyond_err = float((np.count_nonzero(rel > std.err_rel) + np.count_nonzero(bad_small)) / x.size)
        m.beyond_warn = float((np.count_nonzero(rel > std.warn_rel) + np.count_nonzero(bad_small)) / x.size)
    else:
        m.rmse = m.max_rel = m.mean_rel = 0.0
        m.beyond_err = m.beyond_warn = m.small_value_err
    # ULP: spacing of the dtype at the golden value (subnormal spacing below the normal range).
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(ag > 0, ag, 1.0)))
    e = np.where(ag > 0, np.maximum(e, std.min_exp), std.min_exp)
    ulp = err / np.exp2(e - std.mant_bits)
    m.max_ulp = float(ulp.max())
    m.mean_ulp = float(ulp.mean())
    m.ulp_proportion = float(np.count_nonzero(ulp > std.ulp_limit) / ulp.size)
    return m


@dataclass
class Judgement:
    verdict: Verdict = field(default_factory=Verdict)
    method: str = ""
    ratios: dict = field(default_factory=dict)


def _ratio(dev: float, bench: float, floor: float) -> float:
    """Device metric over bench metric, the bench's taken as at least ``floor`` (one
    rounding of the dtype): errors both within one rounding never fail."""
    if math.isnan(dev) or math.isnan(bench):
        return math.nan
    denom = max(bench, floor)
    if denom <= 0.0:
        return 1.0 if dev <= 0.0 else RATIO_WHEN_BENCH_EXACT
    return dev / denom


def judge_benchmark(dev: ErrorMetrics, bench: ErrorMetrics, std: Standard, ulp_api: bool,
                    golden_rms: float) -> Judgement:
    """Benchmark method: compare the device's errors with the bench's (msprobe's ratios)."""
    j = Judgement(method="benchmark")
    v = j.verdict
    rel_floor = max(std.eps, REORDER_FRACTION * TOLERANCES[std.name].rtol)
    floors = {"small_value_err": 0.0, "rmse": rel_floor * golden_rms, "max_rel_err": rel_floor,
              "mean_rel_err": rel_floor, "eb": std.eps}
    pairs = {"small_value_err": (dev.small_value_err, bench.small_value_err),
             "rmse": (dev.rmse, bench.rmse), "max_rel_err": (dev.max_rel, bench.max_rel),
             "mean_rel_err": (dev.mean_rel, bench.mean_rel), "eb": (abs(dev.eb), abs(bench.eb))}
    labels = {"small_value_err": "small-value error proportion", "rmse": "RMSE",
              "max_rel_err": "max relative error", "mean_rel_err": "mean relative error",
              "eb": "error balance |EB|"}
    for key, (d, b) in pairs.items():
        r = _ratio(d, b, floors[key])
        j.ratios[key] = r
        if math.isnan(r):
            continue
        warn, err = RATIO_LIMITS[key]
        what = f"{labels[key]} {d:.3g} vs bench {b:.3g}: ratio {r:.3g}"
        if r > err:
            v.add("error", f"{what} > {err:g}")
        elif r > warn:
            v.add("warning", f"{what} > {warn:g}")
    if ulp_api:
        judge_ulp(v, dev, bench, std)
    return j


def judge_ulp(v: Verdict, dev: ErrorMetrics, bench: ErrorMetrics | None, std: Standard):
    """msprobe's ULP standard, with 'no worse than the bench' as the escape."""
    if math.isnan(dev.mean_ulp):
        return
    no_worse = bench is not None and not math.isnan(bench.ulp_proportion) and \
        dev.ulp_proportion <= bench.ulp_proportion
    if std.name in ("float32", "float64"):
        ok = dev.mean_ulp < ULP_FP32_MEAN or dev.ulp_proportion < ULP_FP32_PROPORTION or no_worse
        rule = f"mean ULP error {dev.mean_ulp:.3g} >= {ULP_FP32_MEAN:g} and {dev.ulp_proportion:.2%} " \
               f"of elements beyond {std.ulp_limit:g} ULP (limit {ULP_FP32_PROPORTION:.0%})"
    else:
        ok = dev.ulp_proportion < ULP_LOW_PROPORTION or no_worse
        rule = f"{dev.ulp_proportion:.2%} of elements beyond {std.ulp_limit:g} ULP " \
               f"(limit {ULP_LOW_PROPORTION:.1%})"
    if not ok:
        v.add("error", f"ULP standard: {rule}")


def judge_direct(dev: ErrorMetrics, std: Standard, ulp_api: bool) -> Judgement:
    """Direct standard: no bench to compare with, so dtype-aware limits against the golden."""
    j = Judgement(method="direct")
    v = j.verdict
    if not math.isnan(dev.cosine) and dev.cosine < COSINE_ERROR:
        v.add("error", f"cosine {dev.cosine:.6f} < {COSINE_ERROR}")
    limit_err = 1e-2 if std.name in ("bfloat16", "float16") else 1e-3
    limit_warn = 1e-3 if std.name in ("bfloat16", "float16") else 1e-4
    if not math.isnan(dev.beyond_err) and dev.beyond_err > limit_err:
        v.add("error", f"{dev.beyond_err:.2%} of elements beyond relative error {std.err_rel:g} "
                       f"({std.name} limit {limit_err:.1%})")
    elif not math.isnan(dev.beyond_warn) and dev.beyond_warn > limit_warn:
        v.add("warning", f"{dev.beyond_warn:.2%} of elements beyond relative error {std.warn_rel:g} "
                         f"({std.name} limit {limit_warn:.2%})")
    if ulp_api:
        judge_ulp(v, dev, None, std)
    return j


def judge_exact(x: np.ndarray, bench: np.ndarray) -> tuple[Judgement, float]:
    """Exact standard: any element differing from the bench (NaN equal to NaN) is an error."""
    j = Judgement(method="exact")
    x = np.asarray(x).ravel()
    b = np.asarray(bench).ravel()
    if x.dtype.kind == "f" or b.dtype.kind == "f":
        xf, bf = x.astype(np.float64), b.astype(np.float64)
        differ = ~((xf == bf) | (np.isnan(xf) & np.isnan(bf)))
    else:
        differ = x != b
    n = int(np.count_nonzero(differ))
    rate = n / x.size if x.size else 0.0
    if n:
        j.verdict.add("error", f"{n} of {x.size} elements differ from the exact result (error rate {rate:.3g})")
    return j, rate


def nonfinite_check(v: Verdict, x: np.ndarray, g: np.ndarray):
    """NaN/Inf must sit where the golden has them, with the same value."""
    x = np.asarray(x, dtype=np.float64).ravel()
    g = np.asarray(g, dtype=np.float64).ravel()
    fx, fg = np.isfinite(x), np.isfinite(g)
    if fx.all() and fg.all():
        return
    bad = ~(fx & fg) & ~((x == g) | (np.isnan(x) & np.isnan(g)))
    n = int(np.count_nonzero(bad))
    if n:
        only_dev = int(np.count_nonzero(~fx & fg))
        v.add("error", f"Inf/NaN mismatch: {n} elements ({only_dev} non-finite only on the device)")
